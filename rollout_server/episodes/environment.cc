#include "rollout_server/episodes/environment.h"

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

absl::Status CheckEpisodeId(const std::string& id) {
  if (!id.empty() && id.size() <= kMaxEpisodeIdBytes) return absl::OkStatus();
  return InvalidAnswer(absl::StrCat("Reset answered an episode_id of ", id.size(),
                                    " bytes; it must have 1 to ", kMaxEpisodeIdBytes));
}

}  // namespace asympo::rollout
