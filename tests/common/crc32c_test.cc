#include "common/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace asympo {
namespace {

TEST(Crc32cTest, MatchesPublishedCheckValues) {
  // RFC 3720 appendix B.4 and the standard "123456789" check value.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable("123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, HardwareAndPortablePathsAgreeAndExtendIncrementally) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(10007);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 10007}) {
    const uint32_t whole = Crc32c(data.data(), n);
    EXPECT_EQ(whole, Crc32cPortable(data.data(), n)) << n;
    const size_t cut = n / 3;
    EXPECT_EQ(Crc32c(data.data() + cut, n - cut, Crc32c(data.data(), cut)), whole) << n;
  }
}

TEST(Crc32cTest, TheInterleavedPathAgreesAtEveryBlockBoundary) {
  // Three streams of 8 KiB: lengths and offsets around multiples of 24 KiB.
  std::mt19937 rng(11);
  std::vector<uint8_t> data(5 * 24576 + 64);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t n : {24575, 24576, 24577, 49151, 49152, 49153, 5 * 24576 + 61}) {
    for (size_t offset : {0, 1, 3}) {
      EXPECT_EQ(Crc32c(data.data() + offset, n), Crc32cPortable(data.data() + offset, n))
          << n << " at " << offset;
      EXPECT_EQ(Crc32cOneStream(data.data() + offset, n), Crc32cPortable(data.data() + offset, n));
    }
  }
}

TEST(Crc32cTest, CombineJoinsTheCrcsOfTwoPieces) {
  std::mt19937 rng(5);
  std::vector<uint8_t> data(70001);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t cut : {0, 1, 8, 4096, 24576, 70000, 70001}) {
    const uint32_t a = Crc32c(data.data(), cut), b = Crc32c(data.data() + cut, data.size() - cut);
    EXPECT_EQ(Crc32cCombine(a, b, data.size() - cut), Crc32c(data.data(), data.size())) << cut;
  }
}

TEST(Crc32cTest, OfManySplitsLargeSpansOverThreadsAndKeepsTheirOrder) {
  std::mt19937 rng(3);
  std::vector<uint8_t> data((size_t{70} << 20) + 5);  // three pieces of at most 32 MiB
  for (size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<uint8_t>(rng());
  const std::vector<Crc32cSpan> spans = {
      {data.data(), data.size()}, {data.data() + 7, 1000}, {data.data(), 0}, {data.data() + 1, 3}};
  for (int threads : {1, 2, 5}) {
    const std::vector<uint32_t> crcs = Crc32cOfMany(spans, threads);
    ASSERT_EQ(crcs.size(), spans.size());
    for (size_t i = 0; i < spans.size(); ++i) {
      EXPECT_EQ(crcs[i], Crc32cPortable(spans[i].data, spans[i].size)) << i << ", " << threads;
    }
  }
  EXPECT_TRUE(Crc32cOfMany({}, 4).empty());
}

TEST(Crc32cTest, DetectsASingleFlippedBit) {
  std::string s(4096, 'a');
  const uint32_t before = Crc32c(s.data(), s.size());
  s[2048] ^= 0x10;
  EXPECT_NE(Crc32c(s.data(), s.size()), before);
}

}  // namespace
}  // namespace asympo
