// RunRequestEpisodes (episode_runner.h): one episode per request, for
// evaluations.
#include <map>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rollout_server/episodes/episode_runner.h"

namespace asympo::rollout {

absl::StatusOr<std::vector<GenerationResult>> RunRequestEpisodes(
    const PolicyModel& model, std::unique_ptr<Environment> environment,
    const std::vector<GenerationRequest>& requests, int32_t max_turns) {
  LocalEpisodeMetrics metrics;
  EpisodeOptions eo;
  eo.group_size = 1;
  eo.max_turns = max_turns;
  int32_t budget = 1;
  for (const GenerationRequest& r : requests) budget = std::max(budget, r.params.max_new_tokens);
  eo.response_budget = budget;
  EpisodeRunner runner(std::move(environment), eo, metrics.get());
  ContinuousOptions o;
  o.max_running_sequences = 64;
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<ContinuousEngine> engine,
                          ContinuousEngine::Create(&model, 0, o));
  std::mt19937_64 rng(0);  // the environment's seeds
  for (size_t i = 0; i < requests.size(); ++i) {
    TaskPrompt p;
    p.prompt_id = std::to_string(i);
    p.prompt_tokens = requests[i].prompt;
    runner.StartGroup(p, requests[i].params.return_logprobs, rng, &requests[i].params);
  }
  ASYMPO_ASSIGN_OR_RETURN(const std::vector<v1::PromptGroup> groups, runner.RunToEnd(*engine));
  std::vector<GenerationResult> out(requests.size());
  size_t done = 0;
  for (const v1::PromptGroup& g : groups) {
    size_t i = 0;
    if (!absl::SimpleAtoi(g.prompt_id(), &i) || i >= out.size()) continue;
    const v1::Response& r = g.responses(0);
    GenerationResult& result = out[i];
    result.tokens.assign(r.tokens().begin(), r.tokens().end());
    result.loss_mask.assign(r.loss_mask().begin(), r.loss_mask().end());
    result.logprobs.assign(r.behavior_logprobs().begin(), r.behavior_logprobs().end());
    result.finish_reason = r.finish_reason();
    ++done;
  }
  if (done < requests.size()) {
    return absl::UnavailableError(absl::StrCat(
        requests.size() - done, " of ", requests.size(),
        " episodes failed against the environment (asympo_rollout_episodes_failed_total)"));
  }
  return out;
}

}  // namespace asympo::rollout
