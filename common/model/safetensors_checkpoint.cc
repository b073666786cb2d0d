#include "common/model/safetensors_checkpoint.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/safetensors_io.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// How many names an error message lists per kind before "and N more".
constexpr size_t kNamesListed = 5;

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// "a, b, c" or "a, b, c, d, e and 7 more".
std::string SomeNames(const std::vector<std::string>& names) {
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), kNamesListed));
  std::string text = absl::StrJoin(shown, ", ");
  if (names.size() > kNamesListed)
    absl::StrAppend(&text, " and ", names.size() - kNamesListed, " more");
  return text;
}

// A shard name as HF writes it: model-00001-of-00003.safetensors.
std::string ShardFileName(size_t index, size_t count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

bool IsShardFileName(const std::string& name) {
  // "model-" 5 digits "-of-" 5 digits ".safetensors"
  static const std::string kPattern = "model-DDDDD-of-DDDDD.safetensors";
  if (name.size() != kPattern.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const bool ok = kPattern[i] == 'D' ? std::isdigit(static_cast<unsigned char>(name[i])) != 0
                                       : name[i] == kPattern[i];
    if (!ok) return false;
  }
  return true;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("error reading '", path, "'"));
  return text.str();
}

}  // namespace

SafetensorsCheckpoint::~SafetensorsCheckpoint() = default;

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& path) {
  std::unique_ptr<SafetensorsCheckpoint> checkpoint(new SafetensorsCheckpoint(path));
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", path, "' does not exist"));
  }
  std::string file_path = path;
  if (fs::is_directory(status)) {
    const fs::path dir(path);
    if (fs::exists(dir / kSafetensorsIndexFileName, error)) {
      ASYMPO_RETURN_IF_ERROR(checkpoint->OpenIndex(path));
      return checkpoint;
    }
    file_path = (dir / kSafetensorsSingleFileName).string();
    if (!fs::exists(file_path, error)) {
      return absl::NotFoundError(absl::StrCat("checkpoint directory '", path, "' holds neither ",
                                              kSafetensorsIndexFileName, " nor ",
                                              kSafetensorsSingleFileName));
    }
  }
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(file_path));
  for (const auto& item : file->tensors()) checkpoint->shard_of_[item.first] = file.get();
  checkpoint->files_.push_back(std::move(file));
  return checkpoint;
}

absl::Status SafetensorsCheckpoint::OpenIndex(const std::string& dir) {
  sharded_ = true;
  const std::string index_path = (fs::path(dir) / kSafetensorsIndexFileName).string();
  const std::string prefix = absl::StrCat("checkpoint index '", index_path, "': ");
  ASYMPO_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(index_path));
  Json index;
  try {
    index = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "not valid JSON: ", e.what()));
  }
  if (!index.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "must be a JSON object"));
  }
  if (const auto meta = index.find("metadata"); meta != index.end() && !meta->is_null()) {
    if (!meta->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "\"metadata\" must be an object"));
    }
    for (const auto& [key, value] : meta->items()) {
      index_metadata_[key] = value.is_string() ? value.get<std::string>() : value.dump();
    }
  }
  const auto weight_map = index.find("weight_map");
  if (weight_map == index.end() || !weight_map->is_object() || weight_map->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "\"weight_map\" must be a non-empty object of tensor -> file name"));
  }
  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (const auto& [name, shard] : weight_map->items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "weight_map entry for '", name, "' must be a file name string"));
    }
    const std::string shard_name = shard.get<std::string>();
    if (shard_name.empty() || shard_name == "." || shard_name == ".." ||
        shard_name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "weight_map maps '", name, "' to '", shard_name,
                       "', which is not a plain file name in the checkpoint directory"));
    }
    names_by_shard[shard_name].push_back(name);
  }
  for (const auto& [shard_name, names] : names_by_shard) {
    const std::string shard_path = (fs::path(dir) / shard_name).string();
    auto file = SafetensorsFile::Open(shard_path);
    if (absl::IsNotFound(file.status())) {
      return absl::NotFoundError(absl::StrCat(prefix, "maps ", names.size(), " tensors (",
                                              SomeNames(names), ") to shard '", shard_name,
                                              "', which does not exist"));
    }
    ASYMPO_RETURN_IF_ERROR(file.status());
    for (const std::string& name : names) {
      if (!(*file)->Contains(name)) {
        return absl::InvalidArgumentError(absl::StrCat(prefix, "maps tensor '", name,
                                                       "' to shard '", shard_name,
                                                       "', which does not hold it"));
      }
      shard_of_[name] = file->get();
    }
    for (const auto& item : (*file)->tensors()) {
      const auto owner = weight_map->find(item.first);
      if (owner == weight_map->end() || owner->get<std::string>() != shard_name) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, "shard '", shard_name, "' holds tensor '", item.first, "', which the index ",
            owner == weight_map->end() ? "does not list" : "assigns to another shard"));
      }
    }
    files_.push_back(*std::move(file));
  }
  return absl::OkStatus();
}

std::vector<std::string> SafetensorsCheckpoint::FilePaths() const {
  std::vector<std::string> paths;
  for (const auto& file : files_) paths.push_back(file->path());
  return paths;
}

std::vector<std::string> SafetensorsCheckpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(shard_of_.size());
  for (const auto& item : shard_of_) names.push_back(item.first);
  return names;
}

const SafetensorsTensorInfo* SafetensorsCheckpoint::Find(const std::string& name) const {
  const auto it = shard_of_.find(name);
  return it == shard_of_.end() ? nullptr : it->second->Find(name);
}

absl::StatusOr<at::Tensor> SafetensorsCheckpoint::Get(const std::string& name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", path_, "' has no tensor '", name, "'"));
  }
  return it->second->Get(name);
}

absl::StatusOr<at::Tensor> SafetensorsCheckpoint::Get(const std::string& name,
                                                      at::ScalarType out_dtype) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", path_, "' has no tensor '", name, "'"));
  }
  return it->second->Get(name, out_dtype);
}

const std::map<std::string, std::string>& SafetensorsCheckpoint::metadata() const {
  static const auto* const kEmpty = new std::map<std::string, std::string>();
  return files_.empty() ? *kEmpty : files_.front()->metadata();
}

TensorSetDiff SafetensorsCheckpoint::Compare(
    const std::map<std::string, std::vector<int64_t>>& expected) const {
  TensorSetDiff diff;
  for (const auto& [name, shape] : expected) {
    const SafetensorsTensorInfo* info = Find(name);
    if (info == nullptr) {
      diff.missing.push_back(name);
    } else if (info->shape != shape) {
      diff.wrong_shape.push_back({name, shape, info->shape});
    }
  }
  for (const auto& item : shard_of_) {
    if (expected.count(item.first) == 0) diff.unexpected.push_back(item.first);
  }
  return diff;
}

absl::Status SafetensorsCheckpoint::CheckTensors(
    const std::map<std::string, std::vector<int64_t>>& expected) const {
  const TensorSetDiff diff = Compare(expected);
  if (diff.empty()) return absl::OkStatus();
  std::vector<std::string> parts;
  if (!diff.missing.empty()) {
    parts.push_back(absl::StrCat(diff.missing.size(), " missing (", SomeNames(diff.missing), ")"));
  }
  if (!diff.unexpected.empty()) {
    parts.push_back(
        absl::StrCat(diff.unexpected.size(), " unexpected (", SomeNames(diff.unexpected), ")"));
  }
  if (!diff.wrong_shape.empty()) {
    std::vector<std::string> shown;
    for (size_t i = 0; i < diff.wrong_shape.size() && i < kNamesListed; ++i) {
      const auto& m = diff.wrong_shape[i];
      shown.push_back(absl::StrCat(m.name, ": ", ShapeText(m.actual), " in the checkpoint, ",
                                   ShapeText(m.expected), " expected"));
    }
    std::string text = absl::StrJoin(shown, ", ");
    if (diff.wrong_shape.size() > kNamesListed) {
      absl::StrAppend(&text, " and ", diff.wrong_shape.size() - kNamesListed, " more");
    }
    parts.push_back(absl::StrCat(diff.wrong_shape.size(), " with the wrong shape (", text, ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint '", path_,
                   "' does not match the expected tensors: ", absl::StrJoin(parts, "; ")));
}

namespace {

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

// Splits `tensors`, in the order given (as transformers does), into shards
// of at most max_shard_bytes (a larger tensor gets a shard of its own): each
// shard's positions in `tensors`.
std::vector<std::vector<size_t>> PlanShards(const Tensors& tensors, uint64_t max_shard_bytes,
                                            uint64_t* total_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0;
  *total_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& tensor = tensors[i].second;
    const uint64_t nbytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    if (!shards.back().empty() && shard_bytes + nbytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += nbytes;
    *total_bytes += nbytes;
  }
  return shards;
}

// A shard's tensors: those given, or made by `materialize` (checked against
// what was planned).
absl::StatusOr<Tensors> ShardTensors(const std::string& prefix, const Tensors& tensors,
                                     const std::vector<size_t>& shard,
                                     const MaterializeTensor& materialize) {
  Tensors out;
  for (const size_t i : shard) {
    if (!materialize) {
      out.push_back(tensors[i]);
      continue;
    }
    ASYMPO_ASSIGN_OR_RETURN(at::Tensor t, materialize(i));
    const at::Tensor& planned = tensors[i].second;
    if (!t.defined() || t.scalar_type() != planned.scalar_type() || t.sizes() != planned.sizes() ||
        !t.device().is_cpu()) {
      return absl::InternalError(absl::StrCat(prefix, "tensor '", tensors[i].first,
                                              "' was made with another dtype, shape or device "
                                              "than planned"));
    }
    out.emplace_back(tensors[i].first, t.contiguous());
  }
  return out;
}

// Writes several shards and then model.safetensors.index.json; adds the
// file names to `written`.
absl::Status WriteShards(const std::string& prefix, const std::string& dir, const Tensors& tensors,
                         const std::vector<std::vector<size_t>>& shards, uint64_t total_bytes,
                         const std::map<std::string, std::string>& metadata,
                         const MaterializeTensor& materialize, std::set<std::string>* written) {
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file_name = ShardFileName(i, shards.size());
    {
      ASYMPO_ASSIGN_OR_RETURN(const Tensors shard,
                              ShardTensors(prefix, tensors, shards[i], materialize));
      ASYMPO_RETURN_IF_ERROR(
          WriteSafetensors((fs::path(dir) / file_name).string(), shard, metadata));
    }  // the shard's tensors go before the next are made
    for (const size_t t : shards[i]) weight_map[tensors[t].first] = file_name;
    written->insert(file_name);
  }
  Json index = Json::object();
  index["metadata"] = Json::object({{"total_size", total_bytes}});
  index["weight_map"] = std::move(weight_map);
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const Json::exception&) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "a tensor name is not valid UTF-8"));
  }
  // Written last: a reader that finds the index finds every shard.
  ASYMPO_ASSIGN_OR_RETURN(
      std::unique_ptr<AtomicFileWriter> writer,
      AtomicFileWriter::Create((fs::path(dir) / kSafetensorsIndexFileName).string()));
  ASYMPO_RETURN_IF_ERROR(writer->Append(text));
  ASYMPO_RETURN_IF_ERROR(writer->Commit());
  written->insert(kSafetensorsIndexFileName);
  return absl::OkStatus();
}

// Removes what an earlier export left in the other layout, so that neither
// this reader nor transformers picks up stale weights.
absl::Status RemoveStaleFiles(const std::string& prefix, const std::string& dir,
                              const std::set<std::string>& written) {
  std::error_code error;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == kSafetensorsSingleFileName || name == kSafetensorsIndexFileName ||
                      IsShardFileName(name);
    if (ours && written.count(name) == 0) stale.push_back(entry.path());
  }
  if (error) {
    return absl::InternalError(
        absl::StrCat(prefix, "cannot list the directory: ", error.message()));
  }
  for (const fs::path& path : stale) {
    fs::remove(path, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat(prefix, "cannot remove stale '", path.string(), "': ", error.message()));
    }
  }
  return stale.empty() ? absl::OkStatus() : SyncDirectory(dir);
}

}  // namespace

absl::Status WriteShardedSafetensors(const std::string& dir, const Tensors& tensors,
                                     int64_t max_shard_bytes,
                                     const std::map<std::string, std::string>& metadata,
                                     const MaterializeTensor& materialize) {
  const std::string prefix = absl::StrCat("writing checkpoint '", dir, "': ");
  if (max_shard_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "max_shard_bytes must be positive, got ", max_shard_bytes));
  }
  // Everything WriteSafetensors would refuse is refused before any shard
  // replaces a file of an earlier export.
  ASYMPO_RETURN_IF_ERROR(CheckTensorsToWrite(prefix, tensors));
  uint64_t total_bytes = 0;
  const std::vector<std::vector<size_t>> shards =
      PlanShards(tensors, static_cast<uint64_t>(max_shard_bytes), &total_bytes);
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat(prefix, "cannot create the directory: ", error.message()));
  }
  std::set<std::string> written;
  if (shards.size() == 1) {
    ASYMPO_ASSIGN_OR_RETURN(const Tensors shard,
                            ShardTensors(prefix, tensors, shards[0], materialize));
    ASYMPO_RETURN_IF_ERROR(
        WriteSafetensors((fs::path(dir) / kSafetensorsSingleFileName).string(), shard, metadata));
    written.insert(kSafetensorsSingleFileName);
  } else {
    ASYMPO_RETURN_IF_ERROR(
        WriteShards(prefix, dir, tensors, shards, total_bytes, metadata, materialize, &written));
  }
  return RemoveStaleFiles(prefix, dir, written);
}

}  // namespace asympo
