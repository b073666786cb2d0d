// libFuzzer target: ParseCheckpointMeta (common/model/checkpoint_meta.h),
// meta.json of a learner checkpoint, which the learner and asympo-eval read
// at start from whatever directory they are pointed at. Beyond not crashing:
// an accepted description holds the very numbers and strings the JSON
// holds, none cut to fit its field.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/model/checkpoint_meta.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<asympo::CheckpointMeta> meta =
      asympo::ParseCheckpointMeta(text, "fuzz/meta.json");
  if (!meta.ok()) {
    ASYMPO_FUZZ_CHECK(meta.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  // Read again, field by field, as numbers of any width.
  const nlohmann::json json = nlohmann::json::parse(text);
  ASYMPO_FUZZ_CHECK(json.at("version").get<uint64_t>() == meta->version);
  ASYMPO_FUZZ_CHECK(json.at("crc32c").get<uint64_t>() == meta->crc32c);
  ASYMPO_FUZZ_CHECK(meta->optimizer_steps >= 0);
  ASYMPO_FUZZ_CHECK(json.at("optimizer_steps").dump() == std::to_string(meta->optimizer_steps));
  const auto batches = json.find("batches");
  const auto ids = json.find("batch_ids");
  const auto list = batches != json.end() ? batches : ids;
  ASYMPO_FUZZ_CHECK(meta->batches.size() == (list == json.end() ? 0 : list->size()));
  for (const asympo::CheckpointBatch& b : meta->batches) {
    ASYMPO_FUZZ_CHECK(b.digest.empty() || b.digest.size() == 32);
    for (size_t i = 0; i < b.trained.size(); ++i) {
      ASYMPO_FUZZ_CHECK(b.trained[i] >= 0 && b.trained[i] < b.groups);
      ASYMPO_FUZZ_CHECK(i == 0 || b.trained[i] > b.trained[i - 1]);
    }
  }
  return 0;
}
