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
#include "learner_server/collective_group.h"

namespace asympo::learner {
namespace {

constexpr size_t kMaxWorkerIdBytes = 128;
constexpr int kMaxStoreKeys = 64;
constexpr size_t kMaxStoreKeyBytes = 512;
constexpr size_t kMaxStoreValueBytes = 1u << 20;
constexpr uint32_t kMaxWaitMs = 60000;
constexpr uint32_t kMaxStoreWaitMs = 30000;
constexpr uint32_t kDefaultWaitMs = 10000;

std::string NewToken() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

absl::Duration WaitOf(uint32_t ms, uint32_t cap) {
  return absl::Milliseconds(ms == 0 ? kDefaultWaitMs : std::min(ms, cap));
}

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// A store request's limits: key count and sizes, value sizes.
grpc::Status CheckStoreRequest(const v1::GroupStoreRequest& r) {
  const auto& keys = r.keys();
  if (keys.size() > kMaxStoreKeys) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("at most ", kMaxStoreKeys, " keys, not ", keys.size()));
  }
  for (const std::string& k : keys) {
    if (k.size() > kMaxStoreKeyBytes) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("a key of ", k.size(), " bytes (at most ", kMaxStoreKeyBytes, ")"));
    }
  }
  if (r.value().size() > kMaxStoreValueBytes || r.expected().size() > kMaxStoreValueBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("a value over ", kMaxStoreValueBytes, " bytes"));
  }
  const bool one_key = r.op() != v1::GroupStoreRequest::OP_CHECK &&
                       r.op() != v1::GroupStoreRequest::OP_WAIT &&
                       r.op() != v1::GroupStoreRequest::OP_NUM_KEYS;
  if (one_key && keys.size() != 1) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("this store operation takes one key, not ", keys.size()));
  }
  return grpc::Status::OK;
}

// One store operation on `store` (c10d's semantics).
grpc::Status RunStoreOp(c10d::Store& store, const v1::GroupStoreRequest& r,
                        v1::GroupStoreResponse* response) {
  const auto& keys = r.keys();
  const auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  const absl::Duration wait = WaitOf(r.wait_ms(), kMaxStoreWaitMs);
  const std::vector<std::string> key_list(keys.begin(), keys.end());
  try {
    switch (r.op()) {
      case v1::GroupStoreRequest::OP_SET:
        store.set(keys[0], bytes(r.value()));
        break;
      case v1::GroupStoreRequest::OP_GET:
      case v1::GroupStoreRequest::OP_WAIT: {
        bool ready = store.check(key_list);
        if (!ready) {
          try {
            store.wait(key_list, Millis(wait));
            ready = true;
          } catch (const std::exception&) {
            ready = false;  // not within wait_ms: the worker asks again
          }
        }
        response->set_ready(ready);
        if (ready && r.op() == v1::GroupStoreRequest::OP_GET) {
          const std::vector<uint8_t> v = store.get(keys[0]);
          response->set_value(std::string(v.begin(), v.end()));
        }
        break;
      }
      case v1::GroupStoreRequest::OP_ADD:
        response->set_number(store.add(keys[0], r.amount()));
        break;
      case v1::GroupStoreRequest::OP_COMPARE_SET: {
        const std::vector<uint8_t> v =
            store.compareSet(keys[0], bytes(r.expected()), bytes(r.value()));
        response->set_value(std::string(v.begin(), v.end()));
        break;
      }
      case v1::GroupStoreRequest::OP_CHECK:
        response->set_ready(store.check(key_list));
        break;
      case v1::GroupStoreRequest::OP_DELETE:
        response->set_number(store.deleteKey(keys[0]) ? 1 : 0);
        break;
      case v1::GroupStoreRequest::OP_NUM_KEYS:
        response->set_number(store.getNumKeys());
        break;
      default:
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("unknown store operation ", static_cast<int>(r.op())));
    }
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("store operation failed: ", what.substr(0, what.find('\n'))));
  }
  return grpc::Status::OK;
}

// Every call that finds the server stopping gets the same answer; clients
// treat UNAVAILABLE as "try again elsewhere or later".
grpc::Status ShuttingDown() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the learner is shutting down");
}

}  // namespace

struct WeightGroup::State {
  WeightGroupOptions options;

  // Metrics.
  prometheus::Gauge* members_gauge = nullptr;
  prometheus::Gauge* generation_gauge = nullptr;
  prometheus::Counter* versions_total = nullptr;
  prometheus::Family<prometheus::Counter>* failures = nullptr;

  // A worker waiting in Join, and what the formation assigns it.
  struct Joiner {
    std::string worker_id;
    uint64_t seq = 0;  // join order
    bool formed = false;
    bool replaced = false;  // a newer Join under the same id took its place
    uint64_t generation = 0;
    int rank = 0;
    int world_size = 0;
    std::string token;
  };
  // A member of the current generation.
  struct Member {
    std::string worker_id;
    std::string token;
    int rank = 0;
    uint64_t held_version = 0;
    std::string held_incarnation;
    bool asking = false;  // a Next call is waiting for an answer
    bool told = false;    // its waiting Next has been answered
    v1::GroupNextResponse::Action action = v1::GroupNextResponse::ACTION_WAIT;
    std::shared_ptr<const v1::SnapshotManifest> manifest;  // with ACTION_RECEIVE
    absl::Time asked_since = absl::InfinitePast();
    absl::Time last_seen;
    int calls = 0;  // calls in flight naming this member
  };
  enum class Phase { kNone, kForming, kConnecting, kActive, kBroadcasting };

  mutable absl::Mutex mu;
  absl::CondVar cv;  // any change below
  bool shut_down = false;
  Phase phase = Phase::kNone;
  uint64_t generation = 0;
  bool regroup = false;  // end the current generation at the next boundary
  std::string regroup_reason;
  uint64_t join_seq = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<Joiner>> joiners;  // by worker id
  std::vector<Member> members;                                        // rank order
  c10::intrusive_ptr<c10d::Store> store;                              // the generation's
  c10::intrusive_ptr<CollectiveGroup> pg;
  std::shared_ptr<const v1::SnapshotManifest> latest;
  broadcast::HostBuckets latest_host;
  int64_t versions_sent = 0;
  at::Tensor device_buffer;  // NCCL: the largest bucket's size, on the GPU
  std::thread thread;

  Member* MemberOf(const std::string& token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (phase == Phase::kNone || phase == Phase::kForming) return nullptr;
    for (Member& m : members) {
      if (m.token == token) return &m;
    }
    return nullptr;
  }

  void Fail(const std::string& reason) { failures->Add({{"reason", reason}}).Increment(); }

  // Ends the current generation at the next boundary.
  void RegroupLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!regroup) {
      regroup = true;
      regroup_reason = why;
    }
    cv.SignalAll();
  }

  // Whether a member lacks the latest snapshot.
  bool Lacks(const Member& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return latest != nullptr &&
           (m.held_version != latest->version() || m.held_incarnation != latest->incarnation());
  }

  void Loop();
  // Ends the current generation and gathers the Joins of the next one
  // (sorted by join order; empty on shutdown or when nobody joined).
  std::vector<std::shared_ptr<Joiner>> EndAndGatherLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Makes `joined` the members of the current generation, ranks 1..N.
  void AssignLocked(const std::vector<std::shared_ptr<Joiner>>& joined)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Form();
  void Broadcast();
  // Answers every member's waiting Next with `action` (and `manifest`).
  void TellAllLocked(v1::GroupNextResponse::Action action,
                     std::shared_ptr<const v1::SnapshotManifest> manifest = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (Member& m : members) {
      m.action = action;
      m.manifest = manifest;
      m.told = true;
    }
    cv.SignalAll();
  }
};

absl::StatusOr<std::unique_ptr<WeightGroup>> WeightGroup::Create(WeightGroupOptions o,
                                                                 prometheus::Registry& registry) {
  if (o.backend != "gloo" && o.backend != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("weight group: backend \"", o.backend, "\" is neither gloo nor nccl"));
  }
  if (o.backend == "gloo" && !GlooGroupBuilt()) {
    return absl::FailedPreconditionError(absl::StrCat("weight group: ", GlooGroupMissing()));
  }
  if (o.backend == "nccl" && !NcclGroupBuilt()) {
    return absl::FailedPreconditionError(absl::StrCat("weight group: ", NcclGroupMissing()));
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

// --- The group thread. ---

void WeightGroup::State::Loop() {
  while (true) {
    enum { kStop, kForm, kBroadcast } next;
    {
      absl::MutexLock lock(&mu);
      while (true) {
        if (shut_down) {
          next = kStop;
          break;
        }
        const absl::Time now = absl::Now();
        // Members gone quiet, or not asking while another waits for the latest.
        if (phase == Phase::kActive) {
          absl::Time first_ask = absl::InfiniteFuture();
          for (const Member& m : members) {
            if (m.asking && !m.told && Lacks(m)) first_ask = std::min(first_ask, m.asked_since);
          }
          for (const Member& m : members) {
            const bool quiet = m.calls == 0 && now - m.last_seen > options.ready_timeout;
            const bool late = !(m.asking && !m.told) && now - first_ask > options.ready_timeout;
            if (quiet || late) {
              LOG(WARNING) << "weight group: " << m.worker_id << " (rank " << m.rank << ") "
                           << (quiet ? "made no call" : "did not ask for the next version")
                           << " for " << absl::FormatDuration(options.ready_timeout)
                           << "; generation " << generation << " ends without it";
              Fail("ready_timeout");
              RegroupLocked("a member timed out");
              break;
            }
          }
        }
        const bool boundary = phase == Phase::kNone || phase == Phase::kActive;
        if (boundary && (regroup || (!joiners.empty() && phase != Phase::kForming))) {
          // Joiners waiting, a member gone, or a failure: form anew (a
          // joiner left over from the last formation only if it is new).
          bool any_new = regroup;
          for (const auto& [id, j] : joiners) any_new = any_new || !j->formed;
          if (any_new) {
            next = kForm;
            break;
          }
        }
        if (phase == Phase::kActive && latest != nullptr && !members.empty()) {
          bool all_asking = true, any_lacks = false;
          for (const Member& m : members) {
            all_asking = all_asking && m.asking && !m.told;
            any_lacks = any_lacks || Lacks(m);
          }
          if (all_asking && any_lacks) {
            next = kBroadcast;
            break;
          }
        }
        cv.WaitWithTimeout(&mu, absl::Milliseconds(200));
      }
    }
    if (next == kStop) break;
    if (next == kForm) Form();
    if (next == kBroadcast) Broadcast();
  }
  absl::MutexLock lock(&mu);
  TellAllLocked(v1::GroupNextResponse::ACTION_REJOIN);
  phase = Phase::kNone;
  pg.reset();
  store.reset();
  cv.SignalAll();
}

std::vector<std::shared_ptr<WeightGroup::State::Joiner>> WeightGroup::State::EndAndGatherLocked() {
  // The old generation ends: its members are told to join again.
  std::vector<std::string> expected;
  for (const Member& m : members) expected.push_back(m.worker_id);
  if (!members.empty()) {
    LOG(INFO) << "weight group: generation " << generation << " ends ("
              << (regroup ? regroup_reason : std::string("workers joining")) << ")";
  }
  TellAllLocked(v1::GroupNextResponse::ACTION_REJOIN);
  members.clear();
  pg.reset();
  store.reset();
  regroup = false;
  phase = Phase::kForming;
  ++generation;
  generation_gauge->Set(static_cast<double>(generation));
  members_gauge->Set(0);
  // Gather Joins for the join window: workers started together form one
  // generation. After a generation with members, as soon as all of them
  // are back (a restart, a new worker beside them).
  const absl::Time deadline = absl::Now() + options.join_window;
  while (!shut_down && absl::Now() < deadline) {
    bool all_back = !expected.empty();
    for (const std::string& id : expected) all_back = all_back && joiners.contains(id);
    if (all_back) break;
    cv.WaitWithDeadline(&mu, deadline);
  }
  std::vector<std::shared_ptr<Joiner>> joined;
  if (shut_down) return joined;
  for (const auto& [id, j] : joiners) joined.push_back(j);
  std::sort(joined.begin(), joined.end(),
            [](const auto& a, const auto& b) { return a->seq < b->seq; });
  if (static_cast<int>(joined.size()) > options.max_members) {
    joined.resize(static_cast<size_t>(options.max_members));
  }
  return joined;
}

void WeightGroup::State::AssignLocked(const std::vector<std::shared_ptr<Joiner>>& joined) {
  const int world = static_cast<int>(joined.size()) + 1;
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < joined.size(); ++i) {
    Joiner& j = *joined[i];
    j.formed = true;
    j.generation = generation;
    j.rank = static_cast<int>(i) + 1;
    j.world_size = world;
    j.token = NewToken();
    Member m;
    m.worker_id = j.worker_id;
    m.token = j.token;
    m.rank = j.rank;
    m.last_seen = now;
    members.push_back(std::move(m));
    joiners.erase(j.worker_id);
  }
  phase = Phase::kConnecting;
  cv.SignalAll();  // the Joins return
}

void WeightGroup::State::Form() {
  c10::intrusive_ptr<c10d::Store> new_store;
  uint64_t gen = 0;
  int world = 0;
  {
    absl::MutexLock lock(&mu);
    const std::vector<std::shared_ptr<Joiner>> joined = EndAndGatherLocked();
    if (shut_down) return;
    if (joined.empty()) {
      phase = Phase::kNone;
      return;
    }
    gen = generation;
    world = static_cast<int>(joined.size()) + 1;
    new_store = c10::make_intrusive<c10d::HashStore>();
    store = new_store;
    AssignLocked(joined);
  }
  // Rank 0's process group, while the members build theirs.
  c10::intrusive_ptr<CollectiveGroup> new_pg;
  std::string error;
  try {
    new_pg = options.backend == "nccl"
                 ? NewNcclGroup(new_store, 0, world, Millis(options.timeout))
                 : NewGlooGroup(new_store, 0, world, Millis(options.timeout), options.address);
  } catch (const std::exception& e) {
    error = e.what();
  }
  absl::MutexLock lock(&mu);
  if (gen != generation || shut_down) return;
  if (new_pg == nullptr) {
    LOG(WARNING) << "weight group: generation " << gen << " (" << world
                 << " ranks) did not connect: " << error.substr(0, error.find('\n'));
    Fail("rendezvous");
    phase = Phase::kActive;  // a boundary: the loop forms the next one
    RegroupLocked("the rendezvous failed");
    return;
  }
  pg = new_pg;
  phase = Phase::kActive;
  members_gauge->Set(static_cast<double>(members.size()));
  std::string ids;
  for (const Member& m : members) absl::StrAppend(&ids, ids.empty() ? "" : ", ", m.worker_id);
  LOG(INFO) << "weight group: generation " << gen << " connected, " << world << " ranks (learner + "
            << ids << ")";
  cv.SignalAll();
}

void WeightGroup::State::Broadcast() {
  std::shared_ptr<const v1::SnapshotManifest> manifest;
  broadcast::HostBuckets host;
  c10::intrusive_ptr<CollectiveGroup> group;
  uint64_t gen = 0;
  {
    absl::MutexLock lock(&mu);
    manifest = latest;
    host = latest_host;
    group = pg;
    gen = generation;
    phase = Phase::kBroadcasting;
    // Each member's Next takes the manifest from here: a small bucket's
    // broadcast may end on rank 0 before a member's call has returned.
    TellAllLocked(v1::GroupNextResponse::ACTION_RECEIVE, manifest);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    const bool nccl = options.backend == "nccl";
    for (const v1::BucketInfo& b : manifest->buckets()) {
      const int64_t size = static_cast<int64_t>(b.size_bytes());
      if (size == 0) continue;  // every rank skips an empty bucket
      char* data = host.data + host.plan->bucket_start(static_cast<int>(b.index()));
      at::Tensor t = at::from_blob(data, {size}, at::TensorOptions().dtype(at::kByte));
      if (nccl) {
        const at::Device dev(at::kCUDA, static_cast<c10::DeviceIndex>(options.nccl_device));
        if (!device_buffer.defined() || device_buffer.numel() < size) {
          device_buffer = at::empty({size}, at::TensorOptions().dtype(at::kByte).device(dev));
        }
        at::Tensor d = device_buffer.narrow(0, 0, size);
        d.copy_(t);
        t = d;
      }
      std::vector<at::Tensor> tensors{t};
      c10d::BroadcastOptions bo;
      bo.rootRank = 0;
      bo.timeout = Millis(options.timeout);
      group->broadcast(tensors, bo)->wait(Millis(options.timeout));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  absl::MutexLock lock(&mu);
  if (gen != generation) return;
  phase = Phase::kActive;
  if (!error.empty()) {
    LOG(WARNING) << "weight group: broadcast of version " << manifest->version()
                 << " in generation " << gen << " failed: " << error.substr(0, error.find('\n'));
    Fail("broadcast");
    RegroupLocked("a broadcast failed");
    return;
  }
  // Every member took part: a long broadcast is not silence.
  const absl::Time now = absl::Now();
  for (Member& m : members) m.last_seen = now;
  ++versions_sent;
  versions_total->Increment();
  VLOG(1) << "weight group: version " << manifest->version() << " to " << members.size()
          << " members in "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
  cv.SignalAll();
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
