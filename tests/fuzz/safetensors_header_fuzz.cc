// libFuzzer target: ParseSafetensorsHeader
// (common/model/safetensors_header.h), the header check that every
// safetensors file a daemon opens (a model directory, a checkpoint) goes
// through before any offset in it is used. The input is the whole file.
// Beyond not crashing: an accepted header's tensors lie inside the file,
// tile its data region exactly, and span numel x element size bytes each.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/model/safetensors_header.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void CheckAccepted(const asympo::SafetensorsHeader& header, uint64_t size) {
  ASYMPO_FUZZ_CHECK(header.data_start >= 8 && header.data_start <= size);
  uint64_t covered = 0;
  for (const auto& [name, info] : header.tensors) {
    ASYMPO_FUZZ_CHECK(name != asympo::kSafetensorsMetadataKey);
    ASYMPO_FUZZ_CHECK(info.begin <= info.end && info.end <= size - header.data_start);
    const size_t element_size = asympo::SafetensorsDtypeSize(info.dtype);
    ASYMPO_FUZZ_CHECK(element_size > 0);
    for (int64_t d : info.shape) ASYMPO_FUZZ_CHECK(d >= 0);
    ASYMPO_FUZZ_CHECK(info.numel() >= 0);
    ASYMPO_FUZZ_CHECK(static_cast<unsigned __int128>(info.numel()) * element_size == info.nbytes());
    covered += info.nbytes();
  }
  // Tiling without overlaps: the sizes add up to the data region.
  ASYMPO_FUZZ_CHECK(covered == size - header.data_start);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::StatusOr<asympo::SafetensorsHeader> header =
      asympo::ParseSafetensorsHeader(size == 0 ? nullptr : data, size, "fuzz: ");
  if (header.ok()) {
    CheckAccepted(*header, size);
  } else {
    ASYMPO_FUZZ_CHECK(header.status().code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}
