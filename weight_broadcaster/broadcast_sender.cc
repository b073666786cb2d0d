#include "weight_broadcaster/broadcast_sender.h"

#include <algorithm>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/wire/raw_messages.h"
#include "weight_broadcaster/sender_internal.h"
#include "weight_broadcaster/wire_format.h"

namespace asympo::broadcast {
namespace {

using internal::SenderState;
using internal::SubscribeReactor;

constexpr size_t kMaxReceiverIdBytes = 128;

// Starts a session for `request`, ending the receiver's previous one.
SenderState::Session& CreateSessionLocked(SenderState& st, const v1::RegisterRequest& request,
                                          const std::string& principal,
                                          const std::string& share_key,
                                          v1::RegisterResponse* response)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
  const std::string& id = request.receiver_id();
  internal::SessionRegistry::Created created = st.sessions.Create(id, principal, share_key);
  if (created.replaced_stream != nullptr) {
    created.replaced_stream->End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                              "session replaced: the receiver registered again"));
  }
  if (int64_t held_back = 0; created.replaced && st.registered_again_log.Allow(&held_back)) {
    LOG(INFO) << "receiver " << QuoteForMessage(id)
              << " registered again; its previous session ends"
              << st.registered_again_log.HeldBack(held_back);
  }
  SenderState::Session& session = *created.session;
  // A version above the latest published is taken as the latest: a lie
  // must not move the oldest-version gauge, and a learner restarted from an
  // older checkpoint must not refuse its receivers (their versions are
  // above its own until they load its weights). Before any publish there is
  // nothing to check against.
  session.version = st.OwnVersionLocked(request.current_version(), request.current_incarnation());
  const std::shared_ptr<const Snapshot> latest = st.store.latest();
  if (latest != nullptr) session.version = std::min(session.version, latest->version());
  response->set_session_id(created.session_id);
  response->set_latest_version(latest == nullptr ? 0 : latest->version());
  response->set_incarnation(st.store.incarnation());
  st.UpdateReceiverGauges();
  return session;
}

// The store's reader: `snapshot`, now the store's latest, is announced to
// every subscriber on gRPC (the NCCL thread announces it to its ranks).
void OnPublished(SenderState& st, const std::shared_ptr<const Snapshot>& snapshot) {
  absl::MutexLock lock(&st.mu);
  for (auto& [id, s] : st.sessions) {
    if (s.stream != nullptr && !st.UsesNcclLocked(s)) s.stream->Offer(snapshot->announcement);
  }
  st.nccl_cv.SignalAll();
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

BroadcastSender::BroadcastSender(BroadcastSenderOptions options, SnapshotStore& store,
                                 prometheus::Registry& registry)
    : state_(std::make_unique<State>(std::move(options), store, registry)) {
  State& st = *state_;
  st.reader_id = store.AddReader(
      [&st](const std::shared_ptr<const Snapshot>& snapshot) { OnPublished(st, snapshot); });
  const int world = st.options.nccl_world_size;
  if (world <= 0) return;
  if (world == 1) {
    LOG(WARNING) << "NCCL world size 1 has no receivers; weights go over gRPC";
    return;
  }
  internal::StartNccl(st);
}

BroadcastSender::~BroadcastSender() {
  state_->store.RemoveReader(state_->reader_id);
  Shutdown();
  if (state_->nccl_thread.joinable()) state_->nccl_thread.join();
}

bool BroadcastSender::nccl_configured() const { return state_->options.nccl_world_size >= 2; }

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

int BroadcastSender::active_receivers() const {
  absl::MutexLock lock(&state_->mu);
  return state_->sessions.subscribed();
}

bool BroadcastSender::nccl_active() const {
  absl::MutexLock lock(&state_->mu);
  return state_->nccl_phase == SenderState::NcclPhase::kRunning;
}

int64_t BroadcastSender::nccl_versions_sent() const {
  absl::MutexLock lock(&state_->mu);
  return state_->nccl_versions;
}

int64_t BroadcastSender::nccl_delta_versions_sent() const {
  absl::MutexLock lock(&state_->mu);
  return state_->nccl_delta_versions;
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
  if (request.model_signature().empty()) {
    // One rule with the weight group's Join: a receiver states the model
    // it holds; nothing is taken on trust.
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("receiver ", QuoteForMessage(id),
                                     ": model_signature is empty (GetStatus's model_signature "
                                     "gives the learner's)"));
  }
  if (request.model_signature() != st.store.model_signature()) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("receiver ", QuoteForMessage(id), " has model signature ",
                     QuoteForMessage(request.model_signature()),
                     ", not the learner's; both must run the same architecture, with the same "
                     "adapters when the learner trains adapters (--lora_rank, --lora_alpha, "
                     "--lora_targets; GetStatus's model_signature gives the learner's)"));
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
    status = st.sessions.AdmitRegistration(id, principal, share_key);
    if (status.ok() && st.shut_down) status = ShuttingDown();
    if (status.ok()) {
      SenderState::Session& session =
          CreateSessionLocked(st, request, principal, share_key, response);
      if (wants_nccl && internal::AssignNcclRankLocked(st, session, request.nccl_deltas()) > 0) {
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
  status = st.sessions.Find(request.session_id(), principal, &found);
  if (!status.ok()) return new SubscribeReactor(&st, status);
  State::Session& session = *found;
  if (session.stream != nullptr) {
    session.stream->End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                     "replaced by a newer Subscribe on the same session"));
  }
  ctx->AddInitialMetadata(kSubscribedMetadataKey, "1");
  auto* stream = new SubscribeReactor(&st, request.session_id(), request.after_version());
  session.stream = stream;
  if (std::shared_ptr<const Snapshot> latest = st.store.latest();
      latest != nullptr && !st.UsesNcclLocked(session)) {
    stream->Offer(latest->announcement);
  }
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
    status = st.sessions.Find(request->session_id(), principal, &session);
    if (status.ok()) status = st.sessions.AdmitFetch(*session, share_key);
    if (!status.ok()) return internal::RefuseFetch(&st, status);
    // Only the newest snapshot is served. An older one stays alive while
    // fetches that started before it was replaced finish, but a new fetch
    // for it is refused: the receiver has a newer announcement waiting.
    snapshot = st.store.latest();
    if (snapshot == nullptr || snapshot->version() != request->version()) {
      return internal::RefuseFetch(
          &st,
          grpc::Status(grpc::StatusCode::NOT_FOUND,
                       absl::StrCat("version ", request->version(), " is not held; the latest is ",
                                    snapshot == nullptr ? 0 : snapshot->version())));
    }
    // Another learner process's version of that number is gone too.
    if (!request->incarnation().empty() &&
        request->incarnation() != snapshot->manifest().incarnation()) {
      return internal::RefuseFetch(
          &st, grpc::Status(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("version ", request->version(), " of incarnation ",
                                         QuoteForMessage(request->incarnation(), 64),
                                         " is not held: this learner is incarnation ",
                                         snapshot->manifest().incarnation(), " (it restarted)")));
    }
    st.sessions.FetchStarted(request->session_id(), *session, share_key);
  }
  uint64_t chunk =
      request->max_chunk_bytes() == 0 ? st.options.default_chunk_bytes : request->max_chunk_bytes();
  chunk = std::min<uint64_t>(std::max<uint64_t>(chunk, st.options.min_chunk_bytes),
                             st.options.max_chunk_bytes_cap);
  // A delta when the receiver holds the version this one's delta is from.
  const bool delta = request->has_base() && !request->incarnation().empty() &&
                     snapshot->delta != nullptr && snapshot->manifest().has_delta_base() &&
                     request->base_version() == snapshot->manifest().delta_base_version();
  return internal::StartFetch(&st, ctx, request->session_id(), std::move(snapshot), chunk, delta);
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
    status = st.sessions.Find(request.session_id(), principal, &session);
    if (!status.ok()) return status;
    // A receiver can only hold a version that was published; anything
    // newer would poison the oldest-version gauge and the staleness alert.
    const uint64_t latest = st.store.latest_version();
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
