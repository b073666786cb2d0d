// Training-step and generation throughput of the policy model on CPU, and
// the machine's matmul FLOP/s. bench/model_bench.py is the equivalent
// PyTorch program; bench/run_model_bench.sh runs both side by side.
//
//   model_bench --config tiny|100m|qwen3-0.6b|qwen3-1.7b --mode train|generate|matmul
//               [--batch 8] [--seq 256] [--response 192] [--new_tokens 64]
//               [--reps 5] [--threads 2] [--profile trace.json]
//               [--device cpu|cuda] [--dtype float32|bfloat16] [--compute_dtype auto|...]
//               [--temperature 0] [--peak_tflops 989]
// Train: float32 master weights and AdamW moments, --compute_dtype compute
// (the learner's mixed precision). Generate: weights in --dtype, sampled
// with --temperature (0: greedy). With --peak_tflops, train prints the model
// FLOP utilisation against that peak.
// Prints one JSON object per run: {"mode", "config", "median_s", "tokens_per_s", ...}.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "common/model/device.h"
#include "common/model/model_io.h"
#include "common/model/policy_model.h"
#include "common/status_macros.h"
#include "learner_server/loss/token_logprobs.h"
#include "learner_server/optim/adamw.h"
#include "rollout_server/engine/generation.h"

namespace {

using asympo::bench::Flag;
using asympo::bench::FlagS;
using asympo::bench::Median;

bool g_cuda = false;  // the benchmark runs on a GPU: wait for it before reading the clock

double Time(const std::function<void()>& fn) {
  return asympo::bench::SecondsOf(fn, [] {
    if (g_cuda) torch::cuda::synchronize();
  });
}

// The command line; defaults as in the usage at the top of this file.
struct Args {
  std::string config_name;
  std::string mode;
  int64_t batch;
  int64_t seq;
  int64_t response;
  int64_t new_tokens;
  int reps;
  int threads;
  int64_t n;            // matmul: the matrices' side
  std::string profile;  // train, generate: where to write a Chrome trace
  std::string device;
  std::string dtype;
  std::string compute_dtype;
  double temperature;
  double peak_tflops;
};

Args ParseArgs(int argc, char** argv) {
  Args args;
  args.config_name = FlagS(argc, argv, "--config", "tiny");
  args.mode = FlagS(argc, argv, "--mode", "train");
  args.batch = Flag(argc, argv, "--batch", 8);
  args.seq = Flag(argc, argv, "--seq", 256);
  args.response = Flag(argc, argv, "--response", 192);
  args.new_tokens = Flag(argc, argv, "--new_tokens", 64);
  args.reps = static_cast<int>(Flag(argc, argv, "--reps", 5));
  args.threads = static_cast<int>(Flag(argc, argv, "--threads", 2));
  args.n = Flag(argc, argv, "--n", 2048);
  args.profile = FlagS(argc, argv, "--profile", "");
  args.device = FlagS(argc, argv, "--device", "cpu");
  args.dtype = FlagS(argc, argv, "--dtype", "float32");
  args.compute_dtype = FlagS(argc, argv, "--compute_dtype", "auto");
  args.temperature = asympo::bench::FlagD(argc, argv, "--temperature", 0);
  args.peak_tflops = asympo::bench::FlagD(argc, argv, "--peak_tflops", 0);
  asympo::bench::RejectUnknownFlags(argc, argv);
  return args;
}

// Median seconds of `reps` runs of `fn`, after one untimed warm-up run and,
// with a `trace` path, one profiled run written there as a Chrome trace.
double MedianSeconds(const std::function<void()>& fn, int reps, const std::string& trace) {
  fn();
  if (!trace.empty()) {
    torch::autograd::profiler::RecordProfile guard(trace);
    fn();
  }
  std::vector<double> ts;
  for (int i = 0; i < reps; ++i) ts.push_back(Time(fn));
  return Median(ts);
}

// The machine's FLOP/s on one square matmul, for scale.
void BenchMatmul(const Args& args) {
  const int64_t n = args.n;
  const torch::Tensor a = torch::randn({n, n}), b = torch::randn({n, n});
  const double s = MedianSeconds([&] { at::matmul(a, b); }, args.reps, /*trace=*/"");
  std::printf("{\"mode\": \"matmul\", \"n\": %lld, \"median_s\": %.6f, \"flops\": %.4e}\n",
              static_cast<long long>(n), s, 2.0 * n * n * n / s);
}

// A policy-gradient training step shaped like the learner's: forward,
// chunked log-probs of the response tokens, backward and AdamW, on random
// tokens and advantages.
void BenchTrain(const Args& args, const asympo::ModelConfig& cfg, asympo::PolicyModel* model) {
  const int64_t batch = args.batch, seq = args.seq, response = args.response;
  const int64_t prompt = seq - response;
  const auto dev = model->options().device;
  const torch::Tensor ids = torch::randint(0, cfg.vocab_size, {batch, seq}, torch::kLong).to(dev);
  const torch::Tensor pos =
      torch::arange(seq, torch::kLong).unsqueeze(0).expand({batch, seq}).contiguous().to(dev);
  const torch::Tensor key_mask = torch::ones({batch, seq}, torch::kBool).to(dev);
  const torch::Tensor targets = ids.narrow(1, prompt, response).reshape({-1});
  const torch::Tensor adv =
      torch::randn({batch, 1}).expand({batch, response}).reshape({-1}).to(dev);
  asympo::learner::AdamW opt(model->parameters(), {});
  auto step = [&] {
    opt.ZeroGrad();
    const torch::Tensor hidden = model->Forward(ids, pos, key_mask);
    // Hidden states that predict the response tokens: (B * R, H).
    const torch::Tensor h = hidden.narrow(1, prompt - 1, response).reshape({-1, cfg.hidden_size});
    const torch::Tensor logp =
        asympo::learner::ChunkedTokenLogProbs(h, model->lm_head_weight(), targets, 1024).value();
    (-(logp * adv).mean()).backward();
    opt.Step(1e-5);
  };
  const double s = MedianSeconds(step, args.reps, args.profile);
  const double flops = asympo::bench::TrainStepFlops(cfg, batch, seq, response) / s;
  std::printf(
      "{\"mode\": \"train\", \"config\": \"%s\", \"device\": \"%s\", \"compute_dtype\": "
      "\"%s\", \"params\": %lld, \"median_s\": %.6f, \"tokens_per_s\": %.1f, \"flops\": %.4e, "
      "\"mfu\": %.4f}\n",
      args.config_name.c_str(), args.device.c_str(),
      asympo::DTypeName(model->compute_dtype()).c_str(),
      static_cast<long long>(cfg.NumParameters()), s, batch * seq / s, flops,
      args.peak_tflops > 0 ? flops / (args.peak_tflops * 1e12) : 0.0);
}

// Greedy generation of --new_tokens tokens after 16-token random prompts,
// the whole batch in one call.
void BenchGenerate(const Args& args, const asympo::ModelConfig& cfg,
                   const asympo::PolicyModel* model) {
  asympo::rollout::GenerationEngine engine(model);
  std::vector<asympo::rollout::GenerationRequest> reqs(args.batch);
  for (int64_t i = 0; i < args.batch; ++i) {
    const torch::Tensor p = torch::randint(0, cfg.vocab_size, {16}, torch::kLong);
    reqs[i].prompt.assign(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + 16);
    reqs[i].params.temperature = args.temperature;
    reqs[i].params.seed = static_cast<uint64_t>(i);
    reqs[i].params.max_new_tokens = static_cast<int32_t>(args.new_tokens);
  }
  const double s = MedianSeconds([&] { engine.Generate(reqs).value(); }, args.reps, args.profile);
  std::printf(
      "{\"mode\": \"generate\", \"config\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", "
      "\"batch\": %lld, \"new_tokens\": %lld, \"median_s\": %.6f, \"tokens_per_s\": %.1f}\n",
      args.config_name.c_str(), args.device.c_str(), args.dtype.c_str(),
      static_cast<long long>(args.batch), static_cast<long long>(args.new_tokens), s,
      args.batch * args.new_tokens / s);
}

// Train: float32 masters with --compute_dtype compute; generate: --dtype.
absl::StatusOr<asympo::ModelOptions> Options(const Args& args) {
  asympo::ModelOptions mo;
  mo.seed = 1;
  ASYMPO_ASSIGN_OR_RETURN(mo.device, asympo::ParseDevice(args.device));
  if (args.mode == "train") {
    ASYMPO_ASSIGN_OR_RETURN(mo.compute_dtype,
                            asympo::ParseComputeDType(args.compute_dtype, mo.device));
  } else {
    ASYMPO_ASSIGN_OR_RETURN(mo.dtype, asympo::ParseModelDType(args.dtype));
  }
  return mo;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  asympo::SetCpuThreads(args.threads);
  torch::manual_seed(0);

  if (args.mode == "matmul") {
    BenchMatmul(args);
    return 0;
  }
  const asympo::ModelConfig cfg = asympo::bench::BenchConfig(args.config_name);
  absl::StatusOr<asympo::ModelOptions> mo = Options(args);
  if (!mo.ok()) {
    std::fprintf(stderr, "model_bench: %s\n", std::string(mo.status().message()).c_str());
    return 2;
  }
  g_cuda = mo->device.is_cuda();
  auto model = asympo::PolicyModel::CreateRandom(cfg, *mo).value();
  if (args.mode == "train") {
    BenchTrain(args, cfg, model.get());
  } else if (args.mode == "generate") {
    BenchGenerate(args, cfg, model.get());
  } else {
    std::fprintf(stderr, "unknown --mode %s (train, generate or matmul)\n", args.mode.c_str());
    return 2;
  }
  return 0;
}
