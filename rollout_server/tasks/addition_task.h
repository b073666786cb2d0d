// The "add" task: add k two-digit numbers, with a scratchpad of running sums
// in any order of the operands, rewarded only on the final answer.
//
// Made to look like reasoning: many correct responses per prompt (any of
// the k! orders of the operands), of 16 to 34 tokens for k = 3..5, and a
// binary verifier, so that a policy can be right for the answer while its
// scratchpad varies. Token ids live in the synthetic tasks' symbol space
// (tasks.h): digits 0..9 are kFirstSymbolId + 0..9, then "+", "=", "," and
// the task's marker. For 23 + 45 + 17:
//
//   prompt    BOS ADD 2 3 + 4 5 + 1 7 SEP
//   response  4 5 + 1 7 = 6 2 , + 2 3 = 8 5 EOS      (one of 6 orders)
//
// The final answer is the digits between the response's last "=" (or its
// start, when it has none) and its EOS; reward 1 when it is the sum, else 0
// (no EOS: 0). The scratchpad is not checked. docs/tasks.md, "add".
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "rollout_server/tasks/tasks.h"

namespace asympo::rollout {

namespace addition {
// Digit d (0..9) is the token DigitId(d); IsDigitId says whether a token is one.
inline constexpr int32_t DigitId(int32_t d) { return synthetic::kFirstSymbolId + d; }
inline constexpr bool IsDigitId(int32_t id) { return id >= DigitId(0) && id <= DigitId(9); }
inline constexpr int32_t kPlusId = synthetic::kFirstSymbolId + 10;
inline constexpr int32_t kEqualsId = synthetic::kFirstSymbolId + 11;
inline constexpr int32_t kCommaId = synthetic::kFirstSymbolId + 12;
inline constexpr int32_t kMarkerId = synthetic::kFirstSymbolId + 13;
// "add_tool": its marker, and CALL, which ends a turn that asks the
// calculator (calculator.h) for the sum the turn wrote.
inline constexpr int32_t kToolMarkerId = synthetic::kFirstSymbolId + 14;
inline constexpr int32_t kCallId = synthetic::kFirstSymbolId + 15;
inline constexpr int32_t kMinOperand = 10;
inline constexpr int32_t kMaxOperand = 99;
inline constexpr int32_t kDefaultMinOperands = 3;
inline constexpr int32_t kDefaultMaxOperands = 5;
inline constexpr int32_t kMaxOperands = 10;
}  // namespace addition

// Appends the digit tokens of n (n >= 0) in decimal, most significant first:
// how the tasks and the calculator write numbers.
void AppendDigits(int64_t n, std::vector<int32_t>* out);

// The task ("add", or "add_tool" when o.name says so: the same problems and
// verifier, on a transcript that may call a calculator, calculator.h);
// o.synthetic_min_length and o.synthetic_max_length are the range of k (0:
// 3 and 5; at most 10), o.synthetic_alphabet_size must be 0.
absl::StatusOr<std::unique_ptr<Task>> CreateAdditionTask(const TaskOptions& o);

// The operands of an "add" prompt (from its reference); INVALID_ARGUMENT
// for a prompt of another task.
absl::StatusOr<std::vector<int32_t>> AdditionOperands(const TaskPrompt& prompt);

// A correct response for `operands` added in `order` (a permutation of
// their indices), EOS included.
std::vector<int32_t> AdditionSolution(const std::vector<int32_t>& operands,
                                      const std::vector<int32_t>& order);

// A correct response in an order drawn uniformly from `rng`.
std::vector<int32_t> RandomAdditionSolution(const std::vector<int32_t>& operands,
                                            std::mt19937_64& rng);

// The order in which a response adds the operands (indices into
// `operands`), read from its scratchpad: its first number, then the number
// after each "+". Empty when the scratchpad does not name each operand
// exactly once. For the entropy of the orders a policy uses.
std::vector<int32_t> AdditionOrder(const std::vector<int32_t>& operands,
                                   const std::vector<int32_t>& response);

// The entropy, in nats, of the operand orders that `responses` use (each
// read with AdditionOrder; responses whose order cannot be read are left
// out), and how many were read. 0 when fewer than two were.
struct OrderEntropy {
  double nats = 0;
  int64_t read = 0;
};
OrderEntropy AdditionOrderEntropy(const std::vector<int32_t>& operands,
                                  const std::vector<std::vector<int32_t>>& responses);

}  // namespace asympo::rollout
