// ConnectionTable (per-peer limits, eviction of connections that never
// authorized, the grace) and KeyedLimit (places per key and in all).
#include "common/listener/connection_table.h"

#include <gtest/gtest.h>

#include "common/keyed_limit.h"

namespace asympo {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

std::string Peer(const std::string& ip, int port) {
  return "ipv4:" + ip + ":" + std::to_string(port);
}

ConnectionTable::Admission Admit(ConnectionTable& t, int fd, const std::string& ip,
                                 absl::Time at = kT0) {
  return t.Admit(fd, 100 + fd, Peer(ip, 40000 + fd), ip, at);
}

TEST(ConnectionTableTest, LimitsOnePeerAddressButNotOthers) {
  ConnectionTable t({/*max_connections=*/10, /*max_per_peer=*/2, absl::InfiniteDuration()});
  EXPECT_EQ(Admit(t, 1, "10.0.0.1").verdict, ConnectionTable::Verdict::kAdmitted);
  EXPECT_EQ(Admit(t, 2, "10.0.0.1").verdict, ConnectionTable::Verdict::kAdmitted);
  t.MarkAuthorized(Peer("10.0.0.1", 40001));
  t.MarkAuthorized(Peer("10.0.0.1", 40002));
  EXPECT_EQ(Admit(t, 3, "10.0.0.1").verdict, ConnectionTable::Verdict::kRefusedAtPeerLimit);
  EXPECT_EQ(Admit(t, 4, "10.0.0.2").verdict, ConnectionTable::Verdict::kAdmitted);
  EXPECT_EQ(t.open_from("10.0.0.1"), 2);
  EXPECT_EQ(t.open(), 3);
}

TEST(ConnectionTableTest, ANewConnectionTakesTheOldestUnauthorizedPlace) {
  ConnectionTable t({/*max_connections=*/3, /*max_per_peer=*/3, absl::InfiniteDuration()});
  Admit(t, 1, "10.0.0.9");
  Admit(t, 2, "10.0.0.9");
  Admit(t, 3, "10.0.0.9");
  t.MarkAuthorized(Peer("10.0.0.9", 40001));  // fd 1 authorized: never evicted
  ConnectionTable::Admission a = Admit(t, 4, "10.0.0.8");
  EXPECT_EQ(a.verdict, ConnectionTable::Verdict::kAdmitted);
  ASSERT_EQ(a.evicted.size(), 1u);
  EXPECT_EQ(a.evicted[0].fd, 2);  // the oldest that never authorized
  EXPECT_EQ(a.evicted[0].inode, 102u);
  t.MarkAuthorized(Peer("10.0.0.9", 40003));
  t.MarkAuthorized(Peer("10.0.0.8", 40004));
  // Everyone authorized: a fourth is refused, nobody evicted.
  a = Admit(t, 5, "10.0.0.7");
  EXPECT_EQ(a.verdict, ConnectionTable::Verdict::kRefusedAtLimit);
  EXPECT_TRUE(a.evicted.empty());
}

TEST(ConnectionTableTest, APeerAtItsLimitEvictsOnlyItsOwn) {
  ConnectionTable t({/*max_connections=*/10, /*max_per_peer=*/2, absl::InfiniteDuration()});
  Admit(t, 1, "10.0.0.2");  // another address's, unauthorized and older
  Admit(t, 2, "10.0.0.1");
  Admit(t, 3, "10.0.0.1");
  ConnectionTable::Admission a = Admit(t, 4, "10.0.0.1");
  EXPECT_EQ(a.verdict, ConnectionTable::Verdict::kAdmitted);
  ASSERT_EQ(a.evicted.size(), 1u);
  EXPECT_EQ(a.evicted[0].fd, 2);
  EXPECT_EQ(t.open_from("10.0.0.2"), 1);
}

TEST(ConnectionTableTest, ConnectionsWithoutAnAuthorizedCallExpireAfterTheGrace) {
  ConnectionTable t({/*max_connections=*/10, /*max_per_peer=*/10, absl::Seconds(5)});
  Admit(t, 1, "10.0.0.1", kT0);
  Admit(t, 2, "10.0.0.1", kT0 + absl::Seconds(1));
  Admit(t, 3, "10.0.0.1", kT0 + absl::Seconds(2));
  t.MarkAuthorized(Peer("10.0.0.1", 40001));
  EXPECT_TRUE(t.Expired(kT0 + absl::Seconds(4)).empty());
  const std::vector<ConnectionRef> gone = t.Expired(kT0 + absl::Seconds(6));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].fd, 2);
  EXPECT_EQ(t.open(), 2);
  EXPECT_EQ(t.Expired(kT0 + absl::Seconds(600)).size(), 1u);  // fd 3; fd 1 stays
  EXPECT_EQ(t.open(), 1);
}

// A connection still being sent its first request (a large message on a
// busy link: authorized only once whole) is not idle: each grace in which
// it received at least min_progress_bytes starts another; one that stops
// receiving expires a grace later.
TEST(ConnectionTableTest, AConnectionStillReceivingItsFirstRequestGetsAnotherGrace) {
  ConnectionTable t({/*max_connections=*/10, /*max_per_peer=*/10, absl::Seconds(5), 1000});
  Admit(t, 1, "10.0.0.1", kT0);  // receiving
  Admit(t, 2, "10.0.0.1", kT0);  // a trickle: less than 1000 bytes a grace
  uint64_t bytes[3] = {0, 0, 0};
  const auto received = [&](int fd) { return bytes[fd]; };
  bytes[1] = 5000, bytes[2] = 999;
  std::vector<ConnectionRef> gone = t.Expired(kT0 + absl::Seconds(6), received);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].fd, 2);
  bytes[1] = 5999;  // less than 1000 more: idle now
  EXPECT_TRUE(t.Expired(kT0 + absl::Seconds(10), received).empty());  // its new grace runs
  gone = t.Expired(kT0 + absl::Seconds(12), received);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].fd, 1);
  EXPECT_EQ(t.open(), 0);
}

TEST(ConnectionTableTest, PruneForgetsClosedConnectionsAndAReusedNumberReplacesItsRecord) {
  ConnectionTable t({/*max_connections=*/2, /*max_per_peer=*/2, absl::InfiniteDuration()});
  Admit(t, 1, "10.0.0.1");
  Admit(t, 2, "10.0.0.1");
  t.MarkAuthorized(Peer("10.0.0.1", 40001));
  t.MarkAuthorized(Peer("10.0.0.1", 40002));
  t.Prune([](int fd, uint64_t) { return fd != 1; });
  EXPECT_EQ(t.open(), 1);
  // Descriptor 2 closed by gRPC and reused for a new connection.
  EXPECT_EQ(t.Admit(2, 555, Peer("10.0.0.3", 1), "10.0.0.3", kT0).verdict,
            ConnectionTable::Verdict::kAdmitted);
  EXPECT_EQ(t.open(), 1);
  EXPECT_EQ(t.open_from("10.0.0.1"), 0);
}

TEST(KeyedLimitTest, OneKeyCannotTakeEveryPlace) {
  KeyedLimit l(/*total=*/8, /*per_key=*/0);  // a quarter: 2 per key
  EXPECT_EQ(l.per_key(), 2);
  EXPECT_EQ(l.Acquire("a"), KeyedLimit::kTaken);
  EXPECT_EQ(l.Acquire("a"), KeyedLimit::kTaken);
  EXPECT_EQ(l.Acquire("a"), KeyedLimit::kFullForKey);
  for (const char* k : {"b", "b", "c", "c", "d", "d"}) EXPECT_EQ(l.Acquire(k), KeyedLimit::kTaken);
  EXPECT_EQ(l.Acquire("e"), KeyedLimit::kFullInAll);
  l.Release("a");
  EXPECT_EQ(l.held("a"), 1);
  EXPECT_EQ(l.Acquire("e"), KeyedLimit::kTaken);
  l.Release("nobody");  // no effect
  EXPECT_EQ(l.held(), 8);
}

TEST(KeyedLimitTest, PerKeyIsNeverAboveTheTotal) {
  EXPECT_EQ(KeyedLimit(3, 100).per_key(), 3);
  EXPECT_EQ(KeyedLimit(2, 0).per_key(), 1);
}

}  // namespace
}  // namespace asympo
