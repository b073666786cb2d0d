// Validation of rollout batches against the learner's limits.
//
// The learner runs ValidateRolloutBatch on every batch before queueing any of
// it; generators may run the same function to catch mistakes before sending.
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "asympo/v1/rollout.pb.h"

namespace asympo {

// The rules a batch must satisfy (docs/protocol.md, "Validation").
struct BatchLimits {
  // Token ids must be in [0, vocab_size).
  int32_t vocab_size = 0;
  // Responses per group, inclusive. min_group_size must be at least 2: an
  // advantage is a reward minus its group's mean.
  int32_t min_group_size = 2;
  int32_t max_group_size = 64;
  // Tokens per prompt / per response, inclusive upper bounds.
  int32_t max_prompt_tokens = 4096;
  int32_t max_response_tokens = 4096;
  // Groups per batch, inclusive upper bound.
  int32_t max_groups_per_batch = 1024;
  // Rewards must lie within [-max_abs_reward, max_abs_reward]: a reward of
  // 1e30 is finite but overflows a step's float32 sums, and one such group
  // would make the whole step non-finite.
  double max_abs_reward = 1e6;
  // When true (the `grpo` baseline) every response must carry
  // behavior_logprobs; otherwise they are optional, and checked when present.
  bool require_behavior_logprobs = false;
};

inline constexpr size_t kMaxPromptIdBytes = 256;
inline constexpr size_t kMaxSourceBytes = 128;
inline constexpr size_t kMaxBatchIdBytes = 128;

// The largest max_abs_reward a learner accepts (a float32 reward's range).
inline constexpr double kMaxAbsRewardBound = 3.4e38;

// Checks that the limits themselves are coherent (positive sizes,
// 2 <= min_group_size <= max_group_size, 0 < max_abs_reward <=
// kMaxAbsRewardBound). INVALID_ARGUMENT names the field.
absl::Status ValidateBatchLimits(const BatchLimits& limits);

// Checks every rule on every group and response of `batch`. Returns OK, or
// INVALID_ARGUMENT whose message starts with the location of the first
// violation, "group <i> (prompt_id \"<id>\") response <j>: ", followed by the
// rule, for example "reward is nan; rewards must be finite".
absl::Status ValidateRolloutBatch(const v1::RolloutBatch& batch, const BatchLimits& limits);

// Sizes of a batch, for accounting.
struct BatchCounts {
  int64_t groups = 0;
  int64_t responses = 0;
  int64_t prompt_tokens = 0;
  int64_t response_tokens = 0;
};
BatchCounts CountBatch(const v1::RolloutBatch& batch);

}  // namespace asympo
