#include "common/model/checkpoint_meta.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

// The largest group count a batch may name (far above any learner's
// --max_groups_per_batch).
constexpr int64_t kMaxGroups = 1 << 20;

absl::StatusOr<std::string> ParseDigest(const nlohmann::json& j, const std::string& where) {
  if (!j.is_string()) return absl::DataLossError(absl::StrCat(where, ": digest is not a string"));
  const std::string hex = j.get<std::string>();
  if (hex.empty()) return std::string();
  if (hex.size() != 64 || !std::all_of(hex.begin(), hex.end(), absl::ascii_isxdigit)) {
    return absl::DataLossError(absl::StrCat(where, ": digest is not 64 hex digits"));
  }
  return absl::HexStringToBytes(hex);
}

absl::StatusOr<CheckpointBatch> ParseBatch(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("id") || !j["id"].is_string()) {
    return absl::DataLossError(absl::StrCat(where, " is not an object with a string id"));
  }
  CheckpointBatch b;
  b.id = j["id"].get<std::string>();
  if (j.contains("principal")) {
    if (!j["principal"].is_string()) {
      return absl::DataLossError(absl::StrCat(where, ": principal is not a string"));
    }
    b.principal = j["principal"].get<std::string>();
  }
  if (j.contains("digest")) {
    ASYMPO_ASSIGN_OR_RETURN(b.digest, ParseDigest(j["digest"], where));
  }
  if (j.contains("groups")) {
    if (!j["groups"].is_number_unsigned() || j["groups"].get<uint64_t>() > kMaxGroups) {
      return absl::DataLossError(absl::StrCat(where, ": groups is not a group count"));
    }
    b.groups = static_cast<int32_t>(j["groups"].get<uint64_t>());
  }
  if (j.contains("trained")) {
    if (!j["trained"].is_array()) {
      return absl::DataLossError(absl::StrCat(where, ": trained is not a list"));
    }
    for (const auto& i : j["trained"]) {
      if (!i.is_number_unsigned() || i.get<uint64_t>() >= static_cast<uint64_t>(b.groups) ||
          (!b.trained.empty() && static_cast<int32_t>(i.get<uint64_t>()) <= b.trained.back())) {
        return absl::DataLossError(
            absl::StrCat(where, ": trained holds ", i.dump(), ", not an ascending group index"));
      }
      b.trained.push_back(static_cast<int32_t>(i.get<uint64_t>()));
    }
  }
  return b;
}

absl::StatusOr<std::vector<CheckpointBatch>> ParseBatches(const nlohmann::json& j,
                                                          const std::string& path) {
  if (!j.is_array()) return absl::DataLossError(absl::StrCat(path, ": batches is not a list"));
  std::vector<CheckpointBatch> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    ASYMPO_ASSIGN_OR_RETURN(CheckpointBatch b,
                            ParseBatch(j[i], absl::StrCat(path, ": batches[", i, "]")));
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

nlohmann::json CheckpointBatchesJson(const std::vector<CheckpointBatch>& batches) {
  nlohmann::json out = nlohmann::json::array();
  for (const CheckpointBatch& b : batches) {
    nlohmann::json j = {{"id", b.id},
                        {"digest", absl::BytesToHexString(b.digest)},
                        {"groups", b.groups},
                        {"trained", b.trained}};
    if (b.principal.has_value()) j["principal"] = *b.principal;
    out.push_back(std::move(j));
  }
  return out;
}

absl::StatusOr<CheckpointMeta> ParseCheckpointMeta(std::string_view text, const std::string& path) {
  const nlohmann::json meta = nlohmann::json::parse(text, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("crc32c") ||
      !meta.contains("version") || !meta.contains("optimizer_steps") ||
      !meta["crc32c"].is_number_unsigned() || !meta["version"].is_number_unsigned() ||
      !meta["optimizer_steps"].is_number_integer()) {
    return absl::DataLossError(absl::StrCat(path, " is not a complete checkpoint description"));
  }
  // Integers that do not fit their field would be read modulo 2^n: a CRC
  // that matches only its low 32 bits, a step count gone negative.
  if (meta["crc32c"].get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
    return absl::DataLossError(
        absl::StrCat(path, ": crc32c ", meta["crc32c"].dump(), " is not a 32-bit checksum"));
  }
  if (meta["optimizer_steps"].is_number_unsigned()
          ? meta["optimizer_steps"].get<uint64_t>() >
                static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
          : meta["optimizer_steps"].get<int64_t>() < 0) {
    return absl::DataLossError(absl::StrCat(
        path, ": optimizer_steps ", meta["optimizer_steps"].dump(), " is not a step count"));
  }
  CheckpointMeta out;
  out.version = meta["version"].get<uint64_t>();
  out.optimizer_steps = meta["optimizer_steps"].get<int64_t>();
  out.crc32c = meta["crc32c"].get<uint32_t>();
  const auto config = meta.find("config");
  if (config != meta.end() && config->is_string()) out.config = config->get<std::string>();
  const auto batches = meta.find("batches");
  if (batches != meta.end()) {
    ASYMPO_ASSIGN_OR_RETURN(out.batches, ParseBatches(*batches, path));
  } else if (const auto ids = meta.find("batch_ids"); ids != meta.end()) {
    if (!ids->is_array())
      return absl::DataLossError(absl::StrCat(path, ": batch_ids is not a list"));
    out.batches.reserve(ids->size());
    for (const auto& id : *ids) {
      if (!id.is_string()) {
        return absl::DataLossError(absl::StrCat(path, ": batch_ids holds a non-string"));
      }
      out.batches.push_back(CheckpointBatch{id.get<std::string>(), "", 0, {}});
    }
  }
  if (const auto monitor = meta.find("reward_monitor"); monitor != meta.end()) {
    if (!monitor->is_object()) {
      return absl::DataLossError(absl::StrCat(path, ": reward_monitor is not an object"));
    }
    out.reward_monitor = monitor->dump();
  }
  if (const auto base = meta.find("base"); base != meta.end()) {
    if (!base->is_object())
      return absl::DataLossError(absl::StrCat(path, ": base is not an object"));
    out.base = base->dump();
  }
  return out;
}

}  // namespace asympo
