#include "rollout_server/submit_client.h"

#include <algorithm>
#include <random>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/security/tls.h"
#include "common/submit_retry.h"
#include "rollout_server/batch_assembler.h"

namespace asympo::rollout {
namespace {

// How long TakeBatch waits for a group before the loop looks around again.
constexpr absl::Duration kTakeWait = absl::Milliseconds(200);

std::shared_ptr<grpc::Channel> LearnerChannel(const SubmitClientOptions& o,
                                              prometheus::Registry& tls_registry) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(o.min_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(o.max_backoff)));
  // Start checked that the channel can be made (its files and policy).
  return security::CreateClientChannel(o.learner_address, o.tls, tls_registry, args).value();
}

// "<source, at most 64 bytes>/<16 random hex digits>/": with a sequence
// number, unique across the daemon's restarts and within kMaxBatchIdBytes.
std::string BatchIdPrefix(const std::string& source) {
  std::random_device rd;
  const uint64_t session = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrCat(source.substr(0, 64), "/", absl::Hex(session, absl::kZeroPad16), "/");
}

}  // namespace

absl::StatusOr<std::unique_ptr<SubmitClient>> SubmitClient::Start(SubmitClientOptions o,
                                                                  SubmitMetrics* metrics) {
  if (o.learner_address.empty()) return absl::InvalidArgumentError("learner address is empty");
  if (o.max_buffered_groups <= 0 || o.max_groups_per_batch <= 0 || o.max_batch_bytes == 0) {
    return absl::InvalidArgumentError(
        "max_buffered_groups, max_groups_per_batch and max_batch_bytes must be positive");
  }
  if (o.min_backoff <= absl::ZeroDuration() || o.max_backoff < o.min_backoff) {
    return absl::InvalidArgumentError("backoff: need 0 < min_backoff <= max_backoff");
  }
  if (o.submit_timeout <= absl::ZeroDuration() || o.status_timeout <= absl::ZeroDuration() ||
      o.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "submit_timeout and status_timeout must be > 0 and drain_timeout >= 0");
  }
  prometheus::Registry unexported;  // this channel is only a check
  if (absl::Status s = security::CreateClientChannel(o.learner_address, o.tls, unexported).status();
      !s.ok()) {
    return s;
  }
  std::unique_ptr<SubmitClient> client(new SubmitClient(std::move(o), metrics));
  client->thread_ = std::thread([c = client.get()] { c->Loop(); });
  return client;
}

SubmitClient::SubmitClient(SubmitClientOptions options, SubmitMetrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      channel_(LearnerChannel(options_, tls_registry_)),
      stub_(v1::Learner::NewStub(channel_)),
      backoff_(options_.min_backoff, options_.max_backoff),
      batch_id_prefix_(BatchIdPrefix(options_.source)) {
  metrics_->buffer_capacity.Set(static_cast<double>(options_.max_buffered_groups));
  metrics_->connected.Set(0);
}

SubmitClient::~SubmitClient() { Finish().IgnoreError(); }

std::optional<v1::LearnerStatus> SubmitClient::WaitForRoom(int64_t groups) {
  absl::MutexLock lock(&mu_);
  const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ ||
           (status_.has_value() && static_cast<int64_t>(buffer_.size()) + in_flight_ + groups <=
                                       options_.max_buffered_groups);
  };
  mu_.Await(absl::Condition(&ready));
  if (stopping_) return std::nullopt;
  return status_;
}

std::optional<v1::LearnerStatus> SubmitClient::RoomNow(int64_t groups) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || !status_.has_value() ||
      static_cast<int64_t>(buffer_.size()) + in_flight_ + groups > options_.max_buffered_groups) {
    return std::nullopt;
  }
  return status_;
}

void SubmitClient::Add(std::vector<v1::PromptGroup> groups) {
  absl::MutexLock lock(&mu_);
  for (auto& g : groups) buffer_.push_back(std::move(g));
  UpdateBufferGaugeLocked();
}

void SubmitClient::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (!stopping_) drain_deadline_ = absl::Now() + options_.drain_timeout;
  stopping_ = true;
}

absl::Status SubmitClient::Finish() {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) drain_deadline_ = absl::Now() + options_.drain_timeout;
    stopping_ = true;
    producer_done_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  return refused_;
}

bool SubmitClient::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

int64_t SubmitClient::accepted_groups() const {
  absl::MutexLock lock(&mu_);
  return accepted_groups_;
}

void SubmitClient::UpdateBufferGaugeLocked() {
  metrics_->buffer_groups.Set(
      static_cast<double>(static_cast<int64_t>(buffer_.size()) + in_flight_));
}

void SubmitClient::CountError(grpc::StatusCode code) {
  metrics_->submit_errors.Add({{"code", GrpcCodeName(code)}}).Increment();
}

bool SubmitClient::Done() {
  absl::MutexLock lock(&mu_);
  return stopping_ &&
         (absl::Now() >= drain_deadline_ || (buffer_.empty() && in_flight_ == 0 && producer_done_));
}

void SubmitClient::Pause(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  if (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
    if (!stopping_) return;
  }
  // Stopping: the buffer is being drained; pause briefly between attempts.
  mu_.Unlock();
  absl::SleepFor(std::min(d, absl::Milliseconds(50)));
  mu_.Lock();
}

void SubmitClient::Loop() {
  while (!Done()) {
    if (!connected_) {
      const Outcome o = Connect();
      if (o == Outcome::kStop) break;
      if (o == Outcome::kRetry) continue;
    }
    std::optional<v1::RolloutBatch> batch = TakeBatch();
    if (batch.has_value()) {
      Send(*std::move(batch));
    } else if (channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
      // Nothing to send (no snapshot loaded yet, or generation paused) and
      // the connection is gone: read the learner's status again rather than
      // wait for a batch to fail, so that a dead learner is noticed (and
      // counted) while idle too.
      VLOG(1) << "the connection to the learner at " << options_.learner_address
              << " went away while there was nothing to send; reconnecting";
      connected_ = false;
      metrics_->connected.Set(0);
    }
  }
  absl::MutexLock lock(&mu_);
  const int64_t left = static_cast<int64_t>(buffer_.size()) + in_flight_;  // in_flight_: retry_
  in_flight_ = 0;
  if (left > 0) {
    metrics_->dropped_shutdown.Increment(static_cast<double>(left));
    LOG(WARNING) << left << " generated groups were not sent before shutdown (counted in "
                 << "asympo_rollout_groups_dropped_total{reason=\"shutdown\"})";
    buffer_.clear();
  }
  UpdateBufferGaugeLocked();
}

SubmitClient::Outcome SubmitClient::Connect() {
  grpc::ClientContext ctx;
  // Waits for the channel to connect (up to the deadline) rather than
  // failing at once while gRPC backs off between connection attempts.
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(GrpcDeadline(options_.status_timeout));
  v1::LearnerStatus status;
  const grpc::Status s = stub_->GetStatus(&ctx, v1::GetStatusRequest(), &status);
  if (!s.ok()) {
    CountError(s.error_code());
    metrics_->connected.Set(0);
    if (DecideGetStatus(s.error_code(), RetryHintOf(ctx).has_value()) == SubmitDecision::kFatal) {
      Stop(FromGrpcStatus(s, absl::StrCat("the learner at ", options_.learner_address,
                                          " refused GetStatus: ", GrpcCodeName(s.error_code()))));
      return Outcome::kStop;
    }
    const absl::Duration wait = backoff_.Next(std::nullopt);
    LOG_EVERY_N(WARNING, 10) << "learner at " << options_.learner_address << " unavailable ("
                             << s.error_message() << "); retrying in "
                             << absl::FormatDuration(wait);
    Pause(wait);
    return Outcome::kRetry;
  }
  const absl::Status accepted =
      options_.check_status ? options_.check_status(status) : absl::OkStatus();
  if (!accepted.ok()) {
    Stop(accepted);
    return Outcome::kStop;
  }
  absl::MutexLock lock(&mu_);
  status_ = status;
  connected_ = true;
  backoff_.Reset();
  metrics_->connected.Set(1);
  LOG(INFO) << "connected to the learner at " << options_.learner_address << " (version "
            << status.version() << ", objective " << status.objective() << ")";
  return Outcome::kSent;
}

void SubmitClient::Stop(absl::Status why) {
  absl::MutexLock lock(&mu_);
  refused_ = std::move(why);
  stopping_ = true;
  drain_deadline_ = absl::Now();
}

std::optional<v1::RolloutBatch> SubmitClient::TakeBatch() {
  if (retry_.has_value()) {
    std::optional<v1::RolloutBatch> batch = std::move(retry_);
    retry_.reset();
    return batch;
  }
  absl::MutexLock lock(&mu_);
  // While draining, the producer may still be finishing its last
  // generation: wait for its groups rather than spin.
  const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !buffer_.empty() || (stopping_ && producer_done_);
  };
  mu_.AwaitWithTimeout(
      absl::Condition(&ready),
      std::min(kTakeWait, std::max(absl::ZeroDuration(), drain_deadline_ - absl::Now())));
  const int32_t learner_max =
      status_.has_value() ? status_->limits().max_groups_per_batch() : int32_t{0};
  BatchAssembler assembler({options_.source,
                            learner_max > 0 ? std::min(options_.max_groups_per_batch, learner_max)
                                            : options_.max_groups_per_batch,
                            options_.max_batch_bytes});
  while (!buffer_.empty() && assembler.TryAdd(&buffer_.front())) buffer_.pop_front();
  std::optional<v1::RolloutBatch> batch = assembler.Flush();
  in_flight_ = batch.has_value() ? batch->groups_size() : 0;
  if (batch.has_value()) batch->set_batch_id(absl::StrCat(batch_id_prefix_, next_batch_++));
  return batch;
}

void SubmitClient::Retry(v1::RolloutBatch batch) { retry_ = std::move(batch); }

void SubmitClient::Send(v1::RolloutBatch batch) {
  v1::SubmitResponse response;
  const SubmitAttempt a = SubmitUntilSettled(
      *stub_, batch, {options_.submit_timeout, /*wait_for_ready=*/false}, backoff_,
      [this](const SubmitAttempt& a) {
        CountError(a.status.error_code());
        if (a.hinted) {  // the learner is there and busy: wait its hint and send again
          VLOG(1) << "learner queue full; retrying in " << absl::FormatDuration(a.wait);
          Pause(a.wait);
          return !Done();
        }
        // Perhaps not accepted: read the learner's status again (it may
        // have restarted), then the same batch with the same id.
        LOG(WARNING) << "submit failed (" << GrpcCodeName(a.status.error_code()) << ": "
                     << a.status.error_message() << "); reconnecting";
        connected_ = false;
        metrics_->connected.Set(0);
        Pause(a.wait);
        return false;
      },
      &response);
  const int n = batch.groups_size();
  switch (a.decision) {
    case SubmitDecision::kAccepted:
      Accepted(batch, response);
      return;
    case SubmitDecision::kRetry:
      Retry(std::move(batch));  // sent first once connected, or counted by the drain
      return;
    case SubmitDecision::kDropBatch:
      // The learner will never accept these groups (for example they break
      // a limit it changed, or the batch is over its message size): drop
      // and count them, and read its status (objective, limits) again.
      CountError(a.status.error_code());
      if (a.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        // Their policy version: too far behind, or another incarnation's.
        LOG(WARNING) << "the learner refused a batch of " << n
                     << " groups as stale: " << a.status.error_message();
        metrics_->dropped_stale.Increment(n);
      } else {
        LOG(ERROR) << "the learner rejected a batch of " << n
                   << " groups: " << a.status.error_message();
        metrics_->dropped_rejected.Increment(n);
      }
      connected_ = false;
      break;
    case SubmitDecision::kFatal:
      CountError(a.status.error_code());
      Retry(std::move(batch));  // counted with the buffer as not sent before shutdown
      Stop(FromGrpcStatus(a.status, absl::StrCat("the learner refused a batch: ",
                                                 GrpcCodeName(a.status.error_code()))));
      return;
  }
  absl::MutexLock lock(&mu_);
  in_flight_ = 0;
  UpdateBufferGaugeLocked();
}

void SubmitClient::Accepted(const v1::RolloutBatch& batch, const v1::SubmitResponse& response) {
  if (response.duplicate_batches() > 0) {
    VLOG(1) << "batch " << batch.batch_id() << " had been accepted before its retry";
  }
  metrics_->groups_sent.Increment(batch.groups_size());
  absl::MutexLock lock(&mu_);
  accepted_groups_ += batch.groups_size();
  in_flight_ = 0;
  UpdateBufferGaugeLocked();
}

}  // namespace asympo::rollout
