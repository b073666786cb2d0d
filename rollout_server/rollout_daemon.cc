#include "rollout_server/rollout_daemon.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "asympo/v1/learner.grpc.pb.h"
#include "common/metric_builders.h"
#include "common/model_io.h"
#include "common/status_macros.h"
#include "weight_broadcaster/broadcast_receiver.h"
#include "weight_broadcaster/model_snapshot.h"

namespace asympo::rollout {
namespace {

using metrics::AddCounter;
using metrics::AddGauge;
using metrics::AddHistogram;

struct RolloutMetrics {
  explicit RolloutMetrics(prometheus::Registry& r)
      : tokens(AddCounter(r, "asympo_rollout_tokens_generated_total", "Response tokens sampled.")),
        groups_generated(AddCounter(r, "asympo_rollout_groups_generated_total",
                                    "Prompt groups sampled and scored.")),
        groups_sent(
            AddCounter(r, "asympo_rollout_groups_sent_total", "Groups the learner accepted.")),
        responses(AddCounter(r, "asympo_rollout_responses_total", "Responses sampled and scored.")),
        correct(AddCounter(r, "asympo_rollout_correct_responses_total",
                           "Responses the task's verifier scored as an exact match.")),
        reward_sum(AddCounter(r, "asympo_rollout_reward_sum_total",
                              "Sum of the rewards of all scored responses (divide by "
                              "asympo_rollout_responses_total for the mean).")),
        dropped(prometheus::BuildCounter()
                    .Name("asympo_rollout_groups_dropped_total")
                    .Help("Groups dropped without reaching the learner, by reason: rejected (the "
                          "learner refused the batch as invalid) or shutdown (still buffered when "
                          "the daemon stopped).")
                    .Register(r)),
        dropped_rejected(dropped.Add({{"reason", "rejected"}})),
        dropped_shutdown(dropped.Add({{"reason", "shutdown"}})),
        submit_errors(prometheus::BuildCounter()
                          .Name("asympo_rollout_submit_errors_total")
                          .Help("Submit and status calls that failed, by gRPC status code.")
                          .Register(r)),
        generation_seconds(AddHistogram(r, "asympo_rollout_generation_seconds",
                                        "Time of one batched generation (prompts x G responses).",
                                        {0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100})),
        buffer_groups(AddGauge(r, "asympo_rollout_buffer_groups",
                               "Groups generated and not yet accepted by the learner.")),
        buffer_capacity(
            AddGauge(r, "asympo_rollout_buffer_capacity_groups", "Bound of the rollout buffer.")),
        connected(AddGauge(r, "asympo_rollout_learner_connected",
                           "1 while the learner answers, 0 while the daemon reconnects.")),
        flips(AddCounter(r, "asympo_rollout_weight_flips_total",
                         "Snapshots loaded into the spare model and flipped to.")) {}

  prometheus::Counter& tokens;
  prometheus::Counter& groups_generated;
  prometheus::Counter& groups_sent;
  prometheus::Counter& responses;
  prometheus::Counter& correct;
  prometheus::Counter& reward_sum;
  prometheus::Family<prometheus::Counter>& dropped;
  prometheus::Counter& dropped_rejected;
  prometheus::Counter& dropped_shutdown;
  prometheus::Family<prometheus::Counter>& submit_errors;
  prometheus::Histogram& generation_seconds;
  prometheus::Gauge& buffer_groups;
  prometheus::Gauge& buffer_capacity;
  prometheus::Gauge& connected;
  prometheus::Counter& flips;
};

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    default:
      return absl::StrCat("CODE_", static_cast<int>(code));
  }
}

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

}  // namespace

struct RolloutDaemon::Impl {
  RolloutDaemonOptions options;
  std::unique_ptr<PolicyModel> models[2];
  int active = 0;
  std::unique_ptr<Task> task;
  std::mt19937_64 rng;
  SamplingParams sampling;
  std::unique_ptr<broadcast::WeightReceiver> receiver;
  std::unique_ptr<RolloutMetrics> metrics;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Learner::Stub> stub;

  // The buffer: groups generated and not yet accepted. `in_flight` counts
  // groups the submit thread took and is sending; they count against the
  // bound until accepted or dropped.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<v1::PromptGroup> buffer;
  int64_t in_flight = 0;
  bool stopping = false;
  bool generation_done = false;
  bool have_status = false;
  v1::LearnerStatus status;
  std::string fatal;  // a configuration the learner can never accept

  std::atomic<int64_t> accepted_groups{0};
  std::thread submit_thread;

  void UpdateBufferGauge() {
    metrics->buffer_groups.Set(static_cast<double>(buffer.size() + in_flight));
  }
  void SubmitLoop();
  // Sleeps `d`, or only briefly once stopping (while draining the buffer).
  void SleepUnlessStopping(absl::Duration d) {
    {
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, absl::ToChronoMilliseconds(d), [&] { return stopping; })) return;
    }
    // Stopping: the buffer is being drained; pause briefly between attempts.
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(std::min(d, absl::Milliseconds(50))));
  }
  absl::Status CheckAgainstLimits(const v1::LearnerStatus& s) const;
};

absl::Status RolloutDaemon::Impl::CheckAgainstLimits(const v1::LearnerStatus& s) const {
  const v1::BatchLimits& l = s.limits();
  if (l.vocab_size() != 0 && l.vocab_size() != models[0]->config().vocab_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("the learner's vocabulary has ", l.vocab_size(), " ids but this model's has ",
                     models[0]->config().vocab_size, ": they run different models"));
  }
  if (l.max_group_size() != 0 &&
      (options.group_size < l.min_group_size() || options.group_size > l.max_group_size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("--group_size=", options.group_size, " is outside the learner's bounds [",
                     l.min_group_size(), ", ", l.max_group_size(), "]"));
  }
  if (l.max_response_tokens() != 0 && sampling.max_new_tokens > l.max_response_tokens()) {
    return absl::FailedPreconditionError(absl::StrCat("--max_new_tokens=", sampling.max_new_tokens,
                                                      " exceeds the learner's max_response_tokens ",
                                                      l.max_response_tokens()));
  }
  return absl::OkStatus();
}

void RolloutDaemon::Impl::SubmitLoop() {
  absl::Duration backoff = options.min_backoff;
  bool connected = false;
  absl::Time drain_deadline = absl::InfiniteFuture();
  auto error = [&](grpc::StatusCode code) {
    metrics->submit_errors.Add({{"code", CodeName(code)}}).Increment();
  };
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping && drain_deadline == absl::InfiniteFuture()) {
        drain_deadline = absl::Now() + options.drain_timeout;
      }
      if (stopping && (absl::Now() >= drain_deadline || (buffer.empty() && generation_done))) {
        break;
      }
    }
    if (!connected) {
      grpc::ClientContext ctx;
      // Waits for the channel to connect (up to the deadline) rather than
      // failing at once while gRPC backs off between connection attempts.
      ctx.set_wait_for_ready(true);
      ctx.set_deadline(Deadline(absl::Seconds(5)));
      v1::GetStatusRequest req;
      v1::LearnerStatus st;
      grpc::Status s = stub->GetStatus(&ctx, req, &st);
      if (!s.ok()) {
        error(s.error_code());
        metrics->connected.Set(0);
        LOG_EVERY_N(WARNING, 10) << "learner at " << options.learner_address << " unavailable ("
                                 << s.error_message() << "); retrying in "
                                 << absl::FormatDuration(backoff);
        SleepUnlessStopping(backoff);
        backoff = std::min(backoff * 2, options.max_backoff);
        continue;
      }
      absl::Status limits = CheckAgainstLimits(st);
      std::lock_guard<std::mutex> lock(mu);
      if (!limits.ok()) {
        fatal = std::string(limits.message());
        stopping = true;
        cv.notify_all();
        break;
      }
      status = st;
      have_status = true;
      connected = true;
      backoff = options.min_backoff;
      metrics->connected.Set(1);
      LOG(INFO) << "connected to the learner at " << options.learner_address << " (version "
                << st.version() << ", objective " << st.objective() << ")";
      cv.notify_all();
    }
    // Take a batch.
    v1::RolloutBatch batch;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(200),
                  [&] { return !buffer.empty() || stopping; });
      const int max_groups =
          std::min<int>(options.max_groups_per_batch, status.limits().max_groups_per_batch() > 0
                                                          ? status.limits().max_groups_per_batch()
                                                          : options.max_groups_per_batch);
      while (!buffer.empty() && batch.groups_size() < max_groups) {
        *batch.add_groups() = std::move(buffer.front());
        buffer.pop_front();
      }
      in_flight = batch.groups_size();
    }
    if (batch.groups_size() == 0) continue;
    batch.set_source(options.rollout_id);
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(options.submit_timeout));
    v1::SubmitResponse resp;
    grpc::Status s = stub->Submit(&ctx, batch, &resp);
    const int n = batch.groups_size();
    if (s.ok()) {
      accepted_groups.fetch_add(n);
      metrics->groups_sent.Increment(n);
      std::lock_guard<std::mutex> lock(mu);
      in_flight = 0;
      UpdateBufferGauge();
      cv.notify_all();
      continue;
    }
    error(s.error_code());
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      // The learner will never accept these groups (for example it switched
      // to grpo and wants behavior log-probs): drop and count them.
      LOG(ERROR) << "the learner rejected a batch of " << n << " groups: " << s.error_message();
      metrics->dropped_rejected.Increment(n);
      std::lock_guard<std::mutex> lock(mu);
      in_flight = 0;
      UpdateBufferGauge();
      connected = false;  // re-read the learner's status (objective, limits)
      cv.notify_all();
      continue;
    }
    // Not accepted: the groups go back to the front of the buffer, in order.
    {
      std::lock_guard<std::mutex> lock(mu);
      for (int i = n - 1; i >= 0; --i) buffer.push_front(std::move(*batch.mutable_groups(i)));
      in_flight = 0;
      UpdateBufferGauge();
    }
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      int64_t retry_ms = 1000;
      auto it = ctx.GetServerTrailingMetadata().find("asympo-retry-after-ms");
      if (it != ctx.GetServerTrailingMetadata().end()) {
        int64_t v = 0;
        if (absl::SimpleAtoi(std::string(it->second.data(), it->second.size()), &v) && v >= 0) {
          retry_ms = std::min<int64_t>(v, 60000);
        }
      }
      VLOG(1) << "learner queue full; retrying in " << retry_ms << " ms";
      SleepUnlessStopping(absl::Milliseconds(retry_ms));
      continue;
    }
    LOG(WARNING) << "submit failed (" << CodeName(s.error_code()) << ": " << s.error_message()
                 << "); reconnecting";
    connected = false;
    metrics->connected.Set(0);
    SleepUnlessStopping(backoff);
    backoff = std::min(backoff * 2, options.max_backoff);
  }
  std::lock_guard<std::mutex> lock(mu);
  const int64_t left = static_cast<int64_t>(buffer.size());
  if (left > 0) {
    metrics->dropped_shutdown.Increment(static_cast<double>(left));
    LOG(WARNING) << left << " generated groups were not sent before shutdown (counted in "
                 << "asympo_rollout_groups_dropped_total{reason=\"shutdown\"})";
    buffer.clear();
  }
  UpdateBufferGauge();
}

RolloutDaemon::RolloutDaemon(RolloutDaemonOptions options) : options_(std::move(options)) {}

RolloutDaemon::~RolloutDaemon() {
  Shutdown();
  if (impl_ && impl_->submit_thread.joinable()) impl_->submit_thread.join();
  if (impl_ && impl_->receiver) impl_->receiver->Stop();
}

int RolloutDaemon::metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }

void RolloutDaemon::Shutdown() {
  if (!impl_) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->stopping = true;
  impl_->cv.notify_all();
}

absl::StatusOr<std::unique_ptr<RolloutDaemon>> RolloutDaemon::Create(RolloutDaemonOptions o) {
  if (o.group_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_size is ", o.group_size, "; a group needs at least 2 responses"));
  }
  if (o.prompts_per_generation <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompts_per_generation is ", o.prompts_per_generation, "; it must be > 0"));
  }
  if (o.max_groups_per_batch <= 0) {
    return absl::InvalidArgumentError("max_groups_per_batch must be positive");
  }
  if (o.max_buffered_groups < o.prompts_per_generation) {
    return absl::InvalidArgumentError(absl::StrCat("max_buffered_groups ", o.max_buffered_groups,
                                                   " is below prompts_per_generation ",
                                                   o.prompts_per_generation));
  }
  if (o.min_backoff <= absl::ZeroDuration() || o.max_backoff < o.min_backoff) {
    return absl::InvalidArgumentError("backoff: need 0 < min_backoff <= max_backoff");
  }
  if (o.rollout_id.empty() || o.rollout_id.size() > 128) {
    return absl::InvalidArgumentError("rollout_id must have 1 to 128 bytes");
  }
  std::unique_ptr<RolloutDaemon> d(new RolloutDaemon(o));
  d->impl_ = std::make_unique<Impl>();
  Impl& im = *d->impl_;
  im.options = o;
  for (auto& m : im.models) {
    ASYMPO_ASSIGN_OR_RETURN(m, CreateOrLoadPolicyModel(o.model, o.tiny_vocab_size, o.model_options));
  }
  TaskOptions to = o.task;
  to.vocab_size = im.models[0]->config().vocab_size;
  ASYMPO_ASSIGN_OR_RETURN(im.task, CreateTask(to));
  im.sampling = o.sampling;
  im.sampling.stop_token_ids = im.task->stop_token_ids();
  if (im.sampling.max_new_tokens <= 0) im.sampling.max_new_tokens = im.task->max_new_tokens();
  ASYMPO_RETURN_IF_ERROR(ValidateSamplingParams(im.sampling));
  im.rng.seed(o.seed);

  d->registry_ = std::make_shared<prometheus::Registry>();
  im.metrics = std::make_unique<RolloutMetrics>(*d->registry_);
  im.metrics->buffer_capacity.Set(static_cast<double>(o.max_buffered_groups));
  if (!o.metrics_address.empty()) {
    ASYMPO_ASSIGN_OR_RETURN(d->metrics_server_,
                            MetricsHttpServer::Start(o.metrics_address, d->registry_));
  }

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(o.min_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(o.max_backoff)));
  im.channel =
      grpc::CreateCustomChannel(o.learner_address, grpc::InsecureChannelCredentials(), args);
  im.stub = v1::Learner::NewStub(im.channel);

  broadcast::WeightReceiverOptions ro;
  ro.target = o.learner_address;
  ro.receiver_id = o.rollout_id;
  ro.model_signature = broadcast::ModelSignatureOf(*im.models[0]);
  ro.max_chunk_bytes = o.weight_chunk_bytes;
  ro.prefer_nccl = o.weight_transport_nccl;
  ro.nccl_device = o.cuda_device;
  ro.min_backoff = o.min_backoff;
  ro.max_backoff = o.max_backoff;
  ro.registry = d->registry_.get();
  ASYMPO_ASSIGN_OR_RETURN(im.receiver, broadcast::WeightReceiver::Start(ro));
  im.submit_thread = std::thread([&im] { im.SubmitLoop(); });
  LOG(INFO) << o.rollout_id << ": task " << im.task->name() << ", model " << o.model << " ("
            << im.models[0]->config().NumParameters() << " parameters), G=" << o.group_size
            << ", max_new_tokens " << im.sampling.max_new_tokens << ", learner "
            << o.learner_address;
  return d;
}

absl::StatusOr<int64_t> RolloutDaemon::Run() {
  Impl& im = *impl_;
  const RolloutDaemonOptions& o = im.options;
  bool have_weights = false;
  int64_t generated = 0;
  absl::Status result = absl::OkStatus();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(im.mu);
      if (im.stopping) break;
    }
    // Flip to the newest verified snapshot, between generations.
    if (!have_weights && !im.receiver->WaitForPending(absl::Milliseconds(200))) continue;
    if (std::shared_ptr<const broadcast::ReceivedSnapshot> snap = im.receiver->TakePending()) {
      PolicyModel* spare = im.models[1 - im.active].get();
      absl::Status s = broadcast::LoadSnapshotIntoModel(*snap, spare);
      if (s.ok()) {
        im.active = 1 - im.active;
        have_weights = true;
        weight_version_ = snap->version();
        im.receiver->ReportLoaded(snap->version());
        im.metrics->flips.Increment();
        VLOG(1) << "sampling with version " << snap->version();
      } else {
        LOG(ERROR) << "snapshot " << snap->version() << " not loaded: " << s;
        im.receiver->ReportLoadFailure(snap->version(), std::string(s.message()));
      }
    }
    if (!have_weights) continue;
    bool wants_logprobs = false;
    {
      // Room for a generation's groups, and the learner's wishes known.
      std::unique_lock<std::mutex> lock(im.mu);
      im.cv.wait(lock, [&] {
        return im.stopping || (im.have_status && static_cast<int64_t>(im.buffer.size()) +
                                                         im.in_flight + o.prompts_per_generation <=
                                                     o.max_buffered_groups);
      });
      if (im.stopping) break;
      wants_logprobs = im.status.wants_behavior_logprobs();
    }
    std::vector<TaskPrompt> prompts;
    std::vector<GenerationRequest> requests;
    for (int p = 0; p < o.prompts_per_generation; ++p) {
      prompts.push_back(im.task->NextPrompt(im.rng));
      for (int g = 0; g < o.group_size; ++g) {
        GenerationRequest r;
        r.prompt = prompts.back().prompt_tokens;
        r.params = im.sampling;
        r.params.seed = im.rng();
        r.params.return_logprobs = wants_logprobs;
        requests.push_back(std::move(r));
      }
    }
    const absl::Time t0 = absl::Now();
    GenerationEngine engine(im.models[im.active].get());
    absl::StatusOr<std::vector<GenerationResult>> results = engine.Generate(requests);
    if (!results.ok()) {
      result = absl::Status(results.status().code(),
                            absl::StrCat("generation failed: ", results.status().message()));
      break;
    }
    im.metrics->generation_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - t0));
    std::vector<v1::PromptGroup> groups;
    for (int p = 0; p < o.prompts_per_generation; ++p) {
      v1::PromptGroup group;
      group.set_prompt_id(prompts[p].prompt_id);
      group.mutable_prompt_tokens()->Assign(prompts[p].prompt_tokens.begin(),
                                            prompts[p].prompt_tokens.end());
      for (int g = 0; g < o.group_size; ++g) {
        GenerationResult& r = (*results)[static_cast<size_t>(p * o.group_size + g)];
        const TaskScore score = im.task->Score(prompts[p], r.tokens);
        v1::Response* resp = group.add_responses();
        resp->mutable_tokens()->Assign(r.tokens.begin(), r.tokens.end());
        resp->set_reward(static_cast<float>(score.reward));
        resp->set_finish_reason(r.finish_reason);
        if (wants_logprobs)
          resp->mutable_behavior_logprobs()->Assign(r.logprobs.begin(), r.logprobs.end());
        im.metrics->tokens.Increment(static_cast<double>(r.tokens.size()));
        im.metrics->responses.Increment();
        im.metrics->reward_sum.Increment(std::max(0.0, score.reward));
        if (score.correct) im.metrics->correct.Increment();
      }
      groups.push_back(std::move(group));
    }
    im.metrics->groups_generated.Increment(static_cast<double>(groups.size()));
    generated += static_cast<int64_t>(groups.size());
    {
      std::lock_guard<std::mutex> lock(im.mu);
      for (auto& g : groups) im.buffer.push_back(std::move(g));
      im.UpdateBufferGauge();
      im.cv.notify_all();
    }
    if (o.max_groups > 0 && generated >= o.max_groups) break;
  }
  {
    std::lock_guard<std::mutex> lock(im.mu);
    im.generation_done = true;
    im.stopping = true;  // the submit thread drains for drain_timeout
    im.cv.notify_all();
  }
  if (im.submit_thread.joinable()) im.submit_thread.join();
  im.receiver->Stop();
  {
    std::lock_guard<std::mutex> lock(im.mu);
    if (!im.fatal.empty()) return absl::FailedPreconditionError(im.fatal);
  }
  ASYMPO_RETURN_IF_ERROR(result);
  LOG(INFO) << o.rollout_id << " stopped: " << generated << " groups generated, "
            << im.accepted_groups.load() << " accepted by the learner";
  return im.accepted_groups.load();
}

}  // namespace asympo::rollout
