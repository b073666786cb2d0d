// libFuzzer target: ParseChunk and CopyChunkData
// (weight_broadcaster/wire_format.h), the in-place reader of the weight
// chunks a rollout daemon fetches from the learner. The input's first byte
// says how many cuts split the rest into gRPC slices (up to 7, at the
// positions the next bytes give), as a received ByteBuffer arrives in
// pieces. Beyond not crashing: the data a parsed chunk points to lies inside
// the slices, and whenever protobuf itself also reads the bytes as a
// WeightChunk, both agree on every field and on the data.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <grpcpp/support/slice.h>

#include "asympo/v1/weight_broadcast.pb.h"
#include "common/crc32c.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/quiet_protobuf.h"
#include "weight_broadcaster/wire_format.h"

namespace {

// Cuts `message` at the sorted positions into slices (empty ones included:
// gRPC may deliver them).
std::vector<grpc::Slice> Cut(const std::string& message, std::vector<size_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(message.data() + begin, cut - begin);
    begin = cut;
  }
  slices.emplace_back(message.data() + begin, message.size() - begin);
  return slices;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t n_cuts = data[0] % 8;
  if (size < 1 + n_cuts) return 0;
  const std::string message(reinterpret_cast<const char*>(data) + 1 + n_cuts, size - 1 - n_cuts);
  std::vector<size_t> cuts;
  for (size_t i = 0; i < n_cuts; ++i) cuts.push_back(data[1 + i] % (message.size() + 1));
  const std::vector<grpc::Slice> slices = Cut(message, cuts);

  const absl::StatusOr<asympo::broadcast::ChunkView> chunk = asympo::broadcast::ParseChunk(slices);
  if (!chunk.ok()) {
    ASYMPO_FUZZ_CHECK(chunk.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  // Data lies inside the message: from (slice, pos), size bytes remain.
  // (slice, pos) mean nothing for a chunk without data.
  if (chunk->size > 0) {
    ASYMPO_FUZZ_CHECK(chunk->slice < slices.size());
    ASYMPO_FUZZ_CHECK(chunk->pos < slices[chunk->slice].size());
    size_t before = 0;
    for (size_t s = 0; s < chunk->slice; ++s) before += slices[s].size();
    ASYMPO_FUZZ_CHECK(before + chunk->pos + chunk->size <= message.size());
  }
  std::string copied(chunk->size, '\0');
  uint32_t crc = 0;
  asympo::broadcast::CopyChunkData(slices, *chunk, copied.data(), &crc);
  ASYMPO_FUZZ_CHECK(crc == asympo::Crc32c(copied.data(), copied.size()));

  asympo::v1::WeightChunk reference;
  if (!reference.ParseFromString(message)) return 0;
  ASYMPO_FUZZ_CHECK(reference.version() == chunk->version);
  ASYMPO_FUZZ_CHECK(reference.bucket() == chunk->bucket);
  ASYMPO_FUZZ_CHECK(reference.offset() == chunk->offset);
  ASYMPO_FUZZ_CHECK(reference.delta_bytes() == chunk->delta_bytes);
  ASYMPO_FUZZ_CHECK(reference.data() == copied);
  return 0;
}
