// The identity of the base weights a run's adapters (common/model/lora.h)
// belong to, saved with every checkpoint of adapters: the --model flag's
// value and a CRC-32C of the base's content. Adapters mean nothing on
// another base, so a resume compares the two. Thread-compatible.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model/policy_model.h"

namespace asympo {

// {"path": model, "crc32c": "xxxxxxxx", "bytes": N} as JSON text. For a
// Hugging Face directory, the CRC-32C runs over config.json and every
// safetensors file and index in name order (the files, whatever dtype they
// are loaded in); for "tiny", over the weights' float32 bytes in
// named_weights() order (its seed and vocabulary decide them). An
// unreadable file is an error naming it.
absl::StatusOr<std::string> BaseIdentity(const std::string& model, const PolicyModel& policy);

// OK when `saved` (a checkpoint's base identity; `where` names the
// checkpoint) has the same content as `mine`, whatever the paths;
// FAILED_PRECONDITION naming both otherwise, or when `saved` is empty or
// not an identity.
absl::Status CheckSameBase(const std::string& saved, const std::string& mine,
                           const std::string& where);

}  // namespace asympo
