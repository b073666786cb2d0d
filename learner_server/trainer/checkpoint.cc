#include "learner_server/trainer/checkpoint.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
#include "common/model/checkpoint_files.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_io.h"
#include "common/model/torch_errors.h"
#include "common/remove_tree.h"
#include "common/status_macros.h"

namespace asympo::learner {
namespace {

namespace fs = std::filesystem;

absl::Status WriteText(const std::string& path, const std::string& text) {
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> w, AtomicFileWriter::Create(path));
  ASYMPO_RETURN_IF_ERROR(w->Append(text));
  return w->Commit();
}

absl::Status Restore(const std::string& dir, PolicyModel* model, AdamW* optimizer,
                     CheckpointInfo* info, bool moments_on_host) {
  ASYMPO_ASSIGN_OR_RETURN(CheckpointContents contents, ReadCheckpointDirectory(dir));
  // Check everything before changing anything.
  ASYMPO_RETURN_IF_ERROR(model->LoadParameters(contents.weights));
  ASYMPO_RETURN_IF_ERROR(optimizer->LoadState(contents.moments, contents.optimizer_steps,
                                              /*copy=*/true, moments_on_host));
  if (contents.rng.defined()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(contents.rng);
  }
  info->path = dir;
  info->version = contents.version;
  info->optimizer_steps = contents.optimizer_steps;
  info->config = std::move(contents.config);
  info->batches = std::move(contents.batches);
  info->reward_monitor = std::move(contents.reward_monitor);
  return absl::OkStatus();
}

}  // namespace

namespace {

// "what it says (errno N)" of a filesystem error.
std::string ErrorText(const std::error_code& ec) {
  return absl::StrCat(ec.message(), " (errno ", ec.value(), ")");
}

// Removes a save's temporary directory when the save fails at any point,
// a LibTorch exception included (GuardTorch catches it further up).
class RemoveUnlessKept {
 public:
  explicit RemoveUnlessKept(std::string dir) : dir_(std::move(dir)) {}
  ~RemoveUnlessKept() {
    if (dir_.empty()) return;
    const absl::Status removed = RemoveTree(dir_);
    if (removed.ok()) return;
    // RemoveTree lists the directory, which takes a descriptor: out of
    // them (EMFILE), remove by name what a save puts there (a file writer
    // that fails removes its own temporary file).
    for (const char* name : {kCheckpointStateFile, kCheckpointMetaFile}) {
      ::unlink((dir_ + "/" + name).c_str());
    }
    if (::rmdir(dir_.c_str()) != 0 && errno != ENOENT) {
      LOG(WARNING) << "cannot remove the unfinished checkpoint " << dir_ << ": "
                   << removed.message() << "; the next start removes it";
    }
  }
  void Keep() { dir_.clear(); }

 private:
  std::string dir_;
};

// Writes state.safetensors and meta.json into `dir`.
absl::Status WriteCheckpointFiles(const std::string& dir, uint64_t version,
                                  const PolicyModel& model, const AdamW& optimizer,
                                  const std::string& config,
                                  const std::vector<CheckpointBatch>& batches,
                                  const std::string& reward_monitor) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, t] : model.named_parameters()) tensors.emplace_back(name, t.detach());
    for (const auto& [name, t] : optimizer.StateTensors()) {
      tensors.emplace_back(kCheckpointOptimizerPrefix + name, t);
    }
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    tensors.emplace_back(kCheckpointRngTensor, gen.get_state());
  }
  const std::string state_path = dir + "/" + kCheckpointStateFile;
  ASYMPO_RETURN_IF_ERROR(WriteSafetensors(state_path, tensors));
  ASYMPO_ASSIGN_OR_RETURN(uint32_t crc, CheckpointFileCrc(state_path));
  nlohmann::json meta;
  meta["version"] = version;
  meta["optimizer_steps"] = optimizer.step_count();
  meta["crc32c"] = crc;
  meta["config"] = config;
  meta["batches"] = CheckpointBatchesJson(batches);
  if (!reward_monitor.empty()) {
    nlohmann::json monitor = nlohmann::json::parse(reward_monitor, nullptr, false);
    if (!monitor.is_object()) {
      return absl::InvalidArgumentError("the reward monitor's state is not a JSON object");
    }
    meta["reward_monitor"] = std::move(monitor);
  }
  // Ids arrive as protobuf strings, which are UTF-8; anything else is
  // replaced rather than failing the checkpoint.
  return WriteText(dir + "/" + kCheckpointMetaFile,
                   meta.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

absl::StatusOr<CheckpointInfo> SaveUnguarded(const std::string& root, uint64_t version,
                                             const PolicyModel& model, const AdamW& optimizer,
                                             const std::string& config, int keep_last,
                                             const std::vector<CheckpointBatch>& batches,
                                             const std::string& reward_monitor) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", root, ": ", ErrorText(ec)));
  const std::string final_dir = absl::StrFormat("%s/ckpt-%012d", root, version);
  const std::string tmp_dir = absl::StrFormat("%s/.tmp-ckpt-%012d-%d", root, version, ::getpid());
  (void)RemoveTree(tmp_dir);  // left by an earlier try of this process id
  RemoveUnlessKept cleanup(tmp_dir);
  fs::create_directories(tmp_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", tmp_dir, ": ", ErrorText(ec)));
  ASYMPO_RETURN_IF_ERROR(
      WriteCheckpointFiles(tmp_dir, version, model, optimizer, config, batches, reward_monitor));
  (void)RemoveTree(final_dir);
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp_dir, " to ", final_dir, ": ",
                     ErrorText(std::error_code(errno, std::generic_category()))));
  }
  cleanup.Keep();
  ASYMPO_RETURN_IF_ERROR(SyncDirectory(root));
  if (keep_last > 0) {
    const std::vector<std::string> all = ListCheckpoints(root);
    for (size_t i = static_cast<size_t>(keep_last); i < all.size(); ++i) {
      const absl::Status removed = RemoveTree(all[i]);
      if (!removed.ok()) LOG(WARNING) << "cannot prune an old checkpoint: " << removed.message();
    }
  }
  CheckpointInfo info;
  info.path = final_dir;
  info.version = version;
  info.optimizer_steps = optimizer.step_count();
  info.config = config;
  info.batches = batches;
  info.reward_monitor = reward_monitor;
  return info;
}

absl::StatusOr<std::optional<CheckpointInfo>> LoadLatestUnguarded(const std::string& root,
                                                                  PolicyModel* model,
                                                                  AdamW* optimizer,
                                                                  bool moments_on_host) {
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
      const absl::Status removed = RemoveTree(e.path().string());
      if (!removed.ok()) LOG(WARNING) << removed.message();
    }
  }
  for (const std::string& dir : ListCheckpoints(root)) {
    CheckpointInfo info;
    const absl::Status s = Restore(dir, model, optimizer, &info, moments_on_host);
    if (s.ok()) return std::optional<CheckpointInfo>(info);
    LOG(WARNING) << "skipping checkpoint " << dir << ": " << s;
  }
  return std::optional<CheckpointInfo>();
}

}  // namespace

absl::StatusOr<CheckpointInfo> SaveCheckpoint(const std::string& root, uint64_t version,
                                              const PolicyModel& model, const AdamW& optimizer,
                                              const std::string& config, int keep_last,
                                              const std::vector<CheckpointBatch>& batches,
                                              const std::string& reward_monitor) {
  return GuardTorch(absl::StrCat("checkpoint of version ", version, " into ", root), [&] {
    return SaveUnguarded(root, version, model, optimizer, config, keep_last, batches,
                         reward_monitor);
  });
}

absl::StatusOr<std::optional<CheckpointInfo>> LoadLatestCheckpoint(const std::string& root,
                                                                   PolicyModel* model,
                                                                   AdamW* optimizer,
                                                                   bool moments_on_host) {
  return GuardTorch(absl::StrCat("restoring a checkpoint from ", root),
                    [&] { return LoadLatestUnguarded(root, model, optimizer, moments_on_host); });
}

}  // namespace asympo::learner
