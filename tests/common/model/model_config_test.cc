// config.json as every transformers version writes it: the <= 4.x layout
// (top-level rope_theta, rope_scaling, torch_dtype) and the 5.x layout
// (rope_parameters, dtype, layer_types), read to the same settings and the
// same logits; what the model cannot run is refused by name.
#include "common/model/model_config.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/model/policy_model.h"
#include "tests/testing/status_matchers.h"

namespace asympo {
namespace {

using ::testing::HasSubstr;

// The sizes of a small model, shared by the configs below ($ARCH, $ROPE and
// $EXTRA are filled in per case).
constexpr char kSmall[] = R"({
  "architectures": ["$ARCH"], "model_type": "$TYPE", "vocab_size": 96, "hidden_size": 64,
  "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
  "rms_norm_eps": 1e-06, "hidden_act": "silu", "attention_bias": false,
  "tie_word_embeddings": false, "eos_token_id": 2, "bos_token_id": 1$ROPE$EXTRA})";

std::string Config(const std::string& type, const std::string& rope,
                   const std::string& extra = "") {
  return absl::StrReplaceAll(kSmall,
                             {{"$ARCH", type == "llama" ? "LlamaForCausalLM" : "Qwen3ForCausalLM"},
                              {"$TYPE", type},
                              {"$ROPE", rope.empty() ? "" : ", " + rope},
                              {"$EXTRA", extra.empty() ? "" : ", " + extra}});
}

std::string Error(const std::string& json) {
  const absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(json);
  return c.ok() ? "OK" : std::string(c.status().message());
}

// Logits of a model built from `c` with fixed random weights, over positions
// far enough apart that the rotary frequencies (and llama3's bands, whose
// original context is 32 below) matter.
torch::Tensor ConfigLogits(const ModelConfig& c) {
  ModelOptions o;
  o.seed = 3;
  o.init_std = 0.2;
  const auto m = PolicyModel::CreateRandom(c, o).value();
  torch::NoGradGuard no_grad;
  const int64_t t = 80;
  const torch::Tensor ids = (torch::arange(t, torch::kLong) * 37 + 11) % c.vocab_size;
  return m->Logits(m->Forward(ids.unsqueeze(0), torch::arange(t, torch::kLong).unsqueeze(0),
                              torch::ones({1, t}, torch::kBool)));
}

// What transformers 4 writes for a Llama 3.1-style model, and what
// transformers 5 writes for the same model.
const std::string kLlamaFour =
    Config("llama",
           R"("rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0,
       "low_freq_factor": 1.0, "original_max_position_embeddings": 32, "rope_type": "llama3"},
       "torch_dtype": "bfloat16", "mlp_bias": false, "pretraining_tp": 1)");
const std::string kLlamaFive =
    Config("llama",
           R"("rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
       "original_max_position_embeddings": 32, "rope_theta": 500000.0, "rope_type": "llama3"},
       "dtype": "bfloat16", "mlp_bias": false, "pretraining_tp": 1)");
// Qwen3 as transformers 4.51 wrote it, and as transformers 5 writes it.
const std::string kQwenFour =
    Config("qwen3", R"("rope_theta": 1000000, "rope_scaling": null, "torch_dtype": "bfloat16")",
           R"("use_sliding_window": false, "sliding_window": null, "max_window_layers": 28)");
const std::string kQwenFive =
    Config("qwen3", R"("rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
       "dtype": "bfloat16")",
           R"("layer_types": ["full_attention", "full_attention"], "use_sliding_window": false,
       "sliding_window": null, "max_window_layers": 28, "pad_token_id": null)");

TEST(ModelConfigTest, TransformersFiveConfigsReadAsTheirFourEquivalents) {
  for (const auto& [four_json, five_json] :
       {std::pair{kLlamaFour, kLlamaFive}, std::pair{kQwenFour, kQwenFive}}) {
    const absl::StatusOr<ModelConfig> four = ModelConfig::FromJson(four_json);
    const absl::StatusOr<ModelConfig> five = ModelConfig::FromJson(five_json);
    ASSERT_OK(four);
    ASSERT_OK(five);
    EXPECT_EQ(five->rope_theta, four->rope_theta);
    EXPECT_EQ(five->rope_scaling.type, four->rope_scaling.type);
    EXPECT_EQ(five->rope_scaling.factor, four->rope_scaling.factor);
    EXPECT_EQ(five->rope_scaling.low_freq_factor, four->rope_scaling.low_freq_factor);
    EXPECT_EQ(five->rope_scaling.high_freq_factor, four->rope_scaling.high_freq_factor);
    EXPECT_EQ(five->rope_scaling.original_max_position_embeddings,
              four->rope_scaling.original_max_position_embeddings);
    EXPECT_EQ(five->torch_dtype, "bfloat16");
    EXPECT_EQ(four->torch_dtype, "bfloat16");
    EXPECT_EQ(five->ToJson(), four->ToJson());
    // The same weights give the same logits from both layouts ...
    const torch::Tensor logits = ConfigLogits(*four);
    EXPECT_TRUE(torch::equal(ConfigLogits(*five), logits)) << five->model_type;
    // ... and different ones from what the 5.x layout read as if it were
    // absent (theta 10000, no scaling), so the comparison can fail.
    ModelConfig unread = *five;
    unread.rope_theta = 10000.0;
    unread.rope_scaling = RopeScaling();
    EXPECT_GT((ConfigLogits(unread) - logits).abs().max().item<double>(), 1e-3) << five->model_type;
  }
  EXPECT_EQ(ModelConfig::FromJson(kLlamaFive)->rope_theta, 500000.0);
  EXPECT_EQ(ModelConfig::FromJson(kLlamaFive)->rope_scaling.type, "llama3");
  EXPECT_EQ(ModelConfig::FromJson(kQwenFive)->rope_theta, 1000000.0);
}

TEST(ModelConfigTest, RopeParametersPerLayerTypeUseTheFullAttentionEntry) {
  const auto c = ModelConfig::FromJson(
      Config("qwen3", R"("rope_parameters": {"full_attention": {"rope_theta": 1000000, "rope_type":
                  "linear", "factor": 2.0}})",
             R"("layer_types": ["full_attention", "full_attention"])"));
  ASSERT_OK(c);
  EXPECT_EQ(c->rope_theta, 1000000.0);
  EXPECT_EQ(c->rope_scaling.type, "linear");
  EXPECT_EQ(c->rope_scaling.factor, 2.0);
  EXPECT_THAT(Error(Config("qwen3", R"("rope_parameters": {"sliding_attention":
                                        {"rope_theta": 10000, "rope_type": "default"}})")),
              HasSubstr("\"rope_parameters\" is given per layer type but has no "
                        "\"full_attention\" entry"));
}

TEST(ModelConfigTest, UnsupportedRopeTypesAreRefusedByTheirField) {
  for (const char* type : {"yarn", "dynamic", "longrope", "proportional"}) {
    EXPECT_THAT(Error(Config("qwen3", absl::StrCat(R"("rope_parameters": {"rope_theta": 1e6,
                                                      "rope_type": ")",
                                                   type, R"(", "factor": 4.0,
                                                      "original_max_position_embeddings": 32})"))),
                HasSubstr(absl::StrCat("\"rope_parameters.rope_type\" \"", type,
                                       "\" is not supported; expected default, linear or llama3")));
  }
  EXPECT_THAT(Error(Config("llama", R"("rope_scaling": {"type": "dynamic", "factor": 2.0})")),
              HasSubstr("\"rope_scaling.type\" \"dynamic\" is not supported"));
  EXPECT_THAT(Error(Config("llama", R"("rope_parameters": {"rope_type": 3})")),
              HasSubstr("\"rope_parameters.rope_type\" must be a string, got 3"));
  EXPECT_THAT(Error(Config("llama", R"("rope_parameters": [10000])")),
              HasSubstr("\"rope_parameters\" must be an object, got [10000]"));
  EXPECT_THAT(Error(Config("llama", R"("rope_scaling": "llama3")")),
              HasSubstr("\"rope_scaling\" must be an object or null"));
}

TEST(ModelConfigTest, ScalingFactorsThatTransformersRequiresAreRequired) {
  EXPECT_THAT(Error(Config("llama", R"("rope_parameters": {"rope_type": "linear"})")),
              HasSubstr("\"rope_parameters.factor\" is missing"));
  EXPECT_THAT(Error(Config("llama", R"("rope_parameters": {"rope_type": "llama3", "factor": 8,
                                        "high_freq_factor": 4})")),
              HasSubstr("\"rope_parameters.low_freq_factor\" is missing"));
  EXPECT_THAT(Error(Config("llama", R"("rope_scaling": {"rope_type": "llama3", "factor": 8,
                                        "low_freq_factor": 1})")),
              HasSubstr("\"rope_scaling.high_freq_factor\" is missing"));
  EXPECT_THAT(Error(Config("llama", R"("rope_parameters": {"rope_type": "llama3", "factor": 8,
                                        "low_freq_factor": 4, "high_freq_factor": 4})")),
              HasSubstr("0 < low_freq_factor < high_freq_factor"));
  EXPECT_THAT(Error(Config("llama", R"("rope_parameters": {"rope_type": "linear",
                                        "factor": "2"})")),
              HasSubstr("\"rope_parameters.factor\" must be a number, got \"2\""));
}

TEST(ModelConfigTest, Llama3OriginalContextFallsBackAsTransformersFiveDoes) {
  const std::string rope = R"("rope_parameters": {"rope_type": "llama3", "factor": 8,
                              "low_freq_factor": 1, "high_freq_factor": 4})";
  // Not in the object: the top-level field (Phi-3 style), else max_position_embeddings.
  EXPECT_EQ(
      ModelConfig::FromJson(Config("llama", rope, R"("original_max_position_embeddings": 64)"))
          ->rope_scaling.original_max_position_embeddings,
      64);
  EXPECT_EQ(
      ModelConfig::FromJson(Config("llama", rope))->rope_scaling.original_max_position_embeddings,
      256);
}

TEST(ModelConfigTest, BothLayoutsMustAgreeWhenBothArePresent) {
  const std::string five = R"("rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3",
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32})";
  const std::string four_scaling = R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32})";
  const auto both = ModelConfig::FromJson(
      Config("llama", five + ", " + four_scaling + R"(, "rope_theta": 500000.0)"));
  ASSERT_OK(both);
  EXPECT_EQ(both->rope_theta, 500000.0);
  EXPECT_EQ(both->rope_scaling.type, "llama3");
  // A top-level theta beside a scaling that only rope_parameters carries.
  const auto theta_only = ModelConfig::FromJson(Config("llama", five + R"(, "rope_theta": 5e5)"));
  ASSERT_OK(theta_only);
  EXPECT_EQ(theta_only->rope_scaling.type, "llama3");
  EXPECT_THAT(Error(Config("llama", five + R"(, "rope_theta": 10000.0)")),
              HasSubstr("\"rope_parameters.rope_theta\" and \"rope_theta\" disagree (500000 and "
                        "10000)"));
  EXPECT_THAT(Error(Config("llama", five + R"(, "rope_scaling": {"rope_type": "linear",
                                                 "factor": 8.0})")),
              HasSubstr("\"rope_parameters\" and \"rope_scaling\" disagree"));
}

TEST(ModelConfigTest, PartialRotaryFactorOtherThanOneIsRefused) {
  EXPECT_THAT(Error(Config("qwen3", R"("rope_parameters": {"rope_theta": 1e6, "rope_type":
                                        "default", "partial_rotary_factor": 0.5})")),
              HasSubstr("\"rope_parameters.partial_rotary_factor\" 0.5 is not supported"));
  EXPECT_THAT(Error(Config("llama", R"("rope_theta": 1e4, "partial_rotary_factor": 0.25)")),
              HasSubstr("\"partial_rotary_factor\" 0.25 is not supported"));
  EXPECT_EQ(Error(Config("llama", R"("rope_theta": 1e4, "partial_rotary_factor": 1.0)")), "OK");
}

TEST(ModelConfigTest, SlidingWindowLayersAreRefused) {
  EXPECT_THAT(Error(Config("qwen3", R"("rope_theta": 1e6)",
                           R"("layer_types": ["full_attention", "sliding_attention"])")),
              HasSubstr("\"layer_types[1]\" \"sliding_attention\" is not supported"));
  EXPECT_THAT(
      Error(Config("qwen3", R"("rope_theta": 1e6)", R"("layer_types": ["full_attention"])")),
      HasSubstr("\"layer_types\" must list one kind per layer (2)"));
  EXPECT_THAT(Error(Config("qwen3", R"("rope_theta": 1e6)",
                           R"("use_sliding_window": true, "sliding_window": 4096,
                              "max_window_layers": 1)")),
              HasSubstr("\"use_sliding_window\": true is not supported: layers 1 to 1"));
  // Every layer below max_window_layers stays full attention.
  EXPECT_EQ(Error(Config("qwen3", R"("rope_theta": 1e6)",
                         R"("use_sliding_window": true, "sliding_window": 4096,
                            "max_window_layers": 28)")),
            "OK");
}

TEST(ModelConfigTest, ActivationsOtherThanSiluAreRefused) {
  EXPECT_THAT(Error(Config("llama", "", R"("hidden_act": "gelu")")),
              HasSubstr("\"hidden_act\" \"gelu\" is not supported"));
}

TEST(ModelConfigTest, MissingFieldsTakeTransformersClassDefaults) {
  const std::string base = R"({"model_type": "$T", "vocab_size": 96, "hidden_size": 256,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 32})";
  const auto qwen = ModelConfig::FromJson(absl::StrReplaceAll(base, {{"$T", "qwen3"}}));
  ASSERT_OK(qwen);
  EXPECT_EQ(qwen->head_dim, 128);  // Qwen3Config.head_dim, not 256 / 32
  EXPECT_EQ(qwen->num_key_value_heads, 32);
  EXPECT_EQ(qwen->max_position_embeddings, 32768);
  EXPECT_EQ(qwen->rope_theta, 10000.0);
  const auto llama = ModelConfig::FromJson(absl::StrReplaceAll(base, {{"$T", "llama"}}));
  ASSERT_OK(llama);
  EXPECT_EQ(llama->head_dim, 8);
  EXPECT_EQ(llama->num_key_value_heads, 32);
  EXPECT_EQ(llama->max_position_embeddings, 2048);
  // null means "the class computes it": as many key/value heads as query heads.
  const auto null_kv = ModelConfig::FromJson(
      R"({"model_type": "qwen3", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": null})");
  ASSERT_OK(null_kv);
  EXPECT_EQ(null_kv->num_key_value_heads, 4);
}

TEST(ModelConfigTest, ParsesLlamaAndQwen3ConfigJson) {
  const auto llama = ModelConfig::FromJson(R"({
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 3072,
    "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": true, "eos_token_id": [128001, 128008],
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})");
  ASSERT_OK(llama);
  EXPECT_EQ(llama->rope_scaling.type, "llama3");
  EXPECT_FALSE(llama->qk_norm);
  EXPECT_EQ(llama->eos_token_ids.size(), 2u);
  // Llama-3.2-3B has about 3.21 billion parameters.
  EXPECT_NEAR(llama->NumParameters() / 1e9, 3.21, 0.01);
  const auto qwen = ModelConfig::FromJson(R"({
    "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000,
    "tie_word_embeddings": true, "eos_token_id": 151643})");
  ASSERT_OK(qwen);
  EXPECT_TRUE(qwen->qk_norm);
  // Qwen3-1.7B: about 1.72 billion parameters.
  EXPECT_NEAR(qwen->NumParameters() / 1e9, 1.72, 0.01);
  const auto round = ModelConfig::FromJson(qwen->ToJson());
  ASSERT_OK(round);
  EXPECT_EQ(round->NumParameters(), qwen->NumParameters());
}

TEST(ModelConfigTest, RejectsUnsupportedConfigsByKey) {
  EXPECT_THAT(Error(R"({"model_type": "gpt2"})"),
              HasSubstr("model_type \"gpt2\" is not supported"));
  EXPECT_THAT(Error(R"({"model_type": "llama"})"), HasSubstr("\"vocab_size\" is missing"));
  EXPECT_THAT(Error(R"({"model_type": "llama", "vocab_size": 10,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 3,
    "num_key_value_heads": 2})"),
              HasSubstr("num_attention_heads 3 is not a multiple of num_key_value_heads 2"));
  EXPECT_THAT(Error(R"({"model_type": "llama", "vocab_size": 10.5, "hidden_size": 8})"),
              HasSubstr("\"vocab_size\" must be an integer, got 10.5"));
  EXPECT_THAT(Error("[1, 2]"), HasSubstr("not a JSON object"));
}

}  // namespace
}  // namespace asympo
