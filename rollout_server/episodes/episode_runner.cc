#include "rollout_server/episodes/episode_runner.h"

#include <algorithm>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log_throttle.h"
#include "common/status_macros.h"

namespace asympo::rollout {
namespace {

// The failure reason of a call's status.
std::string ReasonOf(const absl::Status& s) {
  if (IsInvalidAnswer(s)) return "invalid_answer";
  if (absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s)) return "refused";
  if (absl::IsDeadlineExceeded(s)) return "deadline";
  if (absl::IsUnavailable(s)) return "unavailable";
  return "error";
}

// How long RunToEnd waits for the environment when nothing decodes.
constexpr absl::Duration kEnvironmentWait = absl::Milliseconds(50);
// How long a runner being destroyed waits for the Resets still out, to
// close the episodes they open; the environment then cancels the rest.
constexpr absl::Duration kLateResetGrace = absl::Seconds(1);

LogThrottle& FailureLog() {
  static LogThrottle* throttle = new LogThrottle();
  return *throttle;
}

}  // namespace

EpisodeRunner::EpisodeRunner(std::unique_ptr<Environment> environment, EpisodeOptions options,
                             EpisodeMetrics* metrics)
    : options_(std::move(options)), metrics_(metrics), environment_(std::move(environment)) {}

EpisodeRunner::~EpisodeRunner() {
  Abandon();
  CloseLateResets(kLateResetGrace);
  environment_.reset();
}

void EpisodeRunner::CloseLateResets(absl::Duration grace) {
  const absl::Time until = absl::Now() + grace;
  while (pending_resets_ > 0) {
    std::deque<Event> events = TakeEvents(until - absl::Now());
    if (events.empty()) return;  // the grace is over
    for (const Event& e : events) {
      Settle(e);
      DropAnswer(e);  // Abandon left no group
    }
  }
}

std::deque<EpisodeRunner::Event> EpisodeRunner::TakeEvents(absl::Duration wait) {
  std::deque<Event> events;
  std::unique_lock<std::mutex> lock(mu_);
  if (events_.empty() && pending_ > 0 && wait > absl::ZeroDuration()) {
    arrived_.wait_for(lock, absl::ToChronoMilliseconds(wait), [this] { return !events_.empty(); });
  }
  events.swap(events_);
  return events;
}

void EpisodeRunner::Settle(const Event& e) {
  --pending_;
  if (e.reset) --pending_resets_;
}

void EpisodeRunner::DropAnswer(const Event& e) {
  if (e.reset && e.id.ok() && CheckEpisodeId(*e.id).ok()) environment_->Close(*e.id);
}

void EpisodeRunner::Push(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
  arrived_.notify_one();
}

void EpisodeRunner::StartGroup(const TaskPrompt& prompt, bool logprobs, std::mt19937_64& rng,
                               const SamplingParams* sampling, double max_abs_reward) {
  const uint64_t key = next_group_++;
  Group& g = groups_[key];
  g.prompt = prompt;
  g.logprobs = logprobs;
  g.max_abs_reward = max_abs_reward;
  if (sampling != nullptr) g.sampling = *sampling;
  g.episodes.resize(static_cast<size_t>(options_.group_size));
  for (int i = 0; i < options_.group_size; ++i) {
    Episode& ep = g.episodes[static_cast<size_t>(i)];
    ep.seed = rng();
    ep.sent = absl::Now();
    ++pending_resets_;
    ++pending_;
    environment_->Reset(prompt, static_cast<uint32_t>(i), rng(),
                        [this, key, i](absl::StatusOr<std::string> id) {
                          Event e{key, i, true, std::move(id), TurnAnswer()};
                          Push(std::move(e));
                        });
  }
}

std::vector<v1::PromptGroup> EpisodeRunner::Poll(ContinuousEngine& engine, absl::Duration wait) {
  for (Event& e : TakeEvents(wait)) {
    Settle(e);
    if (groups_.find(e.group) == groups_.end()) {  // abandoned meanwhile
      DropAnswer(e);
      continue;
    }
    if (e.reset) {
      OnReset(engine, e);
    } else {
      OnAnswer(engine, e);
    }
  }
  std::vector<v1::PromptGroup> done;
  Collect(&done);
  return done;
}

absl::StatusOr<std::vector<v1::PromptGroup>> EpisodeRunner::RunToEnd(ContinuousEngine& engine) {
  std::vector<v1::PromptGroup> done;
  while (open_groups() > 0) {
    for (v1::PromptGroup& g :
         Poll(engine, engine.can_decode() ? absl::ZeroDuration() : kEnvironmentWait)) {
      done.push_back(std::move(g));
    }
    if (!engine.can_decode()) continue;
    ASYMPO_ASSIGN_OR_RETURN(std::vector<ContinuousEngine::Finished> finished, engine.Step());
    OnTurns(engine, finished);
  }
  return done;
}

void EpisodeRunner::OnReset(ContinuousEngine& engine, Event& e) {
  Group& g = groups_[e.group];
  Episode& ep = g.episodes[static_cast<size_t>(e.index)];
  metrics_->reset_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - ep.sent));
  if (!e.id.ok()) {
    CallFailed(engine, e, "Reset", e.id.status());
    return;
  }
  if (const absl::Status bad = CheckEpisodeId(*e.id); !bad.ok()) {
    // Never sent back: it names no episode this daemon can close.
    EndEpisode(engine, e.group, e.index, absl::StrCat("invalid_answer: ", bad.message()));
    return;
  }
  ep.id = *e.id;
  if (!g.failure.empty()) {
    EndEpisode(engine, e.group, e.index, "");
    return;
  }
  GenerationRequest r{g.prompt.prompt_tokens, g.sampling.value_or(options_.sampling)};
  if (!g.sampling.has_value()) r.params.seed = ep.seed;
  r.params.return_logprobs = g.logprobs;
  r.multi_turn = true;
  r.response_budget = options_.response_budget;
  absl::StatusOr<uint64_t> id = engine.Add(std::move(r));
  if (!id.ok()) {
    EndEpisode(engine, e.group, e.index, absl::StrCat("error: ", id.status().message()));
    return;
  }
  ep.request = *id;
  ep.in_engine = true;
  by_request_[*id] = {e.group, e.index};
}

void EpisodeRunner::OnTurns(ContinuousEngine& engine,
                            std::vector<ContinuousEngine::Finished>& finished) {
  for (ContinuousEngine::Finished& f : finished) {
    auto where = by_request_.find(f.id);
    if (where == by_request_.end()) continue;
    const auto [key, index] = where->second;
    Group& g = groups_[key];
    Episode& ep = g.episodes[static_cast<size_t>(index)];
    ep.result = std::move(f.result);
    ++ep.turns;
    if (!g.failure.empty()) {
      EndEpisode(engine, key, index, "");
      continue;
    }
    Turn turn;
    turn.tokens.assign(ep.result.tokens.begin() + static_cast<ptrdiff_t>(ep.turn_start),
                       ep.result.tokens.end());
    turn.index = ep.turns - 1;
    turn.finish_reason = ep.result.finish_reason;
    turn.tokens_left = static_cast<uint32_t>(TokensLeft(ep));
    turn.final = Final(ep);
    ep.sent = absl::Now();
    ++pending_;
    environment_->Step(ep.id, turn, [this, key = key, index = index](absl::StatusOr<TurnAnswer> a) {
      Event e{key, index, false, std::string(), std::move(a)};
      Push(std::move(e));
    });
  }
}

void EpisodeRunner::OnAnswer(ContinuousEngine& engine, Event& e) {
  Group& g = groups_[e.group];
  Episode& ep = g.episodes[static_cast<size_t>(e.index)];
  metrics_->step_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - ep.sent));
  if (!g.failure.empty()) {
    EndEpisode(engine, e.group, e.index, "");
    return;
  }
  if (!e.answer.ok()) {
    CallFailed(engine, e, "Step", e.answer.status());
    return;
  }
  const TurnAnswer& a = *e.answer;
  if (a.done) {
    if (const absl::Status bad = CheckReward(a.reward, g.max_abs_reward); !bad.ok()) {
      EndEpisode(engine, e.group, e.index, absl::StrCat("invalid_answer: ", bad.message()));
      return;
    }
    ep.reward = a.reward;
    ep.correct = a.correct;
    metrics_->episodes.Increment();
    metrics_->turns.Observe(ep.turns);
    EndEpisode(engine, e.group, e.index, "");
    return;
  }
  if (Final(ep)) {
    EndEpisode(engine, e.group, e.index,
               absl::StrCat("not_done: turn ", ep.turns, " was final but the answer is not done"));
    return;
  }
  const absl::Status resumed =
      engine.Resume(ep.request, a.append, options_.sampling.max_new_tokens);
  if (!resumed.ok()) {
    const bool overlong = absl::StrContains(resumed.message(), "budget");
    EndEpisode(engine, e.group, e.index,
               absl::StrCat(overlong ? "overlong" : "invalid_answer", ": ", resumed.message()));
    return;
  }
  metrics_->inserted_tokens.Increment(static_cast<double>(a.append.size()));
  ep.turn_start = ep.result.tokens.size() + a.append.size();
}

void EpisodeRunner::CallFailed(ContinuousEngine& engine, const Event& e, const char* call,
                               const absl::Status& status) {
  const std::string reason = ReasonOf(status);
  // The remote environment's messages name their call already.
  const std::string what = absl::StartsWith(status.message(), absl::StrCat(call, ":"))
                               ? std::string(status.message())
                               : absl::StrCat(call, ": ", status.message());
  if (reason == "refused" && refused_.ok()) {
    refused_ = absl::FailedPreconditionError(
        absl::StrCat("the environment at ", environment_->name(), " refused this daemon (",
                     absl::StatusCodeToString(status.code()), ": ", what,
                     "): check --environment_token_file and --environment_tls_*"));
  }
  EndEpisode(engine, e.group, e.index, absl::StrCat(reason, ": ", what));
}

int64_t EpisodeRunner::TokensLeft(const Episode& ep) const {
  return std::max<int64_t>(options_.response_budget - static_cast<int64_t>(ep.result.tokens.size()),
                           0);
}

bool EpisodeRunner::Final(const Episode& ep) const {
  return static_cast<int32_t>(ep.turns) >= options_.max_turns || TokensLeft(ep) == 0;
}

void EpisodeRunner::EndEpisode(ContinuousEngine& engine, uint64_t key, int index,
                               const std::string& failure) {
  Group& g = groups_[key];
  Episode& ep = g.episodes[static_cast<size_t>(index)];
  if (ep.ended) return;
  ep.ended = true;
  ++g.ended;
  if (ep.in_engine) {
    engine.End(ep.request).IgnoreError();  // not paused: the engine was replaced
    by_request_.erase(ep.request);
    ep.in_engine = false;
  }
  if (!ep.id.empty()) environment_->Close(ep.id);
  if (failure.empty()) return;
  const std::string reason = failure.substr(0, failure.find(':'));
  metrics_->Failed(reason);
  int64_t held_back = 0;
  if (FailureLog().Allow(&held_back)) {
    LOG(WARNING) << "episode " << index << " of prompt " << g.prompt.prompt_id << " against "
                 << environment_->name() << " failed (" << failure << "); its group is dropped"
                 << FailureLog().HeldBack(held_back);
  }
  if (g.failure.empty()) {
    g.failure = reason;
    // The group's other episodes end as their calls come back or their
    // sequences pause.
  }
}

void EpisodeRunner::Collect(std::vector<v1::PromptGroup>* done) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    const Group& g = it->second;
    if (g.ended < static_cast<int>(g.episodes.size())) {
      ++it;
      continue;
    }
    if (g.failure.empty()) {
      done->push_back(Assemble(g));
    } else {
      metrics_->dropped.Increment();
    }
    it = groups_.erase(it);
  }
}

v1::PromptGroup EpisodeRunner::Assemble(const Group& g) {
  v1::PromptGroup group;
  group.set_prompt_id(g.prompt.prompt_id);
  group.mutable_prompt_tokens()->Assign(g.prompt.prompt_tokens.begin(),
                                        g.prompt.prompt_tokens.end());
  const GenerationCounters& m = metrics_->generation;
  for (const Episode& ep : g.episodes) {
    const GenerationResult& r = ep.result;
    v1::Response* resp = group.add_responses();
    resp->mutable_tokens()->Assign(r.tokens.begin(), r.tokens.end());
    if (!r.loss_mask.empty()) {
      for (bool b : r.loss_mask) resp->add_loss_mask(b);
    }
    resp->set_reward(static_cast<float>(ep.reward));
    resp->set_finish_reason(r.finish_reason);
    resp->set_first_policy_version(r.first_version);
    resp->set_last_policy_version(r.last_version);
    if (g.logprobs) resp->mutable_behavior_logprobs()->Assign(r.logprobs.begin(), r.logprobs.end());
    const int64_t generated = r.loss_mask.empty()
                                  ? static_cast<int64_t>(r.tokens.size())
                                  : std::count(r.loss_mask.begin(), r.loss_mask.end(), true);
    m.tokens->Increment(static_cast<double>(generated));
    m.responses->Increment();
    m.reward_sum->Increment(std::max(0.0, ep.reward));
    if (ep.correct) m.correct->Increment();
  }
  m.groups->Increment();
  return group;
}

int64_t EpisodeRunner::Abandon() {
  const int64_t n = static_cast<int64_t>(groups_.size());
  for (auto& [key, g] : groups_) {
    for (Episode& ep : g.episodes) {
      if (!ep.ended && !ep.id.empty()) environment_->Close(ep.id);
    }
  }
  groups_.clear();
  by_request_.clear();
  return n;
}

}  // namespace asympo::rollout
