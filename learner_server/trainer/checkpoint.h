// Learner checkpoints: the policy weights, the optimizer's moments and step
// count, the version, the CPU random-generator state and the learner's
// configuration, written atomically and found again at start-up.
//
// Layout: <root>/ckpt-<version, 12 digits>/{state.safetensors, meta.json}.
// A checkpoint is written into a temporary directory, every file fsynced,
// then renamed into place (and the root fsynced), so a crash leaves either
// the whole checkpoint or none. meta.json carries the CRC-32C of
// state.safetensors, so a truncated or corrupted checkpoint is detected;
// LoadLatestCheckpoint logs and skips it and falls back to an older one.
// Functions are thread-compatible; the trainer thread calls them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint_files.h"
#include "common/model/policy_model.h"
#include "learner_server/optim/adamw.h"

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
};

// Saves into <root>/ckpt-<version>, creating `root`; keeps the newest
// `keep_last` checkpoints (0 keeps all) and removes older ones. `batches`
// and `reward_monitor` (a JSON object's text; empty: none) go into
// meta.json.
absl::StatusOr<CheckpointInfo> SaveCheckpoint(const std::string& root, uint64_t version,
                                              const PolicyModel& model, const AdamW& optimizer,
                                              const std::string& config, int keep_last = 3,
                                              const std::vector<CheckpointBatch>& batches = {},
                                              const std::string& reward_monitor = "");

// Restores the newest valid checkpoint under `root` into `model` and
// `optimizer` (and the CPU generator). Corrupt or incomplete ones are logged
// and skipped; temporary directories of interrupted saves are removed. Returns nullopt when there
// is none (or `root` is absent). Only an unreadable root is an error.
// `moments_on_host`: the AdamW moments stay in host memory (rank 0 of a
// sharded world scatters them from there, a round or a unit at a time to
// the device, instead of holding them whole on it).
absl::StatusOr<std::optional<CheckpointInfo>> LoadLatestCheckpoint(const std::string& root,
                                                                   PolicyModel* model,
                                                                   AdamW* optimizer,
                                                                   bool moments_on_host = false);

// Checkpoint directories under `root`, newest first (by version):
// common/model/checkpoint_files.h.
using ::asympo::ListCheckpoints;

}  // namespace asympo::learner
