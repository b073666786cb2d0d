// Trainer::StepWithoutPoisonedGroups: a step whose loss or gradient is not
// finite, tried again without the groups whose rewards made it so.
//
// One group with rewards of +-3e38, say (finite each; within the bound an
// operator raised with --max_abs_reward), makes the whole step's loss NaN:
// skipping the step would lose every honest group in it, and a stream of
// such groups would skip every step. So each group is tried alone (its
// gradients computed, its norm taken, then cleared). A group that is
// non-finite alone is tried once more with its rewards replaced by their
// signs: finite then, its rewards are the poison and it is dropped; still
// non-finite, the fault is the model's (overflowing weights or
// activations), no group is to blame and the step stays skipped. The step
// is then computed again on the groups kept, with their totals, exactly as
// if only they had been popped. When every group is poisoned the step is
// skipped as SkipReason::kPoisonedGroups (the daemon blames their sources). The
// extra passes cost up to two forward and backward passes per group, on
// this path only.
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "learner_server/trainer/trainer.h"

namespace asympo::learner {
namespace {

bool NonFinite(const StepFailure& f) {
  return f.reason == SkipReason::kNonFiniteLoss || f.reason == SkipReason::kNonFiniteGradient;
}

// `q` with each reward replaced by its sign.
QueuedGroup WithSignRewards(QueuedGroup q) {
  for (v1::Response& r : *q.group.mutable_responses()) {
    r.set_reward(static_cast<float>((r.reward() > 0) - (r.reward() < 0)));
  }
  return q;
}

std::vector<QueuedGroup> Without(const std::vector<QueuedGroup>& groups,
                                 const std::vector<size_t>& dropped) {
  std::vector<QueuedGroup> kept;
  size_t next = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (next < dropped.size() && dropped[next] == i) {
      ++next;
    } else {
      kept.push_back(groups[i]);
    }
  }
  return kept;
}

// Sets `result`'s dropped and dropped_sources (a StepResult or the
// trainer's Accumulated).
template <typename Result>
void SetDropped(const std::vector<QueuedGroup>& groups, std::vector<size_t> dropped,
                Result& result) {
  for (const size_t i : dropped) result.dropped_sources.push_back(groups[i].source);
  result.dropped = std::move(dropped);
}

}  // namespace

StepOr<double> Trainer::TryAlone(const QueuedGroup& group) {
  const std::vector<QueuedGroup> one = {group};
  return Guarded("trying one group alone", [&]() -> StepOr<double> {
    StepOr<Accumulated> alone = Accumulate(one, StepTotalsOf(one));
    if (!alone.ok()) return alone.failure();
    const double norm = GradientNorm(model_->parameters());
    optimizer_.ZeroGrad();
    if (!std::isfinite(norm)) return NonFiniteGradient();
    return norm;
  });
}

StepOr<std::vector<size_t>> Trainer::PoisonedGroups(const std::vector<QueuedGroup>& groups,
                                                    const StepFailure& failure) {
  if (!NonFinite(failure)) return failure;  // only a non-finite step can have poison to blame
  std::vector<size_t> poisoned;
  for (size_t i = 0; i < groups.size(); ++i) {
    const StepOr<double> alone = TryAlone(groups[i]);
    if (alone.ok()) continue;
    // Another kind of failure, or one its rewards do not explain: no group
    // can be blamed.
    if (!NonFinite(alone.failure()) || !TryAlone(WithSignRewards(groups[i])).ok()) return failure;
    poisoned.push_back(i);
  }
  return poisoned;
}

StepOr<StepResult> Trainer::StepWithoutPoisonedGroups(const std::vector<QueuedGroup>& groups,
                                                      const StepFailure& failure) {
  StepOr<std::vector<size_t>> dropped = PoisonedGroups(groups, failure);
  if (!dropped.ok() || dropped->empty()) return failure;
  if (dropped->size() == groups.size()) {
    return StepFailure{absl::InternalError(absl::StrCat(
                           "each of the step's ", groups.size(),
                           " groups made the loss or the gradient non-finite by its rewards; "
                           "the step was skipped")),
                       SkipReason::kPoisonedGroups};
  }
  const std::vector<QueuedGroup> kept = Without(groups, *dropped);
  StepOr<StepResult> result = Guarded("training step", [&] { return StepUnguarded(kept); });
  if (result.ok()) SetDropped(groups, *std::move(dropped), *result);
  return result;
}

StepOr<Trainer::Accumulated> Trainer::ShardWithoutPoisonedGroups(
    const std::vector<QueuedGroup>& shard, const StepTotals& totals, const StepFailure& failure) {
  StepOr<std::vector<size_t>> dropped = PoisonedGroups(shard, failure);
  if (!dropped.ok() || dropped->empty()) return failure;
  const std::vector<QueuedGroup> kept = Without(shard, *dropped);
  StepOr<Accumulated> local =
      Guarded("computing gradients", [&] { return Accumulate(kept, totals); });
  if (local.ok()) SetDropped(shard, *std::move(dropped), *local);
  return local;
}

}  // namespace asympo::learner
