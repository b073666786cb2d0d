#include "common/model/model_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view what, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", what, " ", rule));
}

absl::Status Missing(absl::string_view key) {
  return Invalid(absl::StrCat("\"", key, "\""), "is missing");
}

bool Present(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && !it->is_null();
}

// `path` names the key in messages ("rope_parameters.factor"); `key` is looked up in `j`.
absl::StatusOr<int64_t> GetInt(const Json& j, const char* key, std::optional<int64_t> def,
                               absl::string_view path = {}) {
  if (path.empty()) path = key;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def.has_value()) return *def;
    return Missing(path);
  }
  // 8192.0 is how Python writes some integers that passed through a float.
  if (it->is_number_float() && it->get<double>() == std::floor(it->get<double>()) &&
      std::abs(it->get<double>()) < 9e15) {
    return static_cast<int64_t>(it->get<double>());
  }
  if (!it->is_number_integer()) {
    return Invalid(absl::StrCat("\"", path, "\""),
                   absl::StrCat("must be an integer, got ", it->dump()));
  }
  return it->get<int64_t>();
}

absl::StatusOr<double> GetDouble(const Json& j, const char* key, std::optional<double> def,
                                 absl::string_view path = {}) {
  if (path.empty()) path = key;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def.has_value()) return *def;
    return Missing(path);
  }
  if (!it->is_number()) {
    return Invalid(absl::StrCat("\"", path, "\""),
                   absl::StrCat("must be a number, got ", it->dump()));
  }
  return it->get<double>();
}

bool GetBool(const Json& j, const char* key, bool def) {
  auto it = j.find(key);
  return (it == j.end() || !it->is_boolean()) ? def : it->get<bool>();
}

// The rotary settings one source of config.json gives: transformers <= 4
// writes a top-level "rope_theta" and a "rope_scaling" object; transformers 5
// writes one "rope_parameters" object holding both (rope_theta, rope_type and
// the scaling factors).
struct RopeSource {
  std::optional<double> theta;
  RopeScaling scaling;
  std::optional<double> partial_rotary_factor;
};

// Sets s.theta and s.partial_rotary_factor from "rope_theta" and
// "partial_rotary_factor" where `j` has them; `prefix` names `j` in messages.
absl::Status ReadThetaAndPartial(const Json& j, absl::string_view prefix, RopeSource& s) {
  for (const auto& [key, value] : {std::pair{"rope_theta", &s.theta},
                                   std::pair{"partial_rotary_factor", &s.partial_rotary_factor}}) {
    if (!Present(j, key)) continue;
    ASYMPO_ASSIGN_OR_RETURN(*value, GetDouble(j, key, std::nullopt, absl::StrCat(prefix, key)));
  }
  return absl::OkStatus();
}

// Reads one rope object (`r`, named `name`) as transformers does, with its
// required keys per type: linear needs factor; llama3 needs factor,
// low_freq_factor and high_freq_factor, and takes
// original_max_position_embeddings from the object, else from the top level,
// else max_position_embeddings (transformers 5's rule).
absl::StatusOr<RopeSource> ReadRopeObject(const Json& r, const std::string& name, const Json& top,
                                          int64_t max_position_embeddings) {
  RopeSource s;
  const auto field = [&](const char* key) { return absl::StrCat(name, ".", key); };
  std::string type_key = "rope_type";
  if (!Present(r, "rope_type") && Present(r, "type")) type_key = "type";
  if (Present(r, type_key.c_str())) {
    const Json& t = r[type_key];
    if (!t.is_string()) {
      return Invalid(absl::StrCat("\"", field(type_key.c_str()), "\""),
                     absl::StrCat("must be a string, got ", t.dump()));
    }
    s.scaling.type = t.get<std::string>();
  }
  const std::string& type = s.scaling.type;
  if (type != "default" && type != "linear" && type != "llama3") {
    return Invalid(absl::StrCat("\"", field(type_key.c_str()), "\" \"", type, "\""),
                   "is not supported; expected default, linear or llama3 (dynamic, yarn, longrope "
                   "and the other scalings of transformers are not implemented)");
  }
  ASYMPO_RETURN_IF_ERROR(ReadThetaAndPartial(r, name + ".", s));
  if (type == "default") return s;
  ASYMPO_ASSIGN_OR_RETURN(s.scaling.factor, GetDouble(r, "factor", std::nullopt, field("factor")));
  if (type == "linear") return s;
  ASYMPO_ASSIGN_OR_RETURN(s.scaling.low_freq_factor,
                          GetDouble(r, "low_freq_factor", std::nullopt, field("low_freq_factor")));
  ASYMPO_ASSIGN_OR_RETURN(s.scaling.high_freq_factor, GetDouble(r, "high_freq_factor", std::nullopt,
                                                                field("high_freq_factor")));
  ASYMPO_ASSIGN_OR_RETURN(const int64_t fallback,
                          GetInt(top, "original_max_position_embeddings", max_position_embeddings));
  ASYMPO_ASSIGN_OR_RETURN(s.scaling.original_max_position_embeddings,
                          GetInt(r, "original_max_position_embeddings", fallback,
                                 field("original_max_position_embeddings")));
  return s;
}

bool SameScaling(const RopeScaling& a, const RopeScaling& b) {
  if (a.type != b.type) return false;
  if (a.type == "default") return true;
  if (a.factor != b.factor) return false;
  if (a.type == "linear") return true;
  return a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings;
}

// "rope_parameters" may hold one object per attention layer type
// ({"full_attention": {...}}) in transformers 5; every layer here is a full
// attention layer (CheckAttentionLayers), so its entry is the one that counts.
absl::StatusOr<const Json*> FlatRopeParameters(const Json& rp) {
  bool nested = !rp.empty();
  for (const auto& [key, value] : rp.items()) {
    nested = nested && value.is_object() && absl::EndsWith(key, "_attention");
  }
  if (!nested) return &rp;
  auto it = rp.find("full_attention");
  if (it == rp.end()) {
    return Invalid(
        "\"rope_parameters\"",
        absl::StrCat("is given per layer type but has no \"full_attention\" entry: ", rp.dump()));
  }
  return &*it;
}

// Rotary settings from whichever layouts config.json uses. When both are
// present (a config written by one version and edited by another) they must
// agree: picking one silently would give wrong logits for the other.
absl::Status ParseRope(const Json& j, ModelConfig& c) {
  std::optional<RopeSource> five;  // "rope_parameters"
  if (Present(j, "rope_parameters")) {
    if (!j["rope_parameters"].is_object()) {
      return Invalid("\"rope_parameters\"",
                     absl::StrCat("must be an object, got ", j["rope_parameters"].dump()));
    }
    ASYMPO_ASSIGN_OR_RETURN(const Json* rp, FlatRopeParameters(j["rope_parameters"]));
    ASYMPO_ASSIGN_OR_RETURN(five,
                            ReadRopeObject(*rp, "rope_parameters", j, c.max_position_embeddings));
  }
  RopeSource four;  // "rope_scaling" and the top-level keys
  const bool has_scaling = Present(j, "rope_scaling");
  if (has_scaling) {
    if (!j["rope_scaling"].is_object()) {
      return Invalid("\"rope_scaling\"",
                     absl::StrCat("must be an object or null, got ", j["rope_scaling"].dump()));
    }
    ASYMPO_ASSIGN_OR_RETURN(
        four, ReadRopeObject(j["rope_scaling"], "rope_scaling", j, c.max_position_embeddings));
  }
  ASYMPO_RETURN_IF_ERROR(ReadThetaAndPartial(j, "", four));
  if (five.has_value()) {
    if (five->theta && four.theta && *five->theta != *four.theta) {
      return Invalid("\"rope_parameters.rope_theta\" and \"rope_theta\"",
                     absl::StrCat("disagree (", *five->theta, " and ", *four.theta, ")"));
    }
    if (has_scaling && !SameScaling(five->scaling, four.scaling)) {
      return Invalid("\"rope_parameters\" and \"rope_scaling\"",
                     absl::StrCat("disagree: ", j["rope_parameters"].dump(), " and ",
                                  j["rope_scaling"].dump()));
    }
  }
  for (const auto& [s, prefix] :
       {std::pair{five ? &*five : nullptr, "rope_parameters."}, std::pair{&four, ""}}) {
    if (s != nullptr && s->partial_rotary_factor && *s->partial_rotary_factor != 1.0) {
      return Invalid(
          absl::StrCat("\"", prefix, "partial_rotary_factor\" ", *s->partial_rotary_factor),
          "is not supported: Llama and Qwen3 rotate the whole head (1.0)");
    }
  }
  // Where both layouts are present they agree; 10000 is transformers' default_theta.
  c.rope_theta = five && five->theta ? *five->theta : four.theta.value_or(10000.0);
  c.rope_scaling = five ? five->scaling : four.scaling;
  return absl::OkStatus();
}

// Every layer must be a full (global) causal attention layer: the model has
// no sliding-window attention. transformers lists the layers' kinds in
// "layer_types" (Qwen3, 4.53 and later); older Qwen3 configs say
// use_sliding_window, sliding_window and max_window_layers instead.
absl::Status CheckAttentionLayers(const Json& j, const ModelConfig& c) {
  if (Present(j, "layer_types")) {
    const Json& types = j["layer_types"];
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
      return Invalid("\"layer_types\"", absl::StrCat("must list one kind per layer (",
                                                     c.num_hidden_layers, "), got ", types.dump()));
    }
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "full_attention") {
        return Invalid(absl::StrCat("\"layer_types[", i, "]\" ", types[i].dump()),
                       "is not supported; every layer must be \"full_attention\" (no "
                       "sliding-window attention)");
      }
    }
    return absl::OkStatus();
  }
  if (GetBool(j, "use_sliding_window", false) && Present(j, "sliding_window")) {
    ASYMPO_ASSIGN_OR_RETURN(const int64_t max_window_layers,
                            GetInt(j, "max_window_layers", int64_t{28}));
    if (max_window_layers < c.num_hidden_layers) {
      return Invalid("\"use_sliding_window\": true",
                     absl::StrCat("is not supported: layers ", max_window_layers, " to ",
                                  c.num_hidden_layers - 1, " would use sliding-window attention"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Missing keys take the defaults of transformers' LlamaConfig and
// Qwen3Config, so that a config.json means here what it means there (Qwen3's
// head_dim is 128 unless given, not hidden_size / num_attention_heads).
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
  const bool qwen3 = c.model_type == "qwen3";
  ASYMPO_ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", std::nullopt));
  ASYMPO_ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", std::nullopt));
  ASYMPO_ASSIGN_OR_RETURN(c.intermediate_size, GetInt(j, "intermediate_size", std::nullopt));
  ASYMPO_ASSIGN_OR_RETURN(c.num_hidden_layers, GetInt(j, "num_hidden_layers", std::nullopt));
  ASYMPO_ASSIGN_OR_RETURN(c.num_attention_heads, GetInt(j, "num_attention_heads", std::nullopt));
  if (c.num_attention_heads <= 0) {
    return absl::InvalidArgumentError("config.json: \"num_attention_heads\" must be positive");
  }
  // A null count means "as many as the query heads" in both classes; an
  // absent one is Qwen3Config's default of 32.
  ASYMPO_ASSIGN_OR_RETURN(
      c.num_key_value_heads,
      GetInt(j, "num_key_value_heads",
             qwen3 && !j.contains("num_key_value_heads") ? 32 : c.num_attention_heads));
  ASYMPO_ASSIGN_OR_RETURN(
      c.head_dim, GetInt(j, "head_dim", qwen3 ? 128 : c.hidden_size / c.num_attention_heads));
  ASYMPO_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          GetInt(j, "max_position_embeddings", qwen3 ? 32768 : 2048));
  ASYMPO_ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-6));
  ASYMPO_RETURN_IF_ERROR(ParseRope(j, c));
  ASYMPO_RETURN_IF_ERROR(CheckAttentionLayers(j, c));
  c.tie_word_embeddings = GetBool(j, "tie_word_embeddings", false);
  c.attention_bias = GetBool(j, "attention_bias", false);
  c.qk_norm = qwen3;
  if (GetBool(j, "mlp_bias", false)) {
    return absl::InvalidArgumentError("config.json: \"mlp_bias\": true is not supported");
  }
  if (Present(j, "hidden_act")) {
    const Json& act = j["hidden_act"];
    if (act != "silu" && act != "swish") {
      return Invalid(absl::StrCat("\"hidden_act\" ", act.dump()),
                     "is not supported; expected \"silu\" (SwiGLU)");
    }
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
  // transformers 4.56 and later write "dtype"; earlier ones "torch_dtype".
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (auto it = j.find(key); it != j.end() && it->is_string()) {
      c.torch_dtype = it->get<std::string>();
      break;
    }
  }
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
  if (rope_scaling.type == "llama3" &&
      !(rope_scaling.low_freq_factor > 0 &&
        rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
        rope_scaling.original_max_position_embeddings > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and a positive "
        "original_max_position_embeddings, got ",
        rope_scaling.low_freq_factor, ", ", rope_scaling.high_freq_factor, " and ",
        rope_scaling.original_max_position_embeddings));
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
