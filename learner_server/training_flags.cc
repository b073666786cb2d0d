// asympo-learner's flags of the model, the objective, the trainer and its
// ranks (learner_flags.h).
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/daemon/daemon_main.h"
#include "common/flag_ranges.h"
#include "common/model/device.h"
#include "common/model/lora_flags.h"
#include "common/model/model_io.h"
#include "common/status_macros.h"
#include "learner_server/learner_flags.h"

// Model.
ABSL_FLAG(std::string, model, "tiny",
          "\"tiny\" for the built-in test model, or a Hugging Face model directory "
          "(config.json + safetensors).");
ABSL_FLAG(std::string, device, "cpu",
          "Where the model, the optimizer state and the loss live: cpu, cuda (the first GPU, or "
          "under torchrun or Slurm the node's GPU number LOCAL_RANK or SLURM_LOCALID) or "
          "cuda:N.");
ABSL_FLAG(std::string, compute_dtype, "auto",
          "Activations and matmuls: auto (bfloat16 on a GPU, float32 on the CPU), float32 or "
          "bfloat16. Master weights and AdamW moments are float32 either way; the loss and "
          "advantages are computed in float32.");
ABSL_FLAG(std::string, dtype, "float32",
          "Dtype of the weights rollouts sample with: broadcast snapshots and --export_dir are "
          "written in it (float32 or bfloat16; must match the rollouts' --dtype).");
ABSL_FLAG(int64_t, lora_rank, 0,
          "Train low-rank adapters of this rank on the decoder layers' projections instead of "
          "every weight (0: every weight trains). The base stays frozen in the compute dtype "
          "with no gradients or AdamW moments; checkpoints and published versions carry the "
          "adapters alone.");
ABSL_FLAG(double, lora_alpha, 0,
          "The adapters' output is scaled by lora_alpha / lora_rank (0: twice the rank).");
ABSL_FLAG(std::string, lora_targets, "all",
          "The projections that get adapters: a comma-separated list of q, k, v, o, gate, up, "
          "down, or all, attention (q,k,v,o), mlp (gate,up,down).");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the random initialization and of the CPU generator.");
// Objective.
ABSL_FLAG(std::string, objective, "asympo",
          "Training objective: naive, spo, asympo, asympo_stable, grpo or gpg (docs/method.md).");
ABSL_FLAG(std::string, advantage, "mean",
          "Group advantage: mean, or mean_std (divide by the group std).");
ABSL_FLAG(double, spo_alpha, 0.2, "spo: weight of negative advantages, in [0, 1].");
ABSL_FLAG(double, p_low, 0.02,
          "asympo_stable: lower probability bound for A < 0 tokens (the paper recommends "
          "0.01-0.05).");
ABSL_FLAG(double, p_high, 0.99, "asympo_stable: upper probability bound for A >= 0 tokens.");
ABSL_FLAG(double, scale_floor, 1e-2, "asympo_stable: floor of the response scale (nats).");
ABSL_FLAG(double, clip_eps_low, 0.2, "grpo: lower clip range (ratio >= 1 - eps).");
ABSL_FLAG(double, clip_eps_high, 0.2, "grpo: upper clip range (ratio <= 1 + eps).");
ABSL_FLAG(double, clip_ratio_c, 0.0,
          "grpo: the dual clip (0: off; VeRL uses 3): a token with a negative advantage loses at "
          "most clip_ratio_c times it, however large its ratio.");
ABSL_FLAG(bool, gpg_gradient_correction, true, "gpg: apply alpha = B / (B - M).");
ABSL_FLAG(int64_t, micro_batch_tokens, 16384,
          "Tokens per micro-batch (gradient accumulation): real tokens with --pack_sequences, "
          "padded ones (sequences x longest) without. A larger group is a micro-batch of its "
          "own.");
ABSL_FLAG(bool, pack_sequences, true,
          "Pack several prompt+response sequences into each row of a micro-batch, each with its "
          "own positions and a block-diagonal causal mask, instead of one padded row per "
          "response. The loss and its gradients are the same.");
ABSL_FLAG(std::string, activation_checkpointing, "none",
          "none, layers (every decoder layer keeps only its input and runs its forward again in "
          "the backward) or every_N (layers 0, N, 2N, ... do): less activation memory for more "
          "compute.");
ABSL_FLAG(int64_t, logprob_chunk_rows, 1024,
          "Rows of logits computed at once for token log-probs.");
ABSL_FLAG(double, lr, 1e-6, "Peak learning rate.");
ABSL_FLAG(std::string, lr_schedule, "constant", "constant or cosine (after warm-up).");
ABSL_FLAG(int64_t, warmup_steps, 0, "Linear warm-up steps.");
ABSL_FLAG(int64_t, total_steps, 0, "Steps of the cosine schedule.");
ABSL_FLAG(double, min_lr_ratio, 0.1,
          "Final learning rate of the cosine schedule, relative to --lr.");
ABSL_FLAG(double, adam_beta1, 0.9, "AdamW beta1.");
ABSL_FLAG(double, adam_beta2, 0.999, "AdamW beta2.");
ABSL_FLAG(double, adam_eps, 1e-8, "AdamW epsilon.");
ABSL_FLAG(double, weight_decay, 0.0, "AdamW decoupled weight decay.");
ABSL_FLAG(double, max_grad_norm, 1.0, "Clip the global gradient norm to this (<= 0 disables).");
// Data parallelism (docs/operations.md, "Several learner ranks"). Unset
// flags fall back to torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT,
// then Slurm's SLURM_PROCID/SLURM_NTASKS.
ABSL_FLAG(int32_t, dist_rank, -1, "This process's data-parallel rank (-1: from the environment).");
ABSL_FLAG(int32_t, dist_world_size, -1,
          "Data-parallel ranks in the job (-1: from the environment; 1 without it).");
ABSL_FLAG(std::string, dist_master_addr, "", "Rank 0's address (empty: MASTER_ADDR).");
ABSL_FLAG(int32_t, dist_master_port, -1,
          "The rendezvous (c10d TCPStore) port on rank 0 (-1: MASTER_PORT, else 29500).");
ABSL_FLAG(std::string, dist_local_addr, "",
          "The address this rank's Gloo transport binds to (empty: loopback when the master "
          "is loopback, else this host's name).");
ABSL_FLAG(absl::Duration, dist_timeout, absl::Minutes(10),
          "The longest a rank waits for the others in one collective before the job stops.");
ABSL_FLAG(std::string, dist_shard, "",
          "What each data-parallel rank keeps: none (everything; gradients all-reduced), "
          "optimizer (ZeRO-1: 1/world_size of the AdamW moments; reduce-scatter of the "
          "gradients, all-gather of the weights) or full (1/world_size of the float32 master "
          "weights, gradients and moments; each layer's weights gathered for its forward and "
          "its backward). Empty: optimizer with --dist_shard_optimizer, else none.");
ABSL_FLAG(bool, dist_shard_optimizer, false, "The same as --dist_shard=optimizer.");
ABSL_FLAG(std::string, dist_backend, "auto",
          "The ranks' collectives: nccl (GPU ranks, one GPU each), gloo (host memory; CPU "
          "ranks) or auto (nccl on a GPU where this build has it, else gloo).");
ABSL_FLAG(bool, dist_insecure, false,
          "Accept that the ranks' rendezvous and Gloo or NCCL traffic are neither "
          "authenticated nor encrypted (required for more than one rank).");
ABSL_FLAG(std::vector<std::string>, fault_nonfinite_loss_steps, {},
          "Testing only: the training step attempts of this process (1-based) whose loss is made "
          "NaN (the step must be skipped and counted, the weights kept).");
ABSL_FLAG(std::vector<std::string>, fault_exception_steps, {},
          "Testing only: the training step attempts of this process (1-based) that throw a "
          "LibTorch error after their first micro-batch (skipped and counted, weights kept).");

// The documented ranges (--help shows them; a value outside is refused at start).
ASYMPO_FLAG_RANGE(seed, 0, 1.8446744073709552e19);
ASYMPO_FLAG_RANGE(lora_rank, 0, 4096);
ASYMPO_FLAG_RANGE(lora_alpha, 0, 1e6);
ASYMPO_FLAG_RANGE(spo_alpha, 0, 1);
ASYMPO_FLAG_RANGE(p_low, 0, 1);
ASYMPO_FLAG_RANGE(p_high, 0, 1);
ASYMPO_FLAG_RANGE(scale_floor, 0, 100);
ASYMPO_FLAG_RANGE(clip_eps_low, 0, 1);
ASYMPO_FLAG_RANGE(clip_eps_high, 0, 100);
ASYMPO_FLAG_RANGE(clip_ratio_c, 0, 1e6);
ASYMPO_FLAG_RANGE(micro_batch_tokens, 1, 1 << 30);
ASYMPO_FLAG_RANGE(logprob_chunk_rows, 1, 1 << 30);
ASYMPO_FLAG_RANGE(lr, 0, 1);
ASYMPO_FLAG_RANGE(warmup_steps, 0, 1e12);
ASYMPO_FLAG_RANGE(total_steps, 0, 1e12);
ASYMPO_FLAG_RANGE(min_lr_ratio, 0, 1);
ASYMPO_FLAG_RANGE(adam_beta1, 0, 0.999999);
ASYMPO_FLAG_RANGE(adam_beta2, 0, 0.999999);
ASYMPO_FLAG_RANGE(adam_eps, 1e-20, 1);
ASYMPO_FLAG_RANGE(weight_decay, 0, 10);
ASYMPO_FLAG_RANGE(max_grad_norm, -1, 1e6);
ASYMPO_FLAG_RANGE(dist_rank, -1, 65535);
ASYMPO_FLAG_RANGE(dist_world_size, -1, 65536);
ASYMPO_FLAG_RANGE(dist_master_port, -1, 65535);
ASYMPO_DURATION_FLAG_RANGE(dist_timeout, absl::Seconds(1), absl::Hours(24));

namespace asympo::learner {
namespace {

using daemon::ParseIntListFlag;

// The process environment, for the settings torchrun and Slurm pass.
const char* Getenv(const char* name) { return std::getenv(name); }

absl::Status ObjectiveFlags(PolicyLossOptions* loss) {
  auto objective = ParseObjective(absl::GetFlag(FLAGS_objective));
  if (!objective.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--objective: ", objective.status().message()));
  }
  loss->objective = *objective;
  auto adv = ParseAdvantageNormalization(absl::GetFlag(FLAGS_advantage));
  if (!adv.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--advantage: ", adv.status().message()));
  }
  loss->advantage.normalization = *adv;
  loss->spo_alpha = absl::GetFlag(FLAGS_spo_alpha);
  loss->p_low = absl::GetFlag(FLAGS_p_low);
  loss->p_high = absl::GetFlag(FLAGS_p_high);
  loss->scale_floor = absl::GetFlag(FLAGS_scale_floor);
  loss->clip_eps_low = absl::GetFlag(FLAGS_clip_eps_low);
  loss->clip_eps_high = absl::GetFlag(FLAGS_clip_eps_high);
  loss->clip_ratio_c = absl::GetFlag(FLAGS_clip_ratio_c);
  loss->gpg_gradient_correction = absl::GetFlag(FLAGS_gpg_gradient_correction);
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelFlags(LearnerDaemonOptions* o) {
  o->model = absl::GetFlag(FLAGS_model);
  o->tiny_vocab_size = absl::GetFlag(FLAGS_tiny_vocab_size);
  ASYMPO_ASSIGN_OR_RETURN(o->publish_dtype, ParseModelDType(absl::GetFlag(FLAGS_dtype)));
  ASYMPO_ASSIGN_OR_RETURN(const std::string device,
                          RankDevice(absl::GetFlag(FLAGS_device), Getenv));
  ASYMPO_ASSIGN_OR_RETURN(o->model_options.device, ParseDevice(device));
  ASYMPO_ASSIGN_OR_RETURN(
      o->model_options.compute_dtype,
      ParseComputeDType(absl::GetFlag(FLAGS_compute_dtype), o->model_options.device));
  o->model_options.dtype = at::kFloat;  // master weights
  absl::StatusOr<int64_t> every =
      ParseActivationCheckpointing(absl::GetFlag(FLAGS_activation_checkpointing));
  if (!every.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--activation_checkpointing: ", every.status().message()));
  }
  o->model_options.checkpoint_every = *every;
  o->model_options.seed = absl::GetFlag(FLAGS_seed);
  ASYMPO_ASSIGN_OR_RETURN(o->model_options.lora, LoraFromFlags(absl::GetFlag(FLAGS_lora_rank),
                                                               absl::GetFlag(FLAGS_lora_alpha),
                                                               absl::GetFlag(FLAGS_lora_targets)));
  return absl::OkStatus();
}

absl::Status DataParallelFlags(LearnerDaemonOptions* o) {
  struct DataParallelFlags f;  // the type (this function has its name)
  if (absl::GetFlag(FLAGS_dist_rank) >= 0) f.rank = absl::GetFlag(FLAGS_dist_rank);
  if (absl::GetFlag(FLAGS_dist_world_size) >= 0)
    f.world_size = absl::GetFlag(FLAGS_dist_world_size);
  if (absl::GetFlag(FLAGS_dist_master_port) >= 0) {
    f.master_port = absl::GetFlag(FLAGS_dist_master_port);
  }
  f.master_addr = absl::GetFlag(FLAGS_dist_master_addr);
  f.local_addr = absl::GetFlag(FLAGS_dist_local_addr);
  f.timeout = absl::GetFlag(FLAGS_dist_timeout);
  f.insecure = absl::GetFlag(FLAGS_dist_insecure);
  f.shard = absl::GetFlag(FLAGS_dist_shard);
  f.shard_optimizer = absl::GetFlag(FLAGS_dist_shard_optimizer);
  f.backend = absl::GetFlag(FLAGS_dist_backend);
  f.device = o->model_options.device;  // ModelFlags first
  ASYMPO_ASSIGN_OR_RETURN(o->data_parallel, ResolveDataParallel(f, Getenv));
  return absl::OkStatus();
}

absl::Status TrainerFlags(TrainerOptions* t) {
  ASYMPO_RETURN_IF_ERROR(ObjectiveFlags(&t->loss));
  t->micro_batch_tokens = absl::GetFlag(FLAGS_micro_batch_tokens);
  t->pack_sequences = absl::GetFlag(FLAGS_pack_sequences);
  t->logprob_chunk_rows = absl::GetFlag(FLAGS_logprob_chunk_rows);
  t->lr.peak_lr = absl::GetFlag(FLAGS_lr);
  t->lr.kind = absl::GetFlag(FLAGS_lr_schedule);
  t->lr.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  t->lr.total_steps = absl::GetFlag(FLAGS_total_steps);
  t->lr.min_lr_ratio = absl::GetFlag(FLAGS_min_lr_ratio);
  t->adamw.beta1 = absl::GetFlag(FLAGS_adam_beta1);
  t->adamw.beta2 = absl::GetFlag(FLAGS_adam_beta2);
  t->adamw.eps = absl::GetFlag(FLAGS_adam_eps);
  t->adamw.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  t->max_grad_norm = absl::GetFlag(FLAGS_max_grad_norm);
  ASYMPO_RETURN_IF_ERROR(ParseIntListFlag(absl::GetFlag(FLAGS_fault_nonfinite_loss_steps),
                                          "fault_nonfinite_loss_steps",
                                          &t->fault_nonfinite_loss_steps));
  return ParseIntListFlag(absl::GetFlag(FLAGS_fault_exception_steps), "fault_exception_steps",
                          &t->fault_exception_steps);
}

}  // namespace asympo::learner
