#include "weight_broadcaster/broadcast_sender.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/wire/raw_messages.h"
#include "weight_broadcaster/sender_internal.h"
#include "weight_broadcaster/wire_format.h"

namespace asympo::broadcast {
namespace {

using internal::SenderState;
using internal::Snapshot;
using internal::SubscribeReactor;

constexpr size_t kMaxReceiverIdBytes = 128;

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Starts a session for `request`, ending the receiver's previous one.
SenderState::Session& CreateSessionLocked(SenderState& st, const v1::RegisterRequest& request,
                                          const std::string& principal,
                                          const std::string& share_key,
                                          v1::RegisterResponse* response)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
  const std::string& id = request.receiver_id();
  std::string session_id = absl::StrFormat("%016x%016x", st.rng(), st.rng());
  auto old = st.session_of.find(id);
  if (old != st.session_of.end()) {
    auto s = st.sessions.find(old->second);
    if (s != st.sessions.end()) {
      if (s->second.stream != nullptr) {
        s->second.stream->End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                           "session replaced: the receiver registered again"));
      }
      st.sessions.erase(s);
    }
    if (int64_t held_back = 0; st.registered_again_log.Allow(&held_back)) {
      LOG(INFO) << "receiver " << QuoteForMessage(id)
                << " registered again; its previous session ends"
                << st.registered_again_log.HeldBack(held_back);
    }
  }
  st.session_of[id] = session_id;
  SenderState::Session& session = st.sessions[session_id];
  session.receiver_id = id;
  session.registered = st.options.clock->Now();
  session.principal = principal;
  session.share_key = share_key;
  // A version above the latest published is taken as the latest: a lie
  // must not move the oldest-version gauge, and a learner restarted from an
  // older checkpoint must not refuse its receivers (their versions are
  // above its own until they load its weights). Before any publish there is
  // nothing to check against.
  session.version = st.OwnVersionLocked(request.current_version(), request.current_incarnation());
  if (st.latest != nullptr) session.version = std::min(session.version, st.latest->version());
  response->set_session_id(session_id);
  response->set_latest_version(st.latest == nullptr ? 0 : st.latest->version());
  response->set_incarnation(st.incarnation);
  st.UpdateReceiverGauges();
  return session;
}

// INVALID_ARGUMENT unless every view has the bytes its entry in `m` needs.
absl::Status CheckViews(const v1::SnapshotManifest& m, const std::vector<TensorView>& tensors) {
  for (int i = 0; i < m.tensors_size(); ++i) {
    const TensorView& t = tensors[static_cast<size_t>(i)];
    if (t.size_bytes != m.tensors(i).size_bytes() || (t.size_bytes > 0 && t.data == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.spec.name, "\" has ", t.size_bytes, " bytes",
                       t.data == nullptr ? " (null data)" : "", "; its shape and dtype need ",
                       m.tensors(i).size_bytes()));
    }
  }
  return absl::OkStatus();
}

// Version `version` of `host`'s buckets: its plan's manifest with each
// bucket's CRC-32C stamped in.
std::shared_ptr<Snapshot> Stamp(const SenderState& st, uint64_t version, HostBuckets host) {
  auto snapshot = std::make_shared<Snapshot>();
  snapshot->host = std::move(host);
  v1::SnapshotManifest m = snapshot->host.plan->manifest();
  m.set_version(version);
  {
    absl::MutexLock lock(&st.mu);
    m.set_incarnation(st.incarnation);
    m.set_resumed_from_version(st.resumed_from_version);
  }
  for (int b = 0; b < m.buckets_size(); ++b) {
    m.mutable_buckets(b)->set_crc32c(Crc32c(snapshot->bucket(b), m.buckets(b).size_bytes()));
  }
  auto announcement = std::make_shared<v1::SnapshotAnnouncement>();
  *announcement->mutable_manifest() = std::move(m);
  snapshot->announcement = std::move(announcement);
  return snapshot;
}

// Publish's common part, with st.publish_mu held: checks the version,
// stamps `host` and makes it the latest snapshot, announced to every
// subscriber (`t0`: when Publish began).
// The snapshot's manifest, sharing its ownership.
std::shared_ptr<const v1::SnapshotManifest> ManifestOf(const std::shared_ptr<const Snapshot>& s) {
  return std::shared_ptr<const v1::SnapshotManifest>(s->announcement, &s->manifest());
}

absl::Status AdoptLocked(SenderState& st, uint64_t version, HostBuckets host,
                         const DeviceBuckets* device, std::chrono::steady_clock::time_point t0)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.publish_mu) {
  {
    absl::MutexLock lock(&st.mu);
    if (st.latest != nullptr && version <= st.latest->version()) {
      return absl::InvalidArgumentError(absl::StrCat("version ", version,
                                                     " is not greater than the latest published, ",
                                                     st.latest->version()));
    }
  }
  std::shared_ptr<Snapshot> snapshot = Stamp(st, version, std::move(host));
  if (device != nullptr) snapshot->device = *device;
  BroadcastSender::PublishHook hook;
  {
    absl::MutexLock lock(&st.mu);
    st.latest = snapshot;
    for (auto& [id, s] : st.sessions) {
      if (s.stream != nullptr && !st.UsesNcclLocked(s)) s.stream->Offer(snapshot->announcement);
    }
    st.nccl_cv.SignalAll();
    hook = st.publish_hook;
  }
  if (hook) hook(ManifestOf(snapshot), snapshot->host);
  const v1::SnapshotManifest& m = snapshot->manifest();
  st.metrics.publish_seconds.Observe(SecondsSince(t0));
  st.metrics.version.Set(static_cast<double>(version));
  st.metrics.snapshot_bytes.Set(static_cast<double>(m.total_bytes()));
  VLOG(1) << "published version " << version << ": " << m.total_bytes() << " bytes in "
          << m.buckets_size() << " buckets";
  return absl::OkStatus();
}

// Every call that finds the server stopping gets the same answer; clients
// treat UNAVAILABLE as "try again elsewhere or later".
grpc::Status ShuttingDown() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the learner is shutting down");
}

}  // namespace

struct BroadcastSender::State : SenderState {
  using SenderState::SenderState;
};

BroadcastSender::BroadcastSender(BroadcastSenderOptions options, std::string model_signature,
                                 prometheus::Registry& registry)
    : state_(std::make_unique<State>(std::move(options), std::move(model_signature), registry)) {
  State& st = *state_;
  const int world = st.options.nccl_world_size;
  if (world <= 0) return;
  if (world == 1) {
    LOG(WARNING) << "NCCL world size 1 has no receivers; weights go over gRPC";
    return;
  }
  internal::StartNccl(st);
}

BroadcastSender::~BroadcastSender() {
  Shutdown();
  if (state_->nccl_thread.joinable()) state_->nccl_thread.join();
}

bool BroadcastSender::nccl_configured() const { return state_->options.nccl_world_size >= 2; }

void BroadcastSender::SetIncarnation(std::string incarnation, uint64_t resumed_from_version) {
  absl::MutexLock lock(&state_->mu);
  state_->incarnation = std::move(incarnation);
  state_->resumed_from_version = resumed_from_version;
}

absl::StatusOr<std::shared_ptr<const SnapshotPlan>> BroadcastSender::Plan(
    const std::vector<TensorSpec>& specs) {
  State& st = *state_;
  const std::string signature = ModelSignature(specs);
  if (signature != st.model_signature) {
    return absl::InvalidArgumentError(absl::StrCat("the tensors' model signature ", signature,
                                                   " differs from the sender's ",
                                                   st.model_signature));
  }
  absl::MutexLock lock(&st.plan_mu);
  if (st.plan == nullptr) {
    ASYMPO_ASSIGN_OR_RETURN(st.plan, SnapshotPlan::Make(specs, st.options.packing));
  }
  return st.plan;
}

absl::Status BroadcastSender::Publish(uint64_t version, const std::vector<TensorView>& tensors) {
  State& st = *state_;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorView& t : tensors) specs.push_back(t.spec);
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<const SnapshotPlan> plan, Plan(specs));
  ASYMPO_RETURN_IF_ERROR(CheckViews(plan->manifest(), tensors));
  absl::MutexLock publish_lock(&st.publish_mu);
  // New buffers are zeroed; every one has the plan's layout, so the gaps
  // between tensors stay zero.
  const uint64_t bytes = std::max<uint64_t>(plan->flat_bytes(), 1);
  std::shared_ptr<char> buffer = ReuseOrMake(st.tensor_buffers, [bytes] {
    return std::shared_ptr<char>(new char[bytes](), std::default_delete<char[]>());
  });
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].size_bytes == 0) continue;
    std::memcpy(buffer.get() + plan->tensor_start(static_cast<int>(i)), tensors[i].data,
                tensors[i].size_bytes);
  }
  HostBuckets host;
  host.plan = std::move(plan);
  host.data = buffer.get();
  host.keep_alive = std::move(buffer);
  return AdoptLocked(st, version, std::move(host), nullptr, t0);
}

absl::Status BroadcastSender::Publish(uint64_t version, HostBuckets host,
                                      const DeviceBuckets* device) {
  State& st = *state_;
  const auto t0 = std::chrono::steady_clock::now();
  absl::MutexLock publish_lock(&st.publish_mu);
  {
    absl::MutexLock lock(&st.plan_mu);
    if (host.plan == nullptr || host.plan != st.plan || host.data == nullptr) {
      return absl::InvalidArgumentError(
          "the host buckets are not laid out by this sender's plan (BroadcastSender::Plan)");
    }
  }
  return AdoptLocked(st, version, std::move(host), device, t0);
}

void BroadcastSender::SetPublishHook(PublishHook hook) {
  std::shared_ptr<const Snapshot> latest;
  {
    absl::MutexLock lock(&state_->mu);
    state_->publish_hook = hook;
    latest = state_->latest;
  }
  if (hook && latest != nullptr) hook(ManifestOf(latest), latest->host);
}

void BroadcastSender::Shutdown() {
  State& st = *state_;
  absl::MutexLock lock(&st.mu);
  st.shut_down = true;
  st.nccl_cv.SignalAll();
  internal::CancelNcclLocked(st);
  for (auto& [id, s] : st.sessions) {
    if (s.stream != nullptr) {
      s.stream->End(ShuttingDown());
    }
  }
}

uint64_t BroadcastSender::latest_version() const {
  absl::MutexLock lock(&state_->mu);
  return state_->latest == nullptr ? 0 : state_->latest->version();
}

const std::string& BroadcastSender::model_signature() const { return state_->model_signature; }

int BroadcastSender::active_receivers() const {
  absl::MutexLock lock(&state_->mu);
  int n = 0;
  for (const auto& [id, s] : state_->sessions) n += s.stream != nullptr ? 1 : 0;
  return n;
}

bool BroadcastSender::nccl_active() const {
  absl::MutexLock lock(&state_->mu);
  return state_->nccl_phase == SenderState::NcclPhase::kRunning;
}

int64_t BroadcastSender::nccl_versions_sent() const {
  absl::MutexLock lock(&state_->mu);
  return state_->nccl_versions;
}

std::vector<std::pair<std::string, uint64_t>> BroadcastSender::receiver_versions() const {
  absl::MutexLock lock(&state_->mu);
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& [id, s] : state_->sessions) out.emplace_back(s.receiver_id, s.version);
  std::sort(out.begin(), out.end());
  return out;
}

grpc::ServerUnaryReactor* BroadcastSender::Register(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* raw_request,
                                                    grpc::ByteBuffer* raw_response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  CountReceived(state_->options.received_bytes, *raw_request);
  v1::RegisterRequest request;
  v1::RegisterResponse response;
  std::string principal, share_key;
  grpc::Status status = state_->Authorize(*ctx, &principal, &share_key);
  if (status.ok()) status = ToGrpcStatus(ParseRawRequest(*raw_request, &request));
  if (status.ok()) status = DoRegister(principal, share_key, request, &response);
  if (status.ok()) SerializeReply(response, raw_response);
  reactor->Finish(status);
  return reactor;
}

grpc::Status BroadcastSender::DoRegister(const std::string& principal, const std::string& share_key,
                                         const v1::RegisterRequest& request,
                                         v1::RegisterResponse* response) {
  State& st = *state_;
  grpc::Status status;
  const std::string& id = request.receiver_id();
  if (id.empty() || id.size() > kMaxReceiverIdBytes) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("receiver_id must be 1 to ", kMaxReceiverIdBytes, " bytes, got ", id.size()));
  }
  if (request.model_signature() != st.model_signature) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("receiver ", QuoteForMessage(id), " has model signature ",
                     QuoteForMessage(request.model_signature()),
                     ", not the learner's; both must run the same architecture (GetStatus's "
                     "model_signature gives the learner's)"));
  }
  // gRPC is always available. The NCCL transport is chosen while ranks are
  // still free and when the receiver lists TRANSPORT_NCCL first: the reply
  // then also carries the communicator's unique id, the rank and the world
  // size.
  const bool wants_nccl =
      request.transports_size() > 0 && request.transports(0) == v1::TRANSPORT_NCCL;
  v1::Transport transport = v1::TRANSPORT_GRPC;
  {
    absl::MutexLock lock(&st.mu);
    st.ExpireUnsubscribedLocked();
    auto owner = st.session_of.find(id);
    if (owner != st.session_of.end() && st.TakenByAnotherLocked(owner->second, principal)) {
      if (st.options.authorizer != nullptr) {
        st.options.authorizer->CountRefusal("PERMISSION_DENIED", "session_owner");
      }
      status =
          grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                       absl::StrCat("receiver ", QuoteForMessage(id), " is registered by ",
                                    st.anonymous() ? "another connection" : "another principal"));
    } else if (st.shut_down) {
      status = ShuttingDown();
    } else if (grpc::Status full =
                   st.RegistrationRoomLocked(owner != st.session_of.end(), id, share_key);
               !full.ok()) {
      status = full;
    } else {
      SenderState::Session& session =
          CreateSessionLocked(st, request, principal, share_key, response);
      if (wants_nccl && internal::AssignNcclRankLocked(st, session) > 0) {
        transport = v1::TRANSPORT_NCCL;
        response->set_nccl_unique_id(st.nccl_unique_id);
        response->set_nccl_rank(session.nccl_rank);
        response->set_nccl_world_size(st.options.nccl_world_size);
      }
    }
  }
  if (status.ok()) {
    response->set_transport(transport);
    VLOG(1) << "registered receiver " << id << " at version " << request.current_version()
            << (transport == v1::TRANSPORT_NCCL
                    ? absl::StrCat(" as NCCL rank ", response->nccl_rank())
                    : std::string(" on gRPC"));
  }
  return status;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* BroadcastSender::Subscribe(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw_request) {
  State& st = *state_;
  CountReceived(st.options.received_bytes, *raw_request);
  v1::SubscribeRequest request;
  std::string principal;
  grpc::Status status = st.Authorize(*ctx, &principal);
  if (status.ok()) status = ToGrpcStatus(ParseRawRequest(*raw_request, &request));
  if (!status.ok()) return new SubscribeReactor(&st, status);
  absl::MutexLock lock(&st.mu);
  if (st.shut_down) {
    return new SubscribeReactor(&st, ShuttingDown());
  }
  State::Session* found = nullptr;
  status = st.FindSessionLocked(request.session_id(), principal, &found);
  if (!status.ok()) return new SubscribeReactor(&st, status);
  State::Session& session = *found;
  if (session.stream != nullptr) {
    session.stream->End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                     "replaced by a newer Subscribe on the same session"));
  }
  ctx->AddInitialMetadata(kSubscribedMetadataKey, "1");
  auto* stream = new SubscribeReactor(&st, request.session_id(), request.after_version());
  session.stream = stream;
  if (st.latest != nullptr && !st.UsesNcclLocked(session)) stream->Offer(st.latest->announcement);
  st.nccl_cv.SignalAll();
  st.UpdateReceiverGauges();
  return stream;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* BroadcastSender::FetchSnapshot(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw_request) {
  State& st = *state_;
  CountReceived(st.options.received_bytes, *raw_request);
  v1::FetchSnapshotRequest parsed;
  std::string principal, share_key;
  grpc::Status status = st.Authorize(*ctx, &principal, &share_key);
  if (status.ok()) status = ToGrpcStatus(ParseRawRequest(*raw_request, &parsed));
  if (!status.ok()) return internal::RefuseFetch(&st, status);
  const v1::FetchSnapshotRequest* request = &parsed;
  std::shared_ptr<const Snapshot> snapshot;
  {
    absl::MutexLock lock(&st.mu);
    State::Session* session = nullptr;
    status = st.FindSessionLocked(request->session_id(), principal, &session);
    if (!status.ok()) return internal::RefuseFetch(&st, status);
    const int total = st.options.max_concurrent_fetches;
    const int per_key = std::min(total, st.options.max_fetches_per_principal > 0
                                            ? st.options.max_fetches_per_principal
                                            : std::max(1, total / 4));
    const auto mine = st.fetches_by_key.find(share_key);
    const int of_key = mine == st.fetches_by_key.end() ? 0 : mine->second;
    if (session->fetches >= st.options.max_fetches_per_session || of_key >= per_key ||
        st.fetches >= total) {
      if (of_key >= per_key && st.options.authorizer != nullptr) {
        st.options.authorizer->CountRefusal("RESOURCE_EXHAUSTED", "fetches");
      }
      return internal::RefuseFetch(
          &st, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat(session->fetches, " fetches of this session, ", of_key,
                                         " of ", QuoteForMessage(share_key), " and ", st.fetches,
                                         " in all are under way (limits ",
                                         st.options.max_fetches_per_session, ", ", per_key, " and ",
                                         total, "); finish or cancel one first")));
    }
    // Only the newest snapshot is served. An older one stays alive while
    // fetches that started before it was replaced finish, but a new fetch
    // for it is refused: the receiver has a newer announcement waiting.
    if (st.latest == nullptr || st.latest->version() != request->version()) {
      return internal::RefuseFetch(
          &st,
          grpc::Status(grpc::StatusCode::NOT_FOUND,
                       absl::StrCat("version ", request->version(), " is not held; the latest is ",
                                    st.latest == nullptr ? 0 : st.latest->version())));
    }
    snapshot = st.latest;
    ++session->fetches;
    ++st.fetches;
    ++st.fetches_by_key[share_key];
    State::Fetching& f = st.fetching[request->session_id()];
    f.share_key = share_key;
    ++f.count;
  }
  uint64_t chunk =
      request->max_chunk_bytes() == 0 ? st.options.default_chunk_bytes : request->max_chunk_bytes();
  chunk = std::min<uint64_t>(std::max<uint64_t>(chunk, st.options.min_chunk_bytes),
                             st.options.max_chunk_bytes_cap);
  return internal::StartFetch(&st, ctx, request->session_id(), std::move(snapshot), chunk);
}

grpc::ServerUnaryReactor* BroadcastSender::ReportVersion(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* raw_request,
                                                         grpc::ByteBuffer* raw_response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  CountReceived(state_->options.received_bytes, *raw_request);
  v1::ReportVersionRequest request;
  WireLimits limits;
  limits.max_string_bytes = 64 << 10;  // the receiver's error text
  std::string principal;
  grpc::Status status = state_->Authorize(*ctx, &principal);
  if (status.ok()) status = ToGrpcStatus(ParseRawRequest(*raw_request, &request, limits));
  if (status.ok()) status = DoReportVersion(principal, request);
  if (status.ok()) SerializeReply(v1::ReportVersionResponse(), raw_response);
  reactor->Finish(status);
  return reactor;
}

grpc::Status BroadcastSender::DoReportVersion(const std::string& principal,
                                              const v1::ReportVersionRequest& request) {
  State& st = *state_;
  grpc::Status status;
  std::string receiver_id;
  bool count_failure = false;
  {
    absl::MutexLock lock(&st.mu);
    State::Session* session = nullptr;
    status = st.FindSessionLocked(request.session_id(), principal, &session);
    if (!status.ok()) return status;
    // A receiver can only hold a version that was published; anything
    // newer would poison the oldest-version gauge and the staleness alert.
    const uint64_t latest = st.latest == nullptr ? 0 : st.latest->version();
    if (request.version() > latest) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("version ", request.version(),
                                       " was never published (the newest is ", latest, ")"));
    }
    session->version = st.OwnVersionLocked(request.version(), request.incarnation());
    receiver_id = session->receiver_id;
    // One session's reports count at most once per interval: a receiver
    // (or a client posing as one) cannot raise the failure count at will.
    const absl::Time now = st.options.clock->Now();
    if (!request.error().empty() &&
        now - session->failure_counted >= st.options.failure_count_interval) {
      session->failure_counted = now;
      count_failure = true;
    }
    st.UpdateReceiverGauges();
  }
  if (!request.error().empty() && count_failure) {
    st.CountFailure();
    if (int64_t held_back = 0; st.failure_report_log.Allow(&held_back)) {
      LOG(WARNING) << "receiver " << QuoteForMessage(receiver_id) << " (still at version "
                   << request.version() << ") reports: " << QuoteForMessage(request.error(), 512)
                   << st.failure_report_log.HeldBack(held_back);
    }
  }
  return grpc::Status::OK;
}

}  // namespace asympo::broadcast
