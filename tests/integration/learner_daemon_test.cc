// The learner daemon end to end in one process: a real gRPC server on a
// loopback port, a real client, the trainer loop, checkpoints, a restart,
// a real HTTP scrape of /metrics (checked with promtool when present), and
// failed steps that are skipped and counted while training goes on.
#include "learner_server/learner_daemon.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/daemon/metrics_endpoint.h"
#include "learner_server/learner_rank0.h"
#include "learner_server/trainer/checkpoint.h"
#include "tests/testing/http.h"
#include "tests/testing/rollout_batch_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::RolloutBatchBuilder;
using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

// Groups "q<seed>_<g>" of 4 prompt tokens and 4 responses of 3 + r tokens,
// all varying with the seed; one response per group rewarded.
v1::RolloutBatch Batch(int groups, int seed) {
  return RolloutBatchBuilder(groups, 4)
      .PromptIds([seed](int g) { return "q" + std::to_string(seed) + "_" + std::to_string(g); })
      .PromptTokens([seed](int g) {
        std::vector<int32_t> tokens;
        for (int t = 0; t < 4; ++t) tokens.push_back(1 + (seed + g + t) % 60);
        return tokens;
      })
      .ResponseTokens([seed](int g, int r) {
        std::vector<int32_t> tokens;
        for (int t = 0; t < 3 + r; ++t) tokens.push_back(2 + (seed * 7 + g + r + t) % 60);
        return tokens;
      })
      .Rewards([seed](int g, int r) { return r == (seed + g) % 4 ? 1.0f : 0.0f; })
      .Build();
}

LearnerDaemonOptions Options(const std::string& ckpt, int64_t max_steps) {
  LearnerDaemonOptions o;
  o.listen_address = "127.0.0.1:0";
  o.prompts_per_step = 2;
  o.queue.capacity_groups = 8;
  o.service.limits.max_groups_per_batch = 8;
  o.trainer.lr.peak_lr = 1e-3;
  o.checkpoint_dir = ckpt;
  o.checkpoint_every = 2;
  o.max_steps = max_steps;
  o.collapse.warmup_steps = 1;
  return o;
}

// Submits batches until `stop`; after a refusal it waits a little (or
// until `stop`) before the next.
void Feed(int port, absl::Notification* stop) {
  auto stub = v1::Learner::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  for (int i = 0; !stop->HasBeenNotified(); ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::SubmitResponse r;
    if (!stub->Submit(&ctx, Batch(2, i), &r).ok()) {
      stop->WaitForNotificationWithTimeout(absl::Milliseconds(20));
    }
  }
}

// A daemon with its registry and metrics endpoint, as main() makes them.
struct Learner {
  explicit Learner(LearnerDaemonOptions o) {
    auto e = daemon::MetricsEndpoint::Start("127.0.0.1:0", registry);
    EXPECT_OK(e);
    if (e.ok()) endpoint = *std::move(e);
    auto d = LearnerRank0::Create(std::move(o), *registry);
    status = d.status();
    if (d.ok()) daemon = *std::move(d);
  }
  // Trains to max_steps while a client feeds it.
  absl::StatusOr<int64_t> RunFed() {
    absl::Notification stop;
    std::thread feeder(Feed, daemon->port(), &stop);
    absl::StatusOr<int64_t> steps = daemon->Run();
    stop.Notify();
    feeder.join();
    return steps;
  }
  std::string Scrape() {
    return asympo::testing::HttpBody(
        asympo::testing::HttpGet("127.0.0.1", endpoint->port(), "/metrics"));
  }

  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<daemon::MetricsEndpoint> endpoint;
  absl::Status status;
  std::unique_ptr<LearnerRank0> daemon;
};

TEST(LearnerDaemonTest, TrainsCheckpointsServesMetricsAndResumesAfterRestart) {
  asympo::testing::ScopedTempDir tmp("learner_daemon_test");
  const std::string ckpt = tmp.Path("ckpt");
  uint64_t version_after_first_run = 0;
  {
    Learner learner(Options(ckpt, 4));
    ASSERT_OK(learner.status);
    ASSERT_OK_AND_ASSIGN(const int64_t steps, learner.RunFed());
    EXPECT_EQ(steps, 4);
    version_after_first_run = learner.daemon->version();
    EXPECT_EQ(version_after_first_run, 4u);
    // The registry belongs to main (here the test): it is scraped over HTTP
    // after the run as during it.
    const std::string scrape = learner.Scrape();
    EXPECT_THAT(scrape, HasSubstr("asympo_learner_steps_total 4"));
    for (const char* name : {"asympo_learner_version",
                             "asympo_learner_steps_total",
                             "asympo_learner_reward_mean",
                             "asympo_learner_reward_ema",
                             "asympo_learner_loss",
                             "asympo_learner_scale_positive",
                             "asympo_learner_scale_negative",
                             "asympo_learner_naive_ratio",
                             "asympo_learner_imbalance",
                             "asympo_learner_clip_fraction{bound=\"low\"}",
                             "asympo_learner_grad_norm",
                             "asympo_learner_learning_rate",
                             "asympo_learner_tokens_per_second",
                             "asympo_learner_queue_depth_groups",
                             "asympo_learner_queue_capacity_groups",
                             "asympo_learner_staleness_versions_bucket",
                             "asympo_learner_batches_total{result=\"accepted\"}",
                             "asympo_learner_step_duration_seconds_bucket",
                             "asympo_learner_collapse_suspected",
                             "asympo_learner_steps_skipped_total{reason=\"nonfinite_loss\"} 0",
                             "asympo_broadcast_version"}) {
      EXPECT_THAT(scrape, HasSubstr(name));
    }
    // promtool (Debian package prometheus) lints the exposition format.
    if (std::system("command -v promtool >/dev/null 2>&1") == 0) {
      const std::string path = tmp.Path("scrape.txt");
      std::ofstream(path) << scrape;
      EXPECT_EQ(std::system(("promtool check metrics < '" + path + "'").c_str()), 0);
    }
  }
  ASSERT_EQ(ListCheckpoints(ckpt).size(), 2u);  // versions 4 and 2 (keep_checkpoints = 3)

  // Restart: the newest checkpoint is restored.
  Learner again(Options(ckpt, 1));
  ASSERT_OK(again.status);
  EXPECT_EQ(again.daemon->version(), version_after_first_run);
  again.daemon->Shutdown();
  ASSERT_OK_AND_ASSIGN(const int64_t steps, again.daemon->Run());
  EXPECT_EQ(steps, 0);
}

TEST(LearnerDaemonTest, FailedStepsAreSkippedCountedAndTrainingGoesOn) {
  LearnerDaemonOptions o = Options("", 4);
  o.trainer.fault_nonfinite_loss_steps = {2};
  o.trainer.fault_exception_steps = {3, 5};
  Learner learner(o);
  ASSERT_OK(learner.status);
  ASSERT_OK_AND_ASSIGN(const int64_t steps, learner.RunFed());
  EXPECT_EQ(steps, 4) << "max_steps counts the steps that trained";
  EXPECT_EQ(learner.daemon->version(), 4u);
  EXPECT_EQ(learner.daemon->skipped_steps().count(SkipReason::kNonFiniteLoss), 1);
  EXPECT_EQ(learner.daemon->skipped_steps().count(SkipReason::kTorchError), 2);
  const std::string scrape = learner.Scrape();
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_steps_skipped_total{reason=\"nonfinite_loss\"} 1"));
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_steps_skipped_total{reason=\"torch_error\"} 2"));
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_skipped_groups_total 6"));  // 3 steps x 2 groups
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_steps_total 4"));
}

// Batch(groups, seed) with every response sampled by `version`.
v1::RolloutBatch Sampled(int groups, int seed, uint64_t version) {
  v1::RolloutBatch b = Batch(groups, seed);
  for (v1::PromptGroup& g : *b.mutable_groups()) {
    for (v1::Response& r : *g.mutable_responses()) {
      r.set_first_policy_version(version);
      r.set_last_policy_version(version);
    }
  }
  return b;
}

// --max_policy_lag 1, 2 groups a step. Queued at version 0: A (version 0),
// B (no version), C (version 0). Step 1 trains A at version 0, step 2 B at
// 1; C is then 2 behind and is dropped before step 3. At version 2, D
// (version 0) is refused, E (version 1) trained by step 3 at lag 1.
TEST(LearnerDaemonTest, TheLagBoundRefusesAndDropsExactlyTheGroupsBehindIt) {
  LearnerDaemonOptions o = Options("", 0);
  o.max_policy_lag = 1;
  Learner learner(o);
  ASSERT_OK(learner.status);
  auto stub = v1::Learner::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(learner.daemon->port()), grpc::InsecureChannelCredentials()));
  auto submit = [&](const v1::RolloutBatch& b) {
    grpc::ClientContext ctx;
    v1::SubmitResponse r;
    return stub->Submit(&ctx, b, &r);
  };
  ASSERT_OK(submit(Sampled(2, 1, 0)));
  ASSERT_OK(submit(Batch(2, 2)));
  ASSERT_OK(submit(Sampled(2, 3, 0)));
  std::thread run([&] { EXPECT_OK(learner.daemon->Run()); });
  // No ASSERT until the run thread is joined.
  EXPECT_TRUE(asympo::testing::WaitFor([&] { return learner.daemon->version() == 2; }));
  EXPECT_THAT(submit(Sampled(2, 4, 0)),
              StatusIs(grpc::StatusCode::FAILED_PRECONDITION,
                       "2 versions behind the learner's version 2, more than its "
                       "--max_policy_lag 1"));
  EXPECT_OK(submit(Sampled(2, 5, 1)));
  v1::LearnerStatus status;
  EXPECT_TRUE(asympo::testing::WaitFor([&] {  // step 3 done and counted
    grpc::ClientContext ctx;
    return stub->GetStatus(&ctx, {}, &status).ok() && status.trained_groups() == 6;
  }));
  learner.daemon->Shutdown();
  run.join();
  const std::string scrape = learner.Scrape();
  EXPECT_EQ(status.max_policy_lag(), 1u);
  EXPECT_EQ(status.rejected_lag_batches(), 1u);
  EXPECT_EQ(status.dropped_lag_groups(), 2u);
  EXPECT_EQ(status.accepted_groups(), 8u);  // = trained + skipped + dropped + queued
  EXPECT_EQ(status.trained_groups(), 6u);
  EXPECT_EQ(status.queue_depth_groups(), 0u);
  ASSERT_EQ(status.source_policy_lags_size(), 1);
  const v1::SourcePolicyLag& source = status.source_policy_lags(0);
  EXPECT_EQ(source.source(), "anonymous");
  EXPECT_EQ(source.trained_groups(), 4u);  // A and E; B carries no version
  EXPECT_EQ(source.last_lag(), 1u);
  EXPECT_EQ(source.max_lag(), 1u);
  EXPECT_DOUBLE_EQ(source.mean_lag(), 0.5);
  EXPECT_EQ(source.dropped_groups(), 2u);
  EXPECT_EQ(source.rejected_batches(), 1u);
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_dropped_groups_total{reason=\"policy_lag\"} 2"));
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_batches_total{result=\"policy_lag\"} 1"));
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_policy_lag_count 4"));
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_policy_lag_sum 2"));
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_staleness_versions_count 6"));
}

TEST(LearnerDaemonTest, RejectsIncoherentOptionsByName) {
  LearnerDaemonOptions o = Options("", 1);
  prometheus::Registry registry;
  o.prompts_per_step = 10;  // above the queue capacity of 8
  EXPECT_THAT(LearnerDaemon::Create(o, registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--queue_capacity=8 is below --prompts_per_step=10"));
  o = Options("", 1);
  o.model = "/nonexistent/model";
  EXPECT_THAT(LearnerDaemon::Create(o, registry).status().message(),
              HasSubstr("/nonexistent/model"));
}

TEST(LearnerDaemonTest, AnUnwritableCheckpointDirStopsTheStart) {
  asympo::testing::ScopedTempDir tmp("learner_daemon_test");
  std::ofstream(tmp.Path("file")) << "not a directory";
  for (const std::string& dir : {tmp.Path("file"), tmp.Path("file/ckpt")}) {
    prometheus::Registry registry;
    EXPECT_THAT(LearnerDaemon::Create(Options(dir, 1), registry).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         "--checkpoint_dir=" + dir + " cannot be written"));
  }
  LearnerDaemonOptions o = Options("", 1);
  o.export_dir = tmp.Path("file/export");
  prometheus::Registry registry;
  EXPECT_THAT(LearnerDaemon::Create(o, registry).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "--export_dir=" + o.export_dir + " cannot be written"));
}

TEST(LearnerDaemonTest, FailedCheckpointsAreCountedAndTrainingGoesOn) {
  asympo::testing::ScopedTempDir tmp("learner_daemon_test");
  const std::string ckpt = tmp.Path("ckpt");
  Learner learner(Options(ckpt, 4));  // checkpoints at versions 2 and 4, and at the stop
  ASSERT_OK(learner.status);
  // The directory goes away under the running learner (a full or
  // unmounted disk, say): a file now stands where it was.
  std::filesystem::remove_all(ckpt);
  std::ofstream(ckpt) << "not a directory";
  const absl::StatusOr<int64_t> steps = learner.RunFed();
  EXPECT_EQ(learner.daemon->version(), 4u);  // training went on
  // The run ends in an error: its final checkpoint failed too.
  EXPECT_THAT(steps.status(), StatusIs(absl::StatusCode::kInternal, ckpt));
  const std::string scrape = learner.Scrape();
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_checkpoint_failures_total 3"));
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_checkpoint_version 0"));
}

TEST(LearnerDaemonTest, ASecondLearnerCannotListenOnTheSamePort) {
  // gRPC sets SO_REUSEPORT by default: two learners would share the port
  // and the rollouts would split silently between them.
  prometheus::Registry first_registry, second_registry;
  ASSERT_OK_AND_ASSIGN(auto first, LearnerRank0::Create(Options("", 1), first_registry));
  LearnerDaemonOptions o = Options("", 1);
  o.listen_address = "127.0.0.1:" + std::to_string(first->port());
  const absl::Status second = LearnerDaemon::Create(o, second_registry).status();
  EXPECT_THAT(second,
              StatusIs(absl::StatusCode::kUnavailable, "cannot listen on " + o.listen_address));
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kUnavailable, "in use"));
}

// One Submit of `batch` with a deadline.
grpc::Status Submit(v1::Learner::Stub* stub, const v1::RolloutBatch& batch,
                    absl::Duration deadline = absl::Seconds(30)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  v1::SubmitResponse r;
  return stub->Submit(&ctx, batch, &r);
}

// The settings that froze training (the defaults: steps of 8, capacity 64,
// batches of up to 64 groups): 5 groups queued, a batch of 64 that cannot
// fit waiting, then 3 groups that complete a step. With whole steps only,
// the 3 are accepted at once past the waiting batch, the step trains, and
// the 64 are queued and trained after it.
TEST(LearnerDaemonTest, ABatchThatCannotFitYetNeverStopsTheSteps) {
  LearnerDaemonOptions o = Options("", 9);
  o.prompts_per_step = 8;
  o.queue.capacity_groups = 64;
  o.service.limits.max_groups_per_batch = 64;
  o.partial_step_after = absl::ZeroDuration();
  Learner learner(std::move(o));
  ASSERT_OK(learner.status);
  absl::StatusOr<int64_t> steps;
  std::thread run([&] { steps = learner.daemon->Run(); });
  auto stub = v1::Learner::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(learner.daemon->port()), grpc::InsecureChannelCredentials()));
  EXPECT_TRUE(Submit(stub.get(), Batch(5, 1)).ok());
  grpc::Status big;
  std::thread waiting([&] { big = Submit(stub.get(), Batch(64, 2)); });
  // The learner says what admission waits on while no step is taken.
  EXPECT_TRUE(asympo::testing::WaitFor([&] {
    const std::string s = learner.Scrape();
    return s.find("asympo_learner_queue_waiting_groups 64") != std::string::npos &&
           s.find("asympo_learner_queue_waiting_submissions 1") != std::string::npos;
  }));
  const grpc::Status small = Submit(stub.get(), Batch(3, 3), absl::Seconds(5));
  EXPECT_TRUE(small.ok()) << small.error_message();
  waiting.join();
  EXPECT_TRUE(big.ok()) << big.error_message();
  if (!big.ok() || !small.ok()) learner.daemon->Shutdown();
  run.join();
  ASSERT_OK(steps.status());
  EXPECT_EQ(*steps, 9);  // 5 + 3, then 64
  EXPECT_THAT(learner.Scrape(), HasSubstr("asympo_learner_short_steps_total 0"));
}

// The last groups of a supply: fewer than a step's, trained as a short step
// once they have waited --partial_step_after.
TEST(LearnerDaemonTest, FewerGroupsThanAStepAreTrainedAfterPartialStepAfter) {
  LearnerDaemonOptions o = Options("", 1);
  o.prompts_per_step = 4;
  o.partial_step_after = absl::Milliseconds(500);
  Learner learner(std::move(o));
  ASSERT_OK(learner.status);
  auto stub = v1::Learner::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(learner.daemon->port()), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(Submit(stub.get(), Batch(3, 1)).ok());
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(const int64_t steps, learner.daemon->Run());
  EXPECT_EQ(steps, 1);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(learner.daemon->version(), 1u);
  const std::string scrape = learner.Scrape();
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_short_steps_total 1"));
  EXPECT_THAT(scrape, HasSubstr("asympo_learner_short_step_groups_total 3"));
}

}  // namespace
}  // namespace asympo::learner
