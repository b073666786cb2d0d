// Learning with a tool: "add_tool" episodes against the built-in
// calculator, trained by the learner's Trainer, in one process (the
// synchronous loop of bench/task_learning, with multi-turn episodes).
//
//   episode_learning [--steps 150] [--prompts 16] [--group 8] [--lr 1e-4]
//                    [--objective asympo] [--min_k 2] [--max_k 3]
//                    [--sft_steps 200] [--sft_lr 1e-3] [--sft_batch 32]
//                    [--eval_every 25] [--eval_prompts 200] [--unmasked 0]
//                    [--seed 0] [--threads 1] [--csv FILE] [--save_model DIR]
//                    [--record FILE] [--replay FILE]
//
// The tiny model (random weights, vocabulary 64) first learns the format
// from --sft_steps supervised steps on calculator transcripts (the
// operands in a random order, each sum asked of the calculator; the loss
// on generated tokens only), stopped well short of solving the task. Then
// each RL step runs --prompts groups of --group episodes with the current
// weights (temperature 1) and trains one step on them. --unmasked 1 drops
// the responses' loss masks before training: the model is then also
// trained on the calculator's answers as if it had written them, which is
// what a protocol without masks does to a multi-turn response. Every
// --eval_every steps: greedy episodes on --eval_prompts held-out prompts
// (accuracy = reward 1). --csv writes one row per step (reward, accuracy of
// the samples, calls per episode, held-out accuracy where measured).
// --save_model writes the model after the supervised steps (a Hugging Face
// directory: the base model that the daemons' --model read; docs/
// benchmarks.md runs add_tool through the daemons from it).
// --record writes every step's groups (the trajectories as sampled, masks
// included); --replay trains on a recorded run's groups instead of sampling
// (with --unmasked 1: the masked run's own trajectories, their masks
// dropped), so that masked and unmasked training compare on the same
// trajectories. The file: per step, a uint64 length (little-endian), then
// an asympo.v1.RolloutBatch of the step's groups.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "bench/bench_flags.h"
#include "common/model/model_io.h"
#include "learner_server/optim/adamw.h"
#include "learner_server/trainer/trainer.h"
#include "rollout_server/episodes/episode_runner.h"
#include "rollout_server/tasks/addition_task.h"
#include "rollout_server/tasks/calculator.h"

namespace {

namespace rollout = asympo::rollout;
namespace learner = asympo::learner;
using asympo::bench::Flag;
using asympo::bench::FlagD;
using asympo::bench::FlagS;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t steps, prompts, group, min_k, max_k, sft_steps, sft_batch, eval_every, eval_prompts;
  double lr, sft_lr;
  bool unmasked;
  uint64_t seed;
  std::string objective, csv, save_model, record, replay;
};

// A calculator transcript for `prompt`: operands in a random order, "a + b
// CALL [= s]", then "+ c CALL [= s]" for each next one, then EOS; the mask
// false on the calculator's answers.
void ToolTranscript(const rollout::TaskPrompt& prompt, std::mt19937_64& rng,
                    std::vector<int32_t>* tokens, std::vector<bool>* mask) {
  std::vector<int32_t> operands = rollout::AdditionOperands(prompt).value();
  std::shuffle(operands.begin(), operands.end(), rng);
  std::optional<int32_t> previous;
  for (size_t i = 1; i < operands.size(); ++i) {
    std::vector<int32_t> turn;
    if (i == 1) {
      rollout::AppendDigits(operands[0], &turn);
    }
    turn.push_back(rollout::addition::kPlusId);
    rollout::AppendDigits(operands[i], &turn);
    turn.push_back(rollout::addition::kCallId);
    const std::vector<int32_t> answer = rollout::CalculatorAnswer(turn, &previous);
    for (int32_t t : turn) tokens->push_back(t), mask->push_back(true);
    for (int32_t t : answer) tokens->push_back(t), mask->push_back(false);
  }
  tokens->push_back(rollout::synthetic::kEosId);
  mask->push_back(true);
}

// Supervised steps on calculator transcripts: the mean NLL of their
// generated tokens given the prompt and everything before.
void Sft(asympo::PolicyModel* model, rollout::Task* task, const Args& a, std::mt19937_64& rng) {
  learner::AdamW optimizer(model->parameters(), learner::AdamWOptions{});
  for (int64_t step = 0; step < a.sft_steps; ++step) {
    std::vector<std::vector<int32_t>> seqs;
    std::vector<std::vector<bool>> trained;
    int64_t longest = 0;
    for (int64_t i = 0; i < a.sft_batch; ++i) {
      const rollout::TaskPrompt p = task->NextPrompt(rng);
      std::vector<int32_t> tokens = p.prompt_tokens;
      std::vector<bool> mask(p.prompt_tokens.size(), false);
      ToolTranscript(p, rng, &tokens, &mask);
      longest = std::max<int64_t>(longest, static_cast<int64_t>(tokens.size()));
      seqs.push_back(std::move(tokens));
      trained.push_back(std::move(mask));
    }
    at::Tensor ids = at::zeros({a.sft_batch, longest}, at::kLong);
    at::Tensor real = at::zeros({a.sft_batch, longest}, at::kBool);
    at::Tensor target = at::zeros({a.sft_batch, longest}, at::kFloat);
    for (int64_t b = 0; b < a.sft_batch; ++b) {
      for (size_t t = 0; t < seqs[b].size(); ++t) {
        ids[b][static_cast<int64_t>(t)] = seqs[b][t];
        real[b][static_cast<int64_t>(t)] = true;
        target[b][static_cast<int64_t>(t)] = trained[b][t] ? 1.0f : 0.0f;
      }
    }
    const at::Tensor positions =
        at::arange(longest, at::kLong).unsqueeze(0).expand({a.sft_batch, longest});
    const at::Tensor logits = model->Logits(model->Forward(ids, positions, real)).to(at::kFloat);
    // Token t is predicted from position t - 1.
    const at::Tensor logp = at::log_softmax(logits.narrow(1, 0, longest - 1), -1)
                                .gather(2, ids.narrow(1, 1, longest - 1).unsqueeze(2))
                                .squeeze(2);
    const at::Tensor weight = target.narrow(1, 1, longest - 1);
    const at::Tensor loss = -(logp * weight).sum() / weight.sum();
    optimizer.ZeroGrad();
    loss.backward();
    optimizer.Step(a.sft_lr);
    if ((step + 1) % 20 == 0)
      std::printf("sft step=%ld loss=%.4f\n", step + 1, loss.item<double>());
  }
}

// Runs every prompt's group of `group` episodes with `model` to the end.
std::vector<asympo::v1::PromptGroup> RunEpisodes(const asympo::PolicyModel& model,
                                                 const rollout::Task& task,
                                                 const std::vector<rollout::TaskPrompt>& prompts,
                                                 int64_t group, double temperature,
                                                 std::mt19937_64& rng) {
  rollout::LocalEpisodeMetrics metrics;
  rollout::EpisodeOptions eo;
  eo.group_size = static_cast<int32_t>(group);
  eo.sampling.temperature = temperature;
  eo.sampling.stop_token_ids = task.stop_token_ids();
  eo.sampling.max_new_tokens = task.max_new_tokens();
  eo.response_budget = task.max_new_tokens();
  rollout::EpisodeRunner runner(rollout::CreateBuiltinEnvironment(&task), eo, metrics.get());
  rollout::ContinuousOptions o;
  o.max_running_sequences = 64;
  auto engine = rollout::ContinuousEngine::Create(&model, 0, o).value();
  for (const rollout::TaskPrompt& p : prompts) runner.StartGroup(p, false, rng);
  return runner.RunToEnd(*engine).value();
}

// A step's groups to `out`, as --record writes them.
void Record(std::ofstream& out, const std::vector<asympo::v1::PromptGroup>& groups) {
  asympo::v1::RolloutBatch b;
  for (const auto& g : groups) *b.add_groups() = g;
  const std::string bytes = b.SerializeAsString();
  const uint64_t n = bytes.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof(n));
  out.write(bytes.data(), static_cast<std::streamsize>(n));
}

// The next step's groups from `in`; false at its end or on a bad record.
bool Replay(std::ifstream& in, std::vector<asympo::v1::PromptGroup>* groups) {
  uint64_t n = 0;
  if (!in.read(reinterpret_cast<char*>(&n), sizeof(n)) || n > (uint64_t{1} << 30)) return false;
  std::string bytes(n, '\0');
  asympo::v1::RolloutBatch b;
  if (!in.read(bytes.data(), static_cast<std::streamsize>(n)) || !b.ParseFromString(bytes)) {
    return false;
  }
  groups->assign(b.groups().begin(), b.groups().end());
  return true;
}

double MeanReward(const std::vector<asympo::v1::PromptGroup>& groups, double* calls) {
  double sum = 0, n = 0, inserted = 0;
  for (const auto& g : groups) {
    for (const auto& r : g.responses()) {
      sum += r.reward();
      ++n;
      for (int j = 0; j < r.loss_mask_size(); ++j) {
        // One call per inserted run.
        if (!r.loss_mask(j) && (j == 0 || r.loss_mask(j - 1))) ++inserted;
      }
    }
  }
  if (calls != nullptr) *calls = n > 0 ? inserted / n : 0;
  return n > 0 ? sum / n : 0;
}

Args Parse(int argc, char** argv) {
  Args a{Flag(argc, argv, "--steps", 150),
         Flag(argc, argv, "--prompts", 16),
         Flag(argc, argv, "--group", 8),
         Flag(argc, argv, "--min_k", 2),
         Flag(argc, argv, "--max_k", 3),
         Flag(argc, argv, "--sft_steps", 200),
         Flag(argc, argv, "--sft_batch", 32),
         Flag(argc, argv, "--eval_every", 25),
         Flag(argc, argv, "--eval_prompts", 200),
         FlagD(argc, argv, "--lr", 1e-4),
         FlagD(argc, argv, "--sft_lr", 1e-3),
         Flag(argc, argv, "--unmasked", 0) != 0,
         static_cast<uint64_t>(Flag(argc, argv, "--seed", 0)),
         FlagS(argc, argv, "--objective", "asympo"),
         FlagS(argc, argv, "--csv", ""),
         FlagS(argc, argv, "--save_model", ""),
         FlagS(argc, argv, "--record", ""),
         FlagS(argc, argv, "--replay", "")};
  at::set_num_threads(static_cast<int>(Flag(argc, argv, "--threads", 1)));
  asympo::bench::RejectUnknownFlags(argc, argv);
  return a;
}

// The RL steps after the supervised ones: sampled (and --record'ed) or
// --replay'ed groups, each trained one step; held-out evaluations.
class RlRun {
 public:
  RlRun(const Args& a, asympo::PolicyModel* model, rollout::Task* task, std::mt19937_64* rng)
      : a_(a), model_(model), task_(task), rng_(*rng) {}

  int Run() {
    learner::TrainerOptions topt;
    topt.loss.objective = learner::ParseObjective(a_.objective).value();
    topt.lr.peak_lr = a_.lr;
    trainer_ = learner::Trainer::Create(topt, model_, nullptr).value();
    const std::vector<rollout::TaskPrompt> held_out = task_->EvaluationPrompts(a_.eval_prompts);
    if (!Open()) return 1;
    const auto start = Clock::now();
    for (int64_t step = 0; step <= a_.steps; ++step) {
      double heldout = -1;
      if (step % a_.eval_every == 0 || step == a_.steps) {
        heldout = MeanReward(RunEpisodes(*model_, *task_, held_out, 1, 0.0, rng_), nullptr);
      }
      if (step == a_.steps) {
        std::printf("step=%ld heldout_greedy_acc=%.3f\n", step, heldout);
        if (csv_.is_open()) csv_ << step << ",,," << heldout << ",\n";
        break;
      }
      std::vector<asympo::v1::PromptGroup> groups;
      if (!Groups(step, &groups)) return 1;
      double calls = 0;
      const double reward = MeanReward(groups, &calls);
      auto result = trainer_->Step(Queue(std::move(groups)));
      if (!result.ok()) {
        std::fprintf(stderr, "step %ld: %s\n", step,
                     std::string(result.status().message()).c_str());
        return 1;
      }
      Report(step, reward, calls, heldout,
             std::chrono::duration<double>(Clock::now() - start).count());
    }
    return 0;
  }

 private:
  bool Open() {
    if (!a_.csv.empty()) {
      csv_.open(a_.csv);
      csv_ << "step,reward,calls_per_episode,heldout_greedy_acc,seconds\n";
    }
    if (!a_.record.empty()) record_.open(a_.record, std::ios::binary);
    if (!a_.replay.empty()) replay_.open(a_.replay, std::ios::binary);
    if ((!a_.record.empty() && !record_) || (!a_.replay.empty() && !replay_)) {
      std::fprintf(stderr, "cannot open --record or --replay\n");
      return false;
    }
    return true;
  }

  // The step's groups: replayed, or sampled with the current weights.
  bool Groups(int64_t step, std::vector<asympo::v1::PromptGroup>* groups) {
    if (replay_.is_open()) {
      if (Replay(replay_, groups)) return true;
      std::fprintf(stderr, "--replay %s: no groups for step %ld\n", a_.replay.c_str(), step);
      return false;
    }
    std::vector<rollout::TaskPrompt> prompts;
    for (int64_t p = 0; p < a_.prompts; ++p) prompts.push_back(task_->NextPrompt(rng_));
    *groups = RunEpisodes(*model_, *task_, prompts, a_.group, 1.0, rng_);
    if (record_.is_open()) Record(record_, *groups);
    return true;
  }

  std::vector<learner::QueuedGroup> Queue(std::vector<asympo::v1::PromptGroup> groups) {
    std::vector<learner::QueuedGroup> queued;
    for (auto& g : groups) {
      learner::QueuedGroup q;
      q.tokens = 0;
      for (auto& r : *g.mutable_responses()) {
        if (a_.unmasked) r.clear_loss_mask();
        q.tokens += g.prompt_tokens_size() + r.tokens_size();
      }
      q.group = std::move(g);
      q.arrival_version = trainer_->version();
      queued.push_back(std::move(q));
    }
    return queued;
  }

  void Report(int64_t step, double reward, double calls, double heldout, double seconds) {
    if (heldout >= 0 || step % 10 == 0) {
      std::printf("step=%ld reward=%.3f calls=%.2f heldout_greedy_acc=%s t=%.0fs\n", step, reward,
                  calls, heldout >= 0 ? std::to_string(heldout).c_str() : "-", seconds);
      std::fflush(stdout);
    }
    if (csv_.is_open()) {
      csv_ << step << "," << reward << "," << calls << ",";
      if (heldout >= 0) csv_ << heldout;
      csv_ << "," << seconds << "\n";
    }
  }

  const Args& a_;
  asympo::PolicyModel* model_;
  rollout::Task* task_;
  std::mt19937_64& rng_;
  std::unique_ptr<learner::Trainer> trainer_;
  std::ofstream csv_, record_;
  std::ifstream replay_;
};

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  rollout::TaskOptions to;
  to.name = "add_tool";
  to.vocab_size = 64;
  to.synthetic_min_length = static_cast<int32_t>(a.min_k);
  to.synthetic_max_length = static_cast<int32_t>(a.max_k);
  auto task = rollout::CreateTask(to).value();
  asympo::ModelOptions mo;
  mo.seed = a.seed;
  auto model = asympo::PolicyModel::CreateRandom(asympo::ModelConfig::Tiny(64), mo).value();
  std::mt19937_64 rng(a.seed);
  Sft(model.get(), task.get(), a, rng);
  if (!a.save_model.empty()) {
    const absl::Status saved = asympo::ExportPolicyModel(*model, a.save_model);
    if (!saved.ok()) {
      std::fprintf(stderr, "--save_model: %s\n", std::string(saved.message()).c_str());
      return 1;
    }
    std::printf("model written to %s\n", a.save_model.c_str());
  }
  return RlRun(a, model.get(), task.get(), &rng).Run();
}
