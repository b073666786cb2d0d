// Controls of the CPU stand-in for libnccl + libcudart (fake_nccl.cc), which
// the NCCL transport tests load through NcclLoadOptions exactly as they
// would load the real libraries. The test looks these functions up with
// dlsym in the same library (it never links it).
#pragma once

#include <cstdint>

extern "C" {

struct AsympoFakeNcclConfig {
  int nccl_version = 22809;  // what ncclGetVersion reports
  int device_count = 1;      // 0: cudaGetDeviceCount fails with cudaErrorNoDevice
  // A non-blocking init reports ncclInProgress this many extra times after
  // every rank has joined.
  int init_pending_polls = 0;
  // Every ncclBroadcast returns ncclInProgress, and the communicator stays
  // in progress for this many ncclCommGetAsyncError calls.
  int enqueue_pending_polls = 0;
  // Broadcasts with this sequence number or later (per communicator; the
  // handshake is number 0) never complete; -1: off.
  int64_t hang_from_broadcast = -1;
  // Likewise, and the communicator reports ncclRemoteError, as when a peer
  // dies mid-transfer; -1: off.
  int64_t fail_from_broadcast = -1;
};

struct AsympoFakeNcclStats {
  int inits = 0;                 // ncclCommInitRank(Config) calls
  int blocking_inits = 0;        // of which blocking
  int aborts = 0;                // ncclCommAbort calls
  int use_after_abort = 0;       // NCCL calls on an aborted communicator (a bug)
  int64_t enqueued = 0;          // ncclBroadcast calls accepted
  int64_t completed = 0;         // broadcasts completed, counted once per rank
  int64_t live_allocations = 0;  // cudaMalloc minus cudaFree
  int count_mismatches = 0;      // ranks disagreed on a broadcast's size
  int64_t host_to_device_copies = 0;  // cudaMemcpyAsync calls from host to device
};

// Clears the configuration and the counters, and frees any blocked
// ncclCommInitRank (as asympo_fake_nccl_release_blocked_inits does).
void asympo_fake_nccl_reset();
void asympo_fake_nccl_configure(const AsympoFakeNcclConfig* config);
void asympo_fake_nccl_stats(AsympoFakeNcclStats* stats);
// Makes every ncclCommInitRank that waits for missing ranks return a
// communicator, as if the missing ranks had arrived.
void asympo_fake_nccl_release_blocked_inits();

}  // extern "C"
