#include "learner_server/admission/admission_result.h"

#include <utility>

namespace asympo::learner {

AdmissionResult RefusedWith(absl::Status status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return AdmissionResult::Refused(AdmissionOutcome::kInvalid, std::move(status));
    case absl::StatusCode::kResourceExhausted:
      return AdmissionResult::Refused(AdmissionOutcome::kFull, std::move(status));
    case absl::StatusCode::kAlreadyExists:
      return AdmissionResult::Refused(AdmissionOutcome::kBatchIdConflict, std::move(status));
    default:
      return AdmissionResult::Refused(AdmissionOutcome::kUnavailable, std::move(status));
  }
}

std::ostream& operator<<(std::ostream& os, const AdmissionResult& r) {
  return os << OutcomeLabel(r.outcome()) << ": " << r.status();
}

absl::string_view OutcomeLabel(AdmissionOutcome outcome) {
  switch (outcome) {
    case AdmissionOutcome::kAccepted:
      return "accepted";
    case AdmissionOutcome::kDuplicate:
      return "duplicate";
    case AdmissionOutcome::kBatchIdConflict:
      return "batch_id_conflict";
    case AdmissionOutcome::kInvalid:
      return "invalid";
    case AdmissionOutcome::kFull:
      return "full";
    case AdmissionOutcome::kQuota:
      return "quota";
    case AdmissionOutcome::kPolicyLag:
      return "policy_lag";
    case AdmissionOutcome::kUnavailable:
    case AdmissionOutcome::kCancelled:
      break;
  }
  return "unavailable";
}

absl::string_view QuotaLabel(QuotaCause cause) {
  switch (cause) {
    case QuotaCause::kQueueShare:
      return "queue_share";
    case QuotaCause::kQuarantined:
      return "quarantined";
    case QuotaCause::kRate:
    case QuotaCause::kNone:
      break;
  }
  return "rate";
}

}  // namespace asympo::learner
