// The safetensors checkpoint format (Hugging Face): reading one file through a
// memory mapping, and writing one file atomically.
//
// Layout: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON (the header,
// maybe padded with spaces), then the data region. The header maps each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets into
// the data region) and may hold "__metadata__", a string -> string map.
// Tensor bytes are little-endian and row-major.
//
// SafetensorsFile is immutable once opened: every method is const and
// thread-safe. Sharded checkpoints (an index plus several files) are in
// common/model/safetensors_checkpoint.h; the header parser, which needs no
// LibTorch, in common/model/safetensors_header.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/safetensors_header.h"

namespace asympo {

class FileMapping;

// The LibTorch type for a safetensors dtype name. INVALID_ARGUMENT for an
// unknown name; UNIMPLEMENTED for a known one LibTorch 1.13 has no type for
// (U16 U32 U64 F8_E4M3 F8_E5M2).
absl::StatusOr<at::ScalarType> SafetensorsDtypeToScalarType(std::string_view dtype);

// The safetensors dtype name for a LibTorch type: F64 F32 F16 BF16 I64 I32
// I16 I8 U8 BOOL. INVALID_ARGUMENT for any other type (complex, quantized).
absl::StatusOr<std::string> ScalarTypeToSafetensorsDtype(at::ScalarType type);

// One .safetensors file, memory-mapped.
class SafetensorsFile {
 public:
  // Maps `path` and validates its header strictly, with the same rules as the
  // reference reader: header length within the file and at most 100 MB; a
  // JSON object; known dtypes; non-negative dims; data_offsets two
  // non-decreasing unsigned integers whose difference is numel * dtype size;
  // tensors inside the file, neither overlapping nor leaving gaps, and ending
  // exactly at the end of the file; no duplicate names; "__metadata__" string
  // -> string. NOT_FOUND when the file does not exist, INVALID_ARGUMENT
  // (naming the file and the tensor or byte offset) when it breaks a rule.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const;
  // Byte offset of the data region in the file (8 + header length).
  uint64_t data_start() const { return data_start_; }

  // Tensor names, sorted.
  std::vector<std::string> Names() const;
  const std::map<std::string, SafetensorsTensorInfo>& tensors() const { return tensors_; }
  bool Contains(const std::string& name) const { return tensors_.count(name) > 0; }
  // nullptr when the file has no tensor `name`.
  const SafetensorsTensorInfo* Find(const std::string& name) const;
  // The header's "__metadata__" (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Returns tensor `name` on the CPU with its stored dtype, or converted to
  // `out_dtype`. When no conversion is needed and the data is aligned to the
  // element size (always so for files this project writes), the tensor aliases
  // the mapping with no copy and keeps it alive after this object is gone;
  // writing to such a tensor changes a private copy-on-write page, never the
  // file, and is seen by every tensor aliasing the same bytes. Otherwise the
  // tensor owns a copy. NOT_FOUND for an unknown name; UNIMPLEMENTED for a
  // dtype LibTorch lacks.
  absl::StatusOr<at::Tensor> Get(const std::string& name) const;
  absl::StatusOr<at::Tensor> Get(const std::string& name, at::ScalarType out_dtype) const;

 private:
  SafetensorsFile(std::string path, std::shared_ptr<FileMapping> mapping)
      : path_(std::move(path)), mapping_(std::move(mapping)) {}
  absl::Status ParseHeader();

  const std::string path_;
  const std::shared_ptr<FileMapping> mapping_;
  uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// What WriteSafetensors requires of `tensors`: names that are not empty nor
// "__metadata__", each once; defined dense tensors of a dtype safetensors
// has. INVALID_ARGUMENT naming the tensor, after `prefix`.
absl::Status CheckTensorsToWrite(const std::string& prefix,
                                 const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// Writes `tensors` to `path` in the safetensors format, atomically (a
// temporary file in the same directory, fsync, rename, fsync of the
// directory). Tensors may live on any device and have any strides; they are
// written as contiguous little-endian data with their own dtype (see
// ScalarTypeToSafetensorsDtype). The data region holds them ordered by element
// size, largest first, then in the order given, so every tensor is aligned to
// its element size; the header lists them in that order after
// "__metadata__", and is padded with spaces to a multiple of 8 bytes.
// `metadata` becomes "__metadata__", with "format": "pt" added when absent
// (transformers refuses files whose format it does not know).
// INVALID_ARGUMENT for an empty, duplicate or "__metadata__" name, an
// undefined tensor or an unsupported dtype; INTERNAL for I/O errors.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace asympo
