// The reward-collapse detector, run per source and over the fleet.
//
// A source is whoever submitted a group (its principal; docs/security.md).
// Each source's step rewards feed an EMA and a collapse detector of its
// own, so that one source's rewards, however large (any reward within
// --max_abs_reward is legal), move only its own peak. The fleet's reward
// EMA is the median over the active sources' EMAs, each source one vote:
// one source, however far out and however much it sends, cannot move the
// median beyond the other sources' range when three or more are active
// (with two it is their mean, with one that source's). The fleet's detector
// judges that median against its own running peak, as a source's does.
//
// The number of sources with a detector (and a metric label) of their own
// is bounded: later sources share one, kOtherSources. A source that sent
// nothing for `source_idle_steps` steps drops out of the median (its state
// is kept, and it counts again when it sends again).
//
// The whole state (the fleet's and every source's EMA, peak, streak and
// suspicion) goes into checkpoints (ToJson, Restore), so that a resumed
// learner judges against the peak it had, not against the collapsed reward
// it resumes with. Not thread-safe: the trainer thread's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "learner_server/admission/group_queue.h"

namespace asympo::learner {

struct CollapseOptions {
  // Weight of the newest step in the reward EMA.
  double ema_alpha = 0.1;
  // Steps before the detector may fire (the EMA and its peak settle).
  int64_t warmup_steps = 20;
  // Suspected when the EMA is this fraction below its running peak ...
  double drop_fraction = 0.3;
  // ... and at least this far below it in reward units (a 30% drop from a
  // peak of 0.03 is noise, not a collapse) ...
  double min_drop = 0.05;
  // ... for this many steps in a row.
  int64_t confirm_steps = 5;
  // Once suspected, it stays so until the EMA is back within this fraction
  // of the peak (hysteresis: a reward that settles 20% below its peak after
  // a collapse stays flagged; one hovering at the threshold does not flap).
  double recover_fraction = 0.15;
};

absl::Status ValidateCollapseOptions(const CollapseOptions& options);

// What a detector carries from step to step (and across restarts).
struct CollapseState {
  int64_t steps = 0;  // observed
  int64_t below = 0;  // consecutive steps past the entry threshold
  double ema = 0, peak = 0;
  bool suspected = false;
};

// Reward collapse = the reward EMA falls `drop_fraction` below its running
// peak after warm-up, and at least `min_drop` below it, for `confirm_steps`
// steps in a row; the suspicion then holds until the EMA recovers to within
// `recover_fraction` of the peak. With rewards that can be negative, the
// fractions are of the peak's magnitude.
class CollapseDetector {
 public:
  explicit CollapseDetector(CollapseOptions options) : options_(options) {}
  // Feeds one step's mean reward; returns whether collapse is suspected.
  bool Observe(double reward_mean);
  // Feeds a value that is already smoothed (the fleet's median of EMAs):
  // it is the EMA of this step.
  bool ObserveSmoothed(double ema);
  double ema() const { return state_.ema; }
  double peak() const { return state_.peak; }
  bool suspected() const { return state_.suspected; }
  const CollapseState& state() const { return state_; }
  void Restore(const CollapseState& state) { state_ = state; }

 private:
  CollapseOptions options_;
  CollapseState state_;
};

struct RewardMonitorOptions {
  CollapseOptions collapse;
  // Sources with a detector and a label of their own (1 to 1024); later
  // ones share kOtherSources.
  int max_sources = 16;
  // A source that sent nothing for this many steps leaves the median.
  int64_t source_idle_steps = 200;
};

absl::Status ValidateRewardMonitorOptions(const RewardMonitorOptions& options);

// One group's rewards: the sum over its responses and their number.
struct SourceReward {
  std::string source;
  double sum = 0;
  int64_t responses = 0;
};

// Per group of `groups`, in order: its source and its rewards.
std::vector<SourceReward> GroupRewards(const std::vector<QueuedGroup>& groups);

class RewardMonitor {
 public:
  // The label of the sources beyond max_sources, and of a group without a
  // source. Neither is a valid principal name.
  static constexpr char kOtherSources[] = "(other)";
  static constexpr char kNoSource[] = "(none)";

  explicit RewardMonitor(RewardMonitorOptions options);

  // One trained step's groups (GroupRewards, less those not trained): each
  // source's mean reward feeds its detector, then the median of the active
  // sources' EMAs feeds the fleet's. A step with no response changes nothing.
  void Observe(const std::vector<SourceReward>& groups);

  const CollapseDetector& fleet() const { return fleet_; }
  // Sources counted in the fleet's median after the last step.
  int active_sources() const { return active_; }
  // Every source with a detector (at most max_sources + 1), by label.
  struct Source {
    CollapseDetector detector;
    int64_t last_step = 0;  // the step it last sent groups in
  };
  const std::map<std::string, Source>& sources() const { return sources_; }

  // The state as a JSON object, for a checkpoint's meta.json.
  std::string ToJson() const;
  // Restores ToJson's text. INVALID_ARGUMENT naming the field that is
  // missing or wrong; the state is then unchanged.
  absl::Status Restore(std::string_view json);

 private:
  std::string LabelOf(const std::string& source) const;

  RewardMonitorOptions options_;
  CollapseDetector fleet_;
  std::map<std::string, Source> sources_;
  int64_t step_ = 0;
  int active_ = 0;
};

}  // namespace asympo::learner
