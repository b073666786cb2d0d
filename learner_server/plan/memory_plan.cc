#include "learner_server/plan/memory_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "learner_server/loss/token_logprobs.h"
#include "learner_server/optim/sharded_adamw.h"

namespace asympo::learner {
namespace {

constexpr int64_t kMaxMicroBatchTokens = int64_t{1} << 30;  // the learner's flag range
// A part's bytes are computed in double (a million-token row's square
// overflows int64) and saturate here, so that a phase's sum cannot.
constexpr double kMaxPartBytes = static_cast<double>(int64_t{1} << 58);

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The model's sizes (as doubles, for the products below) and the bytes of
// its compute dtype.
struct Dims {
  double h = 0, q = 0, kv = 0, ff = 0, layers = 0, vocab = 0, heads = 0, kv_heads = 0, d = 0;
  bool qk_norm = false, tied = false;
  int64_t layer_params = 0;  // one decoder layer
  int64_t root_params = 0;   // embed_tokens, the final norm, an untied lm_head
  int64_t params = 0;
  double largest_param = 0;  // the largest single tensor
  double c = 4;              // compute dtype bytes
  // What trains: the weights, or with adapters the adapters (frozen: the
  // base is then held in the compute dtype and gets no gradients).
  bool frozen = false;
  double rank = 0, targets = 0;  // adapters' rank and projections per layer
  int64_t train_layer = 0, train_root = 0, train_params = 0;
  double train_largest = 0;
};

// One micro-batch: `rows` rows of `s` positions (n in all), m scored tokens.
struct Batch {
  double rows = 0, s = 0, n = 0, m = 0;
};

Dims DimsOf(const PlanOptions& o) {
  const ModelConfig& m = o.model;
  Dims d;
  d.h = static_cast<double>(m.hidden_size);
  d.heads = static_cast<double>(m.num_attention_heads);
  d.kv_heads = static_cast<double>(m.num_key_value_heads);
  d.d = static_cast<double>(m.head_dim);
  d.q = d.heads * d.d;
  d.kv = d.kv_heads * d.d;
  d.ff = static_cast<double>(m.intermediate_size);
  d.layers = static_cast<double>(m.num_hidden_layers);
  d.vocab = static_cast<double>(m.vocab_size);
  d.qk_norm = m.qk_norm;
  d.tied = m.tie_word_embeddings;
  d.params = m.NumParameters();
  d.root_params = m.vocab_size * m.hidden_size * (m.tie_word_embeddings ? 1 : 2) + m.hidden_size;
  d.layer_params = (d.params - d.root_params) / std::max<int64_t>(1, m.num_hidden_layers);
  d.largest_param = std::max({d.vocab * d.h, d.ff * d.h, d.q * d.h});
  d.c = o.compute_dtype == PlanDType::kBFloat16 ? 2 : 4;
  d.train_layer = d.layer_params, d.train_root = d.root_params, d.train_params = d.params;
  d.train_largest = d.largest_param;
  if (o.lora_rank > 0) {  // A (r, in) and B (out, r) of each adapted projection
    const double in_out[7] = {d.h + d.q,  d.h + d.kv, d.h + d.kv, d.q + d.h,
                              d.h + d.ff, d.h + d.ff, d.ff + d.h};
    d.frozen = true;
    d.rank = static_cast<double>(o.lora_rank);
    double layer = 0;
    for (int t = 0; t < 7; ++t) {
      if (((o.lora_targets >> t) & 1U) == 0) continue;
      layer += d.rank * in_out[t];
      d.targets += 1;
    }
    d.train_largest = d.rank * std::max({d.ff, d.h, d.q});  // at most
    d.train_layer = static_cast<int64_t>(layer);
    d.train_root = 0;
    d.train_params = d.train_layer * m.num_hidden_layers;
  }
  return d;
}

// Packed: the micro-batch's real tokens in rows as long as the longest
// sequence; padded: the budget counts positions, rows x longest.
Batch BatchOf(const PlanOptions& o) {
  const int64_t t = o.micro_batch_tokens;
  const int64_t s = o.max_sequence_tokens > 0 ? o.max_sequence_tokens : t;
  const int64_t rows = o.pack_sequences ? CeilDiv(t, s) : std::max<int64_t>(1, t / s);
  Batch b;
  b.rows = static_cast<double>(rows);
  b.s = static_cast<double>(s);
  b.n = b.rows * b.s;
  b.m = std::min(static_cast<double>(t), b.n);
  return b;
}

// A float32 RMSNorm over `width`: its float32 input and the normed values
// in the compute dtype, and one float32 statistic per `groups`. LibTorch
// 1.13 (the CPU) also keeps the float32 squares for mean()'s backward
// (measured: bench/memory_plan_bench.cc); 2.x keeps only their sizes.
double NormSaved(const Dims& d, PlanDevice device, double n, double width, double groups) {
  const double squares = device == PlanDevice::kCpu ? 4 : 0;
  return (4 + squares + d.c) * n * width + 4 * n * groups;
}

// Attention as the device runs it (see the header), what its layer keeps.
double AttentionSaved(const Dims& d, const Batch& b, PlanDevice device) {
  const double scores = b.rows * d.heads * b.s * b.s;
  if (device == PlanDevice::kCpu) {
    // q regrouped, k and v made dense, the heads' output; float32 softmax
    // probabilities, and their cast when the compute dtype is narrower.
    return d.c * b.n * (2 * d.q + 2 * d.kv) + scores * (4 + (d.c == 4 ? 0 : d.c));
  }
  // q, k and v repeated to every query head, the output and its
  // re-layout for o_proj, the log-sum-exp (the mask's additive bias is
  // the forward's, shared by every layer: KeptMask).
  const double kv_repeated = d.heads > d.kv_heads ? d.q : d.kv;
  return d.c * b.n * (3 * d.q + 2 * kv_repeated) + 4 * b.rows * d.heads * b.s;
}

// What one decoder layer that is not recomputed keeps for its backward.
double LayerSaved(const Dims& d, const Batch& b, PlanDevice device) {
  double bytes = NormSaved(d, device, b.n, d.h, 1) + d.c * b.n * d.h;  // input norm, output
  if (d.qk_norm) {
    bytes += NormSaved(d, device, b.n, d.q, d.heads) + NormSaved(d, device, b.n, d.kv, d.kv_heads);
  }
  if (d.c != 4) bytes += 2 * b.n * d.d * d.c;  // cos and sin in the compute dtype
  bytes += AttentionSaved(d, b, device);
  bytes += NormSaved(d, device, b.n, d.h, 1) + d.c * b.n * d.h;  // post-attention norm
  bytes += 4 * d.c * b.n * d.ff;                                 // gate, silu, up, their product
  return bytes;
}

// Decoder layers that keep only their input (checkpointed, or all of them
// with full sharding).
double RecomputedLayers(const PlanOptions& o, const Dims& d) {
  if (o.shard == DistShard::kFull) return d.layers;
  if (o.checkpoint_every <= 0) return 0;
  return std::ceil(d.layers / static_cast<double>(o.checkpoint_every));
}

// The mask the model builds once per forward (PolicyModel::AttentionBias).
// On the CPU an additive bias in the compute dtype, kept for the backward
// when a recomputed layer reads it again. On CUDA the additive bias that
// scaled_dot_product_attention takes, in the compute dtype with rows
// padded to 16 keys (AlignedAttentionBias): every layer's backward keeps
// that one tensor, recomputed or not.
double KeptMask(const Dims& d, const Batch& b, PlanDevice device, bool recomputing) {
  if (device == PlanDevice::kCuda) return d.c * b.rows * b.s * std::ceil(b.s / 16) * 16;
  if (!recomputing) return 0;
  return b.rows * b.s * b.s * d.c;
}

double Activations(const PlanOptions& o, const Dims& d, const Batch& b) {
  const double recomputed = RecomputedLayers(o, d);
  double bytes = (d.layers - recomputed) * LayerSaved(d, b, o.device);
  bytes += recomputed * d.c * b.n * d.h;         // their inputs
  bytes += NormSaved(d, o.device, b.n, d.h, 1);  // the final norm
  bytes += 2 * 4 * b.n * d.d;                    // float32 rotary tables
  bytes += 25 * b.n;                             // ids, positions, segments, key mask
  // Each adapter's rank-r product x A^T, kept for B's gradient (its input
  // x is kept anyway).
  bytes += (d.layers - recomputed) * d.targets * d.c * b.n * d.rank;
  return bytes + KeptMask(d, b, o.device, recomputed > 0);
}

// The forward of the last layer's attention: the scores beside the
// probabilities on the CPU (saved, or, in a layer run without a graph to
// be recomputed, not yet freed), and the masks Forward holds while the
// layers run.
double ForwardScores(const PlanOptions& o, const Dims& d, const Batch& b) {
  const bool recomputing = RecomputedLayers(o, d) > 0;
  const double square = b.rows * b.s * b.s;
  double bytes = square + 2 * b.s * b.s;            // visible (rows), causal and self (one each)
  if (o.device == PlanDevice::kCuda) return bytes;  // the bias: KeptMask
  if (!recomputing) bytes += square * d.c;
  bytes += d.heads * square * (d.c + (recomputing ? 4 : 0));
  return bytes;
}

// The log-prob path (token_logprobs.cc), the larger of its forward and
// its backward, beside the hidden states and the picked rows:
//   forward: the lm_head cast to the compute dtype and the chunk's two
//     float32 (rows, V) buffers (ChunkedLogProbsPeakBytes);
//   backward: the cast, the full (V, H) float32 weight gradient and either
//     the chunk's softmax beside its logits (float32, and their
//     compute-dtype original), or, narrower compute, the chunk's gradient
//     in both dtypes with the (V, H) product of the weight-gradient GEMM
//     (and on the CPU that product cast to float32 to be added).
double LogProbs(const PlanOptions& o, const Dims& d, const Batch& b) {
  const bool narrow = d.c != 4;
  const double rows = std::min(b.m, static_cast<double>(o.logprob_chunk_rows));
  const double logits = rows * d.vocab;  // one chunk's
  const double weight = d.vocab * d.h;
  // A frozen base is already in the compute dtype and gets no gradient.
  const double cast = narrow && !d.frozen ? weight * d.c : 0;
  const double picked = d.c * b.m * d.h, indices = 16 * b.m;
  const double chunks = static_cast<double>(ChunkedLogProbsPeakBytes(
      static_cast<int64_t>(b.m), static_cast<int64_t>(d.vocab), o.logprob_chunk_rows));
  const double forward = d.c * b.n * d.h + picked + cast + chunks + 4 * b.m;
  const double softmax = chunks + (narrow ? logits * d.c : 0);
  const double weight_grad =
      narrow && !d.frozen
          ? logits * (4 + d.c) + cast + (o.device == PlanDevice::kCpu ? 4 * weight : 0)
          : 0;
  const double backward =
      2 * picked + (d.frozen ? 0 : 4 * weight) + cast + std::max(softmax, weight_grad);
  return std::max(forward, backward) + indices;
}

// The last layer's backward: its recomputation when it keeps only its
// input (its activations and bfloat16 weights; when the last layer is not
// recomputed, the first recomputed one runs after the layers above it
// freed as much), then the larger of two
// stages: SwiGLU's gradients beside everything the layer saved, or
// attention's (the scores' on the CPU) once SwiGLU's and the second norm's
// saved tensors are freed; the residual stream's gradients, and with full
// sharding the layer's flattened gradient. A tied lm_head's float32
// gradient waits for the embedding's until the end of the backward.
double Backward(const PlanOptions& o, const Dims& d, const Batch& b) {
  double bytes = d.tied && !d.frozen ? 4 * d.vocab * d.h : 0;
  // A frozen base needs no cast for the recomputation nor weight gradients.
  const double layer = d.frozen ? 0 : static_cast<double>(d.layer_params);
  const int64_t last = o.model.num_hidden_layers - 1;
  const bool last_recomputed =
      o.shard == DistShard::kFull || (o.checkpoint_every > 0 && last % o.checkpoint_every == 0);
  if (last_recomputed) bytes += LayerSaved(d, b, o.device) + (d.c == 4 ? 0 : layer * d.c);
  const double weight_grad = d.frozen ? 0 : d.ff * d.h * (d.c == 4 ? 4 : 4 + d.c);
  const double mlp = 3 * d.c * b.n * d.ff + weight_grad;
  const double mlp_saved =
      4 * d.c * b.n * d.ff + NormSaved(d, o.device, b.n, d.h, 1) + d.c * b.n * d.h;
  const double attention = o.device == PlanDevice::kCpu
                               ? 2 * 4 * b.rows * d.heads * b.s * b.s
                               : 3 * d.c * b.n * d.q + 4 * b.rows * d.heads * b.s;
  bytes += std::max(mlp, attention - mlp_saved) + 2 * d.c * b.n * d.h;
  if (o.shard == DistShard::kFull) bytes += 4 * static_cast<double>(d.train_layer);
  return bytes;
}

// The embedding's backward, last: its dense float32 (V, H) gradient and,
// tied, the lm_head's that waited for it and their sum.
double EmbeddingGrads(const Dims& d) { return d.frozen ? 0 : (d.tied ? 3 : 1) * 4 * d.vocab * d.h; }

// Floats of this rank's share of everything (full sharding: per unit).
int64_t ShardFloats(const PlanOptions& o, const Dims& d) {
  const int64_t n = o.world_size;
  if (o.shard == DistShard::kNone) return d.train_params;
  if (o.shard == DistShard::kOptimizer) return CeilDiv(d.train_params, n);
  const int64_t layers = o.model.num_hidden_layers;
  return CeilDiv(std::max<int64_t>(d.train_root, 1), n) + layers * CeilDiv(d.train_layer, n);
}

// The optimizer step, after the last backward (the gradients still whole
// where they are).
double Update(const PlanOptions& o, const Dims& d) {
  const double bucket = static_cast<double>(ShardedAdamW::kBucketElements);
  const double world = static_cast<double>(o.world_size);
  switch (o.shard) {
    case DistShard::kNone:
      // AdamW's temporaries on the largest tensor; the all-reduce bucket
      // (no larger than all the gradients; a larger tensor goes alone).
      return 4 * std::max(2 * d.train_largest, o.world_size > 1
                                                   ? std::min(static_cast<double>(d.train_params),
                                                              std::max(bucket, d.train_largest))
                                                   : 0.0);
    case DistShard::kOptimizer: {
      // The reduced chunk, and one round's reduce-scatter inputs.
      const double chunk = static_cast<double>(CeilDiv(d.train_params, o.world_size));
      return 4 * (chunk + std::min(bucket, world * chunk));
    }
    case DistShard::kFull: {
      // The whole root unit and its flattened gradient, until its
      // reduce-scatter; AdamW's temporaries on a chunk.
      const double chunk =
          static_cast<double>(CeilDiv(std::max(d.train_root, d.train_layer), o.world_size));
      return 4 * (2 * static_cast<double>(d.train_root) + 2 * chunk);
    }
  }
  return 0;
}

// Rank 0 between steps, on its device: full sharding gathers each unit's
// float32 weights there in turn for every snapshot (staged, then freed): the
// largest unit. A checkpoint gathers nothing (every rank writes and reads
// its own part: CheckpointHost).
double Rank0Gather(const PlanOptions& o, const Dims& d) {
  if (!o.rank0 || o.shard != DistShard::kFull) return 0;
  return 4 * static_cast<double>(std::max(d.train_root, d.train_layer));
}

// Every rank, for the time of a save or a resume: one piece of its part
// in host memory at a time (a unit's chunk fully sharded; at most the
// largest unit otherwise).
double CheckpointHost(const PlanOptions& o, const Dims& d) {
  if (!o.checkpoints) return 0;
  const int64_t unit = std::max(d.train_root, d.train_layer);
  return 4 * static_cast<double>(o.shard == DistShard::kFull ? CeilDiv(unit, o.world_size) : unit);
}

void SetPart(MemoryPlan& p, PlanPart part, double bytes) {
  p.bytes[static_cast<size_t>(part)] = static_cast<int64_t>(std::min(bytes, kMaxPartBytes));
}

// Every part but the workspace.
void FillParts(const PlanOptions& o, const Dims& d, const Batch& b, MemoryPlan& p) {
  const double shard = static_cast<double>(ShardFloats(o, d));
  const double params = static_cast<double>(d.train_params);
  const bool full = o.shard == DistShard::kFull;
  // With adapters, the frozen base beside them: whole, in the compute dtype.
  const double base = d.frozen ? d.c * static_cast<double>(d.params) : 0;
  SetPart(p, PlanPart::kMasterWeights, base + 4 * (full ? shard : params));
  SetPart(p, PlanPart::kGatheredWeights,
          full ? 4 * static_cast<double>(d.train_root + d.train_layer) : 0);
  SetPart(p, PlanPart::kGradients, 4 * (full ? shard + static_cast<double>(d.train_root) : params));
  SetPart(p, PlanPart::kMoments, 2 * 4 * shard);
  // The layers that are not recomputed; a recomputed one's is in kBackward.
  const double copies = d.layers - RecomputedLayers(o, d);
  SetPart(p, PlanPart::kComputeCopy,
          d.c == 4 ? 0 : copies * static_cast<double>(d.train_layer) * d.c);
  SetPart(p, PlanPart::kActivations, Activations(o, d, b));
  SetPart(p, PlanPart::kForwardScores, ForwardScores(o, d, b));
  SetPart(p, PlanPart::kLogProbs, LogProbs(o, d, b));
  SetPart(p, PlanPart::kBackward, Backward(o, d, b));
  SetPart(p, PlanPart::kEmbeddingGrads, EmbeddingGrads(d));
  SetPart(p, PlanPart::kUpdate, Update(o, d));
  SetPart(p, PlanPart::kRank0Gather, Rank0Gather(o, d));
  SetPart(p, PlanPart::kCheckpointHost, CheckpointHost(o, d));
  const double snapshot = o.rank0 ? params * (o.snapshot_dtype == PlanDType::kFloat32 ? 4 : 2) : 0;
  SetPart(p, PlanPart::kSnapshotDevice,
          o.snapshot_device
              ? (o.snapshot_device_held && o.device == PlanDevice::kCuda ? 2 : 1) * snapshot
              : 0);
  SetPart(p, PlanPart::kSnapshotHost, 2 * snapshot);
  SetPart(p, PlanPart::kSnapshotDelta, o.snapshot_deltas ? snapshot / 2 : 0);
}

// Each phase's sum, the workspace added to it (a fraction of it on a GPU).
void SumPhases(const PlanOptions& o, MemoryPlan& p) {
  int64_t workspace = 0;
  for (int ph = 0; ph < kPlanPhases; ++ph) {
    int64_t sum = 0;
    for (int part = 0; part < kPlanParts; ++part) {
      if (MemoryPlan::AliveIn(static_cast<PlanPart>(part), static_cast<PlanPhase>(ph), o.device)) {
        sum += p.bytes[static_cast<size_t>(part)];
      }
    }
    int64_t extra = 0;
    if (o.workspace) {
      extra = o.device == PlanDevice::kCpu
                  ? kCpuWorkspaceBytes
                  : kCudaWorkspaceBytes +
                        static_cast<int64_t>(kCudaFragmentation * static_cast<double>(sum));
    }
    p.phase_bytes[static_cast<size_t>(ph)] = sum + extra;
    if (sum + extra > p.peak_bytes) {
      p.peak_bytes = sum + extra;
      p.peak_phase = static_cast<PlanPhase>(ph);
      workspace = extra;
    }
  }
  SetPart(p, PlanPart::kWorkspace, static_cast<double>(workspace));
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const PlanOptions& o) {
  if (absl::Status s = ValidatePlanOptions(o); !s.ok()) return s;
  const Dims d = DimsOf(o);
  const Batch b = BatchOf(o);
  MemoryPlan p;
  p.parameters = d.params;
  p.adapter_parameters = d.frozen ? d.train_params : 0;
  p.rows = b.rows;
  p.row_length = b.s;
  FillParts(o, d, b, p);
  SumPhases(o, p);
  return p;
}

absl::StatusOr<int64_t> LargestMicroBatch(const PlanOptions& options, int64_t budget_bytes) {
  PlanOptions o = options;
  const auto fits = [&](int64_t tokens) -> absl::StatusOr<bool> {
    o.micro_batch_tokens = tokens;
    absl::StatusOr<MemoryPlan> plan = PlanMemory(o);
    if (!plan.ok()) return plan.status();
    return plan->peak_bytes <= budget_bytes;
  };
  // The largest `lo` that fits: fits(lo), !fits(hi).
  int64_t lo = 0, hi = kMaxMicroBatchTokens + 1;
  absl::StatusOr<bool> top = fits(kMaxMicroBatchTokens);
  if (!top.ok()) return top.status();
  if (*top) return kMaxMicroBatchTokens;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    absl::StatusOr<bool> ok = fits(mid);
    if (!ok.ok()) return ok.status();
    (*ok ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace asympo::learner
