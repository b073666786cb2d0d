// Data parallelism for the learner on LibTorch's c10d, with Gloo (host
// memory, CPU ranks) or NCCL (one GPU a rank; collective_group.h).
//
// Rank 0 is the learner daemon: it owns the queue and the gRPC services.
// For each step it splits the popped groups across the ranks by tokens
// (whole groups, largest first to the least loaded rank), and sends every
// rank its share with the step's totals, so that each rank's loss is its
// part of the single-process loss. Every rank computes the gradients of its
// share; the gradients and the step's diagnostics are summed across ranks
// (all-reduce; the exchange is a StepExchange, step_exchange.h), and every
// rank applies the same clipping and AdamW update, so the replicas stay
// identical (see Trainer::StepShard). With
// DistShard::kOptimizer each rank keeps a chunk of the AdamW moments instead
// (ShardedAdamW: reduce-scatter, AdamW on the chunk, all-gather). Every
// rank writes its part of a checkpoint ("save" message).
//
// Between steps rank 0 sends "idle" while it waits for groups, and "stop"
// when it shuts down. Every collective has a timeout: a rank that dies or
// hangs makes the others' next collective fail, and they stop with an error
// naming the operation (never a silent hang).
//
// The rendezvous is c10d's TCPStore on rank 0 (MASTER_ADDR:MASTER_PORT).
// Neither it nor Gloo nor NCCL authenticates or encrypts, and the store
// listens on every interface: a world of more than one rank needs
// `insecure` set by the operator (--dist_insecure).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/model/policy_model.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/loss/policy_loss.h"
#include "learner_server/optim/adamw.h"
#include "learner_server/optim/dist_shard.h"
#include "learner_server/optim/sharded_adamw.h"
#include "learner_server/trainer/step_exchange.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace asympo::learner {

// The collectives' library (--dist_backend): Gloo moves host tensors over
// TCP; NCCL moves GPU tensors over NVLink, InfiniBand or TCP.
enum class DistBackend { kGloo = 0, kNccl = 1 };
absl::string_view DistBackendName(DistBackend backend);  // "gloo", "nccl"

struct DataParallelOptions {
  int rank = 0;
  int world_size = 1;
  // Rank 0's address and the TCPStore port on it.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // The address this rank's Gloo transport binds to; empty: master_addr
  // when it is a loopback address, else this host's name.
  std::string local_addr;
  // The longest a collective may wait for the other ranks.
  absl::Duration timeout = absl::Minutes(10);
  bool insecure = false;
  // What each rank keeps (DistShard).
  DistShard shard = DistShard::kNone;
  DistBackend backend = DistBackend::kGloo;
  // This rank's device (its model's): NCCL's tensors live there.
  at::Device device = at::kCPU;
};

// What the operator gave on the command line; unset fields fall back to the
// environment.
struct DataParallelFlags {
  std::optional<int> rank, world_size, master_port;
  std::string master_addr;
  std::string local_addr;
  absl::Duration timeout = absl::Minutes(10);
  bool insecure = false;
  // --dist_shard; empty: --dist_shard_optimizer's choice (optimizer or
  // none).
  std::string shard;
  bool shard_optimizer = false;
  // --dist_backend: "auto" (NCCL when `device` is a GPU and the build has
  // it, else Gloo), "gloo" or "nccl".
  std::string backend = "auto";
  // The rank's device (--device, resolved by RankDevice and ParseDevice).
  at::Device device = at::kCPU;
};

// Resolves the rank, world size and master from, in order: the flags;
// torchrun's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; Slurm's
// SLURM_PROCID / SLURM_NTASKS (with MASTER_ADDR from the environment or the
// flags). `getenv` returns null for an unset variable. Errors name the flag
// or variable that is wrong.
absl::StatusOr<DataParallelOptions> ResolveDataParallel(
    const DataParallelFlags& flags, const std::function<const char*(const char*)>& getenv);

// A rank's device flag: "cuda" without an index becomes cuda:LOCAL_RANK
// (torchrun) or cuda:SLURM_LOCALID (Slurm), when either is set, so that the
// ranks on a node take one GPU each; anything else ("cpu", "cuda:N") stays.
// ParseDevice then checks the GPU exists. Errors name the variable.
absl::StatusOr<std::string> RankDevice(const std::string& device,
                                       const std::function<const char*(const char*)>& getenv);

// Splits groups across `world` ranks by tokens, whole groups: the largest
// first, each to the rank with the fewest tokens so far (the lowest rank on
// a tie). Returns each rank's group indices in their original order.
std::vector<std::vector<size_t>> SplitByTokens(const std::vector<QueuedGroup>& groups, int world);

// Rank 0's message to the other ranks.
struct StepMessage {
  // kSave: every rank writes its part of a checkpoint (kSaveCheckpoint)
  // and joins the export's gathers (kSaveExport).
  enum class Kind { kIdle = 0, kStep = 1, kStop = 2, kSave = 3 };
  static constexpr int64_t kSaveCheckpoint = 1, kSaveExport = 2;
  Kind kind = Kind::kIdle;
  int64_t save = 0;                // kSave: kSaveCheckpoint | kSaveExport
  std::vector<QueuedGroup> shard;  // this rank's groups (kStep)
  StepTotals totals;               // the whole step's (kStep)
};

// A status from a failed collective: the job cannot go on.
bool IsRankFailure(const absl::Status& status);
// The status of a failed collective (or rendezvous) `what`, with c10d's
// `error`; IsRankFailure holds for it.
absl::Status RankFailure(absl::string_view what, absl::string_view error, absl::Duration timeout);

class DataParallel : public StepReducer, public ShardCollectives {
 public:
  // Joins the world (rank 0 starts the store); waits up to the timeout for
  // every rank.
  static absl::StatusOr<std::unique_ptr<DataParallel>> Create(const DataParallelOptions& options);
  ~DataParallel() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  const DataParallelOptions& options() const { return options_; }

  // Rank 0: splits `groups` (SplitByTokens), sends every other rank its
  // share and the totals, and returns rank 0's share.
  absl::StatusOr<StepMessage> SendStep(const std::vector<QueuedGroup>& groups);
  absl::Status SendIdle();
  absl::Status SendStop();
  absl::Status SendSave(int64_t what);  // StepMessage::kSave*
  // Other ranks: rank 0's next message.
  absl::StatusOr<StepMessage> Receive();

  // Rank 0's weights, version and (with `moments`) AdamW state, copied to
  // every rank.
  absl::Status BroadcastState(PolicyModel* model, AdamW* optimizer, uint64_t* version,
                              bool moments = true);
  // Rank 0's `values` on every rank (each rank passes as many).
  absl::Status BroadcastValues(std::vector<int64_t>* values);

  // StepReducer: sums across ranks, in place.
  absl::Status SumValues(std::vector<double>* values) override;
  absl::Status SumGradients(const std::vector<at::Tensor>& gradients) override;

  // ShardCollectives. Gloo (LibTorch 1.13) has no reduce-scatter: it is one
  // c10d reduce per rank, each to the rank that owns that part; NCCL's is
  // its own.
  absl::Status ReduceScatter(std::vector<at::Tensor>& inputs, at::Tensor& output) override;
  absl::Status AllGather(at::Tensor& input, std::vector<at::Tensor>& outputs) override;
  absl::Status GatherToRank0(at::Tensor& input, std::vector<at::Tensor>& outputs) override;
  absl::Status ScatterFromRank0(std::vector<at::Tensor>& inputs, at::Tensor& output) override;

  // Seconds this process has spent in collectives (for the benchmark).
  double collective_seconds() const { return collective_seconds_; }

 private:
  explicit DataParallel(const DataParallelOptions& options);
  absl::Status GlooGatherToRank0(at::Tensor& input, std::vector<at::Tensor>& outputs);
  absl::Status SendHeader(StepMessage::Kind kind, const StepTotals& totals,
                          const std::vector<int64_t>& bytes);

  DataParallelOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  // The c10d process group and where its tensors go (data_parallel.cc).
  struct Group;
  std::unique_ptr<Group> group_;
  double collective_seconds_ = 0;
};

}  // namespace asympo::learner
