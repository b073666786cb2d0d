#include "rollout_server/tasks/math_verifier.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

// Every expectation below was worked out by hand from the documented rules in
// math_verifier.h, not produced by running the code.

namespace asympo::rollout {
namespace {

// nullptr stands for std::nullopt.
std::optional<std::string> Opt(const char* s) {
  return s == nullptr ? std::nullopt : std::optional<std::string>(s);
}

struct ExtractCase {
  const char* response;
  const char* expected;
};

TEST(MathVerifierTest, ExtractFinalAnswerTakesLastBoxOrLastNumber) {
  const ExtractCase kCases[] = {
      // Boxes.
      {"The answer is \\boxed{42}.", "42"},
      {"\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"},
      {"So \\boxed{\\frac{\\sqrt{3}}{2}} done", "\\frac{\\sqrt{3}}{2}"},
      {"\\boxed{x^{2}}", "x^{2}"},
      {"\\boxed{\\{1,2\\}}", "\\{1,2\\}"},
      {"\\boxed{a\\}b}", "a\\}b"},
      {"\\boxed{\\boxed{2}}", "2"},
      {"\\boxed{3} then \\boxed{4}", "4"},
      {"\\boxed{1}\\boxed{2}", "2"},
      {"First \\boxed{1}, corrected: \\boxed{ 2 }", "2"},
      {"\\boxed{\\frac{1}{2}} and \\fbox{3}", "3"},
      {"\\fbox{3} then \\boxed{4}", "4"},
      {"\\fbox{7}", "7"},
      {"\\boxed 5$", "5"},
      {"$\\boxed 12$.", "12"},
      {"\\boxed 5", "5"},
      {"\\boxed {9}", "9"},
      {"\\boxed\n{8}", "8"},
      {"Therefore $\\boxed{12}$ is our answer, and 13 is not.", "12"},
      {"\\boxed{5\\text{ cm}}", "5\\text{ cm}"},
      {"The answer is: \\boxed{\\text{(B)}}", "\\text{(B)}"},
      // Malformed boxes give no answer, even with numbers around.
      {"\\boxed{}", nullptr},
      {"\\boxed{   }", nullptr},
      {"\\boxed{5", nullptr},
      {"\\boxed{3} and later \\boxed{4", nullptr},
      {"The answer is 5 \\boxed{}", nullptr},
      {"\\boxed", nullptr},
      {"\\boxed  ", nullptr},
      // Not a box command: falls back to the last number.
      {"\\boxedx 5", "5"},
      // Last-number fallback.
      {"The answer is 42.", "42"},
      {"2 + 3 = 5", "5"},
      {"-7 degrees", "-7"},
      {"value -3", "-3"},
      {"x = -2.5", "-2.5"},
      {"(-2)", "-2"},
      {"-.5", "-.5"},
      {"x-3 so 4", "4"},
      {"It is x-3", "3"},
      {"5-3", "3"},
      {"about 3.14 units", "3.14"},
      {"3.5.", "3.5"},
      {"1,234 apples", "1,234"},
      {"pay 1,234,567 dollars", "1,234,567"},
      {"list 1,2,3", "3"},
      {"12,3456", "3456"},
      {"ratio 3/4.", "3/4"},
      {"half is .5", ".5"},
      {"The result: 0.25, final", "0.25"},
      {"Steps 1. 2. Answer 10", "10"},
      {"2024 was the year; answer 17", "17"},
      {"a) 4, b) 6", "6"},
      // The fallback does not read LaTeX: the last number here is the 2.
      {"$-\\frac{1}{2}$", "2"},
      // Nothing to extract.
      {"no numbers here", nullptr},
      {"", nullptr},
  };
  for (const ExtractCase& c : kCases) {
    EXPECT_EQ(ExtractFinalAnswer(c.response), Opt(c.expected)) << "response: " << c.response;
  }
}

struct NormalizeCase {
  const char* answer;
  const char* expected;
};

TEST(MathVerifierTest, NormalizeAnswerGivesReducedRationalsOrCleanText) {
  const NormalizeCase kCases[] = {
      {"1/2", "1/2"},
      {"0.5", "1/2"},
      {".5", "1/2"},
      {"\\frac{1}{2}", "1/2"},
      {"\\dfrac{2}{4}", "1/2"},
      {"\\tfrac{3}{6}", "1/2"},
      {"\\frac12", "1/2"},
      {"\\frac 1 2", "1/2"},
      {"-\\frac{1}{2}", "-1/2"},
      {"\\frac{-1}{2}", "-1/2"},
      {"-\\frac12", "-1/2"},
      {"\\frac{1.5}{3}", "1/2"},
      {"-3/-6", "1/2"},
      {"\\left(\\frac{1}{2}\\right)", "1/2"},
      {"\\displaystyle\\frac{1}{2}", "1/2"},
      {"\\frac{1}{2}.", "1/2"},
      {"\\frac{1}{2}\\text{ m}", "1/2"},
      {"2.50", "5/2"},
      {"0.125", "1/8"},
      {"1,234", "1234"},
      {"-1,234,567", "-1234567"},
      {"1{,}000", "1000"},
      {"3\\,000", "3000"},
      {"123456789012345678/2", "61728394506172839"},
      {"50\\%", "50"},
      {"50%", "50"},
      {"30^\\circ", "30"},
      {"30^{\\circ}", "30"},
      {"$42$", "42"},
      {" 42 ", "42"},
      {"\\$5", "5"},
      {"+7", "7"},
      {"7.", "7"},
      {"007", "7"},
      {"-0", "0"},
      {"0.000", "0"},
      {"- 5", "-5"},
      {"\xE2\x88\x92"
       "5",
       "-5"},  // U+2212 minus sign
      {"3\\!", "3"},
      {"\\ 3", "3"},
      {"x = 3", "3"},
      {"5\\text{ cm}", "5"},
      {"\\text{5}", "5"},
      {"\\boxed{3}", "3"},
      {"{5}", "5"},
      {"(5)", "5"},
      {"\\sqrt{2}", "\\sqrt{2}"},
      {"\\sqrt2", "\\sqrt{2}"},
      {"2\\sqrt 3", "2\\sqrt{3}"},
      {"\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}"},
      {"\\dfrac{\\sqrt3}2", "\\frac{\\sqrt{3}}{2}"},
      {"\\frac\\pi2", "\\frac{\\pi}{2}"},
      {"\\pi", "\\pi"},
      {"(1,2)", "(1,2)"},
      {"1,2", "1,2"},
      {"1/0", "1/0"},
      {"1e3", "1e3"},
      {"10^{3}", "10^{3}"},
      {"x", "x"},
      {"x^2=4", "x^2=4"},
      // 50 digits: beyond 128-bit arithmetic, kept as text.
      {"12345678901234567890123456789012345678901234567890",
       "12345678901234567890123456789012345678901234567890"},
      {"", nullptr},
      {"   ", nullptr},
      {"$ $", nullptr},
      {"$$", nullptr},
  };
  for (const NormalizeCase& c : kCases) {
    EXPECT_EQ(NormalizeAnswer(c.answer), Opt(c.expected)) << "answer: " << c.answer;
  }
}

struct MatchCase {
  const char* predicted;
  const char* reference;
  bool match;
};

TEST(MathVerifierTest, AnswersMatchComparesCanonicalForms) {
  const MatchCase kCases[] = {
      // Same rational, different spellings.
      {"1/2", "0.5", true},
      {"\\frac{1}{2}", "0.5", true},
      {"\\dfrac{2}{4}", "1/2", true},
      {".5", "\\frac12", true},
      {"0.50", "1/2", true},
      {"1/2", "2/4", true},
      {"\\frac{2}{4}", "\\frac{1}{2}", true},
      {"-0.5", "-\\frac{1}{2}", true},
      {"-\\frac12", "\\frac{-1}{2}", true},
      {"-\\frac{3}{4}", "-0.75", true},
      {"\\frac{-3}{4}", "-0.75", true},
      {"\\frac{3}{-4}", "-0.75", true},
      {"\\frac{6}{8}", "0.75", true},
      {"3/4", "0.75", true},
      {"\\frac34", "3/4", true},
      {"\\tfrac{9}{12}", "3/4", true},
      {"0.125", "1/8", true},
      {"1/8", "\\frac{1}{8}", true},
      {"0.1", "1/10", true},
      {"2.5", "5/2", true},
      {"2.5", "\\frac{5}{2}", true},
      {"-2.5", "-5/2", true},
      {"\\frac{10}{4}", "2.5", true},
      {"1.5", "3/2", true},
      {"\\displaystyle\\frac{1}{2}", "1/2", true},
      {"\\left(\\frac{1}{2}\\right)", "0.5", true},
      // Integers, signs, separators, decoration.
      {"3.0", "3", true},
      {"3.00", "3", true},
      {"+3", "3", true},
      {"007", "7", true},
      {"10.", "10", true},
      {"-7",
       "\xE2\x88\x92"
       "7",
       true},
      {"-5", "- 5", true},
      {"0", "-0", true},
      {"0.0", "0", true},
      {"1,234", "1234", true},
      {"1234", "1,234", true},
      {"1,000,000", "1000000", true},
      {"100\\,000", "100000", true},
      {"1{,}000", "1000", true},
      {"$3$", "3", true},
      {"\\$5", "5", true},
      {"3\\!", "3", true},
      {"3\\;", "3", true},
      {"(5)", "5", true},
      {"{5}", "5", true},
      {"\\boxed{12}", "12", true},
      {"12", "\\boxed{12}", true},
      {"50\\%", "50", true},
      {"50%", "50", true},
      {"45^\\circ", "45", true},
      {"45^{\\circ}", "45", true},
      {"5\\text{ cm}", "5", true},
      {"5 \\text{dollars}", "5", true},
      {"\\text{5}", "5", true},
      {"\\frac{1}{2}\\text{ m}", "0.5", true},
      // Equations with a one-letter left side.
      {"x=3", "3", true},
      {"x = 3", "3", true},
      {"3", "y=3", true},
      {"x = 3", "x=3", true},
      {"y = 2x + 1", "2x+1", true},
      // Symbolic answers compared as cleaned text.
      {"\\sqrt{2}", "\\sqrt2", true},
      {"2\\sqrt{3}", "2\\sqrt3", true},
      {"2\\sqrt 3", "2\\sqrt{3}", true},
      {"\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt{3}}{2}", true},
      {"\\frac{\\sqrt3}2", "\\frac{\\sqrt{3}}{2}", true},
      {"\\frac{\\pi}{2}", "\\frac\\pi2", true},
      {"\\pi", "\\pi", true},
      {"\\infty", "\\infty", true},
      {"x^2+1", "x^2 + 1", true},
      {"\\left(1,2\\right)", "(1,2)", true},
      {"[0, 1)", "[0,1)", true},
      {"\\{1, 2\\}", "\\{1,2\\}", true},
      {"\\text{(B)}", "(B)", true},
      // Close but different numbers.
      {"1/3", "0.33", false},
      {"0.33", "1/3", false},
      {"0.333", "1/3", false},
      {"2/3", "0.667", false},
      {"1/7", "0.142857", false},
      {"0.1", "0.10000001", false},
      {"2", "3", false},
      {"2.01", "2", false},
      {"-2", "2", false},
      {"2", "-2", false},
      {"-1/2", "1/2", false},
      {"1/2", "2/1", false},
      {"1/2", "0.05", false},
      {"\\frac{1}{2}", "\\frac{1}{3}", false},
      {"3", "\\frac{1}{3}", false},
      {"12", "1.2", false},
      {"1234", "123", false},
      {"1,234", "1.234", false},
      {"1,2", "12", false},
      {"1000", "1,00", false},
      {"50\\%", "0.5", false},
      {"0.75", "\\frac{3}{5}", false},
      // Unsupported notations do not match their values.
      {"1\\frac{1}{2}", "\\frac{3}{2}", false},
      {"100", "10^2", false},
      {"1e3", "1000", false},
      {"\\sqrt{2}", "1.414", false},
      {"\\sqrt{2}", "2", false},
      {"\\sqrt{3}", "\\sqrt{2}", false},
      {"3.14", "\\pi", false},
      // Different symbolic answers.
      {"x=3", "x=4", false},
      {"x^2=4", "4", false},
      {"xy=3", "3", false},
      {"(1,2)", "(2,1)", false},
      {"a", "b", false},
      {"A", "a", false},
      // Nothing to compare.
      {"", "0", false},
      {"0", "", false},
      {"", "", false},
      {"$ $", "0", false},
      {"1/0", "0", false},
      {"\\frac{1}{0}", "1/0", false},
  };
  for (const MatchCase& c : kCases) {
    EXPECT_EQ(AnswersMatch(c.predicted, c.reference), c.match)
        << "predicted: " << c.predicted << " reference: " << c.reference;
    EXPECT_EQ(AnswersMatch(c.reference, c.predicted), c.match)
        << "swapped, predicted: " << c.reference << " reference: " << c.predicted;
  }
}

struct RewardCase {
  const char* response;
  const char* reference;
  double reward;
};

TEST(MathVerifierTest, MathRewardIsOneOnlyForAMatchingFinalAnswer) {
  const RewardCase kCases[] = {
      {"So we get \\boxed{\\frac{1}{2}}.", "0.5", 1.0},
      {"\\boxed{0.5}", "\\frac{1}{2}", 1.0},
      {"So the answer is 1,234.", "1234", 1.0},
      {"The answer is 50\\%.", "50", 1.0},
      {"$x = \\boxed{-4}$", "-4", 1.0},
      {"\\boxed{x=-4}", "-4", 1.0},
      {"\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0},
      {"\\boxed{45^\\circ}", "45", 1.0},
      {"\\boxed{5\\text{ cm}}", "5", 1.0},
      {"answer 0.75", "\\frac{3}{4}", 1.0},
      {"\\boxed{2} no wait \\boxed{3}", "3", 1.0},
      {"The answer is: \\boxed{\\text{(B)}}", "(B)", 1.0},
      {"\\boxed{2} no wait \\boxed{3}", "2", 0.0},
      {"\\boxed{1/3}", "0.33", 0.0},
      {"answer 0.75", "\\frac{3}{5}", 0.0},
      {"Total: 1,000,000", "10^6", 0.0},
      {"\\boxed{5", "5", 0.0},
      {"\\boxed{}", "0", 0.0},
      {"The answer is 5 \\boxed{}", "5", 0.0},
      {"no answer", "0", 0.0},
      {"", "1", 0.0},
      {"\\boxed{7}", "", 0.0},
  };
  for (const RewardCase& c : kCases) {
    EXPECT_EQ(MathReward(c.response, c.reference), c.reward)
        << "response: " << c.response << " reference: " << c.reference;
  }
}

}  // namespace
}  // namespace asympo::rollout
