// Internals of common/wire/wire_check.cc and batch_wire_check.cc: the
// slices of a serialized message as one protobuf input stream, and a reader
// of a message's fields that keeps the first fault with its byte offset.
// Not part of the public API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/wire/wire_check.h"

namespace asympo::wire_internal {

using google::protobuf::io::CodedInputStream;

enum WireType : int {
  kVarint = 0,
  kFixed64 = 1,
  kLen = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// The slices as one protobuf input stream, without copying them.
class SlicesStream final : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit SlicesStream(const WireSlices& slices) : slices_(slices) {}

  bool Next(const void** data, int* size) override {
    if (backed_up_ > 0) {
      *data = current_.data() + current_.size() - backed_up_;
      *size = backed_up_;
      count_ += backed_up_;
      backed_up_ = 0;
      return true;
    }
    while (next_ < slices_.size() && slices_[next_].empty()) ++next_;
    if (next_ == slices_.size()) return false;
    current_ = slices_[next_++];
    *data = current_.data();
    *size = static_cast<int>(current_.size());
    count_ += *size;
    return true;
  }
  void BackUp(int count) override {
    backed_up_ = count;
    count_ -= count;
  }
  bool Skip(int count) override {
    const void* data;
    int size;
    while (count > 0) {
      if (!Next(&data, &size)) return false;
      if (size > count) {
        BackUp(size - count);
        return true;
      }
      count -= size;
    }
    return true;
  }
  int64_t ByteCount() const override { return count_; }

 private:
  const WireSlices& slices_;
  size_t next_ = 0;
  absl::string_view current_;
  int backed_up_ = 0;
  int64_t count_ = 0;
};

// Reads the fields of one message (up to the current limit of `in`): the
// shared mechanics of both checks. A fault is kept in `status`, with the
// byte where it was found.
class FieldReader {
 public:
  FieldReader(CodedInputStream* in, absl::Status* status) : in_(in), status_(status) {}

  // The next field's number and wire type; false at the message's end or
  // on a fault (then status is set).
  bool Next(int* number, int* wire_type) {
    field_start_ = in_->CurrentPosition();
    // Looked at before the read: a tag that fails to decode may consume
    // what is left.
    if (in_->BytesUntilLimit() == 0) return false;
    // A tag is a varint of at most 5 bytes, cut to 32 bits, as protobuf's
    // parser reads it (CodedInputStream::ReadTag would take up to 10).
    uint64_t wide = 0;
    if (!in_->ReadVarint64(&wide) || in_->CurrentPosition() - field_start_ > 5) {
      return Fault("a field tag does not decode");
    }
    const uint32_t tag = static_cast<uint32_t>(wide);
    if (tag == 0) return Fault("a field tag does not decode");
    *number = static_cast<int>(tag >> 3);
    *wire_type = static_cast<int>(tag & 7);
    if (*number == 0) return Fault("a field has the number 0, which no field has");
    if (*wire_type == kStartGroup || *wire_type == kEndGroup) {
      return Fault("a field uses the group wire type, which proto3 does not have");
    }
    if (*wire_type > kFixed32) return Fault("a field has an unknown wire type");
    return true;
  }

  // The length of a length-delimited field, within the bytes left.
  bool Length(uint32_t* length) {
    // At most 5 bytes and 31 bits, as protobuf's parser reads a size
    // (ReadVarint32 would take 10 bytes and drop the high bits).
    const int start = in_->CurrentPosition();
    uint64_t wide = 0;
    if (!in_->ReadVarint64(&wide) || in_->CurrentPosition() - start > 5 || wide > 0x7fffffff) {
      return Fault("a field length does not decode");
    }
    *length = static_cast<uint32_t>(wide);
    if (static_cast<int64_t>(*length) > in_->BytesUntilLimit()) {
      return Fault("a field's length runs past the end of its message");
    }
    return true;
  }

  // Skips the payload of a field of `wire_type` (its tag was read).
  bool Skip(int wire_type) {
    uint64_t v;
    uint32_t length;
    switch (wire_type) {
      case kVarint:
        return in_->ReadVarint64(&v) || Fault("a varint does not decode");
      case kFixed64:
        return in_->ReadLittleEndian64(&v) || Fault("a 64-bit field is cut short");
      case kFixed32: {
        uint32_t w;
        return in_->ReadLittleEndian32(&w) || Fault("a 32-bit field is cut short");
      }
      case kLen:
        return Length(&length) && (in_->Skip(static_cast<int>(length)) || Fault("cut short"));
      default:
        return Fault("a field has an unknown wire type");
    }
  }

  // Counts the elements of a packed field of `length` bytes whose elements
  // have `element_wire_type`.
  bool PackedCount(uint32_t length, int element_wire_type, int64_t* count) {
    switch (element_wire_type) {
      case kFixed32:
      case kFixed64: {
        const uint32_t size = element_wire_type == kFixed32 ? 4 : 8;
        if (length % size != 0) return Fault("a packed field's length is not a whole count");
        *count = length / size;
        return in_->Skip(static_cast<int>(length)) || Fault("cut short");
      }
      case kVarint: {
        // Elements are the bytes without the continuation bit; scanned in
        // place (a varint read per element made the check cost twice the
        // parse). A varint may have at most 10 bytes, as ReadVarint64 takes.
        *count = 0;
        int run = 0;  // continuation bytes in a row
        for (int64_t left = length; left > 0;) {
          const void* data = nullptr;
          int size = 0;
          if (!in_->GetDirectBufferPointer(&data, &size) || size <= 0) {
            return Fault("a packed field is cut short");
          }
          const int n = static_cast<int>(std::min<int64_t>(size, left));
          const auto* p = static_cast<const uint8_t*>(data);
          for (int i = 0; i < n; ++i) {
            if ((p[i] & 0x80) == 0) {
              ++*count;
              run = 0;
            } else if (++run >= 10) {
              return Fault("a packed varint does not decode");
            }
          }
          in_->Skip(n);
          left -= n;
        }
        if (run != 0) return Fault("a packed varint does not decode");
        return true;
      }
      default:
        return Fault("a packed field has an unknown element type");
    }
  }

  // Reads a string field of `length` bytes, keeping at most `keep` of them
  // in `out`; `valid_utf8` tells whether all of it was UTF-8 (only checked
  // when length <= max_checked).
  bool String(uint32_t length, size_t keep, std::string* out, bool* valid_utf8) {
    std::string bytes;
    if (!in_->ReadString(&bytes, static_cast<int>(length))) return Fault("a string is cut short");
    *valid_utf8 = IsValidUtf8(bytes);
    if (bytes.size() > keep) bytes.resize(keep);
    *out = std::move(bytes);
    return true;
  }

  bool Fault(absl::string_view what) {
    if (status_->ok()) {
      *status_ =
          absl::InvalidArgumentError(absl::StrCat(what, " (the field at byte ", field_start_, ")"));
    }
    return false;
  }

  CodedInputStream* in() { return in_; }
  // No fault so far (Next returns false at a fault too).
  bool ok() const { return status_->ok(); }

 private:
  CodedInputStream* in_;
  absl::Status* status_;
  // Where the field being read began: a fault is reported there (the byte
  // where decoding failed depends on how the input is sliced).
  int field_start_ = 0;
};

// INVALID_ARGUMENT "the request is not a valid <type>: <fault>".
absl::Status NotValid(const std::string& type, const absl::Status& fault);

}  // namespace asympo::wire_internal
