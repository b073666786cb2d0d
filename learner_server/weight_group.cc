#include "learner_server/weight_group.h"

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
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/daemon/metric_builders.h"
#include "common/grpc_status.h"
#include "learner_server/weight_group_state.h"
#include "learner_server/weight_group_store.h"

namespace asympo::learner {
namespace {

// Every call that finds the server stopping gets the same answer; clients
// treat UNAVAILABLE as "try again elsewhere or later".
grpc::Status ShuttingDown() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the learner is shutting down");
}

}  // namespace

absl::StatusOr<std::unique_ptr<WeightGroup>> WeightGroup::Create(WeightGroupOptions o,
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
      o.join_window < absl::ZeroDuration() || o.max_members < 1) {
    return absl::InvalidArgumentError("weight group: timeouts must be positive");
  }
  auto st = std::make_unique<State>();
  st->options = std::move(o);
  st->members_gauge = &metrics::AddGauge(registry, "asympo_weight_group_members",
                                         "Workers in the weight group's current generation.");
  st->generation_gauge = &metrics::AddGauge(registry, "asympo_weight_group_generation",
                                            "The weight group's current generation (0: none).");
  st->versions_total = &metrics::AddCounter(registry, "asympo_weight_group_versions_total",
                                            "Versions the weight group broadcast.");
  st->failures = &prometheus::BuildCounter()
                      .Name("asympo_weight_group_failures_total")
                      .Help(
                          "Weight group failures, by reason: rendezvous, broadcast and "
                          "ready_timeout (a member did not ask in time) end the generation; "
                          "receiver_crc (a member reported a bucket that failed its CRC) does "
                          "not.")
                      .Register(registry);
  for (const char* r : {"rendezvous", "broadcast", "ready_timeout", "receiver_crc"}) {
    st->failures->Add({{"reason", r}});
  }
  State* raw = st.get();
  std::unique_ptr<WeightGroup> g(new WeightGroup(std::move(st)));
  raw->thread = std::thread([raw] { raw->Loop(); });
  LOG(INFO) << "weight group: " << raw->options.backend << ", rank 0 at " << raw->options.address
            << ", collective timeout " << absl::FormatDuration(raw->options.timeout);
  return g;
}

WeightGroup::WeightGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}

WeightGroup::~WeightGroup() {
  Shutdown();
  if (state_->thread.joinable()) state_->thread.join();
}

void WeightGroup::Shutdown() {
  absl::MutexLock lock(&state_->mu);
  state_->shut_down = true;
  state_->cv.SignalAll();
}

void WeightGroup::Offer(std::shared_ptr<const v1::SnapshotManifest> manifest,
                        broadcast::HostBuckets host) {
  State& st = *state_;
  absl::MutexLock lock(&st.mu);
  st.latest = std::move(manifest);
  st.latest_host = std::move(host);
  st.cv.SignalAll();
}

uint64_t WeightGroup::generation() const {
  absl::MutexLock lock(&state_->mu);
  return state_->generation;
}

int WeightGroup::members() const {
  absl::MutexLock lock(&state_->mu);
  return state_->phase == State::Phase::kNone ? 0 : static_cast<int>(state_->members.size());
}

int64_t WeightGroup::versions_sent() const {
  absl::MutexLock lock(&state_->mu);
  return state_->versions_sent;
}

// --- The calls. ---

grpc::Status WeightGroup::Join(grpc::ServerContext* ctx, const v1::JoinGroupRequest* request,
                               v1::JoinGroupResponse* response) {
  State& st = *state_;
  absl::StatusOr<const security::Principal*> who =
      security::AuthorizeCall(st.options.authorizer, *ctx, security::Role::kReadWeights);
  if (!who.ok()) return ToGrpcStatus(who.status());
  const std::string& id = request->worker_id();
  if (id.empty() || id.size() > kMaxWorkerIdBytes) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("worker_id must be 1 to ", kMaxWorkerIdBytes, " bytes, not ", id.size()));
  }
  if (request->backend() != st.options.backend) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("the weight group's backend is ", st.options.backend,
                                     ", not \"", request->backend().substr(0, 16), "\""));
  }
  if (!request->model_signature().empty() &&
      request->model_signature() != st.options.model_signature) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the worker's model_signature differs from the learner's model");
  }
  const absl::Time deadline = absl::Now() + WaitOf(request->wait_ms(), kMaxWaitMs);
  absl::MutexLock lock(&st.mu);
  if (st.shut_down) return ShuttingDown();
  if (static_cast<int>(st.joiners.size()) >= st.options.max_members && !st.joiners.contains(id)) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("the weight group has ", st.options.max_members,
                                     " workers waiting to join already"));
  }
  auto j = std::make_shared<State::Joiner>();
  j->worker_id = id;
  j->seq = ++st.join_seq;
  if (auto it = st.joiners.find(id); it != st.joiners.end()) {
    it->second->replaced = true;
    it->second = j;
  } else {
    st.joiners.emplace(id, j);
  }
  // A member joining again (a restarted worker) ends its generation.
  for (const State::Member& m : st.members) {
    if (m.worker_id == id && st.phase != State::Phase::kForming) {
      st.RegroupLocked(absl::StrCat(id, " joined again"));
    }
  }
  st.cv.SignalAll();
  while (!j->formed && !j->replaced && !st.shut_down && !ctx->IsCancelled()) {
    if (st.cv.WaitWithDeadline(&st.mu, deadline) && absl::Now() >= deadline) break;
  }
  if (j->replaced) {
    return grpc::Status(grpc::StatusCode::ABORTED,
                        absl::StrCat("a newer Join for worker ", id, " took this one's place"));
  }
  if (st.shut_down) return ShuttingDown();
  if (!j->formed) {
    // Not formed in time: the worker calls again, unless a formation that
    // counts it is gathering right now.
    if (st.phase != State::Phase::kForming) {
      auto it = st.joiners.find(id);
      if (it != st.joiners.end() && it->second == j) st.joiners.erase(it);
    }
    response->set_formed(false);
    return grpc::Status::OK;
  }
  response->set_formed(true);
  response->set_generation(j->generation);
  response->set_rank(static_cast<uint32_t>(j->rank));
  response->set_world_size(static_cast<uint32_t>(j->world_size));
  response->set_backend(st.options.backend);
  response->set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(st.options.timeout)));
  response->set_member_token(j->token);
  return grpc::Status::OK;
}

grpc::Status WeightGroup::Store(grpc::ServerContext* ctx, const v1::GroupStoreRequest* request,
                                v1::GroupStoreResponse* response) {
  State& st = *state_;
  absl::StatusOr<const security::Principal*> who =
      security::AuthorizeCall(st.options.authorizer, *ctx, security::Role::kReadWeights);
  if (!who.ok()) return ToGrpcStatus(who.status());
  if (grpc::Status bad = CheckStoreRequest(*request); !bad.ok()) return bad;
  c10::intrusive_ptr<c10d::Store> store;
  {
    absl::MutexLock lock(&st.mu);
    State::Member* m = st.MemberOf(request->member_token());
    if (m == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("member token \"", request->member_token().substr(0, 40),
                                       "\" names no member of the weight group's generation ",
                                       st.generation, "; Join again"));
    }
    m->last_seen = absl::Now();
    store = st.store;
  }
  return RunStoreOp(*store, *request, response);
}

grpc::Status WeightGroup::Next(grpc::ServerContext* ctx, const v1::GroupNextRequest* request,
                               v1::GroupNextResponse* response) {
  State& st = *state_;
  absl::StatusOr<const security::Principal*> who =
      security::AuthorizeCall(st.options.authorizer, *ctx, security::Role::kReadWeights);
  if (!who.ok()) return ToGrpcStatus(who.status());
  const absl::Time deadline = absl::Now() + WaitOf(request->wait_ms(), kMaxWaitMs);
  absl::MutexLock lock(&st.mu);
  if (st.shut_down) return ShuttingDown();
  State::Member* m = st.MemberOf(request->member_token());
  if (m == nullptr) {
    response->set_action(v1::GroupNextResponse::ACTION_REJOIN);
    return grpc::Status::OK;
  }
  const std::string token = m->token;
  if (request->received() && !request->received_ok()) {
    LOG(WARNING) << "weight group: " << m->worker_id << " received version "
                 << request->received_version() << " with a bucket that failed its CRC-32C";
    st.Fail("receiver_crc");
  }
  m->held_version = request->held_version();
  m->held_incarnation = request->held_incarnation();
  m->asking = true;
  m->told = false;
  m->action = v1::GroupNextResponse::ACTION_WAIT;
  m->asked_since = absl::Now();
  m->last_seen = m->asked_since;
  ++m->calls;
  st.cv.SignalAll();
  while (true) {
    m = st.MemberOf(token);
    if (m == nullptr || m->told || st.shut_down || ctx->IsCancelled()) break;
    if (st.cv.WaitWithDeadline(&st.mu, deadline) && absl::Now() >= deadline) break;
  }
  m = st.MemberOf(token);
  if (m == nullptr) {
    // The generation ended while this call waited.
    response->set_action(v1::GroupNextResponse::ACTION_REJOIN);
    return grpc::Status::OK;
  }
  --m->calls;
  m->asking = false;
  m->last_seen = absl::Now();
  if (st.shut_down) return ShuttingDown();
  if (!m->told) {
    response->set_action(v1::GroupNextResponse::ACTION_WAIT);
    return grpc::Status::OK;
  }
  m->told = false;
  response->set_action(m->action);
  if (m->action == v1::GroupNextResponse::ACTION_RECEIVE && m->manifest != nullptr) {
    *response->mutable_manifest() = *m->manifest;
  }
  m->manifest.reset();
  return grpc::Status::OK;
}

}  // namespace asympo::learner
