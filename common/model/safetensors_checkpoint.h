// A Hugging Face safetensors checkpoint: one `model.safetensors`, or shards
// listed by `model.safetensors.index.json` ({"metadata": {...},
// "weight_map": {tensor name -> shard file name}}), read as one set of
// tensors; and the writer that exports a policy in the same layout.
//
// SafetensorsCheckpoint is immutable once opened: every method is const and
// thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/safetensors.h"

namespace asympo {

inline constexpr char kSafetensorsSingleFileName[] = "model.safetensors";
inline constexpr char kSafetensorsIndexFileName[] = "model.safetensors.index.json";

// How a checkpoint's tensors differ from the set a model expects. Each list is
// sorted by name.
struct TensorSetDiff {
  struct ShapeMismatch {
    std::string name;
    std::vector<int64_t> expected;
    std::vector<int64_t> actual;
  };
  std::vector<std::string> missing;     // expected, absent from the checkpoint
  std::vector<std::string> unexpected;  // in the checkpoint, not expected
  std::vector<ShapeMismatch> wrong_shape;

  bool empty() const { return missing.empty() && unexpected.empty() && wrong_shape.empty(); }
};

class SafetensorsCheckpoint {
 public:
  // `path` is a .safetensors file, or a directory holding either
  // model.safetensors.index.json (preferred when both exist) or
  // model.safetensors. Every shard is opened and validated
  // (SafetensorsFile::Open); the index must be an object whose "weight_map"
  // maps names to plain file names in the same directory, each shard must hold
  // exactly the tensors the index assigns it. NOT_FOUND when the checkpoint or
  // a shard named by the index is missing; INVALID_ARGUMENT naming the file
  // and tensor for anything malformed.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& path);

  ~SafetensorsCheckpoint();
  SafetensorsCheckpoint(const SafetensorsCheckpoint&) = delete;
  SafetensorsCheckpoint& operator=(const SafetensorsCheckpoint&) = delete;

  // The path given to Open().
  const std::string& path() const { return path_; }
  // The files read, in shard-name order (one for an unsharded checkpoint).
  std::vector<std::string> FilePaths() const;
  bool sharded() const { return sharded_; }

  // Every tensor name of every shard, sorted.
  std::vector<std::string> Names() const;
  size_t size() const { return shard_of_.size(); }
  bool Contains(const std::string& name) const { return shard_of_.count(name) > 0; }
  // nullptr when absent.
  const SafetensorsTensorInfo* Find(const std::string& name) const;
  // As SafetensorsFile::Get on the shard holding `name`; NOT_FOUND names the
  // checkpoint when no shard has it.
  absl::StatusOr<at::Tensor> Get(const std::string& name) const;
  absl::StatusOr<at::Tensor> Get(const std::string& name, at::ScalarType out_dtype) const;

  // "__metadata__" of the first shard (all shards written by transformers or
  // WriteShardedSafetensors carry the same).
  const std::map<std::string, std::string>& metadata() const;
  // The index's "metadata" with non-string values as JSON text (e.g.
  // "total_size" -> "1234"); empty for an unsharded checkpoint.
  const std::map<std::string, std::string>& index_metadata() const { return index_metadata_; }

  // Compares the checkpoint with `expected` (name -> shape).
  TensorSetDiff Compare(const std::map<std::string, std::vector<int64_t>>& expected) const;
  // OK when Compare() finds no difference; otherwise INVALID_ARGUMENT naming
  // the checkpoint and, per kind, the count and the first few names, e.g.
  // "2 missing (a, b); 1 with the wrong shape (c: [4, 3] in the checkpoint, [3, 4] expected)".
  absl::Status CheckTensors(const std::map<std::string, std::vector<int64_t>>& expected) const;

 private:
  explicit SafetensorsCheckpoint(std::string path) : path_(std::move(path)) {}
  absl::Status OpenIndex(const std::string& dir);

  const std::string path_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> shard_of_;
  std::map<std::string, std::string> index_metadata_;
};

// Writes `tensors` into directory `dir` (created when missing) in the layout
// transformers' save_pretrained uses: tensors go, in the order given, into
// shards of at most `max_shard_bytes` of tensor data each (a larger tensor
// gets a shard of its own), named model-00001-of-0000N.safetensors, plus
// model.safetensors.index.json ({"metadata": {"total_size": bytes},
// "weight_map": {...}}, sorted keys, 2-space indent), written last. When
// everything fits in one shard, writes model.safetensors and no index. Each
// file is written atomically (WriteSafetensors) with `metadata`; afterwards
// files of an earlier export in the other layout or with another shard count
// (model.safetensors, the index, model-*-of-*.safetensors) are removed, so the
// directory holds one checkpoint. INVALID_ARGUMENT, before anything is
// written, for max_shard_bytes <= 0 and for what WriteSafetensors refuses.
// Each file is replaced atomically but the export as a whole is not: after an
// I/O error mid-way the directory may mix shards of two exports (the reader
// then refuses it when the index and shards disagree); export to a fresh
// directory where that matters.
//
// With `materialize`, `tensors` only describe what is written (their names,
// shapes and dtypes: meta tensors will do): each shard's tensors are made by
// materialize(i) (i: the position in `tensors`; the result must have that
// entry's dtype and shape) just before the shard is written, and let go
// after it, so that an export holds one shard in memory, not the whole
// model (a GPU's weights, or float32 masters written in bfloat16).
using MaterializeTensor = std::function<absl::StatusOr<at::Tensor>(size_t index)>;
absl::Status WriteShardedSafetensors(const std::string& dir,
                                     const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                     int64_t max_shard_bytes,
                                     const std::map<std::string, std::string>& metadata = {},
                                     const MaterializeTensor& materialize = nullptr);

}  // namespace asympo
