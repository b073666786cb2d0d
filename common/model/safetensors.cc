#include "common/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include "absl/strings/str_cat.h"
#include "common/model/safetensors_io.h"
#include "common/status_macros.h"

// The format stores little-endian bytes; this code copies them as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes little-endian");

namespace asympo {
namespace {

// The LibTorch type of each safetensors dtype that has one (the others:
// U64 U32 U16 F8_E4M3 F8_E5M2; sizes and names are in safetensors_header.cc).
struct TorchDtype {
  const char* name;
  at::ScalarType torch_type;
};

constexpr TorchDtype kTorchDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

}  // namespace

absl::StatusOr<at::ScalarType> SafetensorsDtypeToScalarType(std::string_view dtype) {
  if (SafetensorsDtypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown safetensors dtype \"", std::string(dtype), "\""));
  }
  for (const TorchDtype& e : kTorchDtypes) {
    if (dtype == e.name) return e.torch_type;
  }
  return absl::UnimplementedError(
      absl::StrCat("safetensors dtype ", std::string(dtype), " has no LibTorch equivalent here"));
}

absl::StatusOr<std::string> ScalarTypeToSafetensorsDtype(at::ScalarType type) {
  for (const TorchDtype& e : kTorchDtypes) {
    if (e.torch_type == type) return std::string(e.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("LibTorch dtype ", c10::toString(type), " has no safetensors equivalent"));
}

SafetensorsFile::~SafetensorsFile() = default;

uint64_t SafetensorsFile::file_size() const { return mapping_->size(); }

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<FileMapping> mapping, FileMapping::Open(path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path, std::move(mapping)));
  ASYMPO_RETURN_IF_ERROR(file->ParseHeader());
  return file;
}

absl::Status SafetensorsFile::ParseHeader() {
  ASYMPO_ASSIGN_OR_RETURN(SafetensorsHeader header,
                          ParseSafetensorsHeader(mapping_->data(), mapping_->size(),
                                                 absl::StrCat("safetensors file '", path_, "': ")));
  data_start_ = header.data_start;
  tensors_ = std::move(header.tensors);
  metadata_ = std::move(header.metadata);
  return absl::OkStatus();
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& item : tensors_) names.push_back(item.first);
  return names;
}

const SafetensorsTensorInfo* SafetensorsFile::Find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<at::Tensor> SafetensorsFile::Get(const std::string& name) const {
  const SafetensorsTensorInfo* info = Find(name);
  // Unknown names and dtypes are reported by the two-argument Get.
  const auto stored = info == nullptr ? absl::StatusOr<at::ScalarType>(at::kByte)
                                      : SafetensorsDtypeToScalarType(info->dtype);
  return Get(name, stored.ok() ? *stored : at::kByte);
}

absl::StatusOr<at::Tensor> SafetensorsFile::Get(const std::string& name,
                                                at::ScalarType out_dtype) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("safetensors file '", path_, "' has no tensor '", name, "'"));
  }
  auto stored = SafetensorsDtypeToScalarType(info->dtype);
  if (!stored.ok()) {
    return absl::Status(stored.status().code(),
                        absl::StrCat("safetensors file '", path_, "', tensor '", name,
                                     "': ", stored.status().message()));
  }
  const at::TensorOptions options = at::TensorOptions().dtype(*stored).device(at::kCPU);
  try {
    if (info->nbytes() == 0) return at::empty(info->shape, options.dtype(out_dtype));
    uint8_t* data = mapping_->data() + data_start_ + info->begin;
    const size_t element_size = c10::elementSize(*stored);
    if (reinterpret_cast<uintptr_t>(data) % element_size != 0) {
      // Kernels assume element-aligned data: copy into an owned tensor.
      at::Tensor copy = at::empty(info->shape, options);
      std::memcpy(copy.data_ptr(), data, info->nbytes());
      return out_dtype == *stored ? copy : copy.to(out_dtype);
    }
    if (out_dtype == *stored) {
      // The deleter owns a reference to the mapping: unmapped with the last tensor.
      const auto release = [keep_alive = mapping_](void*) {};
      return at::from_blob(data, info->shape, release, options);
    }
    return at::from_blob(data, info->shape, options).to(out_dtype);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("safetensors file '", path_, "', tensor '", name,
                                            "': LibTorch failed: ", e.what_without_backtrace()));
  }
}

absl::Status CheckTensorsToWrite(const std::string& prefix,
                                 const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::set<std::string_view> names;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == kSafetensorsMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tensor name '", name, "' is reserved or empty"));
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "tensor '", name, "' appears twice"));
    }
    if (!tensor.defined() || tensor.layout() != at::kStrided) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tensor '", name, "' must be a defined dense tensor"));
    }
    if (auto dtype = ScalarTypeToSafetensorsDtype(tensor.scalar_type()); !dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tensor '", name, "': ", dtype.status().message()));
    }
  }
  return absl::OkStatus();
}

namespace {

// One tensor to write: its bytes follow the header in `entries` order.
struct WriteEntry {
  const std::string* name;
  const at::Tensor* tensor;
  std::string dtype;
  size_t element_size;
  uint64_t nbytes;
};

// Checks the tensors and orders them largest elements first: with an
// 8-aligned data region every tensor then starts at a multiple of its
// element size.
absl::StatusOr<std::vector<WriteEntry>> WriteEntries(
    const std::string& prefix, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  ASYMPO_RETURN_IF_ERROR(CheckTensorsToWrite(prefix, tensors));
  std::vector<WriteEntry> entries;
  for (const auto& [name, tensor] : tensors) {
    const size_t element_size = c10::elementSize(tensor.scalar_type());
    entries.push_back({&name, &tensor, *ScalarTypeToSafetensorsDtype(tensor.scalar_type()),
                       element_size, static_cast<uint64_t>(tensor.numel()) * element_size});
  }
  std::stable_sort(entries.begin(), entries.end(), [](const WriteEntry& a, const WriteEntry& b) {
    return a.element_size > b.element_size;
  });
  return entries;
}

// The JSON header, padded with spaces to a multiple of 8 bytes.
absl::StatusOr<std::string> HeaderText(const std::string& prefix,
                                       const std::vector<WriteEntry>& entries,
                                       const std::map<std::string, std::string>& metadata) {
  using OrderedJson = nlohmann::ordered_json;
  OrderedJson header = OrderedJson::object();
  OrderedJson meta = OrderedJson::object();
  if (metadata.count("format") == 0) meta["format"] = "pt";
  for (const auto& [key, value] : metadata) meta[key] = value;
  header[kSafetensorsMetadataKey] = std::move(meta);
  uint64_t offset = 0;
  for (const WriteEntry& e : entries) {
    OrderedJson shape = OrderedJson::array();
    for (int64_t d : e.tensor->sizes()) shape.push_back(d);
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = e.dtype;
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = OrderedJson::array({offset, offset + e.nbytes});
    header[*e.name] = std::move(entry);
    offset += e.nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const OrderedJson::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "a tensor name or metadata string is not valid UTF-8: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  const std::string prefix = absl::StrCat("writing safetensors file '", path, "': ");
  ASYMPO_ASSIGN_OR_RETURN(const std::vector<WriteEntry> entries, WriteEntries(prefix, tensors));
  ASYMPO_ASSIGN_OR_RETURN(const std::string header_text, HeaderText(prefix, entries, metadata));
  uint8_t length[8];  // little-endian u64
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(header_text.size() >> (8 * i));
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> writer, AtomicFileWriter::Create(path));
  ASYMPO_RETURN_IF_ERROR(writer->Append(length, sizeof(length)));
  ASYMPO_RETURN_IF_ERROR(writer->Append(header_text));
  for (const WriteEntry& e : entries) {
    if (e.nbytes == 0) continue;
    at::Tensor data;
    try {
      // One tensor at a time on the host, so a GPU model is never copied whole.
      data = e.tensor->detach().to(at::kCPU).contiguous();
    } catch (const c10::Error& error) {
      return absl::InternalError(absl::StrCat(prefix, "cannot copy tensor '", *e.name,
                                              "' to the host: ", error.what_without_backtrace()));
    }
    ASYMPO_RETURN_IF_ERROR(writer->Append(data.data_ptr(), e.nbytes));
  }
  return writer->Commit();
}

}  // namespace asympo
