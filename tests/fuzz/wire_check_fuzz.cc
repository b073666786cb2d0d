// libFuzzer target: the learner's check of a request's bytes before it is
// parsed (common/wire/wire_check.h), as its raw gRPC methods run it. Beyond not
// crashing:
// - a batch the check passes parses, and its counts are within the limits
//   (what bounds the learner's memory);
// - a batch that parses and that ValidateRolloutBatch accepts is not refused
//   by the check (no false refusals), unless it carries more unknown fields
//   than allowed or the group wire type, which the check refuses on purpose;
// - the answer does not depend on how the bytes are cut into slices;
// - the generic check of another message type: passed means it parses.
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "asympo/v1/rollout.pb.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "common/batch_validation.h"
#include "common/wire/wire_check.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/quiet_protobuf.h"

namespace {

asympo::BatchLimits Limits() {
  asympo::BatchLimits limits;
  limits.vocab_size = 300;
  limits.max_group_size = 8;
  limits.max_prompt_tokens = 64;
  limits.max_response_tokens = 64;
  limits.max_groups_per_batch = 16;
  return limits;
}

void CheckBatch(const asympo::WireSlices& wire, const std::string& bytes) {
  const asympo::BatchLimits limits = Limits();
  const absl::Status check = asympo::CheckRolloutBatchWire(wire, limits);
  ASYMPO_FUZZ_CHECK(check.ok() || check.code() == absl::StatusCode::kInvalidArgument);
  asympo::v1::RolloutBatch batch;
  if (check.ok()) {
    ASYMPO_FUZZ_CHECK(asympo::ParseCheckedWire(wire, &batch).ok());
    ASYMPO_FUZZ_CHECK(batch.groups_size() <= limits.max_groups_per_batch);
    for (const auto& g : batch.groups()) {
      ASYMPO_FUZZ_CHECK(g.responses_size() <= limits.max_group_size);
      ASYMPO_FUZZ_CHECK(g.prompt_tokens_size() <= limits.max_prompt_tokens);
      ASYMPO_FUZZ_CHECK(g.prompt_id().size() <= asympo::kMaxPromptIdBytes);
      for (const auto& r : g.responses()) {
        ASYMPO_FUZZ_CHECK(r.tokens_size() <= limits.max_response_tokens);
        ASYMPO_FUZZ_CHECK(r.behavior_logprobs_size() <= limits.max_response_tokens);
      }
    }
  } else if (batch.ParseFromString(bytes) && asympo::ValidateRolloutBatch(batch, limits).ok()) {
    ASYMPO_FUZZ_CHECK(absl::StrContains(check.message(), "unknown fields") ||
                      absl::StrContains(check.message(), "group wire type"));
  }
  // The same bytes in two slices, cut where the first byte says.
  if (!bytes.empty()) {
    const size_t cut = static_cast<uint8_t>(bytes[0]) % (bytes.size() + 1);
    const asympo::WireSlices two = {absl::string_view(bytes).substr(0, cut),
                                    absl::string_view(bytes).substr(cut)};
    const absl::Status sliced = asympo::CheckRolloutBatchWire(two, limits);
    if (!(sliced == check)) {
      std::fprintf(stderr, "whole: %s\nsliced at %zu: %s\n", check.ToString().c_str(), cut,
                   sliced.ToString().c_str());
    }
    ASYMPO_FUZZ_CHECK(sliced == check);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const asympo::WireSlices wire = {bytes};
  CheckBatch(wire, bytes);
  asympo::v1::RegisterRequest request;
  const absl::Status check = asympo::CheckMessageWire(*request.GetDescriptor(), wire);
  ASYMPO_FUZZ_CHECK(check.ok() || check.code() == absl::StatusCode::kInvalidArgument);
  if (check.ok()) ASYMPO_FUZZ_CHECK(asympo::ParseCheckedWire(wire, &request).ok());
  return 0;
}
