// The in-place WeightChunk encoding against protobuf's own serializer and
// parser (the reference): what one writes the other must read, whatever
// way gRPC cuts the message into slices.
#include "weight_broadcaster/wire_format.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "asympo/v1/weight_broadcast.pb.h"
#include "common/crc32c.h"
#include "tests/testing/status_matchers.h"

namespace asympo::broadcast {
namespace {

using ::asympo::testing::StatusIs;

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// `wire` cut at the given positions (sorted, inside the string).
std::vector<grpc::Slice> Cut(const std::string& wire, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t c : cuts) {
    slices.emplace_back(wire.data() + at, c - at);  // empty slices too
    at = c;
  }
  slices.emplace_back(wire.data() + at, wire.size() - at);
  return slices;
}

// Parses `slices` and checks every field and the data (and its CRC).
void ExpectChunk(const std::vector<grpc::Slice>& slices, const v1::WeightChunk& want) {
  absl::StatusOr<ChunkView> c = ParseChunk(slices);
  ASSERT_OK(c);
  EXPECT_EQ(c->version, want.version());
  EXPECT_EQ(c->bucket, want.bucket());
  EXPECT_EQ(c->offset, want.offset());
  EXPECT_EQ(c->delta_bytes, want.delta_bytes());
  ASSERT_EQ(c->size, want.data().size());
  std::string data(c->size, '\0');
  uint32_t crc = 0;
  CopyChunkData(slices, *c, data.data(), &crc);
  EXPECT_TRUE(data == want.data());
  EXPECT_EQ(crc, Crc32c(want.data().data(), want.data().size()));
}

const std::vector<v1::WeightChunk>& Samples() {
  static const std::vector<v1::WeightChunk>* samples = [] {
    auto* v = new std::vector<v1::WeightChunk>;
    struct F {
      uint64_t version;
      uint32_t bucket;
      uint64_t offset;
      size_t size;
      uint64_t delta_bytes;
    };
    for (const F& f : std::vector<F>{{0, 0, 0, 0, 0},
                                     {1, 0, 0, 1, 0},
                                     {7, 3, 127, 127, 0},
                                     {300, 128, 16384, 300, 0},
                                     {~0ull, ~0u, 1ull << 40, 70000, 0},
                                     {9, 0, 0, 24, 24},
                                     {12, 2, 4096, 300, 1ull << 33}}) {
      v1::WeightChunk c;
      c.set_version(f.version);
      c.set_bucket(f.bucket);
      c.set_offset(f.offset);
      c.set_delta_bytes(f.delta_bytes);
      c.set_data(Bytes(f.size, static_cast<uint32_t>(f.size)));
      v->push_back(c);
    }
    return v;
  }();
  return *samples;
}

TEST(WireFormatTest, ProtobufParsesTheEncodedHeaderAndData) {
  for (const v1::WeightChunk& want : Samples()) {
    const std::string wire = EncodeChunkHeader(want.version(), want.bucket(), want.offset(),
                                               want.data().size(), want.delta_bytes()) +
                             want.data();
    v1::WeightChunk got;
    ASSERT_TRUE(got.ParseFromString(wire));
    EXPECT_EQ(got.version(), want.version());
    EXPECT_EQ(got.bucket(), want.bucket());
    EXPECT_EQ(got.offset(), want.offset());
    EXPECT_EQ(got.delta_bytes(), want.delta_bytes());
    EXPECT_TRUE(got.data() == want.data());
    // Byte for byte what protobuf writes (proto3 omits zeros the same way);
    // delta_bytes (field 5) comes before the data, which must end the
    // header, where protobuf would write it after: the same message.
    if (want.delta_bytes() == 0) {
      EXPECT_TRUE(wire == want.SerializeAsString());
    }
  }
}

TEST(WireFormatTest, ParsesProtobufOutputCutAnywhere) {
  for (const v1::WeightChunk& want : Samples()) {
    const std::string wire = want.SerializeAsString();
    SCOPED_TRACE(wire.size());
    ExpectChunk(Cut(wire, {}), want);
    // Every single cut point in the first 40 bytes (the header and the
    // start of the data), then random multi-way cuts.
    for (size_t c = 0; c <= std::min<size_t>(wire.size(), 40); ++c)
      ExpectChunk(Cut(wire, {c}), want);
    std::mt19937 rng(42);
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<size_t> cuts(1 + rng() % 6);
      for (size_t& c : cuts) c = wire.empty() ? 0 : rng() % (wire.size() + 1);
      std::sort(cuts.begin(), cuts.end());
      ExpectChunk(Cut(wire, cuts), want);
    }
  }
}

TEST(WireFormatTest, SkipsUnknownFieldsOfEveryWireType) {
  const v1::WeightChunk& want = Samples()[2];
  std::string wire = want.SerializeAsString();
  wire += std::string("\x48\x96\x01", 3);                          // field 9, varint 150
  wire += std::string("\x55\x01\x02\x03\x04", 5);                  // field 10, fixed32
  wire += std::string("\x5a\x03xyz", 5);                           // field 11, 3 bytes
  wire += std::string("\x61\x01\x02\x03\x04\x05\x06\x07\x08", 9);  // field 12, fixed64
  v1::WeightChunk reference;
  ASSERT_TRUE(reference.ParseFromString(wire));  // still a valid WeightChunk
  ExpectChunk(Cut(wire, {1, 9, wire.size() - 3}), want);
}

TEST(WireFormatTest, RejectsMalformedChunks) {
  const std::string good = Samples()[3].SerializeAsString();
  const std::vector<std::string> bad = {
      good.substr(0, good.size() - 1),                         // data shorter than declared
      good.substr(0, 1),                                       // key without its value
      std::string("\x08\xff\xff", 3),                          // truncated varint
      std::string("\x20\x05", 2),                              // data (field 4) as a varint
      std::string("\x09\x01\x02\x03\x04\x05\x06\x07\x08", 9),  // version as fixed64
      std::string("\x0b\x0c", 2),                              // group wire type
      std::string("\x08") + std::string(11, '\xff') + "\x01",  // varint over 10 bytes
  };
  for (const std::string& wire : bad) {
    absl::StatusOr<ChunkView> c = ParseChunk(Cut(wire, {}));
    EXPECT_THAT(c, StatusIs(absl::StatusCode::kDataLoss)) << "accepted " << wire.size();
  }
}

// Tags and lengths read as protobuf's parser reads them, or refused: a
// 5-byte tag keeps its low 32 bits (field 1 hidden behind bit 32 is still
// the version: read otherwise, a rollout would take a chunk's version from
// a different field than protobuf does); longer tags, tag 0, field 0, and
// lengths over 5 bytes or 31 bits are refused. Found by fuzzing.
TEST(WireFormatTest, ReadsTagsAndLengthsAsProtobufDoes) {
  const std::string wide_version("\x88\x80\x80\x80\x10\x05", 6);  // tag 8 | 1 << 32, value 5
  v1::WeightChunk reference;
  ASSERT_TRUE(reference.ParseFromString(wide_version));
  ASSERT_EQ(reference.version(), 5u);
  absl::StatusOr<ChunkView> c = ParseChunk(Cut(wide_version, {}));
  if (c.ok()) {
    EXPECT_EQ(c->version, reference.version());
  } else {
    EXPECT_THAT(c, StatusIs(absl::StatusCode::kDataLoss));
  }
  const std::string padded_version("\x88\x80\x80\x80\x00\x05", 6);  // 5-byte tag 8
  ASSERT_TRUE(reference.ParseFromString(padded_version));
  c = ParseChunk(Cut(padded_version, {2}));
  ASSERT_OK(c);
  EXPECT_EQ(c->version, 5u);

  const std::vector<std::string> bad = {
      std::string("\x88\x80\x80\x80\x80\x00\x05", 7),  // 6-byte tag
      std::string("\x00\x05", 2),                      // tag 0
      std::string("\x02\x00", 2),                      // field 0
      std::string("\x22\x80\x80\x80\x80\x80\x00", 7),  // 6-byte length 0
      std::string("\x22\x80\x80\x80\x80\x08", 6),      // length 2^31
  };
  for (const std::string& wire : bad) {
    ASSERT_FALSE(reference.ParseFromString(wire)) << "protobuf takes case " << wire.size();
    c = ParseChunk(Cut(wire, {}));
    EXPECT_THAT(c, StatusIs(absl::StatusCode::kDataLoss)) << "accepted " << wire.size();
  }
}

}  // namespace
}  // namespace asympo::broadcast
