#include "learner_server/trainer/step_exchange.h"

#include <type_traits>

namespace asympo::learner {
namespace {

// Calls `visit` on every field that is summed, in a fixed order: the one
// list that both flattening and unflattening follow.
template <typename Visit>
void ForEachSummed(StepExchange& e, Visit visit) {
  DiagnosticSums& d = e.diagnostics;
  visit(d.loss);
  visit(d.positive_mass);
  visit(d.s_pos);
  visit(d.s_neg);
  visit(d.imbalance);
  visit(d.clip_low);
  visit(d.clip_high);
  visit(d.nll);
  visit(d.response_length);
  visit(d.reward);
  visit(d.reward_squared);
  visit(d.degenerate_groups);
  visit(d.groups);
  visit(d.responses);
  visit(d.tokens);
  visit(e.tokens);
  visit(e.micro_batches);
  visit(e.gpg_alpha);
  visit(e.ranks_with_groups);
  for (int64_t& n : e.failures) visit(n);
  for (int64_t& n : e.has_gradient) visit(n);
}

}  // namespace

absl::Status SumAcrossRanks(StepReducer& reducer, StepExchange& exchange) {
  std::vector<double> values;
  ForEachSummed(exchange, [&](auto& field) { values.push_back(static_cast<double>(field)); });
  if (absl::Status s = reducer.SumValues(&values); !s.ok()) return s;
  size_t next = 0;
  ForEachSummed(exchange, [&](auto& field) {
    field = static_cast<std::remove_reference_t<decltype(field)>>(values[next++]);
  });
  return absl::OkStatus();
}

std::optional<SkipReason> StepExchange::failure() const {
  for (const SkipReason reason : kSkipReasons) {
    if (failures[static_cast<size_t>(reason)] > 0) return reason;
  }
  return std::nullopt;
}

LossDiagnostics StepExchange::Pooled() const {
  DiagnosticSums sums = diagnostics;
  sums.gpg_alpha = ranks_with_groups > 0 ? gpg_alpha / static_cast<double>(ranks_with_groups) : 1.0;
  return sums.Pooled();
}

}  // namespace asympo::learner
