#include "learner_server/plan/memory_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "learner_server/loss/token_logprobs.h"
#include "learner_server/memory_plan_check.h"
#include "learner_server/optim/sharded_adamw.h"
#include "learner_server/plan/memory_plan_report.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

// A model small enough to count by hand: hidden 4, 2 layers, 2 query heads
// and 1 KV head of 2, FFN 6, vocabulary 10, untied, no q/k norm.
ModelConfig HandModel() {
  ModelConfig c = ModelConfig::Tiny(10);
  c.model_type = "llama";
  c.hidden_size = 4;
  c.intermediate_size = 6;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 2;
  c.qk_norm = false;
  c.tie_word_embeddings = false;
  return c;
}

// The learner on the CPU in float32, one rank, nothing but training.
PlanOptions CpuOptions(const ModelConfig& c, int64_t tokens, int64_t sequence) {
  PlanOptions o;
  o.model = c;
  o.device = PlanDevice::kCpu;
  o.compute_dtype = PlanDType::kFloat32;
  o.micro_batch_tokens = tokens;
  o.max_sequence_tokens = sequence;
  o.rank0 = false;
  o.checkpoints = false;
  o.workspace = false;
  return o;
}

MemoryPlan Plan(const PlanOptions& o) {
  absl::StatusOr<MemoryPlan> p = PlanMemory(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : MemoryPlan();
}

TEST(MemoryPlanTest, PartsOfASmallModelMatchACountByHand) {
  // Per layer: q 4x4, k and v 2x4 each, o 4x4, three 6x4 MLP matrices and
  // two norms of 4: 16 + 16 + 16 + 72 + 8 = 128. Embeddings and lm_head
  // 10x4 each, final norm 4: 84. P = 2 x 128 + 84 = 340.
  const MemoryPlan p = Plan(CpuOptions(HandModel(), /*tokens=*/6, /*sequence=*/3));
  EXPECT_EQ(p.parameters, 340);
  EXPECT_EQ(p.rows, 2);
  EXPECT_EQ(p.row_length, 3);
  EXPECT_EQ(p.of(PlanPart::kMasterWeights), 4 * 340);
  EXPECT_EQ(p.of(PlanPart::kGradients), 4 * 340);
  EXPECT_EQ(p.of(PlanPart::kMoments), 8 * 340);
  EXPECT_EQ(p.of(PlanPart::kComputeCopy), 0);  // float32 compute casts nothing
  // Six positions, float32. A norm over 4 keeps its input, its squares and
  // the normed values (3 x 4 floats a position) and one statistic: 312;
  // its output, read by the next projections: 96. Attention on the CPU:
  // q regrouped and its output (4 each), k and v (2 each): 12 floats a
  // position, 288; the probabilities, 2 rows x 2 heads x 3 x 3 floats:
  // 144. SwiGLU: gate, silu, up and product, 4 x 6 floats: 576.
  const int64_t layer = (312 + 96) + (288 + 144) + (312 + 96) + 576;
  // Plus the final norm (312), the rotary tables (2 x 6 x 2 floats: 96)
  // and the inputs (ids, positions, segments, key mask: 25 bytes each).
  EXPECT_EQ(p.of(PlanPart::kActivations), 2 * layer + 312 + 96 + 6 * 25);
  // The untied embedding's dense gradient at the end of the backward.
  EXPECT_EQ(p.of(PlanPart::kEmbeddingGrads), 4 * 10 * 4);
  // AdamW's two temporaries on the largest tensor (10 x 4 embeddings).
  EXPECT_EQ(p.of(PlanPart::kUpdate), 2 * 4 * 40);
  // The peak is the largest phase's sum.
  int64_t largest = 0;
  for (const int64_t phase : p.phase_bytes) largest = std::max(largest, phase);
  EXPECT_EQ(p.peak_bytes, largest);
  EXPECT_EQ(p.phase_bytes[static_cast<size_t>(p.peak_phase)], p.peak_bytes);
}

TEST(MemoryPlanTest, BfloatComputeKeepsACopyOfEveryLayerUntilItsBackward) {
  PlanOptions o = CpuOptions(HandModel(), 6, 3);
  o.compute_dtype = PlanDType::kBFloat16;
  EXPECT_EQ(Plan(o).of(PlanPart::kComputeCopy), 2 * 128 * 2);
  o.checkpoint_every = 1;  // recomputed layers cast again in the backward
  EXPECT_EQ(Plan(o).of(PlanPart::kComputeCopy), 0);
}

TEST(MemoryPlanTest, LogProbPathUsesTheChunkedBound) {
  // Float32: the chunks (ChunkedLogProbsPeakBytes) beside the picked rows,
  // the (V, H) weight gradient and the rows' gradient in the backward.
  PlanOptions o = CpuOptions(HandModel(), 6, 3);
  o.logprob_chunk_rows = 4;
  const int64_t chunks = ChunkedLogProbsPeakBytes(6, 10, 4);
  EXPECT_EQ(chunks, 2 * 4 * 10 * 4);
  EXPECT_EQ(Plan(o).of(PlanPart::kLogProbs), 2 * 4 * 6 * 4 + 4 * 10 * 4 + chunks + 16 * 6);
}

TEST(MemoryPlanTest, ShardingDividesMasterWeightsGradientsAndMomentsByTheWorld) {
  const ModelConfig c = NamedModelShape("qwen3-8b").value();
  PlanOptions o;
  o.model = c;
  o.world_size = 8;
  const int64_t p = c.NumParameters();
  const MemoryPlan none = Plan(o);
  EXPECT_EQ(none.of(PlanPart::kMoments), 8 * p);
  o.shard = DistShard::kOptimizer;
  const MemoryPlan zero1 = Plan(o);
  EXPECT_EQ(zero1.of(PlanPart::kMasterWeights), 4 * p);
  EXPECT_EQ(zero1.of(PlanPart::kGradients), 4 * p);
  EXPECT_EQ(zero1.of(PlanPart::kMoments), 8 * ((p + 7) / 8));
  // ZeRO-1's step: the reduced chunk and one round of exchange buffers.
  EXPECT_EQ(zero1.of(PlanPart::kUpdate), 4 * ((p + 7) / 8 + ShardedAdamW::kBucketElements));
  o.shard = DistShard::kFull;
  const MemoryPlan full = Plan(o);
  // Units: the root (untied: two 151936 x 4096 tables and the final norm)
  // and 36 layers, each cut in ceil(unit / 8).
  const int64_t root = 2 * 151936 * 4096 + 4096, layer = (p - root) / 36;
  const int64_t shard = (root + 7) / 8 + 36 * ((layer + 7) / 8);
  EXPECT_EQ(full.of(PlanPart::kMasterWeights), 4 * shard);
  EXPECT_EQ(full.of(PlanPart::kMoments), 8 * shard);
  EXPECT_EQ(full.of(PlanPart::kGradients), 4 * (shard + root));  // the root accumulates whole
  EXPECT_EQ(full.of(PlanPart::kGatheredWeights), 4 * (root + layer));
  EXPECT_NEAR(static_cast<double>(full.of(PlanPart::kMasterWeights)),
              static_cast<double>(none.of(PlanPart::kMasterWeights)) / 8, 4.0 * 8 * 37);
}

TEST(MemoryPlanTest, AllReduceBucketIsNoLargerThanTheGradients) {
  // Replicated ranks all-reduce the gradients in buckets of up to
  // kBucketElements floats (a single larger tensor goes alone): a model
  // smaller than one bucket needs a buffer of its own size, not 64 MiB.
  PlanOptions o = CpuOptions(HandModel(), 6, 3);
  o.world_size = 2;
  EXPECT_EQ(Plan(o).of(PlanPart::kUpdate), 4 * 340);  // all 340 gradients in one bucket
}

TEST(MemoryPlanTest, CheckpointsGatherNothingAndPassOnePieceAtATimeThroughTheHost) {
  // Rank 0 of 8 on GPUs: a checkpoint gathers nothing (every rank writes
  // and reads its own part, one piece at a time through host memory, outside
  // the device totals); full sharding gathers one unit at a time for every
  // snapshot (the largest: the embedding).
  const ModelConfig c = NamedModelShape("qwen3-8b").value();
  const int64_t root = c.vocab_size * c.hidden_size * (c.tie_word_embeddings ? 1 : 2);
  PlanOptions o;
  o.model = c;
  o.world_size = 8;
  o.shard = DistShard::kOptimizer;
  MemoryPlan zero1 = Plan(o);
  EXPECT_EQ(zero1.of(PlanPart::kRank0Gather), 0);
  EXPECT_GE(zero1.of(PlanPart::kCheckpointHost), 4 * root);  // the largest unit, at most
  EXPECT_LT(zero1.of(PlanPart::kCheckpointHost), 4 * root + 4 * c.hidden_size + 64);
  o.shard = DistShard::kFull;
  MemoryPlan full = Plan(o);
  EXPECT_EQ(full.of(PlanPart::kRank0Gather), 4 * (root + c.hidden_size));  // every snapshot
  EXPECT_LT(full.of(PlanPart::kCheckpointHost), 4 * root / 8 + 4 * c.hidden_size);
  EXPECT_FALSE(
      MemoryPlan::AliveIn(PlanPart::kCheckpointHost, PlanPhase::kGather, PlanDevice::kCuda));
  o.checkpoints = false;
  const MemoryPlan no_checkpoints = Plan(o);
  EXPECT_EQ(no_checkpoints.of(PlanPart::kCheckpointHost), 0);
  EXPECT_EQ(no_checkpoints.phase_bytes[static_cast<size_t>(PlanPhase::kGather)],
            full.phase_bytes[static_cast<size_t>(PlanPhase::kGather)]);
  // On the CPU too: only the snapshot's gather, fully sharded.
  o.checkpoints = true;
  o.device = PlanDevice::kCpu;
  EXPECT_EQ(Plan(o).of(PlanPart::kRank0Gather), 4 * (root + c.hidden_size));
  // Staged in host memory only, the snapshot has no device copy.
  o.device = PlanDevice::kCuda;
  EXPECT_GT(Plan(o).of(PlanPart::kSnapshotDevice), 0);
  o.snapshot_device = false;
  EXPECT_EQ(Plan(o).of(PlanPart::kSnapshotDevice), 0);
  o.shard = DistShard::kOptimizer;
  EXPECT_EQ(Plan(o).of(PlanPart::kRank0Gather), 0);
}

// Rank 0's snapshot: a device copy in --dtype (two when a NCCL path
// broadcasts from it: the published version holds one while the next is
// staged), two host copies and, with delta versions, half a copy for the
// newest delta; on a GPU the host parts are reported but not counted.
TEST(MemoryPlanTest, SnapshotPartsCountTheCopiesThatLive) {
  PlanOptions o;
  o.model = NamedModelShape("qwen3-0.6b").value();
  o.snapshot_dtype = PlanDType::kBFloat16;
  o.workspace = false;  // on a GPU a fraction of the rest: the sums below are exact
  const int64_t copy = 2 * o.model.NumParameters();
  const MemoryPlan gpu = Plan(o);
  EXPECT_EQ(gpu.of(PlanPart::kSnapshotDevice), copy);
  EXPECT_EQ(gpu.of(PlanPart::kSnapshotHost), 2 * copy);
  EXPECT_EQ(gpu.of(PlanPart::kSnapshotDelta), copy / 2);
  o.snapshot_device_held = true;
  const MemoryPlan held = Plan(o);
  EXPECT_EQ(held.of(PlanPart::kSnapshotDevice), 2 * copy);
  EXPECT_EQ(held.peak_bytes - gpu.peak_bytes, copy);  // in every phase
  o.snapshot_deltas = false;
  EXPECT_EQ(Plan(o).of(PlanPart::kSnapshotDelta), 0);
  EXPECT_EQ(Plan(o).peak_bytes, held.peak_bytes);  // host memory on a GPU
  // On the CPU the host parts are the device's memory; no NCCL path there.
  o.device = PlanDevice::kCpu;
  o.snapshot_deltas = true;
  const MemoryPlan cpu = Plan(o);
  EXPECT_EQ(cpu.of(PlanPart::kSnapshotDevice), copy);
  o.snapshot_deltas = false;
  EXPECT_EQ(cpu.peak_bytes - Plan(o).peak_bytes, copy / 2);
  // Not for an unpublished rank.
  o.rank0 = false;
  EXPECT_EQ(Plan(o).of(PlanPart::kSnapshotDevice) + Plan(o).of(PlanPart::kSnapshotHost), 0);
}

TEST(MemoryPlanTest, CheckpointingShrinksActivations) {
  for (const PlanDevice device : {PlanDevice::kCpu, PlanDevice::kCuda}) {
    PlanOptions o;
    o.model = NamedModelShape("qwen3-1.7b").value();
    o.device = device;
    o.micro_batch_tokens = 8192;
    const MemoryPlan none = Plan(o);
    o.checkpoint_every = 2;
    const MemoryPlan every2 = Plan(o);
    o.checkpoint_every = 1;
    const MemoryPlan layers = Plan(o);
    EXPECT_GT(none.of(PlanPart::kActivations), every2.of(PlanPart::kActivations));
    EXPECT_GT(every2.of(PlanPart::kActivations), 4 * layers.of(PlanPart::kActivations));
    EXPECT_GT(none.peak_bytes, every2.peak_bytes);
    EXPECT_GT(every2.peak_bytes, layers.peak_bytes);
    // Full sharding recomputes every layer whatever the flag says.
    o.world_size = 8;
    o.shard = DistShard::kFull;
    o.checkpoint_every = 0;
    EXPECT_EQ(Plan(o).of(PlanPart::kActivations), layers.of(PlanPart::kActivations));
  }
}

TEST(MemoryPlanTest, CpuAttentionKeepsTheProbabilitiesAndCudaOnlyTheMask) {
  // The same positions in rows twice as long: only attention's square
  // terms change. On the CPU the float32 probabilities (heads x T x T a
  // row, in every layer); on CUDA the mask's additive bias (T x T a row,
  // bfloat16), built once per forward and shared by the 28 layers.
  const ModelConfig c = NamedModelShape("qwen3-0.6b").value();
  PlanOptions o;
  o.model = c;
  o.micro_batch_tokens = 4096;
  for (const PlanDevice device : {PlanDevice::kCpu, PlanDevice::kCuda}) {
    o.device = device;
    o.compute_dtype = device == PlanDevice::kCpu ? PlanDType::kFloat32 : PlanDType::kBFloat16;
    o.max_sequence_tokens = 1024;
    const int64_t short_rows = Plan(o).of(PlanPart::kActivations);
    o.max_sequence_tokens = 2048;
    const int64_t long_rows = Plan(o).of(PlanPart::kActivations);
    const int64_t square_growth = 4096 * (2048 - 1024);  // rows x length^2
    const int64_t per_element = device == PlanDevice::kCpu ? 28 * 16 * 4 : 2;
    EXPECT_EQ(long_rows - short_rows, per_element * square_growth);
  }
}

TEST(MemoryPlanTest, LargestMicroBatchIsTheLargestThatFits) {
  PlanOptions o;
  o.model = NamedModelShape("qwen3-1.7b").value();
  o.world_size = 8;
  o.shard = DistShard::kOptimizer;
  o.max_sequence_tokens = 8192;
  const int64_t budget = int64_t{80} << 30;
  const absl::StatusOr<int64_t> largest = LargestMicroBatch(o, budget);
  ASSERT_TRUE(largest.ok()) << largest.status();
  ASSERT_GT(*largest, 0);
  o.micro_batch_tokens = *largest;
  EXPECT_LE(Plan(o).peak_bytes, budget);
  o.micro_batch_tokens = *largest + 1;
  EXPECT_GT(Plan(o).peak_bytes, budget);
  // Nothing fits a tiny budget.
  EXPECT_EQ(LargestMicroBatch(o, 1 << 20).value(), 0);
}

TEST(MemoryPlanTest, NamedShapesHaveTheirPublishedSizes) {
  struct Published {
    const char* name;
    double total, non_embedding;  // billions, as the model cards give them (0: not given)
    int64_t layers;
    bool tied;
  };
  for (const Published& m :
       {Published{"qwen3-0.6b", 0.6, 0.44, 28, true}, Published{"qwen3-1.7b", 1.7, 1.4, 28, true},
        Published{"qwen3-4b", 4.0, 3.6, 36, true}, Published{"qwen3-8b", 8.2, 6.95, 36, false},
        Published{"llama3.2-3b", 3.21, 0, 28, true}}) {
    SCOPED_TRACE(m.name);
    const ModelConfig c = NamedModelShape(m.name).value();
    const double total = static_cast<double>(c.NumParameters()) / 1e9;
    const int64_t embeddings = c.vocab_size * c.hidden_size * (c.tie_word_embeddings ? 1 : 2);
    EXPECT_NEAR(total, m.total, 0.05 * m.total);
    if (m.non_embedding > 0) {
      EXPECT_NEAR(static_cast<double>(c.NumParameters() - embeddings) / 1e9, m.non_embedding,
                  0.02 * m.non_embedding);
    }
    EXPECT_EQ(c.num_hidden_layers, m.layers);
    EXPECT_EQ(c.tie_word_embeddings, m.tied);
  }
  EXPECT_EQ(NamedModelShape("qwen3-8b")->NumParameters(), 8190735360);
  EXPECT_EQ(NamedModelShape("qwen3-0.6b")->NumParameters(), 596049920);
  EXPECT_EQ(NamedModelShape("llama3.2-3b")->rope_scaling.type, "llama3");
  EXPECT_THAT(NamedModelShape("qwen3-9b"), StatusIs(absl::StatusCode::kNotFound, "qwen3-9b"));
}

// Adapters of rank 2 on every projection of the hand model: A (2, in) and
// B (out, 2) of q (4 -> 4), k and v (4 -> 2), o (4 -> 4), gate and up
// (4 -> 6), down (6 -> 4): 2 x (8 + 6 + 6 + 8 + 10 + 10 + 10) = 116 a layer.
TEST(MemoryPlanTest, AdaptersTrainAloneBesideTheFrozenBase) {
  PlanOptions o = CpuOptions(HandModel(), 8, 8);
  o.rank0 = true;
  const MemoryPlan full = Plan(o);
  o.lora_rank = 2;
  const MemoryPlan lora = Plan(o);
  const int64_t params = HandModel().NumParameters(), adapters = 2 * 116;
  EXPECT_EQ(lora.adapter_parameters, adapters);
  EXPECT_EQ(lora.parameters, params);
  EXPECT_EQ(lora.of(PlanPart::kMasterWeights), 4 * params + 4 * adapters);  // float32 compute
  EXPECT_EQ(lora.of(PlanPart::kGradients), 4 * adapters);
  EXPECT_EQ(lora.of(PlanPart::kMoments), 8 * adapters);
  EXPECT_EQ(lora.of(PlanPart::kEmbeddingGrads), 0);
  EXPECT_EQ(lora.of(PlanPart::kSnapshotHost), 2 * 4 * adapters);  // the adapters alone
  EXPECT_LT(lora.of(PlanPart::kBackward), full.of(PlanPart::kBackward));
  EXPECT_LT(lora.of(PlanPart::kLogProbs), full.of(PlanPart::kLogProbs));
  o.lora_targets = 0x1;  // q alone
  EXPECT_EQ(Plan(o).adapter_parameters, 2 * 2 * 8);
}

// Qwen3-8B on one 80 GB GPU: no full-training setting fits; rank-32
// adapters on every projection (87.3M parameters, 0.35 GB in float32) do,
// the base frozen in bfloat16.
TEST(MemoryPlanTest, AdaptersFitQwen3_8BOnOneGpu) {
  PlanOptions o;
  o.model = NamedModelShape("qwen3-8b").value();
  o.micro_batch_tokens = 8192;
  o.checkpoint_every = 1;
  o.snapshot_dtype = PlanDType::kBFloat16;
  const double budget = 80.0 * (int64_t{1} << 30);
  EXPECT_GT(static_cast<double>(Plan(o).peak_bytes), budget);
  o.lora_rank = 32;
  const MemoryPlan lora = Plan(o);
  EXPECT_EQ(lora.adapter_parameters, 36 * 32 * (8192 + 2 * 5120 + 8192 + 2 * 16384 + 16384));
  EXPECT_LT(static_cast<double>(lora.peak_bytes), budget);
  EXPECT_EQ(lora.of(PlanPart::kSnapshotDevice), 2 * lora.adapter_parameters);
  EXPECT_THAT(FormatMemoryPlan(lora, o, "qwen3-8b", static_cast<int64_t>(budget)),
              HasSubstr("adapters: --lora_rank=32 on 7 projection(s) a layer, 87.3M parameters"));
  o.lora_rank = -1;
  EXPECT_THAT(PlanMemory(o), StatusIs(absl::StatusCode::kInvalidArgument, "--lora_rank=-1"));
  o.lora_rank = 8;
  o.lora_targets = 0;
  EXPECT_THAT(PlanMemory(o), StatusIs(absl::StatusCode::kInvalidArgument, "--lora_targets"));
}

TEST(MemoryPlanTest, ModelFromADirectoryOrItsConfigJson) {
  asympo::testing::ScopedTempDir dir("memory_plan");
  const ModelConfig c = NamedModelShape("qwen3-4b").value();
  std::ofstream(dir.path() + "/config.json") << c.ToJson();
  EXPECT_EQ(ResolvePlanModel(dir.path())->NumParameters(), c.NumParameters());
  EXPECT_EQ(ResolvePlanModel(dir.path() + "/config.json")->NumParameters(), c.NumParameters());
  EXPECT_THAT(ResolvePlanModel(dir.path() + "/missing"),
              StatusIs(absl::StatusCode::kInvalidArgument, "--model="));
  EXPECT_THAT(ResolvePlanModel(""), StatusIs(absl::StatusCode::kInvalidArgument, "--model"));
}

TEST(MemoryPlanTest, BadInputsNameTheFlag) {
  PlanOptions o;
  o.model = ModelConfig::Tiny(64);
  const auto refused = [&](auto change, const char* flag) {
    PlanOptions bad = o;
    change(bad);
    EXPECT_THAT(PlanMemory(bad), StatusIs(absl::StatusCode::kInvalidArgument, flag));
  };
  refused([](PlanOptions& p) { p.world_size = 0; }, "--world_size=0");
  refused([](PlanOptions& p) { p.micro_batch_tokens = 0; }, "--micro_batch_tokens=0");
  refused([](PlanOptions& p) { p.micro_batch_tokens = (int64_t{1} << 30) + 1; },
          "--micro_batch_tokens");
  refused([](PlanOptions& p) { p.max_sequence_tokens = -1; }, "--max_sequence_tokens=-1");
  refused([](PlanOptions& p) { p.logprob_chunk_rows = 0; }, "--logprob_chunk_rows=0");
  refused([](PlanOptions& p) { p.checkpoint_every = -2; }, "--activation_checkpointing");
  refused([](PlanOptions& p) { p.model.num_key_value_heads = 3; }, "--model");
  EXPECT_THAT(ParseDistShard("half"), StatusIs(absl::StatusCode::kInvalidArgument, "\"half\""));
  EXPECT_THAT(ParsePlanDevice("gpu"), StatusIs(absl::StatusCode::kInvalidArgument, "\"gpu\""));
  EXPECT_THAT(ParsePlanDType("fp8"), StatusIs(absl::StatusCode::kInvalidArgument, "\"fp8\""));
  EXPECT_EQ(ParsePlanDevice("cuda:3").value(), PlanDevice::kCuda);
}

TEST(MemoryPlanTest, AdviceNamesTheFlagsThatMakeItFit) {
  PlanOptions o;
  o.model = NamedModelShape("qwen3-1.7b").value();
  o.world_size = 8;
  o.shard = DistShard::kOptimizer;
  o.micro_batch_tokens = 65536;
  o.max_sequence_tokens = 8192;
  const int64_t budget = int64_t{80} << 30;
  const std::string advice = FitAdvice(o, budget);
  const int64_t largest = LargestMicroBatch(o, budget).value();
  EXPECT_THAT(advice, HasSubstr(absl::StrCat("lower --micro_batch_tokens to ", largest)));
  EXPECT_THAT(advice, HasSubstr("--activation_checkpointing=layers"));
  EXPECT_THAT(advice, HasSubstr("--dist_shard=full"));
  o.micro_batch_tokens = 4096;
  EXPECT_EQ(FitAdvice(o, budget), "");
  // The table names every part it counts and says whether it fits.
  const MemoryPlan p = Plan(o);
  const std::string table = FormatMemoryPlan(p, o, "qwen3-1.7b", budget);
  EXPECT_THAT(table, HasSubstr("AdamW moments (2 x float32), 1/8"));
  EXPECT_THAT(table, HasSubstr("pinned host memory, not device memory"));
  EXPECT_THAT(table, HasSubstr(": fits, "));
}

TEST(MemoryPlanCheckTest, TheLearnersOptionsBecomeThePlansOptions) {
  LearnerDaemonOptions d;
  d.tiny_vocab_size = 512;
  d.model_options.compute_dtype = at::kBFloat16;
  d.publish_dtype = at::kBFloat16;
  d.trainer.micro_batch_tokens = 4096;
  d.trainer.logprob_chunk_rows = 256;
  d.model_options.checkpoint_every = 2;
  d.service.limits.max_prompt_tokens = 1000;
  d.service.limits.max_response_tokens = 3000;
  d.data_parallel.world_size = 4;
  d.data_parallel.rank = 1;
  d.data_parallel.shard = DistShard::kOptimizer;
  const PlanOptions o = LearnerPlanOptions(d).value();
  EXPECT_EQ(o.model.vocab_size, 512);
  EXPECT_EQ(o.device, PlanDevice::kCpu);
  EXPECT_EQ(o.compute_dtype, PlanDType::kBFloat16);
  EXPECT_EQ(o.snapshot_dtype, PlanDType::kBFloat16);
  EXPECT_EQ(o.micro_batch_tokens, 4096);
  EXPECT_EQ(o.max_sequence_tokens, 4000);
  EXPECT_EQ(o.logprob_chunk_rows, 256);
  EXPECT_EQ(o.checkpoint_every, 2);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.shard, DistShard::kOptimizer);
  EXPECT_FALSE(o.rank0);
  EXPECT_FALSE(o.checkpoints);
  EXPECT_FALSE(o.snapshot_device_held);
  // A NCCL path broadcasts from the device copy.
  d.weight_group_enabled = true;
  d.weight_group.backend = "nccl";
  EXPECT_TRUE(LearnerPlanOptions(d)->snapshot_device_held);
  d.weight_group.backend = "gloo";
  EXPECT_FALSE(LearnerPlanOptions(d)->snapshot_device_held);
  d.broadcast.nccl_world_size = 3;
  EXPECT_TRUE(LearnerPlanOptions(d)->snapshot_device_held);
  // A model directory: its config.json. One that cannot be read is left to
  // the daemon to report (the check passes).
  asympo::testing::ScopedTempDir dir("learner_plan");
  const ModelConfig c = NamedModelShape("qwen3-0.6b").value();
  std::ofstream(dir.path() + "/config.json") << c.ToJson();
  d.model = dir.path();
  EXPECT_EQ(LearnerPlanOptions(d)->model.NumParameters(), c.NumParameters());
  d.model = dir.path() + "/missing";
  EXPECT_FALSE(LearnerPlanOptions(d).ok());
  EXPECT_TRUE(CheckLearnerMemory(d, 0.001).ok());
  d.model = "qwen3-0.6b";  // asympo-plan's names are not the learner's
  EXPECT_FALSE(LearnerPlanOptions(d).ok());
}

TEST(MemoryPlanCheckTest, RefusesAPlanThatDoesNotFitNamingTheFlags) {
  LearnerDaemonOptions d;
  d.trainer.micro_batch_tokens = 16384;
  // The tiny model's plan is a few GiB on the CPU (rows of 8192 keep their
  // attention probabilities); 1 GiB is too little, half a MiB far too
  // little, and a negative memory skips the check.
  const absl::Status tight = CheckLearnerMemory(d, 1.0);
  EXPECT_THAT(tight, StatusIs(absl::StatusCode::kResourceExhausted, "--micro_batch_tokens"));
  EXPECT_THAT(tight.message(), HasSubstr("--device_memory_gib=1"));
  EXPECT_THAT(CheckLearnerMemory(d, 0.0005),
              StatusIs(absl::StatusCode::kResourceExhausted, "no setting of"));
  EXPECT_TRUE(CheckLearnerMemory(d, -1).ok());
  EXPECT_TRUE(CheckLearnerMemory(d, 1024).ok());
  // The CPU's memory is the machine's, or the container's limit.
  std::string source;
  EXPECT_GT(DeviceMemoryBytes(c10::Device(c10::kCPU), &source).value(), int64_t{256} << 20);
  EXPECT_THAT(source, ::testing::AnyOf(HasSubstr("MemTotal"), HasSubstr("cgroup")));
}

TEST(MemoryPlanCheckTest, AContainersCgroupLimitIsTheCpusMemory) {
  std::map<std::string, std::string> files;
  auto read = [&files](const std::string& path) -> std::optional<std::string> {
    auto it = files.find(path);
    if (it == files.end()) return std::nullopt;
    return it->second;
  };
  // cgroup v2 inside a container (its namespace's root is its cgroup).
  files["/sys/fs/cgroup/memory.max"] = "1073741824\n";
  EXPECT_EQ(CgroupMemoryLimit("0::/\n", read), int64_t{1} << 30);
  files["/sys/fs/cgroup/memory.max"] = "max\n";
  EXPECT_EQ(CgroupMemoryLimit("0::/\n", read), std::nullopt);
  // v2 on a host: the process's cgroup and its ancestors; the lowest wins.
  files["/sys/fs/cgroup/user.slice/memory.max"] = "4294967296\n";
  files["/sys/fs/cgroup/user.slice/job.scope/memory.max"] = "max\n";
  EXPECT_EQ(CgroupMemoryLimit("0::/user.slice/job.scope\n", read), int64_t{4} << 30);
  // cgroup v1: the memory controller's line; "unlimited" is near 2^63. A
  // Docker container sees the host's path, but its own cgroup at the root.
  files.clear();
  files["/sys/fs/cgroup/memory/memory.limit_in_bytes"] = "536870912\n";
  const std::string v1 = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/\n";
  EXPECT_EQ(CgroupMemoryLimit(v1, read), int64_t{512} << 20);
  files["/sys/fs/cgroup/memory/memory.limit_in_bytes"] = "9223372036854771712\n";
  EXPECT_EQ(CgroupMemoryLimit(v1, read), std::nullopt);
  // Nothing readable, or text that is not a cgroup list: no limit.
  files.clear();
  EXPECT_EQ(CgroupMemoryLimit(v1, read), std::nullopt);
  EXPECT_EQ(CgroupMemoryLimit("garbage", read), std::nullopt);
  files["/sys/fs/cgroup/memory.max"] = "-5";
  EXPECT_EQ(CgroupMemoryLimit("0::/", read), std::nullopt);
}

}  // namespace
}  // namespace asympo::learner
