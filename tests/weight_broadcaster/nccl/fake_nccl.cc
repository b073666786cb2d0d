// A CPU stand-in for libnccl.so and libcudart.so, built as a shared library
// and loaded by the tests in place of the real ones, so that the NCCL
// transport's pipeline, handshake and watchdog run where there is no GPU.
//
// "Device" memory is host memory. A stream is a queue of operations that
// run, in order, whenever anything queries a stream or an event (so copies
// are really deferred, and an ordering mistake in the transport shows up as
// wrong bytes). A broadcast completes once every rank of its communicator
// (threads of the test process) has reached it; ranks that disagree on its
// size are counted and never complete. All state is behind one mutex.
#include "tests/weight_broadcaster/nccl/fake_nccl.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "weight_broadcaster/nccl/nccl_abi.h"

namespace {

using asympo::broadcast::nccl::Comm;
using asympo::broadcast::nccl::CudaError;
using asympo::broadcast::nccl::DataType;
using asympo::broadcast::nccl::Event;
using asympo::broadcast::nccl::MemcpyKind;
using asympo::broadcast::nccl::Result;
using asympo::broadcast::nccl::Stream;
using asympo::broadcast::nccl::UniqueId;
namespace abi = asympo::broadcast::nccl;

constexpr CudaError kCudaErrorInvalidValue = 1;
constexpr CudaError kCudaErrorNoDevice = 100;
constexpr CudaError kCudaErrorInvalidDevice = 101;
constexpr CudaError kCudaErrorUnknown = 999;

struct Collective {
  int posted = 0;
  int consumed = 0;
  size_t count = 0;
  bool mismatch = false;
  bool done = false;
  const void* root_send = nullptr;
  std::vector<void*> recvs;
};

struct Group {
  int nranks = 0;
  int joined = 0;
  std::map<int64_t, Collective> collectives;
};

}  // namespace

struct asympo::broadcast::nccl::CommHandle {
  Group* group = nullptr;
  int rank = 0;
  bool init_done = false;
  int init_pending_polls = 0;
  int pending_polls = 0;
  bool aborted = false;
  int64_t next_seq = 0;
};

struct asympo::broadcast::nccl::EventHandle {
  uint64_t recorded = 0;
  uint64_t completed = 0;
};

namespace {

struct Op {
  enum Kind { kCopy, kRecord, kWait, kBroadcast } kind;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t n = 0;
  Event event = nullptr;
  uint64_t generation = 0;
  Comm comm = nullptr;
  int64_t seq = 0;
  bool posted = false;
};

}  // namespace

struct asympo::broadcast::nccl::StreamHandle {
  std::deque<Op> ops;
};

namespace {

std::mutex mu;
std::condition_variable joined_cv;
AsympoFakeNcclConfig config;
AsympoFakeNcclStats stats;
// Bumped to let every waiting blocking init return.
int64_t release_generation = 0;
int64_t next_id = 0;
// Groups and communicators are never freed: abandoned init threads and
// queued operations may still point at them, and tests are small.
std::map<std::string, Group*> groups;
std::set<Stream> streams;
std::set<void*> allocations;

bool Stuck(int64_t seq) {
  return (config.hang_from_broadcast >= 0 && seq >= config.hang_from_broadcast) ||
         (config.fail_from_broadcast >= 0 && seq >= config.fail_from_broadcast);
}

// Runs `op` if it can run now.
bool TryRun(Op& op) {
  switch (op.kind) {
    case Op::kCopy:
      std::memcpy(op.dst, op.src, op.n);
      return true;
    case Op::kRecord:
      op.event->completed = std::max(op.event->completed, op.generation);
      return true;
    case Op::kWait:
      return op.event->completed >= op.generation;
    case Op::kBroadcast: {
      Comm comm = op.comm;
      if (comm->aborted) return true;  // an aborted kernel exits
      Group& group = *comm->group;
      Collective& collective = group.collectives[op.seq];
      if (!op.posted) {
        op.posted = true;
        if (collective.posted == 0) {
          collective.count = op.n;
        } else if (collective.count != op.n && !collective.mismatch) {
          collective.mismatch = true;
          ++stats.count_mismatches;
        }
        ++collective.posted;
        if (comm->rank == 0) collective.root_send = op.src;
        collective.recvs.push_back(op.dst);
      }
      if (Stuck(op.seq) || collective.mismatch || collective.posted < group.nranks) return false;
      if (!collective.done) {
        for (void* recv : collective.recvs) {
          if (recv != collective.root_send) std::memmove(recv, collective.root_send, op.n);
        }
        collective.done = true;
      }
      ++stats.completed;
      if (++collective.consumed == group.nranks) group.collectives.erase(op.seq);
      return true;
    }
  }
  return false;
}

// Runs every operation that can run. Streams are visited forwards on one
// call and backwards on the next, so that work the transport forgot to
// order between its two streams runs in the wrong order sooner or later.
void Progress() {
  static bool backwards = false;
  backwards = !backwards;
  std::vector<Stream> order(streams.begin(), streams.end());
  if (backwards) std::reverse(order.begin(), order.end());
  for (bool changed = true; changed;) {
    changed = false;
    for (Stream stream : order) {
      while (!stream->ops.empty() && TryRun(stream->ops.front())) {
        stream->ops.pop_front();
        changed = true;
      }
    }
  }
}

Result JoinGroup(Comm* out, int nranks, const UniqueId& id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return abi::kInvalidArgument;
  Group*& group = groups[std::string(id.internal, abi::kUniqueIdBytes)];
  if (group == nullptr) {
    group = new Group;
    group->nranks = nranks;
  }
  if (group->nranks != nranks) return abi::kInvalidUsage;
  ++group->joined;
  ++stats.inits;
  auto* comm = new abi::CommHandle;
  comm->group = group;
  comm->rank = rank;
  *out = comm;
  joined_cv.notify_all();
  return abi::kSuccess;
}

Result InitBlocking(Comm* out, int nranks, const UniqueId& id, int rank) {
  std::unique_lock<std::mutex> lock(mu);
  ++stats.blocking_inits;
  const Result result = JoinGroup(out, nranks, id, rank);
  if (result != abi::kSuccess) return result;
  Comm comm = *out;
  const int64_t generation = release_generation;
  joined_cv.wait(lock,
                 [&] { return comm->group->joined >= nranks || release_generation != generation; });
  comm->init_done = true;
  return abi::kSuccess;
}

}  // namespace

#define FAKE_API extern "C" __attribute__((visibility("default")))

FAKE_API void asympo_fake_nccl_reset() {
  std::lock_guard<std::mutex> lock(mu);
  config = AsympoFakeNcclConfig();
  stats = AsympoFakeNcclStats();
  stats.live_allocations = static_cast<int64_t>(allocations.size());
  ++release_generation;
  joined_cv.notify_all();
}

FAKE_API void asympo_fake_nccl_configure(const AsympoFakeNcclConfig* new_config) {
  std::lock_guard<std::mutex> lock(mu);
  config = *new_config;
}

FAKE_API void asympo_fake_nccl_stats(AsympoFakeNcclStats* out) {
  std::lock_guard<std::mutex> lock(mu);
  *out = stats;
}

FAKE_API void asympo_fake_nccl_release_blocked_inits() {
  std::lock_guard<std::mutex> lock(mu);
  ++release_generation;
  joined_cv.notify_all();
}

// ---- NCCL ----

FAKE_API Result ncclGetVersion(int* version) {
  std::lock_guard<std::mutex> lock(mu);
  *version = config.nccl_version;
  return abi::kSuccess;
}

FAKE_API Result ncclGetUniqueId(UniqueId* id) {
  std::lock_guard<std::mutex> lock(mu);
  std::memset(id->internal, 0, sizeof(id->internal));
  std::snprintf(id->internal, sizeof(id->internal), "fake-nccl-id-%lld",
                static_cast<long long>(next_id++));
  return abi::kSuccess;
}

FAKE_API Result ncclCommInitRank(Comm* comm, int nranks, UniqueId id, int rank) {
  return InitBlocking(comm, nranks, id, rank);
}

FAKE_API Result ncclCommInitRankConfig(Comm* comm, int nranks, UniqueId id, int rank,
                                       abi::Config* cfg) {
  if (cfg == nullptr || cfg->magic != 0xcafebeef || cfg->size < 24 ||
      cfg->version < static_cast<unsigned>(abi::kFirstConfigVersion)) {
    return abi::kInvalidArgument;
  }
  if (cfg->blocking != 0) return InitBlocking(comm, nranks, id, rank);
  std::lock_guard<std::mutex> lock(mu);
  const Result result = JoinGroup(comm, nranks, id, rank);
  if (result != abi::kSuccess) return result;
  (*comm)->init_pending_polls = config.init_pending_polls;
  return abi::kInProgress;
}

FAKE_API Result ncclCommGetAsyncError(Comm comm, Result* error) {
  std::lock_guard<std::mutex> lock(mu);
  if (comm->aborted) {
    ++stats.use_after_abort;
    return abi::kInvalidUsage;
  }
  Progress();
  if (!comm->init_done) {
    if (comm->group->joined < comm->group->nranks || comm->init_pending_polls-- > 0) {
      *error = abi::kInProgress;
      return abi::kSuccess;
    }
    comm->init_done = true;
  }
  if (comm->pending_polls > 0) {
    --comm->pending_polls;
    *error = abi::kInProgress;
  } else if (config.fail_from_broadcast >= 0 && comm->next_seq > config.fail_from_broadcast) {
    *error = abi::kRemoteError;
  } else {
    *error = abi::kSuccess;
  }
  return abi::kSuccess;
}

FAKE_API Result ncclBroadcast(const void* send, void* recv, size_t count, DataType datatype,
                              int root, Comm comm, Stream stream) {
  std::lock_guard<std::mutex> lock(mu);
  if (comm->aborted) {
    ++stats.use_after_abort;
    return abi::kInvalidUsage;
  }
  if (!comm->init_done || comm->pending_polls > 0) return abi::kInvalidUsage;
  if ((datatype != abi::kUint8 && datatype != abi::kInt8) || root != 0 || recv == nullptr ||
      (comm->rank == 0 && send == nullptr)) {
    return abi::kInvalidArgument;
  }
  Op op{Op::kBroadcast};
  op.dst = recv;
  op.src = send;
  op.n = count;
  op.comm = comm;
  op.seq = comm->next_seq++;
  stream->ops.push_back(op);
  ++stats.enqueued;
  if (config.enqueue_pending_polls > 0) {
    comm->pending_polls = config.enqueue_pending_polls;
    return abi::kInProgress;
  }
  return abi::kSuccess;
}

FAKE_API Result ncclCommAbort(Comm comm) {
  std::lock_guard<std::mutex> lock(mu);
  if (comm->aborted) ++stats.use_after_abort;
  comm->aborted = true;
  ++stats.aborts;
  return abi::kSuccess;
}

FAKE_API Result ncclCommDestroy(Comm comm) { return ncclCommAbort(comm); }

FAKE_API const char* ncclGetErrorString(Result result) {
  switch (result) {
    case abi::kSuccess:
      return "no error";
    case abi::kRemoteError:
      return "remote process exited or there was a network error (fake)";
    case abi::kInProgress:
      return "NCCL operation in progress (fake)";
    default:
      return "fake NCCL error";
  }
}

FAKE_API const char* ncclGetLastError(Comm) { return ""; }

// ---- CUDA runtime ----

FAKE_API CudaError cudaGetDeviceCount(int* count) {
  std::lock_guard<std::mutex> lock(mu);
  *count = config.device_count;
  return config.device_count > 0 ? abi::kCudaSuccess : kCudaErrorNoDevice;
}

FAKE_API CudaError cudaSetDevice(int device) {
  std::lock_guard<std::mutex> lock(mu);
  return device >= 0 && device < config.device_count ? abi::kCudaSuccess : kCudaErrorInvalidDevice;
}

FAKE_API CudaError cudaRuntimeGetVersion(int* version) {
  *version = 12040;
  return abi::kCudaSuccess;
}

FAKE_API CudaError cudaMalloc(void** ptr, size_t size) {
  std::lock_guard<std::mutex> lock(mu);
  *ptr = ::operator new(std::max<size_t>(size, 1));
  allocations.insert(*ptr);
  ++stats.live_allocations;
  return abi::kCudaSuccess;
}

FAKE_API CudaError cudaFree(void* ptr) {
  std::lock_guard<std::mutex> lock(mu);
  if (ptr == nullptr) return abi::kCudaSuccess;
  if (allocations.erase(ptr) == 0) return kCudaErrorInvalidValue;
  ::operator delete(ptr);
  --stats.live_allocations;
  return abi::kCudaSuccess;
}

FAKE_API CudaError cudaMemcpy(void* dst, const void* src, size_t count, MemcpyKind) {
  std::lock_guard<std::mutex> lock(mu);
  std::memcpy(dst, src, count);
  return abi::kCudaSuccess;
}

FAKE_API CudaError cudaMemcpyAsync(void* dst, const void* src, size_t count, MemcpyKind kind,
                                   Stream stream) {
  if (kind != abi::kMemcpyHostToDevice && kind != abi::kMemcpyDeviceToHost) {
    return kCudaErrorInvalidValue;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (kind == abi::kMemcpyHostToDevice) ++stats.host_to_device_copies;
  Op op{Op::kCopy};
  op.dst = dst;
  op.src = src;
  op.n = count;
  stream->ops.push_back(op);
  return abi::kCudaSuccess;
}

FAKE_API CudaError cudaStreamCreateWithFlags(Stream* stream, unsigned int) {
  std::lock_guard<std::mutex> lock(mu);
  *stream = new abi::StreamHandle;
  streams.insert(*stream);
  return abi::kCudaSuccess;
}

FAKE_API CudaError cudaStreamQuery(Stream stream) {
  std::lock_guard<std::mutex> lock(mu);
  Progress();
  return stream->ops.empty() ? abi::kCudaSuccess : abi::kCudaErrorNotReady;
}

FAKE_API CudaError cudaStreamSynchronize(Stream stream) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < give_up) {
    if (cudaStreamQuery(stream) == abi::kCudaSuccess) return abi::kCudaSuccess;
  }
  return kCudaErrorUnknown;
}

FAKE_API CudaError cudaStreamDestroy(Stream stream) {
  std::lock_guard<std::mutex> lock(mu);
  streams.erase(stream);
  delete stream;
  return abi::kCudaSuccess;
}

FAKE_API CudaError cudaStreamWaitEvent(Stream stream, Event event, unsigned int) {
  std::lock_guard<std::mutex> lock(mu);
  Op op{Op::kWait};
  op.event = event;
  op.generation = event->recorded;
  stream->ops.push_back(op);
  return abi::kCudaSuccess;
}

FAKE_API CudaError cudaEventCreateWithFlags(Event* event, unsigned int) {
  *event = new abi::EventHandle;
  return abi::kCudaSuccess;
}

FAKE_API CudaError cudaEventRecord(Event event, Stream stream) {
  std::lock_guard<std::mutex> lock(mu);
  Op op{Op::kRecord};
  op.event = event;
  op.generation = ++event->recorded;
  stream->ops.push_back(op);
  return abi::kCudaSuccess;
}

FAKE_API CudaError cudaEventQuery(Event event) {
  std::lock_guard<std::mutex> lock(mu);
  Progress();
  return event->completed >= event->recorded ? abi::kCudaSuccess : abi::kCudaErrorNotReady;
}

FAKE_API CudaError cudaEventDestroy(Event event) {
  delete event;
  return abi::kCudaSuccess;
}

FAKE_API const char* cudaGetErrorString(CudaError error) {
  return error == abi::kCudaSuccess ? "no error" : "fake CUDA error";
}

FAKE_API const char* cudaGetErrorName(CudaError error) {
  switch (error) {
    case abi::kCudaSuccess:
      return "cudaSuccess";
    case kCudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case kCudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case abi::kCudaErrorNotReady:
      return "cudaErrorNotReady";
    default:
      return "cudaErrorUnknown";
  }
}
