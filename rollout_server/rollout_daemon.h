// The rollout daemon: samples groups of responses with the newest policy
// snapshot, scores them with a task's verifier and streams them to the
// learner (DESIGN.md section 2). rollout_server/main.cc turns flags into
// RolloutDaemonOptions.
//
// Threads:
//  - the generation thread (Run): between two generations it takes the
//    newest verified snapshot from the weight receiver, loads it into the
//    spare model and flips (double buffering), so every group is sampled by
//    exactly one version; then it draws prompts, samples G responses per
//    prompt, scores them and puts the groups into a bounded buffer;
//  - the submit thread: sends buffered groups to the learner. When the
//    learner is away it reconnects with exponential backoff; on
//    RESOURCE_EXHAUSTED it waits the suggested time. Groups stay in the
//    buffer until the learner accepted them, and the generation thread waits
//    while the buffer is full, so nothing is lost to backpressure. Groups
//    the learner rejects as invalid, and groups still buffered when the
//    daemon stops, are dropped and counted by reason.
//  - the weight receiver's thread (weight_broadcaster/broadcast_receiver.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics_http_server.h"
#include "common/policy_model.h"
#include "rollout_server/generation.h"
#include "rollout_server/tasks.h"

namespace asympo::rollout {

struct RolloutDaemonOptions {
  // The learner's gRPC address (Learner and WeightBroadcast services).
  std::string learner_address = "127.0.0.1:50051";
  // Name used as RolloutBatch.source and as the weight receiver's id.
  std::string rollout_id = "rollout-0";
  // "tiny" or a Hugging Face model directory: the same model as the
  // learner's (the weights are replaced by the learner's snapshots).
  std::string model = "tiny";
  int64_t tiny_vocab_size = 64;
  ModelOptions model_options;
  TaskOptions task;
  // Responses per prompt (G) and prompts sampled together.
  int32_t group_size = 8;
  int32_t prompts_per_generation = 8;
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
  int cuda_device = 0;
  // Prometheus endpoint ("host:port", port 0 picks one, empty disables).
  std::string metrics_address = "127.0.0.1:9465";
  // Stop after generating this many groups (0: until Shutdown).
  int64_t max_groups = 0;
};

class RolloutDaemon {
 public:
  // Loads the model and the task, starts the weight receiver, the submit
  // thread and the metrics endpoint. Errors name the bad option or file.
  static absl::StatusOr<std::unique_ptr<RolloutDaemon>> Create(RolloutDaemonOptions options);
  ~RolloutDaemon();

  // Generates until Shutdown() or max_groups, then drains the buffer for up
  // to drain_timeout. Returns the number of groups the learner accepted.
  absl::StatusOr<int64_t> Run();
  void Shutdown();

  int metrics_port() const;
  uint64_t weight_version() const { return weight_version_.load(); }
  prometheus::Registry& registry() { return *registry_; }

  struct Impl;

 private:
  explicit RolloutDaemon(RolloutDaemonOptions options);

  RolloutDaemonOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsHttpServer> metrics_server_;
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> weight_version_{0};
};

}  // namespace asympo::rollout
