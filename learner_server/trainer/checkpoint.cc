#include "learner_server/trainer/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <system_error>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/checkpoint_files.h"
#include "common/model/safetensors_io.h"
#include "common/model/sharded_checkpoint.h"
#include "common/model/torch_errors.h"
#include "common/remove_tree.h"
#include "common/status_macros.h"
#include "learner_server/trainer/checkpoint_ranks.h"

namespace asympo::learner {
namespace {

namespace fs = std::filesystem;

std::string ErrorText(const std::error_code& ec) {
  return absl::StrCat(ec.message(), " (errno ", ec.value(), ")");
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> w, AtomicFileWriter::Create(path));
  ASYMPO_RETURN_IF_ERROR(w->Append(text));
  return w->Commit();
}

std::vector<CheckpointParam> ParamsOf(const PolicyModel& model, const Optimizer& optimizer) {
  const std::vector<std::vector<int64_t>> shapes = optimizer.ParamShapes();
  const std::vector<bool> moments = optimizer.MomentsDefined();
  std::vector<CheckpointParam> out;
  const auto& named = model.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) out.push_back({named[i].first, shapes[i], moments[i]});
  return out;
}

at::Tensor RngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// Removes an unfinished save's directory; out of descriptors (EMFILE:
// RemoveTree lists the directory), by the names a save puts there.
void RemoveUnfinished(const std::string& tmp, int world) {
  const absl::Status removed = RemoveTree(tmp);
  if (removed.ok()) return;
  for (int r = 0; r < world; ++r) {
    ::unlink((tmp + "/" + CheckpointShardFileName(r, world)).c_str());
    ::unlink((tmp + "/" + CheckpointShardIndexName(r)).c_str());
  }
  for (const char* name : {kCheckpointManifestFile, kCheckpointMetaFile}) {
    ::unlink((tmp + "/" + name).c_str());
  }
  if (::rmdir(tmp.c_str()) != 0 && errno != ENOENT) {
    LOG(WARNING) << "cannot remove the unfinished checkpoint " << tmp << ": " << removed.message()
                 << "; the next start removes it";
  }
}

// Rank 0: creates the save's temporary directory.
absl::Status Prepare(const std::string& root, const std::string& tmp) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", root, ": ", ErrorText(ec)));
  (void)RemoveTree(tmp);
  fs::create_directories(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", ErrorText(ec)));
  return absl::OkStatus();
}

absl::Status WriteMeta(const CheckpointSave& save, const std::string& dir, uint32_t manifest_crc,
                       int64_t steps) {
  nlohmann::json meta;
  meta["version"] = save.version;
  meta["optimizer_steps"] = steps;
  meta["crc32c"] = manifest_crc;
  meta["layout"] = "sharded";
  meta["config"] = save.config;
  meta["batches"] = CheckpointBatchesJson(save.batches);
  if (!save.reward_monitor.empty()) {
    nlohmann::json monitor = nlohmann::json::parse(save.reward_monitor, nullptr, false);
    if (!monitor.is_object()) {
      return absl::InvalidArgumentError("the reward monitor's state is not a JSON object");
    }
    meta["reward_monitor"] = std::move(monitor);
  }
  if (!save.base.empty()) {
    nlohmann::json base = nlohmann::json::parse(save.base, nullptr, false);
    if (!base.is_object()) return absl::InvalidArgumentError("the base identity is not JSON");
    meta["base"] = std::move(base);
  }
  // Ids arrive as protobuf strings, which are UTF-8; anything else is
  // replaced rather than failing the checkpoint.
  return WriteText(dir + "/" + kCheckpointMetaFile,
                   meta.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

absl::Status RenameError(const std::string& from, const std::string& to, int error) {
  return absl::InternalError(
      absl::StrCat("cannot rename ", from, " to ", to, ": ",
                   ErrorText(std::error_code(error, std::generic_category()))));
}

// Rank 0, once every rank's part is written: manifest, meta, rename, prune.
absl::Status Commit(const CheckpointSave& save, const std::string& tmp, int world,
                    const std::string& dist_shard, const std::vector<CheckpointParam>& params,
                    int64_t steps) {
  ASYMPO_ASSIGN_OR_RETURN(const uint32_t crc,
                          WriteCheckpointManifest(tmp, world, dist_shard, params));
  ASYMPO_RETURN_IF_ERROR(WriteMeta(save, tmp, crc, steps));
  ASYMPO_RETURN_IF_ERROR(SyncDirectory(tmp));
  const std::string final_dir = CheckpointDir(save.root, save.version);
  std::string old = tmp;
  old.replace(old.rfind("/.tmp-") + 1, 5, ".old-");
  ASYMPO_RETURN_IF_ERROR(CommitCheckpointDirectory(tmp, final_dir, old));
  if (save.keep_last > 0) {
    const std::vector<std::string> all = ListCheckpoints(save.root);
    for (size_t i = static_cast<size_t>(save.keep_last); i < all.size(); ++i) {
      const absl::Status removed = RemoveTree(all[i]);
      if (!removed.ok()) LOG(WARNING) << "cannot prune an old checkpoint: " << removed.message();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointInfo> SaveUnguarded(const CheckpointSave& save, const PolicyModel& model,
                                             const Optimizer& optimizer,
                                             const CheckpointRanks& ranks) {
  const int rank = RankOf(ranks), world = WorldOf(ranks);
  // Rank 0 names the temporary directory (its nonce, to every rank).
  std::vector<double> header{0.0, 0.0};
  absl::Status own;
  const auto tmp_of = [&save](double nonce) {
    return absl::StrFormat("%s/.tmp-ckpt-%012d-%06x", save.root, save.version,
                           static_cast<int>(nonce));
  };
  if (rank == 0) {
    header[0] = static_cast<double>(std::random_device()() & 0xffffff) + 1;
    own = Prepare(save.root, tmp_of(header[0]));
    header[1] = own.ok() ? 0.0 : 1.0;
  }
  ASYMPO_RETURN_IF_ERROR(SumOverRanks(ranks, &header));
  if (header[1] != 0) return Agreed(own, {0}, "preparing the checkpoint");
  const std::string tmp = tmp_of(header[0]);
  const std::vector<CheckpointParam> params = ParamsOf(model, optimizer);
  {
    at::NoGradGuard no_grad;
    own = WriteCheckpointShard(tmp, rank, world, params, optimizer.PiecesToWrite(rank, world),
                               rank == 0 ? RngState() : at::Tensor());
  }
  ASYMPO_ASSIGN_OR_RETURN(const std::vector<int> failed, FailedRanks(ranks, own));
  if (!failed.empty()) {
    if (rank == 0) RemoveUnfinished(tmp, world);
    return Agreed(own, failed, "writing the checkpoint's shards");
  }
  if (rank == 0) {
    const absl::Status committed =
        Commit(save, tmp, world, ranks.dist_shard, params, optimizer.steps());
    if (!committed.ok()) {
      RemoveUnfinished(tmp, world);
      return committed;
    }
  }
  CheckpointInfo info;
  info.path = CheckpointDir(save.root, save.version);
  info.version = save.version;
  info.optimizer_steps = optimizer.steps();
  info.config = save.config;
  info.batches = save.batches;
  info.reward_monitor = save.reward_monitor;
  info.base = save.base;
  return info;
}

}  // namespace

absl::StatusOr<CheckpointInfo> SaveCheckpoint(const CheckpointSave& save, const PolicyModel& model,
                                              const Optimizer& optimizer,
                                              const CheckpointRanks& ranks) {
  return GuardTorch(absl::StrCat("checkpoint of version ", save.version, " into ", save.root),
                    [&] { return SaveUnguarded(save, model, optimizer, ranks); });
}

absl::StatusOr<CheckpointInfo> SaveCheckpoint(const std::string& root, uint64_t version,
                                              const PolicyModel& model, const AdamW& optimizer,
                                              const std::string& config, int keep_last,
                                              const std::vector<CheckpointBatch>& batches,
                                              const std::string& reward_monitor) {
  CheckpointSave save;
  save.root = root;
  save.version = version;
  save.config = config;
  save.keep_last = keep_last;
  save.batches = batches;
  save.reward_monitor = reward_monitor;
  return SaveCheckpoint(save, model, optimizer);
}

absl::Status CommitCheckpointDirectory(const std::string& tmp, const std::string& final_dir,
                                       const std::string& old, bool exchange) {
  const fs::path root = fs::path(final_dir).parent_path();
  if (::rename(tmp.c_str(), final_dir.c_str()) == 0) return SyncDirectory(root.string());
  if (errno != EEXIST && errno != ENOTEMPTY) return RenameError(tmp, final_dir, errno);
  // The version is there already: replace it without a gap. Either way the
  // replaced checkpoint ends in `replaced`, removed once the new one is in.
  std::string replaced = tmp;  // swapped there by the exchange
  if (!exchange ||
      ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
    if (exchange && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
      return RenameError(tmp, final_dir, errno);
    }
    if (::rename(final_dir.c_str(), old.c_str()) != 0) return RenameError(final_dir, old, errno);
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      const int error = errno;
      (void)::rename(old.c_str(), final_dir.c_str());
      return RenameError(tmp, final_dir, error);
    }
    replaced = old;
  }
  ASYMPO_RETURN_IF_ERROR(SyncDirectory(root.string()));
  const absl::Status removed = RemoveTree(replaced);
  if (!removed.ok()) LOG(WARNING) << "cannot remove the replaced checkpoint: " << removed.message();
  return absl::OkStatus();
}

void RecoverReplacedCheckpoints(const std::string& root) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".old-ckpt-", 0) != 0) continue;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(name.c_str() + 10, &end, 10);
    const std::string dir = CheckpointDir(root, v);
    std::error_code exists_error;
    if (end != name.c_str() + 10 && *end == '-' && !fs::exists(dir, exists_error)) {
      LOG(WARNING) << "an interrupted commit left checkpoint " << v << " aside; restoring "
                   << e.path().string() << " as " << dir;
      if (::rename(e.path().c_str(), dir.c_str()) == 0) continue;
      LOG(WARNING) << RenameError(e.path().string(), dir, errno).message();
      continue;
    }
    LOG(WARNING) << "removing the replaced checkpoint " << e.path().string();
    const absl::Status removed = RemoveTree(e.path().string());
    if (!removed.ok()) LOG(WARNING) << removed.message();
  }
}

}  // namespace asympo::learner
