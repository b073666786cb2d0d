#include "learner_server/plan/memory_plan_report.h"

#include <sys/stat.h>

#include <functional>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/policy_model.h"

namespace asympo::learner {
namespace {

// The keys of each model's published config.json (Hugging Face: Qwen/Qwen3-*
// as released with transformers 4.51, meta-llama/Llama-3.2-3B), parsed as
// the learner parses a model directory's.
constexpr std::pair<std::string_view, std::string_view> kShapes[] = {
    {"qwen3-0.6b",
     R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
         "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
         "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
         "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
         "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
         "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
         "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})"},
    {"qwen3-1.7b",
     R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
         "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
         "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 28,
         "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
         "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
         "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
         "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})"},
    {"qwen3-4b",
     R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
         "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
         "intermediate_size": 9728, "max_position_embeddings": 40960, "max_window_layers": 36,
         "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
         "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
         "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
         "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})"},
    {"qwen3-8b",
     R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
         "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
         "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
         "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
         "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
         "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
         "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})"},
    {"llama3.2-3b",
     R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
         "eos_token_id": 128001, "head_dim": 128, "hidden_act": "silu", "hidden_size": 3072,
         "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
         "model_type": "llama", "num_attention_heads": 24, "num_hidden_layers": 28,
         "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
         "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
         "vocab_size": 128256})"},
};

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// "forward, log-probs" or "every phase"; the host buffers on a GPU are
// not device memory.
std::string AliveText(PlanPart part, PlanDevice device) {
  if (part == PlanPart::kSnapshotHost && device == PlanDevice::kCuda) {
    return "pinned host memory, not device memory: not in the totals";
  }
  if (part == PlanPart::kSnapshotDelta && device == PlanDevice::kCuda) {
    return "host memory (at most half a snapshot), not device memory: not in the totals";
  }
  if (part == PlanPart::kCheckpointHost) {
    return "host memory during a save or a resume (one piece at a time), not in the totals";
  }
  std::vector<std::string> phases;
  for (int ph = 0; ph < kPlanPhases; ++ph) {
    if (MemoryPlan::AliveIn(part, static_cast<PlanPhase>(ph), device)) {
      phases.emplace_back(PlanPhaseName(static_cast<PlanPhase>(ph)));
    }
  }
  if (static_cast<int>(phases.size()) == kPlanPhases) return "every phase";
  return absl::StrJoin(phases, ", ");
}

// The part's name with what it depends on: its dtype, its share.
std::string PartLabel(PlanPart part, const PlanOptions& o) {
  std::string label(PlanPartName(part));
  const bool shared = o.shard != DistShard::kNone;
  const std::string share = absl::StrCat(", 1/", o.world_size);
  switch (part) {
    case PlanPart::kMasterWeights:
      if (o.lora_rank > 0) {  // the frozen base beside the float32 adapters (sharded: 1/N)
        label = absl::StrCat("frozen base (", PlanDTypeName(o.compute_dtype), ") + adapters",
                             o.shard == DistShard::kFull ? share : std::string(" (float32)"));
      } else if (o.shard == DistShard::kFull) {
        absl::StrAppend(&label, share);
      }
      break;
    case PlanPart::kGradients:
      if (o.shard == DistShard::kFull) absl::StrAppend(&label, share, " + the root unit");
      break;
    case PlanPart::kMoments:
      if (shared) absl::StrAppend(&label, share);
      break;
    case PlanPart::kComputeCopy:
      absl::StrAppend(&label, " (", PlanDTypeName(o.compute_dtype), ")");
      break;
    case PlanPart::kSnapshotDevice:
    case PlanPart::kSnapshotHost:
      absl::StrAppend(&label, " (", PlanDTypeName(o.snapshot_dtype), ")");
      break;
    default:
      break;
  }
  return label;
}

std::string Heading(const MemoryPlan& p, const PlanOptions& o, absl::string_view model) {
  const int64_t longest = o.max_sequence_tokens > 0 ? o.max_sequence_tokens : o.micro_batch_tokens;
  return absl::StrFormat(
      "memory plan per rank: %s (%s parameters), %d rank(s), --dist_shard=%s, --device=%s, "
      "--compute_dtype=%s, --activation_checkpointing=%s\n"
      "micro-batch: --micro_batch_tokens=%d %s in %d row(s) of %d positions (longest sequence "
      "%d), --logprob_chunk_rows=%d, snapshots in --dtype=%s%s\n%s",
      model,
      p.parameters >= 1000000000
          ? absl::StrFormat("%.2fB", static_cast<double>(p.parameters) / 1e9)
          : absl::StrFormat("%.1fM", static_cast<double>(p.parameters) / 1e6),
      o.world_size, DistShardName(o.shard), PlanDeviceName(o.device),
      PlanDTypeName(o.compute_dtype),
      o.shard == DistShard::kFull ? std::string("layers (full sharding recomputes every layer)")
                                  : ActivationCheckpointingName(o.checkpoint_every),
      o.micro_batch_tokens, o.pack_sequences ? "packed" : "padded", p.rows, p.row_length, longest,
      o.logprob_chunk_rows, PlanDTypeName(o.snapshot_dtype),
      o.rank0 ? " (rank 0 publishes them)" : "",
      o.lora_rank > 0
          ? absl::StrFormat("adapters: --lora_rank=%d on %d projection(s) a layer, %.1fM "
                            "parameters trained in float32; the base frozen in %s\n",
                            o.lora_rank, __builtin_popcount(o.lora_targets),
                            static_cast<double>(p.adapter_parameters) / 1e6,
                            PlanDTypeName(o.compute_dtype))
          : std::string());
}

// The plan with the changes `change` makes, when it fits.
template <typename Change>
bool FitsWith(const PlanOptions& options, int64_t budget, Change change) {
  PlanOptions o = options;
  change(o);
  absl::StatusOr<MemoryPlan> p = PlanMemory(o);
  return p.ok() && p->peak_bytes <= budget;
}

// One change of the flags that may make a plan fit: the flag as written
// and what it changes.
struct Change {
  std::string flag;
  std::function<void(PlanOptions&)> apply;
};

// The changes that apply to `o` (those that would change something).
std::vector<Change> ChangesFor(const PlanOptions& o) {
  std::vector<Change> changes;
  const bool full = o.shard == DistShard::kFull;
  if (!full && o.checkpoint_every != 1) {
    changes.push_back(
        {"--activation_checkpointing=layers", [](PlanOptions& p) { p.checkpoint_every = 1; }});
  }
  if (!full && o.world_size > 1) {
    changes.push_back({"--dist_shard=full", [](PlanOptions& p) { p.shard = DistShard::kFull; }});
  }
  if (o.rank0 && o.snapshot_dtype == PlanDType::kFloat32) {
    changes.push_back(
        {"--dtype=bfloat16", [](PlanOptions& p) { p.snapshot_dtype = PlanDType::kBFloat16; }});
  }
  // Rank 0 stages each snapshot in host memory only, without a device copy.
  if (o.rank0 && o.snapshot_device && o.device == PlanDevice::kCuda) {
    changes.push_back(
        {"--snapshot_staging=host", [](PlanOptions& p) { p.snapshot_device = false; }});
  }
  return changes;
}

}  // namespace

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.2f",
                         static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30));
}

absl::StatusOr<ModelConfig> NamedModelShape(absl::string_view name) {
  for (const auto& [shape, json] : kShapes) {
    if (shape == std::string_view(name.data(), name.size())) return ModelConfig::FromJson(json);
  }
  return absl::NotFoundError(absl::StrCat("no model shape is named \"", name, "\""));
}

std::vector<std::string> NamedModelShapeNames() {
  std::vector<std::string> names;
  for (const auto& [shape, json] : kShapes) names.emplace_back(shape);
  return names;
}

absl::StatusOr<ModelConfig> ResolvePlanModel(const std::string& model) {
  if (model.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model is required: one of ", absl::StrJoin(NamedModelShapeNames(), ", "),
                     ", a Hugging Face model directory or its config.json"));
  }
  if (absl::StatusOr<ModelConfig> named = NamedModelShape(model); named.ok()) return named;
  const std::string path = IsDirectory(model) ? model + "/config.json" : model;
  absl::StatusOr<ModelConfig> config = ModelConfig::FromFile(path);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model=", model, ": not one of ", absl::StrJoin(NamedModelShapeNames(), ", "),
        ", and not a readable config.json (", config.status().message(), ")"));
  }
  return config;
}

std::string FormatMemoryPlan(const MemoryPlan& p, const PlanOptions& o, absl::string_view model,
                             int64_t budget_bytes) {
  std::string out = Heading(p, o, model);
  absl::StrAppendFormat(&out, "%-52s %9s  %s\n", "part", "GiB", "alive in");
  for (int i = 0; i < kPlanParts; ++i) {
    const PlanPart part = static_cast<PlanPart>(i);
    if (p.of(part) == 0) continue;
    absl::StrAppendFormat(&out, "%-52s %9s  %s\n", PartLabel(part, o), Gib(p.of(part)),
                          AliveText(part, o.device));
  }
  std::vector<std::string> phases;
  for (int ph = 0; ph < kPlanPhases; ++ph) {
    phases.push_back(absl::StrCat(PlanPhaseName(static_cast<PlanPhase>(ph)), " ",
                                  Gib(p.phase_bytes[static_cast<size_t>(ph)])));
  }
  absl::StrAppend(&out, "phase totals (GiB): ", absl::StrJoin(phases, ", "), "\n");
  const bool fits = p.peak_bytes <= budget_bytes;
  absl::StrAppendFormat(
      &out, "peak per rank: %s GiB (%s phase) of %s GiB: %s\n", Gib(p.peak_bytes),
      PlanPhaseName(p.peak_phase), Gib(budget_bytes),
      fits ? absl::StrCat("fits, ", Gib(budget_bytes - p.peak_bytes), " GiB spare")
           : absl::StrCat("does not fit, ", Gib(p.peak_bytes - budget_bytes), " GiB over"));
  return out;
}

std::string FitAdvice(const PlanOptions& options, int64_t budget) {
  if (FitsWith(options, budget, [](PlanOptions&) {})) return "";
  std::vector<Change> changes = ChangesFor(options);
  std::vector<std::string> sets;  // the flags that make it fit alone
  for (const Change& c : changes) {
    if (FitsWith(options, budget, c.apply)) sets.push_back(c.flag);
  }
  std::vector<std::string> alternatives;
  if (const absl::StatusOr<int64_t> tokens = LargestMicroBatch(options, budget);
      tokens.ok() && *tokens > 0) {
    alternatives.push_back(absl::StrCat("lower --micro_batch_tokens to ", *tokens));
  }
  if (!sets.empty()) alternatives.push_back(absl::StrCat("set ", absl::StrJoin(sets, " or ")));
  if (!alternatives.empty()) return absl::StrJoin(alternatives, " or ");
  // Nothing fits alone: every change together, with the micro-batch that
  // then fits.
  PlanOptions all = options;
  std::vector<std::string> together;
  for (const Change& c : changes) {
    c.apply(all);
    together.push_back("set " + c.flag);
  }
  const absl::StatusOr<int64_t> tokens = LargestMicroBatch(all, budget);
  if (!changes.empty() && tokens.ok() && *tokens > 0) {
    return absl::StrCat(absl::StrJoin(together, ", "), " and lower --micro_batch_tokens to ",
                        *tokens);
  }
  return "no setting of --micro_batch_tokens, --activation_checkpointing, --dist_shard, --dtype "
         "or --snapshot_staging fits this device: use more ranks or a device with more memory";
}

}  // namespace asympo::learner
