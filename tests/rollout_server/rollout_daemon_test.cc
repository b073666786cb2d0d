// The rollout daemon against a scripted learner: a fake Learner service that
// answers Submit as told, and the real weight broadcaster serving the tiny
// model's weights. Covers the buffer bound while the learner refuses, the
// retry after RESOURCE_EXHAUSTED, the counted drop of rejected batches, of
// groups left at shutdown and of groups being sampled when the learner
// restarts at an older version, the stop on a fatal answer (the retry policy,
// common/submit_retry.h), and behavior log-probs only for grpo.
#include "rollout_server/rollout_daemon.h"

#include <atomic>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include "asympo/v1/learner.grpc.pb.h"
#include "tests/testing/metrics.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"
#include "weight_broadcaster/broadcast_sender.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace asympo::rollout {
namespace {

using ::asympo::testing::StatusIs;

// Answers Submit with the scripted codes in order, then `then`; records
// every batch it accepted.
class FakeLearner final : public v1::Learner::Service {
 public:
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::LearnerStatus* status) override {
    status->set_objective(wants_logprobs ? "grpo" : "asympo");
    status->set_wants_behavior_logprobs(wants_logprobs);
    auto* l = status->mutable_limits();
    l->set_vocab_size(64);
    l->set_min_group_size(2);
    l->set_max_group_size(64);
    l->set_max_prompt_tokens(4096);
    l->set_max_response_tokens(4096);
    l->set_max_groups_per_batch(64);
    return grpc::Status::OK;
  }

  grpc::Status Submit(grpc::ServerContext* ctx, const v1::RolloutBatch* batch,
                      v1::SubmitResponse*) override {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    submitted.push_back(*batch);
    grpc::StatusCode code = then;
    if (!script.empty()) {
      code = script.front();
      script.pop_front();
    }
    if (code == grpc::StatusCode::OK) {
      accepted.push_back(*batch);
      return grpc::Status::OK;
    }
    if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ctx->AddTrailingMetadata("asympo-retry-after-ms", "300");
      refused_at.push_back(absl::Now());
    }
    return grpc::Status(code, "scripted");
  }

  int64_t AcceptedGroups() {
    std::lock_guard<std::mutex> lock(mu);
    int64_t n = 0;
    for (const auto& b : accepted) n += b.groups_size();
    return n;
  }

  std::mutex mu;
  std::deque<grpc::StatusCode> script;
  grpc::StatusCode then = grpc::StatusCode::OK;
  std::vector<v1::RolloutBatch> accepted;
  std::vector<v1::RolloutBatch> submitted;  // every call, refused ones too
  std::vector<absl::Time> refused_at;
  int calls = 0;
  std::atomic<bool> wants_logprobs{false};
};

using ::asympo::testing::MetricValue;
using ::asympo::testing::WaitFor;

class RolloutDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(model_, PolicyModel::CreateRandom(ModelConfig::Tiny(64), {}));
    Serve(&learner_, &sender_registry_, 7, "127.0.0.1:0");
    ASSERT_NE(port_, 0);
  }

  // A learner at `address`: `learner` and a weight broadcaster (metrics in
  // `registry`, which must outlive it) that has published the model as
  // `version`.
  void Serve(FakeLearner* learner, prometheus::Registry* registry, uint64_t version,
             const std::string& address) {
    sender_.reset();  // it reads the store it replaces
    store_ = std::make_unique<broadcast::SnapshotStore>(
        broadcast::SnapshotStoreOptions{}, broadcast::ModelSignatureOf(*model_), *registry);
    sender_ = std::make_unique<broadcast::BroadcastSender>(broadcast::BroadcastSenderOptions{},
                                                           *store_, *registry);
    ASSERT_OK_AND_ASSIGN(auto staging,
                         broadcast::SnapshotStaging::Create(*model_, model_->options().dtype));
    ASSERT_OK(staging->Stage(*model_));
    ASSERT_OK_AND_ASSIGN(auto views, staging->CopyToHost());
    ASSERT_OK(store_->Publish(version, views));
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(learner);
    builder.RegisterService(sender_.get());
    server_ = builder.BuildAndStart();
  }

  void TearDown() override {
    if (daemon_) daemon_->Shutdown();
    if (run_.joinable()) run_.join();
    daemon_.reset();
    if (sender_) sender_->Shutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  void Start(int64_t max_buffered, absl::Duration drain = absl::Seconds(2),
             bool continuous = true) {
    RolloutDaemonOptions o;
    o.continuous_batching = continuous;
    o.continuous.max_running_sequences = 6;
    o.learner_address = absl::StrCat("127.0.0.1:", port_);
    o.task.name = "copy";
    o.group_size = 4;
    o.prompts_per_generation = 2;
    o.max_buffered_groups = max_buffered;
    o.max_groups_per_batch = 4;
    o.min_backoff = absl::Milliseconds(20);
    o.max_backoff = absl::Milliseconds(100);
    o.drain_timeout = drain;
    auto d = RolloutDaemon::Create(o, *registry_);
    ASSERT_OK(d);
    daemon_ = *std::move(d);
    run_ = std::thread([this] { result_ = daemon_->Run(); });
  }

  double M(const std::string& name, const std::string& label = "") {
    return MetricValue(*registry_, name, label);
  }
  int Calls() {
    std::lock_guard<std::mutex> lock(learner_.mu);
    return learner_.calls;
  }

  FakeLearner learner_;
  // As in main: the registry outlives the daemon.
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<PolicyModel> model_;
  prometheus::Registry sender_registry_;  // outlives the sender
  std::unique_ptr<broadcast::SnapshotStore> store_;
  std::unique_ptr<broadcast::BroadcastSender> sender_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<RolloutDaemon> daemon_;
  std::thread run_;
  absl::StatusOr<int64_t> result_ = absl::UnknownError("not run");
};

TEST_F(RolloutDaemonTest, SamplesWithTheLearnersSnapshotAndSubmits) {
  Start(8);
  ASSERT_TRUE(WaitFor([&] { return learner_.AcceptedGroups() >= 6; }));
  EXPECT_EQ(daemon_->weight_version(), 7u);
  std::lock_guard<std::mutex> lock(learner_.mu);
  const v1::RolloutBatch& b = learner_.accepted.front();
  EXPECT_EQ(b.source(), "rollout-0");
  for (const auto& g : b.groups()) {
    EXPECT_EQ(g.responses_size(), 4);
    for (const auto& r : g.responses()) {
      EXPECT_FALSE(r.tokens().empty());
      EXPECT_GE(r.reward(), 0.0f);
      EXPECT_LE(r.reward(), 1.0f);
      EXPECT_TRUE(r.behavior_logprobs().empty()) << "asympo needs no behavior log-probs";
    }
  }
}

TEST_F(RolloutDaemonTest, StaticBatchingSamplesAndSubmitsToo) {
  Start(8, absl::Seconds(2), /*continuous=*/false);
  ASSERT_TRUE(WaitFor([&] { return learner_.AcceptedGroups() >= 4; }));
  std::lock_guard<std::mutex> lock(learner_.mu);
  for (const auto& g : learner_.accepted.front().groups()) {
    EXPECT_EQ(g.responses_size(), 4);
    for (const auto& r : g.responses()) {
      EXPECT_FALSE(r.tokens().empty());
      EXPECT_EQ(r.first_policy_version(), 7u);
      EXPECT_EQ(r.last_policy_version(), 7u);
    }
  }
}

TEST_F(RolloutDaemonTest, EachResponseCarriesTheVersionsThatSampledIt) {
  Start(8);
  ASSERT_TRUE(WaitFor([&] { return learner_.AcceptedGroups() >= 4; }));
  std::lock_guard<std::mutex> lock(learner_.mu);
  for (const auto& b : learner_.accepted) {
    for (const auto& g : b.groups()) {
      for (const auto& r : g.responses()) {
        ASSERT_TRUE(r.has_first_policy_version());
        ASSERT_TRUE(r.has_last_policy_version());
        EXPECT_EQ(r.first_policy_version(), 7u);
        EXPECT_EQ(r.last_policy_version(), 7u);
      }
    }
  }
}

TEST_F(RolloutDaemonTest, DropsTheGroupsBeingSampledWhenTheVersionGoesBack) {
  // The learner restarts from an older checkpoint: same address, version 3
  // where the daemon holds 7. The groups in the engine were partly sampled
  // by version 7, which the restarted learner never made: they are dropped
  // and counted, and what follows is sampled by version 3 alone.
  Start(1000);
  ASSERT_TRUE(WaitFor([&] { return learner_.AcceptedGroups() >= 4; }));
  ASSERT_EQ(M("asympo_rollout_groups_dropped_total", "rewound"), 0);
  sender_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
  FakeLearner restarted;
  prometheus::Registry registry;  // outlives the sender
  const int port = port_;
  Serve(&restarted, &registry, 3, absl::StrCat("127.0.0.1:", port));
  ASSERT_EQ(port_, port);
  ASSERT_TRUE(WaitFor([&] { return daemon_->weight_version() == 3; }, absl::Seconds(30)));
  // Groups whose every response was sampled by version 3 arrive.
  const auto sampled_by_3 = [&] {
    std::lock_guard<std::mutex> lock(restarted.mu);
    for (const auto& b : restarted.accepted) {
      for (const auto& g : b.groups()) {
        bool all = true;
        for (const auto& r : g.responses()) {
          all = all && r.first_policy_version() == 3 && r.last_policy_version() == 3;
        }
        if (all) return true;
      }
    }
    return false;
  };
  ASSERT_TRUE(WaitFor(sampled_by_3, absl::Seconds(30)));
  EXPECT_GE(M("asympo_rollout_groups_dropped_total", "rewound"), 1);
  // Nothing sampled after the rewind mixes the two runs' versions.
  {
    // Released before the shutdown below, which waits for a Submit that
    // may be waiting for this lock.
    std::lock_guard<std::mutex> lock(restarted.mu);
    for (const auto& b : restarted.accepted) {
      for (const auto& g : b.groups()) {
        for (const auto& r : g.responses()) {
          EXPECT_TRUE(r.first_policy_version() == r.last_policy_version())
              << "a response sampled by versions " << r.first_policy_version() << " and "
              << r.last_policy_version();
        }
      }
    }
  }
  daemon_->Shutdown();  // before `restarted` and `registry` go
  run_.join();
  sender_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
  sender_.reset();
}

TEST_F(RolloutDaemonTest, SendsBehaviorLogprobsOnlyWhenTheLearnerWantsThem) {
  learner_.wants_logprobs = true;
  Start(8);
  ASSERT_TRUE(WaitFor([&] { return learner_.AcceptedGroups() >= 2; }));
  std::lock_guard<std::mutex> lock(learner_.mu);
  for (const auto& g : learner_.accepted.front().groups()) {
    for (const auto& r : g.responses()) {
      ASSERT_EQ(r.behavior_logprobs_size(), r.tokens_size());
      for (float lp : r.behavior_logprobs()) EXPECT_LE(lp, 0.0f);
    }
  }
}

TEST_F(RolloutDaemonTest, HoldsAtMostTheBufferWhileRefusedAndLosesNothing) {
  learner_.then = grpc::StatusCode::UNAVAILABLE;
  Start(6);
  ASSERT_TRUE(WaitFor([&] { return M("asympo_rollout_groups_generated_total") >= 6; }));
  ASSERT_TRUE(WaitFor([&] { return M("asympo_rollout_learner_connected") == 0; }));
  // Generation is held at the full buffer while the learner goes on
  // refusing: unbounded, it would go on generating.
  ASSERT_TRUE(WaitFor([&] { return M("asympo_rollout_generation_blocked") == 1; }));
  const int calls = Calls();
  ASSERT_TRUE(WaitFor([&] { return Calls() >= calls + 3; }));
  EXPECT_EQ(M("asympo_rollout_generation_blocked"), 1);
  EXPECT_EQ(M("asympo_rollout_groups_generated_total"), 6);
  EXPECT_LE(M("asympo_rollout_buffer_groups"), 6);
  EXPECT_EQ(learner_.AcceptedGroups(), 0);
  {
    std::lock_guard<std::mutex> lock(learner_.mu);
    learner_.then = grpc::StatusCode::OK;
  }
  ASSERT_TRUE(WaitFor([&] { return learner_.AcceptedGroups() >= 12; }));
  // Every group generated reaches the learner exactly once: none was lost
  // while refused, none is left after the drain at shutdown.
  daemon_->Shutdown();
  run_.join();
  ASSERT_OK(result_);
  EXPECT_EQ(learner_.AcceptedGroups(), M("asympo_rollout_groups_generated_total"));
  EXPECT_EQ(*result_, learner_.AcceptedGroups());
  EXPECT_EQ(M("asympo_rollout_groups_dropped_total", "rejected"), 0);
  EXPECT_EQ(M("asympo_rollout_groups_dropped_total", "shutdown"), 0);
}

TEST_F(RolloutDaemonTest, WaitsTheRetryHintAfterResourceExhausted) {
  learner_.script = {grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::RESOURCE_EXHAUSTED};
  Start(8);
  ASSERT_TRUE(WaitFor([&] { return learner_.AcceptedGroups() >= 4; }));
  std::lock_guard<std::mutex> lock(learner_.mu);
  ASSERT_EQ(learner_.refused_at.size(), 2u);
  EXPECT_GE(learner_.refused_at[1] - learner_.refused_at[0], absl::Milliseconds(290));
  EXPECT_EQ(M("asympo_rollout_submit_errors_total", "RESOURCE_EXHAUSTED"), 2);
  EXPECT_EQ(M("asympo_rollout_groups_dropped_total", "rejected"), 0);
}

TEST_F(RolloutDaemonTest, RetriesABatchAsItWasWithItsBatchId) {
  // A deadline or a dropped connection may hide an accepted batch: the retry
  // must be the same batch with the same id, so that the learner can
  // answer it as a duplicate.
  learner_.script = {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::DEADLINE_EXCEEDED,
                     grpc::StatusCode::RESOURCE_EXHAUSTED};
  Start(8);
  ASSERT_TRUE(WaitFor([&] { return learner_.AcceptedGroups() >= 8; }));
  std::lock_guard<std::mutex> lock(learner_.mu);
  ASSERT_GE(learner_.submitted.size(), 5u);
  const v1::RolloutBatch& first = learner_.submitted[0];
  EXPECT_FALSE(first.batch_id().empty());
  EXPECT_LE(first.batch_id().size(), 128u);
  EXPECT_EQ(first.batch_id().rfind(first.source() + "/", 0), 0u) << first.batch_id();
  for (int i = 1; i <= 3; ++i) {
    EXPECT_EQ(learner_.submitted[i].SerializeAsString(), first.SerializeAsString()) << i;
  }
  std::set<std::string> ids;
  for (const v1::RolloutBatch& b : learner_.accepted) ids.insert(b.batch_id());
  EXPECT_EQ(ids.size(), learner_.accepted.size());  // every other batch has its own id
}

TEST_F(RolloutDaemonTest, CountsRejectedBatchesAsDropped) {
  learner_.script = {grpc::StatusCode::INVALID_ARGUMENT};
  Start(8);
  ASSERT_TRUE(WaitFor([&] { return learner_.AcceptedGroups() >= 4; }));
  const double dropped = M("asympo_rollout_groups_dropped_total", "rejected");
  EXPECT_GE(dropped, 1);
  EXPECT_LE(dropped, 4);
}

TEST_F(RolloutDaemonTest, StopsWithTheErrorOnAFatalAnswer) {
  // Credentials the learner refuses are a configuration error (the retry
  // policy's fatal, docs/protocol.md "Retries"): the daemon stops with it
  // rather than retrying forever; what it held counts as not sent.
  learner_.then = grpc::StatusCode::UNAUTHENTICATED;
  Start(8);
  run_.join();
  EXPECT_THAT(result_, StatusIs(absl::StatusCode::kUnauthenticated, "the learner refused a batch"));
  EXPECT_EQ(Calls(), 1);
  EXPECT_EQ(M("asympo_rollout_submit_errors_total", "UNAUTHENTICATED"), 1);
  EXPECT_GE(M("asympo_rollout_groups_dropped_total", "shutdown"), 1);
  EXPECT_EQ(M("asympo_rollout_groups_dropped_total", "rejected"), 0);
}

TEST_F(RolloutDaemonTest, DropsAFailedPreconditionBatchAsStaleAndGoesOn) {
  // The learner's state does not admit this batch as it is (its policy
  // version is beyond the lag bound, or another incarnation's): drop_batch,
  // counted as stale, not as rejected.
  learner_.script = {grpc::StatusCode::FAILED_PRECONDITION};
  Start(8);
  ASSERT_TRUE(WaitFor([&] { return learner_.AcceptedGroups() >= 4; }));
  const double dropped = M("asympo_rollout_groups_dropped_total", "stale");
  EXPECT_GE(dropped, 1);  // the first batch: what was buffered when it was taken
  EXPECT_LE(dropped, 4);
  EXPECT_EQ(M("asympo_rollout_groups_dropped_total", "rejected"), 0);
  EXPECT_EQ(M("asympo_rollout_submit_errors_total", "FAILED_PRECONDITION"), 1);
}

TEST_F(RolloutDaemonTest, CountsGroupsLeftAtShutdown) {
  learner_.then = grpc::StatusCode::UNAVAILABLE;
  Start(4, absl::Milliseconds(100));
  ASSERT_TRUE(WaitFor([&] { return M("asympo_rollout_groups_generated_total") >= 4; }));
  daemon_->Shutdown();
  run_.join();
  ASSERT_OK(result_);
  EXPECT_EQ(*result_, 0);
  EXPECT_EQ(M("asympo_rollout_groups_dropped_total", "shutdown"), 4);
}

TEST(RolloutDaemonOptionsTest, RejectsBadOptionsByName) {
  prometheus::Registry registry;
  RolloutDaemonOptions o;
  o.group_size = 1;
  EXPECT_THAT(RolloutDaemon::Create(o, registry),
              StatusIs(absl::StatusCode::kInvalidArgument, "group_size"));
  o.group_size = 4;
  o.continuous.max_running_sequences = 0;
  EXPECT_THAT(RolloutDaemon::Create(o, registry),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_running_sequences is 0"));
  o.continuous.max_running_sequences = 8;
  o.continuous_batching = false;
  o.max_buffered_groups = 2;
  o.prompts_per_generation = 4;
  EXPECT_THAT(RolloutDaemon::Create(o, registry),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_buffered_groups"));
  o.max_buffered_groups = 8;
  o.task.name = "no-such-task";
  EXPECT_THAT(RolloutDaemon::Create(o, registry),
              StatusIs(absl::StatusCode::kInvalidArgument, "no-such-task"));
}

}  // namespace
}  // namespace asympo::rollout
