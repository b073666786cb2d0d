// Multi-turn episodes on a continuous engine: a group's G responses are
// episodes against an Environment (environment.h).
//
// A group starts with G Resets; as each answers, its request joins the
// engine (multi_turn: it pauses at the end of every turn). A paused turn
// goes to the environment (Step); its answer is appended to the sequence,
// which decodes its next turn from its own keys and values, or ends the
// episode with the environment's reward. Each response carries the whole
// transcript with its loss mask (inserted tokens false), the behavior
// log-probs of its generated tokens when asked for, and the versions that
// sampled its first and last generated token.
//
// Limits: at most max_turns turns and response_budget tokens (turns and
// inserted tokens) an episode; the Step of the last possible turn is
// `final` and must be answered done. A failed call (an error, a deadline),
// an answer that breaks the protocol, an environment that does not end a
// final turn: the episode ends, its group is dropped (a group is trained
// whole; asympo_rollout_groups_dropped_total{reason="environment"}) and the
// failure is counted by reason (asympo_rollout_episodes_failed_total).
// Every episode Reset answered is Closed.
//
// The generation thread drives it (not thread-safe); the environment's
// callbacks only queue their answers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "asympo/v1/rollout.pb.h"
#include "rollout_server/engine/continuous_engine.h"
#include "rollout_server/episodes/environment.h"
#include "rollout_server/episodes/episode_metrics.h"

namespace asympo::rollout {

struct EpisodeOptions {
  int32_t group_size = 8;
  // Each turn's sampling; max_new_tokens is the most tokens of one turn.
  SamplingParams sampling;
  // The most response tokens of an episode, turns and inserted together.
  int32_t response_budget = 128;
  int32_t max_turns = 8;
};

class EpisodeRunner {
 public:
  // Owns `environment`. Destroying the runner abandons its open groups
  // (Abandon), closes the episodes that Resets still out open as they
  // answer (for up to a second), and waits for its calls.
  EpisodeRunner(std::unique_ptr<Environment> environment, EpisodeOptions options,
                EpisodeMetrics* metrics);
  ~EpisodeRunner();

  // Starts a group's G episodes (their Resets go out now). `sampling`, when
  // given, replaces the options' for this group, its seed included.
  // max_abs_reward > 0: the learner's bound on rewards (BatchLimits); an
  // environment's reward beyond it fails the episode as invalid_answer
  // instead of a batch the learner would refuse whole.
  void StartGroup(const TaskPrompt& prompt, bool logprobs, std::mt19937_64& rng,
                  const SamplingParams* sampling = nullptr, double max_abs_reward = 0);
  // Takes the environment's answers (waiting up to `wait` for one when none
  // has come): adds requests to the engine, resumes or ends sequences.
  // Returns the groups every episode of which is done.
  std::vector<v1::PromptGroup> Poll(ContinuousEngine& engine, absl::Duration wait);
  // The engine's paused results: each turn goes to the environment.
  void OnTurns(ContinuousEngine& engine, std::vector<ContinuousEngine::Finished>& finished);
  // Polls and steps `engine` until every open group has ended (waiting for
  // the environment while nothing decodes); the groups completed. An error
  // of the engine's Step as it came.
  absl::StatusOr<std::vector<v1::PromptGroup>> RunToEnd(ContinuousEngine& engine);
  // Drops every open group (the engine is being replaced) and closes their
  // episodes; returns how many groups.
  int64_t Abandon();

  int64_t open_groups() const { return static_cast<int64_t>(groups_.size()); }
  // FAILED_PRECONDITION once the environment refused this daemon
  // (UNAUTHENTICATED or PERMISSION_DENIED: its token or certificate), naming
  // the flags to check; every later call would be refused the same way, so
  // the daemon stops on it. OK until then.
  const absl::Status& refused() const { return refused_; }
  // Requests not yet in the engine (their Resets are out).
  int64_t pending_resets() const { return pending_resets_; }

 private:
  struct Episode {
    std::string id;     // the environment's, once Reset answered
    uint64_t seed = 0;  // of its sampling
    uint64_t request = 0;
    bool in_engine = false;
    bool ended = false;
    uint32_t turns = 0;
    size_t turn_start = 0;  // where the current turn begins in the response
    GenerationResult result;
    double reward = 0;
    bool correct = false;
    absl::Time sent;  // when the call in flight went out
  };
  struct Group {
    TaskPrompt prompt;
    bool logprobs = false;
    std::optional<SamplingParams> sampling;  // StartGroup's, when given
    double max_abs_reward = 0;               // StartGroup's (0: only finite)
    std::vector<Episode> episodes;
    int ended = 0;
    std::string failure;  // the first failure's reason ("" while none)
  };
  struct Event {
    uint64_t group = 0;
    int index = 0;
    bool reset = false;
    absl::StatusOr<std::string> id;
    absl::StatusOr<TurnAnswer> answer;
  };

  void Push(Event e);
  // Takes the answers still to come for up to `grace`, closing each
  // episode a Reset opened; ends early once no Reset is out.
  void CloseLateResets(absl::Duration grace);
  // The answers arrived, waiting up to `wait` for one while calls are out.
  std::deque<Event> TakeEvents(absl::Duration wait);
  // One answer in: the counts of calls out go down.
  void Settle(const Event& e);
  // An answer whose group is gone (abandoned): the episode its Reset
  // opened is closed; a Step's episode was closed with its group.
  void DropAnswer(const Event& e);
  // Handles one answer; may complete its group into `done`.
  void OnReset(ContinuousEngine& engine, Event& e);
  void OnAnswer(ContinuousEngine& engine, Event& e);
  // Ends episode `index` of `group` (its sequence and its environment
  // episode); `failure` non-empty fails the group.
  void EndEpisode(ContinuousEngine& engine, uint64_t group, int index, const std::string& failure);
  // Response tokens episode `ep` may still hold (>= 0), and whether its
  // last turn (the one just paused) may be the last: the turn or token
  // limit is reached.
  int64_t TokensLeft(const Episode& ep) const;
  bool Final(const Episode& ep) const;
  // The group as the learner takes it, once every episode ended.
  v1::PromptGroup Assemble(const Group& g);
  // Moves finished groups to `done` (dropping failed ones).
  void Collect(std::vector<v1::PromptGroup>* done);

  // Fails the episode of `e` on a call's error status, by its reason.
  void CallFailed(ContinuousEngine& engine, const Event& e, const char* call,
                  const absl::Status& status);

  const EpisodeOptions options_;
  EpisodeMetrics* metrics_;
  std::map<uint64_t, Group> groups_;
  std::map<uint64_t, std::pair<uint64_t, int>> by_request_;  // engine id -> (group, index)
  uint64_t next_group_ = 0;
  int64_t pending_resets_ = 0;
  int64_t pending_ = 0;  // calls whose answers have not been taken
  absl::Status refused_;

  std::mutex mu_;
  std::condition_variable arrived_;
  std::deque<Event> events_;
  // Last: destroyed first, waiting for its callbacks (which use the queue).
  std::unique_ptr<Environment> environment_;
};

// Each request as one episode against `environment` on `model` (its own
// sampling parameters and seed; multi_turn and response_budget are set
// here: the budget is params.max_new_tokens, the turn limit `max_turns`):
// the transcripts, in request order, with their loss masks. For
// evaluations (asympo-eval, rollout_server/evaluation.h).
absl::StatusOr<std::vector<GenerationResult>> RunRequestEpisodes(
    const PolicyModel& model, std::unique_ptr<Environment> environment,
    const std::vector<GenerationRequest>& requests, int32_t max_turns);

}  // namespace asympo::rollout
