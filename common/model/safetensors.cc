#include "common/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/safetensors_io.h"
#include "common/status_macros.h"

// The format stores little-endian bytes; this code copies them as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes little-endian");

namespace asympo {
namespace {

using Json = nlohmann::json;

// The reference reader's limit; larger headers are refused as corrupt.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr char kMetadataKey[] = "__metadata__";

struct DtypeEntry {
  const char* name;
  size_t size;
  bool has_torch_type;
  at::ScalarType torch_type;
};

constexpr DtypeEntry kDtypes[] = {
    {"F64", 8, true, at::kDouble},    {"F32", 4, true, at::kFloat},
    {"F16", 2, true, at::kHalf},      {"BF16", 2, true, at::kBFloat16},
    {"I64", 8, true, at::kLong},      {"I32", 4, true, at::kInt},
    {"I16", 2, true, at::kShort},     {"I8", 1, true, at::kChar},
    {"U8", 1, true, at::kByte},       {"BOOL", 1, true, at::kBool},
    {"U64", 8, false, at::kByte},     {"U32", 4, false, at::kByte},
    {"U16", 2, false, at::kByte},     {"F8_E4M3", 1, false, at::kByte},
    {"F8_E5M2", 1, false, at::kByte},
};

const DtypeEntry* FindDtype(std::string_view name) {
  for (const DtypeEntry& e : kDtypes) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Parses one tensor entry of the header; `prefix` names the file.
absl::StatusOr<SafetensorsTensorInfo> ParseTensorEntry(const std::string& prefix,
                                                       const std::string& name, const Json& entry) {
  const std::string where = absl::StrCat(prefix, "tensor '", name, "': ");
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "entry must be a JSON object"));
  }
  SafetensorsTensorInfo info;
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "\"dtype\" must be a string"));
  }
  info.dtype = dtype->get<std::string>();
  const DtypeEntry* dtype_entry = FindDtype(info.dtype);
  if (dtype_entry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, "unknown dtype \"", info.dtype, "\""));
  }
  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "\"shape\" must be an array"));
  }
  uint64_t numel = 1;
  for (const Json& dim : *shape) {
    if (!dim.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "shape ", shape->dump(), " holds a non-integer"));
    }
    if (!dim.is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "shape ", shape->dump(), " has a negative dimension"));
    }
    const uint64_t d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, d, &numel) ||
        numel > static_cast<uint64_t>(INT64_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "shape ", shape->dump(), " has too many elements"));
    }
    info.shape.push_back(static_cast<int64_t>(d));
  }
  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "\"data_offsets\" must be two non-negative integers [begin, end], got ",
                     offsets == entry.end() ? "nothing" : offsets->dump()));
  }
  info.begin = (*offsets)[0].get<uint64_t>();
  info.end = (*offsets)[1].get<uint64_t>();
  if (info.end < info.begin) {
    return absl::InvalidArgumentError(absl::StrCat(where, "data_offsets [", info.begin, ", ",
                                                   info.end, "] end before they begin"));
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(numel, uint64_t{dtype_entry->size}, &expected_bytes) ||
      info.end - info.begin != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "data_offsets [", info.begin, ", ", info.end, "] span ",
                     info.end - info.begin, " bytes, but shape ", ShapeText(info.shape), " of ",
                     info.dtype, " needs ", numel, " * ", dtype_entry->size, " bytes"));
  }
  return info;
}

}  // namespace

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t SafetensorsDtypeSize(std::string_view dtype) {
  const DtypeEntry* e = FindDtype(dtype);
  return e == nullptr ? 0 : e->size;
}

absl::StatusOr<at::ScalarType> SafetensorsDtypeToScalarType(std::string_view dtype) {
  const DtypeEntry* e = FindDtype(dtype);
  if (e == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown safetensors dtype \"", std::string(dtype), "\""));
  }
  if (!e->has_torch_type) {
    return absl::UnimplementedError(
        absl::StrCat("safetensors dtype ", std::string(dtype), " has no LibTorch equivalent here"));
  }
  return e->torch_type;
}

absl::StatusOr<std::string> ScalarTypeToSafetensorsDtype(at::ScalarType type) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.has_torch_type && e.torch_type == type) return std::string(e.name);
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

namespace {

// The little-endian u64 header length at bytes 0-7, checked against the file.
absl::StatusOr<uint64_t> HeaderLength(const std::string& prefix, const FileMapping& mapping) {
  const uint64_t file_size = mapping.size();
  if (file_size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "file is ", file_size, " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_length = 0;
  std::memcpy(&header_length, mapping.data(), 8);
  if (header_length > file_size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "header length ", header_length, " (bytes 0-7) runs past the end of ",
                     "the file: header would end at byte offset ", 8 + header_length,
                     ", file size is ", file_size));
  }
  if (header_length > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "header length ", header_length,
                                                   " exceeds the limit of ", kMaxHeaderBytes));
  }
  return header_length;
}

// The header at bytes [8, 8 + length) as a JSON object whose top-level names
// are all distinct (a JSON object would silently keep the last of two).
absl::StatusOr<Json> ParseHeaderJson(const std::string& prefix, const FileMapping& mapping,
                                     uint64_t length) {
  std::set<std::string> top_keys;
  std::string duplicate;
  const Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key && duplicate.empty() &&
        !top_keys.insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  const char* begin = reinterpret_cast<const char*>(mapping.data()) + 8;
  Json header;
  try {
    header = Json::parse(begin, begin + length, on_event);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "header (byte offsets 8 to ", 8 + length,
                                                   ") is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "header must be a JSON object, got a ", header.type_name()));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "header names '", duplicate, "' more than once"));
  }
  return header;
}

// "__metadata__": an object of strings.
absl::Status ParseMetadata(const std::string& prefix, const Json& entry,
                           std::map<std::string, std::string>* metadata) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "\"__metadata__\" must be an object of strings"));
  }
  for (const auto& [key, value] : entry.items()) {
    if (!value.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "\"__metadata__\" value for '", key,
                                                     "' must be a string, got ", value.dump()));
    }
    (*metadata)[key] = value.get<std::string>();
  }
  return absl::OkStatus();
}

// The tensors must tile the data region exactly, as the reference reader
// requires: sorted by offset, each begins where the previous one ended.
absl::Status CheckTiling(const std::string& prefix,
                         const std::map<std::string, SafetensorsTensorInfo>& tensors,
                         uint64_t data_start, uint64_t file_size) {
  const uint64_t data_size = file_size - data_start;
  std::vector<const std::pair<const std::string, SafetensorsTensorInfo>*> by_offset;
  for (const auto& item : tensors) by_offset.push_back(&item);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return std::tie(a->second.begin, a->second.end) < std::tie(b->second.begin, b->second.end);
  });
  uint64_t position = 0;
  const std::string* previous = nullptr;
  for (const auto* item : by_offset) {
    const SafetensorsTensorInfo& info = item->second;
    if (info.begin < position) {
      const SafetensorsTensorInfo& other = tensors.at(*previous);
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "tensors '", *previous, "' (data_offsets [", other.begin, ", ", other.end,
          "]) and '", item->first, "' (data_offsets [", info.begin, ", ", info.end, "]) overlap"));
    }
    if (info.begin > position) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "data bytes at byte offsets ", data_start + position, " to ",
                       data_start + info.begin, " belong to no tensor (a gap before tensor '",
                       item->first, "')"));
    }
    position = info.end;
    previous = &item->first;
  }
  if (position != data_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "tensors end at byte offset ", data_start + position, " but the file has ",
        file_size, " bytes (", data_size - position, " trailing bytes belong to no tensor)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SafetensorsFile::ParseHeader() {
  const std::string prefix = absl::StrCat("safetensors file '", path_, "': ");
  const uint64_t file_size = mapping_->size();
  ASYMPO_ASSIGN_OR_RETURN(const uint64_t header_length, HeaderLength(prefix, *mapping_));
  data_start_ = 8 + header_length;
  ASYMPO_ASSIGN_OR_RETURN(const Json header, ParseHeaderJson(prefix, *mapping_, header_length));
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      ASYMPO_RETURN_IF_ERROR(ParseMetadata(prefix, entry, &metadata_));
      continue;
    }
    ASYMPO_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, ParseTensorEntry(prefix, name, entry));
    if (info.end > file_size - data_start_) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tensor '", name, "' (data_offsets [", info.begin, ", ", info.end,
                       "]) ends at byte offset ", data_start_ + info.end,
                       ", past the end of the file (size ", file_size, ")"));
    }
    tensors_.emplace(name, std::move(info));
  }
  return CheckTiling(prefix, tensors_, data_start_, file_size);
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

namespace {}  // namespace

absl::Status CheckTensorsToWrite(const std::string& prefix,
                                 const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::set<std::string_view> names;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == kMetadataKey) {
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
  header[kMetadataKey] = std::move(meta);
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
