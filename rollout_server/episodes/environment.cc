#include "rollout_server/episodes/environment.h"

#include <cmath>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace asympo::rollout {
namespace {

constexpr char kInvalidAnswerPayload[] = "asympo.dev/episode/invalid_answer";

}  // namespace

absl::Status InvalidAnswer(absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kInvalidAnswerPayload, absl::Cord("1"));
  return s;
}

bool IsInvalidAnswer(const absl::Status& s) {
  return s.GetPayload(kInvalidAnswerPayload).has_value();
}

absl::Status CheckReward(double reward, double max_abs_reward) {
  if (!std::isfinite(reward)) {
    return InvalidAnswer(
        absl::StrCat("Step answered done with reward ", reward, "; it must be finite"));
  }
  if (max_abs_reward > 0 && std::fabs(reward) > max_abs_reward) {
    return InvalidAnswer(absl::StrCat("Step answered done with reward ", reward,
                                      ", beyond the learner's max_abs_reward ", max_abs_reward));
  }
  return absl::OkStatus();
}

absl::Status CheckEpisodeId(const std::string& id) {
  if (!id.empty() && id.size() <= kMaxEpisodeIdBytes) return absl::OkStatus();
  return InvalidAnswer(absl::StrCat("Reset answered an episode_id of ", id.size(),
                                    " bytes; it must have 1 to ", kMaxEpisodeIdBytes));
}

}  // namespace asympo::rollout
