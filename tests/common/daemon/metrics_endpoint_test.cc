#include "common/daemon/metrics_endpoint.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/counter.h>

#include "absl/time/clock.h"
#include "common/daemon/metric_builders.h"
#include "tests/testing/http.h"

namespace asympo::daemon {
namespace {

using ::asympo::testing::ConnectTo;
using ::asympo::testing::HttpBody;
using ::asympo::testing::HttpExchange;
using ::asympo::testing::HttpGet;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::shared_ptr<prometheus::Registry> Registry() {
  auto r = std::make_shared<prometheus::Registry>();
  metrics::AddCounter(*r, "asympo_test_requests_total", "A test counter.").Increment(3);
  return r;
}

std::unique_ptr<MetricsEndpoint> Start(const std::string& address,
                                       const MetricsEndpointOptions& options = {}) {
  auto e = MetricsEndpoint::Start(address, Registry(), options);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : nullptr;
}

bool HaveIpv6Loopback() {
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

TEST(MetricsEndpointTest, ServesTheRegistryInTheTextFormat) {
  auto e = Start("127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  EXPECT_GT(e->port(), 0);
  EXPECT_EQ(e->bound_address(), "127.0.0.1:" + std::to_string(e->port()));
  const std::string r = HttpGet("127.0.0.1", e->port(), "/metrics");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(HttpBody(r), HasSubstr("asympo_test_requests_total 3"));
  // A query string is ignored, as Prometheus servers do.
  EXPECT_THAT(HttpGet("127.0.0.1", e->port(), "/metrics?x=1"), StartsWith("HTTP/1.1 200"));
  // HEAD: the head only.
  const std::string head = HttpExchange("127.0.0.1", e->port(), "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(HttpBody(head), "");
}

TEST(MetricsEndpointTest, AddsTheRunLabelsToEverySeriesAndKeepsTheSeriesOwn) {
  auto r = Registry();
  auto& family = prometheus::BuildCounter().Name("asympo_test_dropped_total").Help("Dropped.")
                     .Register(*r);
  family.Add({{"reason", "full"}}).Increment(2);
  family.Add({{"run", "its-own"}}).Increment(4);
  MetricsEndpointOptions options;
  options.labels = {{"run", "exp-7"}};
  auto e = MetricsEndpoint::Start("127.0.0.1:0", r, options);
  ASSERT_TRUE(e.ok()) << e.status();
  const std::string body = HttpBody(HttpGet("127.0.0.1", (*e)->port(), "/metrics"));
  EXPECT_THAT(body, HasSubstr("asympo_test_requests_total{run=\"exp-7\"} 3"));
  EXPECT_THAT(body, HasSubstr("asympo_test_dropped_total{reason=\"full\",run=\"exp-7\"} 2"));
  EXPECT_THAT(body, HasSubstr("asympo_test_dropped_total{run=\"its-own\"} 4"));
}

TEST(MetricsEndpointTest, OtherPathsGet404AndOnlyTheExactPathIsServed) {
  auto e = Start("127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  for (const char* path : {"/", "/metricsX", "/metrics/", "/metrics/x", "/metric", "/Metrics"}) {
    EXPECT_THAT(HttpGet("127.0.0.1", e->port(), path), StartsWith("HTTP/1.1 404")) << path;
  }
}

TEST(MetricsEndpointTest, MalformedRequestsGet400AndOtherMethods405) {
  auto e = Start("127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  for (const char* req :
       {"garbage\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n", "GET metrics HTTP/1.0\r\n\r\n",
        "GET /metrics SPDY/3\r\n\r\n", "GET  /metrics HTTP/1.0\r\n\r\n"}) {
    EXPECT_THAT(HttpExchange("127.0.0.1", e->port(), req), StartsWith("HTTP/1.1 400")) << req;
  }
  const std::string post = HttpExchange("127.0.0.1", e->port(), "POST /metrics HTTP/1.0\r\n\r\n");
  EXPECT_THAT(post, StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(post, HasSubstr("Allow: GET, HEAD"));
  // A head that never ends is cut off at 8 KiB.
  const std::string huge = "GET /metrics HTTP/1.0\r\nX: " + std::string(20000, 'a');
  EXPECT_THAT(HttpExchange("127.0.0.1", e->port(), huge), StartsWith("HTTP/1.1 431"));
}

TEST(MetricsEndpointTest, BadAddressesAreNamedErrors) {
  for (const char* address : {":0", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:9x",
                              "::1:0", "[::1:0", "[nope]:0"}) {
    auto e = MetricsEndpoint::Start(address, Registry());
    ASSERT_FALSE(e.ok()) << address;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(std::string(e.status().message()), HasSubstr(std::string("\"") + address + "\""));
  }
  EXPECT_FALSE(MetricsEndpoint::Start("127.0.0.1:0", nullptr).ok());
}

TEST(MetricsEndpointTest, APortInUseIsUnavailableNamingTheAddress) {
  auto first = Start("127.0.0.1:0");
  ASSERT_NE(first, nullptr);
  const std::string taken = "127.0.0.1:" + std::to_string(first->port());
  auto second = MetricsEndpoint::Start(taken, Registry());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(taken));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use"));
}

TEST(MetricsEndpointTest, ServesIpv6AndNames) {
  auto by_name = Start("localhost:0");
  ASSERT_NE(by_name, nullptr);
  EXPECT_THAT(HttpGet("127.0.0.1", by_name->port(), "/metrics"), StartsWith("HTTP/1.1 200"));
  if (!HaveIpv6Loopback()) GTEST_SKIP() << "this machine has no IPv6 loopback";
  auto v6 = Start("[::1]:0");
  ASSERT_NE(v6, nullptr);
  EXPECT_EQ(v6->bound_address(), "[::1]:" + std::to_string(v6->port()));
  EXPECT_THAT(HttpGet("::1", v6->port(), "/metrics"), StartsWith("HTTP/1.1 200"));
}

TEST(MetricsEndpointTest, AStalledClientDoesNotHoldUpOthers) {
  MetricsEndpointOptions o;
  o.threads = 2;
  o.request_timeout = absl::Seconds(30);
  auto e = Start("127.0.0.1:0", o);
  ASSERT_NE(e, nullptr);
  // A client connects and never sends its request: it holds one worker for
  // up to 30 s. A scrape is still answered at once by the other.
  const int stalled = ConnectTo("127.0.0.1", e->port());
  ASSERT_GE(stalled, 0);
  const absl::Time t0 = absl::Now();
  EXPECT_THAT(HttpGet("127.0.0.1", e->port(), "/metrics"), StartsWith("HTTP/1.1 200"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  ::close(stalled);
}

TEST(MetricsEndpointTest, AClientThatSendsNothingIsDroppedAfterTheRequestTimeout) {
  MetricsEndpointOptions o;
  o.threads = 1;
  o.request_timeout = absl::Milliseconds(200);
  auto e = Start("127.0.0.1:0", o);
  ASSERT_NE(e, nullptr);
  const int stalled = ConnectTo("127.0.0.1", e->port());
  ASSERT_GE(stalled, 0);
  // With the single worker held by the stalled client, this scrape waits
  // until the request timeout frees it.
  const absl::Time t0 = absl::Now();
  EXPECT_THAT(HttpGet("127.0.0.1", e->port(), "/metrics"), StartsWith("HTTP/1.1 200"));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(150));
  char c;
  EXPECT_EQ(::recv(stalled, &c, 1, 0), 0) << "the stalled client was not closed";
  ::close(stalled);
}

TEST(MetricsEndpointTest, ServesManyConcurrentScrapes) {
  auto e = Start("127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&] {
      for (int j = 0; j < 20; ++j) {
        if (HttpGet("127.0.0.1", e->port(), "/metrics").rfind("HTTP/1.1 200", 0) == 0) ++ok;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 160);
}

TEST(MetricsEndpointTest, ShutsDownPromptlyEvenWithClientsConnected) {
  MetricsEndpointOptions o;
  o.request_timeout = absl::Seconds(60);
  auto e = Start("127.0.0.1:0", o);
  ASSERT_NE(e, nullptr);
  const int port = e->port();
  const int stalled = ConnectTo("127.0.0.1", port);
  ASSERT_GE(stalled, 0);
  const absl::Time t0 = absl::Now();
  e.reset();
  const absl::Duration took = absl::Now() - t0;
  EXPECT_LT(took, absl::Milliseconds(500)) << "shutdown took " << took;
  char c;
  EXPECT_LE(::recv(stalled, &c, 1, 0), 0);
  ::close(stalled);
  EXPECT_LT(ConnectTo("127.0.0.1", port), 0) << "still listening after shutdown";
}

}  // namespace
}  // namespace asympo::daemon
