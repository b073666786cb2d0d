#include "rollout_server/tasks/math_verifier.h"

#include <cctype>
#include <cstddef>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"

namespace asympo::rollout {
namespace {

using Int128 = __int128;

bool IsDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }
bool IsAlpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool IsSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Index of the '}' closing the '{' at `open`, or npos. A backslash escapes
// the next character, so \{ and \} do not count.
size_t MatchBrace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '{') {
      ++depth;
    } else if (s[i] == '}' && --depth == 0) {
      return i;
    }
  }
  return std::string_view::npos;
}

// Position just past the command name of the '\' at `i` (letters, or one
// other character).
size_t CommandEnd(std::string_view s, size_t i) {
  size_t j = i + 1;
  if (j < s.size() && !IsAlpha(s[j])) return j + 1;
  while (j < s.size() && IsAlpha(s[j])) ++j;
  return j;
}

// ---------------------------------------------------------------------------
// Extraction.

// Length of the box command at `pos` (\boxed or \fbox followed by '{', a
// space or the end), or 0.
size_t BoxCommandLength(std::string_view s, size_t pos) {
  for (std::string_view kw : {std::string_view("\\boxed"), std::string_view("\\fbox")}) {
    if (s.substr(pos, kw.size()) != kw) continue;
    const size_t next = pos + kw.size();
    if (next == s.size() || s[next] == '{' || IsSpace(s[next])) return kw.size();
  }
  return 0;
}

std::optional<std::string> ExtractLastBox(std::string_view s) {
  size_t box = std::string_view::npos;
  size_t len = 0;
  for (size_t pos = s.find('\\'); pos != std::string_view::npos; pos = s.find('\\', pos + 1)) {
    if (size_t l = BoxCommandLength(s, pos); l > 0) {
      box = pos;
      len = l;
    }
  }
  if (box == std::string_view::npos) return std::nullopt;
  size_t j = box + len;
  while (j < s.size() && IsSpace(s[j])) ++j;
  std::string_view content;
  if (j < s.size() && s[j] == '{') {
    const size_t close = MatchBrace(s, j);
    if (close == std::string_view::npos) return std::string();  // unterminated
    content = s.substr(j + 1, close - j - 1);
  } else if (j > box + len) {
    size_t end = j;
    while (end < s.size() && !IsSpace(s[end]) && s[end] != '$') ++end;
    content = s.substr(j, end - j);
  }
  const absl::string_view trimmed =
      absl::StripAsciiWhitespace(absl::string_view(content.data(), content.size()));
  return std::string(trimmed.data(), trimmed.size());
}

// Length of the number starting at `i` (a digit, or '.' before a digit).
size_t ScanNumber(std::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size() && IsDigit(s[j])) ++j;
  // Thousands separators: only after a 1-3 digit lead, in groups of exactly 3.
  if (j > i && j - i <= 3) {
    while (j + 3 < s.size() && s[j] == ',' && IsDigit(s[j + 1]) && IsDigit(s[j + 2]) &&
           IsDigit(s[j + 3]) && (j + 4 == s.size() || !IsDigit(s[j + 4]))) {
      j += 4;
    }
  }
  if (j + 1 < s.size() && s[j] == '.' && IsDigit(s[j + 1])) {
    ++j;
    while (j < s.size() && IsDigit(s[j])) ++j;
  } else if (j > i && j + 1 < s.size() && s[j] == '/' && IsDigit(s[j + 1])) {
    ++j;
    while (j < s.size() && IsDigit(s[j])) ++j;
  }
  return j - i;
}

std::optional<std::string> ExtractLastNumber(std::string_view s) {
  std::optional<std::string> last;
  size_t i = 0;
  while (i < s.size()) {
    const bool starts = IsDigit(s[i]) || (s[i] == '.' && i + 1 < s.size() && IsDigit(s[i + 1]) &&
                                          (i == 0 || !IsDigit(s[i - 1])));
    if (!starts) {
      ++i;
      continue;
    }
    const size_t len = ScanNumber(s, i);
    // A '-' is a sign unless it follows an operand ("x-3", "5-3").
    const bool negative = i > 0 && s[i - 1] == '-' &&
                          (i == 1 || !(std::isalnum(static_cast<unsigned char>(s[i - 2])) ||
                                       s[i - 2] == ')' || s[i - 2] == '}'));
    last = (negative ? "-" : "") + std::string(s.substr(i, len));
    i += len;
  }
  return last;
}

// ---------------------------------------------------------------------------
// Exact rationals.

struct Rational {
  Int128 num = 0;
  Int128 den = 1;
};

Int128 Gcd(Int128 a, Int128 b) {
  if (a < 0) a = -a;
  if (b < 0) b = -b;
  while (b != 0) a = std::exchange(b, a % b);
  return a;
}

Rational Reduced(Int128 num, Int128 den) {
  if (den < 0) {
    num = -num;
    den = -den;
  }
  const Int128 g = Gcd(num, den);
  if (g > 1) {
    num /= g;
    den /= g;
  }
  return {num, den};
}

std::optional<Rational> Divide(const Rational& a, const Rational& b) {
  Int128 num = 0;
  Int128 den = 0;
  if (b.num == 0 || __builtin_mul_overflow(a.num, b.den, &num) ||
      __builtin_mul_overflow(a.den, b.num, &den)) {
    return std::nullopt;
  }
  return Reduced(num, den);
}

std::string ToString(Int128 v) {
  if (v == 0) return "0";
  const bool negative = v < 0;
  std::string digits;
  while (v != 0) {
    const int d = static_cast<int>(v % 10);
    digits.insert(digits.begin(), static_cast<char>('0' + (d < 0 ? -d : d)));
    v /= 10;
  }
  return negative ? "-" + digits : digits;
}

std::string ToString(const Rational& r) {
  return r.den == 1 ? ToString(r.num) : ToString(r.num) + "/" + ToString(r.den);
}

// "-1,234.50", ".5", "7." -> exact rational; nullopt on anything else or
// overflow.
std::optional<Rational> ParseDecimal(std::string_view s) {
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  size_t int_digits = 0;
  size_t i = 0;
  while (i < s.size() && IsDigit(s[i])) ++i, ++int_digits;
  std::string digits(s.substr(0, i));
  if (int_digits >= 1 && int_digits <= 3) {
    while (i + 3 < s.size() && s[i] == ',' && IsDigit(s[i + 1]) && IsDigit(s[i + 2]) &&
           IsDigit(s[i + 3])) {
      digits.append(s.substr(i + 1, 3));
      i += 4;
    }
  }
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && IsDigit(s[i])) digits.push_back(s[i++]), ++frac_digits;
  }
  if (i != s.size() || digits.empty()) return std::nullopt;
  Int128 num = 0;
  Int128 den = 1;
  for (char c : digits) {
    if (__builtin_mul_overflow(num, 10, &num) || __builtin_add_overflow(num, c - '0', &num)) {
      return std::nullopt;
    }
  }
  for (size_t k = 0; k < frac_digits; ++k) {
    if (__builtin_mul_overflow(den, 10, &den)) return std::nullopt;
  }
  return Reduced(negative ? -num : num, den);
}

// True when s is "(X)" or "{X}" with the outer pair matching each other.
bool IsWrapped(std::string_view s, char open, char close) {
  if (s.size() < 2 || s.front() != open || s.back() != close) return false;
  int depth = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] == open) ++depth;
    if (s[i] == close && --depth == 0) return false;
  }
  return true;
}

std::optional<Rational> ParseNumber(std::string_view s) {
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  std::optional<Rational> value;
  if (IsWrapped(s, '(', ')') || IsWrapped(s, '{', '}')) {
    value = ParseNumber(s.substr(1, s.size() - 2));
  } else if (s.substr(0, 6) == "\\frac{") {
    const size_t close_a = MatchBrace(s, 5);
    if (close_a == std::string_view::npos || close_a + 1 >= s.size() || s[close_a + 1] != '{' ||
        MatchBrace(s, close_a + 1) != s.size() - 1) {
      return std::nullopt;
    }
    const auto a = ParseDecimal(s.substr(6, close_a - 6));
    const auto b = ParseDecimal(s.substr(close_a + 2, s.size() - close_a - 3));
    if (a && b) value = Divide(*a, *b);
  } else if (const size_t slash = s.find('/'); slash != std::string_view::npos) {
    const auto a = ParseDecimal(s.substr(0, slash));
    const auto b = ParseDecimal(s.substr(slash + 1));
    if (a && b) value = Divide(*a, *b);
  } else {
    value = ParseDecimal(s);
  }
  if (value && negative) value->num = -value->num;
  return value;
}

// ---------------------------------------------------------------------------
// Cleaning.

// Drops spacing and sizing commands and whitespace; writes \dfrac, \tfrac
// and \cfrac as \frac. One space survives between a command name and a
// following letter ("\pi r"), where dropping it would merge the two.
std::string DropSpacing(std::string_view s) {
  std::string out;
  bool after_word_command = false;
  for (size_t i = 0; i < s.size();) {
    if (IsSpace(s[i])) {
      while (i < s.size() && IsSpace(s[i])) ++i;
      if (after_word_command && i < s.size() && IsAlpha(s[i])) out.push_back(' ');
      continue;
    }
    after_word_command = false;
    if (s[i] != '\\') {
      out.push_back(s[i++]);
      continue;
    }
    const size_t end = CommandEnd(s, i);
    const std::string_view name = s.substr(i + 1, end - i - 1);
    i = end;
    if (name == "left" || name == "right" || name == "displaystyle" || name == "textstyle" ||
        name == "!" || name == "," || name == ";" || name == ":" || name == " " || name.empty()) {
      continue;
    }
    if (name == "dfrac" || name == "tfrac" || name == "cfrac") {
      out += "\\frac";
    } else {
      out.push_back('\\');
      out.append(name);
    }
    after_word_command = IsAlpha(name.front());
  }
  return out;
}

// Braces the shorthand arguments of \frac and \sqrt: "\frac12" ->
// "\frac{1}{2}", "\sqrt2" -> "\sqrt{2}", "\frac\pi2" -> "\frac{\pi}{2}".
std::string BraceArguments(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s[i] != '\\') {
      out.push_back(s[i++]);
      continue;
    }
    const size_t end = CommandEnd(s, i);
    const std::string_view name = s.substr(i + 1, end - i - 1);
    out.append(s.substr(i, end - i));
    i = end;
    int args = name == "frac" ? 2 : name == "sqrt" ? 1 : 0;
    if (name == "sqrt" && i < s.size() && s[i] == '[') {
      const size_t close = s.find(']', i);
      if (close == std::string_view::npos) continue;
      out.append(s.substr(i, close + 1 - i));
      i = close + 1;
    }
    for (; args > 0 && i < s.size(); --args) {
      if (s[i] == ' ') ++i;
      if (i >= s.size()) break;
      size_t arg_end = i + 1;
      std::string_view inner = s.substr(i, 1);
      if (s[i] == '{') {
        const size_t close = MatchBrace(s, i);
        if (close == std::string_view::npos) break;
        inner = s.substr(i + 1, close - i - 1);
        arg_end = close + 1;
      } else if (s[i] == '\\') {
        arg_end = CommandEnd(s, i);
        inner = s.substr(i, arg_end - i);
      }
      out += "{" + BraceArguments(inner) + "}";
      i = arg_end;
    }
  }
  return out;
}

void StripEnds(std::string& s) {
  while (!s.empty() && s.back() == '.') s.pop_back();
  if (!s.empty() && s.front() == '+') s.erase(0, 1);
}

// Handles \text{...}-like wrappers: after a number they are units and are
// dropped with everything after them; elsewhere they are unwrapped.
std::string HandleTextWrappers(std::string s) {
  static constexpr std::string_view kWrappers[] = {"\\text{", "\\textrm{", "\\textbf{", "\\mathrm{",
                                                   "\\mbox{"};
  for (;;) {
    size_t pos = std::string::npos;
    size_t len = 0;
    for (std::string_view w : kWrappers) {
      const size_t p = s.find(w);
      if (p < pos) pos = p, len = w.size();
    }
    if (pos == std::string::npos) return s;
    if (pos > 0 && ParseNumber(s.substr(0, pos)).has_value()) return s.substr(0, pos);
    const size_t close = MatchBrace(s, pos + len - 1);
    if (close == std::string::npos) return s;
    s = s.substr(0, pos) + s.substr(pos + len, close - pos - len) + s.substr(close + 1);
  }
}

std::string Clean(std::string_view answer) {
  std::string s = absl::StrReplaceAll(absl::string_view(answer.data(), answer.size()),
                                      {{"\xE2\x88\x92", "-"},  // U+2212 minus sign
                                       {"\xC2\xB0", ""},       // degree sign
                                       {"^{\\circ}", ""},
                                       {"^\\circ", ""},
                                       {"{,}", ","},
                                       {"\\%", ""},
                                       {"%", ""},
                                       {"\\$", ""},
                                       {"$", ""}});
  s = BraceArguments(DropSpacing(s));
  for (std::string_view box : {std::string_view("\\boxed{"), std::string_view("\\fbox{")}) {
    if (s.rfind(box, 0) == 0 && MatchBrace(s, box.size() - 1) == s.size() - 1) {
      s = s.substr(box.size(), s.size() - box.size() - 1);
    }
  }
  StripEnds(s);
  // "x=3" -> "3": a single-letter left side names the unknown.
  if (s.size() >= 3 && IsAlpha(s[0]) && s[1] == '=' && s.find('=', 2) == std::string::npos) {
    s.erase(0, 2);
  }
  s = HandleTextWrappers(std::move(s));
  StripEnds(s);
  while (IsWrapped(s, '{', '}')) s = s.substr(1, s.size() - 2);
  return s;
}

}  // namespace

std::optional<std::string> ExtractFinalAnswer(std::string_view response) {
  if (std::optional<std::string> boxed = ExtractLastBox(response)) {
    if (boxed->empty()) return std::nullopt;
    return boxed;
  }
  return ExtractLastNumber(response);
}

std::optional<std::string> NormalizeAnswer(std::string_view answer) {
  std::string s = Clean(answer);
  if (s.empty()) return std::nullopt;
  if (std::optional<Rational> value = ParseNumber(s)) {
    if (value->num == 0) value->den = 1;
    return ToString(*value);
  }
  return s;
}

bool AnswersMatch(std::string_view predicted, std::string_view reference) {
  const std::optional<std::string> a = NormalizeAnswer(predicted);
  const std::optional<std::string> b = NormalizeAnswer(reference);
  return a.has_value() && b.has_value() && *a == *b;
}

double MathReward(std::string_view response, std::string_view reference_answer) {
  const std::optional<std::string> answer = ExtractFinalAnswer(response);
  return answer.has_value() && AnswersMatch(*answer, reference_answer) ? 1.0 : 0.0;
}

}  // namespace asympo::rollout
