// The learner on a GPU (ctest label "gpu"): a bfloat16-compute training step
// on CUDA against the float32 step on the CPU, and the snapshot staging from
// device memory into pinned host memory. Skips itself without a GPU.
#include <cstring>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "tests/testing/gpu.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_test_util.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace asympo::learner {
namespace {

TEST(TrainerGpuTest, Bf16StepOnTheGpuTracksTheFloat32StepOnTheCpu) {
  ASYMPO_SKIP_WITHOUT_GPU();
  auto cpu = Tiny(3, torch::kFloat, torch::kCPU);
  auto gpu = Tiny(3, torch::kBFloat16, torch::kCUDA);
  auto tc = Trainer::Create(Options(Objective::kAsympo), cpu.get(), nullptr).value();
  auto tg = Trainer::Create(Options(Objective::kAsympo), gpu.get(), nullptr).value();
  const auto rc = tc->ComputeGradients(FixedGroups(6)).value();
  const auto rg = tg->ComputeGradients(FixedGroups(6)).value();
  EXPECT_NEAR(rg.diagnostics.s_pos, rc.diagnostics.s_pos, 0.02 * rc.diagnostics.s_pos);
  double dot = 0, nc = 0, ng = 0;
  for (size_t i = 0; i < cpu->parameters().size(); ++i) {
    const torch::Tensor a = cpu->parameters()[i].grad().to(torch::kDouble);
    const torch::Tensor b = gpu->parameters()[i].grad().to(torch::kCPU, torch::kDouble);
    EXPECT_EQ(gpu->parameters()[i].grad().scalar_type(), torch::kFloat);
    EXPECT_TRUE(gpu->parameters()[i].grad().is_cuda());
    dot += (a * b).sum().item<double>();
    nc += a.pow(2).sum().item<double>();
    ng += b.pow(2).sum().item<double>();
  }
  EXPECT_GT(dot / std::sqrt(nc * ng), 0.99);
  ASSERT_OK(tg->Step(FixedGroups(6)));
  for (const auto& [name, t] : tg->optimizer().StateTensors()) {
    EXPECT_TRUE(t.is_cuda()) << name;
    EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;
  }
}

TEST(TrainerGpuTest, StagingCopiesDeviceWeightsIntoPinnedHostMemory) {
  ASYMPO_SKIP_WITHOUT_GPU();
  auto gpu = Tiny(3, torch::kBFloat16, torch::kCUDA);
  auto staging = broadcast::SnapshotStaging::Create(*gpu, torch::kBFloat16).value();
  EXPECT_TRUE(staging->pinned());
  ASSERT_OK(staging->Stage(*gpu));
  const auto views = staging->CopyToHost().value();
  for (size_t i = 0; i < views.size(); ++i) {
    const torch::Tensor want = gpu->parameters()[i].detach().to(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(std::memcmp(views[i].data, want.data_ptr(), views[i].size_bytes), 0)
        << views[i].spec.name;
  }
}

}  // namespace
}  // namespace asympo::learner
