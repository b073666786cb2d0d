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

TEST(Crc32cTest, DetectsASingleFlippedBit) {
  std::string s(4096, 'a');
  const uint32_t before = Crc32c(s.data(), s.size());
  s[2048] ^= 0x10;
  EXPECT_NE(Crc32c(s.data(), s.size()), before);
}

}  // namespace
}  // namespace asympo
