// libFuzzer target: ApplyDeltaPieces and ApplyDelta
// (weight_broadcaster/delta_codec.h), which rebuild a snapshot bucket from
// the delta a rollout daemon fetches from the learner. The input's first two
// bytes give the bucket's size (up to 4 KiB) and the rest is the delta,
// applied to a fixed base. Beyond not crashing: a refused delta leaves the
// output untouched and is INVALID_ARGUMENT; an accepted one gives the CRC-32C
// of what it wrote, and the encoder's own delta of that result rebuilds it
// (in 2-byte words where the size allows: "ASD2" records as well as "ASD1").
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "tests/fuzz/fuzz_check.h"
#include "weight_broadcaster/delta_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t bytes = (size_t{data[0]} | size_t{data[1]} << 8) % 4097;
  const std::string delta(reinterpret_cast<const char*>(data) + 2, size - 2);
  std::vector<uint8_t> base(bytes);
  for (size_t i = 0; i < bytes; ++i) base[i] = static_cast<uint8_t>(i * 131 + 7);
  const std::vector<uint8_t> sentinel(bytes, 0xEE);
  std::vector<uint8_t> out = sentinel;
  uint32_t crc = 0;
  const absl::Status s =
      asympo::broadcast::ApplyDeltaPieces(base.data(), delta, out.data(), bytes, 2, &crc);
  if (!s.ok()) {
    ASYMPO_FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    ASYMPO_FUZZ_CHECK(out == sentinel);
  } else {
    ASYMPO_FUZZ_CHECK(crc == asympo::Crc32c(out.data(), out.size()));
    // Re-encoded in 2-byte words where it can be (the XOR planes), else bytes.
    const int word = bytes % 2 == 0 ? 2 : 1;
    std::string again;
    ASYMPO_FUZZ_CHECK(
        asympo::broadcast::EncodeDeltaPieces(base.data(), out.data(), bytes, word, 512, 2, &again)
            .ok());
    std::vector<uint8_t> rebuilt(bytes);
    uint32_t crc2 = 0;
    ASYMPO_FUZZ_CHECK(
        asympo::broadcast::ApplyDeltaPieces(base.data(), again, rebuilt.data(), bytes, 1, &crc2)
            .ok());
    ASYMPO_FUZZ_CHECK(rebuilt == out && crc2 == crc);
  }
  // One record alone, in place.
  std::vector<uint8_t> in_place = base;
  const absl::Status one =
      asympo::broadcast::ApplyDelta(in_place.data(), delta, in_place.data(), bytes);
  if (!one.ok()) {
    ASYMPO_FUZZ_CHECK(one.code() == absl::StatusCode::kInvalidArgument);
    ASYMPO_FUZZ_CHECK(in_place == base);
  } else {
    ASYMPO_FUZZ_CHECK(s.ok() && in_place == out);  // one record is a delta of pieces too
  }
  return 0;
}
