// The remote environment client against a real asympo.v1.Environment
// server on loopback: what travels each way, deadlines, a server that is
// not there, answers that break the protocol, and calls in flight when the
// client is destroyed (a Close still arrives; a call that hangs is
// cancelled; every callback runs once), and an episode runner stopped while
// its Resets are out (each episode they open is closed).
#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "asympo/v1/environment.grpc.pb.h"
#include "rollout_server/episodes/environment.h"
#include "rollout_server/episodes/episode_runner.h"
#include "tests/testing/episode_metrics.h"
#include "tests/testing/status_matchers.h"

namespace asympo::rollout {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::ElementsAre;

// A server whose answers the test sets; it records the last requests.
class Service : public v1::Environment::Service {
 public:
  grpc::Status Reset(grpc::ServerContext* ctx, const v1::ResetRequest* r,
                     v1::ResetResponse* out) override {
    Wait(ctx);
    std::lock_guard<std::mutex> lock(mu);
    last_reset = *r;
    out->set_episode_id(episode_id);
    return grpc::Status::OK;
  }
  grpc::Status Step(grpc::ServerContext* ctx, const v1::StepRequest* r,
                    v1::StepResponse* out) override {
    Wait(ctx);
    std::lock_guard<std::mutex> lock(mu);
    last_step = *r;
    *out = answer;
    return grpc::Status::OK;
  }
  grpc::Status Close(grpc::ServerContext*, const v1::CloseRequest* r, v1::CloseResponse*) override {
    ++closed;
    return grpc::Status::OK;
  }

  // Sleeps `delay`, or until the call is cancelled.
  void Wait(grpc::ServerContext* ctx) const {
    for (auto t = std::chrono::steady_clock::now() + delay.load();
         std::chrono::steady_clock::now() < t && !ctx->IsCancelled();) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  std::atomic<std::chrono::milliseconds> delay{std::chrono::milliseconds(0)};
  std::string episode_id = "ep-1";
  v1::StepResponse answer;
  // Calls run side by side: each records its request under `mu`.
  std::mutex mu;
  v1::ResetRequest last_reset;
  v1::StepRequest last_step;
  std::atomic<int> closed{0};
};

struct Server {
  Service service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  Server() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
  }
  ~Server() { server->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

std::unique_ptr<Environment> Client(const std::string& address, absl::Duration timeout,
                                    prometheus::Registry& registry) {
  RemoteEnvironmentOptions o;
  o.address = address;
  o.source = "rollout-test";
  o.timeout = timeout;
  return CreateRemoteEnvironment(o, registry).value();
}

absl::StatusOr<std::string> ResetNow(Environment& env, const TaskPrompt& p) {
  std::promise<absl::StatusOr<std::string>> got;
  env.Reset(p, 3, 77, [&](absl::StatusOr<std::string> id) { got.set_value(std::move(id)); });
  return got.get_future().get();
}

absl::StatusOr<TurnAnswer> StepNow(Environment& env, const Turn& turn) {
  std::promise<absl::StatusOr<TurnAnswer>> got;
  env.Step("ep-1", turn, [&](absl::StatusOr<TurnAnswer> a) { got.set_value(std::move(a)); });
  return got.get_future().get();
}

TEST(RemoteEnvironmentTest, CarriesEveryFieldBothWays) {
  Server s;
  prometheus::Registry registry;
  auto env = Client(s.address(), absl::Seconds(10), registry);
  TaskPrompt p{"add-7", {1, 22, 9, 3}, "add 1 2"};
  ASSERT_OK_AND_ASSIGN(const std::string id, ResetNow(*env, p));
  EXPECT_EQ(id, "ep-1");
  EXPECT_EQ(s.service.last_reset.prompt_id(), "add-7");
  EXPECT_THAT(s.service.last_reset.prompt_tokens(), ElementsAre(1, 22, 9, 3));
  EXPECT_EQ(s.service.last_reset.reference(), "add 1 2");
  EXPECT_EQ(s.service.last_reset.response_index(), 3u);
  EXPECT_EQ(s.service.last_reset.seed(), 77u);
  EXPECT_EQ(s.service.last_reset.source(), "rollout-test");
  s.service.answer.add_append_tokens(19);
  s.service.answer.add_append_tokens(14);
  Turn turn{{9, 18, 10, 23}, 2, v1::FINISH_REASON_STOP, false, 30};
  ASSERT_OK_AND_ASSIGN(TurnAnswer a, StepNow(*env, turn));
  EXPECT_THAT(a.append, ElementsAre(19, 14));
  EXPECT_FALSE(a.done);
  EXPECT_THAT(s.service.last_step.turn_tokens(), ElementsAre(9, 18, 10, 23));
  EXPECT_EQ(s.service.last_step.turn(), 2u);
  EXPECT_EQ(s.service.last_step.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_FALSE(s.service.last_step.final());
  EXPECT_EQ(s.service.last_step.tokens_left(), 30u);
  s.service.answer.set_done(true);
  s.service.answer.set_reward(0.75f);
  s.service.answer.set_correct(true);
  ASSERT_OK_AND_ASSIGN(a, StepNow(*env, turn));
  EXPECT_TRUE(a.done);
  EXPECT_TRUE(a.append.empty()) << "tokens sent with done are not appended";
  EXPECT_DOUBLE_EQ(a.reward, 0.75);
  EXPECT_TRUE(a.correct);
  env->Close("ep-1");
  env.reset();  // lets the Close reach the server
  EXPECT_EQ(s.service.closed.load(), 1);
}

TEST(RemoteEnvironmentTest, DeadlinesAbsentServersAndBadAnswersAreErrors) {
  Server s;
  prometheus::Registry registry;
  const TaskPrompt p{"p", {1}, ""};
  {
    s.service.delay = std::chrono::milliseconds(1500);
    auto env = Client(s.address(), absl::Milliseconds(200), registry);
    EXPECT_THAT(ResetNow(*env, p), StatusIs(absl::StatusCode::kDeadlineExceeded));
    s.service.delay = std::chrono::milliseconds(0);
  }
  {
    auto env = Client("127.0.0.1:1", absl::Seconds(5), registry);
    EXPECT_THAT(ResetNow(*env, p), StatusIs(absl::StatusCode::kUnavailable));
  }
  auto env = Client(s.address(), absl::Seconds(5), registry);
  s.service.episode_id = "";
  EXPECT_THAT(ResetNow(*env, p), StatusIs(absl::StatusCode::kInvalidArgument, "episode_id"));
  EXPECT_TRUE(IsInvalidAnswer(ResetNow(*env, p).status())) << "counted as invalid_answer";
  s.service.episode_id = std::string(257, 'x');
  EXPECT_THAT(ResetNow(*env, p), StatusIs(absl::StatusCode::kInvalidArgument, "episode_id"));
  s.service.answer.set_done(true);
  s.service.answer.set_reward(std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(StepNow(*env, Turn{}), StatusIs(absl::StatusCode::kInvalidArgument, "finite"));
  EXPECT_TRUE(IsInvalidAnswer(StepNow(*env, Turn{}).status())) << "counted as invalid_answer";
  prometheus::Registry other;
  RemoteEnvironmentOptions bad;
  bad.address = "no-port";
  EXPECT_THAT(CreateRemoteEnvironment(bad, other).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "--environment"));
}

TEST(RemoteEnvironmentTest, DestroyingItCancelsCallsInFlightAndRunsEachCallbackOnce) {
  Server s;
  s.service.delay = std::chrono::milliseconds(20000);
  prometheus::Registry registry;
  auto env = Client(s.address(), absl::Seconds(60), registry);
  std::atomic<int> answered{0}, cancelled{0};
  for (int i = 0; i < 8; ++i) {
    env->Step("ep-1", Turn{}, [&](absl::StatusOr<TurnAnswer> a) {
      ++answered;
      if (absl::IsCancelled(a.status())) ++cancelled;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  env.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(answered.load(), 8);
  EXPECT_EQ(cancelled.load(), 8);
}

// A daemon that stops (or abandons its groups) while Resets are out still
// closes every episode those Resets open, once their answers come back;
// a server that never answers does not hold the runner past its grace.
TEST(RemoteEnvironmentTest, ARunnerStoppedWithResetsOutClosesTheEpisodesTheyOpen) {
  Server s;
  s.service.delay = std::chrono::milliseconds(300);
  prometheus::Registry registry;
  std::unique_ptr<EpisodeMetrics> metrics = ::asympo::testing::TestEpisodeMetrics(registry);
  EpisodeOptions eo;
  eo.group_size = 4;
  TaskPrompt prompt;
  prompt.prompt_id = "p";
  prompt.prompt_tokens = {1, 2};
  std::mt19937_64 rng(5);
  {
    EpisodeRunner runner(Client(s.address(), absl::Seconds(60), registry), eo, metrics.get());
    runner.StartGroup(prompt, /*logprobs=*/false, rng);
    EXPECT_EQ(runner.Abandon(), 1);
  }
  EXPECT_EQ(s.service.closed.load(), 4) << "each Reset answered after the stop, closed";

  s.service.delay = std::chrono::milliseconds(20000);
  const auto start = std::chrono::steady_clock::now();
  {
    EpisodeRunner runner(Client(s.address(), absl::Seconds(60), registry), eo, metrics.get());
    runner.StartGroup(prompt, /*logprobs=*/false, rng);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace asympo::rollout
