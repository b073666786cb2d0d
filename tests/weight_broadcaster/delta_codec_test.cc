#include "weight_broadcaster/delta_codec.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/crc32c.h"
#include "tests/testing/status_matchers.h"

namespace asympo::broadcast {
namespace {

using ::asympo::testing::StatusIs;

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// `base` with a fraction `density` of its words given other bits: in their
// first (low) byte, or with `whole_words` every byte replaced at random
// (the high bytes of 2-byte words too).
std::vector<uint8_t> Changed(const std::vector<uint8_t>& base, int word, double density,
                             uint32_t seed, bool whole_words = false) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution pick(density);
  std::vector<uint8_t> next = base;
  for (size_t i = 0; i + word <= next.size(); i += word) {
    if (!pick(rng)) continue;
    if (!whole_words) {
      next[i] ^= static_cast<uint8_t>(1 + rng() % 255);
      continue;
    }
    for (int b = 0; b < word; ++b) next[i + b] = static_cast<uint8_t>(rng());
  }
  return next;
}

TEST(DeltaCodecTest, RebuildsTheNextBucketBitExactAtEveryDensity) {
  for (int word : {1, 2, 4, 8}) {
    for (size_t bytes : {size_t{0}, size_t{8}, size_t{24}, size_t{4096}, size_t{100000}}) {
      if (bytes % word != 0) continue;
      const std::vector<uint8_t> base = Random(bytes, 1);
      for (double density : {0.0, 1e-4, 0.01, 0.2, 1.0})
        for (bool replace : {false, true}) {
          const std::vector<uint8_t> next = Changed(base, word, density, 2, replace);
          std::string delta;
          ASSERT_OK(EncodeDelta(base.data(), next.data(), bytes, word, &delta));
          std::vector<uint8_t> out(bytes, 0xEE);
          ASSERT_OK(ApplyDelta(base.data(), delta, out.data(), bytes));
          EXPECT_EQ(out, next) << word << " " << bytes << " " << density;
          std::vector<uint8_t> in_place = base;  // out may be the base itself
          ASSERT_OK(ApplyDelta(in_place.data(), delta, in_place.data(), bytes));
          EXPECT_EQ(in_place, next);
        }
    }
  }
}

TEST(DeltaCodecTest, ASparseDeltaIsSmallAndUsesGapsADenseOneABitmap) {
  const std::vector<uint8_t> base = Random(1 << 20, 3);
  DeltaHeader h;
  std::string sparse, dense;
  const std::vector<uint8_t> few = Changed(base, 2, 0.001, 4), many = Changed(base, 2, 0.3, 5);
  ASSERT_OK(EncodeDelta(base.data(), few.data(), base.size(), 2, &sparse));
  ASSERT_OK(ReadDeltaHeader(sparse, &h));
  EXPECT_EQ(h.index, DeltaIndex::kGaps);
  EXPECT_EQ(h.words, (1u << 20) / 2);
  EXPECT_LT(sparse.size(), base.size() / 100);
  ASSERT_OK(EncodeDelta(base.data(), many.data(), base.size(), 2, &dense));
  ASSERT_OK(ReadDeltaHeader(dense, &h));
  EXPECT_EQ(h.index, DeltaIndex::kBitmap);
  // Only low bytes changed: the XOR planes, a byte and a bit per word.
  EXPECT_EQ(h.values, DeltaValues::kXorPlanes);
  EXPECT_EQ(dense.size(),
            kDeltaXorHeaderBytes + base.size() / 2 / 8 + h.changed + (h.changed + 7) / 8);
  // Words of 4 bytes carry their new values.
  ASSERT_OK(EncodeDelta(base.data(), many.data(), base.size(), 4, &dense));
  ASSERT_OK(ReadDeltaHeader(dense, &h));
  EXPECT_EQ(h.values, DeltaValues::kWhole);
  EXPECT_EQ(dense.size(), kDeltaHeaderBytes + base.size() / 4 / 8 + h.changed * 4);
}

// bfloat16 words moved by a unit or two of their last place, as an RL step
// at a small learning rate moves them: most change in their low byte only
// (the 7 mantissa bits and the exponent's lowest); a step across a power of
// two with a carry into the exponent's higher bits, or across zero, changes
// the high byte too. Every one is rebuilt, at about a byte a changed word
// besides the index, against two for their new values.
TEST(DeltaCodecTest, XorPlanesCarryBfloat16StepsInAboutAByteAWord) {
  std::mt19937 rng(21);
  std::normal_distribution<float> init(0.0f, 0.02f);
  const size_t words = 1 << 18;
  std::vector<uint16_t> a(words), b(words);
  for (size_t i = 0; i < words; ++i) {
    float f = init(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    a[i] = static_cast<uint16_t>(bits >> 16);
    b[i] = a[i];
    if (rng() % 10 == 0) b[i] = static_cast<uint16_t>(a[i] + (rng() % 2 ? 1 : -1));  // 10%
  }
  b[7] = 0x8000, a[7] = 0x0000;    // across zero: the sign
  b[9] = 0x3C80, a[9] = 0x3C7F;    // across 2^-6: exponent 120 -> 121
  b[11] = 0x3D00, a[11] = 0x3CFF;  // across 2^-5 with a carry: exponent 121 -> 122
  const auto* base = reinterpret_cast<const uint8_t*>(a.data());
  const auto* next = reinterpret_cast<const uint8_t*>(b.data());
  std::string delta;
  ASSERT_OK(EncodeDelta(base, next, words * 2, 2, &delta));
  DeltaHeader h;
  ASSERT_OK(ReadDeltaHeader(delta, &h));
  EXPECT_EQ(h.values, DeltaValues::kXorPlanes);
  const uint64_t highs = h.value_bytes - h.changed - (h.changed + 7) / 8;
  EXPECT_GE(highs, 2u);  // the sign and the carry at least
  EXPECT_LT(highs, h.changed / 10);
  EXPECT_LT(h.value_bytes, h.changed * 13 / 10);
  std::vector<uint8_t> out(words * 2, 0xEE);
  ASSERT_OK(ApplyDelta(base, delta, out.data(), words * 2));
  EXPECT_EQ(0, std::memcmp(out.data(), next, words * 2));
}

TEST(DeltaCodecTest, ABadDeltaIsRefusedByNameAndLeavesTheOutputUntouched) {
  const std::vector<uint8_t> base = Random(4096, 6);
  const std::vector<uint8_t> next = Changed(base, 2, 0.001, 7);
  std::string gaps;
  ASSERT_OK(EncodeDelta(base.data(), next.data(), base.size(), 2, &gaps));
  std::string bitmap;
  const std::vector<uint8_t> dense = Changed(base, 2, 0.5, 8);
  ASSERT_OK(EncodeDelta(base.data(), dense.data(), base.size(), 2, &bitmap));
  std::vector<uint8_t> out(base.size(), 0xEE);
  const std::vector<uint8_t> untouched = out;
  auto refused = [&](const std::string& d, size_t bytes, const char* what) {
    EXPECT_THAT(ApplyDelta(base.data(), d, out.data(), bytes),
                StatusIs(absl::StatusCode::kInvalidArgument, what));
    EXPECT_EQ(out, untouched) << what;
  };
  refused(gaps.substr(0, 10), base.size(), "header");
  refused(gaps, base.size() - 2, "for a bucket of");
  refused(gaps.substr(0, gaps.size() - 1), base.size(), "where its header makes");
  refused(gaps + "x", base.size(), "where its header makes");
  // An index a byte longer than its gaps (and the record as long as that
  // says): the values would start inside the index.
  DeltaHeader h;
  ASSERT_OK(ReadDeltaHeader(gaps, &h));
  std::string long_index = gaps + "x";
  const uint64_t more = h.index_bytes + 1;
  std::memcpy(long_index.data() + 24, &more, 8);
  refused(long_index, base.size(), "bytes of gaps where the header says");
  std::string bad_kind = gaps;
  bad_kind[5] = 9;
  refused(bad_kind, base.size(), "unknown index kind");
  const size_t at = h.header_bytes();  // the index
  std::string far = gaps;
  far[at] = static_cast<char>(0xFF);      // the first gap: 16383 words,
  far[at + 1] = static_cast<char>(0x7F);  // of the 2048 there are
  refused(far, base.size(), "gap");
  DeltaHeader b;
  ASSERT_OK(ReadDeltaHeader(bitmap, &b));
  std::string count = bitmap;
  count[b.header_bytes()] = static_cast<char>(count[b.header_bytes()] ^ 1);  // a bit more or less
  refused(count, base.size(), "the bitmap marks");
  std::string magic = bitmap;
  magic[0] = 'X';
  refused(magic, base.size(), "header");
}

TEST(DeltaCodecTest, BadXorPlanesAreRefusedByNameAndLeaveTheOutputUntouched) {
  const std::vector<uint8_t> base = Random(4096, 16);
  // Mostly low bytes, some high bytes too.
  const std::vector<uint8_t> next = Changed(Changed(base, 2, 0.1, 17), 2, 0.01, 18, true);
  std::string delta;
  ASSERT_OK(EncodeDelta(base.data(), next.data(), base.size(), 2, &delta));
  DeltaHeader h;
  ASSERT_OK(ReadDeltaHeader(delta, &h));
  ASSERT_EQ(h.values, DeltaValues::kXorPlanes);
  std::vector<uint8_t> out(base.size(), 0xEE);
  const std::vector<uint8_t> untouched = out;
  auto refused = [&](const std::string& d, const char* what) {
    EXPECT_THAT(ApplyDelta(base.data(), d, out.data(), base.size()),
                StatusIs(absl::StatusCode::kInvalidArgument, what));
    EXPECT_EQ(out, untouched) << what;
  };
  const size_t flags = h.header_bytes() + h.index_bytes + h.changed;  // the high-byte bitmap
  std::string count = delta;
  count[flags] = static_cast<char>(count[flags] ^ 1);
  refused(count, "the high-byte bitmap marks");
  std::string coding = delta;
  coding[6] = 2;
  refused(coding, "value coding");
  std::string word = delta;
  word[4] = 4;
  refused(word, "ASD2");
  std::string short_planes = delta;
  const uint64_t few = h.changed;  // no room for the bitmap
  std::memcpy(short_planes.data() + 32, &few, 8);
  refused(short_planes, "where its header makes");
  short_planes.resize(h.header_bytes() + h.index_bytes + h.changed);
  refused(short_planes, "bytes of XOR planes");
  // The bitmap's last byte marking a word past the changed ones.
  if (h.changed % 8 != 0) {
    std::string past = delta;
    const size_t last = flags + (h.changed + 7) / 8 - 1;
    past[last] = static_cast<char>(past[last] | 0x80);
    refused(past, "the high-byte bitmap marks");
  }
}

TEST(DeltaCodecTest, RefusesABucketThatIsNotWholeWords) {
  std::vector<uint8_t> a(7), b(7);
  std::string delta;
  EXPECT_THAT(EncodeDelta(a.data(), b.data(), 7, 2, &delta),
              StatusIs(absl::StatusCode::kInvalidArgument, "words of 2"));
  EXPECT_THAT(EncodeDelta(a.data(), b.data(), 6, 3, &delta),
              StatusIs(absl::StatusCode::kInvalidArgument, "words of 3"));
}

TEST(DeltaCodecTest, PiecesRebuildTheBucketAndItsChecksumOnAnyThreads) {
  const std::vector<uint8_t> base = Random(300000, 9);
  for (double density : {0.0, 0.003, 0.05, 0.6}) {
    const std::vector<uint8_t> next = Changed(base, 2, density, 10);
    for (size_t piece : {size_t{2}, size_t{4096}, size_t{65536}, size_t{1} << 20}) {
      for (int threads : {1, 3}) {
        std::string delta;
        ASSERT_OK(
            EncodeDeltaPieces(base.data(), next.data(), base.size(), 2, piece, threads, &delta));
        std::string one_thread;
        ASSERT_OK(
            EncodeDeltaPieces(base.data(), next.data(), base.size(), 2, piece, 1, &one_thread));
        EXPECT_EQ(delta, one_thread) << "the encoding does not depend on the threads";
        std::vector<uint8_t> out(base.size(), 0xEE);
        uint32_t crc = 0;
        ASSERT_OK(ApplyDeltaPieces(base.data(), delta, out.data(), out.size(), threads, &crc));
        EXPECT_EQ(out, next) << density << " " << piece << " " << threads;
        EXPECT_EQ(crc, Crc32c(next.data(), next.size()));
      }
    }
  }
  // One record (EncodeDelta's) is a delta of pieces too.
  const std::vector<uint8_t> next = Changed(base, 4, 0.01, 11);
  std::string delta;
  ASSERT_OK(EncodeDelta(base.data(), next.data(), base.size(), 4, &delta));
  std::vector<uint8_t> out(base.size());
  uint32_t crc = 0;
  ASSERT_OK(ApplyDeltaPieces(base.data(), delta, out.data(), out.size(), 2, &crc));
  EXPECT_EQ(out, next);
  // An empty bucket: one empty record.
  ASSERT_OK(EncodeDeltaPieces(base.data(), next.data(), 0, 2, 4096, 2, &delta));
  ASSERT_OK(ApplyDeltaPieces(base.data(), delta, out.data(), 0, 2, &crc));
  EXPECT_EQ(crc, 0u);
}

TEST(DeltaCodecTest, APieceDeltaThatIsWrongAnywhereLeavesTheOutputUntouched) {
  const std::vector<uint8_t> base = Random(40000, 12);
  const std::vector<uint8_t> next = Changed(base, 2, 0.01, 13);
  std::string delta;
  ASSERT_OK(EncodeDeltaPieces(base.data(), next.data(), base.size(), 2, 8192, 2, &delta));
  std::vector<uint8_t> out(base.size(), 0xEE);
  const std::vector<uint8_t> untouched = out;
  uint32_t crc = 7;
  auto refused = [&](const std::string& d, size_t bytes, const char* what) {
    EXPECT_THAT(ApplyDeltaPieces(base.data(), d, out.data(), bytes, 2, &crc),
                StatusIs(absl::StatusCode::kInvalidArgument, what));
    EXPECT_EQ(out, untouched) << what;
    EXPECT_EQ(crc, 7u) << what;
  };
  DeltaHeader first;
  ASSERT_OK(ReadDeltaHeader(delta, &first));
  const std::string second_onwards = delta.substr(first.record_bytes());
  refused(second_onwards, base.size(), "records cover 31808 bytes of a bucket of 40000");
  refused(delta + delta.substr(0, first.record_bytes()), base.size(), "past the end");
  refused(delta.substr(0, delta.size() - 1), base.size(), "past the end of the delta");
  refused(delta, base.size() + 2, "records cover 40000 bytes of a bucket of 40002");
  std::string bad_magic = delta;
  bad_magic[first.record_bytes()] = 'X';
  refused(bad_magic, base.size(), "record 1");
  EXPECT_THAT(EncodeDeltaPieces(base.data(), next.data(), base.size(), 2, 3, 1, &delta),
              StatusIs(absl::StatusCode::kInvalidArgument, "pieces of 3"));
}

}  // namespace
}  // namespace asympo::broadcast
