#include "weight_broadcaster/broadcast_receiver.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <utility>

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "asympo/v1/weight_broadcast.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/security/tls.h"
#include "common/status_macros.h"
#include "weight_broadcaster/announcement_stream.h"
#include "weight_broadcaster/broadcast_metrics.h"
#include "weight_broadcaster/nccl_snapshot.h"
#include "weight_broadcaster/receiver_channel.h"
#include "weight_broadcaster/snapshot_fetch.h"
#include "weight_broadcaster/snapshot_manifest.h"
#include "weight_broadcaster/version_reporter.h"

namespace asympo::broadcast {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

constexpr absl::Duration kRegisterTimeout = absl::Seconds(10);

struct ReceiverState {
  ReceiverState(WeightReceiverOptions o, prometheus::Registry& registry)
      : options(std::move(o)),
        metrics(registry),
        channel(ReceiverChannel(options, tls_registry)),
        stub(v1::WeightBroadcast::NewStub(channel)),
        fetcher(channel, options.max_chunk_bytes, metrics),
        reporter(stub.get()) {}

  void Run();
  absl::StatusOr<v1::RegisterResponse> Register();
  // The announcement stream's callbacks (gRPC threads).
  void Subscribed() {
    absl::MutexLock lock(&mu);
    SetConnected(true);
    cv.SignalAll();
  }
  void Announced(v1::SnapshotAnnouncement a) {
    absl::MutexLock lock(&mu);
    latest_announced = a.manifest().version();
    announced = std::move(a);
    cv.SignalAll();
  }
  void StreamDone(const grpc::Status& s) {
    if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) {
      LOG(INFO) << "weight announcements from " << options.target
                << " ended: " << s.error_message();
    }
    absl::MutexLock lock(&mu);
    SetConnected(false);
    stream_done = true;
    cv.SignalAll();
  }
  // Subscribes and handles announcements until the stream ends or Stop.
  // Returns whether the stream was ever accepted.
  bool RunSession(const v1::RegisterResponse& registration);
  void HandleAnnouncement(const v1::SnapshotAnnouncement& a);
  // Whether the snapshot `m` announces is worth having, given what is held.
  bool Wanted(const v1::SnapshotManifest& m);
  // A verified snapshot becomes the pending one.
  void Accept(std::shared_ptr<ReceivedSnapshot> snapshot, double seconds);
  // NCCL: joins the communicator of `registration` (on failure the session
  // stays on gRPC), and drops it.
  void JoinNccl(const v1::RegisterResponse& registration);
  void DropNccl();
  // Counts a failed transfer, logs it and reports it to the learner.
  void TransferFailed(const std::string& error);

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
    metrics.connected.Set(c ? 1 : 0);
  }

  const WeightReceiverOptions options;
  ReceiverMetrics metrics;
  // The channel's TLS reloads: the rollout exports no asympo_tls_* metrics
  // (docs/security.md), so they count into a registry nobody scrapes.
  prometheus::Registry tls_registry;
  const std::shared_ptr<grpc::Channel> channel;
  const std::unique_ptr<v1::WeightBroadcast::Stub> stub;
  SnapshotFetcher fetcher;  // keeps its buffers across sessions
  VersionReporter reporter;
  std::thread thread;
  absl::Mutex stop_mu;  // serializes Stop

  // The worker thread's: the transports of the current session.
  std::unique_ptr<GrpcSnapshotTransport> grpc_transport;
  std::unique_ptr<NcclSnapshotTransport> nccl_transport;

  mutable absl::Mutex mu;
  absl::CondVar cv;  // signalled on every change below
  bool stop ABSL_GUARDED_BY(mu) = false;
  grpc::ClientContext* call ABSL_GUARDED_BY(mu) = nullptr;        // Register
  grpc::ClientContext* stream_ctx ABSL_GUARDED_BY(mu) = nullptr;  // Subscribe
  // The current session's transports, for Stop's Cancel.
  SnapshotTransport* live_transports[2] ABSL_GUARDED_BY(mu) = {nullptr, nullptr};
  bool connected ABSL_GUARDED_BY(mu) = false;
  bool session_connected ABSL_GUARDED_BY(mu) = false;
  bool stream_done ABSL_GUARDED_BY(mu) = false;
  bool first_in_session ABSL_GUARDED_BY(mu) = true;
  std::optional<v1::SnapshotAnnouncement> announced ABSL_GUARDED_BY(mu);  // newest not yet handled
  uint64_t latest_announced ABSL_GUARDED_BY(mu) = 0;
  std::optional<uint64_t> held_version ABSL_GUARDED_BY(mu);  // newest verified snapshot
  // Its incarnation, buckets (size, CRC-32C) and digest: a version names
  // weights only within one incarnation of the learner.
  std::string held_incarnation, held_digest ABSL_GUARDED_BY(mu);
  std::vector<std::pair<uint64_t, uint32_t>> held_buckets ABSL_GUARDED_BY(mu);
  uint64_t loaded_version ABSL_GUARDED_BY(mu) = 0;  // as ReportLoaded said
  std::string loaded_incarnation, loaded_digest ABSL_GUARDED_BY(mu);
  int64_t failures ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<const ReceivedSnapshot> pending ABSL_GUARDED_BY(mu);
  std::shared_ptr<const ReceivedSnapshot> base ABSL_GUARDED_BY(mu);  // for deltas
  bool using_nccl ABSL_GUARDED_BY(mu) = false;
  int64_t nccl_versions ABSL_GUARDED_BY(mu) = 0;
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
    if (RunSession(*reg)) {
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
  if (options.prefer_nccl) {
    request.add_transports(v1::TRANSPORT_NCCL);
    request.set_nccl_deltas(options.deltas);
  }
  request.add_transports(v1::TRANSPORT_GRPC);
  request.set_model_signature(options.model_signature);
  {
    absl::MutexLock lock(&mu);
    request.set_current_version(loaded_version);
    request.set_current_incarnation(loaded_incarnation);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(kRegisterTimeout));
  // Wait for the channel to connect (up to the deadline) instead of failing
  // at once while gRPC backs off between connection attempts: a learner that
  // is still starting is then joined as soon as it listens.
  ctx.set_wait_for_ready(true);
  if (!BeginCall(&ctx)) return absl::CancelledError("stopped");
  v1::RegisterResponse response;
  const grpc::Status s = stub->Register(&ctx, request, &response);
  EndCall();
  if (!s.ok()) return FromGrpcStatus(s, "Register");
  const bool nccl_offered = request.transports(0) == v1::TRANSPORT_NCCL;
  if (response.transport() != v1::TRANSPORT_GRPC &&
      !(nccl_offered && response.transport() == v1::TRANSPORT_NCCL)) {
    return absl::FailedPreconditionError(absl::StrCat("the learner chose transport ",
                                                      v1::Transport_Name(response.transport()),
                                                      ", which this receiver did not offer"));
  }
  return response;
}

bool ReceiverState::RunSession(const v1::RegisterResponse& registration) {
  const std::string& id = registration.session_id();
  grpc_transport = std::make_unique<GrpcSnapshotTransport>(
      &fetcher, id, options.model_signature, options.fetch_timeout, metrics.delta_fallbacks);
  // The stream hands every announcement to this thread, which keeps only
  // the newest one it has not handled yet.
  AnnouncementStream stream(
      stub.get(),
      {[this] { Subscribed(); }, [this](v1::SnapshotAnnouncement a) { Announced(std::move(a)); },
       [this](const grpc::Status& s) { StreamDone(s); }});
  {
    absl::MutexLock lock(&mu);
    if (stop) return false;
    stream_done = false;
    session_connected = false;
    first_in_session = true;
    announced.reset();
    stream_ctx = stream.context();
    live_transports[0] = grpc_transport.get();
  }
  reporter.SetSession(id);
  stream.Start(id);
  if (registration.transport() == v1::TRANSPORT_NCCL) JoinNccl(registration);
  while (true) {
    v1::SnapshotAnnouncement a;
    {
      absl::MutexLock lock(&mu);
      while (!stop && !stream_done && !announced.has_value()) cv.Wait(&mu);
      if (stop || stream_done) break;
      a = std::move(*announced);
      announced.reset();
    }
    HandleAnnouncement(a);
  }
  DropNccl();
  reporter.SetSession("");
  absl::MutexLock lock(&mu);
  if (!stream_done) stream_ctx->TryCancel();
  while (!stream_done) cv.Wait(&mu);
  stream_ctx = nullptr;
  live_transports[0] = nullptr;
  return session_connected;
}

void ReceiverState::JoinNccl(const v1::RegisterResponse& registration) {
  absl::StatusOr<std::unique_ptr<NcclSnapshotTransport>> joined =
      NcclSnapshotTransport::Join(registration, options.nccl_device, options.nccl,
                                  options.model_signature, metrics.delta_versions);
  if (!joined.ok()) {
    if (!Stopping()) {
      TransferFailed(absl::StrCat("joining the NCCL communicator failed (weights come over gRPC): ",
                                  joined.status().message()));
    }
    return;
  }
  absl::MutexLock lock(&mu);
  if (stop) return;  // destroyed with the unique_ptr
  nccl_transport = *std::move(joined);
  live_transports[1] = nccl_transport.get();
  using_nccl = true;
}

void ReceiverState::DropNccl() {
  {
    absl::MutexLock lock(&mu);
    live_transports[1] = nullptr;
    using_nccl = false;
  }
  nccl_transport.reset();  // aborts the communicator
}

std::vector<std::pair<uint64_t, uint32_t>> BucketsOf(const v1::SnapshotManifest& m) {
  std::vector<std::pair<uint64_t, uint32_t>> out;
  for (const v1::BucketInfo& b : m.buckets()) out.emplace_back(b.size_bytes(), b.crc32c());
  return out;
}

bool ReceiverState::Wanted(const v1::SnapshotManifest& m) {
  std::string report;  // an incarnation to report the loaded version under
  bool wanted = true;
  {
    absl::MutexLock lock(&mu);
    const bool first = first_in_session;
    first_in_session = false;
    if (!held_version.has_value()) return true;  // any version, 0 too
    if (m.incarnation() != held_incarnation) {
      // Another learner process: its version numbers name other weights,
      // unless the bytes are the same (a restart from the checkpoint that
      // made the held version).
      wanted = m.version() != *held_version || BucketsOf(m) != held_buckets;
      if (!wanted) {
        held_incarnation = m.incarnation();
        if (loaded_version == m.version()) report = loaded_incarnation = m.incarnation();
      }
    } else {
      // The first announcement of a session is followed even backwards (a
      // learner without incarnations restarted from an older checkpoint);
      // later ones only forwards.
      wanted = first ? m.version() != *held_version : m.version() > *held_version;
    }
  }
  if (!report.empty()) reporter.Report(m.version(), "", report);
  return wanted;
}

void ReceiverState::Accept(std::shared_ptr<ReceivedSnapshot> snapshot, double seconds) {
  metrics.fetch_seconds.Observe(seconds);
  VLOG(1) << "received version " << snapshot->version() << " (" << snapshot->manifest.total_bytes()
          << " bytes) in " << seconds << " s";
  absl::MutexLock lock(&mu);
  held_version = snapshot->version();
  held_incarnation = snapshot->manifest.incarnation();
  held_buckets = BucketsOf(snapshot->manifest);
  held_digest = WeightDigest(snapshot->manifest);
  if (options.deltas) base = snapshot;
  pending = std::move(snapshot);
  cv.SignalAll();
}

void ReceiverState::HandleAnnouncement(const v1::SnapshotAnnouncement& a) {
  const v1::SnapshotManifest& manifest = a.manifest();
  const uint64_t version = manifest.version();
  const bool wanted = Wanted(manifest);
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<const ReceivedSnapshot> held;
  {
    absl::MutexLock lock(&mu);
    held = base;
  }
  if (nccl_transport != nullptr) {
    // Every announced version is broadcast to every rank: it takes part even
    // when the version is not wanted.
    absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> received =
        nccl_transport->Receive(a, wanted, held);
    if (received.ok() || nccl_transport->usable()) {
      absl::MutexLock lock(&mu);
      ++nccl_versions;  // every broadcast took place
    }
    if (received.ok()) {
      if (*received != nullptr) Accept(*std::move(received), SecondsSince(t0));
      return;
    }
    if (Stopping()) return;
    const bool dead = !nccl_transport->usable();
    if (!dead && nccl_transport->delta_failed()) {
      // The broadcast carried deltas this receiver could not rebuild the
      // version from (no base, or a corrupt delta): the whole version over
      // gRPC, at once.
      metrics.delta_fallbacks.Increment();
      LOG(WARNING) << "NCCL broadcast of version " << version << ": " << received.status().message()
                   << "; fetching it whole over gRPC";
      held = nullptr;
    } else {
      TransferFailed(absl::StrCat("NCCL broadcast of version ", version, " failed",
                                  dead ? " (weights now come over gRPC)" : "", ": ",
                                  received.status().message()));
      if (!dead) return;
      DropNccl();
    }
  }
  absl::StatusOr<std::shared_ptr<ReceivedSnapshot>> fetched =
      grpc_transport->Receive(a, wanted, held);
  if (fetched.ok()) {
    if (*fetched != nullptr) Accept(*std::move(fetched), SecondsSince(t0));
    return;
  }
  if (Stopping()) return;
  if (fetched.status().code() == absl::StatusCode::kNotFound) {
    // Replaced by a newer version between announcement and fetch; its
    // announcement is on the way.
    VLOG(1) << "version " << version << " was superseded before it was fetched";
    return;
  }
  TransferFailed(
      absl::StrCat("fetch of version ", version, " failed: ", fetched.status().message()));
}

void ReceiverState::TransferFailed(const std::string& error) {
  uint64_t loaded;
  std::string incarnation;
  {
    absl::MutexLock lock(&mu);
    ++failures;
    loaded = loaded_version;
    incarnation = loaded_incarnation;
  }
  metrics.failures.Increment();
  LOG(WARNING) << error << "; keeping version " << loaded;
  reporter.Report(loaded, error, incarnation);
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
    WeightReceiverOptions options, prometheus::Registry& registry) {
  ASYMPO_RETURN_IF_ERROR(ValidateReceiverOptions(options));
  auto state = std::make_unique<State>(std::move(options), registry);
  state->metrics.connected.Set(0);
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

void WeightReceiver::ReportLoaded(uint64_t version, double load_seconds) {
  if (load_seconds >= 0) state_->metrics.load_seconds.Observe(load_seconds);
  std::string incarnation, digest;
  {
    absl::MutexLock lock(&state_->mu);
    state_->loaded_version = version;
    if (state_->held_version == version) state_->loaded_incarnation = state_->held_incarnation;
    if (state_->held_version == version) state_->loaded_digest = state_->held_digest;
    incarnation = state_->loaded_incarnation, digest = state_->loaded_digest;
  }
  state_->metrics.version.Set(static_cast<double>(version));
  state_->metrics.weights.Set(WeightsLabels(version, digest));
  state_->reporter.Report(version, "", incarnation);
}

void WeightReceiver::ReportLoadFailure(uint64_t version, std::string_view error) {
  uint64_t loaded;
  std::string incarnation;
  {
    absl::MutexLock lock(&state_->mu);
    loaded = state_->loaded_version;
    incarnation = state_->loaded_incarnation;
  }
  const std::string message = absl::StrCat(
      "loading version ", version, " failed: ", absl::string_view(error.data(), error.size()));
  LOG(WARNING) << message << "; keeping version " << loaded;
  state_->reporter.Report(loaded, message, incarnation);
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
  return state_->using_nccl;
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
    for (grpc::ClientContext* ctx : {st.call, st.stream_ctx}) {
      if (ctx != nullptr) ctx->TryCancel();
    }
    for (SnapshotTransport* t : st.live_transports) {
      if (t != nullptr) t->Cancel();
    }
    st.cv.SignalAll();
  }
  if (st.thread.joinable()) st.thread.join();
  st.reporter.Stop();
}

}  // namespace asympo::broadcast
