// LoadLatestCheckpoint (checkpoint.h): every rank reads its own part of the
// newest checkpoint that every rank finds whole.
#include <filesystem>
#include <fstream>
#include <random>
#include <system_error>

#include <glog/logging.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/checkpoint_files.h"
#include "common/model/sharded_checkpoint.h"
#include "common/model/torch_errors.h"
#include "common/remove_tree.h"
#include "common/status_macros.h"
#include "learner_server/trainer/checkpoint.h"
#include "learner_server/trainer/checkpoint_ranks.h"

namespace asympo::learner {

absl::Status SumOverRanks(const CheckpointRanks& r, std::vector<double>* values) {
  return r.collectives ? r.collectives->SumValues(values) : absl::OkStatus();
}

absl::StatusOr<std::vector<int>> FailedRanks(const CheckpointRanks& r, const absl::Status& status) {
  std::vector<double> flags(static_cast<size_t>(WorldOf(r)), 0.0);
  flags[static_cast<size_t>(RankOf(r))] = status.ok() ? 0.0 : 1.0;
  ASYMPO_RETURN_IF_ERROR(SumOverRanks(r, &flags));
  std::vector<int> failed;
  for (size_t i = 0; i < flags.size(); ++i) {
    if (flags[i] != 0) failed.push_back(static_cast<int>(i));
  }
  return failed;
}

absl::Status Agreed(const absl::Status& own, const std::vector<int>& failed,
                    const std::string& what) {
  if (!own.ok()) return own;
  return absl::DataLossError(
      absl::StrCat(what, " failed on rank(s) ", absl::StrJoin(failed, ", "), " (see their logs)"));
}

std::string CheckpointDir(const std::string& root, uint64_t version) {
  return absl::StrFormat("%s/ckpt-%012d", root, version);
}

namespace {

namespace fs = std::filesystem;

// A checkpoint opened by one rank, checked against its model.
struct Opened {
  CheckpointMeta meta;
  std::unique_ptr<CheckpointStateReader> reader;
  std::vector<StatePiece> pieces;  // what this rank reads, into its live state
};

// Opens `dir`, checks that it holds `model`'s parameters, prepares the
// optimizer for it and verifies every block this rank will read. The
// weights are not touched; the optimizer's moments and step count are.
absl::StatusOr<Opened> OpenAndVerify(const std::string& dir, const PolicyModel& model,
                                     Optimizer* optimizer) {
  Opened o;
  ASYMPO_ASSIGN_OR_RETURN(o.meta, ReadCheckpointMeta(dir));
  std::vector<std::string> names;
  for (const auto& [name, t] : model.named_parameters()) names.push_back(name);
  ASYMPO_ASSIGN_OR_RETURN(o.reader, CheckpointStateReader::Open(dir, o.meta.crc32c, names));
  const std::vector<std::vector<int64_t>> shapes = optimizer->ParamShapes();
  std::vector<bool> moments;
  for (size_t i = 0; i < names.size(); ++i) {
    const CheckpointParam* p = o.reader->Find(names[i]);
    if (p == nullptr || p->shape != shapes[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, " does not hold this model: parameter ", names[i],
                       p == nullptr ? " is missing" : " has another shape"));
    }
    moments.push_back(p->moments);
  }
  if (o.reader->params().size() != names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, " holds ", o.reader->params().size(),
                                                   " parameters; this model has ", names.size()));
  }
  optimizer->PrepareRestore(moments, o.meta.optimizer_steps);
  o.pieces = optimizer->PiecesToRead();
  for (const StatePiece& p : o.pieces) {
    ASYMPO_RETURN_IF_ERROR(o.reader->Verify(p.kind, names[p.param], p.begin, p.data.numel()));
  }
  ASYMPO_RETURN_IF_ERROR(o.reader->Rng().status());
  return o;
}

// Copies the verified pieces into the live state (and rank 0's generator).
absl::Status Apply(Opened& o, const PolicyModel& model, bool rank0) {
  at::NoGradGuard no_grad;
  const auto& named = model.named_parameters();
  for (StatePiece& p : o.pieces) {
    ASYMPO_RETURN_IF_ERROR(o.reader->Read(p.kind, named[p.param].first, p.begin, p.data));
  }
  ASYMPO_ASSIGN_OR_RETURN(const at::Tensor rng, o.reader->Rng());
  if (rank0 && rng.defined()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  }
  return absl::OkStatus();
}

// Rank 0: the candidates, newest first, after removing what interrupted
// saves left.
absl::StatusOr<std::vector<uint64_t>> Candidates(const std::string& root) {
  std::error_code ec;
  if (!fs::exists(root, ec)) return std::vector<uint64_t>();
  if (!fs::is_directory(root, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint root ", root, " is not a directory"));
  }
  RecoverReplacedCheckpoints(root);
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.path().filename().string().rfind(".tmp-ckpt-", 0) == 0) {
      LOG(WARNING) << "removing the unfinished checkpoint " << e.path().string();
      const absl::Status removed = RemoveTree(e.path().string());
      if (!removed.ok()) LOG(WARNING) << removed.message();
    }
  }
  std::vector<uint64_t> out;
  for (const std::string& dir : ListCheckpoints(root)) {
    const uint64_t v = std::stoull(fs::path(dir).filename().string().substr(5));
    if (CheckpointDir(root, v) == dir) out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::optional<CheckpointInfo>> LoadUnguarded(const std::string& root,
                                                            const PolicyModel& model,
                                                            Optimizer* optimizer,
                                                            const CheckpointRanks& ranks) {
  const bool rank0 = RankOf(ranks) == 0;
  absl::StatusOr<std::vector<uint64_t>> candidates =
      rank0 ? Candidates(root) : std::vector<uint64_t>();
  const std::vector<bool> fresh_moments = optimizer->MomentsDefined();
  const int64_t fresh_steps = optimizer->steps();
  for (size_t i = 0;; ++i) {
    // Rank 0's next candidate to every rank (0: none left; -1: no root).
    std::vector<double> next{0.0};
    if (rank0) {
      next[0] = !candidates.ok()         ? -1.0
                : i < candidates->size() ? static_cast<double>((*candidates)[i]) + 1
                                         : 0.0;
    }
    ASYMPO_RETURN_IF_ERROR(SumOverRanks(ranks, &next));
    if (next[0] <= 0) {
      optimizer->PrepareRestore(fresh_moments, fresh_steps);
      if (next[0] < 0) {
        return rank0 ? candidates.status()
                     : absl::InvalidArgumentError("rank 0 cannot read the checkpoint root");
      }
      return std::optional<CheckpointInfo>();
    }
    const std::string dir = CheckpointDir(root, static_cast<uint64_t>(next[0] - 1));
    absl::StatusOr<Opened> opened = OpenAndVerify(dir, model, optimizer);
    ASYMPO_ASSIGN_OR_RETURN(const std::vector<int> failed, FailedRanks(ranks, opened.status()));
    if (!failed.empty()) {
      LOG(WARNING) << "skipping checkpoint " << dir << ": "
                   << Agreed(opened.status(), failed, "its check").message();
      continue;
    }
    ASYMPO_RETURN_IF_ERROR(Apply(*opened, model, rank0));
    CheckpointInfo info;
    info.path = dir;
    info.version = opened->meta.version;
    info.optimizer_steps = opened->meta.optimizer_steps;
    info.config = std::move(opened->meta.config);
    info.batches = std::move(opened->meta.batches);
    info.reward_monitor = std::move(opened->meta.reward_monitor);
    info.base = std::move(opened->meta.base);
    info.written_by = opened->reader->world_size();
    info.written_shard = opened->reader->dist_shard();
    info.bytes_read = opened->reader->bytes_read();
    return std::optional<CheckpointInfo>(std::move(info));
  }
}

}  // namespace

absl::Status CheckSharedCheckpointDir(const std::string& root, const CheckpointRanks& ranks) {
  if (WorldOf(ranks) <= 1) return absl::OkStatus();
  // Rank 0 leaves a file of a random name; every other rank looks for it.
  std::vector<double> nonce{0.0};
  absl::Status own;
  std::string marker;
  if (RankOf(ranks) == 0) {
    nonce[0] = static_cast<double>(std::random_device()() & 0xffffff) + 1;
    marker = absl::StrFormat("%s/.rank0-%06x", root, static_cast<int>(nonce[0]));
    std::error_code ec;
    fs::create_directories(root, ec);
    std::ofstream(marker) << "written by rank 0 to check that every rank sees this directory\n";
    if (!fs::exists(marker, ec)) own = absl::InternalError(absl::StrCat("cannot write ", marker));
  }
  ASYMPO_RETURN_IF_ERROR(SumOverRanks(ranks, &nonce));
  if (RankOf(ranks) != 0) {
    marker = absl::StrFormat("%s/.rank0-%06x", root, static_cast<int>(nonce[0]));
    std::error_code ec;
    if (!fs::exists(marker, ec)) {
      own = absl::FailedPreconditionError(absl::StrCat(
          "--checkpoint_dir=", root, ": this rank does not see the file rank 0 wrote there (",
          marker,
          "): every rank must be given the same shared directory (on several nodes, a "
          "network or parallel filesystem), since each writes and reads its part of every "
          "checkpoint"));
    }
  }
  ASYMPO_ASSIGN_OR_RETURN(const std::vector<int> failed, FailedRanks(ranks, own));
  if (RankOf(ranks) == 0) {
    std::error_code ec;
    fs::remove(marker, ec);
  }
  if (failed.empty()) return absl::OkStatus();
  if (!own.ok()) return own;
  return absl::FailedPreconditionError(absl::StrCat(
      "--checkpoint_dir=", root, ": rank(s) ", absl::StrJoin(failed, ", "),
      " do not see the directory rank 0 writes: every rank must be given the same shared "
      "directory (on several nodes, a network or parallel filesystem)"));
}

absl::StatusOr<std::optional<CheckpointInfo>> LoadLatestCheckpoint(const std::string& root,
                                                                   const PolicyModel& model,
                                                                   Optimizer* optimizer,
                                                                   const CheckpointRanks& ranks) {
  return GuardTorch(absl::StrCat("restoring a checkpoint from ", root),
                    [&] { return LoadUnguarded(root, model, optimizer, ranks); });
}

}  // namespace asympo::learner
