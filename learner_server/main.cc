// asympo-learner: the learner daemon. Accepts rollout batches over gRPC,
// trains the policy with the chosen objective, checkpoints, and exports
// Prometheus metrics. Every flag is described by --help (the flags both
// daemons share are defined in common/daemon/daemon_main.cc); --flagfile=FILE
// reads flags from a file.

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/daemon/daemon_main.h"
#include "common/daemon/heap_release.h"
#include "common/flag_ranges.h"
#include "common/listener/host_port.h"
#include "common/model/device.h"
#include "common/model/model_io.h"
#include "common/status_macros.h"
#include "learner_server/heartbeat.h"
#include "learner_server/learner_daemon.h"
#include "learner_server/memory_plan_check.h"

// Service.
ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC address (host:port) for the Learner service.");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9464",
          "Address of the Prometheus /metrics endpoint; empty disables it.");
// Security (docs/security.md).
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain the gRPC port serves TLS with (read again when it changes).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle of client certificates (mTLS): each caller shows a certificate it "
          "issued; with --auth_file the certificate must name a principal.");
ABSL_FLAG(std::string, auth_file, "",
          "JSON file of principals: SHA-256 hashes of bearer tokens and certificate names, with "
          "roles (submit, read_weights, status) and quotas.");
ABSL_FLAG(bool, insecure, false,
          "Listen beyond loopback in plaintext or without client authentication (anyone who "
          "reaches the port can submit batches and read the weights).");
ABSL_FLAG(double, source_queue_share, 1.0,
          "The share of the queue one source (a principal) may hold, queued or waiting, unless "
          "its entry in --auth_file sets its own; more is RESOURCE_EXHAUSTED.");
ABSL_FLAG(double, source_groups_per_second, 0,
          "Each source's rate in groups per second (0: no limit), unless its entry sets one.");
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
ABSL_FLAG(bool, gpg_gradient_correction, true, "gpg: apply alpha = B / (B - M).");
// Batches.
ABSL_FLAG(int32_t, min_group_size, 2, "Fewest responses per group (at least 2).");
ABSL_FLAG(int32_t, max_group_size, 64, "Most responses per group.");
ABSL_FLAG(int32_t, max_prompt_tokens, 4096, "Most tokens per prompt.");
ABSL_FLAG(int32_t, max_response_tokens, 4096, "Most tokens per response.");
ABSL_FLAG(int32_t, max_groups_per_batch, 64, "Most groups per submitted batch.");
ABSL_FLAG(double, max_abs_reward, 1e6,
          "Largest |reward| a batch may carry; a batch with a larger one is refused (a finite "
          "but huge reward overflows the step's float32 sums).");
// Steps.
ABSL_FLAG(int64_t, prompts_per_step, 8, "Prompt groups per optimizer step.");
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
ABSL_FLAG(double, device_memory_gib, 0,
          "Memory of the device in GiB for the start-up memory plan, logged at start: the learner "
          "refuses to start when the plan's peak per rank exceeds it, naming the flags to change "
          "(docs/operations.md, \"Memory plan\"). 0: detect it (the GPU's total memory, or "
          "MemTotal on the CPU); negative: skip the check.");
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
ABSL_FLAG(int64_t, max_steps, 0, "Stop after this many steps (0: run until SIGINT/SIGTERM).");
ABSL_FLAG(int64_t, quarantine_after_groups, 3,
          "Refuse a source's batches for --quarantine_duration once this many of its groups "
          "were dropped from their steps as poisoned (non-finite by themselves) within "
          "--quarantine_window; 0: never.");
ABSL_FLAG(absl::Duration, quarantine_window, absl::Minutes(10),
          "The window of --quarantine_after_groups.");
ABSL_FLAG(absl::Duration, quarantine_duration, absl::Minutes(10),
          "How long a quarantined source's batches are refused (RESOURCE_EXHAUSTED with the time "
          "left as the retry hint).");
ABSL_FLAG(int64_t, max_consecutive_skipped_steps, 100,
          "Stop with an error (exit 2) after this many skipped steps in a row, instead of "
          "taking groups that cannot be trained on (0: never).");
ABSL_FLAG(absl::Duration, log_every, absl::Seconds(10),
          "Log the per-step line for the first 10 steps, then at most once per this interval "
          "and when a collapse suspicion begins (0: every step; --step_csv and /metrics have "
          "every step).");
// Queue.
ABSL_FLAG(int64_t, queue_capacity, 64, "K: the most prompt groups waiting to be trained.");
ABSL_FLAG(int64_t, max_waiting_submissions, 64, "Most submissions held while the queue is full.");
ABSL_FLAG(int64_t, max_policy_lag, 0,
          "K: refuse (FAILED_PRECONDITION) batches with a group sampled more than K versions ago "
          "(its oldest Response.first_policy_version), and drop queued groups that fall behind "
          "(counted); groups without the version are not bounded. 0: no bound.");
ABSL_FLAG(absl::Duration, full_queue_timeout, absl::Seconds(30),
          "How long a submission waits for queue room before RESOURCE_EXHAUSTED.");
ABSL_FLAG(absl::Duration, retry_after, absl::Seconds(1),
          "Back-off suggested with RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_submit_streams, 1024,
          "SubmitStreams open at once; one more is refused with RESOURCE_EXHAUSTED.");
ABSL_FLAG(int32_t, max_connections, 0,
          "Connections to --listen open at once; one more is closed at once. 0: the soft "
          "RLIMIT_NOFILE less 128, at most 4096 (asympo_learner_max_connections shows it).");
ABSL_FLAG(int32_t, max_connections_per_peer, 0,
          "Connections from one peer address (IP) open at once; one more takes the place of "
          "that address's oldest connection without an authorized call, or is closed at once. "
          "0: a quarter of --max_connections, at least 16.");
ABSL_FLAG(absl::Duration, connection_auth_grace, absl::Seconds(10),
          "A connection that has made no authorized call this long after it was accepted is "
          "closed (clients reconnect when they next call).");
ABSL_FLAG(int64_t, max_streams_per_principal, 0,
          "SubmitStreams one principal (one peer address without authentication) may hold open "
          "at once. 0: a quarter of --max_submit_streams, at least 1.");
ABSL_FLAG(int32_t, max_fetches_per_principal, 0,
          "Weight fetches one principal (one peer address without authentication) may have under "
          "way at once, of the 256 in all. 0: a quarter of them.");
ABSL_FLAG(int32_t, max_registrations_per_principal, 0,
          "Weight receivers one principal (one peer address without authentication) may hold "
          "registered at once, of the 4096 in all. 0: a quarter of them.");
ABSL_FLAG(int64_t, free_heap_limit_mib, 256,
          "Freed heap memory kept resident for reuse (MiB). When requests leave more, the "
          "learner gives the free pages back to the kernel (checked every 2 s; what training "
          "steps free is kept), so that a burst of large requests does not stay resident "
          "(asympo_learner_heap_released_bytes_total).");
ABSL_FLAG(absl::Duration, submit_stream_idle_timeout, absl::Minutes(10),
          "A SubmitStream that sends no batch for this long is closed.");
ABSL_FLAG(int64_t, batch_id_window, 65536,
          "Accepted batch ids remembered for exactly-once delivery (at least --queue_capacity; "
          "the trained ones are kept in checkpoints).");
// Checkpoints.
ABSL_FLAG(std::string, checkpoint_dir, "", "Checkpoint directory (empty: no checkpoints).");
ABSL_FLAG(int64_t, checkpoint_every, 50, "Checkpoint every N steps (0: only at shutdown).");
ABSL_FLAG(int32_t, keep_checkpoints, 3, "Checkpoints kept (0: all).");
ABSL_FLAG(std::string, export_dir, "",
          "Also write the policy here as a Hugging Face directory at each checkpoint and at exit.");
// Collapse alert.
ABSL_FLAG(double, collapse_ema_alpha, 0.1, "Weight of the newest step in the reward EMA.");
ABSL_FLAG(int64_t, collapse_warmup_steps, 20, "Steps before collapse detection starts.");
ABSL_FLAG(double, collapse_drop_fraction, 0.3,
          "Collapse is suspected when the reward EMA is this fraction below its peak ...");
ABSL_FLAG(double, collapse_min_drop, 0.05, "... and at least this far below it (reward units) ...");
ABSL_FLAG(int64_t, collapse_confirm_steps, 5, "... for this many steps in a row.");
ABSL_FLAG(double, collapse_recover_fraction, 0.15,
          "A suspected collapse holds until the reward EMA is back within this fraction of its "
          "peak.");
// Weight broadcast and run log.
ABSL_FLAG(int64_t, broadcast_every, 1,
          "Publish the weights to the rollout daemons every N versions (0: only at start).");
ABSL_FLAG(int64_t, broadcast_bucket_mb, 256, "Snapshot bucket size in MiB.");
ABSL_FLAG(int64_t, broadcast_chunk_kb, 4032,
          "Chunk size of gRPC snapshot transfers when a receiver does not ask for one (the "
          "default leaves room for the message's header under gRPC's default 4 MiB receive "
          "limit, so that any default client can read it).");
ABSL_FLAG(int64_t, broadcast_nccl_world_size, 0,
          "NCCL weight transport: the learner plus this many minus one rollout daemons that "
          "ask for NCCL (--weight_transport=nccl) form one communicator, fixed at start. "
          "0: gRPC only. Needs libnccl, libcudart and a GPU; falls back to gRPC without them.");
ABSL_FLAG(absl::Duration, broadcast_nccl_timeout, absl::Seconds(60),
          "NCCL watchdog: the longest one NCCL wait may take before the communicator is "
          "aborted and every receiver falls back to gRPC.");
ABSL_FLAG(absl::Duration, broadcast_fetch_idle_timeout, absl::Minutes(1),
          "A snapshot fetch whose receiver takes no chunk for this long is cancelled.");
ABSL_FLAG(std::string, weight_group, "off",
          "A collective group for weight updates that external engine workers join "
          "(WeightGroup on the gRPC port, docs/protocol.md \"Weight group\"): gloo, nccl "
          "(the learner on a GPU) or off.");
ABSL_FLAG(std::string, weight_group_address, "127.0.0.1",
          "Where the learner's end of the weight group's collectives listens (Gloo: a host "
          "name or address of this machine). Their traffic is not encrypted: an address beyond "
          "loopback is the operator's explicit choice.");
ABSL_FLAG(absl::Duration, weight_group_timeout, absl::Seconds(60),
          "Weight group: timeout of the rendezvous and of each bucket's broadcast.");
ABSL_FLAG(absl::Duration, weight_group_ready_timeout, absl::Seconds(60),
          "Weight group: a member that does not ask for the next version within this of the "
          "first one that asked (or makes no call for this long) is left out of the next "
          "generation.");
ABSL_FLAG(absl::Duration, weight_group_join_window, absl::Seconds(2),
          "Weight group: how long a new generation gathers joining workers.");
ABSL_FLAG(std::string, step_csv, "", "Append one CSV row per training step to this file.");
ABSL_FLAG(std::string, heartbeat_file, "",
          "Every rank: rewrite this file (\"<unix seconds> <beats>\") at most once a second while "
          "the training loop makes progress (after each step, and while it waits idle for data), "
          "for a liveness probe (deploy/kubernetes/base/learner-probe.sh). Removed at start; "
          "empty: none.");
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
// Fault injection, for tests and drills.
ABSL_FLAG(std::vector<std::string>, fault_corrupt_broadcast_versions, {},
          "Testing only: corrupt one byte of these versions' snapshots in transit "
          "(receivers must detect it and keep their weights).");
ABSL_FLAG(absl::Duration, fault_broadcast_chunk_delay, absl::ZeroDuration(),
          "Testing only: sleep this long before sending each snapshot chunk.");
ABSL_FLAG(std::vector<std::string>, fault_nonfinite_loss_steps, {},
          "Testing only: the training step attempts of this process (1-based) whose loss is made "
          "NaN (the step must be skipped and counted, the weights kept).");
ABSL_FLAG(absl::Duration, fault_submit_reply_delay, absl::ZeroDuration(),
          "Testing only: hold Submit's reply this long after the batch was queued, so that the "
          "client's deadline passes after the learner accepted (a retry must not train twice).");
ABSL_FLAG(std::vector<std::string>, fault_exception_steps, {},
          "Testing only: the training step attempts of this process (1-based) that throw a "
          "LibTorch error after their first micro-batch (skipped and counted, weights kept).");

// The documented ranges (--help shows them; a value outside is refused at
// start, before the options below are read: they need no check of their own).
ASYMPO_FLAG_RANGE(source_queue_share, 1e-6, 1);
ASYMPO_FLAG_RANGE(source_groups_per_second, 0, 1e6);
ASYMPO_FLAG_RANGE(seed, 0, 1.8446744073709552e19);
ASYMPO_FLAG_RANGE(spo_alpha, 0, 1);
ASYMPO_FLAG_RANGE(p_low, 0, 1);
ASYMPO_FLAG_RANGE(p_high, 0, 1);
ASYMPO_FLAG_RANGE(scale_floor, 0, 100);
ASYMPO_FLAG_RANGE(clip_eps_low, 0, 1);
ASYMPO_FLAG_RANGE(clip_eps_high, 0, 100);
ASYMPO_FLAG_RANGE(min_group_size, 2, 4096);
ASYMPO_FLAG_RANGE(max_group_size, 2, 4096);
ASYMPO_FLAG_RANGE(max_prompt_tokens, 1, 1 << 20);
ASYMPO_FLAG_RANGE(max_response_tokens, 1, 1 << 20);
ASYMPO_FLAG_RANGE(max_groups_per_batch, 1, 65536);
ASYMPO_FLAG_RANGE(max_abs_reward, 1e-6, asympo::kMaxAbsRewardBound);
ASYMPO_FLAG_RANGE(prompts_per_step, 1, 65536);
ASYMPO_FLAG_RANGE(micro_batch_tokens, 1, 1 << 30);
ASYMPO_FLAG_RANGE(logprob_chunk_rows, 0, 1 << 30);
ASYMPO_FLAG_RANGE(device_memory_gib, -1, 1 << 20);
ASYMPO_FLAG_RANGE(lr, 0, 1);
ASYMPO_FLAG_RANGE(warmup_steps, 0, 1e12);
ASYMPO_FLAG_RANGE(total_steps, 0, 1e12);
ASYMPO_FLAG_RANGE(min_lr_ratio, 0, 1);
ASYMPO_FLAG_RANGE(adam_beta1, 0, 0.999999);
ASYMPO_FLAG_RANGE(adam_beta2, 0, 0.999999);
ASYMPO_FLAG_RANGE(adam_eps, 1e-20, 1);
ASYMPO_FLAG_RANGE(weight_decay, 0, 10);
ASYMPO_FLAG_RANGE(max_grad_norm, -1, 1e6);
ASYMPO_FLAG_RANGE(max_steps, 0, 1e12);
ASYMPO_FLAG_RANGE(quarantine_after_groups, 0, 1000000);
ASYMPO_DURATION_FLAG_RANGE(quarantine_window, absl::Seconds(1), absl::Hours(168));
ASYMPO_DURATION_FLAG_RANGE(quarantine_duration, absl::Seconds(1), absl::Hours(168));
ASYMPO_FLAG_RANGE(max_consecutive_skipped_steps, 0, 1e9);
ASYMPO_DURATION_FLAG_RANGE(log_every, absl::ZeroDuration(), absl::Hours(24));
ASYMPO_FLAG_RANGE(queue_capacity, 1, 1 << 24);
ASYMPO_FLAG_RANGE(max_waiting_submissions, 1, 1 << 20);
ASYMPO_FLAG_RANGE(max_policy_lag, 0, 1e12);
ASYMPO_FLAG_RANGE(max_submit_streams, 1, 1 << 20);
ASYMPO_FLAG_RANGE(max_connections, 0, 1 << 20);
ASYMPO_FLAG_RANGE(max_connections_per_peer, 0, 1 << 20);
ASYMPO_DURATION_FLAG_RANGE(connection_auth_grace, absl::Seconds(1), absl::Hours(1));
ASYMPO_FLAG_RANGE(max_streams_per_principal, 0, 1 << 20);
ASYMPO_FLAG_RANGE(max_fetches_per_principal, 0, 256);
ASYMPO_FLAG_RANGE(max_registrations_per_principal, 0, 4096);
ASYMPO_FLAG_RANGE(free_heap_limit_mib, 0, 1 << 20);
ASYMPO_FLAG_RANGE(batch_id_window, 1, 1 << 26);
ASYMPO_FLAG_RANGE(checkpoint_every, 0, 1e12);
ASYMPO_FLAG_RANGE(keep_checkpoints, 0, 100000);
ASYMPO_FLAG_RANGE(collapse_ema_alpha, 1e-6, 1);
ASYMPO_FLAG_RANGE(collapse_warmup_steps, 0, 1e9);
ASYMPO_FLAG_RANGE(collapse_drop_fraction, 0, 1);
ASYMPO_FLAG_RANGE(collapse_min_drop, 0, 1e6);
ASYMPO_FLAG_RANGE(collapse_confirm_steps, 1, 1e9);
ASYMPO_FLAG_RANGE(collapse_recover_fraction, 0, 1);
ASYMPO_FLAG_RANGE(broadcast_every, 1, 1e9);
ASYMPO_FLAG_RANGE(broadcast_bucket_mb, 1, 4096);
ASYMPO_FLAG_RANGE(broadcast_chunk_kb, 1, 1 << 20);
ASYMPO_FLAG_RANGE(broadcast_nccl_world_size, 0, 4096);
ASYMPO_FLAG_RANGE(dist_rank, -1, 65535);
ASYMPO_FLAG_RANGE(dist_world_size, -1, 65536);
ASYMPO_FLAG_RANGE(dist_master_port, -1, 65535);
ASYMPO_DURATION_FLAG_RANGE(full_queue_timeout, absl::ZeroDuration(), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(retry_after, absl::ZeroDuration(), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(submit_stream_idle_timeout, absl::Milliseconds(1), absl::Hours(24));
ASYMPO_DURATION_FLAG_RANGE(broadcast_nccl_timeout, absl::Milliseconds(1), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(weight_group_timeout, absl::Milliseconds(100), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(weight_group_ready_timeout, absl::Milliseconds(100), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(weight_group_join_window, absl::ZeroDuration(), absl::Minutes(10));
ASYMPO_DURATION_FLAG_RANGE(broadcast_fetch_idle_timeout, absl::Milliseconds(1), absl::Hours(24));
ASYMPO_DURATION_FLAG_RANGE(dist_timeout, absl::Seconds(1), absl::Hours(24));
ASYMPO_DURATION_FLAG_RANGE(fault_broadcast_chunk_delay, absl::ZeroDuration(), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(fault_submit_reply_delay, absl::ZeroDuration(), absl::Hours(1));

namespace {

using asympo::daemon::ParseIntListFlag;
using asympo::learner::LearnerDaemonOptions;

// The process environment, for the settings torchrun and Slurm pass.
const char* Getenv(const char* name) { return std::getenv(name); }

absl::Status ModelFlags(LearnerDaemonOptions* o) {
  o->model = absl::GetFlag(FLAGS_model);
  o->tiny_vocab_size = absl::GetFlag(FLAGS_tiny_vocab_size);
  ASYMPO_ASSIGN_OR_RETURN(o->publish_dtype, asympo::ParseModelDType(absl::GetFlag(FLAGS_dtype)));
  ASYMPO_ASSIGN_OR_RETURN(const std::string device,
                          asympo::learner::RankDevice(absl::GetFlag(FLAGS_device), Getenv));
  ASYMPO_ASSIGN_OR_RETURN(o->model_options.device, asympo::ParseDevice(device));
  ASYMPO_ASSIGN_OR_RETURN(
      o->model_options.compute_dtype,
      asympo::ParseComputeDType(absl::GetFlag(FLAGS_compute_dtype), o->model_options.device));
  o->model_options.dtype = at::kFloat;  // master weights
  absl::StatusOr<int64_t> every =
      asympo::ParseActivationCheckpointing(absl::GetFlag(FLAGS_activation_checkpointing));
  if (!every.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--activation_checkpointing: ", every.status().message()));
  }
  o->model_options.checkpoint_every = *every;
  o->model_options.seed = absl::GetFlag(FLAGS_seed);
  return absl::OkStatus();
}

absl::Status ObjectiveFlags(asympo::learner::PolicyLossOptions* loss) {
  auto objective = asympo::learner::ParseObjective(absl::GetFlag(FLAGS_objective));
  if (!objective.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--objective: ", objective.status().message()));
  }
  loss->objective = *objective;
  auto adv = asympo::learner::ParseAdvantageNormalization(absl::GetFlag(FLAGS_advantage));
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
  loss->gpg_gradient_correction = absl::GetFlag(FLAGS_gpg_gradient_correction);
  return absl::OkStatus();
}

absl::Status TrainerFlags(asympo::learner::TrainerOptions* t) {
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

// What a batch may hold, and how submissions wait and are refused.
void ServiceFlags(asympo::learner::LearnerServiceOptions* s) {
  s->limits.min_group_size = absl::GetFlag(FLAGS_min_group_size);
  s->limits.max_group_size = absl::GetFlag(FLAGS_max_group_size);
  s->limits.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  s->limits.max_response_tokens = absl::GetFlag(FLAGS_max_response_tokens);
  s->limits.max_groups_per_batch = absl::GetFlag(FLAGS_max_groups_per_batch);
  s->limits.max_abs_reward = absl::GetFlag(FLAGS_max_abs_reward);
  s->full_queue_timeout = absl::GetFlag(FLAGS_full_queue_timeout);
  s->retry_after = absl::GetFlag(FLAGS_retry_after);
  s->max_streams = absl::GetFlag(FLAGS_max_submit_streams);
  s->max_streams_per_principal = absl::GetFlag(FLAGS_max_streams_per_principal);
  s->stream_idle_timeout = absl::GetFlag(FLAGS_submit_stream_idle_timeout);
  s->fault_reply_delay = absl::GetFlag(FLAGS_fault_submit_reply_delay);
}

// The gRPC port: its address, TLS, callers and connections (docs/security.md).
void ListenerFlags(LearnerDaemonOptions* o) {
  o->listen_address = absl::GetFlag(FLAGS_listen);
  o->tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  o->tls.key_file = absl::GetFlag(FLAGS_tls_key);
  o->tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o->auth.principals_file = absl::GetFlag(FLAGS_auth_file);
  o->auth.default_queue_share = absl::GetFlag(FLAGS_source_queue_share);
  o->auth.default_groups_per_second = absl::GetFlag(FLAGS_source_groups_per_second);
  o->insecure = absl::GetFlag(FLAGS_insecure);
  o->max_connections = absl::GetFlag(FLAGS_max_connections);
  o->max_connections_per_peer = absl::GetFlag(FLAGS_max_connections_per_peer);
  o->connection_auth_grace = absl::GetFlag(FLAGS_connection_auth_grace);
}

// The queue, the steps, and what the run keeps: checkpoints, the step CSV,
// the collapse alert, quarantines.
void RunFlags(LearnerDaemonOptions* o) {
  o->queue.capacity_groups = absl::GetFlag(FLAGS_queue_capacity);
  o->queue.max_waiting_pushes = absl::GetFlag(FLAGS_max_waiting_submissions);
  o->queue.batch_id_window = absl::GetFlag(FLAGS_batch_id_window);
  o->prompts_per_step = absl::GetFlag(FLAGS_prompts_per_step);
  o->max_steps = absl::GetFlag(FLAGS_max_steps);
  o->max_consecutive_skipped_steps = absl::GetFlag(FLAGS_max_consecutive_skipped_steps);
  o->max_policy_lag = absl::GetFlag(FLAGS_max_policy_lag);
  o->quarantine.max_poisoned_groups = absl::GetFlag(FLAGS_quarantine_after_groups);
  o->quarantine.window = absl::GetFlag(FLAGS_quarantine_window);
  o->quarantine.duration = absl::GetFlag(FLAGS_quarantine_duration);
  o->log_every = absl::GetFlag(FLAGS_log_every);
  o->step_csv_path = absl::GetFlag(FLAGS_step_csv);
  o->checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o->checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o->keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  o->export_dir = absl::GetFlag(FLAGS_export_dir);
  o->collapse.ema_alpha = absl::GetFlag(FLAGS_collapse_ema_alpha);
  o->collapse.warmup_steps = absl::GetFlag(FLAGS_collapse_warmup_steps);
  o->collapse.drop_fraction = absl::GetFlag(FLAGS_collapse_drop_fraction);
  o->collapse.min_drop = absl::GetFlag(FLAGS_collapse_min_drop);
  o->collapse.confirm_steps = absl::GetFlag(FLAGS_collapse_confirm_steps);
  o->collapse.recover_fraction = absl::GetFlag(FLAGS_collapse_recover_fraction);
}

absl::Status BroadcastFlags(LearnerDaemonOptions* o) {
  o->broadcast_every = absl::GetFlag(FLAGS_broadcast_every);
  asympo::broadcast::BroadcastSenderOptions& b = o->broadcast;
  const int64_t bucket_mb = absl::GetFlag(FLAGS_broadcast_bucket_mb);
  b.packing.bucket_bytes = static_cast<uint64_t>(bucket_mb) << 20;
  const int64_t chunk_kb = absl::GetFlag(FLAGS_broadcast_chunk_kb);
  if (chunk_kb <= 0 || (chunk_kb << 10) > b.max_chunk_bytes_cap) {
    return absl::InvalidArgumentError(absl::StrCat("--broadcast_chunk_kb=", chunk_kb,
                                                   ": expected 1..", b.max_chunk_bytes_cap >> 10));
  }
  b.default_chunk_bytes = static_cast<uint32_t>(chunk_kb << 10);
  ASYMPO_RETURN_IF_ERROR(ParseIntListFlag(absl::GetFlag(FLAGS_fault_corrupt_broadcast_versions),
                                          "fault_corrupt_broadcast_versions", &b.corrupt_versions,
                                          uint64_t{0}));
  b.chunk_delay = absl::GetFlag(FLAGS_fault_broadcast_chunk_delay);
  const int64_t nccl_world = absl::GetFlag(FLAGS_broadcast_nccl_world_size);
  if (nccl_world != 0 && (nccl_world < 2 || nccl_world > 4096)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--broadcast_nccl_world_size=", nccl_world,
                     ": expected 0 (gRPC only) or 2..4096 (the learner plus the NCCL receivers)"));
  }
  b.nccl_world_size = static_cast<int>(nccl_world);
  b.nccl.timeout = absl::GetFlag(FLAGS_broadcast_nccl_timeout);
  b.fetch_idle_timeout = absl::GetFlag(FLAGS_broadcast_fetch_idle_timeout);
  // Each principal's share of the fetches and registrations.
  b.max_fetches_per_principal = absl::GetFlag(FLAGS_max_fetches_per_principal);
  b.max_sessions_per_principal = absl::GetFlag(FLAGS_max_registrations_per_principal);
  // NCCL rank 0 is the learner's own GPU.
  if (o->model_options.device.is_cuda()) {
    b.nccl_device = std::max(0, int{o->model_options.device.index()});
  }
  const std::string group = absl::GetFlag(FLAGS_weight_group);
  if (group != "off" && group != "gloo" && group != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight_group=", group, ": expected off, gloo or nccl"));
  }
  if (group == "nccl" && !o->model_options.device.is_cuda()) {
    return absl::InvalidArgumentError(
        "--weight_group=nccl broadcasts from the learner's GPU: it needs --device=cuda");
  }
  o->weight_group_enabled = group != "off";
  asympo::learner::WeightGroupOptions& g = o->weight_group;
  g.backend = group;
  g.address = absl::GetFlag(FLAGS_weight_group_address);
  if (o->weight_group_enabled && g.address.empty()) {
    return absl::InvalidArgumentError("--weight_group_address is empty");
  }
  if (o->weight_group_enabled && g.backend == "gloo" && !asympo::IsLoopbackAddress(g.address)) {
    LOG(WARNING) << "--weight_group_address=" << g.address
                 << ": the weight group's collectives leave this host unencrypted; anyone who "
                    "reaches that address can read the weights";
  }
  g.timeout = absl::GetFlag(FLAGS_weight_group_timeout);
  g.ready_timeout = absl::GetFlag(FLAGS_weight_group_ready_timeout);
  g.join_window = absl::GetFlag(FLAGS_weight_group_join_window);
  return absl::OkStatus();
}

absl::Status DataParallelFlags(LearnerDaemonOptions* o) {
  asympo::learner::DataParallelFlags f;
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
  ASYMPO_ASSIGN_OR_RETURN(o->data_parallel, asympo::learner::ResolveDataParallel(f, Getenv));
  return absl::OkStatus();
}

// --heartbeat_file: the training loop beats through on_progress; the
// heartbeat lives as long as the options' copy in the daemon.
absl::Status HeartbeatFlag(LearnerDaemonOptions* o) {
  const std::string path = absl::GetFlag(FLAGS_heartbeat_file);
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<asympo::learner::Heartbeat>> hb =
      asympo::learner::Heartbeat::Create(path);
  if (!hb.ok())
    return absl::InvalidArgumentError(absl::StrCat("--heartbeat_file: ", hb.status().message()));
  o->on_progress = [hb = std::shared_ptr<asympo::learner::Heartbeat>(*std::move(hb))] {
    hb->Beat().IgnoreError();  // logged by Beat; the probe sees the stale file
  };
  return absl::OkStatus();
}

absl::StatusOr<LearnerDaemonOptions> OptionsFromFlags() {
  LearnerDaemonOptions o;
  ASYMPO_RETURN_IF_ERROR(ModelFlags(&o));
  ASYMPO_RETURN_IF_ERROR(DataParallelFlags(&o));
  ASYMPO_RETURN_IF_ERROR(TrainerFlags(&o.trainer));
  ServiceFlags(&o.service);
  ListenerFlags(&o);
  RunFlags(&o);
  ASYMPO_RETURN_IF_ERROR(BroadcastFlags(&o));
  ASYMPO_RETURN_IF_ERROR(HeartbeatFlag(&o));
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  asympo::daemon::DaemonMain m(
      "asympo-learner",
      "asympo-learner: the ASymPO-RL learner daemon.\n"
      "  asympo-learner --model=tiny --objective=asympo --checkpoint_dir=/tmp/ckpt\n"
      "Flags can also come from --flagfile=FILE.",
      "learner_server/main.cc");
  if (absl::Status s = m.Start(argc, argv); !s.ok()) return m.Fail(s);
  asympo::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  at::manual_seed(absl::GetFlag(FLAGS_seed));
  absl::StatusOr<LearnerDaemonOptions> options = OptionsFromFlags();
  if (!options.ok()) return m.Fail(options.status());
  for (int i = 1; i < argc; ++i) absl::StrAppend(&options->config_text, argv[i], "\n");
  if (absl::Status s =
          asympo::learner::CheckLearnerMemory(*options, absl::GetFlag(FLAGS_device_memory_gib));
      !s.ok()) {
    return m.Fail(s);
  }
  // Rank 0 serves the metrics; the other ranks' steps are in its figures.
  if (absl::Status s =
          m.ServeMetrics(absl::GetFlag(FLAGS_metrics_address), options->data_parallel.rank == 0);
      !s.ok()) {
    return m.Fail(s);
  }
  absl::StatusOr<std::unique_ptr<asympo::learner::LearnerDaemon>> daemon =
      asympo::learner::LearnerDaemon::Create(*std::move(options), m.registry());
  if (!daemon.ok()) return m.Fail(daemon.status());
  // Gives back what requests leave on the heap, not what steps keep for
  // reuse (common/daemon/heap_release.h).
  asympo::daemon::HeapReleaseOptions heap;
  heap.keep_bytes = absl::GetFlag(FLAGS_free_heap_limit_mib) << 20;
  heap.received_bytes = [&daemon] { return (*daemon)->received_bytes(); };
  const asympo::daemon::HeapReleaser heap_releaser(heap, m.registry(), "asympo_learner");
  return m.Run(**daemon);
}
