// Generation on a GPU (ctest label "gpu"; deploy/gpu_check.sh runs these on
// a GPU node). Every test skips itself where no CUDA device is visible.
#include <gtest/gtest.h>
#include <torch/types.h>

#include "rollout_server/engine/continuous_engine.h"
#include "rollout_server/engine/decode_graph.h"
#include "rollout_server/engine/generation.h"
#include "tests/rollout_server/engine/generation_test_util.h"
#include "tests/testing/gpu.h"

namespace asympo::rollout {
namespace {

std::unique_ptr<PolicyModel> Model(at::Device device, at::ScalarType dtype) {
  ModelOptions o;
  o.seed = 11;
  o.init_std = 0.3;
  o.device = device;
  o.dtype = dtype;
  ModelConfig c = ModelConfig::Tiny(256);
  return PolicyModel::CreateRandom(c, o).value();
}

std::vector<GenerationRequest> Requests(int n, int new_tokens, double temperature) {
  std::vector<GenerationRequest> rs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    for (int t = 0; t < 3 + i % 7; ++t) rs[i].prompt.push_back((7 * i + 3 * t) % 256);
    rs[i].params.max_new_tokens = new_tokens - (i % 3);
    rs[i].params.temperature = temperature;
    rs[i].params.top_k = i % 4 == 1 ? 20 : 0;
    rs[i].params.top_p = i % 4 == 2 ? 0.9 : 1.0;
    rs[i].params.seed = 1000 + static_cast<uint64_t>(i);
    rs[i].params.return_logprobs = true;
    if (i % 5 == 0) rs[i].params.stop_token_ids = {17};
  }
  return rs;
}

TEST(GenerationGpuTest, CachedGenerationEqualsFullRecomputeOnTheGpu) {
  ASYMPO_SKIP_WITHOUT_GPU();
  const auto m = Model(torch::kCUDA, torch::kFloat);
  const GenerationEngine engine(m.get());
  const auto reqs = Requests(12, 16, 1.0);
  const auto got = engine.Generate(reqs).value();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, Recompute(*m, reqs[i]).tokens) << "request " << i;
  }
}

TEST(GenerationGpuTest, CudaGraphReplayGivesTheEagerTokens) {
  ASYMPO_SKIP_WITHOUT_GPU();
  EXPECT_TRUE(DecodeGraphsCompiled()) << "a CUDA LibTorch build should compile CUDA graphs in";
  for (at::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto m = Model(torch::kCUDA, dtype);
    GenerationOptions eager_options;
    eager_options.cuda_graphs = false;
    const auto reqs = Requests(33, 40, 1.0);
    const auto graph = GenerationEngine(m.get()).Generate(reqs).value();
    const auto eager = GenerationEngine(m.get(), eager_options).Generate(reqs).value();
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(graph[i].tokens, eager[i].tokens) << "request " << i;
      EXPECT_EQ(graph[i].finish_reason, eager[i].finish_reason) << "request " << i;
    }
  }
}

TEST(GenerationGpuTest, TheGpuSamplesWhatTheCpuSamples) {
  ASYMPO_SKIP_WITHOUT_GPU();
  // Same weights and seeds in float32: tokens agree except where the two
  // devices' rounding moves a draw across a boundary (rare).
  const auto cpu = Model(torch::kCPU, torch::kFloat);
  const auto gpu = Model(torch::kCUDA, torch::kFloat);
  const auto reqs = Requests(64, 24, 1.0);
  const auto a = GenerationEngine(cpu.get()).Generate(reqs).value();
  const auto b = GenerationEngine(gpu.get()).Generate(reqs).value();
  int same = 0;
  for (size_t i = 0; i < reqs.size(); ++i) same += a[i].tokens == b[i].tokens ? 1 : 0;
  EXPECT_GE(same, 58) << "of 64 rows";
}

TEST(GenerationGpuTest, Bf16GreedyDecodingOnTheGpuMatchesItsRecompute) {
  ASYMPO_SKIP_WITHOUT_GPU();
  const auto m = Model(torch::kCUDA, torch::kBFloat16);
  auto reqs = Requests(16, 12, 0.0);
  const auto got = GenerationEngine(m.get()).Generate(reqs).value();
  int same = 0;
  for (size_t i = 0; i < reqs.size(); ++i) same += got[i].tokens == Recompute(*m, reqs[i]).tokens;
  // bf16 cached and uncached attention round differently; near-ties may flip.
  EXPECT_GE(same, 13) << "of 16 rows";
}

TEST(GenerationGpuTest, ContinuousBatchingOnTheGpuEqualsRecomputeWithAndWithoutGraphs) {
  ASYMPO_SKIP_WITHOUT_GPU();
  const auto m = Model(torch::kCUDA, torch::kFloat);
  const auto reqs = Requests(20, 24, 1.0);
  for (const bool graphs : {true, false}) {
    ContinuousOptions o;
    o.max_running_sequences = 6;  // 20 requests through 6 slots
    o.cuda_graphs = graphs;
    auto engine = ContinuousEngine::Create(m.get(), 0, o).value();
    const auto got = engine->Generate(reqs).value();
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].tokens, Recompute(*m, reqs[i]).tokens)
          << "request " << i << (graphs ? " (graphs)" : " (eager)");
    }
  }
}

TEST(GenerationGpuTest, ContinuousBatchingSwapsModelsBetweenCapturedSteps) {
  ASYMPO_SKIP_WITHOUT_GPU();
  const auto a = Model(torch::kCUDA, torch::kBFloat16), b = Model(torch::kCUDA, torch::kBFloat16);
  const auto reqs = Requests(8, 32, 0.0);
  ContinuousOptions o;
  o.max_running_sequences = 8;
  auto engine = ContinuousEngine::Create(a.get(), 1, o).value();
  for (const auto& r : reqs) ASSERT_TRUE(engine->Add(r).ok());
  // Alternate the two models (a double-buffered policy does): one graph each.
  for (int step = 0; !engine->idle(); ++step) {
    if (step % 5 == 4) engine->SetModel(step % 10 == 4 ? b.get() : a.get(), 2 + step);
    ASSERT_TRUE(engine->Step().ok());
  }
  EXPECT_EQ(engine->stats().finished, 8);
  EXPECT_GE(engine->stats().weight_swaps, 3);
}

}  // namespace
}  // namespace asympo::rollout
