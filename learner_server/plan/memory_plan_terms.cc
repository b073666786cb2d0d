// The memory plan's terms: devices, dtypes, parts and phases by name, when
// each part is alive, and the options' validation (memory_plan.h).
#include "learner_server/plan/memory_plan.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace asympo::learner {
namespace {

constexpr int64_t kMaxMicroBatchTokens = int64_t{1} << 30;  // the learner's flag range

absl::Status Invalid(absl::string_view flag, const absl::AlphaNum& value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", rule));
}

}  // namespace

absl::string_view PlanDeviceName(PlanDevice device) {
  return device == PlanDevice::kCpu ? "cpu" : "cuda";
}

absl::string_view PlanDTypeName(PlanDType dtype) {
  return dtype == PlanDType::kBFloat16 ? "bfloat16" : "float32";
}

absl::StatusOr<PlanDevice> ParsePlanDevice(absl::string_view text) {
  if (text == "cpu") return PlanDevice::kCpu;
  if (text == "cuda" || absl::StartsWith(text, "cuda:")) return PlanDevice::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text, "\" is not a device; expected cpu or cuda"));
}

absl::StatusOr<PlanDType> ParsePlanDType(absl::string_view text) {
  if (text == "float32") return PlanDType::kFloat32;
  if (text == "bfloat16") return PlanDType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text, "\" is not a dtype; expected float32 or bfloat16"));
}

bool MemoryPlan::AliveIn(PlanPart part, PlanPhase phase, PlanDevice device) {
  const bool in_step = phase != PlanPhase::kGather;  // the gradients exist
  const bool in_micro_batch = phase == PlanPhase::kForward || phase == PlanPhase::kLogProbs ||
                              phase == PlanPhase::kBackward;
  switch (part) {
    case PlanPart::kMasterWeights:
    case PlanPart::kMoments:
    case PlanPart::kSnapshotDevice:
    case PlanPart::kWorkspace:
      return true;
    case PlanPart::kSnapshotHost:
    case PlanPart::kSnapshotDelta:
      return device == PlanDevice::kCpu;  // (pinned) host memory on a GPU
    case PlanPart::kCheckpointHost:
      return false;  // host memory, one piece at a time: not in the device totals
    case PlanPart::kGradients:
      return in_step;
    case PlanPart::kGatheredWeights:  // the root unit stays whole to the update
      return in_micro_batch || phase == PlanPhase::kBackwardEnd;
    case PlanPart::kComputeCopy:
    case PlanPart::kActivations:
      return in_micro_batch;
    case PlanPart::kForwardScores:
      return phase == PlanPhase::kForward;
    case PlanPart::kLogProbs:
      return phase == PlanPhase::kLogProbs;
    case PlanPart::kBackward:
      return phase == PlanPhase::kBackward;
    case PlanPart::kEmbeddingGrads:
      return phase == PlanPhase::kBackwardEnd;
    case PlanPart::kUpdate:
      return phase == PlanPhase::kUpdate;
    case PlanPart::kRank0Gather:
      return phase == PlanPhase::kGather;
  }
  return false;
}

absl::Status ValidatePlanOptions(const PlanOptions& o) {
  if (absl::Status s = o.model.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--model: ", s.message()));
  }
  if (o.world_size < 1 || o.world_size > 65536) {
    return Invalid("world_size", o.world_size, "expected 1 to 65536 ranks");
  }
  if (absl::Status s = CheckShardWorld(o.shard, o.world_size); !s.ok()) return s;
  if (o.micro_batch_tokens < 1 || o.micro_batch_tokens > kMaxMicroBatchTokens) {
    return Invalid("micro_batch_tokens", o.micro_batch_tokens, "expected 1 to 1073741824");
  }
  if (o.max_sequence_tokens < 0 || o.max_sequence_tokens > kMaxMicroBatchTokens) {
    return Invalid("max_sequence_tokens", o.max_sequence_tokens,
                   "expected 0 (the micro-batch) to 1073741824");
  }
  if (o.logprob_chunk_rows < 1 || o.logprob_chunk_rows > kMaxMicroBatchTokens) {
    return Invalid("logprob_chunk_rows", o.logprob_chunk_rows, "expected 1 to 1073741824");
  }
  if (o.lora_rank < 0 || o.lora_rank > 4096) {
    return Invalid("lora_rank", o.lora_rank, "expected 0 (no adapters) to 4096");
  }
  if (o.lora_rank > 0 && ((o.lora_targets & 0x7F) == 0 || (o.lora_targets & ~0x7FU) != 0)) {
    return Invalid("lora_targets", o.lora_targets, "no projection to adapt");
  }
  if (o.checkpoint_every < 0) {
    return Invalid("activation_checkpointing", o.checkpoint_every,
                   "expected none, layers or every_N (N >= 1)");
  }
  return absl::OkStatus();
}

absl::string_view PlanPartName(PlanPart part) {
  static constexpr absl::string_view kNames[kPlanParts] = {
      "master weights (float32)",
      "gathered weights (float32)",
      "gradients (float32)",
      "AdamW moments (2 x float32)",
      "compute copy of the weights",
      "activations saved for the backward",
      "attention scores and masks (forward)",
      "log-prob path",
      "last layer's backward",
      "embedding's backward (end)",
      "optimizer update buffers",
      "rank 0's snapshot gather (full sharding: one unit)",
      "snapshot staging on the device",
      "snapshot staging in host memory",
      "the newest version's delta in host memory",
      "a checkpoint piece in host memory (every rank)",
      "workspace outside LibTorch's tensors",
  };
  return kNames[static_cast<size_t>(part)];
}

absl::string_view PlanPhaseName(PlanPhase phase) {
  static constexpr absl::string_view kNames[kPlanPhases] = {
      "forward", "log-probs", "backward", "backward end", "update", "rank-0 gather"};
  return kNames[static_cast<size_t>(phase)];
}

}  // namespace asympo::learner
