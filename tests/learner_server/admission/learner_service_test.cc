// The Learner service with a real gRPC server on a loopback port and a real
// client.
#include "learner_server/admission/learner_service.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "learner_server/admission/policy_lag.h"
#include "learner_server/learner_metrics.h"
#include "tests/testing/grpc_metadata.h"
#include "tests/testing/rollout_batch_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::RolloutBatchBuilder;
using ::asympo::testing::StatusIs;
using ::asympo::testing::Trailing;
using ::asympo::testing::WaitFor;

// Prompt {1, 2}; response r holds {3 + r} with reward r.
v1::RolloutBatch ServiceBatch(int groups, int responses = 3, const std::string& tag = "p") {
  return RolloutBatchBuilder(groups, responses)
      .Source("test")
      .PromptIds([&](int g) { return tag + std::to_string(g); })
      .Build();
}

class LearnerServiceTest : public ::testing::Test {
 protected:
  void Start(int64_t capacity, absl::Duration full_timeout = absl::Seconds(5)) {
    queue_ = std::make_unique<GroupQueue>(GroupQueueOptions{capacity, 64});
    LearnerServiceOptions o;
    o.limits.vocab_size = 100;
    o.limits.max_group_size = 8;
    o.limits.max_groups_per_batch = 16;
    o.full_queue_timeout = full_timeout;
    o.retry_after = absl::Milliseconds(750);
    o.objective = "asympo";
    o.version = [this] { return version_.load(); };
    o.fault_reply_delay = reply_delay_;
    o.max_streams = max_streams_;
    o.max_streams_per_principal = max_streams_per_principal_;
    o.received_bytes = &received_;
    o.policy_lag = policy_lag_.get();
    service_ = std::make_unique<LearnerService>(o, queue_.get(), &counters_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = v1::Learner::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                     grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (queue_) queue_->Close();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  grpc::Status Submit(const v1::RolloutBatch& b, v1::SubmitResponse* r,
                      grpc::ClientContext* ctx = nullptr) {
    grpc::ClientContext own;
    return stub_->Submit(ctx ? ctx : &own, b, r);
  }

  LearnerCounters counters_;
  std::atomic<int64_t> received_{0};
  absl::Duration reply_delay_ = absl::ZeroDuration();
  int64_t max_streams_ = 1024;
  int64_t max_streams_per_principal_ = 1024;  // one client: its share is the whole
  std::atomic<uint64_t> version_{0};          // the trainer's, in the daemon
  prometheus::Registry registry_;
  std::unique_ptr<PolicyLag> policy_lag_;  // set before Start: the bound
  std::unique_ptr<GroupQueue> queue_;
  std::unique_ptr<LearnerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Learner::Stub> stub_;
};

TEST_F(LearnerServiceTest, QueuesAValidBatch) {
  Start(8);
  v1::SubmitResponse r;
  const grpc::Status s = Submit(ServiceBatch(2), &r);
  ASSERT_OK(s);
  EXPECT_EQ(r.accepted_groups(), 2u);
  EXPECT_EQ(r.accepted_responses(), 6u);
  EXPECT_EQ(r.queue_depth_groups(), 2u);
  const auto groups = queue_->Pop(2, absl::Now() + absl::Seconds(1));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].group.prompt_id(), "p1");
  EXPECT_EQ(groups[0].tokens, 3 * 3);  // 3 responses x (2 prompt + 1 response) tokens
}

// Every request's bytes are counted, whatever becomes of it, for the
// release of what requests leave on the heap (common/daemon/heap_release.h).
TEST_F(LearnerServiceTest, CountsTheBytesOfEveryRequest) {
  Start(8);
  v1::SubmitResponse r;
  const v1::RolloutBatch good = ServiceBatch(2);
  v1::RolloutBatch bad = ServiceBatch(1, 3, "bad");
  bad.mutable_groups(0)->mutable_responses(0)->set_tokens(0, 100000);  // beyond the vocabulary
  ASSERT_OK(Submit(good, &r));
  EXPECT_THAT(Submit(bad, &r), StatusIs(grpc::StatusCode::INVALID_ARGUMENT));
  grpc::ClientContext ctx;
  v1::SubmitResponse stream_reply;
  auto writer = stub_->SubmitStream(&ctx, &stream_reply);
  const v1::RolloutBatch streamed = ServiceBatch(1, 3, "s");
  ASSERT_TRUE(writer->Write(streamed));
  ASSERT_TRUE(writer->Write(ServiceBatch(1, 3, "t")));
  writer->WritesDone();
  ASSERT_OK(writer->Finish());
  grpc::ClientContext status_ctx;
  v1::LearnerStatus status;
  ASSERT_OK(stub_->GetStatus(&status_ctx, {}, &status));
  EXPECT_EQ(received_.load(),
            static_cast<int64_t>(good.ByteSizeLong() + bad.ByteSizeLong() +
                                 2 * streamed.ByteSizeLong()));  // GetStatus's request is empty
}

TEST_F(LearnerServiceTest, RejectsEachInvalidClassWholeWithItsMessage) {
  Start(8);
  struct Case {
    std::function<void(v1::RolloutBatch*)> mutate;
    const char* message;
  };
  const Case cases[] = {
      {[](v1::RolloutBatch* b) { b->mutable_groups(1)->mutable_responses(0)->set_tokens(0, 100); },
       "group 1 (prompt_id \"p1\") response 0: response token 0 is 100"},
      {[](v1::RolloutBatch* b) {
         b->mutable_groups(1)->mutable_responses(2)->set_reward(std::nanf(""));
       },
       "response 2: reward is nan"},
      {[](v1::RolloutBatch* b) { b->mutable_groups(0)->mutable_responses()->DeleteSubrange(1, 2); },
       "group 0 (prompt_id \"p0\"): group has 1 responses"},
      {[](v1::RolloutBatch* b) { b->mutable_groups(1)->mutable_responses(1)->clear_tokens(); },
       "response 1: response has no tokens"},
      {[](v1::RolloutBatch* b) { b->clear_groups(); }, "batch has no groups"},
  };
  for (const Case& c : cases) {
    v1::RolloutBatch b = ServiceBatch(2);
    c.mutate(&b);
    v1::SubmitResponse r;
    const grpc::Status s = Submit(b, &r);
    EXPECT_THAT(s, StatusIs(grpc::StatusCode::INVALID_ARGUMENT, c.message));
  }
  EXPECT_EQ(queue_->Stats().depth_groups, 0);  // nothing of any of them
  EXPECT_EQ(counters_.rejected_invalid_batches.load(), 5u);
}

TEST_F(LearnerServiceTest, AFullQueueHoldsTheProducerThenReturnsResourceExhausted) {
  Start(2, absl::Milliseconds(300));
  v1::SubmitResponse r;
  ASSERT_OK(Submit(ServiceBatch(2), &r));
  grpc::ClientContext ctx;
  const absl::Time start = absl::Now();
  const grpc::Status s = Submit(ServiceBatch(1, 3, "late"), &r, &ctx);
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(290));  // held, not refused at once
  EXPECT_EQ(Trailing(ctx, "asympo-retry-after-ms"), "750");
  EXPECT_EQ(queue_->Stats().depth_groups, 2);
  EXPECT_EQ(counters_.rejected_full_batches.load(), 1u);
}

TEST_F(LearnerServiceTest, AHeldProducerIsAdmittedWhenTheTrainerFreesRoom) {
  Start(2, absl::Seconds(10));
  v1::SubmitResponse r;
  ASSERT_OK(Submit(ServiceBatch(2), &r));
  std::thread trainer([&] {
    // Frees room only once the producer is held.
    ASSERT_TRUE(WaitFor([&] { return queue_->Stats().waiting_pushes == 1; }));
    queue_->Pop(2, absl::Now() + absl::Seconds(1));
  });
  const grpc::Status s = Submit(ServiceBatch(2, 3, "second"), &r);
  trainer.join();
  EXPECT_OK(s);
  EXPECT_EQ(queue_->Stats().depth_groups, 2);
}

TEST_F(LearnerServiceTest, StreamStopsAtTheFirstInvalidBatchKeepingEarlierOnes) {
  Start(16);
  grpc::ClientContext ctx;
  v1::SubmitResponse r;
  auto writer = stub_->SubmitStream(&ctx, &r);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(writer->Write(ServiceBatch(1, 2, "ok" + std::to_string(i))));
  v1::RolloutBatch bad = ServiceBatch(1);
  bad.mutable_groups(0)->mutable_responses(0)->set_reward(INFINITY);
  writer->Write(bad);
  writer->WritesDone();
  const grpc::Status s = writer->Finish();
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::INVALID_ARGUMENT, "batch 3: group 0"));
  EXPECT_EQ(Trailing(ctx, "asympo-accepted-batches"), "3");
  EXPECT_EQ(queue_->Stats().depth_groups, 3);
}

// Every response of group g sampled by `versions[g]` (first = last).
v1::RolloutBatch VersionedBatch(const std::vector<uint64_t>& versions, const std::string& tag) {
  v1::RolloutBatch b = ServiceBatch(static_cast<int>(versions.size()), 3, tag);
  for (size_t g = 0; g < versions.size(); ++g) {
    for (v1::Response& r : *b.mutable_groups(static_cast<int>(g))->mutable_responses()) {
      r.set_first_policy_version(versions[g]);
      r.set_last_policy_version(versions[g]);
    }
  }
  return b;
}

// Version 10, --max_policy_lag 2: version 8 is in, 7 is refused whole with
// FAILED_PRECONDITION (on a stream too, keeping the batches before it), 11
// is from the future; each is counted apart.
TEST_F(LearnerServiceTest, RefusesAGroupBeyondThePolicyLagBoundWholeAndCountsIt) {
  policy_lag_ = std::make_unique<PolicyLag>(2, RegisterPolicyLagMetrics(registry_));
  version_ = 10;
  Start(16);
  v1::SubmitResponse r;
  ASSERT_OK(Submit(VersionedBatch({8, 10}, "in"), &r));
  EXPECT_THAT(Submit(VersionedBatch({9, 7}, "old"), &r),
              StatusIs(grpc::StatusCode::FAILED_PRECONDITION,
                       "group 1 (prompt_id \"old1\"): sampled by policy version 7 (its oldest "
                       "first_policy_version), 3 versions behind the learner's version 10, more "
                       "than its --max_policy_lag 2"));
  // Another incarnation's version: stale, refused and counted as lag.
  EXPECT_THAT(Submit(VersionedBatch({11}, "future"), &r),
              StatusIs(grpc::StatusCode::FAILED_PRECONDITION,
                       "response 0: first_policy_version 11 (last 11) is newer than the "
                       "learner's version 10"));
  grpc::ClientContext ctx;
  auto writer = stub_->SubmitStream(&ctx, &r);
  ASSERT_TRUE(writer->Write(ServiceBatch(1, 2, "unversioned")));  // not bounded
  writer->Write(VersionedBatch({0}, "ancient"));
  writer->WritesDone();
  EXPECT_THAT(writer->Finish(), StatusIs(grpc::StatusCode::FAILED_PRECONDITION,
                                         "batch 1: group 0 (prompt_id \"ancient0\")"));
  EXPECT_EQ(Trailing(ctx, "asympo-accepted-batches"), "1");
  EXPECT_EQ(queue_->Stats().depth_groups, 3);
  grpc::ClientContext status_ctx;
  v1::LearnerStatus status;
  ASSERT_OK(stub_->GetStatus(&status_ctx, {}, &status));
  EXPECT_EQ(status.max_policy_lag(), 2u);
  EXPECT_EQ(status.rejected_lag_batches(), 3u);
  EXPECT_EQ(status.rejected_invalid_batches(), 0u);
  EXPECT_EQ(status.accepted_batches(), 2u);
  ASSERT_EQ(status.source_policy_lags_size(), 1);
  EXPECT_EQ(status.source_policy_lags(0).rejected_batches(), 3u);
}

TEST_F(LearnerServiceTest, StreamIsFlowControlledByTheQueue) {
  Start(4, absl::Seconds(10));
  std::atomic<int> popped{0};
  std::atomic<bool> stop{false};
  std::atomic<int> pops_while_held{0};
  std::thread trainer([&] {
    // Takes a group only while the stream is held at the full queue, so
    // that every batch after the first four waits for room.
    while (!stop) {
      if (!WaitFor([&] { return stop || queue_->Stats().waiting_pushes > 0; })) continue;
      if (stop) break;
      popped += static_cast<int>(queue_->Pop(1, absl::Now() + absl::Milliseconds(50)).size());
      ++pops_while_held;
    }
  });
  grpc::ClientContext ctx;
  v1::SubmitResponse r;
  auto writer = stub_->SubmitStream(&ctx, &r);
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(writer->Write(ServiceBatch(2, 2, "s")));
  writer->WritesDone();
  const grpc::Status s = writer->Finish();
  stop = true;
  trainer.join();
  ASSERT_OK(s);
  EXPECT_EQ(r.accepted_batches(), 40u);
  EXPECT_EQ(r.accepted_groups(), 80u);
  EXPECT_EQ(popped.load() + queue_->Stats().depth_groups, 80);
  EXPECT_LE(queue_->Stats().depth_groups, 4);
  EXPECT_GE(pops_while_held.load(), 76) << "the stream was not held by the full queue";
}

TEST_F(LearnerServiceTest, ConcurrentSubmittersAreAccountedExactly) {
  Start(8, absl::Seconds(20));
  std::atomic<bool> stop{false};
  std::atomic<int> trained{0};
  std::thread trainer([&] {
    while (!stop)
      trained += static_cast<int>(queue_->Pop(1, absl::Now() + absl::Milliseconds(20)).size());
  });
  std::vector<std::thread> clients;
  std::atomic<int> accepted{0};
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 25; ++i) {
        v1::SubmitResponse r;
        grpc::ClientContext ctx;
        if (stub_->Submit(&ctx, ServiceBatch(1 + i % 3, 2, "c" + std::to_string(c)), &r).ok()) {
          accepted += static_cast<int>(r.accepted_groups());
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  stop = true;
  trainer.join();
  EXPECT_EQ(accepted.load(), 4 * (8 * 6 + 1));  // 25 batches of 1, 2, 3, 1, 2, 3, ... groups
  EXPECT_EQ(accepted.load(), trained.load() + queue_->Stats().depth_groups);
  EXPECT_EQ(counters_.accepted_groups.load(), static_cast<uint64_t>(accepted.load()));
}

TEST_F(LearnerServiceTest, GetStatusReportsQueueCountersAndLimits) {
  Start(8);
  v1::SubmitResponse r;
  ASSERT_OK(Submit(ServiceBatch(3), &r));
  version_ = 7;
  counters_.counted_version = 7;
  grpc::ClientContext ctx;
  v1::LearnerStatus st;
  ASSERT_OK(stub_->GetStatus(&ctx, v1::GetStatusRequest(), &st));
  EXPECT_EQ(st.version(), 7u);
  EXPECT_EQ(st.queue_depth_groups(), 3u);
  EXPECT_EQ(st.queue_capacity_groups(), 8u);
  EXPECT_EQ(st.accepted_batches(), 1u);
  EXPECT_EQ(st.objective(), "asympo");
  EXPECT_FALSE(st.wants_behavior_logprobs());
  EXPECT_EQ(st.limits().vocab_size(), 100);
  EXPECT_EQ(st.limits().min_group_size(), 2);
}

// The trainer moves its version inside a step and counts the step's groups
// after it: a status read between the two must not pair version v with the
// counters of v - 1 (a client waiting for v would read v's groups as
// untrained). GetStatus reports the version whose step is counted.
TEST_F(LearnerServiceTest, GetStatusReportsTheVersionWhoseStepIsCounted) {
  Start(8);
  counters_.trained_groups = 4;
  counters_.counted_version = 2;
  version_ = 3;  // step 3 trained, its groups not yet counted
  grpc::ClientContext ctx;
  v1::LearnerStatus st;
  ASSERT_OK(stub_->GetStatus(&ctx, v1::GetStatusRequest(), &st));
  EXPECT_EQ(st.version(), 2u);
  EXPECT_EQ(st.trained_groups(), 4u);
  v1::SubmitResponse r;  // a submission is answered with the trainer's own version
  ASSERT_OK(Submit(ServiceBatch(1), &r));
  EXPECT_EQ(r.learner_version(), 3u);
}

v1::RolloutBatch WithId(v1::RolloutBatch b, const std::string& id) {
  b.set_batch_id(id);
  return b;
}

TEST_F(LearnerServiceTest, ARetriedBatchIdIsAcknowledgedAsTheFirstButQueuedOnce) {
  Start(8);
  v1::SubmitResponse first, again;
  ASSERT_OK(Submit(WithId(ServiceBatch(2), "gen-a/1"), &first));
  EXPECT_EQ(first.duplicate_batches(), 0u);
  const grpc::Status s = Submit(WithId(ServiceBatch(2), "gen-a/1"), &again);
  ASSERT_OK(s);
  EXPECT_EQ(again.duplicate_batches(), 1u);
  EXPECT_EQ(again.accepted_batches(), 1u);
  EXPECT_EQ(again.accepted_groups(), 2u);
  EXPECT_EQ(again.queue_depth_groups(), 2u);
  EXPECT_EQ(queue_->Stats().depth_groups, 2);
  EXPECT_EQ(counters_.accepted_batches.load(), 1u);
  EXPECT_EQ(counters_.accepted_groups.load(), 2u);
  EXPECT_EQ(counters_.duplicate_batches.load(), 1u);
  grpc::ClientContext ctx;
  v1::LearnerStatus st;
  ASSERT_OK(stub_->GetStatus(&ctx, v1::GetStatusRequest(), &st));
  EXPECT_EQ(st.duplicate_batches(), 1u);
  EXPECT_EQ(st.accepted_batches(), 1u);
  EXPECT_EQ(st.batch_id_window(), 65536u);
  EXPECT_EQ(st.limits().max_batch_id_bytes(), 128);
}

TEST_F(LearnerServiceTest, ASubmitAcceptedJustBeforeItsDeadlineThenRetriedIsQueuedOnce) {
  reply_delay_ = absl::Milliseconds(600);  // the learner accepts, the reply comes too late
  Start(8);
  v1::SubmitResponse r;
  grpc::ClientContext short_deadline;
  short_deadline.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  const grpc::Status lost = Submit(WithId(ServiceBatch(3), "gen-b/7"), &r, &short_deadline);
  EXPECT_THAT(lost, StatusIs(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_EQ(queue_->Stats().depth_groups, 3);  // accepted all the same
  grpc::ClientContext retry;
  retry.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::Status s = Submit(WithId(ServiceBatch(3), "gen-b/7"), &r, &retry);
  ASSERT_OK(s);
  EXPECT_EQ(r.duplicate_batches(), 1u);
  EXPECT_EQ(queue_->Stats().depth_groups, 3);
  EXPECT_EQ(counters_.accepted_groups.load(), 3u);
}

TEST_F(LearnerServiceTest, AStreamAcknowledgesDuplicatesAndQueuesEachIdOnce) {
  Start(16);
  grpc::ClientContext ctx;
  v1::SubmitResponse r;
  auto writer = stub_->SubmitStream(&ctx, &r);
  ASSERT_TRUE(writer->Write(WithId(ServiceBatch(2), "s/1")));
  ASSERT_TRUE(writer->Write(WithId(ServiceBatch(2), "s/1")));
  ASSERT_TRUE(writer->Write(WithId(ServiceBatch(1), "s/2")));
  ASSERT_TRUE(writer->WritesDone());
  const grpc::Status s = writer->Finish();
  ASSERT_OK(s);
  EXPECT_EQ(r.accepted_batches(), 3u);
  EXPECT_EQ(r.duplicate_batches(), 1u);
  EXPECT_EQ(queue_->Stats().depth_groups, 3);
  EXPECT_EQ(counters_.accepted_batches.load(), 2u);
}

TEST_F(LearnerServiceTest, UnknownFieldsAreNotKeptInTheQueue) {
  Start(8);
  v1::RolloutBatch b = ServiceBatch(2);
  const std::string padding(1 << 20, 'x');  // a field this learner does not know
  b.mutable_groups(0)
      ->GetReflection()
      ->MutableUnknownFields(b.mutable_groups(0))
      ->AddLengthDelimited(99, padding);
  b.mutable_groups(1)
      ->mutable_responses(0)
      ->GetReflection()
      ->MutableUnknownFields(b.mutable_groups(1)->mutable_responses(0))
      ->AddLengthDelimited(98, padding);
  v1::SubmitResponse r;
  const grpc::Status s = Submit(b, &r);
  ASSERT_OK(s);
  const auto groups = queue_->Pop(2, absl::Now() + absl::Seconds(1));
  ASSERT_EQ(groups.size(), 2u);
  for (const QueuedGroup& g : groups) {
    EXPECT_LT(g.group.ByteSizeLong(), 1000u) << "unknown fields were kept";
    EXPECT_GT(g.group.responses_size(), 0);
  }
}

TEST_F(LearnerServiceTest, OpenSubmitStreamsAreBounded) {
  max_streams_ = 2;
  Start(16);
  struct Open {
    grpc::ClientContext ctx;
    v1::SubmitResponse r;
    std::unique_ptr<grpc::ClientWriter<v1::RolloutBatch>> writer;
  };
  std::vector<std::unique_ptr<Open>> open;
  for (int i = 0; i < 2; ++i) {
    open.push_back(std::make_unique<Open>());
    open.back()->writer = stub_->SubmitStream(&open.back()->ctx, &open.back()->r);
    ASSERT_TRUE(open.back()->writer->Write(ServiceBatch(1, 3, "s" + std::to_string(i))));
  }
  ASSERT_TRUE(WaitFor([&] { return service_->open_streams() == 2; }));
  {
    Open third;
    third.writer = stub_->SubmitStream(&third.ctx, &third.r);
    third.writer->Write(ServiceBatch(1));
    third.writer->WritesDone();
    const grpc::Status s = third.writer->Finish();
    EXPECT_THAT(s,
                StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED, "2 SubmitStreams open, its limit"));
    EXPECT_EQ(Trailing(third.ctx, "asympo-retry-after-ms"), "750");
  }
  for (auto& o : open) {
    ASSERT_TRUE(o->writer->WritesDone());
    ASSERT_OK(o->writer->Finish());
  }
  ASSERT_TRUE(WaitFor([&] { return service_->open_streams() == 0; }));
  EXPECT_EQ(queue_->Stats().depth_groups, 2);
  grpc::ClientContext ctx;
  v1::SubmitResponse r;
  auto writer = stub_->SubmitStream(&ctx, &r);
  ASSERT_TRUE(writer->Write(ServiceBatch(1)));
  ASSERT_TRUE(writer->WritesDone());
  EXPECT_OK(writer->Finish());  // room again
}

// Without an authorizer every caller is "anonymous": the share is counted
// per peer address, and one address cannot hold every stream.
TEST_F(LearnerServiceTest, OnePeerCannotHoldEverySubmitStream) {
  max_streams_ = 4;
  max_streams_per_principal_ = 1;
  Start(16);
  grpc::ClientContext held_ctx;
  v1::SubmitResponse held_r;
  auto held = stub_->SubmitStream(&held_ctx, &held_r);
  ASSERT_TRUE(held->Write(ServiceBatch(1, 3, "held")));
  ASSERT_TRUE(WaitFor([&] { return service_->open_streams() == 1; }));
  grpc::ClientContext ctx;
  v1::SubmitResponse r;
  auto second = stub_->SubmitStream(&ctx, &r);
  second->Write(ServiceBatch(1));
  second->WritesDone();
  const grpc::Status s = second->Finish();
  EXPECT_THAT(s, StatusIs(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "\"peer 127.0.0.1\" holds 1 SubmitStreams open"));
  ASSERT_TRUE(held->WritesDone());
  EXPECT_OK(held->Finish());
  EXPECT_TRUE(WaitFor([&] { return service_->open_streams() == 0; }));
}

}  // namespace
}  // namespace asympo::learner
