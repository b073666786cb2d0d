#include "learner_server/parallel/data_parallel.h"

#include <functional>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include "common/collective/collective_group.h"
#include "learner_server/trainer/step_exchange.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_test_util.h"

namespace asympo::learner {
namespace {

using Env = std::map<std::string, std::string>;
using ::asympo::testing::StatusIs;

// A getenv over `env` (null for a variable it lacks).
std::function<const char*(const char*)> Lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

absl::StatusOr<DataParallelOptions> Resolve(const DataParallelFlags& flags, const Env& env) {
  return ResolveDataParallel(flags, Lookup(env));
}

DataParallelFlags Insecure() {
  DataParallelFlags f;
  f.insecure = true;
  return f;
}

TEST(ResolveDataParallelTest, NothingSetIsOneProcess) {
  const auto o = Resolve({}, {});
  ASSERT_OK(o);
  EXPECT_EQ(o->world_size, 1);
  EXPECT_EQ(o->rank, 0);
}

TEST(ResolveDataParallelTest, TorchrunVariables) {
  const auto o = Resolve(
      Insecure(),
      {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29411"}});
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->world_size, 4);
  EXPECT_EQ(o->master_addr, "10.0.0.5");
  EXPECT_EQ(o->master_port, 29411);
}

TEST(ResolveDataParallelTest, SlurmVariablesWhenTorchrunsAreAbsent) {
  const auto o =
      Resolve(Insecure(), {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "3"}, {"MASTER_ADDR", "node7"}});
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->world_size, 3);
  EXPECT_EQ(o->master_port, 29500);
}

TEST(ResolveDataParallelTest, FlagsWinOverTheEnvironment) {
  DataParallelFlags f = Insecure();
  f.rank = 0;
  f.world_size = 2;
  f.master_addr = "127.0.0.1";
  f.master_port = 30000;
  const auto o =
      Resolve(f, {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}});
  ASSERT_OK(o);
  EXPECT_EQ(o->rank, 0);
  EXPECT_EQ(o->world_size, 2);
  EXPECT_EQ(o->master_addr, "127.0.0.1");
  EXPECT_EQ(o->master_port, 30000);
}

TEST(ResolveDataParallelTest, BadValuesAreNamed) {
  auto message = [](const DataParallelFlags& f, const Env& env) {
    const auto o = Resolve(f, env);
    return o.ok() ? std::string("ok") : std::string(o.status().message());
  };
  EXPECT_NE(message(Insecure(), {{"WORLD_SIZE", "two"}}).find("WORLD_SIZE=\"two\""),
            std::string::npos);
  EXPECT_NE(message(Insecure(), {{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}})
                .find("the rank is 4"),
            std::string::npos);
  EXPECT_NE(message(Insecure(), {{"WORLD_SIZE", "0"}}).find("world size is 0"), std::string::npos);
  EXPECT_NE(
      message(Insecure(), {{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
          .find("master port is 70000"),
      std::string::npos);
  EXPECT_NE(message(Insecure(), {{"WORLD_SIZE", "2"}}).find("MASTER_ADDR"), std::string::npos);
}

TEST(ResolveDataParallelTest, TheShardingModeFromEitherFlag) {
  DataParallelFlags f = Insecure();
  EXPECT_EQ(Resolve(f, {}).value().shard, DistShard::kNone);
  f.shard_optimizer = true;
  EXPECT_EQ(Resolve(f, {}).value().shard, DistShard::kOptimizer);
  f.shard = "optimizer";
  EXPECT_EQ(Resolve(f, {}).value().shard, DistShard::kOptimizer);
  f.shard = "full";
  EXPECT_THAT(Resolve(f, {}), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "--dist_shard_optimizer contradicts --dist_shard=full"));
  f.shard_optimizer = false;
  EXPECT_EQ(
      Resolve(f, {{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}}).value().shard,
      DistShard::kFull);
  // One rank has nothing to shard over; it is refused rather than run
  // unsharded without the recomputation full sharding implies.
  EXPECT_THAT(Resolve(f, {}), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "--dist_shard=full with a world of 1 rank"));
  f.shard = "zero3";
  EXPECT_THAT(Resolve(f, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--dist_shard: \"zero3\" is not a sharding mode; expected none, optimizer "
                       "or full"));
  for (const DistShard s : {DistShard::kNone, DistShard::kOptimizer, DistShard::kFull}) {
    EXPECT_EQ(ParseDistShard(DistShardName(s)).value(), s);
  }
}

TEST(ResolveDataParallelTest, MoreThanOneRankNeedsTheOperatorsConsent) {
  const auto o = Resolve({}, {{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}});
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, "--dist_insecure"));
}

TEST(ResolveDataParallelTest, TheBackendFollowsTheDeviceAndTheBuild) {
  DataParallelFlags f = Insecure();
  EXPECT_EQ(Resolve(f, {}).value().backend, DistBackend::kGloo);  // auto on the CPU
  f.backend = "gloo";
  EXPECT_EQ(Resolve(f, {}).value().backend, DistBackend::kGloo);
  f.backend = "mpi";
  EXPECT_THAT(Resolve(f, {}), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "--dist_backend: \"mpi\" is not one of auto, gloo, nccl"));
  f.backend = "nccl";
  EXPECT_THAT(Resolve(f, {}), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "--dist_backend=nccl needs the learner on a GPU"));
  // On a GPU (a device value needs no driver): auto takes NCCL where this
  // build has it; an explicit NCCL that the build lacks is refused, saying
  // what it lacks, once a world needs it.
  f.device = at::Device(at::kCUDA, 1);
  f.world_size = 2, f.rank = 1, f.master_addr = "10.0.0.1";
  const absl::StatusOr<DataParallelOptions> nccl = Resolve(f, {});
  f.backend = "auto";
  const absl::StatusOr<DataParallelOptions> automatic = Resolve(f, {});
  ASSERT_OK(automatic);
  EXPECT_EQ(automatic->device, at::Device(at::kCUDA, 1));
  if (collective::NcclGroupBuilt()) {
    ASSERT_OK(nccl);
    EXPECT_EQ(nccl->backend, DistBackend::kNccl);
    EXPECT_EQ(automatic->backend, DistBackend::kNccl);
  } else {
    EXPECT_THAT(nccl, StatusIs(absl::StatusCode::kFailedPrecondition,
                               "built without c10d's NCCL process group"));
    EXPECT_EQ(automatic->backend, DistBackend::kGloo);
  }
  f.world_size = 1, f.rank = 0;  // one process needs no backend at all
  f.backend = "nccl";
  EXPECT_EQ(Resolve(f, {}).value().backend, DistBackend::kNccl);
}

TEST(ResolveDataParallelTest, TheConsentMessageNamesTheBackend) {
  DataParallelFlags f;
  f.world_size = 2, f.rank = 0;
  f.master_addr = "127.0.0.1";
  EXPECT_THAT(Resolve(f, {}), StatusIs(absl::StatusCode::kInvalidArgument, "and Gloo, neither"));
  if (collective::NcclGroupBuilt()) {
    f.device = at::Device(at::kCUDA, 0);
    EXPECT_THAT(Resolve(f, {}), StatusIs(absl::StatusCode::kInvalidArgument, "and NCCL, neither"));
  }
}

absl::StatusOr<std::string> Device(const std::string& flag, const Env& env) {
  return RankDevice(flag, Lookup(env));
}

TEST(RankDeviceTest, CudaWithoutAnIndexTakesTheLocalRanksGpu) {
  EXPECT_EQ(Device("cuda", {}).value(), "cuda");
  EXPECT_EQ(Device("cuda", {{"LOCAL_RANK", "3"}}).value(), "cuda:3");
  EXPECT_EQ(Device("cuda", {{"SLURM_LOCALID", "1"}}).value(), "cuda:1");
  EXPECT_EQ(Device("cuda", {{"LOCAL_RANK", "2"}, {"SLURM_LOCALID", "5"}}).value(), "cuda:2");
  // The operator's own choice stays.
  EXPECT_EQ(Device("cuda:0", {{"LOCAL_RANK", "3"}}).value(), "cuda:0");
  EXPECT_EQ(Device("cpu", {{"LOCAL_RANK", "3"}}).value(), "cpu");
}

TEST(RankDeviceTest, BadLocalRanksAreNamed) {
  const auto bad = Device("cuda", {{"LOCAL_RANK", "one"}});
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument, "LOCAL_RANK"));
  const auto negative = Device("cuda", {{"SLURM_LOCALID", "-1"}});
  EXPECT_THAT(negative, StatusIs(absl::StatusCode::kInvalidArgument, "SLURM_LOCALID"));
}

TEST(SplitByTokensTest, WholeGroupsBalancedByTokensInOrder) {
  std::vector<QueuedGroup> groups(5);
  const int64_t tokens[] = {10, 40, 25, 25, 5};
  for (size_t i = 0; i < groups.size(); ++i) groups[i].tokens = tokens[i];
  const auto split = SplitByTokens(groups, 2);
  ASSERT_EQ(split.size(), 2u);
  // 40 -> r0; 25 -> r1; 25 -> r1 (50 > 40? no: r1 has 25 < 40); 10 -> r0; 5 -> r0 or r1.
  EXPECT_EQ(split[0], (std::vector<size_t>{0, 1, 4}));
  EXPECT_EQ(split[1], (std::vector<size_t>{2, 3}));
}

TEST(SplitByTokensTest, MoreRanksThanGroupsLeavesSomeEmpty) {
  std::vector<QueuedGroup> groups = FixedGroups(2);
  const auto split = SplitByTokens(groups, 3);
  ASSERT_EQ(split.size(), 3u);
  EXPECT_EQ(split[0].size() + split[1].size(), 2u);
  EXPECT_TRUE(split[2].empty());
  EXPECT_FALSE(split[0].empty());  // rank 0 always holds the largest group
}

// Two ranks holding the same share: each summed value doubles.
class TwoEqualRanks : public StepReducer {
 public:
  absl::Status SumValues(std::vector<double>* values) override {
    ++calls;
    for (double& v : *values) v *= 2;
    return absl::OkStatus();
  }
  absl::Status SumGradients(const std::vector<at::Tensor>&) override { return absl::OkStatus(); }
  int calls = 0;
};

TEST(StepExchangeTest, EverySummedFieldAddsUpAcrossTheRanksInOneCall) {
  StepExchange e;
  e.diagnostics.loss = 1.5;
  e.diagnostics.positive_mass = 2;
  e.diagnostics.s_pos = 1;
  e.diagnostics.s_neg = 0.5;
  e.diagnostics.reward = 6;
  e.diagnostics.groups = 3;
  e.diagnostics.responses = 12;
  e.diagnostics.tokens = 40;
  e.tokens = 90;
  e.micro_batches = 2;
  e.gpg_alpha = 1.25;
  e.ranks_with_groups = 1;
  e.has_gradient = {1, 0, 1};
  EXPECT_EQ(e.failure(), std::nullopt);
  e.failures[static_cast<size_t>(SkipReason::kOutOfMemory)] = 1;
  TwoEqualRanks reducer;
  ASSERT_OK(SumAcrossRanks(reducer, e));
  EXPECT_EQ(reducer.calls, 1);
  EXPECT_EQ(e.diagnostics.loss, 3.0);
  EXPECT_EQ(e.diagnostics.groups, 6);
  EXPECT_EQ(e.tokens, 180);
  EXPECT_EQ(e.micro_batches, 4);
  EXPECT_EQ(e.ranks_with_groups, 2);
  EXPECT_EQ(e.has_gradient, (std::vector<int64_t>{2, 0, 2}));
  EXPECT_EQ(e.failure(), SkipReason::kOutOfMemory);
  const LossDiagnostics d = e.Pooled();  // means over the two ranks' sums
  EXPECT_DOUBLE_EQ(d.loss, 3.0);
  EXPECT_DOUBLE_EQ(d.s_pos, 0.5);
  EXPECT_DOUBLE_EQ(d.s_neg, 0.25);
  EXPECT_DOUBLE_EQ(d.reward_mean, 0.5);
  EXPECT_DOUBLE_EQ(d.gpg_alpha, 1.25);  // averaged over the ranks with groups
  EXPECT_EQ(d.responses, 24);
}

class BrokenRanks : public TwoEqualRanks {
 public:
  absl::Status SumValues(std::vector<double>*) override {
    return absl::UnavailableError("a rank died");
  }
};

TEST(StepExchangeTest, AFailedCollectivePassesThrough) {
  StepExchange e;
  BrokenRanks reducer;
  EXPECT_THAT(SumAcrossRanks(reducer, e), StatusIs(absl::StatusCode::kUnavailable, "a rank died"));
}

}  // namespace
}  // namespace asympo::learner
