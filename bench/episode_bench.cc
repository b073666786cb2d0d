// Multi-turn episodes on the continuous engine.
//
//   episode_bench --mode resume --config tiny|100m [--sequences 8] [--turns 6]
//                 [--turn_tokens 32] [--append 16] [--prompt_tokens 64] [--reps 3]
//     Turn latency with and without KV reuse: --sequences episodes run at
//     once; each turn decodes --turn_tokens tokens, then the sequence is
//     resumed with --append inserted tokens (ContinuousEngine::Resume). With
//     reuse_kv only the appended tokens are pre-filled; without, the whole
//     response so far is. Reports, per setting, the median time of one
//     resume's pre-fill, the time from a turn's end to its sequence decoding
//     again (the pre-fills of the turns that end at one step, as a daemon
//     runs them), and the episodes' wall time; reps alternate the two.
//
//   episode_bench --mode episodes [--environment host:port] [--groups 32]
//                 [--group 8] [--reps 3]
//     Episodes per second of "add_tool" on the tiny model (random weights,
//     the same seeds: the same episodes) through the episode runner, with
//     the built-in calculator and, when --environment is given, with that
//     asympo.v1.Environment service (the Python example,
//     proto/python/examples/calculator_environment.py), side by side.
//
// Common: --threads (LibTorch's intra-op threads), --seed. One JSON line
// per measurement; docs/benchmarks.md has the results.
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <prometheus/registry.h>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "common/model/policy_model.h"
#include "rollout_server/engine/continuous_engine.h"
#include "rollout_server/episodes/episode_runner.h"

namespace {

namespace rollout = asympo::rollout;
using asympo::bench::Flag;
using asympo::bench::FlagS;
using asympo::bench::Median;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct ResumeArgs {
  int64_t sequences, turns, turn_tokens, append, prompt_tokens;
};

struct ResumeRun {
  std::vector<double> prefill_ms;  // one per resume
  std::vector<double> gap_ms;      // per step at which turns ended: the resumes' total
  double wall_s = 0;
};

// One run of `a.sequences` episodes of `a.turns` turns.
ResumeRun RunResumes(const asympo::PolicyModel& model, const ResumeArgs& a, bool reuse,
                     uint64_t seed) {
  rollout::ContinuousOptions o;
  o.max_running_sequences = static_cast<int32_t>(a.sequences);
  o.reuse_kv = reuse;
  auto engine = rollout::ContinuousEngine::Create(&model, 0, o).value();
  std::mt19937_64 rng(seed);
  const int32_t vocab = static_cast<int32_t>(model.config().vocab_size);
  std::vector<int> turns_done(static_cast<size_t>(a.sequences), 0);
  for (int64_t s = 0; s < a.sequences; ++s) {
    rollout::GenerationRequest r;
    for (int64_t t = 0; t < a.prompt_tokens; ++t)
      r.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    r.params.max_new_tokens = static_cast<int32_t>(a.turn_tokens);
    r.params.seed = rng();
    r.multi_turn = true;
    r.response_budget = static_cast<int32_t>(a.turns * (a.turn_tokens + a.append));
    engine->Add(std::move(r)).value();
  }
  ResumeRun run;
  const auto start = Clock::now();
  while (!engine->idle()) {
    std::vector<rollout::ContinuousEngine::Finished> finished = engine->Step().value();
    double gap = 0;
    for (const auto& f : finished) {
      int& done = turns_done[static_cast<size_t>(f.id)];
      if (++done == a.turns) {
        engine->End(f.id).IgnoreError();
        continue;
      }
      std::vector<int32_t> append;
      for (int64_t t = 0; t < a.append; ++t) append.push_back(static_cast<int32_t>(rng() % vocab));
      const double before = engine->stats().resume_seconds;
      engine->Resume(f.id, append, static_cast<int32_t>(a.turn_tokens)).IgnoreError();
      const double ms = 1000 * (engine->stats().resume_seconds - before);
      run.prefill_ms.push_back(ms);
      gap += ms;
    }
    if (gap > 0) run.gap_ms.push_back(gap);
  }
  run.wall_s = Since(start);
  return run;
}

void ResumeMode(int argc, char** argv) {
  const std::string config = FlagS(argc, argv, "--config", "tiny");
  ResumeArgs a{Flag(argc, argv, "--sequences", 8), Flag(argc, argv, "--turns", 6),
               Flag(argc, argv, "--turn_tokens", 32), Flag(argc, argv, "--append", 16),
               Flag(argc, argv, "--prompt_tokens", 64)};
  const int64_t reps = Flag(argc, argv, "--reps", 3);
  const uint64_t seed = static_cast<uint64_t>(Flag(argc, argv, "--seed", 1));
  asympo::bench::RejectUnknownFlags(argc, argv);
  asympo::ModelConfig c = asympo::bench::BenchConfig(config);
  auto model = asympo::PolicyModel::CreateRandom(c, asympo::ModelOptions()).value();
  RunResumes(*model, {2, 2, 4, 2, 8}, true, seed);  // warm-up
  std::vector<double> prefill[2], gap[2], wall[2];
  for (int64_t rep = 0; rep < reps; ++rep) {
    for (int reuse = 1; reuse >= 0; --reuse) {
      const ResumeRun r = RunResumes(*model, a, reuse == 1, seed + static_cast<uint64_t>(rep));
      prefill[reuse].push_back(Median(r.prefill_ms));
      gap[reuse].push_back(Median(r.gap_ms));
      wall[reuse].push_back(r.wall_s);
    }
  }
  for (int reuse = 1; reuse >= 0; --reuse) {
    std::printf(
        "{\"mode\":\"resume\",\"config\":\"%s\",\"reuse_kv\":%s,\"sequences\":%ld,\"turns\":%ld,"
        "\"turn_tokens\":%ld,\"append\":%ld,\"prompt_tokens\":%ld,\"reps\":%ld,"
        "\"resume_prefill_ms_median\":%.3f,\"turn_end_gap_ms_median\":%.3f,"
        "\"episodes_wall_s_median\":%.3f,\"prefill_ratio_vs_reuse\":%.2f,"
        "\"wall_ratio_vs_reuse\":%.3f}\n",
        config.c_str(), reuse ? "true" : "false", a.sequences, a.turns, a.turn_tokens, a.append,
        a.prompt_tokens, reps, Median(prefill[reuse]), Median(gap[reuse]), Median(wall[reuse]),
        Median(prefill[reuse]) / Median(prefill[1]), Median(wall[reuse]) / Median(wall[1]));
  }
}

// Episodes per second through an EpisodeRunner with `env`.
double EpisodesPerSecond(const asympo::PolicyModel& model,
                         std::unique_ptr<rollout::Environment> env, int64_t groups, int64_t group,
                         uint64_t seed, int64_t* done) {
  rollout::LocalEpisodeMetrics metrics;
  rollout::TaskOptions to;
  to.name = "add_tool";
  to.vocab_size = model.config().vocab_size;
  auto task = rollout::CreateTask(to).value();
  rollout::EpisodeOptions eo;
  eo.group_size = static_cast<int32_t>(group);
  eo.sampling.stop_token_ids = task->stop_token_ids();
  eo.sampling.max_new_tokens = task->max_new_tokens();
  eo.response_budget = task->max_new_tokens();
  if (env == nullptr) env = rollout::CreateBuiltinEnvironment(task.get());
  rollout::EpisodeRunner runner(std::move(env), eo, metrics.get());
  rollout::ContinuousOptions o;
  o.max_running_sequences = static_cast<int32_t>(4 * group);
  auto engine = rollout::ContinuousEngine::Create(&model, 0, o).value();
  std::mt19937_64 rng(seed);
  int64_t started = 0;
  const auto start = Clock::now();
  *done = 0;
  while (*done < groups) {
    while (started < groups && engine->running() + engine->waiting() + runner.pending_resets() <
                                   o.max_running_sequences + group) {
      runner.StartGroup(task->NextPrompt(rng), false, rng);
      ++started;
    }
    const bool decoding = engine->can_decode();
    *done += static_cast<int64_t>(
        runner.Poll(*engine, decoding ? absl::ZeroDuration() : absl::Milliseconds(50)).size());
    if (runner.open_groups() == 0 && started >= groups) break;
    if (!decoding) continue;
    auto finished = engine->Step().value();
    runner.OnTurns(*engine, finished);
  }
  return static_cast<double>(*done * group) / Since(start);
}

void EpisodesMode(int argc, char** argv) {
  const std::string address = FlagS(argc, argv, "--environment", "");
  const int64_t groups = Flag(argc, argv, "--groups", 32), group = Flag(argc, argv, "--group", 8);
  const int64_t reps = Flag(argc, argv, "--reps", 3);
  const uint64_t seed = static_cast<uint64_t>(Flag(argc, argv, "--seed", 1));
  asympo::bench::RejectUnknownFlags(argc, argv);
  auto model =
      asympo::PolicyModel::CreateRandom(asympo::ModelConfig::Tiny(64), asympo::ModelOptions())
          .value();
  prometheus::Registry tls;
  std::vector<double> rate[2];
  int64_t done[2] = {0, 0};
  for (int64_t rep = 0; rep < reps; ++rep) {
    rate[0].push_back(EpisodesPerSecond(*model, nullptr, groups, group, seed, &done[0]));
    if (address.empty()) continue;
    rollout::RemoteEnvironmentOptions ro;
    ro.address = address;
    ro.source = "episode_bench";
    rate[1].push_back(EpisodesPerSecond(*model, rollout::CreateRemoteEnvironment(ro, tls).value(),
                                        groups, group, seed, &done[1]));
  }
  for (int remote = 0; remote < (address.empty() ? 1 : 2); ++remote) {
    std::printf(
        "{\"mode\":\"episodes\",\"environment\":\"%s\",\"groups\":%ld,\"group\":%ld,"
        "\"groups_done\":%ld,\"reps\":%ld,\"episodes_per_s_median\":%.1f,"
        "\"ratio_vs_builtin\":%.3f}\n",
        remote ? address.c_str() : "built-in", groups, group, done[remote], reps,
        Median(rate[remote]), Median(rate[remote]) / Median(rate[0]));
  }
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(static_cast<int>(Flag(argc, argv, "--threads", 2)));
  const std::string mode = FlagS(argc, argv, "--mode", "resume");
  if (mode == "resume") {
    ResumeMode(argc, argv);
  } else if (mode == "episodes") {
    EpisodesMode(argc, argv);
  } else {
    asympo::bench::FlagError("--mode=" + mode + ": expected resume or episodes");
  }
  return 0;
}
