// meta.json of a learner checkpoint directory (the layout:
// common/model/checkpoint_files.h), parsed from its text. It reads no file
// and needs no LibTorch, so that the parser is fuzzed on its own
// (tests/fuzz/checkpoint_meta_fuzz.cc); ReadCheckpointDirectory calls it.
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace asympo {

struct CheckpointMeta {
  uint64_t version = 0;
  int64_t optimizer_steps = 0;
  uint32_t crc32c = 0;                 // of state.safetensors
  std::string config;                  // empty when absent or not a string
  std::vector<std::string> batch_ids;  // empty when absent
};

// Parses meta.json's `text`. It must be a JSON object with "version" (an
// unsigned integer), "optimizer_steps" (a non-negative integer) and
// "crc32c" (an unsigned 32-bit integer); "config" (a string) and
// "batch_ids" (a list of strings) are optional. DATA_LOSS naming `path`
// otherwise: a checkpoint whose description is incomplete or corrupt is not
// trusted.
absl::StatusOr<CheckpointMeta> ParseCheckpointMeta(std::string_view text, const std::string& path);

}  // namespace asympo
