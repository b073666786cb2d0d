#include "common/model/model_config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

using Json = nlohmann::json;

absl::Status Missing(const char* key) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" is missing"));
}

absl::StatusOr<int64_t> GetInt(const Json& j, const char* key, std::optional<int64_t> def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def.has_value()) return *def;
    return Missing(key);
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"", key, "\" must be an integer, got ", it->dump()));
  }
  return it->get<int64_t>();
}

absl::StatusOr<double> GetDouble(const Json& j, const char* key, double def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"", key, "\" must be a number, got ", it->dump()));
  }
  return it->get<double>();
}

bool GetBool(const Json& j, const char* key, bool def) {
  auto it = j.find(key);
  return (it == j.end() || !it->is_boolean()) ? def : it->get<bool>();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a JSON object");
  }
  ModelConfig c;
  c.model_type = j.value("model_type", std::string());
  if (c.model_type != "llama" && c.model_type != "qwen3") {
    return absl::InvalidArgumentError(absl::StrCat("config.json: model_type \"", c.model_type,
                                                   "\" is not supported; expected llama or qwen3"));
  }
  ASYMPO_ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", std::nullopt));
  ASYMPO_ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", std::nullopt));
  ASYMPO_ASSIGN_OR_RETURN(c.intermediate_size, GetInt(j, "intermediate_size", std::nullopt));
  ASYMPO_ASSIGN_OR_RETURN(c.num_hidden_layers, GetInt(j, "num_hidden_layers", std::nullopt));
  ASYMPO_ASSIGN_OR_RETURN(c.num_attention_heads, GetInt(j, "num_attention_heads", std::nullopt));
  ASYMPO_ASSIGN_OR_RETURN(c.num_key_value_heads,
                          GetInt(j, "num_key_value_heads", c.num_attention_heads));
  if (c.num_attention_heads <= 0) {
    return absl::InvalidArgumentError("config.json: \"num_attention_heads\" must be positive");
  }
  ASYMPO_ASSIGN_OR_RETURN(c.head_dim, GetInt(j, "head_dim", c.hidden_size / c.num_attention_heads));
  ASYMPO_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          GetInt(j, "max_position_embeddings", int64_t{4096}));
  ASYMPO_ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-6));
  ASYMPO_ASSIGN_OR_RETURN(c.rope_theta, GetDouble(j, "rope_theta", 10000.0));
  c.tie_word_embeddings = GetBool(j, "tie_word_embeddings", false);
  c.attention_bias = GetBool(j, "attention_bias", false);
  c.qk_norm = c.model_type == "qwen3";
  if (GetBool(j, "mlp_bias", false)) {
    return absl::InvalidArgumentError("config.json: \"mlp_bias\": true is not supported");
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && it->is_object()) {
    const Json& r = *it;
    c.rope_scaling.type = r.value("rope_type", r.value("type", std::string("default")));
    if (c.rope_scaling.type != "default" && c.rope_scaling.type != "linear" &&
        c.rope_scaling.type != "llama3") {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: rope_scaling type \"", c.rope_scaling.type,
                       "\" is not supported; expected default, linear or llama3"));
    }
    ASYMPO_ASSIGN_OR_RETURN(c.rope_scaling.factor, GetDouble(r, "factor", 1.0));
    ASYMPO_ASSIGN_OR_RETURN(c.rope_scaling.low_freq_factor, GetDouble(r, "low_freq_factor", 1.0));
    ASYMPO_ASSIGN_OR_RETURN(c.rope_scaling.high_freq_factor, GetDouble(r, "high_freq_factor", 4.0));
    ASYMPO_ASSIGN_OR_RETURN(c.rope_scaling.original_max_position_embeddings,
                            GetInt(r, "original_max_position_embeddings", int64_t{8192}));
  }
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int32_t>());
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (e.is_number_integer()) c.eos_token_ids.push_back(e.get<int32_t>());
      }
    }
  }
  if (auto it = j.find("bos_token_id"); it != j.end() && it->is_number_integer()) {
    c.bos_token_id = it->get<int32_t>();
  }
  c.torch_dtype = j.value("torch_dtype", std::string("float32"));
  ASYMPO_RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open model config ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<ModelConfig> c = FromJson(ss.str());
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  }
  return c;
}

ModelConfig ModelConfig::Tiny(int64_t vocab_size) {
  ModelConfig c;
  c.model_type = "qwen3";
  c.vocab_size = vocab_size;
  c.hidden_size = 64;
  c.intermediate_size = 192;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  c.eos_token_ids = {0};
  return c;
}

absl::Status ModelConfig::Validate() const {
  const auto positive = [](const char* key, int64_t v) -> absl::Status {
    if (v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: ", key, " must be positive, got ", v));
    }
    return absl::OkStatus();
  };
  ASYMPO_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  ASYMPO_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  ASYMPO_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  ASYMPO_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  ASYMPO_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  ASYMPO_RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads));
  ASYMPO_RETURN_IF_ERROR(positive("head_dim", head_dim));
  ASYMPO_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: num_attention_heads ", num_attention_heads,
                     " is not a multiple of num_key_value_heads ", num_key_value_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: head_dim ", head_dim, " must be even for rotary embeddings"));
  }
  if (!(rms_norm_eps > 0) || !(rope_theta > 0)) {
    return absl::InvalidArgumentError("config: rms_norm_eps and rope_theta must be positive");
  }
  if (rope_scaling.type != "default" && !(rope_scaling.factor > 0)) {
    return absl::InvalidArgumentError("config: rope_scaling factor must be positive");
  }
  for (int32_t eos : eos_token_ids) {
    if (eos < 0 || eos >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: eos_token_id ", eos, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

std::string ModelConfig::ToJson() const {
  Json j;
  j["architectures"] = {model_type == "llama" ? "LlamaForCausalLM" : "Qwen3ForCausalLM"};
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = torch_dtype;
  if (rope_scaling.type != "default") {
    j["rope_scaling"] = {
        {"rope_type", rope_scaling.type},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else if (!eos_token_ids.empty()) {
    j["eos_token_id"] = eos_token_ids;
  }
  if (bos_token_id.has_value()) j["bos_token_id"] = *bos_token_id;
  return j.dump(2);
}

int64_t ModelConfig::NumParameters() const {
  const int64_t h = hidden_size, q = num_attention_heads * head_dim,
                kv = num_key_value_heads * head_dim;
  int64_t layer = h * q + 2 * h * kv + q * h + 3 * h * intermediate_size + 2 * h;
  if (attention_bias) layer += q + 2 * kv;
  if (qk_norm) layer += 2 * head_dim;
  int64_t total = num_hidden_layers * layer + vocab_size * h + h;
  if (!tie_word_embeddings) total += vocab_size * h;
  return total;
}

}  // namespace asympo
