// libFuzzer target: ValidateRolloutBatch (common/batch_validation.h) on a
// RolloutBatch parsed from the input, as the learner's service runs it on
// every submitted batch. Beyond not crashing, a batch it accepts must obey
// every limit, checked here again without the validator.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "asympo/v1/rollout.pb.h"
#include "common/batch_validation.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/quiet_protobuf.h"

namespace {

// Small limits, so that accepted batches are within the fuzzer's reach.
asympo::BatchLimits Limits(bool require_behavior_logprobs) {
  asympo::BatchLimits limits;
  limits.vocab_size = 300;
  limits.min_group_size = 2;
  limits.max_group_size = 8;
  limits.max_prompt_tokens = 64;
  limits.max_response_tokens = 64;
  limits.max_groups_per_batch = 16;
  limits.require_behavior_logprobs = require_behavior_logprobs;
  return limits;
}

bool TokensInVocabulary(const google::protobuf::RepeatedField<int32_t>& tokens, int32_t vocab) {
  for (int32_t id : tokens) {
    if (id < 0 || id >= vocab) return false;
  }
  return true;
}

// The rules of docs/protocol.md, "Validation", written out once more.
void CheckAccepted(const asympo::v1::RolloutBatch& batch, const asympo::BatchLimits& limits) {
  ASYMPO_FUZZ_CHECK(batch.groups_size() >= 1 && batch.groups_size() <= limits.max_groups_per_batch);
  ASYMPO_FUZZ_CHECK(batch.source().size() <= asympo::kMaxSourceBytes);
  ASYMPO_FUZZ_CHECK(batch.batch_id().size() <= asympo::kMaxBatchIdBytes);
  for (const asympo::v1::PromptGroup& group : batch.groups()) {
    ASYMPO_FUZZ_CHECK(group.prompt_id().size() <= asympo::kMaxPromptIdBytes);
    ASYMPO_FUZZ_CHECK(!group.prompt_tokens().empty() &&
                      group.prompt_tokens_size() <= limits.max_prompt_tokens);
    ASYMPO_FUZZ_CHECK(TokensInVocabulary(group.prompt_tokens(), limits.vocab_size));
    ASYMPO_FUZZ_CHECK(group.responses_size() >= limits.min_group_size &&
                      group.responses_size() <= limits.max_group_size);
    for (const asympo::v1::Response& r : group.responses()) {
      ASYMPO_FUZZ_CHECK(!r.tokens().empty() && r.tokens_size() <= limits.max_response_tokens);
      ASYMPO_FUZZ_CHECK(TokensInVocabulary(r.tokens(), limits.vocab_size));
      ASYMPO_FUZZ_CHECK(std::isfinite(r.reward()));
      ASYMPO_FUZZ_CHECK(r.behavior_logprobs_size() == 0 ||
                        r.behavior_logprobs_size() == r.tokens_size());
      ASYMPO_FUZZ_CHECK(!limits.require_behavior_logprobs || r.behavior_logprobs_size() > 0);
      for (float lp : r.behavior_logprobs()) ASYMPO_FUZZ_CHECK(std::isfinite(lp) && lp <= 0.0f);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  asympo::v1::RolloutBatch batch;
  if (!batch.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (bool require_logprobs : {false, true}) {
    const asympo::BatchLimits limits = Limits(require_logprobs);
    const absl::Status status = asympo::ValidateRolloutBatch(batch, limits);
    if (status.ok()) {
      CheckAccepted(batch, limits);
    } else {
      ASYMPO_FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    }
  }
  asympo::CountBatch(batch);
  return 0;
}
