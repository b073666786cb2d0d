// The files of one learner checkpoint directory, ckpt-<version, 12 digits>/
// (learner_server/trainer/checkpoint.h writes them atomically):
//  - the state: manifest.json and one shard file per writing rank
//    (common/model/sharded_checkpoint.h); before those, one
//    state.safetensors: the policy's parameters under their own names, the
//    optimizer's tensors under "__optimizer__.<name>", the CPU generator's
//    state as "__rng_state__" (still read);
//  - meta.json: {"version", "optimizer_steps", "crc32c" (of manifest.json,
//    or of state.safetensors), "layout" ("sharded"; absent before),
//    "config" (the learner's flags, one per line), "batches" (optional: the accepted batches of
//    which the checkpoint's steps trained at least one group, oldest first, with their digests and
//    the groups trained, for exactly-once delivery; older checkpoints have
//    "batch_ids", ids alone: common/model/checkpoint_meta.h), "reward_monitor"
//    (optional: the learner's reward EMAs, peaks and detectors)}.
// Reading lives here, below the learner, so that tools that only need the
// weights (asympo-eval) read checkpoints the same way the learner does.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"
#include "common/model/checkpoint_meta.h"

namespace asympo {

inline constexpr char kCheckpointStateFile[] = "state.safetensors";
inline constexpr char kCheckpointMetaFile[] = "meta.json";
inline constexpr char kCheckpointRngTensor[] = "__rng_state__";
inline constexpr char kCheckpointOptimizerPrefix[] = "__optimizer__.";

struct CheckpointContents {
  uint64_t version = 0;
  int64_t optimizer_steps = 0;
  std::string config;
  std::vector<std::pair<std::string, at::Tensor>> weights;  // the policy's parameters
  std::vector<std::pair<std::string, at::Tensor>> moments;  // names without the prefix
  at::Tensor rng;                                           // undefined when absent
  std::vector<CheckpointBatch> batches;                     // empty when absent
  std::string reward_monitor;                               // JSON text; empty when absent
  std::string base;  // adapters' base identity (base_identity.h); empty: not adapters
};

// Reads `dir` (a ckpt-* directory, either layout: the weights whole, the
// moments of the old layout only) after checking it against meta.json's
// CRC-32C (the sharded layout: every block's). DATA_LOSS for an incomplete or corrupt checkpoint;
// NOT_FOUND or another error for unreadable files.
absl::StatusOr<CheckpointContents> ReadCheckpointDirectory(const std::string& dir);

// `dir`/meta.json, parsed (ParseCheckpointMeta; DATA_LOSS when malformed).
absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir);

// The CRC-32C of a whole file, as meta.json records it for
// state.safetensors (the learner when writing, ReadCheckpointDirectory when
// checking).
absl::StatusOr<uint32_t> CheckpointFileCrc(const std::string& path);

// Checkpoint directories (ckpt-<version>) under `root`, newest first.
std::vector<std::string> ListCheckpoints(const std::string& root);

// The value of `--name=value` (or `--name value`) in a checkpoint's config
// text; empty when absent.
std::string CheckpointConfigFlag(const std::string& config, const std::string& name);

}  // namespace asympo
