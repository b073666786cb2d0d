// The learner daemon end to end in one process: a real gRPC server on a
// loopback port, a real client, the trainer loop, checkpoints, a restart,
// and a real HTTP scrape of /metrics (checked with promtool when present).
#include "learner_server/learner_daemon.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "learner_server/checkpoint.h"
#include "tests/testing/temp_dir.h"

namespace asympo::learner {
namespace {

using ::testing::HasSubstr;

std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  ::send(fd, req.data(), req.size(), 0);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

v1::RolloutBatch Batch(int groups, int seed) {
  v1::RolloutBatch b;
  for (int g = 0; g < groups; ++g) {
    v1::PromptGroup* pg = b.add_groups();
    pg->set_prompt_id("q" + std::to_string(seed) + "_" + std::to_string(g));
    for (int t = 0; t < 4; ++t) pg->add_prompt_tokens(1 + (seed + g + t) % 60);
    for (int r = 0; r < 4; ++r) {
      v1::Response* resp = pg->add_responses();
      for (int t = 0; t < 3 + r; ++t) resp->add_tokens(2 + (seed * 7 + g + r + t) % 60);
      resp->set_reward(r == (seed + g) % 4 ? 1.0f : 0.0f);
    }
  }
  return b;
}

LearnerDaemonOptions Options(const std::string& ckpt, int64_t max_steps) {
  LearnerDaemonOptions o;
  o.listen_address = "127.0.0.1:0";
  o.metrics_address = "127.0.0.1:0";
  o.prompts_per_step = 2;
  o.queue.capacity_groups = 8;
  o.limits.max_groups_per_batch = 8;
  o.trainer.lr.peak_lr = 1e-3;
  o.checkpoint_dir = ckpt;
  o.checkpoint_every = 2;
  o.max_steps = max_steps;
  o.collapse.warmup_steps = 1;
  return o;
}

// Submits batches until the daemon stops accepting them.
void Feed(int port, std::atomic<bool>* stop) {
  auto stub = v1::Learner::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  for (int i = 0; !stop->load(); ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::SubmitResponse r;
    if (!stub->Submit(&ctx, Batch(2, i), &r).ok()) absl::SleepFor(absl::Milliseconds(20));
  }
}

TEST(LearnerDaemonTest, TrainsCheckpointsServesMetricsAndResumesAfterRestart) {
  asympo::testing::ScopedTempDir tmp("learner_daemon_test");
  const std::string ckpt = tmp.Path("ckpt");
  uint64_t version_after_first_run = 0;
  {
    auto daemon = LearnerDaemon::Create(Options(ckpt, 4));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    const int metrics_port = (*daemon)->metrics_port();
    ASSERT_GT(metrics_port, 0);
    std::atomic<bool> stop{false};
    std::thread feeder(Feed, (*daemon)->port(), &stop);
    std::string scrape;
    std::thread scraper([&] {
      // Scrape while the daemon runs, once it has trained at least a step.
      for (int i = 0; i < 400; ++i) {
        absl::SleepFor(absl::Milliseconds(25));
        scrape = HttpGet(metrics_port, "/metrics");
        if (scrape.find("asympo_learner_steps_total ") != std::string::npos &&
            scrape.find("asympo_learner_steps_total 0\n") == std::string::npos) {
          break;
        }
      }
    });
    const auto steps = (*daemon)->Run();
    scraper.join();
    stop = true;
    feeder.join();
    ASSERT_TRUE(steps.ok()) << steps.status();
    EXPECT_EQ(*steps, 4);
    version_after_first_run = (*daemon)->version();
    EXPECT_EQ(version_after_first_run, 4u);
    for (const char* name :
         {"asympo_learner_version", "asympo_learner_steps_total", "asympo_learner_reward_mean",
          "asympo_learner_reward_ema", "asympo_learner_loss", "asympo_learner_scale_positive",
          "asympo_learner_scale_negative", "asympo_learner_naive_ratio", "asympo_learner_imbalance",
          "asympo_learner_clip_fraction{bound=\"low\"}", "asympo_learner_grad_norm",
          "asympo_learner_learning_rate", "asympo_learner_tokens_per_second",
          "asympo_learner_queue_depth_groups", "asympo_learner_queue_capacity_groups",
          "asympo_learner_staleness_versions_bucket",
          "asympo_learner_batches_total{result=\"accepted\"}",
          "asympo_learner_step_duration_seconds_bucket", "asympo_learner_collapse_suspected"}) {
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
  auto again = LearnerDaemon::Create(Options(ckpt, 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->version(), version_after_first_run);
  (*again)->Shutdown();
  const auto steps = (*again)->Run();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, 0);
}

TEST(LearnerDaemonTest, RejectsIncoherentOptionsByName) {
  LearnerDaemonOptions o = Options("", 1);
  o.prompts_per_step = 10;  // above the queue capacity of 8
  EXPECT_THAT(std::string(LearnerDaemon::Create(o).status().message()),
              HasSubstr("queue capacity 8 is below prompts_per_step 10"));
  o = Options("", 1);
  o.model = "/nonexistent/model";
  EXPECT_THAT(std::string(LearnerDaemon::Create(o).status().message()),
              HasSubstr("/nonexistent/model"));
}

}  // namespace
}  // namespace asympo::learner
