// The wire check of a RolloutBatch (common/wire/wire_check.h,
// CheckRolloutBatchWire): counts and lengths bounded on the bytes, with the
// validator's own messages.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asympo/v1/rollout.pb.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/wire/wire_check.h"
#include "common/wire/wire_reader.h"

namespace asympo {
namespace {

using wire_internal::CodedInputStream;
using wire_internal::FieldReader;
using wire_internal::kFixed32;
using wire_internal::kFixed64;
using wire_internal::kLen;
using wire_internal::kVarint;
using wire_internal::NotValid;
using wire_internal::SlicesStream;

const char kBatchType[] = "asympo.v1.RolloutBatch";

// ---- RolloutBatch ----

struct ResponseCounts {
  int64_t tokens = 0;
  int64_t logprobs = 0;
  int64_t mask = 0;  // loss_mask entries
};

// What the check of one group found on the wire.
struct GroupWire {
  uint32_t prompt_id_bytes = 0;
  std::string prompt_id;  // its first 65 bytes: enough for QuoteForMessage
  bool prompt_id_utf8 = true;
  int64_t prompt_tokens = 0;
  int64_t responses = 0;
  std::vector<ResponseCounts> kept;  // the first max_group_size responses
};

// Counts the elements of a repeated scalar (packed or not) into `count`.
bool CountScalars(FieldReader& r, int wire_type, int element_wire_type, int64_t* count) {
  if (wire_type == kLen) {
    uint32_t length = 0;
    int64_t n = 0;
    if (!r.Length(&length) || !r.PackedCount(length, element_wire_type, &n)) return false;
    *count += n;
    return true;
  }
  ++*count;
  return r.Skip(wire_type);
}

bool WalkResponse(FieldReader& r, const WireLimits& limits, ResponseCounts* c) {
  int number = 0, wire_type = 0;
  int64_t unknown = 0;
  while (r.Next(&number, &wire_type)) {
    bool ok;
    if (number == v1::Response::kTokensFieldNumber && (wire_type == kLen || wire_type == kVarint)) {
      ok = CountScalars(r, wire_type, kVarint, &c->tokens);
    } else if (number == v1::Response::kBehaviorLogprobsFieldNumber &&
               (wire_type == kLen || wire_type == kFixed32)) {
      ok = CountScalars(r, wire_type, kFixed32, &c->logprobs);
    } else if (number == v1::Response::kLossMaskFieldNumber &&
               (wire_type == kLen || wire_type == kVarint)) {
      ok = CountScalars(r, wire_type, kVarint, &c->mask);
    } else {
      const bool known =
          (number == v1::Response::kRewardFieldNumber && wire_type == kFixed32) ||
          (number == v1::Response::kFinishReasonFieldNumber && wire_type == kVarint) ||
          (number == v1::Response::kFirstPolicyVersionFieldNumber && wire_type == kVarint) ||
          (number == v1::Response::kLastPolicyVersionFieldNumber && wire_type == kVarint);
      if (!known && ++unknown > limits.max_unknown_fields) {
        return r.Fault(absl::StrCat("more than ", limits.max_unknown_fields,
                                    " unknown fields in one Response"));
      }
      ok = r.Skip(wire_type);
    }
    if (!ok) return false;
  }
  return r.ok();  // the loop also ends at a fault
}

bool WalkGroup(FieldReader& r, const BatchLimits& batch_limits, const WireLimits& limits,
               GroupWire* g) {
  CodedInputStream* in = r.in();
  int number = 0, wire_type = 0;
  int64_t unknown = 0;
  while (r.Next(&number, &wire_type)) {
    bool ok;
    uint32_t length = 0;
    if (number == v1::PromptGroup::kPromptIdFieldNumber && wire_type == kLen) {
      // The parser keeps the last occurrence, but refuses any that is not
      // UTF-8; the first 65 bytes are enough for the message.
      bool utf8 = true;
      ok = r.Length(&length) && r.String(length, 65, &g->prompt_id, &utf8);
      g->prompt_id_bytes = length;
      g->prompt_id_utf8 = g->prompt_id_utf8 && utf8;
    } else if (number == v1::PromptGroup::kPromptTokensFieldNumber &&
               (wire_type == kLen || wire_type == kVarint)) {
      ok = CountScalars(r, wire_type, kVarint, &g->prompt_tokens);
    } else if (number == v1::PromptGroup::kResponsesFieldNumber && wire_type == kLen) {
      ResponseCounts c;
      ok = r.Length(&length);
      if (ok) {
        const auto limit = in->PushLimit(static_cast<int>(length));
        ok = WalkResponse(r, limits, &c);
        in->PopLimit(limit);
      }
      if (++g->responses <= batch_limits.max_group_size) g->kept.push_back(c);
    } else {
      if (++unknown > limits.max_unknown_fields) {
        return r.Fault(absl::StrCat("more than ", limits.max_unknown_fields,
                                    " unknown fields in one PromptGroup"));
      }
      ok = r.Skip(wire_type);
    }
    if (!ok) return false;
  }
  return r.ok();  // the loop also ends at a fault
}

// The first count over its limit in group `index`, in ValidateRolloutBatch's
// order and with its messages.
absl::Status CheckGroupCounts(int index, const GroupWire& g, const BatchLimits& l) {
  const std::string where =
      absl::StrCat("group ", index, " (prompt_id ", QuoteForMessage(g.prompt_id), ")");
  auto invalid = [&](const std::string& rule) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", rule));
  };
  if (g.prompt_id_bytes > kMaxPromptIdBytes) {
    return invalid(
        absl::StrCat("prompt_id is ", g.prompt_id_bytes, " bytes, more than ", kMaxPromptIdBytes));
  }
  if (!g.prompt_id_utf8) return invalid("prompt_id is not valid UTF-8");
  if (g.prompt_tokens > l.max_prompt_tokens) {
    return invalid(absl::StrCat("prompt has ", g.prompt_tokens,
                                " tokens, more than max_prompt_tokens ", l.max_prompt_tokens));
  }
  if (g.responses > l.max_group_size) {
    return invalid(absl::StrCat("group has ", g.responses, " responses; group size must be in [",
                                l.min_group_size, ", ", l.max_group_size, "]"));
  }
  for (size_t j = 0; j < g.kept.size(); ++j) {
    const ResponseCounts& c = g.kept[j];
    const std::string at = absl::StrCat(where, " response ", j, ": ");
    if (c.tokens > l.max_response_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(at, "response has ", c.tokens,
                                                     " tokens, more than max_response_tokens ",
                                                     l.max_response_tokens));
    }
    if (c.logprobs > l.max_response_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(at, "behavior_logprobs has ", c.logprobs,
                                                     " values for ", c.tokens,
                                                     " tokens; they must match one to one"));
    }
    if (c.mask > l.max_response_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, "loss_mask has ", c.mask, " entries for ", c.tokens,
                       " tokens; it needs one per token (or none: every token generated)"));
    }
  }
  return absl::OkStatus();
}

// The top level of a batch: the group count, source and batch_id.
absl::Status CheckBatchTop(const WireSlices& wire, const BatchLimits& l, const WireLimits& limits) {
  SlicesStream stream(wire);
  CodedInputStream in(&stream);
  in.PushLimit(static_cast<int>(WireSize(wire)));
  absl::Status status;
  FieldReader r(&in, &status);
  int64_t groups = 0, unknown = 0;
  uint32_t source_bytes = 0, batch_id_bytes = 0;
  bool source_utf8 = true, batch_id_utf8 = true;
  int number = 0, wire_type = 0;
  while (r.Next(&number, &wire_type)) {
    bool ok;
    uint32_t length = 0;
    const bool source = number == v1::RolloutBatch::kSourceFieldNumber;
    const bool batch_id = number == v1::RolloutBatch::kBatchIdFieldNumber;
    if (number == v1::RolloutBatch::kGroupsFieldNumber && wire_type == kLen) {
      ++groups;
      ok = r.Skip(wire_type);
    } else if ((source || batch_id) && wire_type == kLen) {
      uint32_t& bytes = source ? source_bytes : batch_id_bytes;
      bool& all_utf8 = source ? source_utf8 : batch_id_utf8;
      std::string ignored;
      bool utf8 = true;
      ok = r.Length(&length) && r.String(length, 0, &ignored, &utf8);
      bytes = length;  // the parser keeps the last occurrence, and checks all
      all_utf8 = all_utf8 && utf8;
    } else {
      if (++unknown > limits.max_unknown_fields) {
        r.Fault(absl::StrCat("more than ", limits.max_unknown_fields,
                             " unknown fields in one RolloutBatch"));
        break;
      }
      ok = r.Skip(wire_type);
    }
    if (!ok) break;
  }
  if (!status.ok()) return NotValid(kBatchType, status);
  if (groups > l.max_groups_per_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch has ", groups, " groups, more than max_groups_per_batch ", l.max_groups_per_batch));
  }
  if (source_bytes > kMaxSourceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch source is ", source_bytes, " bytes, more than ", kMaxSourceBytes));
  }
  if (batch_id_bytes > kMaxBatchIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_id is ", batch_id_bytes, " bytes, more than ", kMaxBatchIdBytes));
  }
  if (!source_utf8) return absl::InvalidArgumentError("batch source is not valid UTF-8");
  if (!batch_id_utf8) return absl::InvalidArgumentError("batch_id is not valid UTF-8");
  return absl::OkStatus();
}
}  // namespace

absl::Status CheckRolloutBatchWire(const WireSlices& wire, const BatchLimits& limits,
                                   int64_t max_bytes) {
  const int64_t size = WireSize(wire);
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch is ", size, " bytes, more than the learner's ", max_bytes));
  }
  WireLimits wire_limits;
  wire_limits.max_bytes = max_bytes;
  ASYMPO_RETURN_IF_ERROR(CheckBatchTop(wire, limits, wire_limits));
  SlicesStream stream(wire);
  CodedInputStream in(&stream);
  in.PushLimit(static_cast<int>(size));
  absl::Status status;
  FieldReader r(&in, &status);
  int number = 0, wire_type = 0, index = 0;
  while (r.Next(&number, &wire_type)) {
    if (number != v1::RolloutBatch::kGroupsFieldNumber || wire_type != kLen) {
      if (!r.Skip(wire_type)) break;
      continue;
    }
    uint32_t length = 0;
    if (!r.Length(&length)) break;
    const auto limit = in.PushLimit(static_cast<int>(length));
    GroupWire g;
    const bool ok = WalkGroup(r, limits, wire_limits, &g);
    in.PopLimit(limit);
    if (!ok) break;
    ASYMPO_RETURN_IF_ERROR(CheckGroupCounts(index++, g, limits));
  }
  return status.ok() ? status : NotValid(kBatchType, status);
}

}  // namespace asympo
