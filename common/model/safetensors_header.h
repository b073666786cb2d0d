// The header of a safetensors file (the format: common/model/safetensors.h),
// parsed and validated from bytes in memory: the 8-byte little-endian length
// and the JSON object it prefixes. It reads no file and needs no LibTorch, so
// that the parser of untrusted checkpoint headers is fuzzed on its own
// (tests/fuzz/safetensors_header_fuzz.cc). SafetensorsFile::Open calls it on
// the mapped file. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace asympo {

// The header's reserved name for its string -> string map.
inline constexpr char kSafetensorsMetadataKey[] = "__metadata__";

// One tensor entry of a header, as validated.
struct SafetensorsTensorInfo {
  std::string dtype;           // the header's name: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;  // empty for a scalar
  uint64_t begin = 0;          // data_offsets, relative to the data region
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

// The element size in bytes of a safetensors dtype name (F64 F32 F16 BF16 I64
// I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2); 0 for an unknown name.
size_t SafetensorsDtypeSize(std::string_view dtype);

// A validated header.
struct SafetensorsHeader {
  uint64_t data_start = 0;  // byte offset of the data region: 8 + header length
  std::map<std::string, SafetensorsTensorInfo> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
};

// Parses the header of a whole safetensors file of `size` bytes at `data`
// (nullptr when `size` is 0) and checks it with the reference reader's rules
// (listed at SafetensorsFile::Open): every tensor of the header must lie in
// this file's data region and the tensors must tile it exactly. Reads only
// the first 8 + header length bytes. INVALID_ARGUMENT, starting with
// `prefix` and naming the tensor or byte offset, when a rule is broken.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, uint64_t size,
                                                         const std::string& prefix);

}  // namespace asympo
