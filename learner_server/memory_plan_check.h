// The learner's start-up memory check: the memory plan (memory_plan.h) of
// the learner's own options, logged, and a refusal to start when it does
// not fit the device, with the flags that would make it fit. Called by
// main after the flags are resolved, before anything is allocated.
// Thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <c10/core/Device.h>
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "learner_server/learner_options.h"
#include "learner_server/plan/memory_plan.h"

namespace asympo::learner {

// The plan's inputs for `options`: the model (ModelConfig::Tiny, or the
// model directory's config.json), the rank's world and sharding, the
// device, the compute and snapshot dtypes, the micro-batch (the longest
// sequence is --max_prompt_tokens + --max_response_tokens), activation
// checkpointing, rank 0 or not, checkpoints or not. NOT_FOUND /
// INVALID_ARGUMENT when the model directory's config.json cannot be read.
absl::StatusOr<PlanOptions> LearnerPlanOptions(const LearnerDaemonOptions& options);

// The memory of `device` in bytes: a GPU's total memory (cudaMemGetInfo,
// from the CUDA runtime LibTorch loaded), or for the CPU the machine's
// MemTotal (/proc/meminfo) or this process's cgroup memory limit when
// that is lower (a container's). An error says how to give it instead
// (--device_memory_gib). `source`, when given, receives where the figure
// came from.
absl::StatusOr<int64_t> DeviceMemoryBytes(const c10::Device& device, std::string* source = nullptr);

// The lowest memory limit of this process's cgroups, given the text of
// /proc/self/cgroup and a reader of files (nullopt for one that cannot be
// read): cgroup v2's memory.max and v1's memory.limit_in_bytes of its
// cgroup and every ancestor up to the mount's root (inside a container
// the mount's root is the container's own cgroup). nullopt when no limit
// is set ("max", or v1's near-2^63 "unlimited").
std::optional<int64_t> CgroupMemoryLimit(
    const std::string& proc_self_cgroup,
    const std::function<std::optional<std::string>(const std::string&)>& read_file);

// --device_memory_gib: negative skips the check; 0 detects the device's
// memory (DeviceMemoryBytes). Logs the plan's table, and returns
// RESOURCE_EXHAUSTED when its peak exceeds the memory, naming the flags to
// change ("lower --micro_batch_tokens to 12288 or set
// --activation_checkpointing=layers or --dist_shard=full"). A model
// directory whose config.json cannot be read is left to the daemon to
// report (the check is skipped with a warning).
absl::Status CheckLearnerMemory(const LearnerDaemonOptions& options, double device_memory_gib);

}  // namespace asympo::learner
