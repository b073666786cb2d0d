#include "common/model/peft_adapter.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_io.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

// "self_attn.q_proj" -> "q_proj": PEFT's target_modules name the module.
std::vector<std::string> TargetModules(uint32_t targets) {
  std::vector<std::string> out;
  for (int t = 0; t < kLoraTargetCount; ++t) {
    if (((targets >> t) & 1U) == 0) continue;
    const std::string module = LoraModuleName(static_cast<LoraTarget>(t));
    out.push_back(module.substr(module.find('.') + 1));
  }
  return out;
}

nlohmann::json PeftConfig(const LoraOptions& lora, const std::string& base_model) {
  nlohmann::json c;
  c["peft_type"] = "LORA";
  c["task_type"] = "CAUSAL_LM";
  c["base_model_name_or_path"] = base_model;
  c["r"] = lora.rank;
  // PEFT types it an int: an integral alpha is written as one.
  if (lora.alpha == std::floor(lora.alpha) && lora.alpha < 1e9) {
    c["lora_alpha"] = static_cast<int64_t>(lora.alpha);
  } else {
    c["lora_alpha"] = lora.alpha;
  }
  c["lora_dropout"] = 0.0;
  c["target_modules"] = TargetModules(lora.targets);
  c["bias"] = "none";
  c["fan_in_fan_out"] = false;
  c["inference_mode"] = true;
  c["init_lora_weights"] = true;
  c["modules_to_save"] = nullptr;
  c["layers_to_transform"] = nullptr;
  c["layers_pattern"] = nullptr;
  c["rank_pattern"] = nlohmann::json::object();
  c["alpha_pattern"] = nlohmann::json::object();
  c["use_rslora"] = false;
  c["use_dora"] = false;
  c["revision"] = nullptr;
  return c;
}

absl::Status CheckConfig(const nlohmann::json& c, const LoraOptions& lora,
                         const std::string& path) {
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (!c.is_object() || c.value("peft_type", "") != "LORA") return bad("not a LoRA adapter");
  if (!c.contains("r") || !c["r"].is_number_integer() || c["r"].get<int64_t>() != lora.rank) {
    return bad(absl::StrCat("r is ", c.value("r", nlohmann::json()).dump(),
                            "; the model's rank is ", lora.rank));
  }
  if (!c.contains("lora_alpha") || !c["lora_alpha"].is_number() ||
      c["lora_alpha"].get<double>() != lora.alpha) {
    return bad(absl::StrCat("lora_alpha is ", c.value("lora_alpha", nlohmann::json()).dump(),
                            "; the model's is ", lora.alpha));
  }
  std::vector<std::string> targets;
  if (c.contains("target_modules") && c["target_modules"].is_array()) {
    for (const auto& t : c["target_modules"])
      targets.push_back(t.is_string() ? t.get<std::string>() : "?");
  }
  std::sort(targets.begin(), targets.end());
  std::vector<std::string> mine = TargetModules(lora.targets);
  std::sort(mine.begin(), mine.end());
  if (targets != mine) {
    return bad(absl::StrCat("target_modules are [", absl::StrJoin(targets, ", "),
                            "]; the model adapts [", absl::StrJoin(mine, ", "), "]"));
  }
  if (c.value("use_rslora", false) || c.value("use_dora", false) ||
      c.value("bias", std::string("none")) != "none" ||
      (c.contains("modules_to_save") && !c["modules_to_save"].is_null()) ||
      (c.contains("layers_to_transform") && !c["layers_to_transform"].is_null()) ||
      !c.value("rank_pattern", nlohmann::json::object()).empty() ||
      !c.value("alpha_pattern", nlohmann::json::object()).empty()) {
    return bad(
        "uses rsLoRA, DoRA, biases, modules_to_save or per-layer patterns, which this "
        "model's adapters do not have");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ExportPeftAdapter(const PolicyModel& model, const std::string& dir,
                               const std::string& base_model, at::ScalarType dtype) {
  if (!model.has_adapters()) {
    return absl::FailedPreconditionError("the model has no adapters to export");
  }
  if (dtype == at::ScalarType::Undefined) dtype = at::kFloat;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  return GuardTorch(absl::StrCat("exporting the adapter to ", dir), [&]() -> absl::Status {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& [name, t] : model.named_parameters()) {
      tensors.emplace_back(kPeftPrefix + name, t.detach().to(at::kCPU, dtype).contiguous());
    }
    ASYMPO_RETURN_IF_ERROR(WriteSafetensors(dir + "/" + kPeftWeightsFile, tensors));
    ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> out,
                            AtomicFileWriter::Create(dir + "/" + kPeftConfigFile));
    ASYMPO_RETURN_IF_ERROR(
        out->Append(PeftConfig(model.options().lora, base_model).dump(2) + "\n"));
    return out->Commit();
  });
}

absl::Status LoadPeftAdapter(const std::string& dir, PolicyModel* model) {
  if (!model->has_adapters()) {
    return absl::FailedPreconditionError("the model has no adapters to load into");
  }
  const std::string config_path = dir + "/" + kPeftConfigFile;
  std::ifstream in(config_path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", config_path));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, false);
  ASYMPO_RETURN_IF_ERROR(CheckConfig(config, model->options().lora, config_path));
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                          SafetensorsFile::Open(dir + "/" + kPeftWeightsFile));
  std::vector<std::pair<std::string, at::Tensor>> source;
  for (const std::string& name : file->Names()) {
    if (!absl::StartsWith(name, kPeftPrefix)) {
      return absl::InvalidArgumentError(
          absl::StrCat(file->path(), ": tensor ", name, " does not start with ", kPeftPrefix));
    }
    ASYMPO_ASSIGN_OR_RETURN(at::Tensor t, file->Get(name));
    source.emplace_back(name.substr(sizeof(kPeftPrefix) - 1), std::move(t));
  }
  const absl::Status loaded = model->LoadParameters(source);
  if (!loaded.ok())
    return absl::InvalidArgumentError(absl::StrCat(file->path(), ": ", loaded.message()));
  return absl::OkStatus();
}

}  // namespace asympo
