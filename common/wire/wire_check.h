// Checks of a serialized request before it is parsed.
//
// The learner serves its gRPC methods raw (grpc::ByteBuffer) and parses the
// requests itself, for three reasons gRPC's own parsing cannot meet:
// - Memory: a 2-byte empty group on the wire becomes a PromptGroup object of
//   about 100 bytes, so a 60 MB Submit of 30 million empty groups would take
//   gigabytes before validation could refuse it. The counts that
//   ValidateRolloutBatch bounds (groups, responses, tokens) and the number
//   of unknown fields are checked here on the bytes, without allocating.
// - Errors: a request gRPC cannot parse gets UNIMPLEMENTED with an empty
//   message from a callback service, and a SubmitStream read that fails
//   looks like the client's half-close (the stream answered OK). Here it is
//   INVALID_ARGUMENT naming the message type and the fault.
// - Logs: protobuf logs one ERROR line for each string field that is not
//   valid UTF-8. Strings are checked here first, so the parser never sees
//   one.
//
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/batch_validation.h"

namespace asympo {

// A serialized message as gRPC hands it over: one or more slices, in order.
using WireSlices = std::vector<absl::string_view>;

// Bounds of CheckMessageWire, for any message type.
struct WireLimits {
  // The whole message's bytes.
  int64_t max_bytes = 64 << 10;
  // Elements of one repeated field in one message.
  int64_t max_repeated = 1024;
  // Bytes of one string or bytes field.
  int64_t max_string_bytes = 4096;
  // Fields unknown to this build's schema, in one message (a newer
  // protocol's fields are few; they are kept by the parser, then dropped).
  int64_t max_unknown_fields = 64;
  // Nesting of messages.
  int max_depth = 16;
};

// Bytes in `wire`.
int64_t WireSize(const WireSlices& wire);

// Checks that `wire` is a well-formed serialization of a `type` message
// within `limits`: every tag and length decodes, string fields are valid
// UTF-8, no group wire type (proto3 has none). OK, or INVALID_ARGUMENT
// "the request is not a valid <full type name>: <fault>".
absl::Status CheckMessageWire(const google::protobuf::Descriptor& type, const WireSlices& wire,
                              const WireLimits& limits = {});

// As CheckMessageWire for an asympo.v1.RolloutBatch, with the counts of
// `limits` (groups per batch, responses per group, tokens per prompt and
// response, behavior log-probs per response) and the byte lengths of
// source, batch_id and prompt_id checked on the wire. A count over its
// limit gets ValidateRolloutBatch's own message for it; the other rules
// are left to ValidateRolloutBatch after parsing. At most `max_bytes` in
// all (the learner's gRPC message limit).
absl::Status CheckRolloutBatchWire(const WireSlices& wire, const BatchLimits& limits,
                                   int64_t max_bytes = int64_t{64} << 20);

// Parses `wire` (already checked) into `message`. INVALID_ARGUMENT naming
// the type when it does not parse.
absl::Status ParseCheckedWire(const WireSlices& wire, google::protobuf::Message* message);

// Whether `s` is valid UTF-8 (no overlong forms, surrogates or code points
// beyond U+10FFFF), as proto3 requires of string fields.
bool IsValidUtf8(absl::string_view s);

}  // namespace asympo
