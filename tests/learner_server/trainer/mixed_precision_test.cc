// Mixed precision in the learner: float32 master weights, gradients and
// AdamW moments with bfloat16 compute, against the float32 reference; and
// checkpoints and exports that load whatever the compute dtype or device.
#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "common/model/model_io.h"
#include "learner_server/loss/token_logprobs.h"
#include "learner_server/trainer/checkpoint.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer_test_util.h"

namespace asympo::learner {
namespace {

torch::Tensor Flat(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> flat;
  for (const auto& t : ts) flat.push_back(t.detach().reshape({-1}).to(torch::kDouble));
  return torch::cat(flat);
}

double Cosine(const torch::Tensor& a, const torch::Tensor& b) {
  return (a * b).sum().item<double>() / (a.norm().item<double>() * b.norm().item<double>());
}

TEST(MixedPrecisionTest, Bf16ComputeKeepsFloat32MastersGradientsAndMoments) {
  auto model = Tiny(3, at::kBFloat16);
  EXPECT_EQ(model->compute_dtype(), at::kBFloat16);
  auto trainer = Trainer::Create(Options(Objective::kAsympo), model.get(), nullptr).value();
  ASSERT_OK(trainer->ComputeGradients(FixedGroups(4)));
  for (const auto& [name, p] : model->named_parameters()) {
    EXPECT_EQ(p.scalar_type(), at::kFloat) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().scalar_type(), at::kFloat) << name;
  }
  ASSERT_OK(trainer->Step(FixedGroups(4)));
  const auto state = trainer->optimizer().StateTensors();
  ASSERT_FALSE(state.empty());
  for (const auto& [name, t] : state) EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
  // The activations are bfloat16.
  const torch::Tensor ids = torch::tensor({{1, 2, 3}}, torch::kLong);
  EXPECT_EQ(model->Forward(ids, torch::arange(3).unsqueeze(0), torch::ones({1, 3}, torch::kBool))
                .scalar_type(),
            at::kBFloat16);
}

TEST(MixedPrecisionTest, Bf16GradientsAndUpdatesTrackTheFloat32Reference) {
  auto ref = Tiny(3, at::kFloat), bf = Tiny(3, at::kBFloat16);
  auto tr = Trainer::Create(Options(Objective::kAsympo), ref.get(), nullptr).value();
  auto tb = Trainer::Create(Options(Objective::kAsympo), bf.get(), nullptr).value();
  const auto gr = tr->ComputeGradients(FixedGroups(6)).value();
  const auto gb = tb->ComputeGradients(FixedGroups(6)).value();
  std::vector<torch::Tensor> grads_r, grads_b;
  for (const auto& p : ref->parameters()) grads_r.push_back(p.grad());
  for (const auto& p : bf->parameters()) grads_b.push_back(p.grad());
  EXPECT_GT(Cosine(Flat(grads_r), Flat(grads_b)), 0.99);
  EXPECT_NEAR(gb.diagnostics.s_pos, gr.diagnostics.s_pos, 0.02 * gr.diagnostics.s_pos);
  EXPECT_NEAR(gb.diagnostics.s_neg, gr.diagnostics.s_neg, 0.02 * gr.diagnostics.s_neg);

  const torch::Tensor before = Flat(ref->parameters());
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(tr->Step(FixedGroups(6)));
    ASSERT_OK(tb->Step(FixedGroups(6)));
  }
  const torch::Tensor update_r = Flat(ref->parameters()) - before;
  const torch::Tensor update_b = Flat(bf->parameters()) - before;
  EXPECT_GT(Cosine(update_r, update_b), 0.95);
  EXPECT_NEAR(update_b.norm().item<double>(), update_r.norm().item<double>(),
              0.1 * update_r.norm().item<double>());
}

TEST(MixedPrecisionTest, ChunkedLogProbsTakeAFloat32WeightWithBfloat16Hidden) {
  torch::manual_seed(5);
  const torch::Tensor h32 = torch::randn({12, 16});
  const torch::Tensor w = torch::randn({40, 16}).mul_(0.3).requires_grad_(true);
  const torch::Tensor w_ref = w.detach().clone().requires_grad_(true);
  const torch::Tensor h = h32.to(torch::kBFloat16).requires_grad_(true);
  const torch::Tensor targets = torch::randint(0, 40, {12}, torch::kLong);
  const torch::Tensor out = ChunkedTokenLogProbs(h, w, targets, 5).value();
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  const torch::Tensor ref =
      torch::log_softmax(torch::linear(h.detach().to(torch::kFloat), w_ref), 1)
          .gather(1, targets.unsqueeze(1))
          .squeeze(1);
  EXPECT_TRUE(torch::allclose(out, ref, 0.05, 0.05));
  out.sum().backward();
  ref.sum().backward();
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(h.grad().scalar_type(), at::kBFloat16);
  EXPECT_GT(Cosine(w.grad().reshape({-1}).to(torch::kDouble),
                   w_ref.grad().reshape({-1}).to(torch::kDouble)),
            0.995);
}

// A checkpoint holds float32 masters and moments whatever the compute dtype,
// on the host: it resumes bit-exactly under the other compute dtype. (A GPU
// run differs only in where LoadParameters/LoadState put the tensors.)
void ExpectCrossResume(at::ScalarType written_with, at::ScalarType resumed_with) {
  asympo::testing::ScopedTempDir tmp("mixed_precision_ckpt");
  auto a = Tiny(1, written_with);
  auto ta = Trainer::Create(Options(Objective::kAsympo), a.get(), nullptr).value();
  ASSERT_OK(ta->Step(FixedGroups(3)));
  ASSERT_OK(ta->Step(FixedGroups(3)));
  ASSERT_OK(SaveCheckpoint(tmp.path(), ta->version(), *a, ta->optimizer(), ""));
  auto b = Tiny(99, resumed_with);
  auto tb = Trainer::Create(Options(Objective::kAsympo), b.get(), nullptr).value();
  const auto loaded = LoadLatestCheckpoint(tmp.path(), b.get(), &tb->optimizer());
  ASSERT_OK(loaded);
  ASSERT_TRUE(loaded->has_value());
  for (size_t i = 0; i < a->named_parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(a->named_parameters()[i].second, b->named_parameters()[i].second))
        << a->named_parameters()[i].first;
  }
  const auto sa = ta->optimizer().StateTensors(), sb = tb->optimizer().StateTensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sb[i].second.scalar_type(), at::kFloat);
    EXPECT_TRUE(torch::equal(sa[i].second, sb[i].second)) << sa[i].first;
  }
  EXPECT_EQ(tb->optimizer().step_count(), 2);
  tb->set_version((*loaded)->version);
  EXPECT_OK(tb->Step(FixedGroups(3)));
}

TEST(MixedPrecisionTest, ACheckpointWrittenWithBf16ComputeResumesWithFloat32) {
  ExpectCrossResume(at::kBFloat16, at::kFloat);
}

TEST(MixedPrecisionTest, ACheckpointWrittenWithFloat32ResumesWithBf16Compute) {
  ExpectCrossResume(at::kFloat, at::kBFloat16);
}

TEST(MixedPrecisionTest, ExportWritesThePublishDtypeFromFloat32Masters) {
  asympo::testing::ScopedTempDir tmp("mixed_precision_export");
  auto model = Tiny(3, at::kBFloat16);
  ASSERT_OK(ExportPolicyModel(*model, tmp.path(), int64_t{5} << 30, at::kBFloat16));
  ModelOptions o;
  o.dtype = at::kBFloat16;
  auto loaded = LoadPolicyModel(tmp.path(), o).value();
  EXPECT_EQ(loaded->config().torch_dtype, "bfloat16");
  for (size_t i = 0; i < model->named_parameters().size(); ++i) {
    const torch::Tensor& got = loaded->named_parameters()[i].second;
    EXPECT_EQ(got.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(torch::equal(got, model->named_parameters()[i].second.to(torch::kBFloat16)))
        << model->named_parameters()[i].first;
  }
}

}  // namespace
}  // namespace asympo::learner
