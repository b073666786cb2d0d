// asympo-plan: the learner's memory per rank, part by part, for a model, a
// world size, a sharding mode and a micro-batch, before anything starts
// (learner_server/plan/memory_plan.h; the learner logs the same plan at start).
//
//   asympo-plan --model=qwen3-8b --world_size=8 --dist_shard=full
//       --micro_batch_tokens=8192 --device_memory_gib=80
//   asympo-plan --model=/models/Qwen3-4B --device=cpu --device_memory_gib=24
//
// Exit status: 0 when the plan fits in --device_memory_gib, 3 when it does
// not (with the flags that would make it fit), 2 for a bad flag (a message
// naming it).
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/flag_ranges.h"
#include "common/flag_usage.h"
#include "common/model/lora.h"
#include "common/model/policy_model.h"
#include "learner_server/plan/memory_plan.h"
#include "learner_server/plan/memory_plan_report.h"

ABSL_FLAG(std::string, model, "",
          "The model: qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b or llama3.2-3b (their published "
          "shapes), a Hugging Face model directory, or its config.json.");
ABSL_FLAG(int64_t, world_size, 1, "Data-parallel ranks (the learner's --dist_world_size).");
ABSL_FLAG(std::string, dist_shard, "none",
          "What each rank keeps: none (everything), optimizer (ZeRO-1: 1/world_size of the AdamW "
          "moments) or full (1/world_size of the float32 master weights, gradients and moments; "
          "every layer recomputed in the backward).");
ABSL_FLAG(double, device_memory_gib, 80, "Memory of one rank's device, in GiB.");
ABSL_FLAG(std::string, device, "cuda",
          "cuda (LibTorch 2.x: fused attention) or cpu (LibTorch 1.13: attention keeps its "
          "probabilities); cuda:N is cuda.");
ABSL_FLAG(std::string, compute_dtype, "auto",
          "Activations and matmuls: auto (bfloat16 on cuda, float32 on the cpu), float32 or "
          "bfloat16.");
ABSL_FLAG(std::string, dtype, "float32",
          "Dtype of the snapshots rank 0 stages for the rollouts: float32 or bfloat16.");
ABSL_FLAG(int64_t, micro_batch_tokens, 16384,
          "Tokens per micro-batch: real tokens with --pack_sequences, padded ones (sequences x "
          "longest) without.");
ABSL_FLAG(int64_t, max_sequence_tokens, 0,
          "The longest prompt + response (the learner's --max_prompt_tokens + "
          "--max_response_tokens): the length of a micro-batch's rows. 0: the micro-batch itself "
          "(one row).");
ABSL_FLAG(bool, pack_sequences, true, "Packed sequences (several a row) or one padded row each.");
ABSL_FLAG(std::string, activation_checkpointing, "none",
          "none, layers (every decoder layer recomputed in the backward) or every_N (layers 0, N, "
          "2N, ...).");
ABSL_FLAG(int64_t, lora_rank, 0,
          "Low-rank adapters of this rank (the learner's --lora_rank; 0: every weight trains).");
ABSL_FLAG(std::string, lora_targets, "all",
          "The projections with adapters (the learner's --lora_targets).");
ABSL_FLAG(int64_t, logprob_chunk_rows, 1024, "Rows of logits computed at once for log-probs.");
ABSL_FLAG(bool, checkpoints, true,
          "Checkpoints are written (the learner's --checkpoint_dir): every rank passes its part "
          "through host memory, one piece at a time.");
ABSL_FLAG(bool, weight_deltas, true,
          "Delta versions (the learner's --weight_deltas): the newest version's delta in host "
          "memory beside its snapshot.");
ABSL_FLAG(std::string, snapshot_staging, "device",
          "Where rank 0 stages each published version (the learner's --snapshot_staging): "
          "device or host (no device copy).");
ABSL_FLAG(bool, nccl_weights, false,
          "Versions go over NCCL from the device copy (the learner's --broadcast_nccl_world_size "
          "or --weight_group=nccl, on a GPU): a published version holds its device copy while "
          "the next is staged, two device copies.");

ASYMPO_FLAG_RANGE(world_size, 1, 65536);
ASYMPO_FLAG_RANGE(device_memory_gib, 1e-3, 1 << 20);
ASYMPO_FLAG_RANGE(micro_batch_tokens, 1, 1 << 30);
ASYMPO_FLAG_RANGE(max_sequence_tokens, 0, 1 << 30);
ASYMPO_FLAG_RANGE(logprob_chunk_rows, 1, 1 << 30);
ASYMPO_FLAG_RANGE(lora_rank, 0, 4096);

namespace {

using asympo::learner::PlanDType;
using asympo::learner::PlanOptions;

constexpr int kFits = 0, kBadFlag = 2, kDoesNotFit = 3;

// "--flag: message" from a parser's error.
absl::Status Named(const char* flag, const absl::Status& s) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", s.message()));
}

absl::StatusOr<PlanOptions> OptionsFromFlags() {
  PlanOptions o;
  absl::StatusOr<asympo::ModelConfig> model =
      asympo::learner::ResolvePlanModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return model.status();
  o.model = *std::move(model);
  o.world_size = absl::GetFlag(FLAGS_world_size);
  auto shard = asympo::learner::ParseDistShard(absl::GetFlag(FLAGS_dist_shard));
  if (!shard.ok()) return Named("dist_shard", shard.status());
  o.shard = *shard;
  auto device = asympo::learner::ParsePlanDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return Named("device", device.status());
  o.device = *device;
  const std::string compute = absl::GetFlag(FLAGS_compute_dtype);
  if (compute == "auto") {
    o.compute_dtype =
        o.device == asympo::learner::PlanDevice::kCuda ? PlanDType::kBFloat16 : PlanDType::kFloat32;
  } else {
    auto dtype = asympo::learner::ParsePlanDType(compute);
    if (!dtype.ok()) return Named("compute_dtype", dtype.status());
    o.compute_dtype = *dtype;
  }
  auto snapshot = asympo::learner::ParsePlanDType(absl::GetFlag(FLAGS_dtype));
  if (!snapshot.ok()) return Named("dtype", snapshot.status());
  o.snapshot_dtype = *snapshot;
  auto every = asympo::ParseActivationCheckpointing(absl::GetFlag(FLAGS_activation_checkpointing));
  if (!every.ok()) return Named("activation_checkpointing", every.status());
  o.checkpoint_every = *every;
  o.micro_batch_tokens = absl::GetFlag(FLAGS_micro_batch_tokens);
  o.max_sequence_tokens = absl::GetFlag(FLAGS_max_sequence_tokens);
  o.pack_sequences = absl::GetFlag(FLAGS_pack_sequences);
  o.logprob_chunk_rows = absl::GetFlag(FLAGS_logprob_chunk_rows);
  o.checkpoints = absl::GetFlag(FLAGS_checkpoints);
  const std::string staging = absl::GetFlag(FLAGS_snapshot_staging);
  if (staging != "device" && staging != "host") {
    return Named("snapshot_staging", absl::InvalidArgumentError(absl::StrCat(
                                         "\"", staging, "\": expected device or host")));
  }
  o.snapshot_device = staging == "device";
  o.snapshot_device_held = absl::GetFlag(FLAGS_nccl_weights);
  o.snapshot_deltas = absl::GetFlag(FLAGS_weight_deltas);
  o.lora_rank = absl::GetFlag(FLAGS_lora_rank);
  if (o.lora_rank > 0) {
    absl::StatusOr<uint32_t> targets = asympo::ParseLoraTargets(absl::GetFlag(FLAGS_lora_targets));
    if (!targets.ok()) return targets.status();
    o.lora_targets = *targets;
  }
  if (absl::Status s = asympo::learner::ValidatePlanOptions(o); !s.ok()) return s;
  return o;
}

int Fail(const absl::Status& s) {
  std::cerr << "asympo-plan: " << s.message() << "\n";
  return kBadFlag;
}

}  // namespace

int main(int argc, char** argv) {
  asympo::SetProgramUsage(
      "asympo-plan: the learner's memory per rank, part by part (weights, gradients, AdamW "
      "moments, the compute copy, activations, the log-prob path, snapshot staging), the peak "
      "against the device's memory, and the largest --micro_batch_tokens that fits. Exit 0: "
      "fits; 3: does not fit; 2: a bad flag.\n"
      "  asympo-plan --model=qwen3-8b --world_size=8 --dist_shard=full "
      "--micro_batch_tokens=8192 --device_memory_gib=80",
      "learner_server/plan/plan_main.cc");
  if (absl::Status s = asympo::ParseFlagsAndStartLogging(argc, argv); !s.ok()) return Fail(s);
  const absl::StatusOr<PlanOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  const auto plan = asympo::learner::PlanMemory(*options);
  if (!plan.ok()) return Fail(plan.status());
  const double gib = absl::GetFlag(FLAGS_device_memory_gib);
  const int64_t budget = static_cast<int64_t>(gib * static_cast<double>(int64_t{1} << 30));
  std::cout << asympo::learner::FormatMemoryPlan(*plan, *options, absl::GetFlag(FLAGS_model),
                                                 budget);
  const auto largest = asympo::learner::LargestMicroBatch(*options, budget);
  if (!largest.ok()) return Fail(largest.status());
  std::cout << "largest --micro_batch_tokens that fits: "
            << (*largest > 0 ? absl::StrCat(*largest) : std::string("none")) << "\n";
  if (plan->peak_bytes <= budget) return kFits;
  std::cout << "to fit: " << asympo::learner::FitAdvice(*options, budget) << "\n";
  return kDoesNotFit;
}
