#include "learner_server/trainer/micro_batches.h"

#include <algorithm>
#include <numeric>

#include <ATen/ATen.h>
#include "absl/strings/str_cat.h"
#include "common/batch_validation.h"
#include "common/status_macros.h"

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

// Prompt + response tokens of every response of a group.
int64_t SequenceTokens(const v1::PromptGroup& g) {
  int64_t tokens = 0;
  for (const v1::Response& r : g.responses()) tokens += g.prompt_tokens_size() + r.tokens_size();
  return tokens;
}

// Where a response's sequence starts: its row and column.
struct Placement {
  int64_t row = 0, column = 0;
};

// What Lay relies on in response i beyond admission's checks (a group may
// come back from a checkpoint): a loss mask of one entry per token, and
// with `grpo` one behavior log-prob per generated token.
absl::Status CheckLaidOut(const v1::Response& r, int64_t i, bool grpo) {
  if (r.loss_mask_size() != 0 && r.loss_mask_size() != r.tokens_size()) {
    return absl::InvalidArgumentError(absl::StrCat("response ", i, " has a loss_mask of ",
                                                   r.loss_mask_size(), " entries for ",
                                                   r.tokens_size(), " tokens"));
  }
  if (grpo && r.behavior_logprobs_size() != GeneratedTokens(r)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "response ", i, " has ", r.behavior_logprobs_size(), " behavior log-probs for ",
        GeneratedTokens(r), " generated tokens; the objective needs one per generated token"));
  }
  return absl::OkStatus();
}

// The micro-batch of `groups` with response i (in group order) at
// placements[i], in `rows` rows of `t` positions; with segments when
// `packed`.
absl::StatusOr<MicroBatch> Lay(const std::vector<const QueuedGroup*>& groups, int64_t rows,
                               int64_t t, const std::vector<Placement>& placements, bool packed,
                               const PaddedLayoutOptions& options) {
  MicroBatch mb;
  mb.groups = static_cast<int64_t>(groups.size());
  mb.rows = rows;
  mb.longest = t;
  for (const QueuedGroup* q : groups) {
    mb.responses += q->group.responses_size();
    mb.real_tokens += SequenceTokens(q->group);
    for (const v1::Response& r : q->group.responses()) {
      mb.longest_response = std::max<int64_t>(mb.longest_response, r.tokens_size());
    }
  }
  const int64_t n = mb.responses, rl = mb.longest_response, vocab = options.vocab_size;
  const bool grpo = options.behavior_logprobs;
  // Padding: the pad id, its column as position, no segment, not a key.
  mb.ids = at::full({rows, t}, options.pad_token_id, at::kLong);
  mb.positions = at::arange(t, at::kLong).unsqueeze(0).expand({rows, t}).contiguous();
  mb.key_mask = at::zeros({rows, t}, at::kBool);
  if (packed) mb.segments = at::full({rows, t}, -1, at::kLong);
  mb.response_mask = at::zeros({n, rl}, at::kBool);
  mb.rewards = at::empty({n}, at::kFloat);
  mb.group_index = at::empty({n}, at::kLong);
  if (grpo) mb.behavior = at::zeros({n, rl}, at::kFloat);
  auto ids = mb.ids.accessor<int64_t, 2>();
  auto pos = mb.positions.accessor<int64_t, 2>();
  auto keys = mb.key_mask.accessor<bool, 2>();
  auto resp = mb.response_mask.accessor<bool, 2>();
  auto rewards = mb.rewards.accessor<float, 1>();
  auto group_index = mb.group_index.accessor<int64_t, 1>();
  int64_t* segments = packed ? mb.segments.data_ptr<int64_t>() : nullptr;
  float* behavior = grpo ? mb.behavior.data_ptr<float>() : nullptr;
  mb.hidden_rows.reserve(static_cast<size_t>(mb.real_tokens));
  mb.targets.reserve(static_cast<size_t>(mb.real_tokens));
  int64_t i = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const v1::PromptGroup& pg = groups[g]->group;
    const int64_t p = pg.prompt_tokens_size();
    for (const v1::Response& r : pg.responses()) {
      ASYMPO_RETURN_IF_ERROR(CheckLaidOut(r, i, grpo));
      const int64_t row = placements[static_cast<size_t>(i)].row;
      const int64_t c = placements[static_cast<size_t>(i)].column;
      const int64_t length = p + r.tokens_size();
      int generated = 0;  // the generated tokens before token j
      for (int64_t k = 0; k < p; ++k) ids[row][c + k] = pg.prompt_tokens(static_cast<int>(k));
      for (int j = 0; j < r.tokens_size(); ++j) {
        const int32_t tok = r.tokens(j);
        if (tok < 0 || tok >= vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat("token ", tok, " is outside the model's vocabulary of ", vocab));
        }
        ids[row][c + p + j] = tok;
        // A token the environment inserted is context only: no log-prob,
        // no loss (Response.loss_mask).
        if (!IsGenerated(r, j)) continue;
        resp[i][j] = true;
        mb.hidden_rows.push_back(row * t + c + p - 1 + j);
        mb.targets.push_back(tok);
        if (grpo) behavior[i * rl + j] = r.behavior_logprobs(generated++);
      }
      for (int64_t k = 0; k < length; ++k) {
        keys[row][c + k] = true;
        pos[row][c + k] = k;
        if (packed) segments[row * t + c + k] = i;
      }
      rewards[i] = r.reward();
      group_index[i] = static_cast<int64_t>(g);
      ++i;
    }
  }
  return mb;
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

// Per response: a row of its own, prompt + response ids; the hidden state
// at position P - 1 + j predicts response token j.
absl::StatusOr<MicroBatch> PaddedLayout::Build(
    const std::vector<const QueuedGroup*>& groups) const {
  std::vector<Placement> placements;
  int64_t longest = 0;
  for (const QueuedGroup* q : groups) {
    longest = std::max(longest, LongestSequence(q->group));
    for (int i = 0; i < q->group.responses_size(); ++i) {
      placements.push_back({static_cast<int64_t>(placements.size()), 0});
    }
  }
  return Lay(groups, static_cast<int64_t>(placements.size()), longest, placements,
             /*packed=*/false, options_);
}

// Splits groups, in order, into micro-batches of at most the budget's real
// tokens (a lone larger group excepted).
std::vector<std::vector<const QueuedGroup*>> PackedLayout::Split(
    const std::vector<QueuedGroup>& groups) const {
  std::vector<std::vector<const QueuedGroup*>> out;
  int64_t tokens = 0;
  for (const QueuedGroup& q : groups) {
    const int64_t n = SequenceTokens(q.group);
    if (!out.empty() && tokens + n <= options_.micro_batch_tokens) {
      tokens += n;
      out.back().push_back(&q);
    } else {
      out.push_back({&q});
      tokens = n;
    }
  }
  return out;
}

// First fit, longest first, into rows of the longest sequence's length.
absl::StatusOr<MicroBatch> PackedLayout::Build(
    const std::vector<const QueuedGroup*>& groups) const {
  std::vector<int64_t> lengths;
  for (const QueuedGroup* q : groups) {
    for (const v1::Response& r : q->group.responses()) {
      lengths.push_back(q->group.prompt_tokens_size() + r.tokens_size());
    }
  }
  const int64_t capacity = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Stable: equal lengths keep their order, so a layout is reproducible.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<Placement> placements(lengths.size());
  std::vector<int64_t> filled;  // per row
  for (const size_t i : order) {
    size_t row = 0;
    while (row < filled.size() && filled[row] + lengths[i] > capacity) ++row;
    if (row == filled.size()) filled.push_back(0);
    placements[i] = {static_cast<int64_t>(row), filled[row]};
    filled[row] += lengths[i];
  }
  const int64_t t = filled.empty() ? 0 : *std::max_element(filled.begin(), filled.end());
  return Lay(groups, static_cast<int64_t>(filled.size()), t, placements, /*packed=*/true, options_);
}

}  // namespace asympo::learner
