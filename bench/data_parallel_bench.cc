// One rank of the data-parallel learner benchmark (bench/data_parallel_bench.py
// starts the ranks and compares the worlds side by side). With --world 1 it
// is the single-process learner (Trainer::Step, no c10d at all); with more,
// rank 0 splits each step's groups across the ranks as the learner daemon
// does (DataParallel::SendStep, Gloo on loopback) and every rank runs
// Trainer::StepShard, with nothing sharded (--shard 0), the AdamW moments
// sharded (1, ZeRO-1) or the weights, gradients and moments (2, full; with
// --world 1 too, through a world of one Gloo rank).
//
// Every rank keeps asympo-learner's glibc settings (RetainFreedMemory).
// Each rank prints one JSON line: its step seconds (rank 0's include the
// split and the scatter of the groups), the seconds spent in the step's
// collectives (all-reduce, or reduce-scatter and all-gather, including the
// wait for the slowest rank), the tokens it trained, its optimizer state in
// bytes, the tensor memory it holds between steps and its peak in a step
// (LibTorch's CPU allocations: common/model/cpu_memory.h), and its resident
// memory after the last step and at its peak.
//
//   data_parallel_bench --world N --rank R --port P [--shard 0|1|2] [--model 100m]
//                       [--steps 4] [--warmup 1] [--groups 6] [--responses 4]
//                       [--prompt 8] [--response 8] [--threads T]
//                       [--micro_batch_tokens M --sequence S --micro_batches K
//                        --checkpointing E]
//
// With --micro_batch_tokens, each rank's share of a step is instead K
// micro-batches of M real tokens in sequences of S tokens (bench/step_groups.h;
// the trainer's --micro_batch_tokens is M, its activation checkpointing E as
// ModelOptions::checkpoint_every), and the rank also prints its memory plan
// (learner_server/plan/memory_plan.h: CPU, float32, no publisher, no checkpoint,
// no workspace) beside the measured tensor peak.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <glog/logging.h>
#include "bench/bench_models.h"
#include "bench/step_groups.h"
#include "common/daemon/daemon_runtime.h"
#include "common/model/cpu_memory.h"
#include "common/model/device.h"
#include "learner_server/parallel/data_parallel.h"
#include "learner_server/plan/memory_plan.h"
#include "learner_server/trainer/trainer.h"

namespace asympo::learner {
namespace {

std::vector<QueuedGroup> GroupsOf(int step, const std::map<std::string, int>& f, int64_t vocab) {
  std::mt19937 rng(1000 + step);
  std::uniform_int_distribution<int> ids(1, static_cast<int>(vocab) - 1);
  auto token = [&] { return ids(rng); };
  std::vector<QueuedGroup> out;
  for (int g = 0; g < f.at("groups"); ++g) {
    QueuedGroup q;
    q.arrival_version = static_cast<uint64_t>(step);
    q.group.set_prompt_id("s" + std::to_string(step) + "g" + std::to_string(g));
    for (int t = 0; t < f.at("prompt"); ++t) q.group.add_prompt_tokens(token());
    for (int r = 0; r < f.at("responses"); ++r) {
      v1::Response* resp = q.group.add_responses();
      for (int t = 0; t < f.at("response"); ++t) resp->add_tokens(token());
      resp->set_reward(static_cast<float>(r % 2));
      q.tokens += f.at("prompt") + f.at("response");
    }
    out.push_back(std::move(q));
  }
  return out;
}

// VmRSS or VmHWM from /proc/self/status, in bytes.
int64_t ProcStatus(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::atoll(line.c_str() + key.size() + 1) * 1024;
  }
  return -1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// This rank's memory plan for the flags (CPU, float32, no publisher, no
// checkpoint, no workspace).
MemoryPlan PlanOf(const ModelConfig& config, std::map<std::string, int>& f, int64_t chunk_rows) {
  PlanOptions po = bench::CpuStepPlan(config, f["micro_batch_tokens"], f["sequence"],
                                      f["checkpointing"], chunk_rows);
  po.world_size = f["world"];
  po.shard = f["shard"] == 2 ? DistShard::kFull
                             : (f["shard"] == 1 ? DistShard::kOptimizer : DistShard::kNone);
  return PlanMemory(po).value();
}

// A world of Gloo ranks (none for one unsharded process), sharded as
// --shard says, from rank 0's state.
std::unique_ptr<DataParallel> JoinWorld(std::map<std::string, int>& f, PolicyModel* model,
                                        Trainer* trainer) {
  if (f["world"] == 1 && f["shard"] != 2) return nullptr;
  DataParallelOptions o;
  o.world_size = f["world"], o.rank = f["rank"], o.master_port = f["port"], o.insecure = true;
  o.timeout = absl::Minutes(5);
  std::unique_ptr<DataParallel> dp = DataParallel::Create(o).value();
  uint64_t version = 0;
  CHECK(dp->BroadcastState(model, &trainer->optimizer(), &version, !f["shard"]).ok());
  if (f["shard"] == 1) CHECK(trainer->ShardOptimizer(dp.get()).ok());
  if (f["shard"] == 2) CHECK(trainer->ShardFully(dp.get()).ok());
  return dp;
}

// The flags, over their defaults; false on an unknown one.
bool ParseFlags(int argc, char** argv, std::map<std::string, int>* f, std::string* model_name) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--model") {
      *model_name = argv[i + 1];
    } else if (k.size() > 2 && f->count(k.substr(2)) == 1) {
      (*f)[k.substr(2)] = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return false;
    }
  }
  return true;
}

int Run(int argc, char** argv) {
  std::map<std::string, int> f = {
      {"world", 1},      {"rank", 0},          {"port", 29500},     {"shard", 0},
      {"steps", 4},      {"warmup", 1},        {"groups", 6},       {"responses", 4},
      {"prompt", 8},     {"response", 8},      {"threads", 0},      {"micro_batch_tokens", 0},
      {"sequence", 512}, {"micro_batches", 2}, {"checkpointing", 0}};
  std::string model_name = "100m";
  if (!ParseFlags(argc, argv, &f, &model_name)) return 2;
  const int world = f["world"], rank = f["rank"];
  daemon::RetainFreedMemory();               // asympo-learner's glibc settings
  CpuMemory& memory = CpuMemory::Install();  // before the model: count everything
  asympo::SetCpuThreads(f["threads"] > 0 ? f["threads"] : 1);
  const bool planned = f["micro_batch_tokens"] > 0;
  ModelOptions mo;
  mo.seed = 11;
  mo.checkpoint_every = f["checkpointing"];
  const ModelConfig config = bench::BenchConfig(model_name);
  std::unique_ptr<PolicyModel> model = PolicyModel::CreateRandom(config, mo).value();
  TrainerOptions to;
  to.loss.objective = Objective::kAsympoStable;
  to.lr.peak_lr = 1e-5;
  if (planned) to.micro_batch_tokens = f["micro_batch_tokens"];
  auto step_groups = [&](int step) {
    if (!planned) return GroupsOf(step, f, config.vocab_size);
    std::mt19937 rng(1000 + step);
    return bench::UniformStepGroups(int64_t{f["micro_batches"]} * world, f["micro_batch_tokens"],
                                    f["sequence"], config.vocab_size, rng);
  };
  std::unique_ptr<Trainer> trainer = Trainer::Create(to, model.get(), nullptr).value();
  std::unique_ptr<DataParallel> dp = JoinWorld(f, model.get(), trainer.get());
  std::vector<double> seconds, exchange;
  int64_t tokens = 0, held = 0, peak = 0;
  for (int step = 1; step <= f["warmup"] + f["steps"]; ++step) {
    memory.ResetPeak();
    const double before = dp != nullptr ? dp->collective_seconds() : 0.0;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<StepResult> r;
    if (dp == nullptr) {
      r = trainer->Step(step_groups(step));
    } else {
      StepMessage m = rank == 0 ? dp->SendStep(step_groups(step)).value() : dp->Receive().value();
      r = trainer->StepShard(m.shard, m.totals, dp.get());
    }
    CHECK(r.ok()) << r.status();
    held = memory.current();
    if (step <= f["warmup"]) continue;
    peak = std::max(peak, memory.peak());
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    exchange.push_back(dp != nullptr ? dp->collective_seconds() - before : 0.0);
    tokens = r->tokens;  // the whole step's (summed across ranks)
  }
  const int64_t state_bytes = trainer->optimizer_state_bytes();
  const int64_t params = config.NumParameters();
  // The plan of this rank's step, as asympo-plan would print it for these
  // flags on the CPU without a publisher or checkpoints.
  const MemoryPlan plan = planned ? PlanOf(config, f, to.logprob_chunk_rows) : MemoryPlan();
  const std::string plan_phase = planned ? std::string(PlanPhaseName(plan.peak_phase)) : "";
  std::printf(
      "{\"world\": %d, \"rank\": %d, \"shard\": %d, \"model\": \"%s\", \"parameters\": %lld, "
      "\"threads\": %d, \"step_s\": %.4f, \"exchange_s\": %.4f, \"tokens\": %lld, "
      "\"optimizer_state_bytes\": %lld, \"held_bytes\": %lld, \"peak_step_bytes\": %lld, "
      "\"rss_bytes\": %lld, \"peak_rss_bytes\": %lld, \"checkpointing\": %d, "
      "\"micro_batch_tokens\": %d, \"sequence\": %d, \"plan_peak_bytes\": %lld, "
      "\"plan_phase\": \"%s\"}\n",
      world, rank, f["shard"], model_name.c_str(), static_cast<long long>(params),
      at::get_num_threads(), Median(seconds), Median(exchange), static_cast<long long>(tokens),
      static_cast<long long>(state_bytes), static_cast<long long>(held),
      static_cast<long long>(peak), static_cast<long long>(ProcStatus("VmRSS")),
      static_cast<long long>(ProcStatus("VmHWM")), f["checkpointing"], f["micro_batch_tokens"],
      f["sequence"], static_cast<long long>(plan.peak_bytes), plan_phase.c_str());
  if (dp != nullptr && rank == 0) CHECK(dp->SendStop().ok());
  if (dp != nullptr && rank != 0) CHECK(dp->Receive().ok());
  return 0;
}

}  // namespace
}  // namespace asympo::learner

int main(int argc, char** argv) { return asympo::learner::Run(argc, argv); }
