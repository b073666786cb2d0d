#include "common/listener/grpc_listener.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "asympo/v1/learner.grpc.pb.h"
#include "tests/testing/log_lines.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace asympo {
namespace {

using ::asympo::testing::LineCounter;
using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kVersion = 7;

// The Learner service's GetStatus alone, answering a fixed version.
class StatusOnly final : public v1::Learner::Service {
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::LearnerStatus* reply) override {
    reply->set_version(kVersion);
    return grpc::Status::OK;
  }
};

// A server whose only way in is a GrpcListener on `address`.
struct Served {
  explicit Served(const std::string& address, GrpcListenerOptions options = {}) {
    grpc::ServerBuilder builder;
    auto bound = GrpcListener::Bind(address, grpc::InsecureServerCredentials(), &builder, options);
    if (!bound.ok()) {
      ADD_FAILURE() << bound.status();
      return;
    }
    listener = *std::move(bound);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    if (server == nullptr) {
      ADD_FAILURE() << "BuildAndStart failed";
      return;
    }
    listener->Start();
  }
  ~Served() {
    listener.reset();  // before the server shuts down (grpc_listener.h)
    if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  StatusOnly service;
  std::unique_ptr<GrpcListener> listener;
  std::unique_ptr<grpc::Server> server;
};

// One GetStatus on a connection of its own (gRPC would otherwise share one
// between channels to the same address).
grpc::Status CallStatus(const std::string& target, uint64_t* version = nullptr,
                        absl::Duration timeout = absl::Seconds(2)) {
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  auto stub = v1::Learner::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  v1::LearnerStatus reply;
  const grpc::Status s = stub->GetStatus(&context, v1::GetStatusRequest(), &reply);
  if (version != nullptr) *version = reply.version();
  return s;
}

// An idle TCP connection to 127.0.0.1:port (the kernel completes it from
// the listen backlog, accepted or not); -1 on failure.
int ConnectIdle(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` (end of file or reset) within `timeout`.
// gRPC's peer string of the client end `fd`, as the server sees it.
std::string PeerString(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return "ipv4:127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

bool ClosedByPeer(int fd, absl::Duration timeout) {
  // What gRPC sent first (its SETTINGS) is read past.
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
}

TEST(GrpcListenerTest, ServesCallsOnAPickedPort) {
  Served s("127.0.0.1:0");
  ASSERT_NE(s.listener, nullptr);
  EXPECT_GT(s.listener->port(), 0);
  EXPECT_EQ(s.listener->bound_address(), "127.0.0.1:" + std::to_string(s.listener->port()));
  uint64_t version = 0;
  const grpc::Status status = CallStatus(s.listener->bound_address(), &version);
  ASSERT_OK(status);
  EXPECT_EQ(version, kVersion);
  EXPECT_EQ(s.listener->stats().accepted, 1);
}

TEST(GrpcListenerTest, ServesANameOnEachOfItsAddresses) {
  Served s("localhost:0");
  ASSERT_NE(s.listener, nullptr);
  const std::string port = std::to_string(s.listener->port());
  EXPECT_OK(CallStatus("127.0.0.1:" + port));
  EXPECT_OK(CallStatus("localhost:" + port));
}

TEST(GrpcListenerTest, ServesBracketedIpv6) {
  const int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 loopback{};
  loopback.sin6_family = AF_INET6;
  loopback.sin6_addr = in6addr_loopback;
  const bool ipv6 =
      probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&loopback), sizeof(loopback)) == 0;
  if (probe >= 0) ::close(probe);
  if (!ipv6) GTEST_SKIP() << "no IPv6 loopback here";
  Served s("[::1]:0");
  ASSERT_NE(s.listener, nullptr);
  EXPECT_EQ(s.listener->bound_address(), "[::1]:" + std::to_string(s.listener->port()));
  EXPECT_OK(CallStatus(s.listener->bound_address()));
}

TEST(GrpcListenerTest, ASecondBindOnThePortFailsNamingTheAddress) {
  Served first("127.0.0.1:0");
  ASSERT_NE(first.listener, nullptr);
  const std::string address = first.listener->bound_address();
  grpc::ServerBuilder builder;
  auto second = GrpcListener::Bind(address, grpc::InsecureServerCredentials(), &builder);
  ASSERT_THAT(second, StatusIs(absl::StatusCode::kUnavailable, "cannot listen on " + address));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use"));
  EXPECT_OK(CallStatus(address)) << "the first still serves";
}

TEST(GrpcListenerTest, RejectsMalformedAddresses) {
  for (const std::string address :
       {"127.0.0.1", "127.0.0.1:65536", "::1:80", "[::1:80", ":80", "[nothost]:80"}) {
    grpc::ServerBuilder builder;
    auto bound = GrpcListener::Bind(address, grpc::InsecureServerCredentials(), &builder);
    ASSERT_THAT(bound, StatusIs(absl::StatusCode::kInvalidArgument, "\"" + address + "\""))
        << address;
  }
}

TEST(GrpcListenerTest, DefaultLimitLeavesDescriptorsToTheRestOfTheProcess) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 8192) {
    GTEST_SKIP() << "hard RLIMIT_NOFILE below 8192";
  }
  const auto with_soft = [&](rlim_t soft) {
    rlimit r = saved;
    r.rlim_cur = soft;
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &r), 0);
    const int n = DefaultMaxConnections();
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
    return n;
  };
  EXPECT_EQ(with_soft(1024), 1024 - kDescriptorsReservedFromConnections);
  EXPECT_EQ(with_soft(8192), kMaxConnectionsCap);
  EXPECT_EQ(with_soft(100), 16);
}

TEST(GrpcListenerTest, ConnectionsBeyondTheLimitAreClosedAtOnce) {
  GrpcListenerOptions options;
  options.max_connections = 2;
  std::atomic<int> accepted_events{0}, refused_events{0}, other_events{0};
  options.on_event = [&](GrpcListenerEvent e) {
    (e == GrpcListenerEvent::kAccepted         ? accepted_events
     : e == GrpcListenerEvent::kRefusedAtLimit ? refused_events
                                               : other_events)++;
  };
  Served s("127.0.0.1:0", options);
  ASSERT_NE(s.listener, nullptr);
  const int port = s.listener->port();
  const int a = ConnectIdle(port), b = ConnectIdle(port);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_TRUE(testing::WaitFor([&] { return s.listener->stats().accepted == 2; }));
  // Both made an authorized call: neither gives its place to a newcomer.
  s.listener->authorized_hook()(PeerString(a));
  s.listener->authorized_hook()(PeerString(b));
  const int c = ConnectIdle(port);
  ASSERT_GE(c, 0);
  EXPECT_TRUE(ClosedByPeer(c, absl::Seconds(2))) << "the third is closed, not left hanging";
  EXPECT_EQ(s.listener->stats().refused_at_limit, 1);
  // Each counted as it happened, for the daemon's metrics.
  EXPECT_EQ(accepted_events.load(), 2);
  EXPECT_EQ(refused_events.load(), 1);
  EXPECT_EQ(other_events.load(), 0);
  EXPECT_FALSE(ClosedByPeer(a, absl::Milliseconds(100))) << "the first two stay open";
  ::close(c);
  // gRPC closes its end of `a` once it sees the client's end of file; the
  // listener then finds a place free again.
  ::close(a);
  EXPECT_TRUE(testing::WaitFor([&] { return CallStatus("127.0.0.1:" + std::to_string(port)).ok(); },
                               absl::Seconds(5)));
  ::close(b);
}

TEST(GrpcListenerTest, ANewcomerTakesThePlaceOfTheOldestUnauthorizedConnection) {
  GrpcListenerOptions options;
  options.max_connections = 2;
  Served s("127.0.0.1:0", options);
  ASSERT_NE(s.listener, nullptr);
  const int port = s.listener->port();
  const int a = ConnectIdle(port);
  ASSERT_TRUE(testing::WaitFor([&] { return s.listener->stats().accepted == 1; }));
  const int b = ConnectIdle(port);
  ASSERT_TRUE(testing::WaitFor([&] { return s.listener->stats().accepted == 2; }));
  s.listener->authorized_hook()(PeerString(b));
  const int c = ConnectIdle(port);
  EXPECT_TRUE(ClosedByPeer(a, absl::Seconds(2))) << "the oldest that never authorized goes";
  EXPECT_FALSE(ClosedByPeer(b, absl::Milliseconds(100)));
  EXPECT_FALSE(ClosedByPeer(c, absl::Milliseconds(100)));
  EXPECT_EQ(s.listener->stats().closed_unauthenticated, 1);
  EXPECT_EQ(s.listener->stats().refused_at_limit, 0);
  for (const int fd : {a, b, c}) ::close(fd);
}

TEST(GrpcListenerTest, LimitsConnectionsPerPeerAddress) {
  GrpcListenerOptions options;
  options.max_connections = 8;
  options.max_connections_per_peer = 1;
  Served s("127.0.0.1:0", options);
  ASSERT_NE(s.listener, nullptr);
  EXPECT_EQ(s.listener->max_connections_per_peer(), 1);
  const int a = ConnectIdle(s.listener->port());
  ASSERT_TRUE(testing::WaitFor([&] { return s.listener->stats().accepted == 1; }));
  s.listener->authorized_hook()(PeerString(a));
  const int b = ConnectIdle(s.listener->port());
  EXPECT_TRUE(ClosedByPeer(b, absl::Seconds(2)));
  EXPECT_EQ(s.listener->stats().refused_at_peer_limit, 1);
  EXPECT_FALSE(ClosedByPeer(a, absl::Milliseconds(100)));
  ::close(a);
  ::close(b);
}

TEST(GrpcListenerTest, ClosesConnectionsWithoutAnAuthorizedCallAfterTheGrace) {
  GrpcListenerOptions options;
  options.unauthenticated_grace = absl::Milliseconds(300);
  Served s("127.0.0.1:0", options);
  ASSERT_NE(s.listener, nullptr);
  const int idle = ConnectIdle(s.listener->port());
  const int known = ConnectIdle(s.listener->port());
  ASSERT_TRUE(testing::WaitFor([&] { return s.listener->stats().accepted == 2; }));
  s.listener->authorized_hook()(PeerString(known));
  EXPECT_TRUE(ClosedByPeer(idle, absl::Seconds(3)));
  EXPECT_FALSE(ClosedByPeer(known, absl::Milliseconds(500)));
  EXPECT_EQ(s.listener->stats().closed_unauthenticated, 1);
  ::close(idle);
  ::close(known);
}

TEST(GrpcListenerTest, DestructorIsPrompt) {
  Served s("127.0.0.1:0");
  ASSERT_NE(s.listener, nullptr);
  ASSERT_OK(CallStatus(s.listener->bound_address()));
  const int idle = ConnectIdle(s.listener->port());
  const absl::Time t0 = absl::Now();
  s.listener.reset();
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(500));
  if (idle >= 0) ::close(idle);
}

// The highest descriptor number open in this process.
int HighestOpenDescriptor() {
  int highest = 2;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 1024;
  while (const dirent* e = ::readdir(dir)) highest = std::max(highest, std::atoi(e->d_name));
  ::closedir(dir);
  return highest;
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// Fills every free descriptor, releases `keep_free` of them again, and
// makes that many idle connections: the process is then out of
// descriptors with connections pending at the listener, which must close
// them at once.
void ExhaustAndConnect(int port, int connections, std::vector<int>* hog) {
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) hog->push_back(fd);
  if (errno != EMFILE || hog->size() < static_cast<size_t>(connections)) Fail("fill descriptors");
  // One descriptor freed for each client; a thread of gRPC's may take a
  // freed one first (the process is out of them), so free another then.
  std::vector<int> clients;
  for (int i = 0; i < connections; ++i) {
    int fd = -1;
    while (fd < 0 && !hog->empty()) {
      ::close(hog->back());
      hog->pop_back();
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0 && errno != EMFILE) Fail("socket while out of descriptors");
    }
    clients.push_back(fd);
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (const int fd : clients) {
    if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      Fail(std::string(fd < 0 ? "no socket" : "connect") + " while out of descriptors: " +
           std::strerror(errno));
    }
  }
  for (const int fd : clients) {
    if (!ClosedByPeer(fd, absl::Seconds(2))) Fail("a client was left hanging");
    ::close(fd);  // into the hog's place again: still out of descriptors
    const int again = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (again >= 0) hog->push_back(again);
  }
}

// Runs in a child process (a death test): lowers RLIMIT_NOFILE to a little
// above what is open, runs out of descriptors five times with connections
// pending, then frees them and expects a new client to be served. Exits 0
// on success, 1 naming the failed step.
[[noreturn]] void RunOutOfDescriptorsAndRecover() {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = static_cast<rlim_t>(HighestOpenDescriptor() + 96);
  if (::setrlimit(RLIMIT_NOFILE, &r) != 0) Fail("setrlimit");
  LineCounter logged("out of file descriptors");
  GrpcListenerOptions options;
  options.max_connections = 100000;  // the descriptors run out first
  std::atomic<int64_t> exhaustion_events{0}, shed_events{0};
  options.on_event = [&](GrpcListenerEvent e) {
    if (e == GrpcListenerEvent::kDescriptorExhaustion) ++exhaustion_events;
    if (e == GrpcListenerEvent::kRefusedWithoutDescriptors) ++shed_events;
  };
  Served s("127.0.0.1:0", options);
  if (s.listener == nullptr || s.server == nullptr) Fail("start the server");
  const std::string target = s.listener->bound_address();
  // Kept open to the end: a connection closing while the descriptors are
  // all taken would free one, and a pending connection would be served.
  auto first =
      v1::Learner::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::LearnerStatus reply;
  if (!first->GetStatus(&context, v1::GetStatusRequest(), &reply).ok()) Fail("first call");
  // Each round takes every descriptor the moment the last one ends: the
  // listener must have kept its reserve's slot through the round.
  constexpr int kRounds = 5, kConnections = 8;
  std::vector<int> hog;
  for (int round = 0; round < kRounds; ++round) {
    ExhaustAndConnect(s.listener->port(), kConnections, &hog);
  }
  // A round's connections can arrive while the listener is still shedding
  // the last round's, in the same exhaustion: at least one, then.
  const GrpcListenerStats stats = s.listener->stats();
  if (stats.descriptor_exhaustions < 1 ||
      stats.refused_without_descriptors != kRounds * kConnections) {
    Fail("counted " + std::to_string(stats.descriptor_exhaustions) + " exhaustions, " +
         std::to_string(stats.refused_without_descriptors) + " refused, expected >= 1 and " +
         std::to_string(kRounds * kConnections));
  }
  if (exhaustion_events != stats.descriptor_exhaustions ||
      shed_events != stats.refused_without_descriptors) {
    Fail("the events disagree with stats(): " + std::to_string(exhaustion_events) +
         " exhaustions, " + std::to_string(shed_events) + " refused");
  }
  if (logged.count() != 1) Fail("logged " + std::to_string(logged.count()) + " times, not once");
  for (const int fd : hog) ::close(fd);
  const absl::Time freed = absl::Now();
  if (!testing::WaitFor([&] { return CallStatus(target).ok(); }, absl::Seconds(2))) {
    Fail("no call served within 2 s of freeing the descriptors");
  }
  std::fprintf(stderr, "recovered: a call served %.2f s after the descriptors were freed\n",
               absl::ToDoubleSeconds(absl::Now() - freed));
  std::fflush(stderr);
  std::_Exit(0);
}

TEST(GrpcListenerDeathTest, KeepsAcceptingAfterRunningOutOfDescriptors) {
  // A fresh process (the test binary run again), so that neither this
  // process's descriptors nor its gRPC threads are in the way.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RunOutOfDescriptorsAndRecover(), ::testing::ExitedWithCode(0), "recovered");
}

}  // namespace
}  // namespace asympo
