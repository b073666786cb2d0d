// The rollout daemon: samples groups of responses with the newest policy
// snapshot, scores them with a task's verifier and sends them to the
// learner (docs/architecture.md). rollout_server/main.cc turns flags into
// RolloutDaemonOptions and owns the metrics registry and endpoint.
//
// Threads:
//  - the generation thread (Run). With continuous batching (the default) it
//    keeps a ContinuousEngine full: it adds a prompt's G requests whenever
//    slots are about to free and the submit buffer has room, steps the
//    engine, and scores and hands over each group as its last response
//    finishes. A new verified snapshot is adopted between two decode steps
//    (in-flight updates) or, with between-batches updates, once the running
//    sequences have drained. With static batching it flips to the newest
//    snapshot between generations, samples prompts_per_generation prompts'
//    groups at once (GenerationEngine), scores them and hands them over,
//    waiting while the buffer is full. Each response carries the versions
//    that sampled its first and last token;
//  - the submit thread (SubmitClient): sends buffered groups to the
//    learner, with reconnection, backoff and the learner's retry hint;
//    nothing is lost to backpressure, and drops are counted by reason;
//  - the weight receiver's thread (weight_broadcaster/broadcast_receiver.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/policy_model.h"
#include "rollout_server/engine/continuous_engine.h"
#include "rollout_server/engine/double_buffered_policy.h"
#include "rollout_server/engine/generation.h"
#include "rollout_server/episodes/environment.h"
#include "rollout_server/episodes/episode_metrics.h"
#include "rollout_server/rollout_metrics.h"
#include "rollout_server/submit_client.h"
#include "rollout_server/tasks/tasks.h"
#include "weight_broadcaster/broadcast_receiver.h"

namespace asympo::rollout {

struct RolloutDaemonOptions {
  // The learner's gRPC address (Learner and WeightBroadcast services).
  std::string learner_address = "127.0.0.1:50051";
  // TLS, a client certificate and a bearer token for the learner
  // (docs/security.md).
  security::ClientTlsOptions tls;
  // Name used as RolloutBatch.source and as the weight receiver's id.
  std::string rollout_id = "rollout-0";
  // "tiny" or a Hugging Face model directory: the same model as the
  // learner's (the weights are replaced by the learner's snapshots).
  std::string model = "tiny";
  int64_t tiny_vocab_size = 64;
  ModelOptions model_options;  // dtype and device of the sampling weights
  GenerationOptions generation;
  TaskOptions task;
  // Responses per prompt (G) and, with static batching, prompts sampled
  // together.
  int32_t group_size = 8;
  int32_t prompts_per_generation = 8;
  // Continuous batching (ContinuousEngine, with `continuous`'s slots), or
  // static batches of prompts_per_generation prompts (GenerationEngine,
  // with `generation`), kept for comparison.
  bool continuous_batching = true;
  ContinuousOptions continuous;
  // Continuous batching: adopt a new snapshot between two decode steps
  // (true), or only once no sequence is running (new groups wait meanwhile).
  bool inflight_weight_updates = true;
  // Sampling; max_new_tokens 0 uses the task's.
  SamplingParams sampling;
  uint64_t seed = 0;
  // Most groups held (generated, not yet accepted by the learner).
  int64_t max_buffered_groups = 64;
  // Most groups per submitted batch.
  int32_t max_groups_per_batch = 16;
  // Reconnection backoff: starts at min, doubles up to max.
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Deadline of one Submit call (a full learner queue holds a submission up
  // to its own --full_queue_timeout).
  absl::Duration submit_timeout = absl::Seconds(60);
  // On shutdown, how long buffered groups may still be sent.
  absl::Duration drain_timeout = absl::Seconds(2);
  // Largest weight chunk asked for (0: the learner's default).
  uint32_t weight_chunk_bytes = 0;
  // Ask the learner for the NCCL weight transport (on CUDA device
  // cuda_device) before gRPC; see WeightReceiverOptions::prefer_nccl.
  bool weight_transport_nccl = false;
  bool weight_deltas = true;  // WeightReceiverOptions::deltas
  int cuda_device = 0;
  // Stop after generating this many groups (0: until Shutdown).
  int64_t max_groups = 0;
  // Multi-turn episodes (rollout_server/episodes/): against the
  // asympo.v1.Environment service at `environment` (host:port), or, when
  // empty, the task's built-in environment if it has one. The response
  // budget is sampling.max_new_tokens (turns and inserted tokens
  // together); a turn has at most max_turn_tokens (0: the budget).
  // Continuous batching only.
  std::string environment;
  security::ClientTlsOptions environment_tls;
  absl::Duration environment_timeout = absl::Seconds(30);
  int32_t max_turns = 8;
  int32_t max_turn_tokens = 0;
  // Ids that also end a turn, beside the task's stop ids (each in the
  // vocabulary).
  std::vector<int32_t> turn_stop_token_ids;
};

// What the options can tell before anything binds, loads or connects: the
// learner's address (host:port), the id, the task's name and the relations
// between settings. INVALID_ARGUMENT "--FLAG=VALUE: what is wrong" (the
// options mirror asympo-rollout's flags). Create checks it too.
absl::Status ValidateRolloutDaemonOptions(const RolloutDaemonOptions& o);

class RolloutDaemon {
 public:
  // Loads the model and the task, starts the weight receiver and the submit
  // thread; metrics go to `registry`, which must outlive the daemon. Errors
  // name the bad option or file.
  static absl::StatusOr<std::unique_ptr<RolloutDaemon>> Create(RolloutDaemonOptions options,
                                                               prometheus::Registry& registry);
  ~RolloutDaemon();

  // Generates until Shutdown() or max_groups, then drains the buffer for up
  // to drain_timeout. Returns the number of groups the learner accepted.
  absl::StatusOr<int64_t> Run();
  // Any thread; Run returns soon after.
  void Shutdown();

  // The snapshot version generation samples with (0 before the first).
  uint64_t weight_version() const { return policy_ ? policy_->version() : 0; }

 private:
  explicit RolloutDaemon(RolloutDaemonOptions options);
  // Static batching: Run's loop, and the groups of one generation:
  // prompts_per_generation prompts, G responses each, scored (behavior
  // log-probs when the learner wants them).
  absl::Status RunStatic(int64_t* generated);
  absl::StatusOr<std::vector<v1::PromptGroup>> GenerateGroups(bool with_logprobs);
  // Continuous batching: Run's loop.
  absl::Status RunContinuous(int64_t* generated);
  // Multi-turn episodes on continuous batching: Run's loop
  // (rollout_episodes.cc).
  absl::Status RunEpisodes(int64_t* generated);
  // The engine's options for the continuous loops.
  ContinuousOptions EngineOptions() const;
  // The environment of the options (remote, or the task's built-in one);
  // null for single-turn sampling.
  absl::Status SetUpEnvironment(prometheus::Registry& registry);
  // Loads a pending snapshot when the update policy allows, and says what
  // the engine must do: nothing, let its sequences drain first (new groups
  // wait; between-batches updates), take the newer weights, or drop what it
  // samples (the version went back).
  enum class WeightUpdate { kNone, kDrain, kNewer, kRewound };
  WeightUpdate UpdateWeights(const ContinuousEngine& engine);
  // A continuous engine on the active model (noting its loads()).
  absl::StatusOr<std::unique_ptr<ContinuousEngine>> NewEngine(const ContinuousOptions& o);
  // The continuous loops' start: waits for the first snapshot; false when
  // the daemon stops first.
  bool WaitForFirstSnapshot();
  // After a kRewound update, once the loop has dropped the `dropped` groups
  // it was sampling: logs and counts them and replaces `engine`.
  absl::Status Rewind(const ContinuousOptions& o, int64_t dropped,
                      std::unique_ptr<ContinuousEngine>* engine);
  // Scores `results` (G of them, for `prompt`) into a group and counts it.
  v1::PromptGroup ScoreGroup(const TaskPrompt& prompt, std::vector<GenerationResult>& results,
                             bool with_logprobs);
  // Builds the task and the sampling parameters (after the models).
  absl::Status SetUpTask(int64_t vocab_size);
  // Waits for room for `groups` more groups in the submit buffer, timing
  // how long generation was held.
  std::optional<v1::LearnerStatus> WaitForRoom(int64_t groups);

  const RolloutDaemonOptions options_;
  std::unique_ptr<RolloutMetrics> metrics_;
  std::unique_ptr<SubmitMetrics> submit_metrics_;
  std::unique_ptr<Task> task_;
  SamplingParams sampling_;
  std::mt19937_64 rng_;
  // DoubleBufferedPolicy::loads() when the continuous engine last took the
  // active model (generation thread only).
  uint64_t engine_loads_ = 0;
  std::unique_ptr<broadcast::WeightReceiver> receiver_;
  std::unique_ptr<DoubleBufferedPolicy> policy_;
  std::unique_ptr<Environment> environment_;  // moved into the episode loop
  std::unique_ptr<EpisodeMetrics> episode_metrics_;
  std::unique_ptr<SubmitClient> submit_;
  std::atomic<bool> stopping_{false};
};

}  // namespace asympo::rollout
