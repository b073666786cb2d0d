// asympo-learner: the learner daemon. Accepts rollout batches over gRPC,
// trains the policy with the chosen objective, checkpoints, and exports
// Prometheus metrics. Every flag is described by --help (the flags both
// daemons share are defined in common/daemon/daemon_main.cc, those of the
// model, trainer and weights in training_flags.cc and weight_flags.cc);
// --flagfile=FILE reads flags from a file.

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
#include "learner_server/learner_flags.h"
#include "learner_server/memory_plan_check.h"
#include "learner_server/start_checks.h"

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
ABSL_FLAG(absl::Duration, partial_step_after, absl::Seconds(30),
          "Train the groups queued as a short step (each weighted as in a full step) when fewer "
          "than --prompts_per_step have waited this long; 0: steps are always whole.");
ABSL_FLAG(double, device_memory_gib, 0,
          "Memory of the device in GiB for the start-up memory plan, logged at start: the learner "
          "refuses to start when the plan's peak per rank exceeds it, naming the flags to change "
          "(docs/operations.md, \"Memory plan\"). 0: detect it (the GPU's total memory, or "
          "MemTotal on the CPU); negative: skip the check.");
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
          "Also write the policy here as a Hugging Face directory at each checkpoint and at exit "
          "(with --lora_rank: the merged model, and the adapters alone as a PEFT directory in "
          "adapter/).");
// Collapse alert.
ABSL_FLAG(double, collapse_ema_alpha, 0.1,
          "Weight of the newest step in the reward EMA (each source's; the fleet's is their "
          "median). At most 0.1: the alert rules (deploy/prometheus/alerts.yml) judge the EMA as "
          "exported and take a larger weight's step-to-step noise for a collapse.");
ABSL_FLAG(int64_t, collapse_warmup_steps, 20, "Steps before collapse detection starts.");
ABSL_FLAG(double, collapse_drop_fraction, 0.3,
          "Collapse is suspected when the reward EMA is this fraction below its peak ...");
ABSL_FLAG(double, collapse_min_drop, 0.05, "... and at least this far below it (reward units) ...");
ABSL_FLAG(int64_t, collapse_confirm_steps, 5, "... for this many steps in a row.");
ABSL_FLAG(double, collapse_recover_fraction, 0.15,
          "A suspected collapse holds until the reward EMA is back within this fraction of its "
          "peak.");
ABSL_FLAG(int32_t, collapse_max_sources, 16,
          "Sources (principals) with a reward EMA, a detector and a metric label of their own; "
          "later ones share the label \"(other)\".");
ABSL_FLAG(int64_t, collapse_source_idle_steps, 200,
          "A source that sent nothing for this many steps leaves the fleet's median reward EMA.");
ABSL_FLAG(std::string, step_csv, "", "Append one CSV row per training step to this file.");
ABSL_FLAG(std::string, heartbeat_file, "",
          "Every rank: rewrite this file (\"<unix seconds> <beats>\") at most once a second while "
          "the training loop makes progress (after each step, and while it waits idle for data), "
          "for a liveness probe (deploy/kubernetes/base/learner-probe.sh). Removed at start; "
          "empty: none.");
ABSL_FLAG(absl::Duration, ready_stall_timeout, absl::Minutes(5),
          "Readiness: GET /ready on --metrics_address answers 503 once the training loop has not "
          "come round (after a step, or an idle wait for data) for this long, or work waits (a "
          "step's groups queued, or submissions held for room) while the queue has not moved "
          "for this long; an idle learner is ready (docs/operations.md, \"Readiness\"). 0: "
          "always ready once started.");
ABSL_FLAG(absl::Duration, fault_step_delay, absl::ZeroDuration(),
          "Testing only: each training step sleeps this long before it trains (a stuck step).");
ABSL_FLAG(absl::Duration, fault_submit_reply_delay, absl::ZeroDuration(),
          "Testing only: hold Submit's reply this long after the batch was queued, so that the "
          "client's deadline passes after the learner accepted (a retry must not train twice).");

// The documented ranges (--help shows them; a value outside is refused at
// start, before the options below are read: they need no check of their own).
ASYMPO_FLAG_RANGE(source_queue_share, 1e-6, 1);
ASYMPO_FLAG_RANGE(source_groups_per_second, 0, 1e6);
ASYMPO_FLAG_RANGE(min_group_size, 2, 4096);
ASYMPO_FLAG_RANGE(max_group_size, 2, 4096);
ASYMPO_FLAG_RANGE(max_prompt_tokens, 1, 1 << 20);
ASYMPO_FLAG_RANGE(max_response_tokens, 1, 1 << 20);
ASYMPO_FLAG_RANGE(max_groups_per_batch, 1, 65536);
ASYMPO_FLAG_RANGE(max_abs_reward, 1e-6, asympo::kMaxAbsRewardBound);
ASYMPO_FLAG_RANGE(prompts_per_step, 1, 65536);
ASYMPO_FLAG_RANGE(device_memory_gib, -1, 1 << 20);
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
ASYMPO_FLAG_RANGE(free_heap_limit_mib, 0, 1 << 20);
ASYMPO_FLAG_RANGE(batch_id_window, 1, 1 << 26);
ASYMPO_FLAG_RANGE(checkpoint_every, 0, 1e12);
ASYMPO_FLAG_RANGE(keep_checkpoints, 0, 100000);
ASYMPO_FLAG_RANGE(collapse_ema_alpha, 1e-6, 0.1);
ASYMPO_FLAG_RANGE(collapse_warmup_steps, 0, 1e9);
ASYMPO_FLAG_RANGE(collapse_drop_fraction, 0, 1);
ASYMPO_FLAG_RANGE(collapse_min_drop, 0, 1e6);
ASYMPO_FLAG_RANGE(collapse_confirm_steps, 1, 1e9);
ASYMPO_FLAG_RANGE(collapse_recover_fraction, 0, 1);
ASYMPO_FLAG_RANGE(collapse_max_sources, 1, 1024);
ASYMPO_FLAG_RANGE(collapse_source_idle_steps, 1, 1e9);
ASYMPO_DURATION_FLAG_RANGE(full_queue_timeout, absl::ZeroDuration(), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(partial_step_after, absl::ZeroDuration(), absl::Hours(24));
ASYMPO_DURATION_FLAG_RANGE(retry_after, absl::ZeroDuration(), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(submit_stream_idle_timeout, absl::Milliseconds(1), absl::Hours(24));
ASYMPO_DURATION_FLAG_RANGE(fault_submit_reply_delay, absl::ZeroDuration(), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(ready_stall_timeout, absl::ZeroDuration(), absl::Hours(24));
ASYMPO_DURATION_FLAG_RANGE(fault_step_delay, absl::ZeroDuration(), absl::Hours(1));

namespace {

using asympo::learner::LearnerDaemonOptions;

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
  o->partial_step_after = absl::GetFlag(FLAGS_partial_step_after);
  o->max_steps = absl::GetFlag(FLAGS_max_steps);
  o->max_consecutive_skipped_steps = absl::GetFlag(FLAGS_max_consecutive_skipped_steps);
  o->max_policy_lag = absl::GetFlag(FLAGS_max_policy_lag);
  o->quarantine.max_poisoned_groups = absl::GetFlag(FLAGS_quarantine_after_groups);
  o->quarantine.window = absl::GetFlag(FLAGS_quarantine_window);
  o->quarantine.duration = absl::GetFlag(FLAGS_quarantine_duration);
  o->log_every = absl::GetFlag(FLAGS_log_every);
  o->ready_stall_timeout = absl::GetFlag(FLAGS_ready_stall_timeout);
  o->fault_step_delay = absl::GetFlag(FLAGS_fault_step_delay);
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
  o->collapse_max_sources = absl::GetFlag(FLAGS_collapse_max_sources);
  o->collapse_source_idle_steps = absl::GetFlag(FLAGS_collapse_source_idle_steps);
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
  ASYMPO_RETURN_IF_ERROR(asympo::learner::ModelFlags(&o));
  ASYMPO_RETURN_IF_ERROR(asympo::learner::DataParallelFlags(&o));
  ASYMPO_RETURN_IF_ERROR(asympo::learner::TrainerFlags(&o.trainer));
  ServiceFlags(&o.service);
  ListenerFlags(&o);
  RunFlags(&o);
  ASYMPO_RETURN_IF_ERROR(asympo::learner::BroadcastFlags(&o));
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
  m.AddFlagFile(asympo::learner::kTrainingFlagsFile);
  m.AddFlagFile(asympo::learner::kWeightFlagsFile);
  if (absl::Status s = m.Start(argc, argv); !s.ok()) return m.Fail(s);
  asympo::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  at::manual_seed(absl::GetFlag(FLAGS_seed));
  absl::StatusOr<LearnerDaemonOptions> options = OptionsFromFlags();
  if (!options.ok()) return m.Fail(options.status());
  for (int i = 1; i < argc; ++i) absl::StrAppend(&options->config_text, argv[i], "\n");
  // Every flag is checked before anything binds or starts.
  if (absl::Status s = asympo::learner::CheckBeforeStart(*options); !s.ok()) return m.Fail(s);
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
  m.SetReadiness([&daemon] { return (*daemon)->Readiness(); });
  // Gives back what requests leave on the heap, not what steps keep for
  // reuse (common/daemon/heap_release.h).
  asympo::daemon::HeapReleaseOptions heap;
  heap.keep_bytes = absl::GetFlag(FLAGS_free_heap_limit_mib) << 20;
  heap.received_bytes = [&daemon] { return (*daemon)->received_bytes(); };
  const asympo::daemon::HeapReleaser heap_releaser(heap, m.registry(), "asympo_learner");
  return m.Run(**daemon);
}
