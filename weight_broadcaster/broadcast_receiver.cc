#include "weight_broadcaster/broadcast_receiver.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <optional>
#include <thread>
#include <utility>

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "asympo/v1/weight_broadcast.grpc.pb.h"
#include "weight_broadcaster/broadcast_metrics.h"
#include "weight_broadcaster/nccl_snapshot.h"
#include "weight_broadcaster/snapshot_fetch.h"
#include "weight_broadcaster/wire_format.h"

namespace asympo::broadcast {
namespace {

constexpr absl::Duration kRegisterTimeout = absl::Seconds(10);
constexpr absl::Duration kReportTimeout = absl::Seconds(10);
constexpr size_t kMaxReceiverIdBytes = 128;

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

std::chrono::system_clock::time_point DeadlineIn(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

int Millis(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT_MAX));
}

// One ReportVersion call in flight.
struct ReportCall {
  grpc::ClientContext ctx;
  v1::ReportVersionRequest request;
  v1::ReportVersionResponse response;
};

// WeightReceiver::State, declared out here so that the reactor below may name
// it.
struct ReceiverState {
  explicit ReceiverState(WeightReceiverOptions o) : options(std::move(o)) {
    if (options.registry != nullptr) metrics = std::make_unique<ReceiverMetrics>(*options.registry);
    grpc::ChannelArguments args;
    const int64_t max_message =
        std::max<int64_t>(64 << 20, options.max_chunk_bytes) + (1 << 20);  // + manifest headroom
    args.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(max_message, INT_MAX)));
    // A channel of its own (not shared with other receivers in the process),
    // reconnecting on the receiver's own backoff schedule.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Millis(options.min_backoff));
    // Also gRPC's minimum connect timeout: below a second, a handshake with a
    // learner that is busy starting up times out again and again.
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, Millis(options.max_backoff));
    // Keepalive pings: a learner host that vanishes without closing the
    // connection ends the announcement stream within about 30 s (the learner
    // permits pings every 10 s, learner_daemon.cc).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    channel = grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args);
    stub = v1::WeightBroadcast::NewStub(channel);
    fetcher = std::make_unique<SnapshotFetcher>(channel, options.max_chunk_bytes,
                                                metrics ? &metrics->fetch_bytes : nullptr);
  }

  void Run();
  absl::StatusOr<v1::RegisterResponse> Register();
  // Subscribes and handles announcements until the stream ends or Stop.
  // Returns whether the stream was ever accepted.
  bool RunSession(const std::string& session_id);
  void HandleAnnouncement(const v1::SnapshotManifest& manifest, const std::string& session_id);
  // NCCL: joins the communicator of `reg` (failure: stays on gRPC), and
  // drops it.
  void JoinNccl(const v1::RegisterResponse& reg);
  void DropNccl() {
    {
      absl::MutexLock lock(&mu);
      nccl_live = nullptr;
    }
    nccl.reset();  // aborts the communicator
  }
  // Counts a failed transfer, logs it and reports it to the learner.
  void TransferFailed(const std::string& error) {
    uint64_t loaded;
    {
      absl::MutexLock lock(&mu);
      ++failures;
      loaded = loaded_version;
    }
    if (metrics) metrics->failures.Increment();
    LOG(WARNING) << error << "; keeping version " << loaded;
    SendReport(loaded, error);
  }
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> Fetch(const v1::SnapshotManifest& manifest,
                                                          const std::string& session_id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(options.fetch_timeout));
    if (!BeginCall(&ctx)) return absl::CancelledError("stopped");
    auto snapshot = fetcher->Fetch(&ctx, session_id, manifest, options.model_signature);
    EndCall();
    return snapshot;
  }
  // ReportVersion, asynchronously: one call in flight, and of the reports
  // made meanwhile only the newest is sent after it.
  void SendReport(uint64_t version, std::string error);
  void StartReport(v1::ReportVersionRequest request);
  void ReportDone(ReportCall* call, const grpc::Status& s);

  // Makes `ctx` the blocking call that Stop cancels; false after Stop.
  bool BeginCall(grpc::ClientContext* ctx) {
    absl::MutexLock lock(&mu);
    if (stop) return false;
    call = ctx;
    return true;
  }
  void EndCall() {
    absl::MutexLock lock(&mu);
    call = nullptr;
  }
  bool Stopping() const {
    absl::MutexLock lock(&mu);
    return stop;
  }
  // Sleeps `d` or until Stop.
  void Sleep(absl::Duration d) {
    absl::MutexLock lock(&mu);
    const absl::Time deadline = absl::Now() + d;
    while (!stop && !cv.WaitWithDeadline(&mu, deadline)) {
    }
  }
  void SetConnected(bool c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    connected = c;
    if (c) session_connected = true;
    if (metrics) metrics->connected.Set(c ? 1 : 0);
  }

  const WeightReceiverOptions options;
  std::unique_ptr<ReceiverMetrics> metrics;  // null without a registry
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::WeightBroadcast::Stub> stub;
  std::unique_ptr<SnapshotFetcher> fetcher;
  std::thread thread;
  absl::Mutex stop_mu;  // serializes Stop
  // The worker thread's: the NCCL assignment of the current registration,
  // and the communicator joined for the current session.
  std::optional<v1::RegisterResponse> nccl_assignment;
  // Shared only so that its deleter is bound where it is made: without
  // ASYMPO_NCCL nothing here names ~NcclBroadcaster.
  std::shared_ptr<NcclBroadcaster> nccl;

  mutable absl::Mutex mu;
  absl::CondVar cv;  // signalled on every change below
  bool stop ABSL_GUARDED_BY(mu) = false;
  grpc::ClientContext* call ABSL_GUARDED_BY(mu) = nullptr;        // Register or FetchSnapshot
  grpc::ClientContext* stream_ctx ABSL_GUARDED_BY(mu) = nullptr;  // Subscribe
  grpc::ClientContext* report_ctx ABSL_GUARDED_BY(mu) = nullptr;  // ReportVersion
  std::string session_id ABSL_GUARDED_BY(mu);
  bool connected ABSL_GUARDED_BY(mu) = false;
  bool session_connected ABSL_GUARDED_BY(mu) = false;
  bool stream_done ABSL_GUARDED_BY(mu) = false;
  bool first_in_session ABSL_GUARDED_BY(mu) = true;
  std::optional<v1::SnapshotManifest> announced ABSL_GUARDED_BY(mu);  // newest not yet handled
  uint64_t latest_announced ABSL_GUARDED_BY(mu) = 0;
  std::optional<uint64_t> held_version ABSL_GUARDED_BY(mu);  // newest verified snapshot
  uint64_t loaded_version ABSL_GUARDED_BY(mu) = 0;           // as ReportLoaded said
  int64_t failures ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<const ReceivedSnapshot> pending ABSL_GUARDED_BY(mu);
  bool report_in_flight ABSL_GUARDED_BY(mu) = false;
  std::optional<v1::ReportVersionRequest> next_report ABSL_GUARDED_BY(mu);
  NcclBroadcaster* nccl_live ABSL_GUARDED_BY(mu) = nullptr;  // `nccl`, for Stop's Cancel
  int64_t nccl_versions ABSL_GUARDED_BY(mu) = 0;
};

// The Subscribe stream: hands every announcement to the worker thread, which
// keeps only the newest one it has not handled yet.
class SubscribeStream final : public grpc::ClientReadReactor<v1::SnapshotAnnouncement> {
 public:
  explicit SubscribeStream(ReceiverState* state) : state_(state) {}

  grpc::ClientContext* context() { return &ctx_; }

  void Start(const std::string& session_id) {
    request_.set_session_id(session_id);
    request_.set_after_version(0);
    state_->stub->async()->Subscribe(&ctx_, &request_, this);
    StartRead(&message_);
    StartCall();
  }

  void OnReadInitialMetadataDone(bool ok) override {
    if (!ok) return;
    const auto& md = ctx_.GetServerInitialMetadata();
    if (md.find(kSubscribedMetadataKey) == md.end()) return;
    absl::MutexLock lock(&state_->mu);
    state_->SetConnected(true);
    state_->cv.SignalAll();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    {
      absl::MutexLock lock(&state_->mu);
      state_->latest_announced = message_.manifest().version();
      state_->announced = std::move(*message_.mutable_manifest());
      state_->cv.SignalAll();
    }
    message_.Clear();
    StartRead(&message_);
  }

  // gRPC touches neither this object nor ctx_ after OnDone, so the worker
  // may destroy both as soon as it sees stream_done.
  void OnDone(const grpc::Status& s) override {
    if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) {
      LOG(INFO) << "weight announcements from " << state_->options.target
                << " ended: " << s.error_message();
    }
    absl::MutexLock lock(&state_->mu);
    state_->SetConnected(false);
    state_->stream_done = true;
    state_->cv.SignalAll();
  }

 private:
  ReceiverState* const state_;
  grpc::ClientContext ctx_;
  v1::SubscribeRequest request_;
  v1::SnapshotAnnouncement message_;
};

void ReceiverState::Run() {
  absl::Duration backoff = options.min_backoff;
  bool outage_logged = false;
  while (!Stopping()) {
    absl::StatusOr<v1::RegisterResponse> reg = Register();
    if (!reg.ok()) {
      if (Stopping()) break;
      absl::Duration wait = backoff;
      if (reg.status().code() == absl::StatusCode::kFailedPrecondition) {
        // A configuration error that only an operator can fix: say so loudly
        // each time, and retry slowly in case the learner is being replaced.
        LOG(ERROR) << "learner at " << options.target << " refused receiver " << options.receiver_id
                   << ": " << reg.status().message();
        wait = options.max_backoff;
      } else if (!outage_logged) {
        LOG(WARNING) << "cannot register with the learner at " << options.target << " ("
                     << reg.status().message() << "); retrying with backoff";
        outage_logged = true;
      }
      Sleep(wait);
      backoff = std::min(backoff * 2, options.max_backoff);
      continue;
    }
    if (outage_logged) LOG(INFO) << "registered with the learner at " << options.target;
    outage_logged = false;
    nccl_assignment.reset();
    if (reg->transport() == v1::TRANSPORT_NCCL) nccl_assignment = *reg;
    if (RunSession(reg->session_id())) {
      backoff = options.min_backoff;
    } else {  // registered but not subscribed: do not spin
      Sleep(backoff);
      backoff = std::min(backoff * 2, options.max_backoff);
    }
  }
}

absl::StatusOr<v1::RegisterResponse> ReceiverState::Register() {
  v1::RegisterRequest request;
  request.set_receiver_id(options.receiver_id);
#ifdef ASYMPO_WITH_NCCL
  if (options.prefer_nccl) request.add_transports(v1::TRANSPORT_NCCL);
#endif
  request.add_transports(v1::TRANSPORT_GRPC);
  request.set_model_signature(options.model_signature);
  {
    absl::MutexLock lock(&mu);
    request.set_current_version(loaded_version);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(kRegisterTimeout));
  // Wait for the channel to connect (up to the deadline) instead of failing
  // at once while gRPC backs off between connection attempts: a learner that
  // is still starting is then joined as soon as it listens.
  ctx.set_wait_for_ready(true);
  if (!BeginCall(&ctx)) return absl::CancelledError("stopped");
  v1::RegisterResponse response;
  const grpc::Status s = stub->Register(&ctx, request, &response);
  EndCall();
  if (!s.ok()) return FromGrpc(s, "Register");
  const bool nccl_offered = request.transports(0) == v1::TRANSPORT_NCCL;
  if (response.transport() != v1::TRANSPORT_GRPC &&
      !(nccl_offered && response.transport() == v1::TRANSPORT_NCCL)) {
    return absl::FailedPreconditionError(absl::StrCat("the learner chose transport ",
                                                      v1::Transport_Name(response.transport()),
                                                      ", which this receiver did not offer"));
  }
  return response;
}

bool ReceiverState::RunSession(const std::string& id) {
  SubscribeStream stream(this);
  {
    absl::MutexLock lock(&mu);
    if (stop) return false;
    session_id = id;
    stream_done = false;
    session_connected = false;
    first_in_session = true;
    announced.reset();
    stream_ctx = stream.context();
  }
  stream.Start(id);
  if (nccl_assignment.has_value()) JoinNccl(*nccl_assignment);
  while (true) {
    v1::SnapshotManifest manifest;
    {
      absl::MutexLock lock(&mu);
      while (!stop && !stream_done && !announced.has_value()) cv.Wait(&mu);
      if (stop || stream_done) break;
      manifest = std::move(*announced);
      announced.reset();
    }
    HandleAnnouncement(manifest, id);
  }
  DropNccl();
  absl::MutexLock lock(&mu);
  if (!stream_done) stream_ctx->TryCancel();
  while (!stream_done) cv.Wait(&mu);
  stream_ctx = nullptr;
  session_id.clear();
  return session_connected;
}

void ReceiverState::JoinNccl(const v1::RegisterResponse& reg) {
#ifdef ASYMPO_WITH_NCCL
  LOG(INFO) << "joining the learner's NCCL communicator as rank " << reg.nccl_rank() << " of "
            << reg.nccl_world_size();
  absl::StatusOr<std::unique_ptr<NcclBroadcaster>> created = NcclBroadcaster::Create(
      reg.nccl_unique_id(), reg.nccl_rank(), reg.nccl_world_size(), options.nccl_device,
      options.nccl);
  if (!created.ok()) {
    if (!Stopping()) {
      TransferFailed(absl::StrCat("joining the NCCL communicator failed (weights come over gRPC): ",
                                  created.status().message()));
    }
    return;
  }
  absl::MutexLock lock(&mu);
  if (stop) return;  // destroyed with the unique_ptr
  nccl = std::shared_ptr<NcclBroadcaster>(*std::move(created));
  nccl_live = nccl.get();
#else
  (void)reg;
#endif
}

void ReceiverState::HandleAnnouncement(const v1::SnapshotManifest& manifest,
                                       const std::string& id) {
  const uint64_t version = manifest.version();
  bool wanted;
  {
    absl::MutexLock lock(&mu);
    // Until a snapshot is held, any version is wanted (version 0 too). The
    // first announcement of a session is followed even backwards (a learner
    // restarted from an older checkpoint); later ones only forwards.
    wanted = !held_version.has_value() ||
             (first_in_session ? version != *held_version : version > *held_version);
    first_in_session = false;
  }
  const auto t0 = std::chrono::steady_clock::now();
#ifdef ASYMPO_WITH_NCCL
  if (nccl != nullptr) {
    // Every announced version is broadcast to every rank: take part even
    // when it is not wanted.
    absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> received =
        ReceiveSnapshotOverNccl(*nccl, manifest, options.model_signature);
    if (received.ok() ||
        (nccl->healthy() && received.status().code() != absl::StatusCode::kInvalidArgument)) {
      absl::MutexLock lock(&mu);
      ++nccl_versions;  // every broadcast took place
    }
    if (received.ok()) {
      if (!wanted) return;
      if (metrics) {
        metrics->fetch_seconds.Observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      VLOG(1) << "received version " << version << " over NCCL";
      absl::MutexLock lock(&mu);
      pending = *std::move(received);
      held_version = version;
      cv.SignalAll();
      return;
    }
    if (Stopping()) return;
    const bool dead = !nccl->healthy() ||
                      received.status().code() == absl::StatusCode::kInvalidArgument;
    TransferFailed(absl::StrCat("NCCL broadcast of version ", version, " failed",
                                dead ? " (weights now come over gRPC)" : "", ": ",
                                received.status().message()));
    if (!dead) return;
    DropNccl();
  }
#endif
  if (!wanted) return;
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> snapshot = Fetch(manifest, id);
  if (snapshot.ok()) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (metrics) metrics->fetch_seconds.Observe(seconds);
    VLOG(1) << "fetched version " << version << " (" << manifest.total_bytes() << " bytes) in "
            << seconds << " s";
    absl::MutexLock lock(&mu);
    pending = *std::move(snapshot);
    held_version = version;
    cv.SignalAll();
    return;
  }
  if (Stopping()) return;
  if (snapshot.status().code() == absl::StatusCode::kNotFound) {
    // Replaced by a newer version between announcement and fetch; its
    // announcement is on the way.
    VLOG(1) << "version " << version << " was superseded before it was fetched";
    return;
  }
  TransferFailed(
      absl::StrCat("fetch of version ", version, " failed: ", snapshot.status().message()));
}

void ReceiverState::SendReport(uint64_t version, std::string error) {
  v1::ReportVersionRequest request;
  request.set_version(version);
  request.set_error(std::move(error));
  {
    absl::MutexLock lock(&mu);
    // Without a session the version travels with the next Register.
    if (stop || session_id.empty()) return;
    request.set_session_id(session_id);
    if (report_in_flight) {  // only the newest report matters
      next_report = std::move(request);
      return;
    }
    report_in_flight = true;
  }
  StartReport(std::move(request));
}

void ReceiverState::StartReport(v1::ReportVersionRequest request) {
  auto* call = new ReportCall;
  call->request = std::move(request);
  call->ctx.set_deadline(DeadlineIn(kReportTimeout));
  {
    absl::MutexLock lock(&mu);
    if (stop) {
      report_in_flight = false;
      cv.SignalAll();
      delete call;
      return;
    }
    report_ctx = &call->ctx;
  }
  stub->async()->ReportVersion(&call->ctx, &call->request, &call->response,
                               [this, call](grpc::Status s) { ReportDone(call, s); });
}

void ReceiverState::ReportDone(ReportCall* call, const grpc::Status& s) {
  if (!s.ok()) VLOG(1) << "ReportVersion failed: " << s.error_message();
  std::optional<v1::ReportVersionRequest> next;
  {
    absl::MutexLock lock(&mu);
    report_ctx = nullptr;
    if (!stop && next_report.has_value()) {
      next = std::move(next_report);
    } else {
      report_in_flight = false;
      cv.SignalAll();
    }
    next_report.reset();
  }
  delete call;
  if (next.has_value()) StartReport(*std::move(next));
}

}  // namespace

std::string_view ReceivedSnapshot::TensorBytes(const v1::TensorEntry& entry) const {
  const std::string& bucket = buckets.at(entry.bucket());
  return std::string_view(bucket).substr(entry.offset(), entry.size_bytes());
}

struct WeightReceiver::State : ReceiverState {
  using ReceiverState::ReceiverState;
};

absl::StatusOr<std::unique_ptr<WeightReceiver>> WeightReceiver::Start(
    WeightReceiverOptions options) {
  if (options.target.empty()) return absl::InvalidArgumentError("receiver target is empty");
  if (options.receiver_id.empty() || options.receiver_id.size() > kMaxReceiverIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("receiver_id must be 1 to ", kMaxReceiverIdBytes,
                                                   " bytes, got ", options.receiver_id.size()));
  }
  if (options.min_backoff <= absl::ZeroDuration() || options.max_backoff < options.min_backoff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backoff must satisfy 0 < min <= max, got min ", absl::FormatDuration(options.min_backoff),
        " max ", absl::FormatDuration(options.max_backoff)));
  }
  if (options.fetch_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("fetch_timeout must be positive");
  }
  auto state = std::make_unique<State>(std::move(options));
  if (state->metrics) state->metrics->connected.Set(0);
  State* s = state.get();
  s->thread = std::thread([s] { s->Run(); });
  return std::unique_ptr<WeightReceiver>(new WeightReceiver(std::move(state)));
}

WeightReceiver::WeightReceiver(std::unique_ptr<State> state) : state_(std::move(state)) {}

WeightReceiver::~WeightReceiver() { Stop(); }

std::shared_ptr<const ReceivedSnapshot> WeightReceiver::TakePending() {
  absl::MutexLock lock(&state_->mu);
  return std::move(state_->pending);
}

bool WeightReceiver::WaitForPending(absl::Duration timeout) {
  State& st = *state_;
  absl::MutexLock lock(&st.mu);
  const absl::Time deadline = absl::Now() + timeout;
  while (st.pending == nullptr && !st.stop) {
    if (st.cv.WaitWithDeadline(&st.mu, deadline)) break;
  }
  return st.pending != nullptr;
}

void WeightReceiver::ReportLoaded(uint64_t version) {
  {
    absl::MutexLock lock(&state_->mu);
    state_->loaded_version = version;
  }
  if (state_->metrics) state_->metrics->version.Set(static_cast<double>(version));
  state_->SendReport(version, "");
}

void WeightReceiver::ReportLoadFailure(uint64_t version, std::string_view error) {
  uint64_t loaded;
  {
    absl::MutexLock lock(&state_->mu);
    loaded = state_->loaded_version;
  }
  const std::string message = absl::StrCat(
      "loading version ", version, " failed: ", absl::string_view(error.data(), error.size()));
  LOG(WARNING) << message << "; keeping version " << loaded;
  state_->SendReport(loaded, message);
}

bool WeightReceiver::connected() const {
  absl::MutexLock lock(&state_->mu);
  return state_->connected;
}

int64_t WeightReceiver::failures() const {
  absl::MutexLock lock(&state_->mu);
  return state_->failures;
}

uint64_t WeightReceiver::latest_announced() const {
  absl::MutexLock lock(&state_->mu);
  return state_->latest_announced;
}

bool WeightReceiver::using_nccl() const {
  absl::MutexLock lock(&state_->mu);
  return state_->nccl_live != nullptr;
}

int64_t WeightReceiver::nccl_versions() const {
  absl::MutexLock lock(&state_->mu);
  return state_->nccl_versions;
}

void WeightReceiver::Stop() {
  State& st = *state_;
  absl::MutexLock stop_lock(&st.stop_mu);
  {
    absl::MutexLock lock(&st.mu);
    st.stop = true;
    for (grpc::ClientContext* ctx : {st.call, st.stream_ctx, st.report_ctx}) {
      if (ctx != nullptr) ctx->TryCancel();
    }
#ifdef ASYMPO_WITH_NCCL
    if (st.nccl_live != nullptr) st.nccl_live->Cancel();
#endif
    st.cv.SignalAll();
  }
  if (st.thread.joinable()) st.thread.join();
  absl::MutexLock lock(&st.mu);
  while (st.report_in_flight) st.cv.Wait(&st.mu);
}

}  // namespace asympo::broadcast
