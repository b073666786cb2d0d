// ContinuousEngine's multi-turn requests (continuous_engine.h): a sequence
// pauses at the end of a turn with its slot and its keys and values, takes
// an environment's tokens and decodes its next turn.
#include <algorithm>
#include <chrono>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include "absl/strings/str_cat.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"
#include "rollout_server/engine/continuous_engine.h"

namespace asympo::rollout {

int64_t ContinuousEngine::ResponseNeed(const GenerationRequest& r) {
  return r.multi_turn && r.response_budget > 0 ? r.response_budget : r.params.max_new_tokens;
}

ContinuousEngine::Finished ContinuousEngine::Pause(int64_t s, const at::Tensor& tokens,
                                                   const at::Tensor& logprobs, int64_t n,
                                                   uint64_t last_version) {
  Slot& slot = slot_[static_cast<size_t>(s)];
  // The turn just decoded: the positions after the mask's were generated;
  // logprobs are 0 where tokens were inserted.
  const GenerationResult row = ResultOfRow(tokens, logprobs, n, slot.request.params);
  slot.tokens = row.tokens;
  slot.mask.resize(static_cast<size_t>(n), true);
  slot.paused = true;
  ++paused_;
  Finished f{slot.id, row, true};
  f.result.first_version = slot.first_version;
  f.result.last_version = last_version;
  const bool all_generated =
      std::all_of(slot.mask.begin(), slot.mask.end(), [](bool b) { return b; });
  if (!all_generated) {
    f.result.loss_mask = slot.mask;
    f.result.logprobs.clear();
    for (size_t j = 0; j < row.logprobs.size(); ++j) {
      if (slot.mask[j]) f.result.logprobs.push_back(row.logprobs[j]);
    }
  }
  return f;
}

int64_t ContinuousEngine::PausedSlot(uint64_t id) const {
  for (int64_t s = 0; s < slots_; ++s) {
    const Slot& slot = slot_[static_cast<size_t>(s)];
    if (slot.used && slot.paused && slot.id == id) return s;
  }
  return -1;
}

void ContinuousEngine::Prefill(int64_t s, const std::vector<int32_t>& ids, int64_t start) {
  const Slot& slot = slot_[static_cast<size_t>(s)];
  const auto device = model_->options().device;
  const int64_t t = static_cast<int64_t>(ids.size());
  const int64_t prompt_length = static_cast<int64_t>(slot.request.prompt.size());
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor tokens =
      at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::kLong).view({1, t}).to(device);
  const at::Tensor positions = at::arange(prompt_length + start, prompt_length + start + t, longs);
  const at::Tensor hidden = model_->ExtendShared(tokens, positions.view({1, t}), slot.prompt_row,
                                                 prompt_length, s, start, &cache_);
  logits_[s].copy_(model_->Logits(hidden.select(1, t - 1)).select(0, 0));
}

absl::Status ContinuousEngine::Resume(uint64_t id, const std::vector<int32_t>& append,
                                      int32_t max_new_tokens) {
  const int64_t s = PausedSlot(id);
  if (s < 0) {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, " is not paused"));
  }
  Slot& slot = slot_[static_cast<size_t>(s)];
  ASYMPO_RETURN_IF_ERROR(CheckTokenIds(append, model_->config().vocab_size, "appended token"));
  const int64_t n = static_cast<int64_t>(slot.tokens.size());
  const int64_t t = static_cast<int64_t>(append.size());
  if (n + t + 1 > slot.budget) {
    return absl::InvalidArgumentError(absl::StrCat(t, " appended tokens after ", n,
                                                   " leave no room for a generated token in "
                                                   "the response budget of ",
                                                   slot.budget));
  }
  if (max_new_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens is ", max_new_tokens, "; it must be positive"));
  }
  absl::Status done = GuardTorch("generation", [&]() -> absl::Status {
    c10::InferenceMode inference_mode;
    const auto start = std::chrono::steady_clock::now();
    std::vector<int32_t> ids;
    int64_t from = n;
    if (!options_.reuse_kv) {
      ids = slot.tokens;  // the whole response again
      from = 0;
    }
    ids.insert(ids.end(), append.begin(), append.end());
    if (!ids.empty()) Prefill(s, ids, from);
    if (!model_->options().device.is_cpu()) logits_[s].sum().item<float>();  // synchronise
    ++stats_.resumes;
    stats_.resume_tokens += static_cast<int64_t>(ids.size());
    stats_.resume_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (t > 0) {
      const auto longs = at::TensorOptions().dtype(at::kLong);
      const at::Tensor values =
          at::tensor(std::vector<int64_t>(append.begin(), append.end()), longs)
              .to(tokens_.device());
      tokens_[s].narrow(0, n, t).copy_(values);
      logprobs_[s].narrow(0, n, t).zero_();
      last_[s].fill_(static_cast<int64_t>(append.back()));
    }
    slot.tokens.insert(slot.tokens.end(), append.begin(), append.end());
    slot.mask.resize(static_cast<size_t>(n + t), false);
    slot.steps += t;
    length_[s].fill_(n + t);
    max_new_[s].fill_(std::min<int64_t>(n + t + max_new_tokens, slot.budget));
    live_[s].fill_(true);
    slot.paused = false;
    --paused_;
    return absl::OkStatus();
  });
  if (!done.ok()) Reset();  // as Step: the engine is then empty
  return done;
}

absl::Status ContinuousEngine::End(uint64_t id) {
  const int64_t s = PausedSlot(id);
  if (s < 0) return absl::NotFoundError(absl::StrCat("request ", id, " is not paused"));
  c10::InferenceMode inference_mode;
  Slot& slot = slot_[static_cast<size_t>(s)];
  stats_.generated_tokens += std::count(slot.mask.begin(), slot.mask.end(), true);
  ReleasePromptRow(slot.prompt_row);
  slot = Slot();
  prompt_length_[s].fill_(0);
  length_[s].fill_(0);
  --running_;
  --paused_;
  ++stats_.finished;
  return absl::OkStatus();
}

}  // namespace asympo::rollout
