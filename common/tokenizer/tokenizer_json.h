// Reading a tokenizer.json: a streaming parse that moves the two big tables
// (model.vocab, model.merges: 150k entries each for Qwen3) straight into hash
// maps and vectors, and keeps the rest as a JSON tree; plus checked accessors
// so that a malformed file gives an error naming the field and the expected
// type instead of a JSON exception.
//
// Internal to common/tokenizer/tokenizer.h; pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace asympo {
namespace tokenizer_internal {

// model.vocab and model.merges of a tokenizer.json, as read.
struct BpeTables {
  bool has_vocab = false;  // model.vocab was an object.
  absl::flat_hash_map<std::string, int32_t> vocab;
  bool has_merges = false;  // model.merges was an array.
  // (left, right) in rank order; "left right" strings are split already.
  std::vector<std::pair<std::string, std::string>> merges;
};

// Parses tokenizer.json text. Returns the document without the contents of
// model.vocab and model.merges (left as {} and []), which go to *tables.
// INVALID_ARGUMENT for malformed JSON (with the position), a vocab entry that
// is not an id, or a merge that is not "left right" or ["left", "right"].
absl::StatusOr<nlohmann::json> ParseTokenizerJson(absl::string_view text, BpeTables* tables);

// The "type" a tokenizer.json component declares, e.g. "Split"; "" if none.
inline std::string TypeOf(const nlohmann::json& component) {
  if (!component.is_object()) return "";
  auto it = component.find("type");
  return it != component.end() && it->is_string() ? it->get<std::string>() : "";
}

// Reads optional boolean `key` of `object`; absent or null leaves *out as is.
inline absl::Status ReadBool(const nlohmann::json& object, const char* key, absl::string_view where,
                             bool* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".", key, " is ", it->type_name(), "; it must be a boolean"));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

// Reads optional string `key` of `object`; absent or null leaves *out as is.
inline absl::Status ReadString(const nlohmann::json& object, const char* key,
                               absl::string_view where, std::string* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".", key, " is ", it->type_name(), "; it must be a string"));
  }
  *out = it->get<std::string>();
  return absl::OkStatus();
}

// Converts a token id from JSON; it must be an integer in [0, 2^31).
inline absl::Status ReadId(const nlohmann::json& value, absl::string_view where, int32_t* out) {
  if (value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0)) {
    const uint64_t v = value.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      *out = static_cast<int32_t>(v);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, " is ", value.dump(), "; token ids must be integers in [0, 2^31)"));
}

}  // namespace tokenizer_internal
}  // namespace asympo
