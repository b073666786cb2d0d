#include "common/model/policy_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include <torch/types.h>

namespace asympo {
namespace {

using ::testing::HasSubstr;

// init_std larger than usual so that attention is far from uniform.
std::unique_ptr<PolicyModel> Tiny(uint64_t seed = 1, int64_t vocab = 64) {
  return ::asympo::testing::TinyPolicy(vocab, seed, 0.2);
}

torch::Tensor Positions(int64_t b, int64_t t) {
  return torch::arange(t, torch::kLong).unsqueeze(0).expand({b, t}).contiguous();
}

TEST(PolicyModelTest, UsesCheckpointNamesAndCountsParameters) {
  const auto m = Tiny();
  const auto& p = m->named_parameters();
  EXPECT_EQ(p.front().first, "model.embed_tokens.weight");
  EXPECT_EQ(p.back().first, "model.norm.weight");  // tied: no lm_head.weight
  int64_t count = 0;
  bool has_q_norm = false;
  for (const auto& [name, t] : p) {
    count += t.numel();
    has_q_norm |= name == "model.layers.1.self_attn.q_norm.weight";
    EXPECT_TRUE(t.requires_grad()) << name;
  }
  EXPECT_TRUE(has_q_norm);
  EXPECT_EQ(count, m->config().NumParameters());
  EXPECT_TRUE(m->lm_head_weight().is_same(p.front().second));
}

TEST(PolicyModelTest, RandomInitIsDeterministicPerSeed) {
  const auto a = Tiny(7), b = Tiny(7), c = Tiny(8);
  for (size_t i = 0; i < a->named_parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(a->named_parameters()[i].second, b->named_parameters()[i].second));
  }
  EXPECT_FALSE(torch::equal(a->named_parameters()[0].second, c->named_parameters()[0].second));
}

TEST(PolicyModelTest, CachedForwardEqualsFullRecompute) {
  const auto m = Tiny();
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  const int64_t b = 3, t = 12, prompt = 5;
  const torch::Tensor ids = torch::randint(0, 64, {b, t}, torch::kLong);
  const torch::Tensor full = m->Forward(ids, Positions(b, t), torch::ones({b, t}, torch::kBool));
  KvCache cache = m->NewCache(b, t);
  const torch::Tensor pre = m->Forward(ids.narrow(1, 0, prompt), Positions(b, prompt),
                                       torch::ones({b, prompt}, torch::kBool), &cache);
  EXPECT_TRUE(torch::allclose(pre, full.narrow(1, 0, prompt), 1e-5, 1e-5));
  for (int64_t i = prompt; i < t; ++i) {
    const torch::Tensor step = m->Forward(ids.narrow(1, i, 1), torch::full({b, 1}, i, torch::kLong),
                                          torch::ones({b, i + 1}, torch::kBool), &cache);
    EXPECT_TRUE(torch::allclose(step, full.narrow(1, i, 1), 1e-5, 1e-5)) << "position " << i;
  }
  EXPECT_EQ(cache.length, t);
}

TEST(PolicyModelTest, LeftPaddingDoesNotChangeRealTokens) {
  const auto m = Tiny();
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::tensor({{5, 9, 2, 33, 7}}, torch::kLong);
  const torch::Tensor ref = m->Forward(ids, Positions(1, 5), torch::ones({1, 5}, torch::kBool));
  // Same sequence behind three pad tokens (id 0), positions starting at 0
  // on the first real token.
  const torch::Tensor padded = torch::cat({torch::zeros({1, 3}, torch::kLong), ids}, 1);
  const torch::Tensor mask =
      torch::cat({torch::zeros({1, 3}, torch::kBool), torch::ones({1, 5}, torch::kBool)}, 1);
  const torch::Tensor pos = (mask.to(torch::kLong).cumsum(1) - 1).clamp_min(0);
  const torch::Tensor out = m->Forward(padded, pos, mask);
  EXPECT_TRUE(torch::allclose(out.narrow(1, 3, 5), ref, 1e-5, 1e-5));
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
}

TEST(PolicyModelTest, AlignedAttentionBiasIsTheMaskAsZerosAndMinusInfinities) {
  at::manual_seed(3);
  for (const int64_t keys : {1, 15, 16, 17, 40}) {
    const at::Tensor allowed = at::rand({2, 3, keys}) > 0.5;
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor bias = AlignedAttentionBias(allowed, dtype);
      ASSERT_EQ(bias.sizes(), (std::vector<int64_t>{2, 1, 3, keys}));
      EXPECT_EQ(bias.scalar_type(), dtype);
      // Rows a multiple of the alignment apart, whatever K is.
      EXPECT_EQ(bias.stride(2) % kAttentionBiasAlignment, 0) << keys;
      const at::Tensor expected =
          at::where(allowed.unsqueeze(1), at::zeros({}, at::kFloat),
                    at::full({}, -std::numeric_limits<float>::infinity(), at::kFloat));
      EXPECT_TRUE(at::equal(bias.to(at::kFloat), expected)) << keys;
    }
  }
}

TEST(PolicyModelTest, PackedSequencesSeeOnlyThemselves) {
  const auto m = Tiny();
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::tensor({{5, 9, 2, 33, 7}}, torch::kLong);
  const torch::Tensor b = torch::tensor({{40, 3, 8}}, torch::kLong);
  const torch::Tensor ha = m->Forward(a, Positions(1, 5), torch::ones({1, 5}, torch::kBool));
  const torch::Tensor hb = m->Forward(b, Positions(1, 3), torch::ones({1, 3}, torch::kBool));
  // One row: b, then a, then a padded position; positions restart per
  // sequence.
  const torch::Tensor ids = torch::cat({b, a, torch::zeros({1, 1}, torch::kLong)}, 1);
  const torch::Tensor pos = torch::tensor({{0, 1, 2, 0, 1, 2, 3, 4, 8}}, torch::kLong);
  const torch::Tensor seg = torch::tensor({{0, 0, 0, 1, 1, 1, 1, 1, -1}}, torch::kLong);
  const torch::Tensor out = m->Forward(ids, pos, seg >= 0, nullptr, seg);
  EXPECT_TRUE(torch::allclose(out.narrow(1, 0, 3), hb, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(out.narrow(1, 3, 5), ha, 1e-5, 1e-5));
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
  // Without segments, a would attend to b.
  const torch::Tensor mixed = m->Forward(ids, pos, seg >= 0);
  EXPECT_FALSE(torch::allclose(mixed.narrow(1, 3, 5), ha, 1e-3, 1e-3));
}

TEST(PolicyModelTest, CheckpointedLayersGiveTheSameOutputAndGradientsBitwise) {
  ModelOptions o;
  o.seed = 4;
  o.init_std = 0.2;
  const auto plain = PolicyModel::CreateRandom(ModelConfig::Tiny(64), o).value();
  o.checkpoint_every = 1;
  const auto checkpointed = PolicyModel::CreateRandom(ModelConfig::Tiny(64), o).value();
  torch::manual_seed(2);
  const torch::Tensor ids = torch::randint(0, 64, {2, 7}, torch::kLong);
  const torch::Tensor weights = torch::randn({2, 7});
  for (const auto* m : {plain.get(), checkpointed.get()}) {
    (m->Logits(m->Forward(ids, Positions(2, 7), torch::ones({2, 7}, torch::kBool))).logsumexp(-1) *
     weights)
        .sum()
        .backward();
  }
  const auto& p = plain->named_parameters();
  const auto& c = checkpointed->named_parameters();
  for (size_t i = 0; i < p.size(); ++i) {
    ASSERT_TRUE(c[i].second.grad().defined()) << c[i].first;
    EXPECT_TRUE(torch::equal(p[i].second.grad(), c[i].second.grad())) << p[i].first;
  }
  // Without gradients it is a plain forward.
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(
      torch::equal(plain->Forward(ids, Positions(2, 7), torch::ones({2, 7}, torch::kBool)),
                   checkpointed->Forward(ids, Positions(2, 7), torch::ones({2, 7}, torch::kBool))));
}

TEST(PolicyModelTest, IsCausal) {
  const auto m = Tiny();
  torch::NoGradGuard no_grad;
  torch::Tensor ids = torch::tensor({{1, 2, 3, 4, 5, 6}}, torch::kLong);
  const torch::Tensor a = m->Forward(ids, Positions(1, 6), torch::ones({1, 6}, torch::kBool));
  ids[0][5] = 40;
  const torch::Tensor b = m->Forward(ids, Positions(1, 6), torch::ones({1, 6}, torch::kBool));
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 5), b.narrow(1, 0, 5)));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 5, 1), b.narrow(1, 5, 1)));
}

TEST(PolicyModelTest, GradientsReachEveryParameter) {
  const auto m = Tiny();
  const torch::Tensor ids = torch::randint(0, 64, {2, 6}, torch::kLong);
  const torch::Tensor logits =
      m->Logits(m->Forward(ids, Positions(2, 6), torch::ones({2, 6}, torch::kBool)));
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({2, 6, 64}));
  logits.logsumexp(-1).sum().backward();
  for (const auto& [name, t] : m->named_parameters()) {
    ASSERT_TRUE(t.grad().defined()) << name;
    EXPECT_GT(t.grad().abs().sum().item<double>(), 0.0) << name;
  }
}

TEST(PolicyModelTest, LoadParametersChecksNamesAndShapes) {
  const auto m = Tiny(1), other = Tiny(2);
  auto params = other->named_parameters();
  ASSERT_OK(m->LoadParameters(params));
  EXPECT_TRUE(torch::equal(m->named_parameters()[3].second, params[3].second));
  auto missing = params;
  missing.erase(missing.begin() + 2);
  EXPECT_THAT(std::string(m->LoadParameters(missing).message()),
              HasSubstr("missing tensors: model.layers.0.self_attn.q_proj.weight"));
  auto extra = params;
  extra.emplace_back("model.layers.9.mlp.up_proj.weight", torch::zeros({1}));
  EXPECT_THAT(std::string(m->LoadParameters(extra).message()),
              HasSubstr("unexpected tensors: model.layers.9.mlp.up_proj.weight"));
  auto shaped = params;
  shaped[1].second = torch::zeros({3, 3});
  EXPECT_THAT(std::string(m->LoadParameters(shaped).message()),
              HasSubstr("mis-shaped tensors: model.layers.0.input_layernorm.weight (expected "
                        "[64], got [3, 3])"));
}

}  // namespace
}  // namespace asympo
