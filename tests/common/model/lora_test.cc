#include "common/model/lora.h"
#include "common/model/base_identity.h"
#include "common/model/model_io.h"
#include "common/model/peft_adapter.h"
#include "common/model/policy_model.h"
#include "common/model/safetensors.h"
#include "tests/testing/status_matchers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include <torch/types.h>
#include <nlohmann/json.hpp>

namespace asympo {
namespace {

using ::asympo::testing::StatusIs;

constexpr int64_t kVocab = 64;

std::unique_ptr<PolicyModel> Model(int64_t rank, uint32_t targets = kAllLoraTargets,
                                   int64_t checkpoint_every = 0, uint64_t seed = 5) {
  ModelOptions o;
  o.seed = seed;
  o.init_std = 0.2;
  o.checkpoint_every = checkpoint_every;
  o.lora.rank = rank;
  o.lora.alpha = 2.0 * static_cast<double>(rank);
  o.lora.targets = targets;
  return PolicyModel::CreateRandom(ModelConfig::Tiny(kVocab), o).value();
}

// Gives every adapter's B random values (a trained adapter).
void RandomizeB(PolicyModel& m, uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(static_cast<int64_t>(seed));
  for (const auto& [name, t] : m.named_parameters()) {
    if (name.find("lora_B") != std::string::npos) t.copy_(torch::randn_like(t) * 0.3);
  }
}

torch::Tensor Logits(const PolicyModel& m, const torch::Tensor& ids) {
  const int64_t b = ids.size(0), t = ids.size(1);
  const torch::Tensor pos = torch::arange(t, torch::kLong).unsqueeze(0).expand({b, t});
  return m.Logits(m.Forward(ids, pos.contiguous(), torch::ones({b, t}, torch::kBool)));
}

torch::Tensor Ids() {
  torch::manual_seed(3);
  return torch::randint(0, kVocab, {2, 9}, torch::kLong);
}

// A fixed differentiable function of the logits.
torch::Tensor Loss(const torch::Tensor& logits) {
  torch::manual_seed(4);
  const torch::Tensor w = torch::randn(logits.sizes());
  return (logits * w).sum() + logits.pow(2).mean();
}

TEST(LoraTargetsTest, ParsesListsAndGroups) {
  EXPECT_EQ(ParseLoraTargets("all").value(), kAllLoraTargets);
  EXPECT_EQ(LoraTargetsName(ParseLoraTargets("attention").value()), "q,k,v,o");
  EXPECT_EQ(LoraTargetsName(ParseLoraTargets("mlp").value()), "gate,up,down");
  EXPECT_EQ(LoraTargetsName(ParseLoraTargets("down, q").value()), "q,down");
  EXPECT_THAT(ParseLoraTargets("q,lm_head"),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown target \"lm_head\""));
  EXPECT_THAT(ParseLoraTargets("q,attention"),
              StatusIs(absl::StatusCode::kInvalidArgument, "repeats a target"));
  EXPECT_THAT(ParseLoraTargets(""), StatusIs(absl::StatusCode::kInvalidArgument, "unknown"));
}

TEST(LoraTargetsTest, ValidatesRankAlphaAndTargets) {
  LoraOptions o;
  EXPECT_OK(ValidateLoraOptions(o));  // off
  o.rank = 8;
  o.alpha = 16;
  o.targets = kAllLoraTargets;
  EXPECT_OK(ValidateLoraOptions(o));
  o.rank = -1;
  EXPECT_THAT(ValidateLoraOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, "--lora_rank"));
  o.rank = 8;
  o.alpha = 0;
  EXPECT_THAT(ValidateLoraOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, "--lora_alpha"));
  o.alpha = 16;
  o.targets = 0;
  EXPECT_THAT(ValidateLoraOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "--lora_targets"));
}

TEST(LoraModelTest, OnlyTheAdaptersAreParameters) {
  const auto m = Model(4, ParseLoraTargets("q,down").value());
  const auto& p = m->named_parameters();
  ASSERT_EQ(p.size(), 2u * 2 * static_cast<size_t>(m->config().num_hidden_layers));
  EXPECT_EQ(p[0].first, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(p[1].first, "model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(p[3].first, "model.layers.0.mlp.down_proj.lora_B.weight");
  const int64_t h = m->config().hidden_size, ff = m->config().intermediate_size;
  EXPECT_EQ(p[2].second.sizes(), (torch::IntArrayRef{4, ff}));  // down's A: (r, in)
  EXPECT_EQ(p[3].second.sizes(), (torch::IntArrayRef{h, 4}));   // down's B: (out, r)
  for (const auto& [name, t] : p) {
    EXPECT_TRUE(t.requires_grad()) << name;
    EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;
  }
  EXPECT_TRUE(torch::equal(p[1].second, torch::zeros_like(p[1].second)));  // B starts at zero
  for (const auto& [name, t] : m->named_weights()) EXPECT_FALSE(t.requires_grad()) << name;
  EXPECT_EQ(m->named_weights().size(), Model(0)->named_parameters().size());
  EXPECT_EQ(m->LayerParameters(1).size(), 4u);
}

TEST(LoraModelTest, AZeroAdapterIsTheBaseBitExactly) {
  const auto base = Model(0), lora = Model(8);
  for (size_t i = 0; i < base->named_weights().size(); ++i) {
    ASSERT_TRUE(torch::equal(base->named_weights()[i].second, lora->named_weights()[i].second));
  }
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(Logits(*base, Ids()), Logits(*lora, Ids())));
}

TEST(LoraModelTest, ForwardEqualsTheMergedWeights) {
  const auto lora = Model(4);
  RandomizeB(*lora, 9);
  const auto merged = Model(0);
  ASSERT_OK(merged->LoadWeights(lora->MergedWeights()));
  torch::NoGradGuard no_grad;
  const torch::Tensor a = Logits(*lora, Ids()), b = Logits(*merged, Ids());
  EXPECT_FALSE(torch::equal(a, Logits(*Model(0), Ids())));  // the adapters change the output
  EXPECT_TRUE(torch::allclose(a, b, 1e-4, 1e-4)) << (a - b).abs().max();
}

// The adapters' gradients are the merged weights' (computed by autograd on
// a model without adapters) through W' = W + s B A: dA = s B^T dW',
// dB = s dW' A^T.
TEST(LoraModelTest, AdapterGradientsAreTheMergedWeightsGradients) {
  const auto lora = Model(4);
  RandomizeB(*lora, 10);
  const auto merged = Model(0);
  ASSERT_OK(merged->LoadWeights(lora->MergedWeights()));
  Loss(Logits(*lora, Ids())).backward();
  Loss(Logits(*merged, Ids())).backward();
  std::map<std::string, torch::Tensor> merged_grad;
  for (const auto& [name, t] : merged->named_parameters()) merged_grad[name] = t.grad();
  const double s = lora->options().lora.scale();
  const auto& p = lora->named_parameters();
  ASSERT_EQ(p.size() % 2, 0u);
  for (size_t i = 0; i < p.size(); i += 2) {
    const std::string weight = p[i].first.substr(0, p[i].first.find(".lora_A")) + ".weight";
    const torch::Tensor& a = p[i].second;
    const torch::Tensor& b = p[i + 1].second;
    const torch::Tensor dw = merged_grad.at(weight);
    const torch::Tensor da = s * b.detach().t().matmul(dw);
    const torch::Tensor db = s * dw.matmul(a.detach().t());
    EXPECT_TRUE(torch::allclose(a.grad(), da, 1e-3, 1e-4))
        << weight << " A: " << (a.grad() - da).abs().max();
    EXPECT_TRUE(torch::allclose(b.grad(), db, 1e-3, 1e-4))
        << weight << " B: " << (b.grad() - db).abs().max();
  }
}

TEST(LoraModelTest, CheckpointedLayersGiveTheSameAdapterGradients) {
  const auto plain = Model(4), checkpointed = Model(4, kAllLoraTargets, /*checkpoint_every=*/1);
  RandomizeB(*plain, 11);
  RandomizeB(*checkpointed, 11);
  Loss(Logits(*plain, Ids())).backward();
  Loss(Logits(*checkpointed, Ids())).backward();
  for (size_t i = 0; i < plain->named_parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(plain->named_parameters()[i].second.grad(),
                             checkpointed->named_parameters()[i].second.grad()))
        << plain->named_parameters()[i].first;
  }
}

TEST(LoraModelTest, LoadsAdaptersAndRefusesWeightsAsParameters) {
  const auto a = Model(4), b = Model(4, kAllLoraTargets, 0, /*seed=*/6);
  RandomizeB(*a, 12);
  std::vector<std::pair<std::string, torch::Tensor>> source;
  for (const auto& [name, t] : a->named_parameters()) source.emplace_back(name, t.detach());
  ASSERT_OK(b->LoadParameters(source));
  for (size_t i = 0; i < source.size(); ++i) {
    EXPECT_TRUE(torch::equal(b->named_parameters()[i].second, source[i].second));
  }
  std::vector<std::pair<std::string, torch::Tensor>> weights;
  for (const auto& [name, t] : a->named_weights()) weights.emplace_back(name, t);
  EXPECT_THAT(b->LoadParameters(weights),
              StatusIs(absl::StatusCode::kInvalidArgument, "missing tensors: model.layers.0"));
  EXPECT_THAT(b->LoadWeights(source), StatusIs(absl::StatusCode::kInvalidArgument, "missing"));
}

TEST(LoraModelTest, ExportsTheMergedModel) {
  const auto lora = Model(4);
  RandomizeB(*lora, 13);
  const std::string dir = ::testing::TempDir() + "/lora_merged_export";
  ASSERT_OK(ExportPolicyModel(*lora, dir));
  ModelOptions o;
  const auto loaded = LoadPolicyModel(dir, o).value();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(Logits(*loaded, Ids()), Logits(*lora, Ids()), 1e-4, 1e-4));
  // A model with adapters loads the same directory as its base.
  o.lora = lora->options().lora;
  const auto based = LoadPolicyModel(dir, o).value();
  EXPECT_TRUE(torch::equal(Logits(*based, Ids()), Logits(*loaded, Ids())));
}

TEST(PeftAdapterTest, RoundTripsThroughTheDirectoryPeftWrites) {
  const auto a = Model(4, ParseLoraTargets("q,v,down").value());
  RandomizeB(*a, 14);
  const std::string dir = ::testing::TempDir() + "/lora_peft";
  ASSERT_OK(ExportPeftAdapter(*a, dir, "Qwen/Qwen3-0.6B"));
  const auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors").value();
  EXPECT_TRUE(file->Contains("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  EXPECT_EQ(file->Names().size(), a->named_parameters().size());
  std::ifstream in(dir + "/adapter_config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8);
  EXPECT_EQ(config["target_modules"], nlohmann::json({"q_proj", "v_proj", "down_proj"}));
  EXPECT_EQ(config["base_model_name_or_path"], "Qwen/Qwen3-0.6B");

  const auto b = Model(4, ParseLoraTargets("q,v,down").value(), 0, /*seed=*/8);
  ASSERT_OK(LoadPeftAdapter(dir, b.get()));
  for (size_t i = 0; i < a->named_parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(a->named_parameters()[i].second, b->named_parameters()[i].second))
        << a->named_parameters()[i].first;
  }
}

TEST(PeftAdapterTest, RefusesAnAdapterOfOtherShape) {
  const auto a = Model(4, ParseLoraTargets("q,v").value());
  const std::string dir = ::testing::TempDir() + "/lora_peft_other";
  ASSERT_OK(ExportPeftAdapter(*a, dir, "base"));
  const auto other_rank = Model(8, ParseLoraTargets("q,v").value());
  EXPECT_THAT(LoadPeftAdapter(dir, other_rank.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "r is 4; the model's rank is 8"));
  const auto other_targets = Model(4, ParseLoraTargets("q,k").value());
  EXPECT_THAT(LoadPeftAdapter(dir, other_targets.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "target_modules are [q_proj, v_proj]"));
  EXPECT_THAT(LoadPeftAdapter(dir, Model(0).get()),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no adapters"));
  EXPECT_THAT(ExportPeftAdapter(*Model(0), dir, "base"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no adapters"));
}

TEST(BaseIdentityTest, NamesTheBaseAndRefusesAnother) {
  const std::string a = BaseIdentity("tiny", *Model(4)).value();
  const std::string b = BaseIdentity("tiny", *Model(4, kAllLoraTargets, 0, /*seed=*/6)).value();
  EXPECT_EQ(a, BaseIdentity("tiny", *Model(0)).value());  // the adapters are not the base
  EXPECT_NE(a, b);
  EXPECT_OK(CheckSameBase(a, a, "ckpt-1"));
  EXPECT_THAT(CheckSameBase(a, b, "ckpt-1"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "ckpt-1 holds adapters trained on the base tiny"));
  EXPECT_THAT(CheckSameBase("", b, "ckpt-1"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "does not name their base"));
  // A directory: its files, not the path, decide.
  const std::string dir = ::testing::TempDir() + "/lora_base_dir";
  ASSERT_OK(ExportPolicyModel(*Model(0), dir));
  const std::string from_dir = BaseIdentity(dir, *Model(0)).value();
  EXPECT_THAT(from_dir, ::testing::HasSubstr(dir));
  EXPECT_OK(CheckSameBase(from_dir, from_dir, "ckpt-1"));
  EXPECT_THAT(BaseIdentity(dir + "/missing", *Model(0)),
              StatusIs(absl::StatusCode::kNotFound, "missing"));
}

}  // namespace
}  // namespace asympo
