#include "weight_broadcaster/delta_codec.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

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

// `base` with a fraction `density` of its words given other bits.
std::vector<uint8_t> Changed(const std::vector<uint8_t>& base, int word, double density,
                             uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution pick(density);
  std::vector<uint8_t> next = base;
  for (size_t i = 0; i + word <= next.size(); i += word) {
    if (pick(rng)) next[i] ^= static_cast<uint8_t>(1 + rng() % 255);
  }
  return next;
}

TEST(DeltaCodecTest, RebuildsTheNextBucketBitExactAtEveryDensity) {
  for (int word : {1, 2, 4, 8}) {
    for (size_t bytes : {size_t{0}, size_t{8}, size_t{24}, size_t{4096}, size_t{100000}}) {
      if (bytes % word != 0) continue;
      const std::vector<uint8_t> base = Random(bytes, 1);
      for (double density : {0.0, 1e-4, 0.01, 0.2, 1.0}) {
        const std::vector<uint8_t> next = Changed(base, word, density, 2);
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
  EXPECT_EQ(dense.size(), kDeltaHeaderBytes + base.size() / 2 / 8 + h.changed * 2);
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
  refused(gaps.substr(0, gaps.size() - 1), base.size(), "bytes of values");
  refused(gaps + "x", base.size(), "bytes of values");
  std::string bad_kind = gaps;
  bad_kind[5] = 9;
  refused(bad_kind, base.size(), "unknown index kind");
  std::string far = gaps;
  far[kDeltaHeaderBytes] = static_cast<char>(0xFF);      // the first gap: 16383 words,
  far[kDeltaHeaderBytes + 1] = static_cast<char>(0x7F);  // of the 2048 there are
  refused(far, base.size(), "gap");
  std::string count = bitmap;
  count[kDeltaHeaderBytes] =
      static_cast<char>(count[kDeltaHeaderBytes] ^ 1);  // one bit more or less
  refused(count, base.size(), "the bitmap marks");
  std::string magic = bitmap;
  magic[0] = 'X';
  refused(magic, base.size(), "header");
}

TEST(DeltaCodecTest, RefusesABucketThatIsNotWholeWords) {
  std::vector<uint8_t> a(7), b(7);
  std::string delta;
  EXPECT_THAT(EncodeDelta(a.data(), b.data(), 7, 2, &delta),
              StatusIs(absl::StatusCode::kInvalidArgument, "words of 2"));
  EXPECT_THAT(EncodeDelta(a.data(), b.data(), 6, 3, &delta),
              StatusIs(absl::StatusCode::kInvalidArgument, "words of 3"));
}

}  // namespace
}  // namespace asympo::broadcast
