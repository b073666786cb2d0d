#include "learner_server/memory_plan_check.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include <c10/core/DeviceGuard.h>
#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"
#include "learner_server/plan/memory_plan_report.h"

namespace asympo::learner {
namespace {

constexpr double kGib = static_cast<double>(int64_t{1} << 30);

PlanDType DTypeOf(at::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf ? PlanDType::kBFloat16 : PlanDType::kFloat32;
}

// MemTotal from /proc/meminfo, in bytes.
absl::StatusOr<int64_t> MemTotal() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::istringstream fields(line.substr(9));
    int64_t kib = 0;
    if (fields >> kib && kib > 0) return kib * 1024;
  }
  return absl::UnavailableError(
      "cannot read MemTotal from /proc/meminfo; give the memory with --device_memory_gib");
}

// A whole file's text; nullopt when it cannot be read.
std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A limit file's value: nullopt for none ("max", or v1's unlimited).
std::optional<int64_t> LimitOf(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(word, &bytes) || bytes <= 0 || bytes >= (int64_t{1} << 62)) {
    return std::nullopt;
  }
  return bytes;
}

// cudaMemGetInfo from the CUDA runtime the CUDA LibTorch loaded (or one
// that can be loaded), on the current device.
using MemGetInfo = int (*)(size_t* free, size_t* total);
MemGetInfo FindMemGetInfo() {
  if (void* f = dlsym(RTLD_DEFAULT, "cudaMemGetInfo")) return reinterpret_cast<MemGetInfo>(f);
  for (const char* name :
       {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}) {
    void* lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) continue;
    if (void* f = dlsym(lib, "cudaMemGetInfo")) return reinterpret_cast<MemGetInfo>(f);
  }
  return nullptr;
}

absl::StatusOr<int64_t> GpuMemory(const c10::Device& device) {
  const MemGetInfo mem_get_info = FindMemGetInfo();
  if (mem_get_info == nullptr) {
    return absl::UnavailableError(
        "cannot find cudaMemGetInfo in the CUDA runtime; give the GPU's memory with "
        "--device_memory_gib");
  }
  // The device (ParseDevice checked it) becomes current for the query.
  const c10::DeviceGuard on_device(device);
  size_t free = 0, total = 0;
  if (const int error = mem_get_info(&free, &total); error != 0 || total == 0) {
    return absl::UnavailableError(absl::StrCat("cudaMemGetInfo on ", device.str(), " failed (",
                                               error,
                                               "); give the GPU's memory with "
                                               "--device_memory_gib"));
  }
  return static_cast<int64_t>(total);
}

std::string ModelLabel(const LearnerDaemonOptions& o) {
  if (o.model == "tiny") return absl::StrCat("tiny (vocabulary ", o.tiny_vocab_size, ")");
  return o.model;
}

}  // namespace

absl::StatusOr<PlanOptions> LearnerPlanOptions(const LearnerDaemonOptions& o) {
  PlanOptions p;
  if (o.model == "tiny") {
    p.model = ModelConfig::Tiny(o.tiny_vocab_size);
  } else {
    // The learner's --model is a directory (asympo-plan's names are not).
    absl::StatusOr<ModelConfig> config = ModelConfig::FromFile(o.model + "/config.json");
    if (!config.ok()) return config.status();
    p.model = *std::move(config);
  }
  p.world_size = o.data_parallel.world_size;
  p.shard = o.data_parallel.shard;
  p.device = o.model_options.device.is_cuda() ? PlanDevice::kCuda : PlanDevice::kCpu;
  const at::ScalarType compute = o.model_options.compute_dtype == at::ScalarType::Undefined
                                     ? o.model_options.dtype
                                     : o.model_options.compute_dtype;
  p.compute_dtype = DTypeOf(compute);
  p.snapshot_dtype = DTypeOf(o.publish_dtype);
  p.micro_batch_tokens = o.trainer.micro_batch_tokens;
  p.max_sequence_tokens =
      int64_t{o.service.limits.max_prompt_tokens} + int64_t{o.service.limits.max_response_tokens};
  p.pack_sequences = o.trainer.pack_sequences;
  p.checkpoint_every = o.model_options.checkpoint_every;
  p.lora_rank = o.model_options.lora.rank;
  if (p.lora_rank > 0) p.lora_targets = o.model_options.lora.targets;
  p.logprob_chunk_rows = o.trainer.logprob_chunk_rows;
  p.rank0 = o.data_parallel.rank == 0;
  p.checkpoints = !o.checkpoint_dir.empty();
  p.snapshot_device = !o.snapshot_staging_host;
  p.snapshot_device_held = NcclFromDeviceCopy(o);  // counted for a GPU only
  p.snapshot_deltas = o.snapshots.delta_keyframe_every > 0;
  return p;
}

std::optional<int64_t> CgroupMemoryLimit(
    const std::string& proc_self_cgroup,
    const std::function<std::optional<std::string>(const std::string&)>& read_file) {
  std::optional<int64_t> lowest;
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    // "ID:CONTROLLERS:PATH"; v2 is "0::PATH".
    const std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3 || f[2].empty() || f[2][0] != '/') continue;
    std::string dir, file;
    if (f[0] == "0" && f[1].empty()) {
      dir = "/sys/fs/cgroup", file = "memory.max";
    } else if (absl::c_linear_search(absl::StrSplit(f[1], ','), "memory")) {
      dir = "/sys/fs/cgroup/memory", file = "memory.limit_in_bytes";
    } else {
      continue;
    }
    // The cgroup and its ancestors, up to the mount's root.
    std::string path(f[2]);
    while (true) {
      const std::string at = absl::StrCat(dir, path == "/" ? "" : path, "/", file);
      if (const std::optional<std::string> text = read_file(at); text.has_value()) {
        if (const std::optional<int64_t> limit = LimitOf(*text); limit.has_value()) {
          lowest = lowest.has_value() ? std::min(*lowest, *limit) : *limit;
        }
      }
      if (path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == 0 ? "/" : path.substr(0, slash);
    }
  }
  return lowest;
}

absl::StatusOr<int64_t> DeviceMemoryBytes(const c10::Device& device, std::string* source) {
  if (device.is_cuda()) {
    if (source != nullptr) *source = device.str();
    return GpuMemory(device);
  }
  absl::StatusOr<int64_t> total = MemTotal();
  if (!total.ok()) return total;
  if (source != nullptr) *source = "this machine (MemTotal)";
  const std::optional<std::string> cgroup = ReadFile("/proc/self/cgroup");
  if (!cgroup.has_value()) return total;
  const std::optional<int64_t> limit = CgroupMemoryLimit(*cgroup, ReadFile);
  if (!limit.has_value() || *limit >= *total) return total;
  if (source != nullptr) *source = "this process's cgroup memory limit (a container's)";
  return *limit;
}

absl::Status CheckLearnerMemory(const LearnerDaemonOptions& o, double device_memory_gib) {
  if (device_memory_gib < 0 || std::isnan(device_memory_gib)) return absl::OkStatus();
  absl::StatusOr<PlanOptions> options = LearnerPlanOptions(o);
  if (!options.ok()) {
    LOG(WARNING) << "memory plan skipped: " << options.status().message();
    return absl::OkStatus();
  }
  absl::StatusOr<MemoryPlan> plan = PlanMemory(*options);
  if (!plan.ok()) return plan.status();
  int64_t budget = static_cast<int64_t>(device_memory_gib * kGib);
  std::string source = absl::StrFormat("--device_memory_gib=%g", device_memory_gib);
  if (device_memory_gib == 0) {
    std::string where;
    absl::StatusOr<int64_t> detected = DeviceMemoryBytes(o.model_options.device, &where);
    if (!detected.ok()) return detected.status();
    budget = *detected;
    source = absl::StrCat(where, ", detected");
  }
  LOG(INFO) << "memory plan (" << source << "):\n"
            << FormatMemoryPlan(*plan, *options, ModelLabel(o), budget);
  if (plan->peak_bytes <= budget) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the memory plan needs ", Gib(plan->peak_bytes), " GiB per rank (",
      PlanPhaseName(plan->peak_phase), " phase) but the device has ", Gib(budget), " GiB (", source,
      "): ", FitAdvice(*options, budget),
      "; the plan is logged above (docs/operations.md, \"Memory plan\"); --device_memory_gib=-1 "
      "skips this check"));
}

}  // namespace asympo::learner
