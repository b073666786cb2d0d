// Learner checkpoints: the policy weights, the optimizer's moments and step
// count, the version, the CPU random-generator state and the learner's
// configuration, written by every data-parallel rank in parallel and found
// again at start-up by any world.
//
// Layout: <root>/ckpt-<version, 12 digits>/: meta.json, manifest.json and
// one shard file per writing rank (common/model/sharded_checkpoint.h). Each
// rank writes its own part (what it alone holds, and its 1/world of what
// every rank holds whole), with no gather. Rank 0 then merges the ranks'
// indexes into manifest.json, writes meta.json and renames the temporary
// directory into place (fsyncing the root): a crash at any point leaves
// either the whole checkpoint or none, and the older ones untouched.
// Restoring, every rank reads only the elements it holds, from any writers'
// world size and sharding mode; the blocks it reads are checked against
// their CRC-32C first, on every rank, and a checkpoint that any rank finds
// incomplete or corrupt is skipped by all for an older one. Checkpoints of
// the older layout (one state.safetensors) are read the same way.
//
// Both calls are collectives when `ranks` has collectives: every rank calls
// them, in the same order. Thread-compatible; the trainer thread calls them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint_files.h"
#include "common/model/policy_model.h"
#include "learner_server/optim/adamw.h"
#include "learner_server/optim/sharded_adamw.h"

namespace asympo::learner {

struct CheckpointInfo {
  std::string path;  // the checkpoint directory
  uint64_t version = 0;
  int64_t optimizer_steps = 0;
  // Free-form configuration text saved with it (the learner's flags).
  std::string config;
  // The batches its steps trained groups of (GroupQueue::RecordedBatches).
  std::vector<CheckpointBatch> batches;
  // The reward monitor's state (RewardMonitor::ToJson); empty: none saved.
  std::string reward_monitor;
  // A checkpoint of adapters: their base's identity (base_identity.h).
  std::string base;
  // Restored: the writers' world size and sharding mode; bytes this rank read.
  int written_by = 1;
  std::string written_shard;
  int64_t bytes_read = 0;
};

// Who takes part: the ranks' collectives (nullptr: one process) and the
// sharding mode the manifest records.
struct CheckpointRanks {
  ShardCollectives* collectives = nullptr;
  std::string dist_shard = "none";
};

// What rank 0 saves beside the state (the other ranks' values are unused).
struct CheckpointSave {
  std::string root;
  uint64_t version = 0;
  std::string config;
  int keep_last = 3;  // newest checkpoints kept (0: all); rank 0 prunes
  std::vector<CheckpointBatch> batches;
  std::string reward_monitor;  // a JSON object's text; empty: none
  std::string base;            // adapters' base identity, a JSON object's text; empty: none
};

// Saves into <root>/ckpt-<version>, creating `root`. Every rank returns the
// same outcome of the writes; only rank 0 learns whether the commit
// succeeded (the others return its would-be path).
absl::StatusOr<CheckpointInfo> SaveCheckpoint(const CheckpointSave& save, const PolicyModel& model,
                                              const Optimizer& optimizer,
                                              const CheckpointRanks& ranks = {});

// One process: the form the tests and tools use.
absl::StatusOr<CheckpointInfo> SaveCheckpoint(const std::string& root, uint64_t version,
                                              const PolicyModel& model, const AdamW& optimizer,
                                              const std::string& config, int keep_last = 3,
                                              const std::vector<CheckpointBatch>& batches = {},
                                              const std::string& reward_monitor = "");

// Restores the newest valid checkpoint under `root` into `model` (its
// weights, through `optimizer`, which holds them or this rank's chunks of
// them) and `optimizer`, and rank 0's CPU generator. Corrupt or incomplete
// ones, and ones of another model (names or shapes), are logged and
// skipped; temporary directories of interrupted saves are removed. Returns
// nullopt when there is none (or `root` is absent), with the optimizer's
// moments and step count reset. Only an unreadable root or a read failing
// after its check is an error.
absl::StatusOr<std::optional<CheckpointInfo>> LoadLatestCheckpoint(
    const std::string& root, const PolicyModel& model, Optimizer* optimizer,
    const CheckpointRanks& ranks = {});

// Collective, before anything is saved or restored: checks that every rank
// sees the directory rank 0 writes (`root`; created). FAILED_PRECONDITION
// naming the flag and the ranks that do not.
absl::Status CheckSharedCheckpointDir(const std::string& root, const CheckpointRanks& ranks);

// One process, the model by pointer (the tests' form).
inline absl::StatusOr<std::optional<CheckpointInfo>> LoadLatestCheckpoint(const std::string& root,
                                                                          PolicyModel* model,
                                                                          Optimizer* optimizer) {
  return LoadLatestCheckpoint(root, *model, optimizer, CheckpointRanks{});
}

// Rank 0's commit of a written save `tmp` as `final_dir`. When
// `final_dir` already holds a checkpoint (a version saved again: the final
// checkpoint at shutdown), the two directories are swapped in one
// renameat2(RENAME_EXCHANGE) and the old one, now at `tmp`, removed: at no
// moment is there no ckpt-<version>. Where the filesystem has no exchange
// (NFS), or with `exchange` false, the old one is first renamed to
// `old` (a name starting ".old-ckpt-") beside it: a kill between the two
// renames leaves it there, and the next restore renames it back
// (RecoverReplacedCheckpoints).
absl::Status CommitCheckpointDirectory(const std::string& tmp, const std::string& final_dir,
                                       const std::string& old, bool exchange = true);

// Under `root`: each .old-ckpt-<version>-* left by an interrupted commit
// goes back to ckpt-<version> when that is missing, else is removed.
void RecoverReplacedCheckpoints(const std::string& root);

// Checkpoint directories under `root`, newest first (by version):
// common/model/checkpoint_files.h.
using ::asympo::ListCheckpoints;

}  // namespace asympo::learner
