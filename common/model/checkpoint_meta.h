// meta.json of a learner checkpoint directory (the layout:
// common/model/checkpoint_files.h), parsed from its text. It reads no file
// and needs no LibTorch, so that the parser is fuzzed on its own
// (tests/fuzz/checkpoint_meta_fuzz.cc); ReadCheckpointDirectory calls it.
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace asympo {

// One accepted batch a checkpoint remembers, for exactly-once delivery
// across restarts (learner_server/admission/batch_ledger.h).
struct CheckpointBatch {
  std::string id;
  std::string digest;  // SHA-256 of its groups, raw bytes; empty: unknown
  int32_t groups = 0;  // groups in the batch; 0: unknown (all count as trained)
  // Indices of the groups the checkpoint's steps trained, ascending.
  std::vector<int32_t> trained;
  // Who submitted it: batch ids are one namespace per principal. nullopt:
  // written before checkpoints named principals (its id then matches a push
  // of any principal).
  std::optional<std::string> principal;
};

struct CheckpointMeta {
  uint64_t version = 0;
  int64_t optimizer_steps = 0;
  uint32_t crc32c = 0;                   // of state.safetensors
  std::string config;                    // empty when absent or not a string
  std::vector<CheckpointBatch> batches;  // empty when absent
  // The learner's reward monitor (learner_server/reward_monitor.h), as JSON
  // text; empty when absent.
  std::string reward_monitor;
  // A checkpoint of adapters: their base's identity
  // (common/model/base_identity.h), as JSON text; empty when absent.
  std::string base;
};

// Parses meta.json's `text`. It must be a JSON object with "version" (an
// unsigned integer), "optimizer_steps" (a non-negative integer) and
// "crc32c" (an unsigned 32-bit integer); "config" (a string) is optional,
// and so are "batches" (a list of {"id": string, "digest": 64 hex digits,
// "groups": count, "trained": [group indices below groups]}) and the older
// "batch_ids" (a list of strings: ids without digests, every group
// trained), read when "batches" is absent; "reward_monitor" (an object,
// kept as its JSON text) is optional too, and so is "base" (an object,
// kept as its JSON text). DATA_LOSS naming `path`
// otherwise: a checkpoint whose description is incomplete or corrupt is not
// trusted.
absl::StatusOr<CheckpointMeta> ParseCheckpointMeta(std::string_view text, const std::string& path);

// "batches" as ParseCheckpointMeta reads it.
nlohmann::json CheckpointBatchesJson(const std::vector<CheckpointBatch>& batches);

}  // namespace asympo
