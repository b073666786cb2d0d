// bench/task_learning's flags and what they build (task_learning_setup.h).
#include "bench/task_learning_setup.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bench/bench_flags.h"
#include "common/model/lora_flags.h"
#include "common/model/model_io.h"
#include "learner_server/loss/policy_loss.h"

namespace asympo::bench::task_learning {

namespace {

// The combinations that no run could use, named before anything starts.
void CheckArgs(const Args& args) {
  if (args.steps < 0 || args.prompts < 1 || args.group < 1) {
    FlagError("task_learning: --steps must be >= 0, --prompts and --group >= 1");
  }
  if (args.minibatches < 1) {
    FlagError(absl::StrCat("task_learning: --minibatches ", args.minibatches, " must be >= 1"));
  }
  if (args.steps % args.minibatches != 0) {
    FlagError(absl::StrCat("task_learning: --steps ", args.steps,
                           " is not a whole number of batches of --minibatches ", args.minibatches,
                           " steps"));
  }
}

}  // namespace

Args ParseArgs(int argc, char** argv) {
  Args args;
  args.task_name = FlagS(argc, argv, "--task", "copy");
  args.steps = Flag(argc, argv, "--steps", 300);
  args.prompts = Flag(argc, argv, "--prompts", 8);
  args.group = Flag(argc, argv, "--group", 8);
  args.lr = FlagD(argc, argv, "--lr", 3e-3);
  args.temperature = FlagD(argc, argv, "--temperature", 1.0);
  args.objective_name = FlagS(argc, argv, "--objective", "asympo");
  args.max_new_tokens = Flag(argc, argv, "--max_new_tokens", 0);
  args.vocab = Flag(argc, argv, "--vocab", 64);
  args.seed = static_cast<uint64_t>(Flag(argc, argv, "--seed", 0));
  args.log_every = std::max<int64_t>(1, Flag(argc, argv, "--log_every", 10));
  args.threads = static_cast<int>(Flag(argc, argv, "--threads", 1));
  args.alphabet = static_cast<int32_t>(Flag(argc, argv, "--alphabet", 0));
  args.min_length = static_cast<int32_t>(Flag(argc, argv, "--min_length", 0));
  args.max_length = static_cast<int32_t>(Flag(argc, argv, "--max_length", 0));
  args.p_low = FlagD(argc, argv, "--p_low", learner::PolicyLossOptions().p_low);
  args.p_high = FlagD(argc, argv, "--p_high", learner::PolicyLossOptions().p_high);
  args.scale_floor = FlagD(argc, argv, "--scale_floor", learner::PolicyLossOptions().scale_floor);
  args.advantage = FlagS(argc, argv, "--advantage", "mean");
  args.clip_ratio_c = FlagD(argc, argv, "--clip_ratio_c", 0.0);
  args.weight_decay = FlagD(argc, argv, "--weight_decay", 0.0);
  args.layers = Flag(argc, argv, "--layers", 0);
  args.hidden = Flag(argc, argv, "--hidden", 0);
  args.lag = std::max<int64_t>(0, Flag(argc, argv, "--lag", 0));
  args.csv = FlagS(argc, argv, "--csv", "");
  args.eval_every = Flag(argc, argv, "--eval_every", 0);
  args.eval_k = static_cast<int32_t>(Flag(argc, argv, "--eval_k", 8));
  args.eval_prompts = std::max<int64_t>(0, Flag(argc, argv, "--eval_prompts", 0));
  args.eval_json = FlagS(argc, argv, "--eval_json", "");
  args.init_model = FlagS(argc, argv, "--init_model", "");
  args.save_model = FlagS(argc, argv, "--save_model", "");
  args.sft_steps = Flag(argc, argv, "--sft_steps", 0);
  args.sft.max_steps = std::max<int64_t>(1, args.sft_steps);
  args.sft.target_accuracy = FlagD(argc, argv, "--sft_target", 0.4);
  args.sft.lr = FlagD(argc, argv, "--sft_lr", 1e-3);
  args.sft.batch = Flag(argc, argv, "--sft_batch", 32);
  args.sft.eval_every = Flag(argc, argv, "--sft_eval_every", 50);
  args.base_stats = Flag(argc, argv, "--base_stats", 64);
  args.lora_rank = Flag(argc, argv, "--lora_rank", 0);
  args.lora_alpha = FlagD(argc, argv, "--lora_alpha", 0.0);
  args.lora_targets = FlagS(argc, argv, "--lora_targets", "all");
  args.minibatches = Flag(argc, argv, "--minibatches", 1);
  RejectUnknownFlags(argc, argv);
  CheckArgs(args);
  return args;
}

ModelConfig ModelConfigFor(const Args& args) {
  ModelConfig config = ModelConfig::Tiny(args.vocab);
  if (args.layers > 0) config.num_hidden_layers = args.layers;
  if (args.hidden > 0) {
    config.hidden_size = args.hidden;
    config.intermediate_size = 3 * args.hidden;
    config.head_dim = args.hidden / config.num_attention_heads;
  }
  return config;
}

absl::StatusOr<Setup> CreateSetup(const Args& args) {
  Setup setup;
  rollout::TaskOptions task_options;
  task_options.name = args.task_name;
  task_options.vocab_size = args.vocab;
  task_options.synthetic_alphabet_size = args.alphabet;
  task_options.synthetic_min_length = args.min_length;
  task_options.synthetic_max_length = args.max_length;
  absl::StatusOr<std::unique_ptr<rollout::Task>> task = rollout::CreateTask(task_options);
  if (!task.ok()) return task.status();
  setup.task = *std::move(task);

  ModelOptions model_options;
  model_options.seed = args.seed;
  absl::StatusOr<LoraOptions> lora =
      LoraFromFlags(args.lora_rank, args.lora_alpha, args.lora_targets);
  if (!lora.ok()) return lora.status();
  model_options.lora = *lora;
  absl::StatusOr<std::unique_ptr<PolicyModel>> model =
      args.init_model.empty() ? PolicyModel::CreateRandom(ModelConfigFor(args), model_options)
                              : LoadPolicyModel(args.init_model, model_options);
  if (!model.ok()) return model.status();
  setup.model = *std::move(model);
  if (setup.model->config().vocab_size < setup.task->min_vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--init_model ", args.init_model, ": its vocabulary (", setup.model->config().vocab_size,
        ") is smaller than the task needs (", setup.task->min_vocab_size(), ")"));
  }
  if (args.lag > 0) {
    absl::StatusOr<std::unique_ptr<PolicyModel>> behavior =
        PolicyModel::CreateRandom(setup.model->config(), model_options);
    if (!behavior.ok()) return behavior.status();
    setup.behavior = *std::move(behavior);
    // With adapters only they follow the trained model: the base is copied once.
    if (absl::Status s = setup.behavior->LoadWeights(setup.model->named_weights()); !s.ok()) {
      return s;
    }
  }

  learner::TrainerOptions trainer_options;
  absl::StatusOr<learner::Objective> objective = learner::ParseObjective(args.objective_name);
  if (!objective.ok()) return objective.status();
  trainer_options.loss.objective = *objective;
  trainer_options.loss.p_low = args.p_low;
  trainer_options.loss.p_high = args.p_high;
  trainer_options.loss.scale_floor = args.scale_floor;
  trainer_options.loss.clip_ratio_c = args.clip_ratio_c;
  absl::StatusOr<learner::AdvantageNormalization> advantage =
      learner::ParseAdvantageNormalization(args.advantage);
  if (!advantage.ok()) return advantage.status();
  trainer_options.loss.advantage.normalization = *advantage;
  trainer_options.lr.peak_lr = args.lr;
  trainer_options.adamw.weight_decay = args.weight_decay;
  absl::StatusOr<std::unique_ptr<learner::Trainer>> trainer =
      learner::Trainer::Create(trainer_options, setup.model.get(), /*publisher=*/nullptr);
  if (!trainer.ok()) return trainer.status();
  setup.trainer = *std::move(trainer);

  setup.sampling.temperature = args.temperature;
  setup.sampling.max_new_tokens = args.max_new_tokens > 0
                                      ? static_cast<int32_t>(args.max_new_tokens)
                                      : setup.task->max_new_tokens();
  setup.sampling.stop_token_ids = setup.task->stop_token_ids();
  // The grpo objective needs the sampling policy's token log-probs, and so
  // does the drift measured under --lag or --minibatches (behavior_kl).
  setup.sampling.return_logprobs =
      *objective == learner::Objective::kGrpo || args.lag > 0 || args.minibatches > 1;
  return setup;
}

}  // namespace asympo::bench::task_learning
