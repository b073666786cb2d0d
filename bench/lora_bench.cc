// What low-rank adapters (common/model/lora.h) cost and save on the CPU,
// against full training, side by side in one run (the order of the setups
// rotates from step to step):
//
//   lora_bench --mode train [--config 100m] [--ranks 8,32,128] [--steps 4] [--groups 2]
//              [--group_size 8] [--prompt 32] [--response 96] [--threads 2]
// One optimizer step on the same groups per setup (full training, then
// adapters of each rank on every projection): the median step time
// (gradients and the AdamW update), the peak of LibTorch's allocations
// above the model and the optimizer state before the step, the trained
// parameters and the AdamW moments' bytes.
//
//   lora_bench --mode versions [--config 100m] [--ranks 8,32,128] [--dtype bfloat16] [--reps 5]
// One published version per setup: its bytes in --dtype, the learner's
// share of publishing it (SnapshotStaging: staged and copied to the host,
// the buckets the store adopts), and a rollout's share of using it: the
// adapters loaded beside its base (what asympo-rollout does), or merged
// into a copy of the weights (MergedWeights, then the copy's LoadWeights).
//
//   lora_bench --mode generate [--config 100m] [--rank 32] [--batch 16] [--prompt 32]
//              [--new_tokens 64] [--rounds 3]
// Generation (GenerationEngine, sampling) with the adapters applied beside
// the frozen base in every projection, against a model holding the merged
// weights: tokens/s, the median of --rounds rounds.
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "common/model/cpu_memory.h"
#include "common/model/device.h"
#include "common/model/model_io.h"
#include "common/model/policy_model.h"
#include "learner_server/trainer/trainer.h"
#include "rollout_server/engine/generation.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace {

using asympo::CpuMemory;
using asympo::ModelConfig;
using asympo::ModelOptions;
using asympo::PolicyModel;
using asympo::bench::Flag;
using asympo::bench::FlagS;
using asympo::bench::Median;
using asympo::bench::SecondsOf;
using asympo::learner::QueuedGroup;

constexpr double kMiB = 1 << 20;

// rank 0: full training; otherwise adapters of that rank on every
// projection, alpha twice the rank.
std::unique_ptr<PolicyModel> Model(const ModelConfig& c, int64_t rank) {
  ModelOptions o;
  o.seed = 1;
  o.lora.rank = rank;
  o.lora.alpha = 2.0 * static_cast<double>(rank);
  o.lora.targets = asympo::kAllLoraTargets;
  return PolicyModel::CreateRandom(c, o).value();
}

std::string Name(int64_t rank) { return rank == 0 ? "full" : "LoRA r" + std::to_string(rank); }

int64_t Numel(const PolicyModel& m) {
  int64_t n = 0;
  for (const at::Tensor& p : m.parameters()) n += p.numel();
  return n;
}

// A trained adapter: B away from zero (a fresh one is zero).
void MoveAdapters(PolicyModel& m) {
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : m.named_parameters()) {
    if (name.find("lora_B") != std::string::npos) t.normal_(0.0, 0.02);
  }
}

std::vector<QueuedGroup> Groups(std::mt19937& rng, int64_t groups, int64_t size, int64_t prompt,
                                int64_t response, int64_t vocab) {
  std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(vocab - 1));
  std::vector<QueuedGroup> out;
  for (int64_t g = 0; g < groups; ++g) {
    QueuedGroup q;
    for (int64_t t = 0; t < prompt; ++t) q.group.add_prompt_tokens(token(rng));
    for (int64_t r = 0; r < size; ++r) {
      auto* resp = q.group.add_responses();
      for (int64_t t = 0; t < response; ++t) resp->add_tokens(token(rng));
      resp->set_reward(static_cast<float>(r % 2));
      q.tokens += prompt + response;
    }
    out.push_back(std::move(q));
  }
  return out;
}

struct TrainRun {
  int64_t rank = 0;
  std::unique_ptr<PolicyModel> model;
  std::unique_ptr<asympo::learner::Trainer> trainer;
  std::vector<double> seconds, peak_mib;
};

void PrintTrain(const std::vector<TrainRun>& runs, int64_t tokens) {
  std::printf(
      "| setup | trained parameters | weights MiB | AdamW moments MiB | median step s | tokens/s | "
      "peak of a step above them MiB | peak in all MiB |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::vector<double> total;
  for (const TrainRun& r : runs) {
    const double step = Median(r.seconds);
    double weights = 0;
    for (const auto& [name, t] : r.model->named_weights()) weights += t.nbytes();
    if (r.rank > 0) weights += 4.0 * static_cast<double>(Numel(*r.model));
    const double moments = static_cast<double>(r.trainer->optimizer_state_bytes());
    total.push_back((weights + moments) / kMiB + Median(r.peak_mib));
    std::printf("| %s | %.2fM | %.0f | %.1f | %.2f | %.0f | %.0f | %.0f |\n", Name(r.rank).c_str(),
                static_cast<double>(Numel(*r.model)) / 1e6, weights / kMiB, moments / kMiB, step,
                static_cast<double>(tokens) / step, Median(r.peak_mib), total.back());
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    std::printf("%s / full: step time %.2fx, peak in all %.2fx\n", Name(runs[i].rank).c_str(),
                Median(runs[i].seconds) / Median(runs[0].seconds), total[i] / total[0]);
  }
}

int Train(int argc, char** argv, const ModelConfig& c, const std::vector<int64_t>& ranks) {
  const int64_t steps = Flag(argc, argv, "--steps", 4);
  const int64_t groups = Flag(argc, argv, "--groups", 2);
  const int64_t size = Flag(argc, argv, "--group_size", 8);
  const int64_t prompt = Flag(argc, argv, "--prompt", 32);
  const int64_t response = Flag(argc, argv, "--response", 96);
  asympo::bench::RejectUnknownFlags(argc, argv);
  std::mt19937 rng(1);
  std::vector<TrainRun> runs;
  for (const int64_t rank : ranks) {
    TrainRun r;
    r.rank = rank;
    r.model = Model(c, rank);
    asympo::learner::TrainerOptions o;
    o.lr.peak_lr = 1e-4;
    r.trainer = asympo::learner::Trainer::Create(o, r.model.get(), nullptr).value();
    runs.push_back(std::move(r));
  }
  CpuMemory& memory = CpuMemory::Install();
  int64_t tokens = 0;
  for (int64_t s = 0; s <= steps; ++s) {  // step 0 warms up (and allocates the moments)
    const std::vector<QueuedGroup> step = Groups(rng, groups, size, prompt, response, c.vocab_size);
    tokens = 0;
    for (const QueuedGroup& q : step) tokens += q.tokens;
    for (size_t k = 0; k < runs.size(); ++k) {
      TrainRun& r = runs[(k + static_cast<size_t>(s)) % runs.size()];
      memory.ResetPeak();
      const int64_t base = memory.current();
      const double t = SecondsOf([&] {
        if (!r.trainer->Step(step).ok()) asympo::bench::FlagError("a training step failed");
      });
      if (s == 0) continue;
      r.seconds.push_back(t);
      r.peak_mib.push_back(static_cast<double>(memory.peak() - base) / kMiB);
    }
  }
  std::printf("%s, %lld steps of %lld groups x %lld responses (%lld + %lld tokens each)\n",
              FlagS(argc, argv, "--config", "100m").c_str(), static_cast<long long>(steps),
              static_cast<long long>(groups), static_cast<long long>(size),
              static_cast<long long>(prompt), static_cast<long long>(response));
  PrintTrain(runs, tokens);
  return 0;
}

// The host views of a staged copy as (name, tensor) pairs.
std::vector<std::pair<std::string, at::Tensor>> Received(
    const std::vector<asympo::broadcast::TensorView>& views, const PolicyModel& model,
    at::ScalarType dtype) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const auto& named = model.named_parameters();
  for (size_t i = 0; i < views.size(); ++i) {
    const at::Tensor& p = named[i].second;
    out.emplace_back(named[i].first, at::from_blob(const_cast<void*>(views[i].data), p.sizes(),
                                                   at::TensorOptions().dtype(dtype)));
  }
  return out;
}

int Versions(int argc, char** argv, const ModelConfig& c, const std::vector<int64_t>& ranks) {
  const int64_t reps = Flag(argc, argv, "--reps", 5);
  const at::ScalarType dtype =
      asympo::ParseModelDType(FlagS(argc, argv, "--dtype", "bfloat16")).value();
  asympo::bench::RejectUnknownFlags(argc, argv);
  std::printf(
      "| setup | bytes a version | staged and copied to the host (learner) s | loaded beside the "
      "base (rollout) s | merged into a copy of the weights (rollout) s |\n"
      "| --- | --- | --- | --- | --- |\n");
  for (const int64_t rank : ranks) {
    std::unique_ptr<PolicyModel> model = Model(c, rank);
    MoveAdapters(*model);
    auto staging = asympo::broadcast::SnapshotStaging::Create(*model, dtype).value();
    std::vector<asympo::broadcast::TensorView> views;
    const double stage = asympo::bench::WarmMedianSeconds(
        [&] {
          if (!staging->Stage(*model).ok()) asympo::bench::FlagError("staging failed");
          views = staging->CopyToHost().value();
        },
        reps);
    const auto source = Received(views, *model, dtype);
    std::unique_ptr<PolicyModel> receiver = Model(c, rank);
    const double beside = asympo::bench::WarmMedianSeconds(
        [&] {
          if (!receiver->LoadParameters(source).ok()) asympo::bench::FlagError("load failed");
        },
        reps);
    double merged = 0;
    if (rank > 0) {
      std::unique_ptr<PolicyModel> copy = Model(c, 0);
      merged = asympo::bench::WarmMedianSeconds(
          [&] {
            if (!receiver->LoadParameters(source).ok() ||
                !copy->LoadWeights(receiver->MergedWeights()).ok()) {
              asympo::bench::FlagError("merge failed");
            }
          },
          reps);
    }
    std::printf("| %s | %.2f MiB | %.4f | %.4f | %s |\n", Name(rank).c_str(),
                static_cast<double>(staging->bytes()) / kMiB, stage, beside,
                rank > 0 ? std::to_string(merged).c_str() : "-");
  }
  return 0;
}

int Generate(int argc, char** argv, const ModelConfig& c) {
  const int64_t rank = Flag(argc, argv, "--rank", 32);
  const int64_t batch = Flag(argc, argv, "--batch", 16);
  const int64_t prompt = Flag(argc, argv, "--prompt", 32);
  const int64_t new_tokens = Flag(argc, argv, "--new_tokens", 64);
  const int64_t rounds = Flag(argc, argv, "--rounds", 3);
  asympo::bench::RejectUnknownFlags(argc, argv);
  std::unique_ptr<PolicyModel> beside = Model(c, rank);
  MoveAdapters(*beside);
  std::unique_ptr<PolicyModel> merged = Model(c, 0);
  if (!merged->LoadWeights(beside->MergedWeights()).ok()) asympo::bench::FlagError("merge failed");
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(c.vocab_size - 1));
  std::vector<asympo::rollout::GenerationRequest> requests(static_cast<size_t>(batch));
  for (auto& r : requests) {
    for (int64_t t = 0; t < prompt; ++t) r.prompt.push_back(token(rng));
    r.params.max_new_tokens = static_cast<int32_t>(new_tokens);
    r.params.seed = 7;
  }
  const asympo::rollout::GenerationEngine engines[2] = {
      asympo::rollout::GenerationEngine(beside.get()),
      asympo::rollout::GenerationEngine(merged.get())};
  std::vector<double> rate[2];
  for (int64_t round = 0; round <= rounds; ++round) {  // round 0 warms up
    for (int k = 0; k < 2; ++k) {
      const int e = (k + static_cast<int>(round)) % 2;
      int64_t generated = 0;
      const double t = SecondsOf([&] {
        const auto results = engines[e].Generate(requests).value();
        for (const auto& r : results) generated += static_cast<int64_t>(r.tokens.size());
      });
      if (round > 0) rate[e].push_back(static_cast<double>(generated) / t);
    }
  }
  std::printf("%s, rank %lld: %lld sequences of %lld + %lld tokens\n",
              FlagS(argc, argv, "--config", "100m").c_str(), static_cast<long long>(rank),
              static_cast<long long>(batch), static_cast<long long>(prompt),
              static_cast<long long>(new_tokens));
  std::printf(
      "| sampling with | tokens/s |\n| --- | --- |\n| adapters beside the base | %.0f |\n"
      "| merged weights | %.0f |\nbeside / merged: %.2fx\n",
      Median(rate[0]), Median(rate[1]), Median(rate[0]) / Median(rate[1]));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = FlagS(argc, argv, "--mode", "train");
  const std::string config = FlagS(argc, argv, "--config", "100m");
  at::set_num_threads(static_cast<int>(Flag(argc, argv, "--threads", 2)));
  at::set_num_interop_threads(1);
  const ModelConfig c = asympo::bench::BenchConfig(config);
  std::vector<int64_t> ranks = {0};
  if (mode != "generate") {
    for (const int64_t r : asympo::bench::ListFlag(argc, argv, "--ranks", "8,32,128")) {
      ranks.push_back(r);
    }
  }
  if (mode == "train") return Train(argc, argv, c, ranks);
  if (mode == "versions") return Versions(argc, argv, c, ranks);
  if (mode == "generate") return Generate(argc, argv, c);
  asympo::bench::FlagError("--mode is train, versions or generate");
}
