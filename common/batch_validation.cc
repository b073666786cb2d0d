#include "common/batch_validation.h"

#include <cmath>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

std::string GroupWhere(int g, const v1::PromptGroup& group) {
  return absl::StrCat("group ", g, " (prompt_id ", QuoteForMessage(group.prompt_id()), ")");
}

absl::Status CheckTokens(const google::protobuf::RepeatedField<int32_t>& tokens, int32_t vocab_size,
                         const std::string& where, const char* what) {
  for (int i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens.Get(i);
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", what, " token ", i, " is ", id,
                                                     ", outside the vocabulary [0, ", vocab_size,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

// The versions' own rules; how they stand to the learner's version is the
// learner's to check (learner_server/admission/policy_lag.h).
absl::Status CheckResponseVersions(const v1::Response& r, const std::string& where) {
  if (!r.has_last_policy_version()) return absl::OkStatus();
  if (!r.has_first_policy_version()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": last_policy_version is ", r.last_policy_version(),
                     " without first_policy_version; set both, or first_policy_version alone"));
  }
  if (r.last_policy_version() < r.first_policy_version()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": last_policy_version ", r.last_policy_version(), " is below first_policy_version ",
        r.first_policy_version(), "; the last token cannot be sampled by an older policy"));
  }
  return absl::OkStatus();
}

// A loss mask, when there is one: one entry per token, at least one
// generated token.
absl::Status CheckLossMask(const v1::Response& r, const std::string& where) {
  if (r.loss_mask_size() == 0) return absl::OkStatus();
  if (r.loss_mask_size() != r.tokens_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": loss_mask has ", r.loss_mask_size(), " entries for ", r.tokens_size(),
        " tokens; it needs one per token (or none: every token generated)"));
  }
  if (GeneratedTokens(r) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": loss_mask marks none of its ", r.tokens_size(),
        " tokens as generated; a response needs at least one generated token to train on"));
  }
  return absl::OkStatus();
}

absl::Status CheckResponse(const v1::Response& r, const BatchLimits& limits,
                           const std::string& where) {
  if (r.tokens().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": response has no tokens; every response needs at least one"));
  }
  if (r.tokens_size() > limits.max_response_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": response has ", r.tokens_size(),
                                                   " tokens, more than max_response_tokens ",
                                                   limits.max_response_tokens));
  }
  ASYMPO_RETURN_IF_ERROR(CheckTokens(r.tokens(), limits.vocab_size, where, "response"));
  if (!std::isfinite(r.reward())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": reward is ", r.reward(), "; rewards must be finite"));
  }
  if (std::fabs(r.reward()) > limits.max_abs_reward) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": reward is ", r.reward(), ", beyond max_abs_reward ",
                     limits.max_abs_reward, "; rewards must lie within +-max_abs_reward"));
  }
  ASYMPO_RETURN_IF_ERROR(CheckResponseVersions(r, where));
  ASYMPO_RETURN_IF_ERROR(CheckLossMask(r, where));
  const int n_lp = r.behavior_logprobs_size();
  if (n_lp == 0) {
    if (limits.require_behavior_logprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": behavior_logprobs missing; the learner's objective (grpo) needs one "
                       "behavior log-prob per generated response token"));
    }
    return absl::OkStatus();
  }
  if (const int generated = GeneratedTokens(r); n_lp != generated) {
    return absl::InvalidArgumentError(
        r.loss_mask_size() == 0
            ? absl::StrCat(where, ": behavior_logprobs has ", n_lp, " values for ", r.tokens_size(),
                           " tokens; they must match one to one")
            : absl::StrCat(where, ": behavior_logprobs has ", n_lp, " values for ", generated,
                           " generated tokens (loss_mask true); one per generated token"));
  }
  for (int i = 0; i < n_lp; ++i) {
    const float lp = r.behavior_logprobs(i);
    if (!std::isfinite(lp) || lp > 0.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": behavior_logprobs[", i, "] is ", lp,
                       "; a log-probability must be finite and <= 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateBatchLimits(const BatchLimits& l) {
  auto positive = [](const char* name, int64_t v) -> absl::Status {
    if (v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be positive, got ", v));
    }
    return absl::OkStatus();
  };
  ASYMPO_RETURN_IF_ERROR(positive("vocab_size", l.vocab_size));
  ASYMPO_RETURN_IF_ERROR(positive("max_prompt_tokens", l.max_prompt_tokens));
  ASYMPO_RETURN_IF_ERROR(positive("max_response_tokens", l.max_response_tokens));
  ASYMPO_RETURN_IF_ERROR(positive("max_groups_per_batch", l.max_groups_per_batch));
  if (l.min_group_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_group_size must be at least 2 (an advantage needs a group mean), got ",
                     l.min_group_size));
  }
  if (!(l.max_abs_reward > 0 && l.max_abs_reward <= kMaxAbsRewardBound)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_abs_reward must be in (0, ", kMaxAbsRewardBound, "], got ", l.max_abs_reward));
  }
  if (l.max_group_size < l.min_group_size) {
    return absl::InvalidArgumentError(absl::StrCat("max_group_size ", l.max_group_size,
                                                   " is below min_group_size ", l.min_group_size));
  }
  return absl::OkStatus();
}

absl::Status ValidateRolloutBatch(const v1::RolloutBatch& batch, const BatchLimits& limits) {
  if (batch.groups().empty()) {
    return absl::InvalidArgumentError("batch has no groups; send at least one prompt group");
  }
  if (batch.groups_size() > limits.max_groups_per_batch) {
    return absl::InvalidArgumentError(absl::StrCat("batch has ", batch.groups_size(),
                                                   " groups, more than max_groups_per_batch ",
                                                   limits.max_groups_per_batch));
  }
  if (batch.source().size() > kMaxSourceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("batch source is ", batch.source().size(),
                                                   " bytes, more than ", kMaxSourceBytes));
  }
  if (batch.batch_id().size() > kMaxBatchIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("batch_id is ", batch.batch_id().size(),
                                                   " bytes, more than ", kMaxBatchIdBytes));
  }
  for (int g = 0; g < batch.groups_size(); ++g) {
    const v1::PromptGroup& group = batch.groups(g);
    const std::string where = GroupWhere(g, group);
    if (group.prompt_id().size() > kMaxPromptIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": prompt_id is ",
                                                     group.prompt_id().size(), " bytes, more than ",
                                                     kMaxPromptIdBytes));
    }
    if (group.prompt_tokens().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": prompt has no tokens; every prompt needs at least one"));
    }
    if (group.prompt_tokens_size() > limits.max_prompt_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": prompt has ", group.prompt_tokens_size(),
                       " tokens, more than max_prompt_tokens ", limits.max_prompt_tokens));
    }
    ASYMPO_RETURN_IF_ERROR(CheckTokens(group.prompt_tokens(), limits.vocab_size, where, "prompt"));
    const int size = group.responses_size();
    if (size < limits.min_group_size || size > limits.max_group_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": group has ", size, " responses; group size must be in [",
                       limits.min_group_size, ", ", limits.max_group_size, "]"));
    }
    for (int j = 0; j < size; ++j) {
      ASYMPO_RETURN_IF_ERROR(
          CheckResponse(group.responses(j), limits, absl::StrCat(where, " response ", j)));
    }
  }
  return absl::OkStatus();
}

BatchCounts CountBatch(const v1::RolloutBatch& batch) {
  BatchCounts c;
  c.groups = batch.groups_size();
  for (const auto& group : batch.groups()) {
    c.responses += group.responses_size();
    c.prompt_tokens += group.prompt_tokens_size();
    for (const auto& r : group.responses()) c.response_tokens += r.tokens_size();
  }
  return c;
}

}  // namespace asympo
