#include "rollout_server/rollout_daemon.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/listener/host_port.h"
#include "common/model/model_io.h"
#include "common/status_macros.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace asympo::rollout {
namespace {

// Whether this daemon's settings suit the learner's limits; an error names
// the flag to change (the learner will never accept otherwise).
absl::Status CheckAgainstLimits(const v1::LearnerStatus& s, int64_t vocab_size, int32_t group_size,
                                int32_t max_new_tokens) {
  const v1::BatchLimits& l = s.limits();
  if (l.vocab_size() != 0 && l.vocab_size() != vocab_size) {
    return absl::FailedPreconditionError(absl::StrCat("the learner's vocabulary has ",
                                                      l.vocab_size(), " ids but this model's has ",
                                                      vocab_size, ": they run different models"));
  }
  if (l.max_group_size() != 0 &&
      (group_size < l.min_group_size() || group_size > l.max_group_size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("--group_size=", group_size, " is outside the learner's bounds [",
                     l.min_group_size(), ", ", l.max_group_size(), "]"));
  }
  if (l.max_response_tokens() != 0 && max_new_tokens > l.max_response_tokens()) {
    return absl::FailedPreconditionError(absl::StrCat("--max_new_tokens=", max_new_tokens,
                                                      " exceeds the learner's max_response_tokens ",
                                                      l.max_response_tokens()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRolloutDaemonOptions(const RolloutDaemonOptions& o) {
  ASYMPO_RETURN_IF_ERROR(CheckAddressFlag("learner", o.learner_address));
  if (o.group_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--group_size=", o.group_size, ": a group needs at least 2 responses"));
  }
  if (o.prompts_per_generation <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompts_per_generation=", o.prompts_per_generation, ": it must be > 0"));
  }
  if (o.max_groups_per_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_groups_per_batch=", o.max_groups_per_batch, ": it must be positive"));
  }
  if (o.continuous_batching) ASYMPO_RETURN_IF_ERROR(ValidateContinuousOptions(o.continuous));
  if (!o.continuous_batching && o.max_buffered_groups < o.prompts_per_generation) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_buffered_groups=", o.max_buffered_groups, " is below --prompts_per_generation=",
        o.prompts_per_generation, ": a static batch could never be buffered"));
  }
  if (o.min_backoff <= absl::ZeroDuration() || o.max_backoff < o.min_backoff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min_backoff=", absl::FormatDuration(o.min_backoff), " and --max_backoff=",
        absl::FormatDuration(o.max_backoff), ": need 0 < --min_backoff <= --max_backoff"));
  }
  if (!o.environment.empty()) {
    ASYMPO_RETURN_IF_ERROR(CheckAddressFlag("environment", o.environment));
    if (!o.continuous_batching) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--environment=", o.environment, ": multi-turn episodes need --batching=continuous"));
    }
  }
  if (o.max_turns < 1 || o.max_turn_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max_turns=", o.max_turns,
                                                   " and --max_turn_tokens=", o.max_turn_tokens,
                                                   ": need --max_turns >= 1 and "
                                                   "--max_turn_tokens >= 0"));
  }
  if (o.rollout_id.empty() || o.rollout_id.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat("--id=", o.rollout_id.substr(0, 130),
                                                   ": it must have 1 to 128 bytes (has ",
                                                   o.rollout_id.size(), ")"));
  }
  return CheckTaskFlag(o.task.name);
}

RolloutDaemon::RolloutDaemon(RolloutDaemonOptions options) : options_(std::move(options)) {}

// The members stop themselves: the submit client (declared last) drains and
// joins its thread, then the receiver stops.
RolloutDaemon::~RolloutDaemon() = default;

void RolloutDaemon::Shutdown() {
  stopping_ = true;
  if (submit_) submit_->Shutdown();
}

absl::Status RolloutDaemon::SetUpTask(int64_t vocab_size) {
  TaskOptions to = options_.task;
  to.vocab_size = vocab_size;
  ASYMPO_ASSIGN_OR_RETURN(task_, CreateTask(to));
  sampling_ = options_.sampling;
  sampling_.stop_token_ids = task_->stop_token_ids();
  ASYMPO_RETURN_IF_ERROR(
      CheckTokenIds(options_.turn_stop_token_ids, vocab_size, "--turn_stop_ids:"));
  sampling_.stop_token_ids.insert(sampling_.stop_token_ids.end(),
                                  options_.turn_stop_token_ids.begin(),
                                  options_.turn_stop_token_ids.end());
  if (sampling_.max_new_tokens <= 0) sampling_.max_new_tokens = task_->max_new_tokens();
  ASYMPO_RETURN_IF_ERROR(ValidateSamplingParams(sampling_));
  rng_.seed(options_.seed);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RolloutDaemon>> RolloutDaemon::Create(
    RolloutDaemonOptions o, prometheus::Registry& registry) {
  ASYMPO_RETURN_IF_ERROR(ValidateRolloutDaemonOptions(o));
  std::unique_ptr<RolloutDaemon> d(new RolloutDaemon(o));
  // Two copies of the model: the active one and the spare (double buffering).
  std::unique_ptr<PolicyModel> models[2];
  for (auto& m : models) {
    ASYMPO_ASSIGN_OR_RETURN(m,
                            CreateOrLoadPolicyModel(o.model, o.tiny_vocab_size, o.model_options));
  }
  const ModelConfig config = models[0]->config();
  ASYMPO_RETURN_IF_ERROR(d->SetUpTask(config.vocab_size));
  d->metrics_ = std::make_unique<RolloutMetrics>(registry);
  d->submit_metrics_ = std::make_unique<SubmitMetrics>(registry);

  broadcast::WeightReceiverOptions ro;
  ro.target = o.learner_address;
  ro.tls = o.tls;
  ro.receiver_id = o.rollout_id;
  ro.model_signature = broadcast::ModelSignatureOf(*models[0]);
  ro.max_chunk_bytes = o.weight_chunk_bytes;
  ro.prefer_nccl = o.weight_transport_nccl;
  ro.deltas = o.weight_deltas;
  ro.nccl_device = o.cuda_device;
  ro.min_backoff = o.min_backoff;
  ro.max_backoff = o.max_backoff;
  ASYMPO_ASSIGN_OR_RETURN(d->receiver_, broadcast::WeightReceiver::Start(ro, registry));
  d->policy_ = std::make_unique<DoubleBufferedPolicy>(std::move(models[0]), std::move(models[1]),
                                                      d->receiver_.get(), &d->metrics_->flips);

  SubmitClientOptions so;
  so.learner_address = o.learner_address;
  so.tls = o.tls;
  so.source = o.rollout_id;
  so.max_buffered_groups = o.max_buffered_groups;
  so.max_groups_per_batch = o.max_groups_per_batch;
  so.min_backoff = o.min_backoff;
  so.max_backoff = o.max_backoff;
  so.submit_timeout = o.submit_timeout;
  so.drain_timeout = o.drain_timeout;
  so.check_status = [vocab = config.vocab_size, g = o.group_size,
                     tokens = d->sampling_.max_new_tokens](const v1::LearnerStatus& s) {
    return CheckAgainstLimits(s, vocab, g, tokens);
  };
  ASYMPO_RETURN_IF_ERROR(d->SetUpEnvironment(registry));
  ASYMPO_ASSIGN_OR_RETURN(d->submit_, SubmitClient::Start(so, d->submit_metrics_.get()));
  LOG(INFO) << o.rollout_id << ": task " << d->task_->name() << ", model " << o.model << " ("
            << config.NumParameters() << " parameters), G=" << o.group_size << ", max_new_tokens "
            << d->sampling_.max_new_tokens << ", learner " << o.learner_address;
  return d;
}

std::optional<v1::LearnerStatus> RolloutDaemon::WaitForRoom(int64_t groups) {
  const absl::Time t0 = absl::Now();
  metrics_->blocked.Set(1);
  std::optional<v1::LearnerStatus> status = submit_->WaitForRoom(groups);
  metrics_->blocked.Set(0);
  metrics_->blocked_seconds.Increment(absl::ToDoubleSeconds(absl::Now() - t0));
  return status;
}

absl::StatusOr<std::vector<v1::PromptGroup>> RolloutDaemon::GenerateGroups(bool with_logprobs) {
  const int g_size = options_.group_size;
  std::vector<TaskPrompt> prompts;
  std::vector<GenerationRequest> requests;
  for (int p = 0; p < options_.prompts_per_generation; ++p) {
    prompts.push_back(task_->NextPrompt(rng_));
    for (int g = 0; g < g_size; ++g) {
      GenerationRequest r;
      r.prompt = prompts.back().prompt_tokens;
      r.params = sampling_;
      r.params.seed = rng_();
      r.params.return_logprobs = with_logprobs;
      requests.push_back(std::move(r));
    }
  }
  const absl::Time t0 = absl::Now();
  GenerationEngine engine(&policy_->active(), options_.generation);
  absl::StatusOr<std::vector<GenerationResult>> results = engine.Generate(requests);
  if (!results.ok()) {
    return absl::Status(results.status().code(),
                        absl::StrCat("generation failed: ", results.status().message()));
  }
  metrics_->generation_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - t0));
  std::vector<v1::PromptGroup> groups;
  const uint64_t version = policy_->version();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto first = results->begin() + static_cast<ptrdiff_t>(p * static_cast<size_t>(g_size));
    std::vector<GenerationResult> group(std::make_move_iterator(first),
                                        std::make_move_iterator(first + g_size));
    for (GenerationResult& r : group) r.first_version = r.last_version = version;
    groups.push_back(ScoreGroup(prompts[p], group, with_logprobs));
  }
  return groups;
}

v1::PromptGroup RolloutDaemon::ScoreGroup(const TaskPrompt& prompt,
                                          std::vector<GenerationResult>& results,
                                          bool with_logprobs) {
  v1::PromptGroup group;
  group.set_prompt_id(prompt.prompt_id);
  group.mutable_prompt_tokens()->Assign(prompt.prompt_tokens.begin(), prompt.prompt_tokens.end());
  for (GenerationResult& r : results) {
    const TaskScore score = task_->Score(prompt, r.tokens);
    v1::Response* resp = group.add_responses();
    resp->mutable_tokens()->Assign(r.tokens.begin(), r.tokens.end());
    resp->set_reward(static_cast<float>(score.reward));
    resp->set_finish_reason(r.finish_reason);
    resp->set_first_policy_version(r.first_version);
    resp->set_last_policy_version(r.last_version);
    if (with_logprobs) {
      resp->mutable_behavior_logprobs()->Assign(r.logprobs.begin(), r.logprobs.end());
    }
    metrics_->tokens.Increment(static_cast<double>(r.tokens.size()));
    metrics_->responses.Increment();
    metrics_->reward_sum.Increment(std::max(0.0, score.reward));
    if (score.correct) metrics_->correct.Increment();
  }
  metrics_->groups_generated.Increment();
  return group;
}

absl::Status RolloutDaemon::RunStatic(int64_t* generated) {
  while (!stopping_.load() && !submit_->stopping()) {
    if (!policy_->Refresh(absl::Milliseconds(200))) continue;  // no snapshot yet
    std::optional<v1::LearnerStatus> status = WaitForRoom(options_.prompts_per_generation);
    if (!status.has_value()) break;
    ASYMPO_ASSIGN_OR_RETURN(std::vector<v1::PromptGroup> groups,
                            GenerateGroups(status->wants_behavior_logprobs()));
    *generated += static_cast<int64_t>(groups.size());
    submit_->Add(std::move(groups));
    if (options_.max_groups > 0 && *generated >= options_.max_groups) break;
  }
  return absl::OkStatus();
}

RolloutDaemon::WeightUpdate RolloutDaemon::UpdateWeights(const ContinuousEngine& engine) {
  if (!options_.inflight_weight_updates && !policy_->pending()) return WeightUpdate::kNone;
  if (!options_.inflight_weight_updates && engine.running() > 0) return WeightUpdate::kDrain;
  policy_->Refresh(absl::ZeroDuration());
  if (policy_->loads() == engine_loads_) return WeightUpdate::kNone;
  engine_loads_ = policy_->loads();
  // Not higher: the learner restarted, from an older checkpoint or with
  // other weights under the same number (another incarnation). The
  // versions above it are lost, and a response begun under one would carry
  // a last version below its first: the learner refuses both.
  return policy_->version() > engine.version() ? WeightUpdate::kNewer : WeightUpdate::kRewound;
}

absl::StatusOr<std::unique_ptr<ContinuousEngine>> RolloutDaemon::NewEngine(
    const ContinuousOptions& o) {
  engine_loads_ = policy_->loads();
  return ContinuousEngine::Create(&policy_->active(), policy_->version(), o);
}

bool RolloutDaemon::WaitForFirstSnapshot() {
  while (!policy_->Refresh(absl::Milliseconds(200))) {  // no snapshot yet
    if (stopping_.load() || submit_->stopping()) return false;
  }
  return true;
}

absl::Status RolloutDaemon::Rewind(const ContinuousOptions& o, int64_t dropped,
                                   std::unique_ptr<ContinuousEngine>* engine) {
  LOG(WARNING) << options_.rollout_id << ": the learner's weights went back from version "
               << (*engine)->version() << " to " << policy_->version()
               << " (a restarted learner); dropping the " << dropped << " groups being sampled";
  submit_metrics_->dropped_rewound.Increment(static_cast<double>(dropped));
  ASYMPO_ASSIGN_OR_RETURN(*engine, NewEngine(o));
  return absl::OkStatus();
}

absl::Status RolloutDaemon::RunContinuous(int64_t* generated) {
  if (!WaitForFirstSnapshot()) return absl::OkStatus();
  const ContinuousOptions co = EngineOptions();
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<ContinuousEngine> engine, NewEngine(co));
  // The groups in the engine, by the id of their first request.
  struct Open {
    TaskPrompt prompt;
    std::vector<GenerationResult> results;
    int finished = 0;
    bool logprobs = false;
    absl::Time started;
  };
  std::map<uint64_t, Open> open;
  const int g_size = options_.group_size;
  // Enough requests wait to refill every slot that frees at one step.
  const int64_t target = co.max_running_sequences + g_size;
  while (!stopping_.load() && !submit_->stopping()) {
    const WeightUpdate update = UpdateWeights(*engine);
    if (update == WeightUpdate::kNewer) engine->SetModel(&policy_->active(), policy_->version());
    if (update == WeightUpdate::kRewound) {
      ASYMPO_RETURN_IF_ERROR(Rewind(co, static_cast<int64_t>(open.size()), &engine));
      open.clear();
    }
    const bool draining = update == WeightUpdate::kDrain;
    while (!draining && engine->running() + engine->waiting() < target &&
           (options_.max_groups == 0 ||
            *generated + static_cast<int64_t>(open.size()) < options_.max_groups)) {
      // Room in the submit buffer for every group the engine holds.
      std::optional<v1::LearnerStatus> status =
          submit_->RoomNow(static_cast<int64_t>(open.size()) + 1);
      if (!status.has_value()) break;
      Open group{task_->NextPrompt(rng_), std::vector<GenerationResult>(g_size), 0,
                 status->wants_behavior_logprobs(), absl::Now()};
      uint64_t first = 0;
      for (int g = 0; g < g_size; ++g) {
        GenerationRequest r{group.prompt.prompt_tokens, sampling_};
        r.params.seed = rng_();
        r.params.return_logprobs = group.logprobs;
        ASYMPO_ASSIGN_OR_RETURN(const uint64_t id, engine->Add(std::move(r)));
        if (g == 0) first = id;
      }
      open.emplace(first, std::move(group));
    }
    if (engine->idle()) {
      if (options_.max_groups > 0 && *generated >= options_.max_groups) break;
      if (draining) continue;  // UpdateWeights adopts it now
      // Nothing runs and the buffer is full: wait for room.
      if (!WaitForRoom(1).has_value()) break;
      continue;
    }
    absl::StatusOr<std::vector<ContinuousEngine::Finished>> finished = engine->Step();
    if (!finished.ok()) {
      return absl::Status(finished.status().code(),
                          absl::StrCat("generation failed: ", finished.status().message()));
    }
    for (ContinuousEngine::Finished& f : *finished) {
      auto it = std::prev(open.upper_bound(f.id));  // the group's first id <= f.id
      Open& group = it->second;
      group.results[f.id - it->first] = std::move(f.result);
      if (++group.finished < g_size) continue;
      metrics_->generation_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - group.started));
      submit_->Add({ScoreGroup(group.prompt, group.results, group.logprobs)});
      ++*generated;
      open.erase(it);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RolloutDaemon::Run() {
  int64_t generated = 0;
  const absl::Status result = environment_ != nullptr        ? RunEpisodes(&generated)
                              : options_.continuous_batching ? RunContinuous(&generated)
                                                             : RunStatic(&generated);
  // The submit thread drains the buffer for drain_timeout.
  const absl::Status refused = submit_->Finish();
  receiver_->Stop();
  ASYMPO_RETURN_IF_ERROR(refused);
  ASYMPO_RETURN_IF_ERROR(result);
  LOG(INFO) << options_.rollout_id << " stopped: " << generated << " groups generated, "
            << submit_->accepted_groups() << " accepted by the learner";
  return submit_->accepted_groups();
}

}  // namespace asympo::rollout
