// asympo-rollout: the rollout daemon. Samples groups of responses with the
// newest policy snapshot from the learner, scores them with a task's
// verifier and submits them to the learner over gRPC. Every flag is
// described by --help (the flags both daemons share are defined in
// common/daemon/daemon_main.cc); --flagfile=FILE reads flags from a file.
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/daemon/daemon_main.h"
#include "common/flag_ranges.h"
#include "common/model/device.h"
#include "common/model/lora_flags.h"
#include "common/model/model_io.h"
#include "common/status_macros.h"
#include "rollout_server/rollout_daemon.h"

// Learner and identity.
ABSL_FLAG(std::string, learner, "127.0.0.1:50051",
          "The learner's gRPC address, host:port (Learner and WeightBroadcast services).");
ABSL_FLAG(std::string, id, "rollout-0", "This daemon's name (batch source, receiver id).");
// Security (docs/security.md).
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle the learner's certificate must chain to; enables TLS to the learner.");
ABSL_FLAG(std::string, tls_cert, "", "This daemon's PEM certificate, for mTLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "The name the learner's certificate must carry, when it is not --learner's host.");
ABSL_FLAG(std::string, tls_token_file, "",
          "File whose first line is the bearer token sent to the learner (never logged).");
ABSL_FLAG(bool, insecure, false,
          "Allow the bearer token to travel in plaintext beyond loopback (no --tls_ca).");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9465",
          "Address of the Prometheus /metrics endpoint; empty disables it.");
// Model.
ABSL_FLAG(std::string, model, "tiny",
          "\"tiny\" for the built-in test model, or a Hugging Face model directory; must be the "
          "learner's model (its weights are replaced by the learner's snapshots).");
ABSL_FLAG(std::string, device, "cpu",
          "Where the model, its KV cache and sampling live: cpu, cuda (the first GPU) or cuda:N.");
ABSL_FLAG(std::string, dtype, "float32",
          "Dtype of the weights sampled with (float32 or bfloat16); must match the learner's "
          "--dtype.");
ABSL_FLAG(bool, cuda_graphs, true,
          "On a GPU, replay each decode step as a CUDA graph (where the build has CUDA).");
ABSL_FLAG(int64_t, lora_rank, 0,
          "The learner's --lora_rank: the model samples with its low-rank adapters beside the "
          "frozen base, and the learner's versions carry the adapters alone (0: whole weights).");
ABSL_FLAG(double, lora_alpha, 0, "The learner's --lora_alpha (0: twice the rank).");
ABSL_FLAG(std::string, lora_targets, "all", "The learner's --lora_targets.");
ABSL_FLAG(uint64_t, seed, 0, "Seed of prompt order and sampling.");
// Task.
ABSL_FLAG(std::string, task, "copy", "Task to sample prompts from; --list_tasks lists them.");
ABSL_FLAG(bool, list_tasks, false, "Print the built-in tasks and exit.");
ABSL_FLAG(std::string, task_data, "", "math: JSONL file of {\"prompt\", \"answer\"} rows.");
ABSL_FLAG(int32_t, task_min_length, 0,
          "Synthetic tasks: the shortest prompt, in symbols (add, add_tool: operands; 0: the "
          "task's default).");
ABSL_FLAG(int32_t, task_max_length, 0,
          "Synthetic tasks: the longest prompt, in symbols (add, add_tool: operands; 0: the "
          "task's default).");
ABSL_FLAG(std::string, tokenizer, "", "math: the model's tokenizer.json.");
ABSL_FLAG(std::string, prompt_template, "",
          "math: template with {prompt} where the question goes (empty: the default chat "
          "template, docs/tasks.md).");
ABSL_FLAG(std::string, stop_token, "", "math: token that ends a response (empty: the EOS).");
// Sampling.
ABSL_FLAG(int32_t, group_size, 8, "Responses sampled per prompt (G).");
ABSL_FLAG(std::string, batching, "continuous",
          "continuous: up to --max_running_sequences sequences decode at once, a finished one's "
          "slot refilled at the next step, one prefill per group; static: batches of "
          "--prompts_per_generation prompts, each decoded until its longest response ends.");
ABSL_FLAG(int32_t, max_running_sequences, 64, "Continuous batching: sequences decoding at once.");
ABSL_FLAG(int32_t, max_prompt_rows, 0,
          "Continuous batching: prompts whose keys and values are held at once (0: "
          "--max_running_sequences, the most that can be running).");
ABSL_FLAG(std::string, weight_update, "inflight",
          "Continuous batching: adopt a new snapshot between two decode steps (inflight: running "
          "sequences go on with the new weights) or once no sequence runs (between_batches: new "
          "groups wait while the running ones drain).");
ABSL_FLAG(int32_t, prompts_per_generation, 8,
          "Static batching: prompts sampled together in one batch.");
ABSL_FLAG(double, temperature, 1.0, "Sampling temperature (0: greedy).");
ABSL_FLAG(int32_t, top_k, 0, "Keep the k most likely tokens (0: all).");
ABSL_FLAG(double, top_p, 1.0, "Nucleus sampling mass (1: all).");
ABSL_FLAG(int32_t, max_new_tokens, 0, "Most tokens per response (0: the task's default).");
// Submission.
ABSL_FLAG(int64_t, max_buffered_groups, 64,
          "Most groups held before the learner accepts them; generation pauses when full.");
ABSL_FLAG(int32_t, max_groups_per_batch, 16, "Most groups per submitted batch.");
ABSL_FLAG(absl::Duration, min_backoff, absl::Milliseconds(100), "First reconnection delay.");
ABSL_FLAG(absl::Duration, max_backoff, absl::Seconds(5), "Longest reconnection delay.");
ABSL_FLAG(absl::Duration, submit_timeout, absl::Seconds(60), "Deadline of one Submit call.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(2),
          "At shutdown, how long buffered groups may still be sent.");
ABSL_FLAG(int64_t, weight_chunk_kb, 0, "Weight transfer chunk size (0: the learner's default).");
ABSL_FLAG(std::string, weight_transport, "grpc",
          "How weights arrive: grpc, or nccl (ask the learner for a rank of its NCCL "
          "communicator, --broadcast_nccl_world_size; gRPC when none is free or NCCL fails).");
ABSL_FLAG(bool, weight_deltas, true,
          "Keep the weights in use as the base of delta versions: a new version then arrives as "
          "what changed when the learner has it so (--weight_deltas there), at the cost of one "
          "more copy of the weights in host memory.");
ABSL_FLAG(int32_t, cuda_device, -1,
          "CUDA device of the NCCL weight transport (-1: the --device GPU, or 0 on the CPU).");
ABSL_FLAG(int64_t, max_groups, 0, "Stop after generating this many groups (0: until a signal).");
// Multi-turn episodes (docs/protocol.md, "Environments").
ABSL_FLAG(std::string, environment, "",
          "Run multi-turn episodes against the asympo.v1.Environment service at host:port (empty: "
          "the task's built-in environment, if it has one).");
ABSL_FLAG(std::string, environment_tls_ca, "",
          "PEM CA bundle the environment's certificate must chain to; enables TLS to it.");
ABSL_FLAG(std::string, environment_tls_cert, "",
          "This daemon's PEM certificate for the environment, for mTLS.");
ABSL_FLAG(std::string, environment_tls_key, "", "PEM private key of --environment_tls_cert.");
ABSL_FLAG(std::string, environment_tls_server_name, "",
          "The name the environment's certificate must carry, when not --environment's host.");
ABSL_FLAG(std::string, environment_token_file, "",
          "File whose first line is the bearer token sent to the environment (never logged).");
ABSL_FLAG(absl::Duration, environment_timeout, absl::Seconds(30),
          "Deadline of each environment call; a late answer fails the episode.");
ABSL_FLAG(int32_t, max_turns, 8, "Multi-turn: most turns of the model in an episode.");
ABSL_FLAG(int32_t, max_turn_tokens, 0,
          "Multi-turn: most tokens of one turn (0: the response budget, --max_new_tokens).");
ABSL_FLAG(std::string, turn_stop_ids, "",
          "Multi-turn: token ids, comma-separated, that also end a turn (a tool call's closing "
          "token, say), beside the task's stop ids (without an environment: a response).");
ABSL_FLAG(bool, reuse_kv, true,
          "Multi-turn: a resumed sequence pre-fills only the environment's tokens (false: its "
          "whole response again, for comparison).");

// The documented ranges (--help shows them; a value outside is refused at
// start, before the options are read: they need no check of their own).
ASYMPO_FLAG_RANGE(seed, 0, 1.8446744073709552e19);
ASYMPO_FLAG_RANGE(lora_rank, 0, 4096);
ASYMPO_FLAG_RANGE(lora_alpha, 0, 1e6);
ASYMPO_FLAG_RANGE(group_size, 2, 4096);
ASYMPO_FLAG_RANGE(prompts_per_generation, 1, 65536);
ASYMPO_FLAG_RANGE(max_running_sequences, 1, 65536);
ASYMPO_FLAG_RANGE(max_prompt_rows, 0, 65536);
ASYMPO_FLAG_RANGE(temperature, 0, 100);
ASYMPO_FLAG_RANGE(top_k, 0, 1 << 24);
ASYMPO_FLAG_RANGE(top_p, 0, 1);
ASYMPO_FLAG_RANGE(task_min_length, 0, 4096);
ASYMPO_FLAG_RANGE(task_max_length, 0, 4096);
ASYMPO_FLAG_RANGE(max_new_tokens, 0, 1 << 20);
ASYMPO_FLAG_RANGE(max_buffered_groups, 1, 1 << 24);
ASYMPO_FLAG_RANGE(max_groups_per_batch, 1, 65536);
ASYMPO_DURATION_FLAG_RANGE(min_backoff, absl::Milliseconds(1), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(max_backoff, absl::Milliseconds(1), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(submit_timeout, absl::Milliseconds(1), absl::Hours(24));
ASYMPO_DURATION_FLAG_RANGE(drain_timeout, absl::ZeroDuration(), absl::Hours(1));
ASYMPO_FLAG_RANGE(weight_chunk_kb, 0, 1 << 20);
ASYMPO_FLAG_RANGE(cuda_device, -1, 1023);
ASYMPO_FLAG_RANGE(max_groups, 0, 1e15);
ASYMPO_DURATION_FLAG_RANGE(environment_timeout, absl::Milliseconds(1), absl::Hours(1));
ASYMPO_FLAG_RANGE(max_turns, 1, 4096);
ASYMPO_FLAG_RANGE(max_turn_tokens, 0, 1 << 20);

namespace {

using asympo::rollout::RolloutDaemonOptions;

asympo::security::ClientTlsOptions TlsFlags() {
  asympo::security::ClientTlsOptions tls;
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  tls.token_file = absl::GetFlag(FLAGS_tls_token_file);
  tls.insecure = absl::GetFlag(FLAGS_insecure);
  return tls;
}

absl::Status EnvironmentFlags(RolloutDaemonOptions* o) {
  for (absl::string_view id :
       absl::StrSplit(absl::GetFlag(FLAGS_turn_stop_ids), ',', absl::SkipWhitespace())) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(id, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--turn_stop_ids=", absl::GetFlag(FLAGS_turn_stop_ids), ": \"", id,
                       "\" is not a token id"));
    }
    o->turn_stop_token_ids.push_back(v);
  }
  o->environment = absl::GetFlag(FLAGS_environment);
  o->environment_tls.ca_file = absl::GetFlag(FLAGS_environment_tls_ca);
  o->environment_tls.cert_file = absl::GetFlag(FLAGS_environment_tls_cert);
  o->environment_tls.key_file = absl::GetFlag(FLAGS_environment_tls_key);
  o->environment_tls.server_name = absl::GetFlag(FLAGS_environment_tls_server_name);
  o->environment_tls.token_file = absl::GetFlag(FLAGS_environment_token_file);
  o->environment_tls.insecure = absl::GetFlag(FLAGS_insecure);
  o->environment_timeout = absl::GetFlag(FLAGS_environment_timeout);
  o->max_turns = absl::GetFlag(FLAGS_max_turns);
  o->max_turn_tokens = absl::GetFlag(FLAGS_max_turn_tokens);
  o->continuous.reuse_kv = absl::GetFlag(FLAGS_reuse_kv);
  return absl::OkStatus();
}

absl::Status ModelFlags(RolloutDaemonOptions* o) {
  o->model = absl::GetFlag(FLAGS_model);
  o->tiny_vocab_size = absl::GetFlag(FLAGS_tiny_vocab_size);
  ASYMPO_ASSIGN_OR_RETURN(o->model_options.dtype,
                          asympo::ParseModelDType(absl::GetFlag(FLAGS_dtype)));
  ASYMPO_ASSIGN_OR_RETURN(o->model_options.device,
                          asympo::ParseDevice(absl::GetFlag(FLAGS_device)));
  o->generation.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o->seed = absl::GetFlag(FLAGS_seed);
  ASYMPO_ASSIGN_OR_RETURN(
      o->model_options.lora,
      asympo::LoraFromFlags(absl::GetFlag(FLAGS_lora_rank), absl::GetFlag(FLAGS_lora_alpha),
                            absl::GetFlag(FLAGS_lora_targets)));
  return absl::OkStatus();
}

absl::Status BatchingFlags(RolloutDaemonOptions* o) {
  const std::string batching = absl::GetFlag(FLAGS_batching);
  if (batching != "continuous" && batching != "static") {
    return absl::InvalidArgumentError(
        absl::StrCat("--batching=", batching, ": expected continuous or static"));
  }
  o->continuous_batching = batching == "continuous";
  o->continuous.max_running_sequences = absl::GetFlag(FLAGS_max_running_sequences);
  o->continuous.max_prompts = absl::GetFlag(FLAGS_max_prompt_rows);
  const std::string update = absl::GetFlag(FLAGS_weight_update);
  if (update != "inflight" && update != "between_batches") {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight_update=", update, ": expected inflight or between_batches"));
  }
  o->inflight_weight_updates = update == "inflight";
  return absl::OkStatus();
}

void TaskAndSamplingFlags(RolloutDaemonOptions* o) {
  o->task.name = absl::GetFlag(FLAGS_task);
  o->task.data_path = absl::GetFlag(FLAGS_task_data);
  o->task.synthetic_min_length = absl::GetFlag(FLAGS_task_min_length);
  o->task.synthetic_max_length = absl::GetFlag(FLAGS_task_max_length);
  o->task.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  o->task.prompt_template = absl::GetFlag(FLAGS_prompt_template);
  o->task.stop_token = absl::GetFlag(FLAGS_stop_token);
  o->group_size = absl::GetFlag(FLAGS_group_size);
  o->prompts_per_generation = absl::GetFlag(FLAGS_prompts_per_generation);
  o->sampling.temperature = absl::GetFlag(FLAGS_temperature);
  o->sampling.top_k = absl::GetFlag(FLAGS_top_k);
  o->sampling.top_p = absl::GetFlag(FLAGS_top_p);
  o->sampling.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  if (o->sampling.max_new_tokens > 0) o->task.math_max_new_tokens = o->sampling.max_new_tokens;
}

void SubmitFlags(RolloutDaemonOptions* o) {
  o->max_buffered_groups = absl::GetFlag(FLAGS_max_buffered_groups);
  o->max_groups_per_batch = absl::GetFlag(FLAGS_max_groups_per_batch);
  o->min_backoff = absl::GetFlag(FLAGS_min_backoff);
  o->max_backoff = absl::GetFlag(FLAGS_max_backoff);
  o->submit_timeout = absl::GetFlag(FLAGS_submit_timeout);
  o->drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
}

absl::Status WeightFlags(RolloutDaemonOptions* o) {
  const int64_t chunk_kb = absl::GetFlag(FLAGS_weight_chunk_kb);
  o->weight_chunk_bytes = static_cast<uint32_t>(chunk_kb << 10);
  const std::string transport = absl::GetFlag(FLAGS_weight_transport);
  if (transport != "grpc" && transport != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight_transport=", transport, ": expected grpc or nccl"));
  }
  o->weight_transport_nccl = transport == "nccl";
  o->weight_deltas = absl::GetFlag(FLAGS_weight_deltas);
  o->cuda_device = absl::GetFlag(FLAGS_cuda_device);
  const c10::Device device = o->model_options.device;
  if (o->cuda_device == -1)
    o->cuda_device = device.is_cuda() ? std::max(0, int{device.index()}) : 0;
  return absl::OkStatus();
}

absl::StatusOr<RolloutDaemonOptions> OptionsFromFlags() {
  RolloutDaemonOptions o;
  o.learner_address = absl::GetFlag(FLAGS_learner);
  o.tls = TlsFlags();
  o.rollout_id = absl::GetFlag(FLAGS_id);
  ASYMPO_RETURN_IF_ERROR(ModelFlags(&o));
  TaskAndSamplingFlags(&o);
  ASYMPO_RETURN_IF_ERROR(BatchingFlags(&o));
  SubmitFlags(&o);
  ASYMPO_RETURN_IF_ERROR(WeightFlags(&o));
  o.max_groups = absl::GetFlag(FLAGS_max_groups);
  ASYMPO_RETURN_IF_ERROR(EnvironmentFlags(&o));
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  asympo::daemon::DaemonMain m("asympo-rollout",
                               "asympo-rollout: the ASymPO-RL rollout daemon.\n"
                               "  asympo-rollout --learner=127.0.0.1:50051 --id=rollout-0 "
                               "--task=copy\n"
                               "Flags can also come from --flagfile=FILE.",
                               "rollout_server/main.cc");
  if (absl::Status s = m.Start(argc, argv); !s.ok()) return m.Fail(s);
  if (absl::GetFlag(FLAGS_list_tasks)) {
    for (const auto& [name, description] : asympo::rollout::TaskNames()) {
      std::cout << name << "\t" << description << "\n";
    }
    return 0;
  }
  asympo::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  absl::StatusOr<RolloutDaemonOptions> options = OptionsFromFlags();
  if (!options.ok()) return m.Fail(options.status());
  // Every flag is checked before anything binds or starts.
  if (absl::Status s = asympo::rollout::ValidateRolloutDaemonOptions(*options); !s.ok()) {
    return m.Fail(s);
  }
  if (absl::Status s = m.ServeMetrics(absl::GetFlag(FLAGS_metrics_address)); !s.ok()) {
    return m.Fail(s);
  }
  absl::StatusOr<std::unique_ptr<asympo::rollout::RolloutDaemon>> daemon =
      asympo::rollout::RolloutDaemon::Create(*std::move(options), m.registry());
  if (!daemon.ok()) return m.Fail(daemon.status());
  return m.Run(**daemon);
}
