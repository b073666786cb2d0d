// The rollout daemon's multi-turn loop (rollout_daemon.h): groups of
// episodes against an environment (rollout_server/episodes/) on a
// continuous engine, weights adopted between decode steps as RunContinuous
// does.
#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rollout_server/episodes/episode_runner.h"
#include "rollout_server/rollout_daemon.h"

namespace asympo::rollout {
namespace {

// How long the loop waits for the environment when no sequence decodes.
constexpr absl::Duration kEnvironmentWait = absl::Milliseconds(50);

}  // namespace

ContinuousOptions RolloutDaemon::EngineOptions() const {
  ContinuousOptions co = options_.continuous;
  co.pad_token_id = options_.generation.pad_token_id;
  co.cuda_graphs = options_.generation.cuda_graphs;
  if (co.response_capacity == 0) co.response_capacity = sampling_.max_new_tokens;
  return co;
}

absl::Status RolloutDaemon::SetUpEnvironment(prometheus::Registry& registry) {
  if (options_.environment.empty()) {
    environment_ = CreateBuiltinEnvironment(task_.get());
  } else {
    RemoteEnvironmentOptions ro;
    ro.address = options_.environment;
    ro.tls = options_.environment_tls;
    ro.source = options_.rollout_id;
    ro.timeout = options_.environment_timeout;
    ASYMPO_ASSIGN_OR_RETURN(environment_, CreateRemoteEnvironment(ro, registry));
  }
  if (environment_ == nullptr) return absl::OkStatus();
  if (!options_.continuous_batching) {
    return absl::InvalidArgumentError(
        absl::StrCat("--task=", std::string(task_->name()),
                     " runs multi-turn episodes, which need --batching=continuous"));
  }
  if (options_.max_turn_tokens > sampling_.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_turn_tokens=", options_.max_turn_tokens, " exceeds the response budget ",
        sampling_.max_new_tokens, " (--max_new_tokens, or the task's default)"));
  }
  GenerationCounters counters;
  counters.tokens = &metrics_->tokens;
  counters.responses = &metrics_->responses;
  counters.reward_sum = &metrics_->reward_sum;
  counters.correct = &metrics_->correct;
  counters.groups = &metrics_->groups_generated;
  counters.dropped = &submit_metrics_->dropped;
  episode_metrics_ = std::make_unique<EpisodeMetrics>(registry, counters);
  LOG(INFO) << options_.rollout_id << ": multi-turn episodes against " << environment_->name()
            << ", at most " << options_.max_turns << " turns and " << sampling_.max_new_tokens
            << " response tokens each";
  return absl::OkStatus();
}

absl::Status RolloutDaemon::RunEpisodes(int64_t* generated) {
  if (!WaitForFirstSnapshot()) return absl::OkStatus();
  const ContinuousOptions co = EngineOptions();
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<ContinuousEngine> engine, NewEngine(co));
  EpisodeOptions eo;
  eo.group_size = options_.group_size;
  eo.sampling = sampling_;
  eo.response_budget = sampling_.max_new_tokens;
  if (options_.max_turn_tokens > 0) eo.sampling.max_new_tokens = options_.max_turn_tokens;
  eo.max_turns = options_.max_turns;
  EpisodeRunner runner(std::move(environment_), eo, episode_metrics_.get());
  const int64_t target = co.max_running_sequences + options_.group_size;
  while (!stopping_.load() && !submit_->stopping()) {
    const WeightUpdate update = UpdateWeights(*engine);
    if (update == WeightUpdate::kNewer) engine->SetModel(&policy_->active(), policy_->version());
    if (update == WeightUpdate::kRewound) {
      ASYMPO_RETURN_IF_ERROR(Rewind(co, runner.Abandon(), &engine));
    }
    const bool draining = update == WeightUpdate::kDrain;
    while (!draining && engine->running() + engine->waiting() + runner.pending_resets() < target &&
           (options_.max_groups == 0 || *generated + runner.open_groups() < options_.max_groups)) {
      std::optional<v1::LearnerStatus> status = submit_->RoomNow(runner.open_groups() + 1);
      if (!status.has_value()) break;
      runner.StartGroup(task_->NextPrompt(rng_), status->wants_behavior_logprobs(), rng_,
                        /*sampling=*/nullptr, status->limits().max_abs_reward());
    }
    for (v1::PromptGroup& g :
         runner.Poll(*engine, engine->can_decode() ? absl::ZeroDuration() : kEnvironmentWait)) {
      submit_->Add({std::move(g)});
      ++*generated;
    }
    if (!runner.refused().ok()) return runner.refused();
    if (runner.open_groups() == 0 && engine->idle()) {
      if (options_.max_groups > 0 && *generated >= options_.max_groups) break;
      if (draining) continue;
      if (!WaitForRoom(1).has_value()) break;
      continue;
    }
    if (!engine->can_decode()) continue;
    absl::StatusOr<std::vector<ContinuousEngine::Finished>> finished = engine->Step();
    if (!finished.ok()) {
      runner.Abandon();
      return absl::Status(finished.status().code(),
                          absl::StrCat("generation failed: ", finished.status().message()));
    }
    runner.OnTurns(*engine, *finished);
  }
  runner.Abandon();
  return absl::OkStatus();
}

}  // namespace asympo::rollout
