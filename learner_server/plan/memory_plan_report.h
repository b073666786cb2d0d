// The memory plan (memory_plan.h) as people read it: the model shapes
// asympo-plan knows by name, the table it prints (and the learner logs),
// and the advice when a plan does not fit. No LibTorch; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/model_config.h"
#include "learner_server/plan/memory_plan.h"

namespace asympo::learner {

// The published configurations (config.json) of qwen3-0.6b, qwen3-1.7b,
// qwen3-4b, qwen3-8b and llama3.2-3b; NOT_FOUND for another name.
absl::StatusOr<ModelConfig> NamedModelShape(absl::string_view name);
std::vector<std::string> NamedModelShapeNames();

// --model: a named shape, a Hugging Face model directory (its config.json)
// or a config.json file. INVALID_ARGUMENT naming --model otherwise.
absl::StatusOr<ModelConfig> ResolvePlanModel(const std::string& model);

// The table: one row per part (GiB, the phases it is alive in), each
// phase's total, the peak against `budget_bytes` and whether it fits.
// `model_label` names the model in the heading.
std::string FormatMemoryPlan(const MemoryPlan& plan, const PlanOptions& options,
                             absl::string_view model_label, int64_t budget_bytes);

// What makes a plan that does not fit in `budget_bytes` fit, as flags:
// "lower --micro_batch_tokens to 12288 or set --activation_checkpointing=
// layers or --dist_shard=full"; each alternative fits on its own. When none
// does, the changes together, with the micro-batch that then fits; when not
// even that fits, says so. Empty when the plan fits.
std::string FitAdvice(const PlanOptions& options, int64_t budget_bytes);

// "12.34" (bytes in GiB, two decimals).
std::string Gib(int64_t bytes);

}  // namespace asympo::learner
