#include "rollout_server/tasks/calculator.h"

#include "rollout_server/tasks/addition_task.h"

namespace asympo::rollout {
namespace {

using addition::DigitId;
using addition::IsDigitId;
using addition::kCallId;
using addition::kCommaId;
using addition::kEqualsId;
using addition::kPlusId;

// The sum spelled by t[0, end): [+] n (+ n)*, numbers of 1 to 4 digits; a
// leading "+" adds to `previous`. nullopt when it cannot be read.
std::optional<int64_t> ReadSum(const std::vector<int32_t>& t, size_t end,
                               const std::optional<int32_t>& previous) {
  size_t i = 0;
  int64_t sum = 0;
  if (i < end && t[i] == kPlusId) {
    if (!previous.has_value()) return std::nullopt;
    sum = *previous;
    ++i;
  }
  while (true) {
    size_t digits = 0;
    int64_t n = 0;
    while (i < end && IsDigitId(t[i]) && digits < 5) {
      n = n * 10 + (t[i] - DigitId(0));
      ++i;
      ++digits;
    }
    if (digits == 0 || digits > 4) return std::nullopt;
    sum += n;
    if (i == end) return sum;
    if (t[i] != kPlusId) return std::nullopt;
    ++i;
  }
}

}  // namespace

std::vector<int32_t> CalculatorAnswer(const std::vector<int32_t>& turn,
                                      std::optional<int32_t>* previous) {
  if (turn.empty() || turn.back() != kCallId) return {};
  const std::optional<int64_t> sum = ReadSum(turn, turn.size() - 1, *previous);
  if (!sum.has_value()) return {kCommaId};
  std::vector<int32_t> out = {kEqualsId};
  AppendDigits(*sum, &out);
  *previous = static_cast<int32_t>(*sum);
  return out;
}

}  // namespace asympo::rollout
