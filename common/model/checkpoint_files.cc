#include "common/model/checkpoint_files.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/crc32c.h"
#include "common/model/checkpoint_meta.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_io.h"
#include "common/model/sharded_checkpoint.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<FileMapping> m, FileMapping::Open(path));
  return std::string(reinterpret_cast<const char*>(m->data()), m->size());
}

}  // namespace

absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir) {
  const std::string path = dir + "/" + kCheckpointMetaFile;
  ASYMPO_ASSIGN_OR_RETURN(const std::string text, ReadWhole(path));
  return ParseCheckpointMeta(text, path);
}

absl::StatusOr<CheckpointContents> ReadCheckpointDirectory(const std::string& dir) {
  const std::string state_path = dir + "/" + kCheckpointStateFile;
  ASYMPO_ASSIGN_OR_RETURN(CheckpointMeta meta, ReadCheckpointMeta(dir));
  CheckpointContents out;
  out.version = meta.version;
  out.optimizer_steps = meta.optimizer_steps;
  out.config = meta.config;
  out.batches = meta.batches;
  out.reward_monitor = meta.reward_monitor;
  out.base = meta.base;
  if (fs::exists(dir + "/" + kCheckpointManifestFile)) {
    // Written by every rank (sharded_checkpoint.h): the weights, whole.
    ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStateReader> reader,
                            CheckpointStateReader::Open(dir, meta.crc32c, {}));
    ASYMPO_ASSIGN_OR_RETURN(out.weights, ReadCheckpointWeights(*reader));
    ASYMPO_ASSIGN_OR_RETURN(out.rng, reader->Rng());
    return out;
  }
  ASYMPO_ASSIGN_OR_RETURN(const uint32_t crc, CheckpointFileCrc(state_path));
  if (crc != meta.crc32c) {
    return absl::DataLossError(
        absl::StrFormat("%s has CRC-32C %08x, meta.json says %08x", state_path, crc, meta.crc32c));
  }
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(state_path));
  const std::string prefix = kCheckpointOptimizerPrefix;
  for (const std::string& name : file->Names()) {
    ASYMPO_ASSIGN_OR_RETURN(at::Tensor t, file->Get(name));
    if (name == kCheckpointRngTensor) {
      out.rng = t.clone();
    } else if (name.rfind(prefix, 0) == 0) {
      out.moments.emplace_back(name.substr(prefix.size()), t);
    } else {
      out.weights.emplace_back(name, t);
    }
  }
  return out;
}

absl::StatusOr<uint32_t> CheckpointFileCrc(const std::string& path) {
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<FileMapping> m, FileMapping::Open(path));
  return Crc32c(m->data(), m->size());
}

std::vector<std::string> ListCheckpoints(const std::string& root) {
  std::vector<std::pair<uint64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) != 0 || !e.is_directory()) continue;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(name.c_str() + 5, &end, 10);
    if (end == name.c_str() + 5 || *end != '\0') continue;
    found.emplace_back(v, e.path().string());
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& [v, p] : found) out.push_back(p);
  return out;
}

std::string CheckpointConfigFlag(const std::string& config, const std::string& name) {
  const std::vector<std::string> args =
      absl::StrSplit(config, absl::ByAnyChar("\n"), absl::SkipWhitespace());
  const std::string flag = "--" + name, with_value = flag + "=";
  std::string value;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind(with_value, 0) == 0) {
      value = args[i].substr(with_value.size());
    } else if (args[i] == flag && i + 1 < args.size()) {
      value = args[i + 1];
    }
  }
  return value;
}

}  // namespace asympo
