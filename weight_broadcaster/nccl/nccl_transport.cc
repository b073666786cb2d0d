#include "weight_broadcaster/nccl/nccl_transport.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace asympo::broadcast {
namespace {

constexpr uint64_t kPieceAlignment = 4096;
constexpr uint64_t kMinStagingBytes = 2 * kPieceAlignment;
constexpr uint64_t kMaxPieceBytes = 1ull << 30;

// What the root sends in the handshake. Fixed-size, little-endian like every
// machine NCCL runs on.
struct Hello {
  uint64_t magic;
  uint32_t protocol;
  uint32_t world_size;
  uint64_t piece_bytes;
  uint64_t reserved;
};
static_assert(sizeof(Hello) == 32, "Hello is a wire format");
constexpr uint64_t kHelloMagic = 0x4f4c4c4548504d41ull;  // "AMPHELLO"
constexpr uint32_t kHelloProtocol = 1;

absl::Status NcclFailure(nccl::Result result, std::string message) {
  // A peer or the network failing is transient from the caller's point of
  // view; anything else is a bug or a broken installation.
  if (result == nccl::kRemoteError || result == nccl::kSystemError) {
    return absl::UnavailableError(std::move(message));
  }
  return absl::InternalError(std::move(message));
}

}  // namespace

struct NcclBroadcaster::Slot {
  void* send = nullptr;          // device: the root copies its piece here
  void* recv = nullptr;          // device: the collective's output (== send except readback)
  nccl::Event copied = nullptr;  // the root's host -> device copy is done
  nccl::Event sent = nullptr;    // the slot's broadcast is done
  nccl::Event free = nullptr;    // nothing reads or writes the slot any more
};

NcclBroadcaster::NcclBroadcaster(const NcclApi* api, int rank, int world_size, int device,
                                 const NcclBroadcasterOptions& options)
    : api_(api), rank_(rank), world_size_(world_size), device_(device), options_(options) {}

absl::StatusOr<std::unique_ptr<NcclBroadcaster>> NcclBroadcaster::Create(
    absl::string_view unique_id, int rank, int world_size, int device,
    const NcclBroadcasterOptions& options) {
  if (unique_id.size() != nccl::kUniqueIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the NCCL unique id has ", unique_id.size(),
                                                   " bytes; an ncclUniqueId has ",
                                                   nccl::kUniqueIdBytes));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL rank ", rank, " of world size ",
                                                   world_size,
                                                   ": the rank must be in [0, world size)"));
  }
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " is negative"));
  }
  if (options.timeout <= absl::ZeroDuration() || options.init_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NCCL timeout and init_timeout must be positive");
  }
  if (options.poll_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NCCL poll_interval must not be negative");
  }
  if (options.staging_bytes < kMinStagingBytes) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL staging_bytes is ", options.staging_bytes,
                                                   "; it must be at least ", kMinStagingBytes));
  }
  ASYMPO_ASSIGN_OR_RETURN(const NcclApi* api, LoadNccl(options.load));
  ASYMPO_ASSIGN_OR_RETURN(const int devices, CudaDeviceCount(*api));
  if (devices == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device is visible (cudaGetDeviceCount returned 0; check CUDA_VISIBLE_DEVICES)");
  }
  if (device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " requested but only ", devices, " are visible"));
  }

  const absl::Time start = absl::Now();
  std::unique_ptr<NcclBroadcaster> broadcaster(
      new NcclBroadcaster(api, rank, world_size, device, options));
  nccl::UniqueId id;
  std::memcpy(id.internal, unique_id.data(), nccl::kUniqueIdBytes);
  ASYMPO_RETURN_IF_ERROR(broadcaster->Init(id));
  ASYMPO_RETURN_IF_ERROR(broadcaster->Handshake());
  LOG(INFO) << "NCCL broadcaster ready: " << broadcaster->Where() << ", CUDA device " << device
            << ", NCCL " << NcclVersionString(api->nccl_version) << " ("
            << (broadcaster->nonblocking_ ? "non-blocking" : "blocking") << " communicator), "
            << broadcaster->piece_bytes_ << "-byte pieces, joined in "
            << absl::FormatDuration(absl::Now() - start);
  return broadcaster;
}

NcclBroadcaster::~NcclBroadcaster() {
  // Abort rather than destroy: every operation has completed or failed by
  // now, and ncclCommDestroy may wait on peers that are gone.
  if (comm_ != nullptr) api_->ncclCommAbort(comm_);
  api_->cudaSetDevice(device_);
  // Streams first: their pending work, if any, finishes before the runtime
  // releases them, and cudaFree below waits for the device.
  if (copy_stream_ != nullptr) api_->cudaStreamDestroy(copy_stream_);
  if (nccl_stream_ != nullptr) api_->cudaStreamDestroy(nccl_stream_);
  if (slots_ != nullptr) {
    for (int s = 0; s < 2; ++s) {
      Slot& slot = slots_[s];
      for (nccl::Event event : {slot.copied, slot.sent, slot.free}) {
        if (event != nullptr) api_->cudaEventDestroy(event);
      }
      if (slot.recv != nullptr && slot.recv != slot.send) api_->cudaFree(slot.recv);
      if (slot.send != nullptr) api_->cudaFree(slot.send);
    }
  }
  if (control_ != nullptr) api_->cudaFree(control_);
}

std::string NcclBroadcaster::Where() const {
  return absl::StrCat("rank ", rank_, " of ", world_size_);
}

absl::Status NcclBroadcaster::Fail(absl::Status status) {
  {
    absl::MutexLock lock(&error_mu_);
    if (dead_reason_.ok()) dead_reason_ = status;
  }
  dead_.store(true, std::memory_order_release);
  if (comm_ != nullptr) {
    const nccl::Result result = api_->ncclCommAbort(comm_);
    if (result != nccl::kSuccess && result != nccl::kInProgress) {
      LOG(WARNING) << "ncclCommAbort on " << Where() << ": " << api_->NcclErrorText(result);
    }
    comm_ = nullptr;
  }
  LOG(ERROR) << status;
  return status;
}

absl::Status NcclBroadcaster::DeadError() const {
  absl::MutexLock lock(&error_mu_);
  return absl::FailedPreconditionError(absl::StrCat(
      "the NCCL communicator on ", Where(), " was aborted earlier: ", dead_reason_.message()));
}

void NcclBroadcaster::Cancel() { cancelled_.store(true, std::memory_order_release); }

template <typename ReadyFn>
absl::Status NcclBroadcaster::Wait(absl::string_view what, absl::Duration timeout, ReadyFn ready) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  for (int polls = 0;; ++polls) {
    absl::StatusOr<bool> done = ready();
    if (!done.ok()) return Fail(std::move(done).status());
    if (*done) return absl::OkStatus();
    if (comm_ != nullptr) {
      nccl::Result async_error = nccl::kSuccess;
      const nccl::Result result = api_->ncclCommGetAsyncError(comm_, &async_error);
      if (result != nccl::kSuccess) async_error = result;
      if (async_error != nccl::kSuccess && async_error != nccl::kInProgress) {
        return Fail(NcclFailure(
            async_error,
            absl::StrFormat("NCCL %s failed on %s after %.3f s: %s; communicator aborted", what,
                            Where(), absl::ToDoubleSeconds(absl::Now() - start),
                            api_->NcclErrorText(async_error, comm_))));
      }
    }
    if (cancelled_.load(std::memory_order_acquire)) {
      return Fail(absl::CancelledError(
          absl::StrFormat("NCCL %s cancelled on %s after %.3f s; communicator aborted", what,
                          Where(), absl::ToDoubleSeconds(absl::Now() - start))));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrFormat(
          "NCCL %s timed out on %s: no completion after %.3f s (watchdog limit %s); "
          "communicator aborted",
          what, Where(), absl::ToDoubleSeconds(now - start), absl::FormatDuration(timeout))));
    }
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(options_.poll_interval);
    }
  }
}

absl::Status NcclBroadcaster::WaitCommReady(absl::string_view what) {
  return Wait(what, options_.timeout, [&]() -> absl::StatusOr<bool> {
    nccl::Result state = nccl::kInProgress;
    const nccl::Result result = api_->ncclCommGetAsyncError(comm_, &state);
    if (result != nccl::kSuccess) state = result;
    if (state == nccl::kInProgress) return false;
    if (state == nccl::kSuccess) return true;
    return NcclFailure(
        state, absl::StrCat(what, " failed on ", Where(), ": ", api_->NcclErrorText(state, comm_)));
  });
}

absl::Status NcclBroadcaster::CheckNccl(nccl::Result result, absl::string_view what) {
  if (result == nccl::kSuccess) return absl::OkStatus();
  if (result == nccl::kInProgress && nonblocking_) return WaitCommReady(what);
  return Fail(NcclFailure(result, absl::StrCat(what, " failed on ", Where(), ": ",
                                               api_->NcclErrorText(result, comm_))));
}

absl::Status NcclBroadcaster::CheckCuda(nccl::CudaError error, absl::string_view what) {
  if (error == nccl::kCudaSuccess) return absl::OkStatus();
  return Fail(absl::InternalError(absl::StrCat(what, " failed on ", Where(), " (CUDA device ",
                                               device_, "): ", api_->CudaErrorText(error))));
}

absl::Status NcclBroadcaster::Init(const nccl::UniqueId& id) {
  ASYMPO_RETURN_IF_ERROR(CheckCuda(api_->cudaSetDevice(device_), "cudaSetDevice"));
  ASYMPO_RETURN_IF_ERROR(
      CheckCuda(api_->cudaStreamCreateWithFlags(&copy_stream_, nccl::kStreamNonBlocking),
                "cudaStreamCreateWithFlags"));
  ASYMPO_RETURN_IF_ERROR(
      CheckCuda(api_->cudaStreamCreateWithFlags(&nccl_stream_, nccl::kStreamNonBlocking),
                "cudaStreamCreateWithFlags"));
  ASYMPO_RETURN_IF_ERROR(CheckCuda(api_->cudaMalloc(&control_, sizeof(Hello)), "cudaMalloc"));
  if (!options_.nonblocking_init || !api_->SupportsNonBlockingInit()) {
    return InitBlockingOnHelperThread(id);
  }

  nccl::Config config;
  config.blocking = 0;
  nonblocking_ = true;
  const nccl::Result result = api_->ncclCommInitRankConfig(&comm_, world_size_, id, rank_, &config);
  if (result != nccl::kSuccess && result != nccl::kInProgress) {
    return Fail(NcclFailure(result, absl::StrCat("ncclCommInitRankConfig failed on ", Where(), ": ",
                                                 api_->NcclErrorText(result, comm_))));
  }
  return Wait("communicator init", options_.init_timeout, [&]() -> absl::StatusOr<bool> {
    nccl::Result state = nccl::kInProgress;
    const nccl::Result query = api_->ncclCommGetAsyncError(comm_, &state);
    if (query != nccl::kSuccess) state = query;
    if (state == nccl::kInProgress) return false;
    if (state == nccl::kSuccess) return true;
    return NcclFailure(state, absl::StrCat("communicator init failed on ", Where(), ": ",
                                           api_->NcclErrorText(state, comm_)));
  });
}

absl::Status NcclBroadcaster::InitBlockingOnHelperThread(const nccl::UniqueId& id) {
  // ncclCommInitRank blocks until every rank has joined and cannot be
  // interrupted, so it runs on a detached thread. If the watchdog gives up,
  // the thread aborts the communicator itself whenever the call returns.
  struct PendingInit {
    absl::Mutex mu;
    bool finished ABSL_GUARDED_BY(mu) = false;
    bool abandoned ABSL_GUARDED_BY(mu) = false;
    nccl::Comm comm ABSL_GUARDED_BY(mu) = nullptr;
    nccl::Result result ABSL_GUARDED_BY(mu) = nccl::kSuccess;
  };
  auto pending = std::make_shared<PendingInit>();
  std::thread([api = api_, pending, id, device = device_, world = world_size_, rank = rank_] {
    api->cudaSetDevice(device);
    nccl::Comm comm = nullptr;
    const nccl::Result result = api->ncclCommInitRank(&comm, world, id, rank);
    absl::MutexLock lock(&pending->mu);
    if (pending->abandoned) {
      if (comm != nullptr) api->ncclCommAbort(comm);
      return;
    }
    pending->finished = true;
    pending->comm = comm;
    pending->result = result;
  }).detach();

  absl::Status waited = Wait("communicator init (blocking ncclCommInitRank on a helper thread)",
                             options_.init_timeout, [&]() -> absl::StatusOr<bool> {
                               absl::MutexLock lock(&pending->mu);
                               return pending->finished;
                             });
  nccl::Result result;
  {
    absl::MutexLock lock(&pending->mu);
    if (!pending->finished) {
      pending->abandoned = true;
      return waited;
    }
    comm_ = pending->comm;
    result = pending->result;
  }
  if (!waited.ok()) {  // finished just after the watchdog fired
    if (comm_ != nullptr) api_->ncclCommAbort(comm_);
    comm_ = nullptr;
    return waited;
  }
  if (result != nccl::kSuccess) {
    return Fail(NcclFailure(result, absl::StrCat("ncclCommInitRank failed on ", Where(), ": ",
                                                 api_->NcclErrorText(result, comm_))));
  }
  return absl::OkStatus();
}

absl::Status NcclBroadcaster::Handshake() {
  auto stream_idle = [&]() -> absl::StatusOr<bool> {
    const nccl::CudaError error = api_->cudaStreamQuery(nccl_stream_);
    if (error == nccl::kCudaErrorNotReady) return false;
    if (error == nccl::kCudaSuccess) return true;
    return absl::InternalError(
        absl::StrCat("cudaStreamQuery failed on ", Where(), ": ", api_->CudaErrorText(error)));
  };
  Hello hello{};
  if (rank_ == 0) {
    uint64_t piece = options_.staging_bytes / 2 / kPieceAlignment * kPieceAlignment;
    piece = std::min(piece, kMaxPieceBytes);
    hello = Hello{kHelloMagic, kHelloProtocol, static_cast<uint32_t>(world_size_), piece, 0};
    ASYMPO_RETURN_IF_ERROR(CheckCuda(api_->cudaMemcpyAsync(control_, &hello, sizeof(hello),
                                                           nccl::kMemcpyHostToDevice, nccl_stream_),
                                     "cudaMemcpyAsync (handshake)"));
  }
  ASYMPO_RETURN_IF_ERROR(CheckNccl(
      api_->ncclBroadcast(control_, control_, sizeof(Hello), nccl::kUint8, 0, comm_, nccl_stream_),
      "ncclBroadcast (handshake)"));
  ASYMPO_RETURN_IF_ERROR(Wait("handshake broadcast", options_.timeout, stream_idle));
  if (rank_ != 0) {
    ASYMPO_RETURN_IF_ERROR(CheckCuda(api_->cudaMemcpyAsync(&hello, control_, sizeof(hello),
                                                           nccl::kMemcpyDeviceToHost, nccl_stream_),
                                     "cudaMemcpyAsync (handshake)"));
    ASYMPO_RETURN_IF_ERROR(Wait("handshake copy", options_.timeout, stream_idle));
    if (hello.magic != kHelloMagic || hello.protocol != kHelloProtocol) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "the NCCL handshake on ", Where(), " received no ASymPO hello from rank 0 (magic ",
          absl::Hex(hello.magic), ", protocol ", hello.protocol, ")")));
    }
    if (static_cast<int>(hello.world_size) != world_size_ || hello.piece_bytes == 0 ||
        hello.piece_bytes % kPieceAlignment != 0 || hello.piece_bytes > kMaxPieceBytes) {
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("the NCCL handshake on ", Where(), " disagrees with rank 0: world size ",
                       hello.world_size, ", piece of ", hello.piece_bytes, " bytes")));
    }
  }
  piece_bytes_ = hello.piece_bytes;
  return AllocateSlots(piece_bytes_, /*readback=*/false);
}

absl::Status NcclBroadcaster::AllocateSlots(uint64_t piece_bytes, bool readback) {
  if (slots_ == nullptr) {
    slots_ = std::make_unique<Slot[]>(2);
    for (int s = 0; s < 2; ++s) {
      Slot& slot = slots_[s];
      ASYMPO_RETURN_IF_ERROR(
          CheckCuda(api_->cudaMalloc(&slot.send, piece_bytes), "cudaMalloc (staging)"));
      slot.recv = slot.send;
      for (nccl::Event* event : {&slot.copied, &slot.sent, &slot.free}) {
        ASYMPO_RETURN_IF_ERROR(
            CheckCuda(api_->cudaEventCreateWithFlags(event, nccl::kEventDisableTiming),
                      "cudaEventCreateWithFlags"));
      }
    }
  }
  if (readback && !slots_have_readback_) {
    for (int s = 0; s < 2; ++s) {
      void* recv = nullptr;
      ASYMPO_RETURN_IF_ERROR(
          CheckCuda(api_->cudaMalloc(&recv, piece_bytes), "cudaMalloc (readback)"));
      slots_[s].recv = recv;
    }
    slots_have_readback_ = true;
  }
  return absl::OkStatus();
}

absl::Status NcclBroadcaster::Broadcast(void* host_bytes, size_t n) {
  absl::MutexLock lock(&op_mu_);
  if (rank_ == 0) return Run(host_bytes, nullptr, n, "broadcast");
  return Run(nullptr, host_bytes, n, "broadcast");
}

absl::Status NcclBroadcaster::BroadcastWithReadback(const void* src, void* readback, size_t n) {
  absl::MutexLock lock(&op_mu_);
  if (rank_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("BroadcastWithReadback is for rank 0; this is ", Where()));
  }
  if (!healthy()) return DeadError();
  ASYMPO_RETURN_IF_ERROR(AllocateSlots(piece_bytes_, /*readback=*/true));
  return Run(src, readback, n, "broadcast with readback");
}

absl::Status NcclBroadcaster::BroadcastFromDevice(const void* device_bytes, size_t n) {
  absl::MutexLock lock(&op_mu_);
  if (rank_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("BroadcastFromDevice is for rank 0; this is ", Where()));
  }
  return Run(device_bytes, nullptr, n, "broadcast from device memory", /*src_on_device=*/true);
}

// One Run: the bytes, and how they are cut into pieces.
struct NcclBroadcaster::Pipeline {
  const char* in;  // root only
  char* out;       // receivers, or the root's readback; null otherwise
  size_t n;
  absl::string_view what;
  uint64_t piece;
  size_t pieces;
  bool root;
  bool in_on_device;  // root: `in` is device memory, broadcast in place

  size_t offset(size_t i) const { return i * piece; }
  size_t length(size_t i) const { return std::min<size_t>(piece, n - offset(i)); }
  std::string Label(size_t i, absl::string_view step) const {
    return absl::StrCat(what, " of ", n, " bytes, piece ", i + 1, " of ", pieces, " (", step, ")");
  }
};

absl::Status NcclBroadcaster::WaitEvent(nccl::Event event, const std::string& label) {
  return Wait(label, options_.timeout, [&]() -> absl::StatusOr<bool> {
    const nccl::CudaError error = api_->cudaEventQuery(event);
    if (error == nccl::kCudaErrorNotReady) return false;
    if (error == nccl::kCudaSuccess) return true;
    return absl::InternalError(
        absl::StrCat("cudaEventQuery failed on ", Where(), ": ", api_->CudaErrorText(error)));
  });
}

// Enqueues piece i: (root) host -> device, then the broadcast.
absl::Status NcclBroadcaster::IssuePiece(const Pipeline& p, size_t i) {
  Slot& slot = slots_[i % 2];
  const size_t len = p.length(i);
  ASYMPO_RETURN_IF_ERROR(WaitEvent(slot.free, p.Label(i, "staging slot reuse")));
  if (p.root && p.in_on_device) {
    // Straight from the caller's device memory, in place (NCCL reads the
    // root's buffer and writes nothing new into it).
    char* piece = const_cast<char*>(p.in + p.offset(i));
    ASYMPO_RETURN_IF_ERROR(CheckNccl(
        api_->ncclBroadcast(piece, piece, len, nccl::kUint8, 0, comm_, nccl_stream_),
        p.Label(i, "ncclBroadcast")));
    ASYMPO_RETURN_IF_ERROR(
        CheckCuda(api_->cudaEventRecord(slot.sent, nccl_stream_), "cudaEventRecord"));
    return CheckCuda(api_->cudaEventRecord(slot.free, nccl_stream_), "cudaEventRecord");
  }
  if (p.root) {
    ASYMPO_RETURN_IF_ERROR(CheckCuda(api_->cudaMemcpyAsync(slot.send, p.in + p.offset(i), len,
                                                           nccl::kMemcpyHostToDevice, copy_stream_),
                                     "cudaMemcpyAsync (host to device)"));
    ASYMPO_RETURN_IF_ERROR(
        CheckCuda(api_->cudaEventRecord(slot.copied, copy_stream_), "cudaEventRecord"));
    ASYMPO_RETURN_IF_ERROR(
        CheckCuda(api_->cudaStreamWaitEvent(nccl_stream_, slot.copied, 0), "cudaStreamWaitEvent"));
  }
  ASYMPO_RETURN_IF_ERROR(CheckNccl(api_->ncclBroadcast(p.root ? slot.send : slot.recv, slot.recv,
                                                       len, nccl::kUint8, 0, comm_, nccl_stream_),
                                   p.Label(i, "ncclBroadcast")));
  ASYMPO_RETURN_IF_ERROR(
      CheckCuda(api_->cudaEventRecord(slot.sent, nccl_stream_), "cudaEventRecord"));
  if (p.out == nullptr) {
    ASYMPO_RETURN_IF_ERROR(
        CheckCuda(api_->cudaEventRecord(slot.free, nccl_stream_), "cudaEventRecord"));
  }
  return absl::OkStatus();
}

// Once piece i is broadcast: device -> host into the output.
absl::Status NcclBroadcaster::DrainPiece(const Pipeline& p, size_t i) {
  Slot& slot = slots_[i % 2];
  ASYMPO_RETURN_IF_ERROR(WaitEvent(slot.sent, p.Label(i, "broadcast")));
  ASYMPO_RETURN_IF_ERROR(
      CheckCuda(api_->cudaMemcpyAsync(p.out + p.offset(i), slot.recv, p.length(i),
                                      nccl::kMemcpyDeviceToHost, copy_stream_),
                "cudaMemcpyAsync (device to host)"));
  return CheckCuda(api_->cudaEventRecord(slot.free, copy_stream_), "cudaEventRecord");
}

// The pipeline. Piece i uses slot i % 2:
//   root:      [wait slot free] H2D(copy stream) -> copied -> ncclBroadcast
//              (nccl stream) -> sent (-> free, when nothing is read back)
//   receivers: [wait slot free] ncclBroadcast -> sent; then, after piece
//              i + 1 is enqueued: [wait sent] D2H(copy stream) -> free
// Every host-side wait polls an event under the watchdog, and no copy is
// issued before the event it depends on has completed: copies to or from
// pageable memory may block the calling thread inside cudaMemcpyAsync until
// the stream reaches them, which must never mean waiting on NCCL unwatched.
absl::Status NcclBroadcaster::Run(const void* src, void* dst, size_t n, absl::string_view what,
                                  bool src_on_device) {
  if (!healthy()) return DeadError();
  if (cancelled_.load(std::memory_order_acquire)) {
    return Fail(absl::CancelledError(
        absl::StrCat("NCCL ", what, " on ", Where(), " cancelled before it began")));
  }
  if (n == 0) return absl::OkStatus();
  if (rank_ == 0 && src == nullptr) return absl::InvalidArgumentError("null source buffer");
  if (rank_ != 0 && dst == nullptr) return absl::InvalidArgumentError("null destination buffer");
  ASYMPO_RETURN_IF_ERROR(CheckCuda(api_->cudaSetDevice(device_), "cudaSetDevice"));

  const absl::Time start = absl::Now();
  const Pipeline p{static_cast<const char*>(src),
                   static_cast<char*>(dst),
                   n,
                   what,
                   piece_bytes_,
                   (n + piece_bytes_ - 1) / piece_bytes_,
                   rank_ == 0,
                   src_on_device && rank_ == 0};
  for (size_t i = 0; i < p.pieces; ++i) {
    ASYMPO_RETURN_IF_ERROR(IssuePiece(p, i));
    if (p.out != nullptr && i > 0) ASYMPO_RETURN_IF_ERROR(DrainPiece(p, i - 1));
  }
  if (p.out != nullptr) ASYMPO_RETURN_IF_ERROR(DrainPiece(p, p.pieces - 1));
  for (size_t i = p.pieces > 2 ? p.pieces - 2 : 0; i < p.pieces; ++i) {
    ASYMPO_RETURN_IF_ERROR(WaitEvent(slots_[i % 2].free, p.Label(i, "completion")));
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  VLOG(1) << "NCCL " << what << " of " << n << " bytes on " << Where() << ": " << p.pieces
          << " pieces in " << seconds << " s ("
          << (seconds > 0 ? static_cast<double>(n) / seconds / 1e9 : 0.0) << " GB/s)";
  return absl::OkStatus();
}

absl::StatusOr<std::string> NewNcclUniqueId(const NcclLoadOptions& options) {
  ASYMPO_ASSIGN_OR_RETURN(const NcclApi* api, LoadNccl(options));
  nccl::UniqueId id;
  const nccl::Result result = api->ncclGetUniqueId(&id);
  if (result != nccl::kSuccess) {
    return NcclFailure(result,
                       absl::StrCat("ncclGetUniqueId failed: ", api->NcclErrorText(result)));
  }
  return std::string(id.internal, nccl::kUniqueIdBytes);
}

}  // namespace asympo::broadcast
