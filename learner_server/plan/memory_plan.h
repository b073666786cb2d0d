// The learner's memory plan: what one data-parallel rank holds, part by
// part, for a model, a world size, a sharding mode, activation
// checkpointing, a micro-batch size and low-rank adapters, and whether that
// fits a device.
// asympo-plan prints it; the learner logs it at start and refuses to start
// when it does not fit (memory_plan_check.h).
//
// The plan follows what the code allocates, not a rule of thumb:
//   - float32 master weights, float32 gradients, AdamW's two float32
//     moments (learner_server/optim/adamw.h), divided as --dist_shard divides
//     them (sharded_adamw.h: ZeRO-1; full_shard.h: units of one decoder
//     layer each, and a root unit of embed_tokens, the final norm and an
//     untied lm_head, cut into ceil(unit / N) chunks);
//   - the compute copy: with bfloat16 compute each forward casts every
//     weight it uses (PolicyModel::ComputeWeight) and at::linear keeps the
//     cast for the backward, so a layer's bfloat16 weights live from its
//     forward to its backward unless the layer is recomputed;
//   - activations: what each decoder layer saves for the backward
//     (common/model/policy_model.cc: RMSNorm in float32, the projections,
//     Qwen3's q/k norms, rotary, attention, SwiGLU), per micro-batch of
//     positions laid out in rows as long as the longest sequence
//     (micro_batches.h). Attention on the CPU (LibTorch 1.13) is a masked
//     GEMM that saves a float32 (heads x T x T) probability matrix per row;
//     on CUDA (LibTorch >= 2.1) scaled_dot_product_attention's
//     memory-efficient kernel saves O(T) per head and the additive
//     (rows, 1, T, T) bias in the compute dtype, which the model builds once
//     per forward and every layer shares (AlignedAttentionBias);
//   - the transient buffers of the phase each peak is reached in: the
//     attention scores of the last layer's forward, the log-prob path
//     (token_logprobs.h), the last layer's backward, the embedding's
//     backward at the end (with tied embeddings the lm_head gradient waits
//     there for the embedding's, and the two are summed into a third
//     buffer), the optimizer update, and rank 0's gathers between steps
//     (full sharding: each unit's weights in turn for every snapshot, on
//     the device: the largest unit); a
//     checkpoint gathers nothing: every rank writes and reads its own part,
//     one piece at a time through host memory (kCheckpointHost, reported
//     but not in the device totals);
//   - rank 0's snapshot staging (snapshot_publisher.h): one copy of the
//     weights in --dtype on the device (two when a NCCL path broadcasts
//     from it: snapshot_device_held), two in host memory (pinned on a GPU:
//     reported, but not device memory), and with delta versions the
//     newest one's delta (at most half a copy, in host memory);
//   - a workspace outside LibTorch's tensors (kCudaWorkspaceBytes plus
//     kCudaFragmentation of the rest on a GPU, kCpuWorkspaceBytes on the
//     CPU).
// The peak is the largest phase's sum. Pure arithmetic (this header brings no
// LibTorch headers): thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/model_config.h"
#include "learner_server/optim/dist_shard.h"

namespace asympo::learner {

// Where the learner runs (--device): the attention kernels differ.
enum class PlanDevice { kCpu, kCuda };
// float32 or bfloat16 (--compute_dtype, --dtype).
enum class PlanDType { kFloat32, kBFloat16 };

absl::string_view PlanDeviceName(PlanDevice device);
absl::string_view PlanDTypeName(PlanDType dtype);
// INVALID_ARGUMENT naming the value and the choices.
absl::StatusOr<PlanDevice> ParsePlanDevice(absl::string_view text);
absl::StatusOr<PlanDType> ParsePlanDType(absl::string_view text);

struct PlanOptions {
  ModelConfig model;
  int64_t world_size = 1;
  DistShard shard = DistShard::kNone;
  PlanDevice device = PlanDevice::kCuda;
  PlanDType compute_dtype = PlanDType::kBFloat16;
  // Snapshots for the rollouts (--dtype), staged on the device
  // (--snapshot_staging=device) or straight into host memory.
  PlanDType snapshot_dtype = PlanDType::kFloat32;
  bool snapshot_device = true;
  // A NCCL path (--broadcast_nccl_world_size, --weight_group=nccl) on a GPU
  // broadcasts each version from its device copy, which the published
  // version holds while the trainer stages the next into another: two
  // device copies (with snapshot_device).
  bool snapshot_device_held = false;
  // Delta versions (--weight_deltas): the newest version's delta beside
  // its snapshot in host memory, at most half of it.
  bool snapshot_deltas = true;
  // Tokens per micro-batch (--micro_batch_tokens): real tokens when packed,
  // padded positions otherwise.
  int64_t micro_batch_tokens = 16384;
  // The longest prompt + response: the row length. 0: the micro-batch
  // itself (one row).
  int64_t max_sequence_tokens = 0;
  bool pack_sequences = true;
  // --activation_checkpointing as ModelOptions::checkpoint_every: 0 none,
  // 1 every layer, N layers 0, N, 2N, ...
  int64_t checkpoint_every = 0;
  int64_t logprob_chunk_rows = 1024;
  // The plan is rank 0's: it publishes the snapshots and gathers the
  // sharded state for checkpoints (the largest rank).
  bool rank0 = true;
  // Checkpoints are written (--checkpoint_dir).
  bool checkpoints = true;
  // Counts the workspace outside LibTorch's tensors (off to compare with
  // what LibTorch allocates).
  bool workspace = true;
  // Low-rank adapters (--lora_rank; 0: every weight trains) on the
  // projections of lora_targets (LoraOptions::targets' bits:
  // common/model/lora.h; 0x7F: all seven). The base is then frozen in the
  // compute dtype, whole on every rank, with no gradients, moments or
  // float32 copy; what the parts below say of the weights' training state
  // (gradients, moments, sharding, gathers, checkpoints, snapshots) holds
  // for the adapters alone.
  int64_t lora_rank = 0;
  uint32_t lora_targets = 0x7F;
};

// The plan's parts, in the order they are printed.
enum class PlanPart {
  kMasterWeights,    // float32, this rank's share (with adapters: the frozen base beside them)
  kGatheredWeights,  // full sharding: the root unit and one decoder layer, whole
  kGradients,        // float32
  kMoments,          // AdamW, 2 x float32, this rank's share
  kComputeCopy,      // bfloat16 casts of the weights, forward to backward
  kActivations,      // saved for the backward
  kForwardScores,    // the last layer's attention scores and the mask, in the forward
  kLogProbs,         // the log-prob path's buffers, end of forward / start of backward
  kBackward,         // the last layer's backward (and its recomputation)
  kEmbeddingGrads,   // the end of the backward: the embedding's gradients
  kUpdate,           // the optimizer step's buffers
  kRank0Gather,      // rank 0, fully sharded: one unit gathered for the snapshot
  kSnapshotDevice,   // rank 0: the staged snapshot on the device
  kSnapshotHost,     // rank 0: the snapshot in host memory (pinned on a GPU)
  kSnapshotDelta,    // rank 0: the newest version's delta in host memory (at most half)
  kCheckpointHost,   // every rank: one piece of its checkpoint part in host memory
  kWorkspace,        // outside LibTorch's tensors
};
inline constexpr int kPlanParts = 17;

// When a part is alive; the peak is the largest of these phases' sums.
enum class PlanPhase { kForward, kLogProbs, kBackward, kBackwardEnd, kUpdate, kGather };
inline constexpr int kPlanPhases = 6;

// Workspace on a GPU: the CUDA context and kernel images (about 0.5 GiB
// with CUDA 12's lazy loading), cuBLAS/cuBLASLt workspaces (tens of MiB
// per stream) and the collectives' buffers: 1 GiB, plus 5% of the tensors'
// peak for the caching allocator's fragmentation (reserved minus allocated).
inline constexpr int64_t kCudaWorkspaceBytes = int64_t{1} << 30;
inline constexpr double kCudaFragmentation = 0.05;
// On the CPU: the process beyond LibTorch's tensors (code, gRPC, the queue,
// the allocator's arenas).
inline constexpr int64_t kCpuWorkspaceBytes = int64_t{256} << 20;

struct MemoryPlan {
  std::array<int64_t, kPlanParts> bytes{};
  std::array<int64_t, kPlanPhases> phase_bytes{};
  // The largest phase: the rank's peak.
  int64_t peak_bytes = 0;
  PlanPhase peak_phase = PlanPhase::kForward;
  // The model's parameters (tied embeddings once), and the adapters' (0
  // without).
  int64_t parameters = 0;
  int64_t adapter_parameters = 0;
  // The micro-batch's layout: rows of row_length positions.
  int64_t rows = 0;
  int64_t row_length = 0;

  int64_t of(PlanPart part) const { return bytes[static_cast<size_t>(part)]; }
  // Whether `part` counts in `phase`'s sum.
  static bool AliveIn(PlanPart part, PlanPhase phase, PlanDevice device);
};

// Checks the options; INVALID_ARGUMENT naming the asympo-plan flag and the
// rule (--world_size, --micro_batch_tokens, --max_sequence_tokens,
// --logprob_chunk_rows, --activation_checkpointing, --dist_shard, --model,
// --lora_rank, --lora_targets).
absl::Status ValidatePlanOptions(const PlanOptions& options);

// The plan, or ValidatePlanOptions's error.
absl::StatusOr<MemoryPlan> PlanMemory(const PlanOptions& options);

// The largest micro_batch_tokens (1 to 2^30) whose plan fits in
// `budget_bytes` (binary search; the plan grows with the micro-batch);
// 0 when not even one token fits.
absl::StatusOr<int64_t> LargestMicroBatch(const PlanOptions& options, int64_t budget_bytes);

absl::string_view PlanPartName(PlanPart part);
absl::string_view PlanPhaseName(PlanPhase phase);

}  // namespace asympo::learner
