// What the gRPC transport of the weight broadcaster puts on the wire beyond
// the generated code:
// - WeightChunk written and read in place, so that a chunk's data is never
//   copied through a protobuf message: the sender sends a small encoded
//   header followed by a slice that points into the snapshot, and the
//   receiver copies the data straight from gRPC's receive slices into its
//   bucket. The bytes are exactly WeightChunk's protobuf encoding, so any
//   other client or server sees ordinary messages.
// - The initial-metadata key that marks an accepted Subscribe stream.
// Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <grpcpp/support/slice.h>

#include "absl/status/statusor.h"

namespace asympo::broadcast {

// Sent as initial metadata ("1") on an accepted Subscribe stream. A refused
// stream can also deliver (empty) initial metadata, so a receiver looks for
// this key to know that it is subscribed before any announcement arrives.
inline constexpr char kSubscribedMetadataKey[] = "asympo-subscribed";

// Fields 1-3 (version, bucket, offset) and 5 (delta_bytes; zeros omitted as
// proto3 does), then the key and length of field 4 (data), whose
// `data_size` bytes must follow.
std::string EncodeChunkHeader(uint64_t version, uint32_t bucket, uint64_t offset,
                              uint64_t data_size, uint64_t delta_bytes = 0);

// A chunk parsed in place: its fields, and where its data lies.
struct ChunkView {
  uint64_t version = 0;
  uint64_t bucket = 0;  // uint32 on the wire; wider values fail bounds checks
  uint64_t offset = 0;
  uint64_t size = 0;         // bytes of data
  uint64_t delta_bytes = 0;  // non-zero: a slice of the bucket's delta
  size_t slice = 0;          // the data starts in slices[slice] at byte `pos`
  size_t pos = 0;
};

// Parses one serialized WeightChunk spread over `slices` (a received
// grpc::ByteBuffer's contents). Unknown fields are skipped, as protobuf
// does; DATA_LOSS for malformed input (truncated, bad wire type, a length
// beyond the end).
absl::StatusOr<ChunkView> ParseChunk(const std::vector<grpc::Slice>& slices);

// Copies the chunk's `size` data bytes to `dest` and extends `*crc`
// (CRC-32C) over them.
void CopyChunkData(const std::vector<grpc::Slice>& slices, const ChunkView& chunk, char* dest,
                   uint32_t* crc);

}  // namespace asympo::broadcast
