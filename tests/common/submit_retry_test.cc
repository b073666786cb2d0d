// The one Submit retry policy (common/submit_retry.h): the decision
// for every gRPC status code, that docs/protocol.md's table says the same,
// the backoff and its hint, and the loop against a scripted learner.
#include "common/submit_retry.h"

#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/testing/status_matchers.h"

namespace asympo {
namespace {

using ::asympo::testing::StatusIs;
using C = grpc::StatusCode;
using D = SubmitDecision;

// Every code, as docs/protocol.md ("Retries") gives it. The second
// decision is RESOURCE_EXHAUSTED's with the learner's hint.
struct Row {
  C code;
  const char* name;
  D without_hint;
  D with_hint;
};
const Row kTable[] = {
    {C::OK, "OK", D::kAccepted, D::kAccepted},
    {C::CANCELLED, "CANCELLED", D::kRetry, D::kRetry},
    {C::UNKNOWN, "UNKNOWN", D::kRetry, D::kRetry},
    {C::INVALID_ARGUMENT, "INVALID_ARGUMENT", D::kDropBatch, D::kDropBatch},
    {C::DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", D::kRetry, D::kRetry},
    {C::NOT_FOUND, "NOT_FOUND", D::kFatal, D::kFatal},
    {C::ALREADY_EXISTS, "ALREADY_EXISTS", D::kFatal, D::kFatal},
    {C::PERMISSION_DENIED, "PERMISSION_DENIED", D::kFatal, D::kFatal},
    {C::RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED", D::kDropBatch, D::kRetry},
    {C::FAILED_PRECONDITION, "FAILED_PRECONDITION", D::kDropBatch, D::kDropBatch},
    {C::ABORTED, "ABORTED", D::kRetry, D::kRetry},
    {C::OUT_OF_RANGE, "OUT_OF_RANGE", D::kDropBatch, D::kDropBatch},
    {C::UNIMPLEMENTED, "UNIMPLEMENTED", D::kFatal, D::kFatal},
    {C::INTERNAL, "INTERNAL", D::kRetry, D::kRetry},
    {C::UNAVAILABLE, "UNAVAILABLE", D::kRetry, D::kRetry},
    {C::DATA_LOSS, "DATA_LOSS", D::kFatal, D::kFatal},
    {C::UNAUTHENTICATED, "UNAUTHENTICATED", D::kFatal, D::kFatal},
};

TEST(SubmitRetryTest, DecidesEveryCodeAsTheTableSays) {
  ASSERT_EQ(std::size(kTable), 17u);  // every canonical code, 0 to 16
  for (const Row& row : kTable) {
    EXPECT_EQ(DecideSubmit(row.code, false), row.without_hint) << row.name;
    // The hint only matters to RESOURCE_EXHAUSTED.
    EXPECT_EQ(DecideSubmit(row.code, true), row.with_hint) << row.name;
  }
}

TEST(SubmitRetryTest, TheToolsFormerDisagreementsAreSettled) {
  // asympo-submit stopped on these; the daemon dropped FAILED_PRECONDITION.
  EXPECT_EQ(DecideSubmit(C::FAILED_PRECONDITION, false), D::kDropBatch);
  EXPECT_EQ(DecideSubmit(C::CANCELLED, false), D::kRetry);
  // The daemon retried these forever; they are configuration errors.
  EXPECT_EQ(DecideSubmit(C::UNAUTHENTICATED, false), D::kFatal);
  EXPECT_EQ(DecideSubmit(C::PERMISSION_DENIED, false), D::kFatal);
}

TEST(SubmitRetryTest, GetStatusHasNoBatchToDrop) {
  for (const Row& row : kTable) {
    const D d = DecideGetStatus(row.code, false);
    EXPECT_EQ(d, row.without_hint == D::kDropBatch ? D::kFatal : row.without_hint) << row.name;
  }
  EXPECT_EQ(DecideGetStatus(C::RESOURCE_EXHAUSTED, true), D::kRetry);
}

TEST(SubmitRetryTest, DecisionsHaveThePythonClientsNames) {
  EXPECT_EQ(SubmitDecisionName(D::kAccepted), "accepted");
  EXPECT_EQ(SubmitDecisionName(D::kRetry), "retry");
  EXPECT_EQ(SubmitDecisionName(D::kDropBatch), "drop_batch");
  EXPECT_EQ(SubmitDecisionName(D::kFatal), "fatal");
}

// docs/protocol.md's table, "| `CODE` [with or without ...] | decision | ...".
std::map<std::string, std::string> DocumentedTable() {
  std::ifstream in(std::string(ASYMPO_SOURCE_DIR) + "/docs/protocol.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const size_t start = doc.find("## Retries");
  std::map<std::string, std::string> table;
  if (start == std::string::npos) return table;
  const size_t end = doc.find("\n## ", start + 1);
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(doc).substr(start, end - start), '\n')) {
    if (!absl::ConsumePrefix(&line, "| `")) continue;
    std::vector<std::string> cells = absl::StrSplit(line, " | ");
    if (cells.size() < 2) continue;
    std::string key = cells[0];
    key.erase(key.find('`'), 1);  // "RESOURCE_EXHAUSTED` with `asympo-..." keeps its words
    table[key] = cells[1];
  }
  return table;
}

TEST(SubmitRetryTest, DocsProtocolMdSaysTheSame) {
  const std::map<std::string, std::string> doc = DocumentedTable();
  ASSERT_EQ(doc.size(), 18u) << "docs/protocol.md, \"Retries\": one row per code, two for "
                                "RESOURCE_EXHAUSTED";
  for (const Row& row : kTable) {
    if (row.code == C::RESOURCE_EXHAUSTED) {
      EXPECT_EQ(doc.at("RESOURCE_EXHAUSTED with `asympo-retry-after-ms`"),
                SubmitDecisionName(row.with_hint));
      EXPECT_EQ(doc.at("RESOURCE_EXHAUSTED without it"), SubmitDecisionName(row.without_hint));
      continue;
    }
    ASSERT_EQ(doc.count(row.name), 1u) << row.name;
    EXPECT_EQ(doc.at(row.name), SubmitDecisionName(row.without_hint)) << row.name;
  }
}

TEST(SubmitRetryTest, BackoffDoublesToItsMaximumWithJitter) {
  SubmitBackoff b(absl::Milliseconds(100), absl::Milliseconds(700));
  const int64_t expected[] = {100, 200, 400, 700, 700};
  for (int64_t ms : expected) {
    const absl::Duration wait = b.Next(std::nullopt);
    EXPECT_GE(wait, absl::Milliseconds(ms));
    EXPECT_LE(wait, absl::Milliseconds(ms) * 1.2);
  }
  b.Reset();
  EXPECT_EQ(b.current(), absl::Milliseconds(100));
}

TEST(SubmitRetryTest, AHintIsWaitedWithJitterAndLeavesTheBackoff) {
  SubmitBackoff b(absl::Milliseconds(100), absl::Seconds(5));
  for (int i = 0; i < 20; ++i) {
    const absl::Duration wait = b.Next(absl::Milliseconds(300));
    EXPECT_GE(wait, absl::Milliseconds(300));
    EXPECT_LE(wait, absl::Milliseconds(360));
  }
  EXPECT_EQ(b.current(), absl::Milliseconds(100));
}

// Answers Submit with the scripted (code, hint ms) pairs, then OK.
class ScriptedLearner final : public v1::Learner::Service {
 public:
  grpc::Status Submit(grpc::ServerContext* ctx, const v1::RolloutBatch* batch,
                      v1::SubmitResponse* reply) override {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(*batch);
    if (script.empty()) {
      reply->set_accepted_groups(static_cast<uint64_t>(batch->groups_size()));
      return grpc::Status::OK;
    }
    const auto [code, hint_ms] = script.front();
    script.pop_front();
    if (hint_ms >= 0) ctx->AddTrailingMetadata("asympo-retry-after-ms", std::to_string(hint_ms));
    return grpc::Status(code, "scripted");
  }

  std::mutex mu;
  std::deque<std::pair<C, int>> script;
  std::vector<v1::RolloutBatch> seen;
};

class SubmitLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&learner_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = v1::Learner::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    batch_.set_source("test");
    batch_.set_batch_id("test/1/0");
    batch_.add_groups()->set_prompt_id("p0");
  }
  void TearDown() override { server_->Shutdown(); }

  // Runs the loop; before_retry records each attempt and allows `retries`.
  SubmitAttempt Run(int retries = 100) {
    return SubmitUntilSettled(
        *stub_, batch_, {absl::Seconds(5), false}, backoff_,
        [&](const SubmitAttempt& a) {
          retried_.push_back(a);
          return static_cast<int>(retried_.size()) <= retries;
        },
        &reply_);
  }

  ScriptedLearner learner_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Learner::Stub> stub_;
  v1::RolloutBatch batch_;
  SubmitBackoff backoff_{absl::Milliseconds(1), absl::Milliseconds(4)};
  std::vector<SubmitAttempt> retried_;
  v1::SubmitResponse reply_;
};

TEST_F(SubmitLoopTest, RetriesTheSameBatchUntilAccepted) {
  learner_.script = {{C::UNAVAILABLE, -1}, {C::RESOURCE_EXHAUSTED, 250}, {C::INTERNAL, -1}};
  const SubmitAttempt a = Run();
  EXPECT_EQ(a.decision, D::kAccepted);
  EXPECT_OK(a.status);
  EXPECT_EQ(reply_.accepted_groups(), 1u);
  ASSERT_EQ(retried_.size(), 3u);
  EXPECT_FALSE(retried_[0].hinted);
  EXPECT_TRUE(retried_[1].hinted);  // the learner's hint, not the backoff
  EXPECT_GE(retried_[1].wait, absl::Milliseconds(250));
  EXPECT_THAT(retried_[2].status, StatusIs(C::INTERNAL, "scripted"));
  ASSERT_EQ(learner_.seen.size(), 4u);
  for (const v1::RolloutBatch& b : learner_.seen) {
    EXPECT_EQ(b.SerializeAsString(), batch_.SerializeAsString());  // same bytes, same id
  }
}

TEST_F(SubmitLoopTest, StopsAtADroppedBatchWithoutRetrying) {
  learner_.script = {{C::RESOURCE_EXHAUSTED, -1}};  // over the size limit: no hint
  const SubmitAttempt a = Run();
  EXPECT_EQ(a.decision, D::kDropBatch);
  EXPECT_THAT(a.status, StatusIs(C::RESOURCE_EXHAUSTED));
  EXPECT_TRUE(retried_.empty());
  EXPECT_EQ(learner_.seen.size(), 1u);
}

TEST_F(SubmitLoopTest, StopsAtAFatalAnswer) {
  learner_.script = {{C::UNAVAILABLE, -1}, {C::UNAUTHENTICATED, -1}};
  const SubmitAttempt a = Run();
  EXPECT_EQ(a.decision, D::kFatal);
  EXPECT_THAT(a.status, StatusIs(C::UNAUTHENTICATED, "scripted"));
  EXPECT_EQ(retried_.size(), 1u);
}

TEST_F(SubmitLoopTest, ReturnsTheRetryWhenTheCallerDeclinesAnother) {
  learner_.script = {{C::UNAVAILABLE, -1}, {C::UNAVAILABLE, -1}, {C::UNAVAILABLE, -1}};
  const SubmitAttempt a = Run(/*retries=*/1);
  EXPECT_EQ(a.decision, D::kRetry);
  EXPECT_THAT(a.status, StatusIs(C::UNAVAILABLE));
  EXPECT_EQ(learner_.seen.size(), 2u);
}

}  // namespace
}  // namespace asympo
