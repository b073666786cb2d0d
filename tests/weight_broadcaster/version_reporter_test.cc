#include "weight_broadcaster/version_reporter.h"

#include <mutex>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "tests/testing/wait.h"

namespace asympo::broadcast {
namespace {

using ::asympo::testing::WaitFor;

// Records ReportVersion calls; the first one is held until released.
class FakeBroadcast final : public v1::WeightBroadcast::Service {
 public:
  grpc::Status ReportVersion(grpc::ServerContext* ctx, const v1::ReportVersionRequest* request,
                             v1::ReportVersionResponse*) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      reports.push_back(*request);
    }
    if (hold_first && reports.size() == 1) {
      while (!release.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
        if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
      }
    }
    return grpc::Status::OK;
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return reports.size();
  }

  std::mutex mu;
  std::vector<v1::ReportVersionRequest> reports;
  bool hold_first = true;
  absl::Notification release;
};

class VersionReporterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_GT(port, 0);
    stub_ = v1::WeightBroadcast::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                             grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (!service_.release.HasBeenNotified()) service_.release.Notify();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  FakeBroadcast service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::WeightBroadcast::Stub> stub_;
};

TEST_F(VersionReporterTest, OnlyTheNewestReportWaitingBehindACallIsSent) {
  VersionReporter reporter(stub_.get());
  reporter.SetSession("s1");
  reporter.Report(1, "");
  ASSERT_TRUE(WaitFor([&] { return service_.count() == 1; }));  // held in the server
  reporter.Report(2, "");
  reporter.Report(3, "checksum mismatch");
  service_.release.Notify();
  ASSERT_TRUE(WaitFor([&] { return service_.count() == 2; }));
  reporter.Stop();
  std::lock_guard<std::mutex> lock(service_.mu);
  ASSERT_EQ(service_.reports.size(), 2u) << "report 2 should have been replaced by 3";
  EXPECT_EQ(service_.reports[0].version(), 1u);
  EXPECT_EQ(service_.reports[1].version(), 3u);
  EXPECT_EQ(service_.reports[1].error(), "checksum mismatch");
  EXPECT_EQ(service_.reports[1].session_id(), "s1");
  EXPECT_EQ(reporter.sent(), 2);
}

TEST_F(VersionReporterTest, ReportsWithoutASessionAreDropped) {
  service_.hold_first = false;
  VersionReporter reporter(stub_.get());
  reporter.Report(1, "");
  reporter.SetSession("s2");
  reporter.Report(2, "");
  reporter.SetSession("");
  reporter.Report(3, "");
  ASSERT_TRUE(WaitFor([&] { return service_.count() == 1; }));
  reporter.Stop();
  EXPECT_EQ(reporter.sent(), 1);
  EXPECT_EQ(service_.reports[0].version(), 2u);
}

TEST_F(VersionReporterTest, StopCancelsTheCallInFlightAndDropsTheRest) {
  VersionReporter reporter(stub_.get());
  reporter.SetSession("s3");
  reporter.Report(1, "");
  ASSERT_TRUE(WaitFor([&] { return service_.count() == 1; }));
  reporter.Report(2, "");
  const absl::Time t0 = absl::Now();
  reporter.Stop();  // the server never releases the first call
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  reporter.Report(4, "");  // after Stop: dropped
  EXPECT_EQ(reporter.sent(), 1);
}

}  // namespace
}  // namespace asympo::broadcast
