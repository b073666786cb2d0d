// The rollout engines side by side: continuous against static batching,
// and one prefill per group against one per response.
//
//   engine_bench --mode batching --config tiny|100m|qwen3-0.6b --slots 32,128
//                [--requests N] [--mean_new 64] [--max_new 512] [--reps 3]
//     Useful tokens/s (tokens of finished responses per second) of
//     ContinuousEngine with --slots running sequences against
//     GenerationEngine on static batches of --slots requests, over the same
//     --requests requests (default 16 x slots, a stream long enough that the
//     last long responses, which run almost alone in either engine, are a
//     small part of it; a rollout daemon's stream does not end): 16-token
//     random prompts, response lengths drawn from a geometric distribution
//     with mean --mean_new, capped at --max_new (each request's
//     max_new_tokens; the random model has no stop token). Reps alternate
//     the two engines, after a warm-up of both on the first --slots
//     requests.
//
//   engine_bench --mode prefill --config tiny|100m --groups 8,16
//                [--prompts 4] [--prompt_tokens 256] [--reps 3]
//     Prefill seconds and prompt KV bytes in use for --prompts prompts of
//     G responses each (G from --groups), with one prefill per group
//     (share_prompts) and one per response, all running at once.
//
// Common: --device cpu|cuda, --dtype float32|bfloat16, --seed; --only
// static|continuous runs one engine of the batching pair (for a profiler;
// the other's time is then ~0); --warmup 0 skips the batching warm-up (for
// a large model whose first step is not the one to avoid). One JSON line
// per measurement; docs/benchmarks.md has the results.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <c10/core/InferenceMode.h>
#include <glog/logging.h>
#include <torch/cuda.h>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "common/model/device.h"
#include "common/model/model_io.h"
#include "rollout_server/engine/continuous_engine.h"
#include "rollout_server/engine/generation.h"

namespace {

using asympo::rollout::ContinuousEngine;
using asympo::rollout::ContinuousOptions;
using asympo::rollout::GenerationEngine;
using asympo::rollout::GenerationRequest;
using asympo::rollout::GenerationResult;

struct Args {
  std::string mode, config, device, dtype, only;
  std::vector<int64_t> slots, groups;
  int64_t requests = 0, mean_new = 64, max_new = 512, prompts = 4, prompt_tokens = 256;
  int64_t reps = 3, seed = 1;
  bool warmup = true;
};

// Random prompts of `tokens` tokens, each repeated `g` times with its own
// seed; new tokens per request from a geometric distribution (mean
// mean_new, at least 1, capped at max_new) when mean_new > 0, else max_new.
std::vector<GenerationRequest> Requests(int64_t n, int64_t g, int64_t tokens, int64_t vocab,
                                        int64_t mean_new, int64_t max_new, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(vocab - 1));
  std::geometric_distribution<int64_t> length(mean_new > 0 ? 1.0 / static_cast<double>(mean_new)
                                                           : 1.0);
  std::vector<GenerationRequest> out;
  for (int64_t i = 0; i < n; i += g) {
    std::vector<int32_t> prompt(static_cast<size_t>(tokens));
    for (int32_t& t : prompt) t = token(rng);
    for (int64_t j = 0; j < g && i + j < n; ++j) {
      GenerationRequest r{prompt, {}};
      r.params.temperature = 1.0;
      r.params.seed = rng();
      r.params.max_new_tokens = static_cast<int32_t>(
          mean_new > 0 ? std::clamp<int64_t>(length(rng) + 1, 1, max_new) : max_new);
      out.push_back(std::move(r));
    }
  }
  return out;
}

int64_t Tokens(const std::vector<GenerationResult>& results) {
  int64_t n = 0;
  for (const auto& r : results) n += static_cast<int64_t>(r.tokens.size());
  return n;
}

// Waits for the device's queued work (as the other benchmarks do).
void Synchronize(const asympo::PolicyModel& m) {
  if (m.options().device.is_cuda()) torch::cuda::synchronize();
}

void BenchBatching(const Args& a, const asympo::PolicyModel& m) {
  for (const int64_t slots : a.slots) {
    const int64_t n = a.requests > 0 ? a.requests : 16 * slots;
    const auto reqs = Requests(n, 1, 16, m.config().vocab_size, a.mean_new, a.max_new,
                               static_cast<uint64_t>(a.seed));
    int64_t want = 0;
    for (const auto& r : reqs) want += r.params.max_new_tokens;
    ContinuousOptions o;
    o.max_running_sequences = static_cast<int32_t>(slots);
    o.prompt_capacity = 16;
    o.response_capacity = static_cast<int32_t>(a.max_new);
    auto engine = ContinuousEngine::Create(&m, 0, o).value();
    const GenerationEngine fixed(&m);
    std::vector<double> ts_static, ts_cont;
    int64_t got_static = 0, got_cont = 0, steps = 0;
    const std::vector<GenerationRequest> warm(
        reqs.begin(), reqs.begin() + static_cast<ptrdiff_t>(std::min<int64_t>(n, slots)));
    if (a.warmup && a.only != "continuous") fixed.Generate(warm).value();
    if (a.warmup && a.only != "static") engine->Generate(warm).value();
    for (int64_t rep = 0; rep < a.reps; ++rep) {
      const double s = asympo::bench::SecondsOf(
          [&] {
            got_static = 0;
            if (a.only == "continuous") {
              got_static = want;
              return;
            }
            for (size_t i = 0; i < reqs.size(); i += static_cast<size_t>(slots)) {
              const std::vector<GenerationRequest> batch(
                  reqs.begin() + static_cast<ptrdiff_t>(i),
                  reqs.begin() + static_cast<ptrdiff_t>(std::min(reqs.size(), i + slots)));
              got_static += Tokens(fixed.Generate(batch).value());
            }
          },
          [&] { Synchronize(m); });
      const int64_t before = engine->stats().decode_steps;
      const double c = asympo::bench::SecondsOf(
          [&] { got_cont = a.only == "static" ? want : Tokens(engine->Generate(reqs).value()); },
          [&] { Synchronize(m); });
      steps = engine->stats().decode_steps - before;
      ts_static.push_back(s);
      ts_cont.push_back(c);
    }
    CHECK_EQ(got_static, want);
    CHECK_EQ(got_cont, want);
    const double s = asympo::bench::Median(ts_static), c = asympo::bench::Median(ts_cont);
    std::printf(
        "{\"mode\": \"batching\", \"config\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", "
        "\"slots\": %lld, \"requests\": %lld, \"mean_new\": %lld, \"max_new\": %lld, "
        "\"tokens\": %lld, \"static_s\": %.4f, \"continuous_s\": %.4f, "
        "\"static_tokens_per_s\": %.1f, \"continuous_tokens_per_s\": %.1f, \"speedup\": %.3f, "
        "\"continuous_steps\": %lld, \"reps\": %lld}\n",
        a.config.c_str(), a.device.c_str(), a.dtype.c_str(), static_cast<long long>(slots),
        static_cast<long long>(n), static_cast<long long>(a.mean_new),
        static_cast<long long>(a.max_new), static_cast<long long>(want), s, c, want / s, want / c,
        s / c, static_cast<long long>(steps), static_cast<long long>(a.reps));
    std::fflush(stdout);
  }
}

void BenchPrefill(const Args& a, const asympo::PolicyModel& m) {
  for (const int64_t g : a.groups) {
    const int64_t n = a.prompts * g;
    const auto reqs =
        Requests(n, g, a.prompt_tokens, m.config().vocab_size, 0, 1, static_cast<uint64_t>(a.seed));
    double seconds[2] = {0, 0};
    int64_t bytes[2] = {0, 0}, prefills[2] = {0, 0};
    for (int shared = 0; shared < 2; ++shared) {
      ContinuousOptions o;
      o.max_running_sequences = static_cast<int32_t>(n);
      o.prompt_capacity = static_cast<int32_t>(a.prompt_tokens);
      o.response_capacity = 1;
      o.share_prompts = shared == 1;
      std::vector<double> ts;
      for (int64_t rep = 0; rep <= a.reps; ++rep) {
        auto engine = ContinuousEngine::Create(&m, 0, o).value();
        engine->Generate(reqs).value();
        if (rep == 0) continue;  // warm-up
        ts.push_back(engine->stats().prefill_seconds);
        bytes[shared] = engine->stats().prompt_rows_peak * engine->stats().prompt_row_bytes;
        prefills[shared] = engine->stats().prefills;
      }
      seconds[shared] = asympo::bench::Median(ts);
    }
    std::printf(
        "{\"mode\": \"prefill\", \"config\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", "
        "\"group\": %lld, \"prompts\": %lld, \"prompt_tokens\": %lld, "
        "\"per_response_prefills\": %lld, \"per_group_prefills\": %lld, "
        "\"per_response_s\": %.4f, \"per_group_s\": %.4f, \"time_ratio\": %.2f, "
        "\"per_response_kv_bytes\": %lld, \"per_group_kv_bytes\": %lld, \"kv_ratio\": %.2f, "
        "\"reps\": %lld}\n",
        a.config.c_str(), a.device.c_str(), a.dtype.c_str(), static_cast<long long>(g),
        static_cast<long long>(a.prompts), static_cast<long long>(a.prompt_tokens),
        static_cast<long long>(prefills[0]), static_cast<long long>(prefills[1]), seconds[0],
        seconds[1], seconds[0] / seconds[1], static_cast<long long>(bytes[0]),
        static_cast<long long>(bytes[1]), static_cast<double>(bytes[0]) / bytes[1],
        static_cast<long long>(a.reps));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  namespace b = asympo::bench;
  Args a;
  a.mode = b::FlagS(argc, argv, "--mode", "batching");
  a.config = b::FlagS(argc, argv, "--config", "tiny");
  a.device = b::FlagS(argc, argv, "--device", "cpu");
  a.only = b::FlagS(argc, argv, "--only", "");
  a.dtype = b::FlagS(argc, argv, "--dtype", "float32");
  a.slots = b::ListFlag(argc, argv, "--slots", "32,128");
  a.groups = b::ListFlag(argc, argv, "--groups", "8,16");
  a.requests = b::Flag(argc, argv, "--requests", 0);
  a.mean_new = b::Flag(argc, argv, "--mean_new", 64);
  a.max_new = b::Flag(argc, argv, "--max_new", 512);
  a.prompts = b::Flag(argc, argv, "--prompts", 4);
  a.prompt_tokens = b::Flag(argc, argv, "--prompt_tokens", 256);
  a.reps = b::Flag(argc, argv, "--reps", 3);
  a.seed = b::Flag(argc, argv, "--seed", 1);
  a.warmup = b::Flag(argc, argv, "--warmup", 1) != 0;
  const int64_t threads = b::Flag(argc, argv, "--threads", 0);
  b::RejectUnknownFlags(argc, argv);
  if (a.mode != "batching" && a.mode != "prefill") b::FlagError("--mode is batching or prefill");
  if (!a.only.empty() && a.only != "static" && a.only != "continuous") {
    b::FlagError("--only is static or continuous (for profiling one engine)");
  }
  if (a.config != "tiny" && a.config != "100m" && a.config != "qwen3-0.6b") {
    b::FlagError("--config is tiny, 100m or qwen3-0.6b");
  }
  for (const int64_t v : a.slots) {
    if (v < 1) b::FlagError("--slots must be positive");
  }
  for (const int64_t v : a.groups) {
    if (v < 1) b::FlagError("--groups must be positive");
  }
  if (a.requests < 0 || a.mean_new < 0 || a.max_new < 1 || a.prompts < 1 || a.prompt_tokens < 1 ||
      a.reps < 1) {
    b::FlagError("--requests, --mean_new >= 0; --max_new, --prompts, --prompt_tokens, --reps >= 1");
  }
  if (threads > 0) asympo::SetCpuThreads(static_cast<int>(threads));
  asympo::ModelOptions mo;
  mo.device = asympo::ParseDevice(a.device).value();
  mo.dtype = asympo::ParseModelDType(a.dtype).value();
  mo.seed = static_cast<uint64_t>(a.seed);
  asympo::ModelConfig cfg = b::BenchConfig(a.config);
  cfg.max_position_embeddings = std::max<int64_t>(cfg.max_position_embeddings, 4096);
  auto model = asympo::PolicyModel::CreateRandom(cfg, mo).value();
  if (a.mode == "batching") {
    BenchBatching(a, *model);
  } else {
    BenchPrefill(a, *model);
  }
  return 0;
}
