// The data-parallel learner's settings, its split of a step, and its
// failure status: everything but the collectives (data_parallel.cc), so
// that a build without Gloo still resolves and refuses the settings.
#include <algorithm>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/collective/collective_group.h"
#include "common/status_macros.h"
#include "learner_server/parallel/data_parallel.h"

namespace asympo::learner {
namespace {

constexpr char kRankFailureUrl[] = "type.asympo/learner.rank_failure";

// One integer setting: the flag when given, else the first set variable.
absl::StatusOr<std::optional<int>> IntSetting(
    std::optional<int> flag, std::initializer_list<const char*> variables,
    const std::function<const char*(const char*)>& getenv) {
  if (flag.has_value()) return flag;
  for (const char* name : variables) {
    const char* value = getenv(name);
    if (value == nullptr || *value == '\0') continue;
    int x = 0;
    if (!absl::SimpleAtoi(value, &x)) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", name, "=\"", value, "\" is not an integer"));
    }
    return std::optional<int>(x);
  }
  return std::optional<int>();
}

// --dist_backend for the rank's device: refuses what this build lacks only
// where a world of more than one rank needs it.
absl::StatusOr<DistBackend> ResolveBackend(const DataParallelFlags& f, int world_size) {
  DistBackend backend;
  if (f.backend == "auto") {
    backend = f.device.is_cuda() && collective::NcclGroupBuilt() ? DistBackend::kNccl
                                                                 : DistBackend::kGloo;
  } else if (f.backend == "gloo") {
    backend = DistBackend::kGloo;
  } else if (f.backend == "nccl") {
    backend = DistBackend::kNccl;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dist_backend: \"", f.backend, "\" is not one of auto, gloo, nccl"));
  }
  if (backend == DistBackend::kNccl && !f.device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dist_backend=nccl needs the learner on a GPU (--device=cuda), and the "
                     "device is ",
                     f.device.str(), "; on the CPU use --dist_backend=gloo"));
  }
  if (world_size > 1 && backend == DistBackend::kNccl && !collective::NcclGroupBuilt()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--dist_backend=nccl: ", collective::NcclGroupMissing()));
  }
  if (world_size > 1 && backend == DistBackend::kGloo && !collective::GlooGroupBuilt()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--dist_backend=gloo", f.backend == "auto" ? " (auto)" : "", ": ",
        collective::GlooGroupMissing(), collective::NcclGroupBuilt() ? "" : "; nor has it NCCL's"));
  }
  return backend;
}

}  // namespace

absl::string_view DistBackendName(DistBackend backend) {
  return backend == DistBackend::kNccl ? "nccl" : "gloo";
}

// The status of a failed collective (or rendezvous).
absl::Status RankFailure(absl::string_view what, absl::string_view error, absl::Duration timeout) {
  std::string message(error);
  if (const size_t nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
  absl::Status s = absl::UnavailableError(absl::StrCat(
      "data parallel: ", what, " failed: ", message,
      " (a rank died, hung, or did not answer within ", absl::FormatDuration(timeout), ")"));
  s.SetPayload(kRankFailureUrl, absl::Cord("1"));
  return s;
}

absl::StatusOr<DataParallelOptions> ResolveDataParallel(
    const DataParallelFlags& f, const std::function<const char*(const char*)>& getenv) {
  DataParallelOptions o;
  ASYMPO_ASSIGN_OR_RETURN(std::optional<int> world,
                          IntSetting(f.world_size, {"WORLD_SIZE", "SLURM_NTASKS"}, getenv));
  ASYMPO_ASSIGN_OR_RETURN(std::optional<int> rank,
                          IntSetting(f.rank, {"RANK", "SLURM_PROCID"}, getenv));
  ASYMPO_ASSIGN_OR_RETURN(std::optional<int> port,
                          IntSetting(f.master_port, {"MASTER_PORT"}, getenv));
  o.world_size = world.value_or(1);
  o.rank = rank.value_or(0);
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the world size is ", o.world_size, "; it must be at least 1"));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("the rank is ", o.rank, "; with a world of ",
                                                   o.world_size, " it must be in [0, ",
                                                   o.world_size - 1, "]"));
  }
  o.master_port = port.value_or(29500);
  if (o.master_port < 1 || o.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("the master port is ", o.master_port, "; expected 1..65535"));
  }
  o.master_addr = f.master_addr;
  if (const char* env = getenv("MASTER_ADDR"); o.master_addr.empty() && env != nullptr) {
    o.master_addr = env;
  }
  if (o.master_addr.empty()) {
    if (o.world_size > 1) {
      return absl::InvalidArgumentError(
          "a world of more than one rank needs rank 0's address: --dist_master_addr or "
          "MASTER_ADDR");
    }
    o.master_addr = "127.0.0.1";
  }
  o.local_addr = f.local_addr;
  o.timeout = f.timeout;
  if (o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the data-parallel timeout must be positive");
  }
  o.insecure = f.insecure;
  if (f.shard.empty()) {
    o.shard = f.shard_optimizer ? DistShard::kOptimizer : DistShard::kNone;
  } else {
    absl::StatusOr<DistShard> shard = ParseDistShard(f.shard);
    if (!shard.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--dist_shard: ", shard.status().message()));
    }
    if (f.shard_optimizer && *shard != DistShard::kOptimizer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--dist_shard_optimizer contradicts --dist_shard=", f.shard, "; give only --dist_shard"));
    }
    o.shard = *shard;
  }
  ASYMPO_RETURN_IF_ERROR(CheckShardWorld(o.shard, o.world_size));
  ASYMPO_ASSIGN_OR_RETURN(o.backend, ResolveBackend(f, o.world_size));
  o.device = f.device;
  if (o.world_size > 1 && !o.insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a world of ", o.world_size, " ranks talks over c10d's TCPStore (listening on port ",
        o.master_port, " of every interface of rank 0) and ",
        o.backend == DistBackend::kNccl ? "NCCL" : "Gloo",
        ", neither authenticated nor encrypted; "
        "on a trusted network pass --dist_insecure to accept that"));
  }
  return o;
}

absl::StatusOr<std::string> RankDevice(const std::string& device,
                                       const std::function<const char*(const char*)>& getenv) {
  if (device != "cuda") return device;
  ASYMPO_ASSIGN_OR_RETURN(std::optional<int> local,
                          IntSetting(std::nullopt, {"LOCAL_RANK", "SLURM_LOCALID"}, getenv));
  if (!local.has_value()) return device;
  if (*local < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the local rank (LOCAL_RANK or SLURM_LOCALID) is ", *local, "; it must be >= 0"));
  }
  return absl::StrCat("cuda:", *local);
}

std::vector<std::vector<size_t>> SplitByTokens(const std::vector<QueuedGroup>& groups, int world) {
  std::vector<size_t> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return groups[a].tokens > groups[b].tokens; });
  std::vector<std::vector<size_t>> out(static_cast<size_t>(world));
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  for (size_t i : order) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += groups[i].tokens;
    out[r].push_back(i);
  }
  for (auto& indices : out) std::sort(indices.begin(), indices.end());
  return out;
}

bool IsRankFailure(const absl::Status& status) {
  return status.GetPayload(kRankFailureUrl).has_value();
}

}  // namespace asympo::learner
