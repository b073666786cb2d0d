// Rule-based verifier for math answers, used as the RL reward for math tasks.
//
// A response is reduced to its final answer (the last \boxed{...}, otherwise
// the last number in the text), both answers are brought to a canonical form
// and compared as strings. Numbers become exact reduced rationals, so "1/2",
// "0.5", "\frac{1}{2}" and "\dfrac{2}{4}" all agree while "1/3" and "0.33" do
// not; anything that is not a plain number (\sqrt{2}, intervals, expressions)
// is compared by its cleaned LaTeX text. No symbolic algebra is attempted.
//
// All functions are pure and thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace asympo::rollout {

// Returns the final answer in a model response:
//  - if the response contains \boxed or \fbox, the content of the LAST one,
//    either "\boxed{...}" (balanced braces, nesting and \{ \} allowed) or
//    "\boxed 42" (the token up to the next space or '$'). If that last box is
//    unterminated or empty, returns nullopt: earlier boxes and bare numbers
//    are not consulted, since a broken final box is a broken answer.
//  - otherwise the last number in the text: an integer, a decimal (".5",
//    "2.50"), optionally negative, with thousands separators ("1,234") or a
//    fraction "3/4".
// Returns nullopt when there is neither a box nor a number.
std::optional<std::string> ExtractFinalAnswer(std::string_view response);

// Returns the canonical form of an answer, or nullopt when nothing is left
// after cleaning (empty, only spaces or '$').
//  - Cleaning drops '$', whitespace, \left/\right, \! \, \; \:, \displaystyle,
//    a trailing period, a leading '+', percent signs ("50\%" -> 50), degrees
//    ("30^\circ" -> 30), a \text{...} unit after a number ("5\text{ cm}" ->
//    5), an enclosing \boxed{}, and a single-letter left side ("x=3" -> 3).
//  - A number ("-3", "1,234", ".5", "2.50", "3/4", "\frac{1}{2}", "\frac12",
//    "-\dfrac{2}{4}") becomes "p" or "p/q" with q > 0 and gcd(p, q) = 1.
//    Numbers too large for exact 128-bit arithmetic keep their cleaned text.
//  - Anything else is its cleaned text with \dfrac/\tfrac written \frac and
//    shorthand arguments braced ("\sqrt2" -> "\sqrt{2}").
std::optional<std::string> NormalizeAnswer(std::string_view answer);

// True when both answers normalize and their canonical forms are equal.
bool AnswersMatch(std::string_view predicted, std::string_view reference);

// 1.0 when the final answer extracted from `response` matches
// `reference_answer`, else 0.0 (including when no answer can be extracted).
double MathReward(std::string_view response, std::string_view reference_answer);

}  // namespace asympo::rollout
