// Cost of each policy objective relative to the token log-prob gather that
// feeds it, on one learner micro-batch, side by side in one run.
//
//   build/bench/loss_bench [--responses 256] [--tokens 1024] [--vocab 32768]
//                          [--reps 15] [--threads 2]
//
// Prints a Markdown table of median milliseconds (forward + backward) per
// objective, and the objective's cost as a fraction of the log-prob step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/types.h>

#include "bench/bench_flags.h"
#include "common/model/device.h"
#include "learner_server/loss/policy_loss.h"
#include "learner_server/loss/token_logprobs.h"

namespace {

using asympo::bench::Flag;
using asympo::learner::LossInputs;
using asympo::learner::Objective;
using asympo::learner::ObjectiveNames;
using asympo::learner::ParseObjective;
using asympo::learner::PolicyLoss;
using asympo::learner::PolicyLossOptions;

double MedianMs(int reps, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = Flag(argc, argv, "--responses", 256);
  const int64_t t = Flag(argc, argv, "--tokens", 1024);
  const int64_t v = Flag(argc, argv, "--vocab", 32768);
  const int reps = static_cast<int>(Flag(argc, argv, "--reps", 15));
  asympo::SetCpuThreads(static_cast<int>(Flag(argc, argv, "--threads", 2)));
  asympo::bench::RejectUnknownFlags(argc, argv);
  const int64_t group_size = 8;
  torch::manual_seed(0);

  // Variable lengths in [t/4, t]; rewards in {0, 1}.
  const torch::Tensor len = torch::randint(t / 4, t + 1, {n}, torch::kLong);
  const torch::Tensor mask = torch::arange(t).unsqueeze(0) < len.unsqueeze(1);
  const torch::Tensor rewards = torch::randint(0, 2, {n}, torch::kFloat);
  const torch::Tensor group = torch::arange(n, torch::kLong).div(group_size, "floor");
  const torch::Tensor logp_data = -torch::rand({n, t}) * 4;
  const torch::Tensor behavior = logp_data + (torch::rand({n, t}) - 0.5) * 0.1;

  std::printf(
      "# loss_bench: %lld responses x %lld tokens (groups of %lld), %d threads, "
      "median of %d\n\n",
      static_cast<long long>(n), static_cast<long long>(t), static_cast<long long>(group_size),
      at::get_num_threads(), reps);

  // Reference: token log-probs from logits for a slice of the batch (the
  // full (N, T, V) tensor would not fit), scaled to the whole batch.
  const int64_t slice = std::max<int64_t>(1, std::min<int64_t>(n, (1ll << 28) / (t * v)));
  const torch::Tensor logits = torch::randn({slice, t, v}).requires_grad_(true);
  const torch::Tensor targets = torch::randint(0, v, {slice, t}, torch::kLong);
  const double gather_ms =
      MedianMs(
          reps,
          [&] {
            const torch::Tensor l =
                asympo::learner::TokenLogProbs(logits, targets, mask.narrow(0, 0, slice)).value();
            l.sum().backward();
            logits.mutable_grad().reset();
          }) *
      static_cast<double>(n) / static_cast<double>(slice);
  std::printf("| step | median ms (fwd+bwd) | share of the token log-prob step (V=%lld) |\n",
              static_cast<long long>(v));
  std::printf("| --- | ---: | ---: |\n");
  std::printf("| token log-probs, whole batch (extrapolated from %lld rows) | %.2f | 100%% |\n",
              static_cast<long long>(slice), gather_ms);

  for (std::string_view name : ObjectiveNames()) {
    PolicyLossOptions options;
    options.objective = ParseObjective(name).value();
    const PolicyLoss loss = PolicyLoss::Create(options).value();
    torch::Tensor logp = logp_data.clone().requires_grad_(true);
    LossInputs in;
    in.token_logprobs = logp;
    in.mask = mask;
    in.rewards = rewards;
    in.group_index = group;
    in.num_groups = n / group_size;
    in.behavior_logprobs = behavior;
    const double ms = MedianMs(reps, [&] {
      loss.Compute(in).value().loss.backward();
      logp.mutable_grad().reset();
    });
    std::printf("| objective `%s` (loss + diagnostics) | %.2f | %.4f%% |\n",
                std::string(name).c_str(), ms, 100.0 * ms / gather_ms);
  }
  return 0;
}
