#include "learner_server/micro_batches.h"

#include <algorithm>

#include <ATen/ATen.h>
#include "absl/strings/str_cat.h"

namespace asympo::learner {
namespace {

// Longest prompt + response of a group.
int64_t LongestSequence(const v1::PromptGroup& g) {
  int64_t longest = 0;
  for (const v1::Response& r : g.responses()) {
    longest = std::max<int64_t>(longest, g.prompt_tokens_size() + r.tokens_size());
  }
  return longest;
}

// The tensors of `mb`, shaped from its sizes: padding, no token yet.
void Allocate(MicroBatch& mb, int64_t pad_token_id, bool behavior) {
  const int64_t n = mb.rows, t = mb.longest, rl = mb.longest_response;
  mb.ids = at::full({n, t}, pad_token_id, at::kLong);
  mb.positions = at::arange(t, at::kLong).unsqueeze(0).expand({n, t}).contiguous();
  mb.key_mask = at::zeros({n, t}, at::kBool);
  mb.response_mask = at::zeros({n, rl}, at::kBool);
  mb.rewards = at::empty({n}, at::kFloat);
  mb.group_index = at::empty({n}, at::kLong);
  if (behavior) mb.behavior = at::zeros({n, rl}, at::kFloat);
}

}  // namespace

// Splits groups, in order, into micro-batches whose padded size
// (sequences x longest) stays within the budget (a lone larger group
// excepted).
std::vector<std::vector<const QueuedGroup*>> PaddedLayout::Split(
    const std::vector<QueuedGroup>& groups) const {
  std::vector<std::vector<const QueuedGroup*>> out;
  int64_t rows = 0, longest = 0;
  for (const QueuedGroup& q : groups) {
    const int64_t n = q.group.responses_size();
    const int64_t len = LongestSequence(q.group);
    if (!out.empty() && rows > 0 &&
        (rows + n) * std::max(longest, len) <= options_.micro_batch_tokens) {
      rows += n;
      longest = std::max(longest, len);
      out.back().push_back(&q);
    } else {
      out.push_back({&q});
      rows = n;
      longest = len;
    }
  }
  return out;
}

// Per response: prompt + response ids; the hidden state at position
// P - 1 + j predicts response token j.
absl::StatusOr<MicroBatch> PaddedLayout::Build(
    const std::vector<const QueuedGroup*>& groups) const {
  MicroBatch mb;
  mb.groups = static_cast<int64_t>(groups.size());
  for (const QueuedGroup* q : groups) {
    mb.rows += q->group.responses_size();
    mb.longest = std::max(mb.longest, LongestSequence(q->group));
    for (const v1::Response& r : q->group.responses()) {
      mb.longest_response = std::max<int64_t>(mb.longest_response, r.tokens_size());
    }
  }
  const bool grpo = options_.behavior_logprobs;
  Allocate(mb, options_.pad_token_id, grpo);
  const int64_t t = mb.longest, rl = mb.longest_response, vocab = options_.vocab_size;
  auto ids = mb.ids.accessor<int64_t, 2>();
  auto keys = mb.key_mask.accessor<bool, 2>();
  auto resp = mb.response_mask.accessor<bool, 2>();
  auto rewards = mb.rewards.accessor<float, 1>();
  auto group_index = mb.group_index.accessor<int64_t, 1>();
  float* behavior = grpo ? mb.behavior.data_ptr<float>() : nullptr;
  int64_t i = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const v1::PromptGroup& pg = groups[g]->group;
    const int64_t p = pg.prompt_tokens_size();
    for (const v1::Response& r : pg.responses()) {
      for (int64_t k = 0; k < p; ++k) ids[i][k] = pg.prompt_tokens(static_cast<int>(k));
      for (int j = 0; j < r.tokens_size(); ++j) {
        const int32_t tok = r.tokens(j);
        if (tok < 0 || tok >= vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat("token ", tok, " is outside the model's vocabulary of ", vocab));
        }
        ids[i][p + j] = tok;
        resp[i][j] = true;
        mb.hidden_rows.push_back(i * t + p - 1 + j);
        mb.targets.push_back(tok);
        if (grpo) behavior[i * rl + j] = r.behavior_logprobs(j);
      }
      for (int64_t k = 0; k < p + r.tokens_size(); ++k) keys[i][k] = true;
      rewards[i] = r.reward();
      group_index[i] = static_cast<int64_t>(g);
      ++i;
    }
  }
  return mb;
}

}  // namespace asympo::learner
