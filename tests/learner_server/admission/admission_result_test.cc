// A batch's typed admission result: what the client is answered, the
// metric labels, and the refusals of the checks that return a Status.
#include "learner_server/admission/admission_result.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;

TEST(AdmissionResultTest, AcceptedAndDuplicatesAreAcknowledgedRefusalsAreNot) {
  EXPECT_TRUE(AdmissionResult::Accepted().acknowledged());
  EXPECT_OK(AdmissionResult::Accepted());
  const AdmissionResult dup =
      AdmissionResult::Duplicate(absl::AlreadyExistsError("batch_id \"x\" was accepted"), true);
  EXPECT_TRUE(dup.acknowledged());
  EXPECT_FALSE(dup.accepted());
  EXPECT_TRUE(dup.recorded());
  EXPECT_THAT(dup, StatusIs(absl::StatusCode::kAlreadyExists, "was accepted"));
  const AdmissionResult full =
      AdmissionResult::Refused(AdmissionOutcome::kFull, absl::ResourceExhaustedError("full"));
  EXPECT_FALSE(full.acknowledged());
  EXPECT_EQ(full.retry_after(), std::nullopt);
  const AdmissionResult rate = AdmissionResult::OverQuota(
      QuotaCause::kRate, absl::ResourceExhaustedError("rate"), absl::Seconds(3));
  EXPECT_EQ(rate.outcome(), AdmissionOutcome::kQuota);
  EXPECT_EQ(rate.quota(), QuotaCause::kRate);
  EXPECT_EQ(rate.retry_after(), absl::Seconds(3));
}

// The labels are the asympo_learner_batches_total results and the
// refusal causes dashboards and alerts select.
TEST(AdmissionResultTest, LabelsAreTheMetricsOwn) {
  EXPECT_EQ(OutcomeLabel(AdmissionOutcome::kAccepted), "accepted");
  EXPECT_EQ(OutcomeLabel(AdmissionOutcome::kDuplicate), "duplicate");
  EXPECT_EQ(OutcomeLabel(AdmissionOutcome::kBatchIdConflict), "batch_id_conflict");
  EXPECT_EQ(OutcomeLabel(AdmissionOutcome::kInvalid), "invalid");
  EXPECT_EQ(OutcomeLabel(AdmissionOutcome::kFull), "full");
  EXPECT_EQ(OutcomeLabel(AdmissionOutcome::kQuota), "quota");
  EXPECT_EQ(OutcomeLabel(AdmissionOutcome::kPolicyLag), "policy_lag");
  EXPECT_EQ(OutcomeLabel(AdmissionOutcome::kUnavailable), "unavailable");
  EXPECT_EQ(OutcomeLabel(AdmissionOutcome::kCancelled), "unavailable");
  EXPECT_EQ(QuotaLabel(QuotaCause::kQueueShare), "queue_share");
  EXPECT_EQ(QuotaLabel(QuotaCause::kRate), "rate");
  EXPECT_EQ(QuotaLabel(QuotaCause::kQuarantined), "quarantined");
}

TEST(AdmissionResultTest, AStatusRefusalTakesItsOutcomeFromItsCode) {
  EXPECT_EQ(RefusedWith(absl::InvalidArgumentError("x")).outcome(), AdmissionOutcome::kInvalid);
  EXPECT_EQ(RefusedWith(absl::ResourceExhaustedError("x")).outcome(), AdmissionOutcome::kFull);
  EXPECT_EQ(RefusedWith(absl::AlreadyExistsError("x")).outcome(),
            AdmissionOutcome::kBatchIdConflict);
  EXPECT_EQ(RefusedWith(absl::InternalError("x")).outcome(), AdmissionOutcome::kUnavailable);
  EXPECT_THAT(RefusedWith(absl::InvalidArgumentError("bad group 3")),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad group 3"));
}

}  // namespace
}  // namespace asympo::learner
