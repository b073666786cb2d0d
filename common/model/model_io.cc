#include "common/model/model_io.h"

#include <sys/stat.h>

#include <stdio.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/device.h"
#include "common/model/safetensors_checkpoint.h"
#include "common/model/safetensors_io.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

absl::Status MakeDirs(const std::string& dir) {
  std::string path;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!path.empty() && ::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::InternalError(
            absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
      }
    }
    if (i < dir.size()) path.push_back(dir[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PolicyModel>> LoadUnguarded(const std::string& dir,
                                                           const ModelOptions& options) {
  ASYMPO_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromFile(dir + "/config.json"));
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> ckpt,
                          SafetensorsCheckpoint::Open(dir));
  ModelOptions o = options;
  o.random_init = false;
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<PolicyModel> model, PolicyModel::CreateRandom(config, o));
  std::map<std::string, std::vector<int64_t>> expected;
  for (const auto& [name, t] : model->named_weights()) {
    expected[name] = std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
  }
  // Tied checkpoints sometimes also store lm_head.weight; it must match.
  if (config.tie_word_embeddings && ckpt->Contains("lm_head.weight")) {
    expected["lm_head.weight"] = {config.vocab_size, config.hidden_size};
  }
  absl::Status check = ckpt->CheckTensors(expected);
  if (!check.ok()) {
    return absl::Status(check.code(), absl::StrCat(dir, ": ", check.message()));
  }
  std::vector<std::pair<std::string, at::Tensor>> weights;
  for (const auto& [name, t] : model->named_weights()) {
    // Read in the model's dtype (the compute dtype of a frozen base).
    ASYMPO_ASSIGN_OR_RETURN(at::Tensor w, ckpt->Get(name, t.scalar_type()));
    weights.emplace_back(name, std::move(w));
  }
  ASYMPO_RETURN_IF_ERROR(model->LoadWeights(weights));
  return model;
}

absl::Status WriteConfig(const PolicyModel& model, const std::string& dir, at::ScalarType dtype) {
  ASYMPO_RETURN_IF_ERROR(MakeDirs(dir));
  ModelConfig config = model.config();
  config.torch_dtype = DTypeName(dtype);
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> out,
                          AtomicFileWriter::Create(dir + "/config.json"));
  ASYMPO_RETURN_IF_ERROR(out->Append(config.ToJson() + "\n"));
  return out->Commit();
}

absl::Status ExportUnguarded(const PolicyModel& model, const std::string& dir,
                             int64_t max_shard_bytes, at::ScalarType dtype) {
  if (dtype == at::ScalarType::Undefined) dtype = model.options().dtype;
  ASYMPO_RETURN_IF_ERROR(WriteConfig(model, dir, dtype));
  // With adapters: the merged weights (a plain Hugging Face model).
  const std::vector<std::pair<std::string, at::Tensor>> weights = model.MergedWeights();
  // Planned as meta tensors; each shard converted to host memory in `dtype`
  // only when it is written, so that the export holds one shard, not a
  // host copy of the whole model.
  std::vector<std::pair<std::string, at::Tensor>> planned;
  for (const auto& [name, t] : weights) {
    planned.emplace_back(name,
                         at::empty(t.sizes(), at::TensorOptions().dtype(dtype).device(at::kMeta)));
  }
  return WriteShardedSafetensors(dir, planned, max_shard_bytes, {},
                                 [&weights, dtype](size_t i) -> absl::StatusOr<at::Tensor> {
                                   return weights[i].second.detach().to(at::kCPU, dtype);
                                 });
}

// Writes each part as it comes (model-part-<i>.safetensors), then names
// the files after their count and writes the index.
absl::Status ExportPartsUnguarded(
    const PolicyModel& model, const std::string& dir, at::ScalarType dtype,
    const std::function<absl::Status(const ModelPartVisitor&)>& parts) {
  if (model.has_adapters()) {
    // The weights are whole on every rank; only adapters are sharded.
    return absl::FailedPreconditionError(
        "exporting in parts is for sharded weights; a model with adapters exports whole");
  }
  if (dtype == at::ScalarType::Undefined) dtype = model.options().dtype;
  ASYMPO_RETURN_IF_ERROR(WriteConfig(model, dir, dtype));
  std::vector<std::vector<std::string>> files;  // each part's tensor names
  int64_t total = 0;
  absl::Status written;
  ASYMPO_RETURN_IF_ERROR(parts([&](const std::vector<size_t>& params) -> absl::Status {
    if (!written.ok()) return absl::OkStatus();
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    std::vector<std::string> names;
    for (const size_t i : params) {
      const auto& [name, t] = model.named_parameters()[i];
      tensors.emplace_back(name, t.detach().to(at::kCPU, dtype).contiguous());
      names.push_back(name);
      total += tensors.back().second.nbytes();
    }
    written =
        WriteSafetensors(absl::StrCat(dir, "/model-part-", files.size(), ".safetensors"), tensors);
    files.push_back(std::move(names));
    return absl::OkStatus();
  }));
  ASYMPO_RETURN_IF_ERROR(written);
  nlohmann::json index;
  index["metadata"]["total_size"] = total;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string name = absl::StrFormat("model-%05d-of-%05d.safetensors", f + 1, files.size());
    const std::string from = absl::StrCat(dir, "/model-part-", f, ".safetensors");
    if (::rename(from.c_str(), (dir + "/" + name).c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot rename ", from, ": ", std::strerror(errno)));
    }
    for (const std::string& t : files[f]) index["weight_map"][t] = name;
  }
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> out,
                          AtomicFileWriter::Create(dir + "/" + kSafetensorsIndexFileName));
  ASYMPO_RETURN_IF_ERROR(out->Append(index.dump(2) + "\n"));
  ASYMPO_RETURN_IF_ERROR(out->Commit());
  return SyncDirectory(dir);
}

}  // namespace

absl::Status ExportPolicyModelInParts(
    const PolicyModel& model, const std::string& dir, at::ScalarType dtype,
    const std::function<absl::Status(const ModelPartVisitor&)>& parts) {
  return GuardTorch(absl::StrCat("exporting the model to ", dir),
                    [&] { return ExportPartsUnguarded(model, dir, dtype, parts); });
}

absl::StatusOr<std::unique_ptr<PolicyModel>> LoadPolicyModel(const std::string& dir,
                                                             const ModelOptions& options) {
  return GuardTorch(absl::StrCat("loading the model ", dir),
                    [&] { return LoadUnguarded(dir, options); });
}

absl::Status ExportPolicyModel(const PolicyModel& model, const std::string& dir,
                               int64_t max_shard_bytes, at::ScalarType dtype) {
  return GuardTorch(absl::StrCat("exporting the model to ", dir),
                    [&] { return ExportUnguarded(model, dir, max_shard_bytes, dtype); });
}

absl::StatusOr<std::unique_ptr<PolicyModel>> CreateOrLoadPolicyModel(const std::string& model,
                                                                     int64_t tiny_vocab_size,
                                                                     const ModelOptions& options) {
  if (model != "tiny") return LoadPolicyModel(model, options);
  return PolicyModel::CreateRandom(ModelConfig::Tiny(tiny_vocab_size), options);
}

absl::StatusOr<at::ScalarType> ParseModelDType(const std::string& dtype) {
  if (dtype == "float32") return at::kFloat;
  if (dtype == "bfloat16") return at::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype=", dtype, ": expected float32 or bfloat16"));
}

}  // namespace asympo
