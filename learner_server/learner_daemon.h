// The learner daemon: the model, the bounded queue, the gRPC service, the
// trainer loop, checkpoints and metrics, wired together.
// learner_server/main.cc turns flags into LearnerDaemonOptions and owns the
// metrics registry and its endpoint.
//
// Run() blocks on the calling thread, training step after step, until
// Shutdown() (from any thread, e.g. a signal handler thread) or max_steps.
// A step that fails is skipped and counted by reason (SkippedSteps); its
// groups are not trained on, and training goes on. Shutdown stops accepting
// batches, lets the current step finish, writes a checkpoint and logs how
// many queued groups were left untrained.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include <prometheus/registry.h>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "common/batch_validation.h"
#include "common/listener/grpc_listener.h"
#include "common/log_throttle.h"
#include "common/model/policy_model.h"
#include "common/security/authorizer.h"
#include "common/security/tls.h"
#include "learner_server/data_parallel.h"
#include "learner_server/group_queue.h"
#include "learner_server/learner_metrics.h"
#include "learner_server/learner_service.h"
#include "learner_server/skipped_steps.h"
#include "learner_server/snapshot_publisher.h"
#include "learner_server/source_quarantine.h"
#include "learner_server/trainer.h"
#include "weight_broadcaster/broadcast_sender.h"

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
  // received_bytes and quarantine are filled in by the daemon.
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
  CollapseOptions collapse;
  // Weight broadcast (the WeightBroadcast service shares the gRPC port):
  // every `broadcast_every` versions the weights are published to the
  // rollout daemons; the current version is published at start.
  int64_t broadcast_every = 1;
  broadcast::BroadcastSenderOptions broadcast;
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
};

class LearnerDaemon {
 public:
  // Builds everything, restores the newest checkpoint and starts the gRPC
  // server; metrics go to `registry`, which must outlive the daemon. Errors
  // name the bad option or file.
  static absl::StatusOr<std::unique_ptr<LearnerDaemon>> Create(LearnerDaemonOptions options,
                                                               prometheus::Registry& registry);
  ~LearnerDaemon();

  // Trains until Shutdown() or max_steps; then checkpoints. Returns the
  // number of steps this run trained.
  absl::StatusOr<int64_t> Run();
  // Whether this process is a data-parallel rank other than 0.
  bool is_worker() const { return dp_ != nullptr && dp_->rank() != 0; }
  // Any thread; Run returns after the current step.
  void Shutdown();

  int port() const { return port_; }
  // The bytes of every request taken in so far, on every method and
  // whatever became of it (common/daemon/heap_release.h). Any thread.
  int64_t received_bytes() const { return received_bytes_.load(std::memory_order_relaxed); }
  // The policy version (the trainer's). Any thread.
  uint64_t version() const { return trainer_->version(); }
  broadcast::BroadcastSender& broadcaster() { return *sender_; }
  const SkippedSteps& skipped_steps() const { return *skipped_; }

 private:
  explicit LearnerDaemon(LearnerDaemonOptions options);
  // The parts of Create.
  absl::Status SetUpSecurity(prometheus::Registry& registry);
  absl::Status BuildModelAndTrainer(prometheus::Registry& registry);
  absl::Status RestoreCheckpoint();
  absl::Status OpenStepCsv();
  absl::Status StartServer(prometheus::Registry& registry);
  // One step from the queue: false once stopping (its groups counted in
  // `untrained`).
  bool TrainOneStep(int64_t* steps, int64_t* untrained);
  // Rank 0's step across the ranks; a failed collective ends the job.
  absl::StatusOr<StepResult> StepAcrossRanks(const std::vector<QueuedGroup>& groups);
  // A rank other than 0: trains what rank 0 sends until it says stop.
  absl::StatusOr<int64_t> RunWorker();
  // Ends the run after a rank failure (Run returns `status`).
  void Fail(absl::Status status);
  // Counts a skipped step; past max_consecutive_skipped_steps in a row,
  // stops the job (Fail) and returns true.
  bool TooManySkipped(const absl::Status& last);
  // Counts groups dropped from a step as poisoned, one per entry of
  // `sources` (in skipped_groups unless `counted` already), and may
  // quarantine their sources. In data-parallel mode, rank 0's share only.
  void DropPoisoned(const std::vector<std::string>& sources, bool counted = false);
  void LogStep(int64_t steps, const StepResult& step, const GroupQueueStats& queue);
  // Writes a checkpoint (and the export); a failure is counted and logged.
  absl::Status Checkpoint();
  absl::Status WriteCheckpoint();
  void WriteStepCsv(const StepResult& step, const GroupQueueStats& queue);

  // Declared in dependency order: what is used by another member comes
  // first, so that it is destroyed after it.
  LearnerDaemonOptions options_;
  std::atomic<int64_t> received_bytes_{0};            // of every request (CountReceived)
  std::unique_ptr<security::Authorizer> authorizer_;  // rank 0
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<PolicyModel> model_;
  std::unique_ptr<broadcast::BroadcastSender> sender_;
  std::unique_ptr<SnapshotPublisher> publisher_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<LearnerMetrics> metrics_;
  std::unique_ptr<SkippedSteps> skipped_;
  std::unique_ptr<SourceQuarantine> quarantine_;
  LogThrottle poisoned_log_;
  std::unique_ptr<GroupQueue> queue_;
  LearnerCounters counters_;
  std::unique_ptr<LearnerService> service_;
  std::unique_ptr<grpc::Server> server_;
  // Hands its connections to server_; destroyed first (~LearnerDaemon).
  std::unique_ptr<GrpcListener> listener_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  absl::Status failure_;  // a rank failure (trainer thread only)
  std::FILE* step_csv_ = nullptr;
  absl::Time start_time_;
  absl::Time last_step_log_ = absl::InfinitePast();
  absl::Time last_collapse_log_ = absl::InfinitePast();
  bool logged_collapse_ = false;
  int64_t skipped_in_a_row_ = 0;
  // The batch ids of the restored checkpoint, for the queue's window.
  std::vector<std::string> restored_batch_ids_;
};

}  // namespace asympo::learner
