// What became of a submitted batch, as one typed value: the service's
// checks, the policy-lag bound and the queue each return one, and the
// reply, the counters and the metrics read it (no status payloads to
// decode, no predicates to keep in step).
//
// A result is acknowledged (the client is answered OK) when the batch was
// queued or is a duplicate of one accepted before. status() is OK for a
// queued batch, ALREADY_EXISTS naming the batch id for a duplicate (what
// the log says; the client is answered OK), and otherwise the refusal the
// client gets, with its code and a message naming the fault. Value type.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace asympo::learner {

enum class AdmissionOutcome : uint8_t {
  kAccepted,         // queued whole (OK)
  kDuplicate,        // its batch id was accepted before with the same payload: nothing
                     // queued, answered OK as the first submission was
  kBatchIdConflict,  // its batch id was accepted before with another payload (ALREADY_EXISTS)
  kInvalid,          // malformed, or against the limits (INVALID_ARGUMENT)
  kFull,             // the queue had no room before the deadline, or too many pushes
                     // waited (RESOURCE_EXHAUSTED)
  kQuota,            // its source over a quota (RESOURCE_EXHAUSTED; quota() says which)
  kPolicyLag,        // a group more versions behind than the bound (FAILED_PRECONDITION)
  kUnavailable,      // the learner is stopping (UNAVAILABLE)
  kCancelled,        // the caller went away while the batch waited (CANCELLED)
};

// Which quota refused a batch.
enum class QuotaCause : uint8_t {
  kNone,
  kQueueShare,   // its source's share of the queue
  kRate,         // its source's groups per second
  kQuarantined,  // its source is quarantined for poisoned groups
};

class AdmissionResult {
 public:
  // Not refused (so far, for a check; queued, for the queue).
  static AdmissionResult Accepted() { return AdmissionResult(AdmissionOutcome::kAccepted, {}); }
  // A duplicate (`status`: ALREADY_EXISTS naming it); `recorded` when the
  // restored checkpoint recorded the batch as trained in full
  // (SubmitResponse.recorded_duplicates).
  static AdmissionResult Duplicate(absl::Status status, bool recorded) {
    AdmissionResult r(AdmissionOutcome::kDuplicate, std::move(status));
    r.recorded_ = recorded;
    return r;
  }
  // A refusal: `status` is the client's answer (not OK).
  static AdmissionResult Refused(AdmissionOutcome outcome, absl::Status status) {
    return AdmissionResult(outcome, std::move(status));
  }
  // A quota's refusal, with the wait it suggests (none: the service's
  // default hint).
  static AdmissionResult OverQuota(QuotaCause cause, absl::Status status,
                                   std::optional<absl::Duration> retry_after = std::nullopt) {
    AdmissionResult r(AdmissionOutcome::kQuota, std::move(status));
    r.quota_ = cause;
    r.retry_after_ = retry_after;
    return r;
  }

  AdmissionOutcome outcome() const { return outcome_; }
  QuotaCause quota() const { return quota_; }
  bool recorded() const { return recorded_; }
  // The retry hint the refusal suggests (none: the service's default).
  std::optional<absl::Duration> retry_after() const { return retry_after_; }
  bool accepted() const { return outcome_ == AdmissionOutcome::kAccepted; }
  // Answered OK: queued, or a duplicate.
  bool acknowledged() const { return accepted() || outcome_ == AdmissionOutcome::kDuplicate; }
  // OK when queued; a duplicate's ALREADY_EXISTS; else the refusal.
  const absl::Status& status() const { return status_; }

 private:
  AdmissionResult(AdmissionOutcome outcome, absl::Status status)
      : outcome_(outcome), status_(std::move(status)) {}

  AdmissionOutcome outcome_;
  QuotaCause quota_ = QuotaCause::kNone;
  bool recorded_ = false;
  std::optional<absl::Duration> retry_after_;
  absl::Status status_;
};

// A refusal by status code, for the checks that return a Status (parsing,
// validation): INVALID_ARGUMENT is kInvalid, RESOURCE_EXHAUSTED kFull,
// ALREADY_EXISTS kBatchIdConflict, any other code kUnavailable.
AdmissionResult RefusedWith(absl::Status status);

// For logs and test failures: "duplicate: ALREADY_EXISTS: ...".
std::ostream& operator<<(std::ostream& os, const AdmissionResult& r);

// The metric label of an outcome (asympo_learner_batches_total's result):
// accepted, duplicate, batch_id_conflict, invalid, full, quota, policy_lag,
// unavailable (a cancelled batch counts as unavailable).
absl::string_view OutcomeLabel(AdmissionOutcome outcome);
// The refusal-counter cause of a quota: queue_share, rate, quarantined.
absl::string_view QuotaLabel(QuotaCause cause);

}  // namespace asympo::learner
