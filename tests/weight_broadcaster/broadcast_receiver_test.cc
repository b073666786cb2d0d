// WeightReceiver against a scripted sender that announces a manifest and
// streams whatever chunks a test gives it: every way a transfer can go wrong
// must be counted, reported to the learner and leave nothing pending.
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "tests/weight_broadcaster/broadcast_test_util.h"
#include "weight_broadcaster/announcement_stream.h"
#include "weight_broadcaster/wire_format.h"

namespace asympo::broadcast {
namespace {

using ::testing::HasSubstr;
using testing::ReceiverOptions;
using testing::WaitUntil;

class ScriptedSender final : public v1::WeightBroadcast::Service {
 public:
  ScriptedSender(v1::SnapshotManifest manifest, std::vector<v1::WeightChunk> chunks)
      : manifest_(std::move(manifest)), chunks_(std::move(chunks)) {}

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*,
                        v1::RegisterResponse* r) override {
    r->set_session_id("scripted");
    r->set_transport(v1::TRANSPORT_GRPC);
    return grpc::Status::OK;
  }
  grpc::Status Subscribe(grpc::ServerContext* ctx, const v1::SubscribeRequest*,
                         grpc::ServerWriter<v1::SnapshotAnnouncement>* w) override {
    ctx->AddInitialMetadata(kSubscribedMetadataKey, "1");
    v1::SnapshotAnnouncement a;
    *a.mutable_manifest() = manifest_;
    w->Write(a);
    while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return grpc::Status::CANCELLED;
  }
  grpc::Status FetchSnapshot(grpc::ServerContext*, const v1::FetchSnapshotRequest*,
                             grpc::ServerWriter<v1::WeightChunk>* w) override {
    for (const v1::WeightChunk& c : chunks_) w->Write(c);
    return grpc::Status::OK;
  }
  grpc::Status ReportVersion(grpc::ServerContext*, const v1::ReportVersionRequest* r,
                             v1::ReportVersionResponse*) override {
    absl::MutexLock lock(&mu_);
    errors_.push_back(r->error());
    return grpc::Status::OK;
  }
  std::vector<std::string> errors() {
    absl::MutexLock lock(&mu_);
    return errors_;
  }

 private:
  const v1::SnapshotManifest manifest_;
  const std::vector<v1::WeightChunk> chunks_;
  absl::Mutex mu_;
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
};

// Version 1 of the test model packed by hand (independently of the sender),
// with its checksums, and cut into 1000-byte chunks.
struct Packed {
  v1::SnapshotManifest manifest;
  std::vector<v1::WeightChunk> chunks;
};

Packed PackVersion1() {
  Packed p;
  p.manifest = *PlanSnapshot(testing::TestSpecs(), 1, testing::TestPacking());
  const std::vector<std::string> w = testing::Weights(1);
  std::vector<std::string> buckets;
  for (const auto& b : p.manifest.buckets()) buckets.emplace_back(b.size_bytes(), '\0');
  for (int t = 0; t < p.manifest.tensors_size(); ++t) {
    const v1::TensorEntry& e = p.manifest.tensors(t);
    buckets[e.bucket()].replace(e.offset(), e.size_bytes(), w[static_cast<size_t>(t)]);
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    p.manifest.mutable_buckets(static_cast<int>(b))
        ->set_crc32c(Crc32c(buckets[b].data(), buckets[b].size()));
    for (size_t off = 0; off < buckets[b].size(); off += 1000) {
      v1::WeightChunk c;
      c.set_version(1);
      c.set_bucket(static_cast<uint32_t>(b));
      c.set_offset(off);
      c.set_data(buckets[b].substr(off, 1000));
      p.chunks.push_back(std::move(c));
    }
  }
  return p;
}

// Serves `service` on a loopback port, named in *target.
std::unique_ptr<grpc::Server> Serve(ScriptedSender* service, std::string* target) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *target = "127.0.0.1:" + std::to_string(port);
  return server;
}

struct Case {
  std::string name;
  std::function<void(Packed*)> spoil;  // empty: the transfer is sound
  std::string error;                   // expected in the reported error
};

TEST(WeightReceiverTest, EveryBrokenTransferIsCountedReportedAndDropped) {
  const std::vector<Case> cases = {
      {"sound", nullptr, ""},
      {"chunk of another version", [](Packed* p) { p->chunks[2].set_version(2); },
       "chunk of version 2"},
      {"bucket out of range", [](Packed* p) { p->chunks.back().set_bucket(3); },
       "chunk for bucket 3 of 3"},
      {"gap", [](Packed* p) { p->chunks.erase(p->chunks.begin() + 1); },
       "bucket 0: chunk at offset 2000"},
      {"past the bucket's end",
       [](Packed* p) {
         v1::WeightChunk extra = p->chunks.back();
         extra.set_offset(4000);
         p->chunks.push_back(extra);
       },
       "bucket 2: chunk at offset 4000"},
      {"missing tail", [](Packed* p) { p->chunks.pop_back(); },
       "bucket 2 is incomplete: 3000 of 4000 bytes"},
      {"flipped byte", [](Packed* p) { (*p->chunks[5].mutable_data())[17] ^= 1; },
       "bucket 1 fails its checksum"},
      {"manifest with a tensor outside its bucket",
       [](Packed* p) { p->manifest.mutable_tensors(2)->set_offset(600); }, "invalid manifest"},
      {"manifest of another model",
       [](Packed* p) { p->manifest.set_model_signature("4-0badf00d"); }, "4-0badf00d"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Packed p = PackVersion1();
    if (c.spoil) c.spoil(&p);
    ScriptedSender service(p.manifest, p.chunks);
    std::string target;
    std::unique_ptr<grpc::Server> server = Serve(&service, &target);
    prometheus::Registry registry;
    auto receiver = *WeightReceiver::Start(ReceiverOptions(target, "rx"), registry);
    if (c.error.empty()) {
      ASSERT_TRUE(receiver->WaitForPending(absl::Seconds(2)));
      testing::ExpectWeightsOf(*receiver->TakePending(), 1);
      EXPECT_EQ(receiver->failures(), 0);
    } else {
      ASSERT_TRUE(WaitUntil([&] { return service.errors().size() == 1; }));
      EXPECT_THAT(service.errors()[0], HasSubstr("version 1"));
      EXPECT_THAT(service.errors()[0], HasSubstr(c.error));
      EXPECT_EQ(receiver->failures(), 1);
      EXPECT_EQ(receiver->TakePending(), nullptr);
    }
    receiver->Stop();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
}

// gRPC may run a stream's reactions on different threads in either order:
// an announcement must never reach the receiver before the subscription it
// arrived on has been reported, however late the metadata's reaction runs
// (the receiver's connected() once read false after loading a version).
TEST(AnnouncementStreamTest, TheSubscriptionIsReportedBeforeItsFirstAnnouncement) {
  Packed p = PackVersion1();
  ScriptedSender service(p.manifest, p.chunks);
  std::string target;
  std::unique_ptr<grpc::Server> server = Serve(&service, &target);
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = v1::WeightBroadcast::NewStub(channel);
  for (int round = 0; round < 3; ++round) {
    absl::Mutex mu;
    int subscribed = 0, announced = 0, announced_first = 0;
    bool done = false;
    AnnouncementStream stream(
        stub.get(), {[&] {
                       absl::SleepFor(absl::Milliseconds(100));  // a slow metadata reaction
                       absl::MutexLock lock(&mu);
                       ++subscribed;
                     },
                     [&](v1::SnapshotAnnouncement) {
                       absl::MutexLock lock(&mu);
                       ++announced;
                       if (subscribed == 0) ++announced_first;
                     },
                     [&](const grpc::Status&) {
                       absl::MutexLock lock(&mu);
                       done = true;
                     }});
    stream.Start("scripted");
    {
      absl::MutexLock lock(&mu);
      ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                          +[](int* n) { return *n > 0; }, &announced),
                                      absl::Seconds(5)));
    }
    stream.context()->TryCancel();
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
    EXPECT_EQ(subscribed, 1);
    EXPECT_EQ(announced_first, 0);
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace asympo::broadcast
