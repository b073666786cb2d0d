#include "common/model/checkpoint_meta.h"

#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace asympo {

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
  const auto ids = meta.find("batch_ids");
  if (ids != meta.end()) {
    if (!ids->is_array())
      return absl::DataLossError(absl::StrCat(path, ": batch_ids is not a list"));
    out.batch_ids.reserve(ids->size());
    for (const auto& id : *ids) {
      if (!id.is_string()) {
        return absl::DataLossError(absl::StrCat(path, ": batch_ids holds a non-string"));
      }
      out.batch_ids.push_back(id.get<std::string>());
    }
  }
  return out;
}

}  // namespace asympo
