#include "learner_server/checkpoint.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_io.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"

namespace asympo::learner {
namespace {

namespace fs = std::filesystem;
constexpr char kStateFile[] = "state.safetensors";
constexpr char kMetaFile[] = "meta.json";
constexpr char kRngTensor[] = "__rng_state__";
constexpr char kOptimizerPrefix[] = "__optimizer__.";

absl::StatusOr<uint32_t> FileCrc(const std::string& path) {
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<FileMapping> m, FileMapping::Open(path));
  return Crc32c(m->data(), m->size());
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> w, AtomicFileWriter::Create(path));
  ASYMPO_RETURN_IF_ERROR(w->Append(text));
  return w->Commit();
}

absl::Status Restore(const std::string& dir, PolicyModel* model, AdamW* optimizer,
                     CheckpointInfo* info) {
  const std::string state_path = dir + "/" + kStateFile;
  std::string meta_text;
  {
    ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<FileMapping> m,
                            FileMapping::Open(dir + "/" + kMetaFile));
    meta_text.assign(reinterpret_cast<const char*>(m->data()), m->size());
  }
  const nlohmann::json meta = nlohmann::json::parse(meta_text, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("crc32c") ||
      !meta.contains("version") || !meta.contains("optimizer_steps")) {
    return absl::DataLossError("meta.json is not a complete checkpoint description");
  }
  ASYMPO_ASSIGN_OR_RETURN(uint32_t crc, FileCrc(state_path));
  if (crc != meta["crc32c"].get<uint32_t>()) {
    return absl::DataLossError(absl::StrFormat("%s has CRC-32C %08x, meta.json says %08x",
                                               kStateFile, crc, meta["crc32c"].get<uint32_t>()));
  }
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(state_path));
  std::vector<std::pair<std::string, at::Tensor>> weights, moments;
  at::Tensor rng;
  for (const std::string& name : file->Names()) {
    ASYMPO_ASSIGN_OR_RETURN(at::Tensor t, file->Get(name));
    if (name == kRngTensor) {
      rng = t.clone();
    } else if (name.rfind(kOptimizerPrefix, 0) == 0) {
      moments.emplace_back(name.substr(sizeof(kOptimizerPrefix) - 1), t);
    } else {
      weights.emplace_back(name, t);
    }
  }
  // Check everything before changing anything.
  ASYMPO_RETURN_IF_ERROR(model->LoadParameters(weights));
  ASYMPO_RETURN_IF_ERROR(optimizer->LoadState(moments, meta["optimizer_steps"].get<int64_t>()));
  if (rng.defined()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  }
  info->path = dir;
  info->version = meta["version"].get<uint64_t>();
  info->optimizer_steps = meta["optimizer_steps"].get<int64_t>();
  info->config = meta.value("config", std::string());
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> ListCheckpoints(const std::string& root) {
  std::vector<std::pair<uint64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) != 0 || !e.is_directory()) continue;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(name.c_str() + 5, &end, 10);
    if (end == name.c_str() + 5 || *end != '\0') continue;
    found.emplace_back(v, e.path().string());
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& [v, p] : found) out.push_back(p);
  return out;
}

namespace {

absl::StatusOr<CheckpointInfo> SaveUnguarded(const std::string& root, uint64_t version,
                                             const PolicyModel& model, const AdamW& optimizer,
                                             const std::string& config, int keep_last) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", root, ": ", ec.message()));
  const std::string final_dir = absl::StrFormat("%s/ckpt-%012d", root, version);
  const std::string tmp_dir = absl::StrFormat("%s/.tmp-ckpt-%012d-%d", root, version, ::getpid());
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", tmp_dir, ": ", ec.message()));

  std::vector<std::pair<std::string, at::Tensor>> tensors;
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, t] : model.named_parameters()) tensors.emplace_back(name, t.detach());
    for (const auto& [name, t] : optimizer.StateTensors()) {
      tensors.emplace_back(kOptimizerPrefix + name, t);
    }
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    tensors.emplace_back(kRngTensor, gen.get_state());
  }
  const std::string state_path = tmp_dir + "/" + kStateFile;
  ASYMPO_RETURN_IF_ERROR(WriteSafetensors(state_path, tensors));
  ASYMPO_ASSIGN_OR_RETURN(uint32_t crc, FileCrc(state_path));
  nlohmann::json meta;
  meta["version"] = version;
  meta["optimizer_steps"] = optimizer.step_count();
  meta["crc32c"] = crc;
  meta["config"] = config;
  ASYMPO_RETURN_IF_ERROR(WriteText(tmp_dir + "/" + kMetaFile, meta.dump(2) + "\n"));
  fs::remove_all(final_dir, ec);
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp_dir, " to ", final_dir));
  }
  ASYMPO_RETURN_IF_ERROR(SyncDirectory(root));
  if (keep_last > 0) {
    const std::vector<std::string> all = ListCheckpoints(root);
    for (size_t i = static_cast<size_t>(keep_last); i < all.size(); ++i) fs::remove_all(all[i], ec);
  }
  CheckpointInfo info;
  info.path = final_dir;
  info.version = version;
  info.optimizer_steps = optimizer.step_count();
  info.config = config;
  return info;
}

absl::StatusOr<std::optional<CheckpointInfo>> LoadLatestUnguarded(const std::string& root,
                                                                  PolicyModel* model,
                                                                  AdamW* optimizer) {
  std::error_code ec;
  if (!fs::exists(root, ec)) return std::optional<CheckpointInfo>();
  if (!fs::is_directory(root, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint root ", root, " is not a directory"));
  }
  // Temporary directories of saves that a crash interrupted.
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.path().filename().string().rfind(".tmp-ckpt-", 0) == 0) {
      LOG(WARNING) << "removing the unfinished checkpoint " << e.path().string();
      fs::remove_all(e.path(), ec);
    }
  }
  for (const std::string& dir : ListCheckpoints(root)) {
    CheckpointInfo info;
    const absl::Status s = Restore(dir, model, optimizer, &info);
    if (s.ok()) return std::optional<CheckpointInfo>(info);
    LOG(WARNING) << "skipping checkpoint " << dir << ": " << s;
  }
  return std::optional<CheckpointInfo>();
}

}  // namespace

absl::StatusOr<CheckpointInfo> SaveCheckpoint(const std::string& root, uint64_t version,
                                              const PolicyModel& model, const AdamW& optimizer,
                                              const std::string& config, int keep_last) {
  return GuardTorch(absl::StrCat("checkpoint of version ", version, " into ", root), [&] {
    return SaveUnguarded(root, version, model, optimizer, config, keep_last);
  });
}

absl::StatusOr<std::optional<CheckpointInfo>> LoadLatestCheckpoint(const std::string& root,
                                                                   PolicyModel* model,
                                                                   AdamW* optimizer) {
  return GuardTorch(absl::StrCat("restoring a checkpoint from ", root),
                    [&] { return LoadLatestUnguarded(root, model, optimizer); });
}

}  // namespace asympo::learner
