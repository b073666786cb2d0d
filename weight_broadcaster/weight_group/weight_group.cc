#include "weight_broadcaster/weight_group/weight_group.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>

#include <ATen/ATen.h>
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/daemon/metric_builders.h"
#include "common/grpc_status.h"
#include "common/wire/raw_messages.h"
#include "weight_broadcaster/weight_group/weight_group_state.h"
#include "weight_broadcaster/weight_group/weight_group_store.h"

namespace asympo::broadcast {
absl::StatusOr<std::unique_ptr<WeightGroup>> WeightGroup::Create(WeightGroupOptions o,
                                                                 SnapshotStore& store,
                                                                 prometheus::Registry& registry) {
  if (o.backend != "gloo" && o.backend != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("weight group: backend \"", o.backend, "\" is neither gloo nor nccl"));
  }
  if (o.backend == "gloo" && !collective::GlooGroupBuilt()) {
    return absl::FailedPreconditionError(
        absl::StrCat("weight group: ", collective::GlooGroupMissing()));
  }
  if (o.backend == "nccl" && !collective::NcclGroupBuilt()) {
    return absl::FailedPreconditionError(
        absl::StrCat("weight group: ", collective::NcclGroupMissing()));
  }
  if (o.address.empty()) return absl::InvalidArgumentError("weight group: empty address");
  if (o.timeout <= absl::ZeroDuration() || o.ready_timeout <= absl::ZeroDuration() ||
      o.join_window < absl::ZeroDuration() || o.worker_id_ttl <= absl::ZeroDuration() ||
      o.rendezvous_backoff < absl::ZeroDuration() ||
      o.max_rendezvous_backoff < o.rendezvous_backoff) {
    return absl::InvalidArgumentError(
        "weight group: timeouts must be positive, and max_rendezvous_backoff at least "
        "rendezvous_backoff");
  }
  if (o.max_members < 1 || o.max_waiting < 1 || o.max_waiting_per_caller < 1 ||
      o.max_waiting_per_member < 1 || o.max_store_bytes < 1 || o.max_store_keys < 1 ||
      o.max_store_bytes_per_member < 1 || o.max_store_keys_per_member < 1 ||
      o.max_worker_ids_per_principal < 1) {
    return absl::InvalidArgumentError("weight group: every limit must be at least 1");
  }
  auto st = std::make_unique<State>();
  st->options = std::move(o);
  st->members_gauge = &metrics::AddGauge(registry, "asympo_weight_group_members",
                                         "Workers in the weight group's current generation.");
  st->generation_gauge = &metrics::AddGauge(registry, "asympo_weight_group_generation",
                                            "The weight group's current generation (0: none).");
  st->versions_total = &metrics::AddCounter(registry, "asympo_weight_group_versions_total",
                                            "Versions the weight group broadcast.");
  st->delta_versions_total =
      &metrics::AddCounter(registry, "asympo_weight_group_delta_versions_total",
                           "Versions the weight group broadcast as their delta against the "
                           "version every member held.");
  st->bytes_total = &metrics::AddCounter(registry, "asympo_weight_group_bytes_total",
                                         "Bytes the weight group broadcast (each once, whatever "
                                         "the number of members).");
  st->failures = &prometheus::BuildCounter()
                      .Name("asympo_weight_group_failures_total")
                      .Help(
                          "Weight group failures, by reason: rendezvous, broadcast and "
                          "ready_timeout (a member did not ask in time) end the generation; "
                          "trial_rendezvous (newcomers did not connect beside it) and "
                          "receiver_crc (a member reported a bucket that failed its CRC) do "
                          "not.")
                      .Register(registry);
  for (const char* r :
       {"rendezvous", "trial_rendezvous", "broadcast", "ready_timeout", "receiver_crc"}) {
    st->failures->Add({{"reason", r}});
  }
  State* raw = st.get();
  std::unique_ptr<WeightGroup> g(new WeightGroup(std::move(st)));
  raw->snapshots = &store;
  // A new snapshot wakes the group thread, which reads it from the store.
  raw->reader_id = store.AddReader([raw](const std::shared_ptr<const Snapshot>&) {
    absl::MutexLock lock(&raw->mu);
    raw->cv.SignalAll();
  });
  raw->thread = std::thread([raw] { raw->Loop(); });
  raw->answerer = std::thread([raw] { raw->Answer(); });
  LOG(INFO) << "weight group: " << raw->options.backend << ", rank 0 at " << raw->options.address
            << ", collective timeout " << absl::FormatDuration(raw->options.timeout);
  return g;
}

WeightGroup::WeightGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}

WeightGroup::~WeightGroup() {
  state_->snapshots->RemoveReader(state_->reader_id);
  Shutdown();
  if (state_->thread.joinable()) state_->thread.join();
  if (state_->answerer.joinable()) state_->answerer.join();
  if (state_->trial_thread.joinable()) state_->trial_thread.join();
}

void WeightGroup::Shutdown() {
  absl::MutexLock lock(&state_->mu);
  state_->shut_down = true;
  state_->cv.SignalAll();
}

uint64_t WeightGroup::generation() const {
  absl::MutexLock lock(&state_->mu);
  return state_->generation;
}

int WeightGroup::members() const {
  absl::MutexLock lock(&state_->mu);
  return state_->phase == State::Phase::kNone ? 0 : static_cast<int>(state_->members.size());
}

int WeightGroup::waiting_calls() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<int>(state_->waiting.size());
}

int64_t WeightGroup::versions_sent() const {
  absl::MutexLock lock(&state_->mu);
  return state_->versions_sent;
}

// --- The calls. ---

namespace {

// The caller of `ctx` if it may read weights, and its share key; else the
// refusal (counted by the authorizer).
grpc::Status Authorize(const WeightGroupOptions& o, const grpc::CallbackServerContext& ctx,
                       std::string* caller) {
  absl::StatusOr<const security::Principal*> who =
      security::AuthorizeCall(o.authorizer, ctx, security::Role::kReadWeights);
  if (!who.ok()) return ToGrpcStatus(who.status());
  *caller = security::ShareKey(o.authorizer, **who, ctx);
  return grpc::Status::OK;
}

// The request's bytes counted, its caller authorized, then the request
// checked on the wire and parsed.
grpc::Status Accept(const WeightGroupOptions& o, const grpc::CallbackServerContext& ctx,
                    const grpc::ByteBuffer& raw, google::protobuf::Message* request,
                    std::string* caller, const WireLimits& limits = {}) {
  CountReceived(o.received_bytes, raw);
  grpc::Status status = Authorize(o, ctx, caller);
  if (status.ok()) status = ToGrpcStatus(ParseRawRequest(raw, request, limits));
  return status;
}

grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* Replied(grpc::CallbackServerContext* ctx,
                                  const google::protobuf::Message& response,
                                  grpc::ByteBuffer* reply) {
  SerializeReply(response, reply);
  return Finished(ctx, grpc::Status::OK);
}

// A Join's checks that need no lock.
grpc::Status CheckJoin(const WeightGroupOptions& o, const SnapshotStore& store,
                       const v1::JoinGroupRequest& r) {
  const std::string& id = r.worker_id();
  if (id.empty() || id.size() > kMaxWorkerIdBytes) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("worker_id must be 1 to ", kMaxWorkerIdBytes, " bytes, not ", id.size()));
  }
  if (r.model_signature().empty() || r.model_signature().size() > kMaxSignatureBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("model_signature must be 1 to ", kMaxSignatureBytes,
                                     " bytes (GetStatus's model_signature gives the learner's), "
                                     "not ",
                                     r.model_signature().size()));
  }
  if (r.backend() != o.backend) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("the weight group's backend is ", o.backend, ", not \"",
                                     r.backend().substr(0, 16), "\""));
  }
  if (r.model_signature() != store.model_signature()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the worker's model_signature differs from the learner's model");
  }
  return grpc::Status::OK;
}

// A Next's checks that need no lock.
grpc::Status CheckNext(const v1::GroupNextRequest& r) {
  grpc::Status status = CheckMemberToken(r.member_token());
  if (status.ok() && r.held_incarnation().size() > kMaxSignatureBytes) {
    status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("held_incarnation must be at most ", kMaxSignatureBytes,
                                       " bytes, not ", r.held_incarnation().size()));
  }
  return status;
}

}  // namespace

grpc::Status WeightGroup::State::AdmitJoinLocked(const std::string& id, const std::string& owner,
                                                 grpc::CallbackServerContext* ctx) {
  bool rejoining = this->rejoining.contains(id) || proven.contains(id);
  for (const Member& m : members) rejoining = rejoining || m.worker_id == id;
  absl::Duration retry = absl::ZeroDuration();
  std::string cause;
  grpc::Status status = ids.Admit(
      id, owner, rejoining, absl::Now(),
      [this](const std::string& x) {
        mu.AssertHeld();
        return InUseLocked(x);
      },
      &retry, &cause);
  if (status.ok()) return status;
  CountRefusal(status, cause);
  if (retry > absl::ZeroDuration()) {
    ctx->AddTrailingMetadata(kRetryAfterMetadataKey,
                             std::to_string(absl::ToInt64Milliseconds(retry)));
  }
  return status;
}

grpc::ServerUnaryReactor* WeightGroup::Join(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* raw, grpc::ByteBuffer* reply) {
  State& st = *state_;
  v1::JoinGroupRequest request;
  auto w = std::make_unique<State::Waiting>();
  grpc::Status status = Accept(st.options, *ctx, *raw, &request, &w->caller);
  if (status.ok()) status = CheckJoin(st.options, *st.snapshots, request);
  if (!status.ok()) return Finished(ctx, status);
  const std::string& id = request.worker_id();
  absl::MutexLock lock(&st.mu);
  if (st.shut_down) return Finished(ctx, GroupShuttingDown());
  status = st.AdmitJoinLocked(id, w->caller, ctx);
  if (!status.ok()) return Finished(ctx, status);
  if (static_cast<int>(st.joiners.size()) >= st.options.max_members && !st.joiners.contains(id)) {
    return Finished(ctx, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                      absl::StrCat("the weight group has ", st.options.max_members,
                                                   " workers waiting to join already")));
  }
  w->Bind(State::Waiting::Kind::kJoin, ctx, reply, WaitOf(request.wait_ms(), kMaxWaitMs));
  auto j = std::make_shared<State::Joiner>();
  j->worker_id = id;
  j->owner = w->caller;
  w->joiner = j;
  bool parked = false;
  grpc::ServerUnaryReactor* reactor = st.ParkLocked(std::move(w), &parked);
  if (!parked) return reactor;
  j->seq = ++st.join_seq;
  if (auto it = st.joiners.find(id); it != st.joiners.end()) {
    it->second->replaced = true;
    it->second = j;
  } else {
    st.joiners.emplace(id, j);
  }
  // A worker joining again under a member's id (a restarted one) goes
  // through a trial like any newcomer: the generation goes on meanwhile.
  st.cv.SignalAll();
  return reactor;
}

grpc::ServerUnaryReactor* WeightGroup::Store(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* raw, grpc::ByteBuffer* reply) {
  State& st = *state_;
  v1::GroupStoreRequest request;
  std::string caller;
  grpc::Status status = Accept(st.options, *ctx, *raw, &request, &caller, StoreWireLimits());
  if (status.ok()) status = CheckStoreRequest(request);
  if (!status.ok()) return Finished(ctx, status);
  std::shared_ptr<GenerationStore> store;
  std::string worker;
  {
    absl::MutexLock lock(&st.mu);
    if (st.shut_down) return Finished(ctx, GroupShuttingDown());
    State::Member* m = st.MemberOf(request.member_token(), &store);
    if (m == nullptr) {
      return Finished(
          ctx, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("member token \"", request.member_token().substr(0, 40),
                                         "\" names no member of the weight group's "
                                         "generation ",
                                         st.generation, "; Join again")));
    }
    m->last_seen = absl::Now();
    ++m->store_ops;
    worker = m->worker_id;
  }
  v1::GroupStoreResponse response;
  std::string cause;
  status = store->Run(request.member_token(), worker, request, &response, &cause);
  if (!status.ok()) {
    st.CountRefusal(status, cause);
    return Finished(ctx, status);
  }
  if (!IsStoreWait(request) || response.ready()) return Replied(ctx, response, reply);
  // Keys not set yet: parked until they are or its wait ends.
  auto w = std::make_unique<State::Waiting>();
  w->Bind(State::Waiting::Kind::kStore, ctx, reply, WaitOf(request.wait_ms(), kMaxStoreWaitMs));
  w->caller = std::move(caller);
  w->token = request.member_token();
  w->request = std::move(request);
  w->group_store = store->store();
  absl::MutexLock lock(&st.mu);
  if (st.shut_down) return Finished(ctx, GroupShuttingDown());
  bool parked = false;
  return st.ParkLocked(std::move(w), &parked);
}

grpc::ServerUnaryReactor* WeightGroup::Next(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* raw, grpc::ByteBuffer* reply) {
  State& st = *state_;
  v1::GroupNextRequest request;
  auto w = std::make_unique<State::Waiting>();
  grpc::Status status = Accept(st.options, *ctx, *raw, &request, &w->caller);
  if (status.ok()) status = CheckNext(request);
  if (!status.ok()) return Finished(ctx, status);
  absl::MutexLock lock(&st.mu);
  if (st.shut_down) return Finished(ctx, GroupShuttingDown());
  State::Member* m = st.MemberOf(request.member_token());
  if (m == nullptr) {
    v1::GroupNextResponse response;
    response.set_action(v1::GroupNextResponse::ACTION_REJOIN);
    return Replied(ctx, response, reply);
  }
  w->Bind(State::Waiting::Kind::kNext, ctx, reply, WaitOf(request.wait_ms(), kMaxWaitMs));
  w->token = m->token;
  bool parked = false;
  grpc::ServerUnaryReactor* reactor = st.ParkLocked(std::move(w), &parked);
  if (!parked) return reactor;
  if (request.received() && !request.received_ok()) {
    LOG(WARNING) << "weight group: " << m->worker_id << " received version "
                 << request.received_version() << " with a bucket that failed its CRC-32C";
    st.Fail("receiver_crc");
  }
  m->held_version = request.held_version();
  m->held_incarnation = request.held_incarnation();
  m->accepts_delta = request.accepts_delta();
  m->asking = true;
  m->told = false;
  m->action = v1::GroupNextResponse::ACTION_WAIT;
  m->asked_since = absl::Now();
  m->last_seen = m->asked_since;
  ++m->calls;
  st.cv.SignalAll();
  return reactor;
}

}  // namespace asympo::broadcast
