// bench/task_learning's command line and what it builds from it: the task,
// the model (random, or a model directory), the behavior model that --lag
// samples with, and the learner's Trainer. The run loop is task_learning.cc.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "bench/task_sft.h"
#include "common/model/model_config.h"
#include "common/model/policy_model.h"
#include "learner_server/trainer/trainer.h"
#include "rollout_server/engine/generation.h"
#include "rollout_server/tasks/tasks.h"

namespace asympo::bench::task_learning {

// The command line; defaults as in the usage at the top of task_learning.cc.
struct Args {
  std::string task_name;
  int64_t steps;
  int64_t prompts;  // per optimizer step (per mini-batch with --minibatches)
  int64_t group;
  // --minibatches k: every k-th step samples k * prompts groups at once,
  // which the next k steps train in turn (VeRL's batch of B prompts trained
  // as k mini-batch steps: the j-th trains on samples j steps old).
  int64_t minibatches = 1;
  double lr;
  double temperature;
  std::string objective_name;
  int64_t max_new_tokens;  // 0: the task's own limit
  int64_t vocab;
  uint64_t seed;
  int64_t log_every;
  int threads;
  int32_t alphabet;
  int32_t min_length;
  int32_t max_length;
  double p_low, p_high, scale_floor;  // asympo_stable
  double clip_ratio_c = 0.0;          // grpo's dual clip (0: off)
  std::string advantage;              // mean or mean_std
  double weight_decay = 0.0;          // AdamW decoupled weight decay
  int64_t layers = 0;                 // 0: the tiny model's 2
  int64_t hidden = 0;                 // 0: the tiny model's 64 (4 heads of hidden / 4)
  int64_t lag;                        // sample with the weights of `lag` steps before
  std::string csv;                    // per-step rows; empty: none
  int64_t eval_every;                 // 0: only at the end
  int32_t eval_k;
  int64_t eval_prompts;    // held-out prompts evaluated; 0: the task's default set
  std::string eval_json;   // the last evaluation, per prompt; empty: none
  std::string init_model;  // a model directory to start from; empty: random
  int64_t lora_rank = 0;   // adapters (0: every weight trains)
  double lora_alpha = 0;
  std::string lora_targets;
  std::string save_model;  // where to write the model after --sft_steps
  SftOptions sft;
  int64_t sft_steps = 0;
  int64_t base_stats = 64;
};

// Reads the flags; an unknown flag, a bad number or a bad combination exits
// 2 naming it.
Args ParseArgs(int argc, char** argv);

// The task, the model and its trainer, and how to sample from the model.
// Members are destroyed in reverse order: the trainer before the model it
// holds.
struct Setup {
  std::unique_ptr<rollout::Task> task;
  std::unique_ptr<PolicyModel> model;
  // --lag > 0: the model the rollouts sample with, loaded at each sampling
  // step from `past` (the trained weights of the last lag + 1 steps, oldest
  // first).
  std::unique_ptr<PolicyModel> behavior;
  std::deque<std::vector<std::pair<std::string, at::Tensor>>> past;
  std::unique_ptr<learner::Trainer> trainer;
  rollout::SamplingParams sampling;
};

// The tiny model, with --layers and --hidden when given (intermediate size
// 3 x hidden, 4 query heads and 2 key/value heads of hidden / 4).
ModelConfig ModelConfigFor(const Args& args);

absl::StatusOr<Setup> CreateSetup(const Args& args);

}  // namespace asympo::bench::task_learning
