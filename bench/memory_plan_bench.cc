// The memory plan (learner_server/plan/memory_plan.h) against what LibTorch
// allocates on the CPU for a learner step.
//
//   memory_plan_bench [--config 100m] [--threads 2] [--modes 0,1,2]
//                     [--micro_batch_tokens 2048] [--sequence 512]
//                     [--micro_batches 2] [--logprob_chunk_rows 1024] [--parts 0]
//
// For each activation checkpointing mode (--modes: checkpoint_every, 0 none,
// 1 layers, N every_N), a fresh model and the learner's Trainer take two
// optimizer steps (Trainer::Step, packed sequences, float32 compute) of
// --micro_batches micro-batches each; every micro-batch holds
// micro_batch_tokens real tokens in sequences of --sequence tokens (groups
// of two responses, a quarter prompt), so that its rows are as long as the
// plan's. The first step creates the AdamW moments; the second is measured:
// its peak of LibTorch's CPU allocations (common/model/cpu_memory.h,
// installed before the model is built, so the weights count) against the
// plan's peak for --device=cpu --compute_dtype=float32, one rank, no
// snapshot publisher, no checkpoints and no workspace (neither exists
// here).
//
// --parts 1 checks the parts one by one instead, on one micro-batch of
// random ids in micro_batch_tokens / sequence full rows, in float32 and in
// bfloat16 compute: the gradients allocated first (as in a step's second
// micro-batch), the forward, the chunked log-probs of every position, the
// backward; what the forward leaves against the plan's activations and
// compute copy, and the peak against the plan's largest micro-batch phase
// (forward, log-probs, backward, backward end), both above the weights,
// gradients and moments.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "bench/step_groups.h"
#include "common/model/cpu_memory.h"
#include "common/model/device.h"
#include "common/model/policy_model.h"
#include "learner_server/loss/token_logprobs.h"
#include "learner_server/plan/memory_plan.h"
#include "learner_server/plan/memory_plan_report.h"
#include "learner_server/trainer/trainer.h"

namespace {

using asympo::CpuMemory;
using asympo::ModelConfig;
using asympo::learner::QueuedGroup;

struct Run {
  int64_t micro_batch_tokens = 2048;
  int64_t sequence = 512;
  int64_t micro_batches = 2;
  int64_t chunk_rows = 1024;
};

std::vector<QueuedGroup> StepGroups(const Run& run, int64_t vocab, std::mt19937& rng) {
  return asympo::bench::UniformStepGroups(run.micro_batches, run.micro_batch_tokens, run.sequence,
                                          vocab, rng);
}

asympo::learner::PlanOptions PlanFor(const ModelConfig& c, const Run& run, int64_t every) {
  return asympo::bench::CpuStepPlan(c, run.micro_batch_tokens, run.sequence, every, run.chunk_rows);
}

// Measures one mode; prints its table row.
void Measure(const ModelConfig& c, const std::string& config_name, const Run& run, int64_t every) {
  CpuMemory& memory = CpuMemory::Install();
  const int64_t before = memory.current();
  asympo::ModelOptions mo;
  mo.seed = 1;
  mo.checkpoint_every = every;
  auto model = asympo::PolicyModel::CreateRandom(c, mo).value();
  asympo::learner::TrainerOptions to;
  to.micro_batch_tokens = run.micro_batch_tokens;
  to.logprob_chunk_rows = run.chunk_rows;
  to.lr.peak_lr = 1e-5;
  auto trainer = asympo::learner::Trainer::Create(to, model.get(), nullptr).value();
  std::mt19937 rng(7);
  const auto first = trainer->Step(StepGroups(run, c.vocab_size, rng));
  if (!first.ok()) asympo::bench::FlagError("the first step failed");
  const int64_t between = memory.current() - before;  // weights and moments
  memory.ResetPeak();
  const double seconds = asympo::bench::SecondsOf([&] {
    const auto second = trainer->Step(StepGroups(run, c.vocab_size, rng));
    if (!second.ok() || second->micro_batches != run.micro_batches) {
      asympo::bench::FlagError("the measured step failed or was not split as planned");
    }
  });
  const int64_t measured = memory.peak() - before;
  const auto plan = asympo::learner::PlanMemory(PlanFor(c, run, every)).value();
  using asympo::learner::PlanPart;
  const int64_t planned_between = plan.of(PlanPart::kMasterWeights) + plan.of(PlanPart::kMoments);
  std::printf(
      "| %s | %s | %lld x %lld | %s | %s | %+.1f%% | %s (%s) | %s | %.0f |\n", config_name.c_str(),
      asympo::ActivationCheckpointingName(every).c_str(),
      static_cast<long long>(run.micro_batch_tokens / run.sequence),
      static_cast<long long>(run.sequence), asympo::learner::Gib(plan.peak_bytes).c_str(),
      asympo::learner::Gib(measured).c_str(),
      100.0 * static_cast<double>(plan.peak_bytes - measured) / static_cast<double>(measured),
      asympo::learner::Gib(planned_between).c_str(), asympo::learner::Gib(between).c_str(),
      std::string(asympo::learner::PlanPhaseName(plan.peak_phase)).c_str(), seconds);
  std::fflush(stdout);
}

// One micro-batch by hand (see --parts above): after the forward, the
// peak; bytes above what was allocated before the forward.
struct PartsMeasured {
  int64_t after_forward = 0, peak = 0;
};

PartsMeasured MeasureParts(const ModelConfig& c, const Run& run, const asympo::ModelOptions& mo) {
  CpuMemory& memory = CpuMemory::Install();
  auto model = asympo::PolicyModel::CreateRandom(c, mo).value();
  for (at::Tensor p : model->parameters()) p.mutable_grad() = at::zeros_like(p);
  const int64_t rows = run.micro_batch_tokens / run.sequence, s = run.sequence;
  at::manual_seed(1);
  const at::Tensor ids = at::randint(0, c.vocab_size, {rows, s}, at::kLong);
  const at::Tensor positions = at::arange(s, at::kLong).unsqueeze(0).expand({rows, s}).contiguous();
  const at::Tensor keys = at::ones({rows, s}, at::kBool);
  const at::Tensor segments = at::zeros({rows, s}, at::kLong);
  const int64_t base = memory.current();
  memory.ResetPeak();
  PartsMeasured m;
  at::Tensor hidden = model->Forward(ids, positions, keys, nullptr, segments);  // (rows, s, H)
  m.after_forward = memory.current() - base - static_cast<int64_t>(hidden.nbytes());
  at::Tensor picked = hidden.reshape({-1, c.hidden_size});  // (M, H), every position
  const at::Tensor logp = asympo::learner::ChunkedTokenLogProbs(picked, model->lm_head_weight(),
                                                                ids.reshape({-1}), run.chunk_rows)
                              .value();
  hidden.reset();
  picked.reset();
  (-logp.mean()).backward();
  m.peak = memory.peak() - base;
  return m;
}

void Parts(const ModelConfig& c, const std::string& config_name, const Run& run, int64_t every) {
  using asympo::learner::PlanPart;
  for (const bool bf16 : {false, true}) {
    asympo::ModelOptions mo;
    mo.seed = 1;
    mo.checkpoint_every = every;
    if (bf16) mo.compute_dtype = at::kBFloat16;
    const PartsMeasured m = MeasureParts(c, run, mo);
    asympo::learner::PlanOptions o = PlanFor(c, run, every);
    o.compute_dtype =
        bf16 ? asympo::learner::PlanDType::kBFloat16 : asympo::learner::PlanDType::kFloat32;
    const auto plan = asympo::learner::PlanMemory(o).value();
    const int64_t persistent = plan.of(PlanPart::kMasterWeights) + plan.of(PlanPart::kGradients) +
                               plan.of(PlanPart::kMoments);
    int64_t planned_peak = 0;
    for (const auto phase :
         {asympo::learner::PlanPhase::kForward, asympo::learner::PlanPhase::kLogProbs,
          asympo::learner::PlanPhase::kBackward, asympo::learner::PlanPhase::kBackwardEnd}) {
      planned_peak = std::max(planned_peak, plan.phase_bytes[static_cast<size_t>(phase)]);
    }
    planned_peak -= persistent;
    const int64_t planned_forward =
        plan.of(PlanPart::kActivations) + plan.of(PlanPart::kComputeCopy);
    const auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
    const auto off = [](int64_t plan, int64_t measured) {
      return 100.0 * static_cast<double>(plan - measured) / static_cast<double>(measured);
    };
    std::printf("| %s | %s | %s | %.1f / %.1f (%+.1f%%) | %.1f / %.1f (%+.1f%%) |\n",
                config_name.c_str(), bf16 ? "bfloat16" : "float32",
                asympo::ActivationCheckpointingName(every).c_str(), mib(planned_forward),
                mib(m.after_forward), off(planned_forward, m.after_forward), mib(planned_peak),
                mib(m.peak), off(planned_peak, m.peak));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using asympo::bench::Flag;
  const std::string config = asympo::bench::FlagS(argc, argv, "--config", "100m");
  Run run;
  run.micro_batch_tokens = Flag(argc, argv, "--micro_batch_tokens", 2048);
  run.sequence = Flag(argc, argv, "--sequence", 512);
  run.micro_batches = Flag(argc, argv, "--micro_batches", 2);
  run.chunk_rows = Flag(argc, argv, "--logprob_chunk_rows", 1024);
  const std::vector<int64_t> modes = asympo::bench::ListFlag(argc, argv, "--modes", "0,1,2");
  const bool parts = Flag(argc, argv, "--parts", 0) != 0;
  asympo::SetCpuThreads(static_cast<int>(Flag(argc, argv, "--threads", 2)));
  asympo::bench::RejectUnknownFlags(argc, argv);
  if (run.sequence < 2 || run.micro_batch_tokens % (2 * run.sequence) != 0) {
    asympo::bench::FlagError("--micro_batch_tokens must be a multiple of twice --sequence");
  }
  const ModelConfig c = asympo::bench::BenchConfig(config);
  if (parts) {
    std::printf(
        "| model | compute | checkpointing | after the forward: plan / measured MiB | micro-batch "
        "peak: plan / measured MiB |\n| --- | --- | --- | --- | --- |\n");
    for (const int64_t every : modes) Parts(c, config, run, every);
    return 0;
  }
  std::printf(
      "| model | checkpointing | rows x length | plan peak GiB | measured peak GiB | plan vs "
      "measured | weights + moments: plan (measured) GiB | plan's peak phase | step s |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const int64_t every : modes) Measure(c, config, run, every);
  std::printf("(%.1fM parameters; %lld micro-batches of %lld packed tokens a step)\n",
              static_cast<double>(c.NumParameters()) / 1e6,
              static_cast<long long>(run.micro_batches),
              static_cast<long long>(run.micro_batch_tokens));
  return 0;
}
