#include "common/wire/wire_check.h"

#include <algorithm>
#include <utility>

#include <google/protobuf/io/coded_stream.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire/wire_reader.h"

namespace asympo {
namespace wire_internal {

absl::Status NotValid(const std::string& type, const absl::Status& fault) {
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", type, ": ", fault.message()));
}

}  // namespace wire_internal

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using wire_internal::CodedInputStream;
using wire_internal::FieldReader;
using wire_internal::kFixed32;
using wire_internal::kFixed64;
using wire_internal::kLen;
using wire_internal::kVarint;
using wire_internal::SlicesStream;

// The wire type a scalar field's elements use.
int ScalarWireType(const FieldDescriptor& f) {
  switch (f.type()) {
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
    case FieldDescriptor::TYPE_FLOAT:
      return kFixed32;
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
    case FieldDescriptor::TYPE_DOUBLE:
      return kFixed64;
    case FieldDescriptor::TYPE_STRING:
    case FieldDescriptor::TYPE_BYTES:
    case FieldDescriptor::TYPE_MESSAGE:
    case FieldDescriptor::TYPE_GROUP:
      return kLen;
    default:
      return kVarint;
  }
}

absl::Status WalkMessage(CodedInputStream* in, const Descriptor& type, const WireLimits& limits,
                         int depth);

// One known field of a generic message; `elements` counts what it adds to
// a repeated field.
absl::Status WalkKnownField(FieldReader& r, const FieldDescriptor& f, int wire_type,
                            const WireLimits& limits, int depth, int64_t* elements) {
  absl::Status status;
  CodedInputStream* in = r.in();
  *elements = 1;
  if (wire_type != kLen) {
    r.Skip(wire_type);
    return status;
  }
  uint32_t length = 0;
  if (!r.Length(&length)) return status;
  if (f.type() == FieldDescriptor::TYPE_MESSAGE) {
    const auto limit = in->PushLimit(static_cast<int>(length));
    ASYMPO_RETURN_IF_ERROR(WalkMessage(in, *f.message_type(), limits, depth + 1));
    in->PopLimit(limit);
    return status;
  }
  if (f.type() == FieldDescriptor::TYPE_STRING || f.type() == FieldDescriptor::TYPE_BYTES) {
    if (length > limits.max_string_bytes) {
      r.Fault(absl::StrCat("field ", f.name(), " is ", length, " bytes, more than ",
                           limits.max_string_bytes));
      return status;
    }
    if (f.type() == FieldDescriptor::TYPE_BYTES) {
      if (!in->Skip(static_cast<int>(length))) r.Fault("a field is cut short");
      return status;
    }
    std::string kept;
    bool utf8 = true;
    if (r.String(length, 0, &kept, &utf8) && !utf8) {
      r.Fault(absl::StrCat("field ", f.name(), " is not valid UTF-8"));
    }
    return status;
  }
  r.PackedCount(length, ScalarWireType(f), elements);  // a packed repeated scalar
  return status;
}

absl::Status WalkMessage(CodedInputStream* in, const Descriptor& type, const WireLimits& limits,
                         int depth) {
  absl::Status status;
  FieldReader r(in, &status);
  if (depth > limits.max_depth) {
    r.Fault(absl::StrCat("messages are nested more than ", limits.max_depth, " deep"));
    return status;
  }
  std::vector<std::pair<int, int64_t>> counts;  // repeated field number -> elements
  int64_t unknown = 0;
  int number = 0, wire_type = 0;
  while (r.Next(&number, &wire_type)) {
    const FieldDescriptor* f = type.FindFieldByNumber(number);
    const bool fits = f != nullptr &&
                      (ScalarWireType(*f) == wire_type || (wire_type == kLen && f->is_packable()));
    if (!fits) {
      if (++unknown > limits.max_unknown_fields) {
        r.Fault(absl::StrCat("more than ", limits.max_unknown_fields, " unknown fields in one ",
                             type.name()));
        break;
      }
      if (!r.Skip(wire_type)) break;
      continue;
    }
    int64_t elements = 0;
    ASYMPO_RETURN_IF_ERROR(WalkKnownField(r, *f, wire_type, limits, depth, &elements));
    if (!status.ok()) break;
    if (!f->is_repeated()) continue;
    auto it = std::find_if(counts.begin(), counts.end(),
                           [number](const auto& c) { return c.first == number; });
    if (it == counts.end()) it = counts.insert(counts.end(), {number, 0});
    it->second += elements;
    if (it->second > limits.max_repeated) {
      r.Fault(
          absl::StrCat("field ", f->name(), " has more than ", limits.max_repeated, " elements"));
      break;
    }
  }
  return status;
}

}  // namespace

int64_t WireSize(const WireSlices& wire) {
  int64_t n = 0;
  for (absl::string_view s : wire) n += static_cast<int64_t>(s.size());
  return n;
}

absl::Status CheckMessageWire(const Descriptor& type, const WireSlices& wire,
                              const WireLimits& limits) {
  const int64_t size = WireSize(wire);
  if (size > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request is ", size, " bytes; a ", type.full_name(), " is at most ", limits.max_bytes));
  }
  SlicesStream stream(wire);
  CodedInputStream in(&stream);
  in.PushLimit(static_cast<int>(size));
  absl::Status s = WalkMessage(&in, type, limits, 0);
  return s.ok() ? s : wire_internal::NotValid(type.full_name(), s);
}

absl::Status ParseCheckedWire(const WireSlices& wire, google::protobuf::Message* message) {
  SlicesStream stream(wire);
  if (!message->ParseFromZeroCopyStream(&stream)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a valid ", message->GetTypeName(), ": it does not parse"));
  }
  return absl::OkStatus();
}

bool IsValidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int n;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= n) return false;
    for (int i = 1; i <= n; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    p += n + 1;
  }
  return true;
}

}  // namespace asympo