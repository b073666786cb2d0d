#include "common/model/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

using Json = nlohmann::json;

// The reference reader's limit; larger headers are refused as corrupt.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeSize {
  const char* name;
  size_t size;
};

constexpr DtypeSize kDtypeSizes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2},    {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},      {"BOOL", 1},
    {"U64", 8}, {"U32", 4}, {"U16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

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
  const size_t element_size = SafetensorsDtypeSize(info.dtype);
  if (element_size == 0) {
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
  if (__builtin_mul_overflow(numel, uint64_t{element_size}, &expected_bytes) ||
      info.end - info.begin != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "data_offsets [", info.begin, ", ", info.end, "] span ",
                     info.end - info.begin, " bytes, but shape ", ShapeText(info.shape), " of ",
                     info.dtype, " needs ", numel, " * ", element_size, " bytes"));
  }
  return info;
}

// The little-endian u64 header length at bytes 0-7, checked against the file.
absl::StatusOr<uint64_t> HeaderLength(const std::string& prefix, const uint8_t* data,
                                      uint64_t file_size) {
  if (file_size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "file is ", file_size, " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_length = 0;
  std::memcpy(&header_length, data, 8);
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
absl::StatusOr<Json> ParseHeaderJson(const std::string& prefix, const uint8_t* data,
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
  const char* begin = reinterpret_cast<const char*>(data) + 8;
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

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t SafetensorsDtypeSize(std::string_view dtype) {
  for (const DtypeSize& e : kDtypeSizes) {
    if (dtype == e.name) return e.size;
  }
  return 0;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, uint64_t size,
                                                         const std::string& prefix) {
  SafetensorsHeader out;
  ASYMPO_ASSIGN_OR_RETURN(const uint64_t header_length, HeaderLength(prefix, data, size));
  out.data_start = 8 + header_length;
  ASYMPO_ASSIGN_OR_RETURN(const Json header, ParseHeaderJson(prefix, data, header_length));
  for (const auto& [name, entry] : header.items()) {
    if (name == kSafetensorsMetadataKey) {
      ASYMPO_RETURN_IF_ERROR(ParseMetadata(prefix, entry, &out.metadata));
      continue;
    }
    ASYMPO_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, ParseTensorEntry(prefix, name, entry));
    if (info.end > size - out.data_start) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tensor '", name, "' (data_offsets [", info.begin, ", ", info.end,
                       "]) ends at byte offset ", out.data_start + info.end,
                       ", past the end of the file (size ", size, ")"));
    }
    out.tensors.emplace(name, std::move(info));
  }
  ASYMPO_RETURN_IF_ERROR(CheckTiling(prefix, out.tensors, out.data_start, size));
  return out;
}

}  // namespace asympo
