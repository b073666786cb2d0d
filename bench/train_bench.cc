// How a training step is computed, measured on CPU: packed against padded
// micro-batches, and activation checkpointing against none.
//
//   train_bench --mode packing|checkpointing [--config 100m] [--threads 2]
//               [--steps 3] [--seed 1]
//     packing:       [--groups 2] [--group_size 8] [--prompt 32]
//                    [--max_response 512] [--micro_batch_tokens 8192]
//     checkpointing: [--seq 2048] [--group_size 2] [--every 1,2]
//
// packing: the same steps of long-tailed response lengths (per response:
// 75% uniform in [8, 64] tokens, 20% in [64, 256], 5% in [256,
// max_response]; prompts of --prompt tokens) trained by the learner's
// Trainer with each layout, alternating step by step; per layout the
// median step time, training (real) tokens/s, token positions computed, and
// the peak memory above the weights (gradients included).
// checkpointing: one group of --group_size responses of --seq tokens (a
// quarter prompt), forward, token log-probs and backward per mode; the
// activation memory (what the forward left allocated for the backward),
// the peak above the weights and gradients, and the step time.
// Memory is LibTorch's CPU allocations (common/model/cpu_memory.h).
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "common/model/cpu_memory.h"
#include "common/model/device.h"
#include "common/model/policy_model.h"
#include "learner_server/loss/token_logprobs.h"
#include "learner_server/trainer/micro_batches.h"
#include "learner_server/trainer/trainer.h"

namespace {

using asympo::CpuMemory;
using asympo::ModelConfig;
using asympo::ModelOptions;
using asympo::PolicyModel;
using asympo::bench::Flag;
using asympo::bench::FlagS;
using asympo::bench::Median;
using asympo::learner::QueuedGroup;

constexpr double kMiB = 1 << 20;

std::unique_ptr<PolicyModel> Model(const ModelConfig& c, int64_t checkpoint_every) {
  ModelOptions o;
  o.seed = 1;
  o.checkpoint_every = checkpoint_every;
  return PolicyModel::CreateRandom(c, o).value();
}

void ClearGradients(PolicyModel& m) {
  for (at::Tensor p : m.parameters()) p.mutable_grad().reset();
}

// One step's groups with long-tailed response lengths.
std::vector<QueuedGroup> LongTailedStep(std::mt19937& rng, int64_t groups, int64_t size,
                                        int64_t prompt, int64_t max_response, int64_t vocab) {
  const auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<QueuedGroup> step;
  for (int64_t g = 0; g < groups; ++g) {
    QueuedGroup q;
    for (int64_t t = 0; t < prompt; ++t)
      q.group.add_prompt_tokens(static_cast<int32_t>(uniform(0, vocab - 1)));
    for (int64_t r = 0; r < size; ++r) {
      const int64_t u = uniform(0, 99);
      const int64_t length = u < 75   ? uniform(8, 64)
                             : u < 95 ? uniform(64, 256)
                                      : uniform(256, max_response);
      auto* resp = q.group.add_responses();
      for (int64_t t = 0; t < length; ++t)
        resp->add_tokens(static_cast<int32_t>(uniform(0, vocab - 1)));
      resp->set_reward(static_cast<float>(uniform(0, 1)));
      q.tokens += prompt + length;
    }
    step.push_back(q);
  }
  return step;
}

// Token positions the layout computes for a step: rows x row length summed
// over its micro-batches.
int64_t PositionsComputed(const asympo::learner::MicroBatchLayout& layout,
                          const std::vector<QueuedGroup>& step) {
  int64_t positions = 0;
  for (const auto& micro : layout.Split(step))
    positions += layout.Build(micro).value().padded_tokens();
  return positions;
}

int Packing(int argc, char** argv, const ModelConfig& c) {
  const int64_t steps = Flag(argc, argv, "--steps", 3);
  const int64_t groups = Flag(argc, argv, "--groups", 2);
  const int64_t size = Flag(argc, argv, "--group_size", 8);
  const int64_t prompt = Flag(argc, argv, "--prompt", 32);
  const int64_t max_response = Flag(argc, argv, "--max_response", 512);
  const int64_t budget = Flag(argc, argv, "--micro_batch_tokens", 8192);
  const int64_t seed = Flag(argc, argv, "--seed", 1);
  asympo::bench::RejectUnknownFlags(argc, argv);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::vector<QueuedGroup>> data;
  for (int64_t s = 0; s <= steps; ++s) {  // the first one warms up
    data.push_back(LongTailedStep(rng, groups, size, prompt, max_response, c.vocab_size));
  }
  struct Run {
    const char* name;
    bool packed;
    std::unique_ptr<PolicyModel> model;
    std::unique_ptr<asympo::learner::Trainer> trainer;
    std::vector<double> seconds, tokens_per_s, peak_mib;
    int64_t positions = 0, tokens = 0;
  };
  std::vector<Run> runs;
  for (const bool packed : {false, true}) {
    Run r{packed ? "packed" : "padded", packed, Model(c, 0), nullptr, {}, {}, {}};
    asympo::learner::TrainerOptions o;
    o.pack_sequences = packed;
    o.micro_batch_tokens = budget;
    r.trainer = asympo::learner::Trainer::Create(o, r.model.get(), nullptr).value();
    runs.push_back(std::move(r));
  }
  CpuMemory& memory = CpuMemory::Install();
  for (int64_t s = 0; s <= steps; ++s) {
    const auto& step = data[static_cast<size_t>(s)];
    int64_t tokens = 0;
    for (const QueuedGroup& q : step) tokens += q.tokens;
    // Alternate which layout goes first.
    for (size_t k = 0; k < runs.size(); ++k) {
      Run& r = runs[(k + static_cast<size_t>(s)) % runs.size()];
      ClearGradients(*r.model);
      memory.ResetPeak();
      const int64_t base = memory.current();
      const double t = asympo::bench::SecondsOf([&] { r.trainer->ComputeGradients(step).value(); });
      if (s == 0) continue;
      r.seconds.push_back(t);
      r.tokens_per_s.push_back(static_cast<double>(tokens) / t);
      r.peak_mib.push_back(static_cast<double>(memory.peak() - base) / kMiB);
      asympo::learner::PaddedLayoutOptions lo{budget, c.vocab_size, 0, false};
      r.positions += r.packed ? PositionsComputed(asympo::learner::PackedLayout(lo), step)
                              : PositionsComputed(asympo::learner::PaddedLayout(lo), step);
      r.tokens += tokens;
    }
  }
  std::printf(
      "| layout | median step s | training tokens/s | positions computed / real tokens | peak "
      "above weights MiB |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  for (const Run& r : runs) {
    std::printf(
        "| %s | %.2f | %.0f | %.2f | %.0f |\n", r.name, Median(r.seconds), Median(r.tokens_per_s),
        static_cast<double>(r.positions) / static_cast<double>(r.tokens), Median(r.peak_mib));
  }
  std::printf(
      "packed / padded: tokens/s %.2fx, peak memory %.2fx (%lld steps of %lld groups x %lld, %lld "
      "real tokens)\n",
      Median(runs[1].tokens_per_s) / Median(runs[0].tokens_per_s),
      Median(runs[1].peak_mib) / Median(runs[0].peak_mib), static_cast<long long>(steps),
      static_cast<long long>(groups), static_cast<long long>(size),
      static_cast<long long>(runs[0].tokens));
  return 0;
}

int Checkpointing(int argc, char** argv, const ModelConfig& c) {
  const int64_t seq = Flag(argc, argv, "--seq", 2048);
  const int64_t size = Flag(argc, argv, "--group_size", 2);
  const int64_t steps = Flag(argc, argv, "--steps", 2);
  std::vector<int64_t> modes = {0};
  for (const int64_t every : asympo::bench::ListFlag(argc, argv, "--every", "1,2"))
    modes.push_back(every);
  asympo::bench::RejectUnknownFlags(argc, argv);
  const int64_t prompt = seq / 4, response = seq - prompt;
  at::manual_seed(1);
  const at::Tensor ids = at::randint(0, c.vocab_size, {size, seq}, at::kLong);
  const at::Tensor positions =
      at::arange(seq, at::kLong).unsqueeze(0).expand({size, seq}).contiguous();
  const at::Tensor keys = at::ones({size, seq}, at::kBool);
  // The response tokens' predictors and targets.
  const at::Tensor rows = (at::arange(size, at::kLong).unsqueeze(1) * seq +
                           at::arange(prompt - 1, seq - 1, at::kLong).unsqueeze(0))
                              .reshape({-1});
  const at::Tensor targets = ids.narrow(1, prompt, response).reshape({-1});
  CpuMemory& memory = CpuMemory::Install();
  std::printf(
      "| checkpointing | activation MiB | peak above weights and gradients MiB | median step s "
      "|\n");
  std::printf("| --- | --- | --- | --- |\n");
  double none_activation = 0, none_seconds = 0;
  for (const int64_t every : modes) {
    auto model = Model(c, every);
    const int64_t grad_bytes = c.NumParameters() * 4;
    std::vector<double> activation, peak, seconds;
    for (int64_t s = 0; s <= steps; ++s) {  // the first one warms up
      ClearGradients(*model);
      memory.ResetPeak();
      const int64_t base = memory.current();
      int64_t after_forward = 0;
      const double t = asympo::bench::SecondsOf([&] {
        const at::Tensor hidden = model->Forward(ids, positions, keys);
        const at::Tensor logp = asympo::learner::ChunkedTokenLogProbs(
                                    hidden.reshape({-1, c.hidden_size}).index_select(0, rows),
                                    model->lm_head_weight(), targets, 1024)
                                    .value();
        const at::Tensor loss = -logp.mean();
        after_forward = memory.current();
        loss.backward();
      });
      if (s == 0) continue;
      activation.push_back(static_cast<double>(after_forward - base) / kMiB);
      peak.push_back(static_cast<double>(memory.peak() - base - grad_bytes) / kMiB);
      seconds.push_back(t);
    }
    const std::string name = asympo::ActivationCheckpointingName(every);
    std::printf("| %s | %.0f | %.0f | %.2f |\n", name.c_str(), Median(activation), Median(peak),
                Median(seconds));
    if (every == 0) {
      none_activation = Median(activation);
      none_seconds = Median(seconds);
    } else {
      std::printf("  %s against none: %.2fx less activation memory, %.2fx the step time\n",
                  name.c_str(), none_activation / Median(activation),
                  Median(seconds) / none_seconds);
    }
  }
  std::printf("(%lld sequences of %lld tokens, %lld-layer model)\n", static_cast<long long>(size),
              static_cast<long long>(seq), static_cast<long long>(c.num_hidden_layers));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = FlagS(argc, argv, "--mode", "packing");
  const ModelConfig c = asympo::bench::BenchConfig(FlagS(argc, argv, "--config", "100m"));
  asympo::SetCpuThreads(static_cast<int>(Flag(argc, argv, "--threads", 2)));
  if (mode == "packing") return Packing(argc, argv, c);
  if (mode == "checkpointing") return Checkpointing(argc, argv, c);
  asympo::bench::FlagError("--mode is '" + mode + "'; it must be packing or checkpointing");
}
