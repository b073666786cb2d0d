#include "common/tokenizer/tokenizer_text.h"
#include "tests/testing/status_matchers.h"

#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace asympo {
namespace tokenizer_internal {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(Utf8Test, DecodesAndRejectsLikeTheStandard) {
  char32_t cp = 0;
  EXPECT_EQ(DecodeUtf8("\xe4\xbd\xa0", &cp), 3);
  EXPECT_EQ(cp, U'\u4f60');
  EXPECT_EQ(DecodeUtf8("\xf0\x9f\x98\x80", &cp), 4);
  EXPECT_EQ(cp, U'\U0001F600');
  EXPECT_EQ(DecodeUtf8("\xc0\xaf", &cp), -1);          // Overlong.
  EXPECT_EQ(DecodeUtf8("\xed\xa0\x80", &cp), -1);      // Surrogate.
  EXPECT_EQ(DecodeUtf8("\xf4\x90\x80\x80", &cp), -1);  // Above U+10FFFF.
  EXPECT_EQ(DecodeUtf8("\xe4\xbd", &cp), -2);          // Truncated.
}

TEST(Utf8Test, RepairReplacesEachMaximalInvalidPart) {
  EXPECT_EQ(RepairUtf8("ok"), "ok");
  EXPECT_EQ(RepairUtf8("a\xe4\xbd"
                       "b"),
            "a\xef\xbf\xbd"
            "b");
  EXPECT_EQ(RepairUtf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(RepairUtf8("\xff"), "\xef\xbf\xbd");
}

TEST(Utf8Test, ValidateNamesTheOffset) {
  EXPECT_OK(ValidateUtf8("h\xc3\xa9llo"));
  const absl::Status s = ValidateUtf8("abc\xff");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "byte 3 (0xFF)"));
}

TEST(NormalizeTest, ComposesAndDecomposes) {
  EXPECT_EQ(Normalize(NormalForm::kNFC, "A\u030a"), "\u00c5");
  EXPECT_EQ(Normalize(NormalForm::kNFC, "\u212b"), "\u00c5");  // Angstrom sign.
  EXPECT_EQ(Normalize(NormalForm::kNFD, "\u00c5"), "A\u030a");
  EXPECT_EQ(Normalize(NormalForm::kNFKC, "\ufb01"), "fi");
  // Hangul jamo compose into a syllable.
  EXPECT_EQ(Normalize(NormalForm::kNFC, "\u1112\u1161\u11ab"), "\ud55c");
  EXPECT_EQ(Normalize(NormalForm::kNFC, "plain ascii"), "plain ascii");
}

TEST(ByteLevelTest, MapsEveryByteReversibly) {
  EXPECT_EQ(BytesToByteLevel(" the"), "\u0120the");  // Ġthe
  EXPECT_EQ(BytesToByteLevel("\n"), "\u010a");       // Ċ
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string back;
  ASSERT_TRUE(ByteLevelToBytes(BytesToByteLevel(all), &back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(ByteLevelToBytes("a b", &back));  // A raw space is not in the alphabet.
}

std::vector<std::pair<size_t, size_t>> FindAll(const char* pattern, const std::string& text) {
  auto re = Regex::Compile(pattern);
  EXPECT_OK(re);
  std::vector<std::pair<size_t, size_t>> spans;
  if (re.ok()) (*re)->FindAll(text, &spans);
  return spans;
}

TEST(RegexTest, WhitespaceMeansUnicodeWhiteSpace) {
  EXPECT_EQ(TranslateHfPattern("[^\\s\\p{L}]\\s+(?!\\S)\\\\s"),
            "[^\\p{White_Space}\\p{L}]\\p{White_Space}+(?!\\P{White_Space})\\\\s");
  // U+0085 (NEL) and U+3000 are White_Space; U+180E and U+FEFF are not.
  EXPECT_THAT(FindAll("\\s+", "a\u0085b\u180ec\ufeffd\u3000"),
              ElementsAre(Pair(1, 3), Pair(12, 15)));
}

TEST(RegexTest, HandlesUnicodeClassesAndLookAhead) {
  // \p{L}+ over Devanagari with its vowel signs (marks, not letters).
  EXPECT_THAT(FindAll("\\p{L}+", "\u0928\u092e\u0938\u094d\u0924\u0947"),
              ElementsAre(Pair(0, 9), Pair(12, 15)));
  EXPECT_THAT(FindAll("\\s+(?!\\S)|\\s+", "a   b"), ElementsAre(Pair(1, 3), Pair(3, 4)));
  EXPECT_THAT(FindAll("(?i:'s)", "'S 's"), ElementsAre(Pair(0, 2), Pair(3, 5)));
  // Case-insensitive by Unicode case folding: long s (U+017F) folds to s.
  EXPECT_THAT(FindAll("(?i:'s)", "'\u017f"), ElementsAre(Pair(0, 3)));
}

TEST(RegexTest, LongInputsDoNotExhaustTheMatcher) {
  const std::string spaces(1 << 20, ' ');
  EXPECT_THAT(FindAll("\\s+(?!\\S)|\\s+", spaces + "x"),
              ElementsAre(Pair(0, spaces.size() - 1), Pair(spaces.size() - 1, spaces.size())));
  const std::string letters(1 << 20, 'a');
  EXPECT_THAT(FindAll("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", letters),
              ElementsAre(Pair(0, letters.size())));
}

TEST(RegexTest, BadPatternNamesItself) {
  auto re = Regex::Compile("(?<bad");
  EXPECT_THAT(re, StatusIs(absl::StatusCode::kInvalidArgument, "(?<bad"));
}

}  // namespace
}  // namespace tokenizer_internal
}  // namespace asympo
