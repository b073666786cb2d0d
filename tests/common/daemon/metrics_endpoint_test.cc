#include "common/daemon/metrics_endpoint.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/counter.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/daemon/metric_builders.h"
#include "tests/testing/http.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace asympo::daemon {
namespace {

using ::asympo::testing::ConnectTo;
using ::asympo::testing::HttpBody;
using ::asympo::testing::HttpExchange;
using ::asympo::testing::HttpGet;
using ::asympo::testing::StatusIs;
using ::asympo::testing::WaitFor;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Sends `request`, then closes its sending side when `half_close` (a head
// cut short), and returns all the server answers until it closes.
std::string Exchange(int port, const std::string& request, bool half_close) {
  const int fd = ConnectTo("127.0.0.1", port);
  if (fd < 0) return "";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  if (half_close) ::shutdown(fd, SHUT_WR);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  ::close(fd);
  return out;
}

// How long a GET /metrics takes and its status line.
std::pair<absl::Duration, std::string> TimedScrape(int port) {
  const absl::Time t0 = absl::Now();
  const std::string r = HttpGet("127.0.0.1", port, "/metrics");
  return {absl::Now() - t0, r.substr(0, r.find("\r\n"))};
}

// True when the server has answered on `fd` or closed it within `wait`.
bool Readable(int fd, absl::Duration wait) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) == 1;
}

// A slowloris client: connects at once, then sends one byte of a request
// head that never ends every `every` until the server closes the
// connection, the client is destroyed or 10 s have passed.
class Dribbler {
 public:
  Dribbler(int port, absl::Duration every)
      : fd_(ConnectTo("127.0.0.1", port)), connected_(absl::Now()) {
    thread_ = std::thread([this, every] {
      const std::string head = "GET /metrics HTTP/1.1\r\nX-Slow: " + std::string(4000, 'a');
      const absl::Time give_up = connected_ + absl::Seconds(10);
      for (size_t i = 0; i < head.size() && !stop_ && fd_ >= 0 && absl::Now() < give_up; ++i) {
        if (Readable(fd_, every) || ::send(fd_, &head[i], 1, MSG_NOSIGNAL) != 1) {
          closed_after_ = absl::Now() - connected_;
          return;
        }
      }
    });
  }
  ~Dribbler() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  bool connected() const { return fd_ >= 0; }
  // Waits until the server closes the connection (or the client gives up)
  // and says how long after connecting it did (infinite: it did not).
  absl::Duration ClosedAfter() {
    if (thread_.joinable()) thread_.join();
    return closed_after_;
  }

 private:
  const int fd_;
  const absl::Time connected_;
  std::atomic<bool> stop_{false};
  absl::Duration closed_after_ = absl::InfiniteDuration();
  std::thread thread_;
};

std::shared_ptr<prometheus::Registry> Registry() {
  auto r = std::make_shared<prometheus::Registry>();
  metrics::AddCounter(*r, "asympo_test_requests_total", "A test counter.").Increment(3);
  return r;
}

std::unique_ptr<MetricsEndpoint> Start(const std::string& address,
                                       const MetricsEndpointOptions& options = {}) {
  auto e = MetricsEndpoint::Start(address, Registry(), options);
  EXPECT_OK(e);
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
  auto& family =
      prometheus::BuildCounter().Name("asympo_test_dropped_total").Help("Dropped.").Register(*r);
  family.Add({{"reason", "full"}}).Increment(2);
  family.Add({{"run", "its-own"}}).Increment(4);
  MetricsEndpointOptions options;
  options.labels = {{"run", "exp-7"}};
  auto e = MetricsEndpoint::Start("127.0.0.1:0", r, options);
  ASSERT_OK(e);
  const std::string body = HttpBody(HttpGet("127.0.0.1", (*e)->port(), "/metrics"));
  EXPECT_THAT(body, HasSubstr("asympo_test_requests_total{run=\"exp-7\"} 3"));
  EXPECT_THAT(body, HasSubstr("asympo_test_dropped_total{reason=\"full\",run=\"exp-7\"} 2"));
  EXPECT_THAT(body, HasSubstr("asympo_test_dropped_total{run=\"its-own\"} 4"));
}

TEST(MetricsEndpointTest, OtherPathsGet404AndOnlyTheExactPathIsServed) {
  auto e = Start("127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  for (const char* path :
       {"/", "/metricsX", "/metricsfoo", "/metrics/", "/metrics/x", "/metrics/../x", "/metrics%3F",
        "/metrics#x", "/metric", "/Metrics", "//metrics"}) {
    EXPECT_THAT(HttpGet("127.0.0.1", e->port(), path), StartsWith("HTTP/1.1 404")) << path;
  }
  for (const char* path : {"/metrics?x=1", "/metrics?", "/metrics?a=/metrics/x&b"}) {
    EXPECT_THAT(HttpGet("127.0.0.1", e->port(), path), StartsWith("HTTP/1.1 200")) << path;
  }
}

TEST(MetricsEndpointTest, ReadyAnswersTheReadinessCheckAnd404WithoutOne) {
  auto none = Start("127.0.0.1:0");
  ASSERT_NE(none, nullptr);
  EXPECT_THAT(HttpGet("127.0.0.1", none->port(), "/ready"), StartsWith("HTTP/1.1 404"));
  absl::Status state = absl::OkStatus();
  MetricsEndpointOptions options;
  options.ready = [&state] { return state; };
  auto e = MetricsEndpoint::Start("127.0.0.1:0", Registry(), options);
  ASSERT_OK(e);
  const std::string ok = HttpGet("127.0.0.1", (*e)->port(), "/ready");
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(HttpBody(ok), "ready\n");
  state = absl::UnavailableError("the loop is stuck");
  const std::string stuck = HttpGet("127.0.0.1", (*e)->port(), "/ready?x=1");
  EXPECT_THAT(stuck, StartsWith("HTTP/1.1 503"));
  EXPECT_EQ(HttpBody(stuck), "not ready: the loop is stuck\n");
  EXPECT_THAT(HttpGet("127.0.0.1", (*e)->port(), "/readyX"), StartsWith("HTTP/1.1 404"));
}

TEST(MetricsEndpointTest, MalformedRequestsGet400AndOtherMethods405) {
  auto e = Start("127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  for (const char* req :
       {"garbage\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n", "GET metrics HTTP/1.0\r\n\r\n",
        "GET /metrics SPDY/3\r\n\r\n", "GET  /metrics HTTP/1.0\r\n\r\n",
        // Bare LF, anywhere; the request line must end in CRLF.
        "GET /metrics HTTP/1.0\n\n", "GET /metrics HTTP/1.0\n\r\n",
        "GET /metrics HTTP/1.0\r\nHost: x\nX: y\r\n\r\n",
        // The version is HTTP/1.<digit>, nothing after it.
        "GET /metrics HTTP/1.\r\n\r\n", "GET /metrics HTTP/1.1x\r\n\r\n",
        "GET /metrics HTTP/2.0\r\n\r\n", "GET /metrics http/1.1\r\n\r\n",
        "GET /metrics HTTP/1.0 \r\n\r\n", "GET\t/metrics HTTP/1.0\r\n\r\n",
        "GET /metrics\tHTTP/1.0\r\n\r\n", "GET /met\x01rics HTTP/1.0\r\n\r\n",
        "G(T /metrics HTTP/1.0\r\n\r\n", "\r\nGET /metrics HTTP/1.0\r\n\r\n",
        "GET http://x/metrics HTTP/1.1\r\n\r\n"}) {
    EXPECT_THAT(HttpExchange("127.0.0.1", e->port(), req), StartsWith("HTTP/1.1 400")) << req;
  }
  const std::string post = HttpExchange("127.0.0.1", e->port(), "POST /metrics HTTP/1.0\r\n\r\n");
  EXPECT_THAT(post, StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(post, HasSubstr("Allow: GET, HEAD"));
  // A head that never ends is cut off at 8 KiB.
  const std::string huge = "GET /metrics HTTP/1.0\r\nX: " + std::string(20000, 'a');
  EXPECT_THAT(HttpExchange("127.0.0.1", e->port(), huge), StartsWith("HTTP/1.1 431"));
}

TEST(MetricsEndpointTest, AHeadCutShortByTheClientGets400) {
  auto e = Start("127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  for (const char* req : {"GET /metrics HTTP/1.0", "GET /metrics HTTP/1.0\r\n",
                          "GET /metrics HTTP/1.0\r\nHost: x\r\n", "GET /metrics HTTP/1.0\r\n\r"}) {
    EXPECT_THAT(Exchange(e->port(), req, /*half_close=*/true), StartsWith("HTTP/1.1 400"))
        << absl::CEscape(req);
  }
}

TEST(MetricsEndpointTest, TheRequestHeadMayHaveEightKiBAndNotOneByteMore) {
  auto e = Start("127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  const auto head_of = [](size_t size) {
    const std::string start = "GET /metrics HTTP/1.0\r\nX: ";
    return start + std::string(size - start.size() - 4, 'a') + "\r\n\r\n";
  };
  ASSERT_EQ(head_of(8192).size(), 8192u);
  EXPECT_THAT(HttpExchange("127.0.0.1", e->port(), head_of(8192)), StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(HttpExchange("127.0.0.1", e->port(), head_of(8193)), StartsWith("HTTP/1.1 431"));
  // The same when the bytes come in small pieces, and without any CRLF.
  for (const std::string& head : {head_of(8193), std::string(9000, 'G')}) {
    const int fd = ConnectTo("127.0.0.1", e->port());
    ASSERT_GE(fd, 0);
    for (size_t at = 0; at < head.size(); at += 100) {
      if (::send(fd, head.data() + at, std::min<size_t>(100, head.size() - at), MSG_NOSIGNAL) <= 0)
        break;
    }
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
    ::close(fd);
    EXPECT_THAT(out, StartsWith("HTTP/1.1 431")) << head.substr(0, 30);
  }
}

TEST(MetricsEndpointTest, AnswersToHeadHaveNoBody) {
  auto e = Start("127.0.0.1:0");
  ASSERT_NE(e, nullptr);
  const std::string get = HttpGet("127.0.0.1", e->port(), "/metrics");
  const std::string head = HttpExchange("127.0.0.1", e->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(head, HasSubstr(absl::StrCat("Content-Length: ", HttpBody(get).size(), "\r\n")));
  EXPECT_EQ(HttpBody(head), "");
  for (const char* path : {"/", "/metricsX"}) {
    const std::string r =
        HttpExchange("127.0.0.1", e->port(), absl::StrCat("HEAD ", path, " HTTP/1.0\r\n\r\n"));
    EXPECT_THAT(r, StartsWith("HTTP/1.1 404")) << path;
    EXPECT_THAT(r, HasSubstr("\r\n\r\n")) << path;
    EXPECT_EQ(HttpBody(r), "") << path;
  }
}

TEST(MetricsEndpointTest, BadAddressesAreNamedErrors) {
  for (const char* address : {":0", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:9x",
                              "::1:0", "[::1:0", "[nope]:0"}) {
    auto e = MetricsEndpoint::Start(address, Registry());
    ASSERT_THAT(e, StatusIs(absl::StatusCode::kInvalidArgument, std::string("\"") + address + "\""))
        << address;
  }
  EXPECT_THAT(MetricsEndpoint::Start("127.0.0.1:0", nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "without a registry"));
}

TEST(MetricsEndpointTest, APortInUseIsUnavailableNamingTheAddress) {
  auto first = Start("127.0.0.1:0");
  ASSERT_NE(first, nullptr);
  const std::string taken = "127.0.0.1:" + std::to_string(first->port());
  auto second = MetricsEndpoint::Start(taken, Registry());
  ASSERT_THAT(second, StatusIs(absl::StatusCode::kUnavailable, taken));
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

TEST(MetricsEndpointTest, AClientThatSendsNothingIsDroppedAfterTheRequestTimeout) {
  MetricsEndpointOptions o;
  o.threads = 1;
  o.request_timeout = absl::Milliseconds(300);
  auto e = Start("127.0.0.1:0", o);
  ASSERT_NE(e, nullptr);
  const absl::Time t0 = absl::Now();
  const int stalled = ConnectTo("127.0.0.1", e->port());
  ASSERT_GE(stalled, 0);
  // A scrape is answered at once, even with a single worker: the client
  // that sends nothing holds none.
  const auto [took, status] = TimedScrape(e->port());
  EXPECT_EQ(status, "HTTP/1.1 200 OK");
  EXPECT_LT(took, absl::Milliseconds(250));
  ASSERT_TRUE(Readable(stalled, absl::Seconds(5)));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(250));
  char c;
  EXPECT_EQ(::recv(stalled, &c, 1, 0), 0) << "the stalled client was answered";
  ::close(stalled);
}

TEST(MetricsEndpointTest, SlowlorisClientsDoNotHoldUpScrapes) {
  MetricsEndpointOptions o;
  o.threads = 2;
  o.request_timeout = absl::Seconds(3);
  auto e = Start("127.0.0.1:0", o);
  ASSERT_NE(e, nullptr);
  // More slow clients than workers, all connected before the scrapes.
  std::vector<std::unique_ptr<Dribbler>> slow;
  for (int i = 0; i < 6; ++i) {
    slow.push_back(std::make_unique<Dribbler>(e->port(), absl::Milliseconds(100)));
    ASSERT_TRUE(slow.back()->connected());
  }
  for (int i = 0; i < 5; ++i) {
    const auto [took, status] = TimedScrape(e->port());
    EXPECT_EQ(status, "HTTP/1.1 200 OK") << "scrape " << i;
    EXPECT_LT(took, absl::Seconds(1)) << "scrape " << i;
  }
}

TEST(MetricsEndpointTest, AClientHasOneDeadlineForItsWholeHeadCountedFromAccept) {
  MetricsEndpointOptions o;
  o.threads = 1;
  o.request_timeout = absl::Seconds(1);
  auto e = Start("127.0.0.1:0", o);
  ASSERT_NE(e, nullptr);
  // Bytes that keep coming do not extend the deadline, and a client that
  // connects while another one is being read gets no more time either.
  Dribbler first(e->port(), absl::Milliseconds(50));
  Dribbler second(e->port(), absl::Milliseconds(50));
  for (Dribbler* d : {&first, &second}) {
    const absl::Duration closed_after = d->ClosedAfter();
    EXPECT_GE(closed_after, absl::Milliseconds(900));
    EXPECT_LT(closed_after, absl::Milliseconds(1600));
  }
}

TEST(MetricsEndpointTest, ClientsThatDoNotReadTheAnswerDoNotHoldUpScrapes) {
  // An answer much larger than what the kernel buffers for a client that
  // does not read (tcp_wmem allows at most 4 MiB).
  auto r = Registry();
  auto& family = prometheus::BuildGauge().Name("asympo_test_wide").Help("Wide.").Register(*r);
  for (int i = 0; i < 25000; ++i) family.Add({{"i", absl::StrCat(i, std::string(250, 'x'))}});
  MetricsEndpointOptions o;
  o.threads = 2;
  o.send_timeout = absl::Seconds(5);
  auto e = MetricsEndpoint::Start("127.0.0.1:0", r, o);
  ASSERT_OK(e);
  std::vector<int> readers;
  for (int i = 0; i < o.threads; ++i) {
    readers.push_back(ConnectTo("127.0.0.1", (*e)->port()));
    ASSERT_GE(readers.back(), 0);
    const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
    ASSERT_EQ(::send(readers.back(), req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  }
  // The first bytes of the answers reach every reader: each is being
  // answered, and none reads on.
  for (int fd : readers) ASSERT_TRUE(Readable(fd, absl::Seconds(5)));
  // Held up, a scrape would wait for a reader's 5 s send timeout; serving
  // the 6.5 MB answer itself takes up to about 1.4 s under ThreadSanitizer
  // on a busy 2-core machine.
  for (int i = 0; i < 3; ++i) {
    const auto [took, status] = TimedScrape((*e)->port());
    EXPECT_EQ(status, "HTTP/1.1 200 OK") << "scrape " << i;
    EXPECT_LT(took, absl::Seconds(3)) << "scrape " << i;
  }
  for (int fd : readers) ::close(fd);
}

TEST(MetricsEndpointTest, IdleConnectionsAreBoundedAndTheOldestMakeRoom) {
  MetricsEndpointOptions o;
  o.max_connections = 50;
  o.request_timeout = absl::Seconds(30);
  auto e = Start("127.0.0.1:0", o);
  ASSERT_NE(e, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    idle.push_back(ConnectTo("127.0.0.1", e->port()));
    ASSERT_GE(idle.back(), 0) << i;
  }
  const auto [took, status] = TimedScrape(e->port());
  EXPECT_EQ(status, "HTTP/1.1 200 OK");
  EXPECT_LT(took, absl::Seconds(1));
  // The scrape was accepted after all of them: by then the server held at
  // most 50 connections, so at least 251 of the idle ones were closed,
  // the oldest first.
  const auto closed = [&] {
    return std::count_if(idle.begin(), idle.end(),
                         [](int fd) { return Readable(fd, absl::ZeroDuration()); });
  };
  EXPECT_TRUE(WaitFor([&] { return closed() >= 251; }, absl::Seconds(5))) << closed();
  EXPECT_TRUE(Readable(idle.front(), absl::ZeroDuration()));
  EXPECT_FALSE(Readable(idle.back(), absl::ZeroDuration()));
  for (int fd : idle) ::close(fd);
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
  Dribbler slow(port, absl::Milliseconds(20));
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
