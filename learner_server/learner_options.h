// The options of the learner daemon, both roles' (learner_daemon.h): the
// service, the model, the trainer, the queue, checkpoints, the weight
// broadcast and group, data parallelism. learner_server/main.cc fills them
// from flags; ValidateLearnerDaemonOptions checks what both roles share.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/batch_validation.h"
#include "common/model/policy_model.h"
#include "common/security/authorizer.h"
#include "common/security/tls.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/admission/learner_service.h"
#include "learner_server/admission/source_quarantine.h"
#include "learner_server/learner_metrics.h"
#include "learner_server/parallel/data_parallel.h"
#include "learner_server/trainer/trainer.h"
#include "weight_broadcaster/broadcast_sender.h"
#include "weight_broadcaster/snapshot_store.h"
#include "weight_broadcaster/weight_group/weight_group.h"

namespace asympo::learner {

struct LearnerDaemonOptions {
  // gRPC address to serve the Learner service on ("host:port"; port 0
  // picks a free one, see port()).
  std::string listen_address = "127.0.0.1:50051";
  // Transport security and who may call (docs/security.md). Beyond
  // loopback the learner needs TLS and a way to authenticate its callers,
  // unless `insecure`.
  security::ServerTlsOptions tls;
  security::AuthOptions auth;
  bool insecure = false;
  // The Learner service: batch limits (vocab_size is taken from the
  // model), the queue-full wait and retry hint, the stream limits and
  // timeout. Its authorizer, objective, version, model_signature,
  // received_bytes, quarantine and policy_lag are filled in by the daemon.
  LearnerServiceOptions service;
  // "tiny" for the built-in model, or a Hugging Face model directory.
  std::string model = "tiny";
  int64_t tiny_vocab_size = 64;
  // The learner's model: dtype float32 (master weights), compute_dtype
  // (bfloat16 on a GPU), device.
  ModelOptions model_options;
  // The dtype of the weights rollouts sample with: broadcast snapshots and
  // exported directories are in it (--dtype).
  at::ScalarType publish_dtype = at::kFloat;
  TrainerOptions trainer;
  int64_t prompts_per_step = 8;
  // While fewer than prompts_per_step groups have been queued for this
  // long, the trainer takes them as a short step (weighted as a full one:
  // TrainerOptions::step_groups); zero: never, steps are always whole.
  absl::Duration partial_step_after = absl::Seconds(30);
  GroupQueueOptions queue;
  // Connections to listen_address open at once (GrpcListenerOptions); 0:
  // the soft RLIMIT_NOFILE less 128, at most 4,096.
  int max_connections = 0;
  // GrpcListenerOptions::max_connections_per_peer and
  // unauthenticated_grace.
  int max_connections_per_peer = 0;
  absl::Duration connection_auth_grace = absl::Seconds(10);
  // Checkpoints: every N steps (0: only at shutdown) into checkpoint_dir
  // (empty: none); the newest valid one is restored at start.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 50;
  int keep_checkpoints = 3;
  // When set, the policy is also written there as a Hugging Face directory
  // with every checkpoint and at shutdown.
  std::string export_dir;
  // The reward monitor (reward_monitor.h): the detector's thresholds, the
  // sources with a detector of their own, and the steps after which a
  // silent source leaves the fleet's median.
  CollapseOptions collapse;
  int collapse_max_sources = 16;
  int64_t collapse_source_idle_steps = 200;
  // Weight broadcast (the WeightBroadcast service shares the gRPC port):
  // every `broadcast_every` versions the weights are published to the
  // rollout daemons; the current version is published at start.
  int64_t broadcast_every = 1;
  // --snapshot_staging=host: no device staging buffer (SnapshotPublisher).
  bool snapshot_staging_host = false;
  broadcast::BroadcastSenderOptions broadcast;
  // The snapshot store every transport reads (its bucket packing).
  broadcast::SnapshotStoreOptions snapshots;
  // The weight group that external engine workers join (WeightGroup on
  // the gRPC port; off unless enabled). Its model_signature and authorizer
  // are filled in at start.
  bool weight_group_enabled = false;
  broadcast::WeightGroupOptions weight_group;
  // When set, one CSV row per step (time, version, reward, loss, ...) is
  // appended there.
  std::string step_csv_path;
  // Stop after this many steps of this run (0: run until Shutdown).
  int64_t max_steps = 0;
  // Stop with an error after this many skipped steps in a row (0: never): a
  // learner whose every step fails (non-finite gradients that its
  // checkpointed state reproduces) would otherwise take the generators'
  // groups for ever without training on them.
  int64_t max_consecutive_skipped_steps = 100;
  // When a source's groups keep poisoning steps (SourceQuarantine).
  QuarantineOptions quarantine;
  // K: the most versions a group's policy version (the oldest
  // Response.first_policy_version of its responses) may be behind the
  // learner's, at admission and when a step takes it (PolicyLag; 0: no
  // bound). Groups without a policy version are not bounded.
  int64_t max_policy_lag = 0;
  // The per-step INFO line: every step of the first 10, then at most one
  // per this interval, and when a collapse suspicion begins (at most once an
  // interval too; zero: every step). The step CSV and the metrics have
  // every step.
  absl::Duration log_every = absl::Seconds(10);
  // Text stored in checkpoints (the flags the daemon was started with).
  std::string config_text;
  // Data parallelism (world_size 1: none). Rank 0 is the daemon described
  // above; every other rank only trains the share of each step rank 0 sends
  // it: no gRPC server, queue, checkpoints, CSV or export.
  DataParallelOptions data_parallel;
  // When set, called by the training loop after each step and each idle
  // wait for data (rank 0), and after each message from rank 0 (the other
  // ranks): the liveness heartbeat (learner_server/heartbeat.h).
  std::function<void()> on_progress;
  // Rank 0's readiness (ProgressWatch): not ready once the training loop
  // or, while work waits, the queue has not moved for this long (zero:
  // always ready).
  absl::Duration ready_stall_timeout = absl::Minutes(5);
  // Testing only: each training step sleeps this long first (a stuck step).
  absl::Duration fault_step_delay = absl::ZeroDuration();
};

// Checks the options both roles share, so that a bad one stops every rank
// at start; INVALID_ARGUMENT naming it.
absl::Status ValidateLearnerDaemonOptions(const LearnerDaemonOptions& options);

// The reward monitor's part of `options`.
inline RewardMonitorOptions RewardMonitorOptionsOf(const LearnerDaemonOptions& options) {
  return {options.collapse, options.collapse_max_sources, options.collapse_source_idle_steps};
}

// Whether rank 0's versions go over NCCL from its staged device copy (the
// NCCL transport, --broadcast_nccl_world_size, or an NCCL weight group, with
// --snapshot_staging=device), when the model is on a GPU: a published
// version then holds that copy while the next is staged into another. The
// learner's staging and its memory plan both follow this.
inline bool NcclFromDeviceCopy(const LearnerDaemonOptions& options) {
  return !options.snapshot_staging_host &&
         (options.broadcast.nccl_world_size >= 2 ||
          (options.weight_group_enabled && options.weight_group.backend == "nccl"));
}

}  // namespace asympo::learner
