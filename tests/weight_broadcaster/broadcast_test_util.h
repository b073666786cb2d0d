// Test helpers for the weight broadcaster: a small model whose weights
// depend on the version (loose or laid out as a plan's buckets), a sender on
// a loopback gRPC server, polling with a
// deadline, and reading a metric back from a registry. Not thread-safe.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/metrics.h"
#include "tests/testing/wait.h"
#include "weight_broadcaster/broadcast_receiver.h"
#include "weight_broadcaster/broadcast_sender.h"
#include "weight_broadcaster/snapshot_manifest.h"

namespace asympo::broadcast::testing {

// Four tensors of three dtypes; with 4 KiB buckets they span three buckets
// (the 4096-byte embedding fills the first exactly).
inline std::vector<TensorSpec> TestSpecs() {
  return {{"model.embed_tokens.weight", v1::DTYPE_F32, {64, 16}},
          {"model.layers.0.mlp.up_proj.weight", v1::DTYPE_BF16, {33, 7}},
          {"model.layers.0.input_layernorm.weight", v1::DTYPE_F16, {5}},
          {"lm_head.weight", v1::DTYPE_F32, {100, 10}}};
}

inline PackingOptions TestPacking() {
  PackingOptions p;
  p.bucket_bytes = 4096;
  return p;
}

// Byte i of tensor t at version v: differs between versions and tensors.
inline char WeightByte(uint64_t version, size_t t, size_t i) {
  uint64_t x = (version + 1) * 0x9E3779B97F4A7C15ull ^ (t * 1000003 + i) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<char>(x & 0xff);
}

// The weights of `version`, one byte string per tensor of `specs`.
inline std::vector<std::string> Weights(uint64_t version,
                                        const std::vector<TensorSpec>& specs = TestSpecs()) {
  std::vector<std::string> out;
  for (size_t t = 0; t < specs.size(); ++t) {
    size_t n = DTypeSize(specs[t].dtype);
    for (int64_t d : specs[t].shape) n *= static_cast<size_t>(d);
    std::string bytes(n, '\0');
    for (size_t i = 0; i < n; ++i) bytes[i] = WeightByte(version, t, i);
    out.push_back(std::move(bytes));
  }
  return out;
}

// Weights along a training run: version 0 is Weights(seed), and each version
// after changes about `per_mille` of the 2-byte words of the one before.
inline std::vector<std::string> ChainWeights(uint64_t version, uint64_t seed, int per_mille = 20) {
  std::vector<std::string> w = Weights(seed);
  for (uint64_t u = 1; u <= version; ++u) {
    for (size_t t = 0; t < w.size(); ++t) {
      for (size_t i = 0; i + 2 <= w[t].size(); i += 2) {
        const char h = WeightByte(u * 7919 + seed, t, i);
        if (static_cast<uint8_t>(h) % 1000 < static_cast<unsigned>(per_mille) * 256 / 1000) {
          w[t][i] = static_cast<char>(w[t][i] ^ (1 | h));
        }
      }
    }
  }
  return w;
}

inline std::vector<TensorView> Views(const std::vector<std::string>& weights,
                                     const std::vector<TensorSpec>& specs = TestSpecs()) {
  std::vector<TensorView> views;
  for (size_t t = 0; t < specs.size(); ++t) {
    views.push_back({specs[t], weights[t].data(), weights[t].size()});
  }
  return views;
}

// Weights(version) in one buffer laid out as `plan` says, for
// Publish(version, HostBuckets).
inline HostBuckets LaidOut(std::shared_ptr<const SnapshotPlan> plan, uint64_t version) {
  auto bytes = std::make_shared<std::string>(plan->flat_bytes(), '\0');
  const std::vector<std::string> w = Weights(version);
  for (size_t t = 0; t < w.size(); ++t) {
    bytes->replace(plan->tensor_start(static_cast<int>(t)), w[t].size(), w[t]);
  }
  HostBuckets host;
  host.plan = std::move(plan);
  host.data = bytes->data();
  host.keep_alive = std::move(bytes);
  return host;
}

// Every tensor of `s` holds exactly the bytes of Weights(version).
inline void ExpectWeightsOf(const ReceivedSnapshot& s, uint64_t version) {
  ASSERT_EQ(s.version(), version);
  const std::vector<TensorSpec> specs = TestSpecs();
  const std::vector<std::string> want = Weights(version);
  ASSERT_EQ(s.manifest.tensors_size(), static_cast<int>(specs.size()));
  for (size_t t = 0; t < specs.size(); ++t) {
    const v1::TensorEntry& e = s.manifest.tensors(static_cast<int>(t));
    EXPECT_EQ(e.name(), specs[t].name);
    EXPECT_TRUE(s.TensorBytes(e) == want[t]) << e.name() << " differs at version " << version;
  }
}

// Polls `done` until it holds or `timeout` passes.
inline bool WaitUntil(const std::function<bool()>& done,
                      absl::Duration timeout = absl::Seconds(2)) {
  return ::asympo::testing::WaitFor(done, timeout);
}

using ::asympo::testing::MetricValue;

// The sender's options and its store's, for SenderServer.
struct ServerOptions : BroadcastSenderOptions {
  PackingOptions packing;
  std::string incarnation;
  int delta_keyframe_every = 0;  // SnapshotStoreOptions's: 0, no deltas
};

// A BroadcastSender over a snapshot store of its own, served on a loopback
// port (0: any free one).
class SenderServer {
 public:
  explicit SenderServer(ServerOptions options = {}, int port = 0)
      : registry_(std::make_shared<prometheus::Registry>()),
        store_(std::make_unique<SnapshotStore>(
            SnapshotStoreOptions{options.packing, options.incarnation,
                                 options.delta_keyframe_every},
            ModelSignature(TestSpecs()), *registry_)),
        sender_(std::make_unique<BroadcastSender>(static_cast<BroadcastSenderOptions>(options),
                                                  *store_, *registry_)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(sender_.get());
    server_ = builder.BuildAndStart();
  }
  ~SenderServer() { Shutdown(); }

  // The daemon's order: end the Subscribe streams, then the server.
  void Shutdown() {
    if (server_ == nullptr) return;
    sender_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }

  absl::Status Publish(uint64_t version) {
    const std::vector<std::string> w = Weights(version);
    return store_->Publish(version, Views(w));
  }

  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  BroadcastSender& sender() { return *sender_; }
  SnapshotStore& store() { return *store_; }
  prometheus::Registry& registry() { return *registry_; }
  double Metric(const std::string& name) { return MetricValue(*registry_, name); }

  std::unique_ptr<v1::WeightBroadcast::Stub> NewStub() const {
    return v1::WeightBroadcast::NewStub(
        grpc::CreateChannel(target(), grpc::InsecureChannelCredentials()));
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<SnapshotStore> store_;
  std::unique_ptr<BroadcastSender> sender_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// Receiver options for tests: fast backoff.
inline WeightReceiverOptions ReceiverOptions(const std::string& target, const std::string& id) {
  WeightReceiverOptions o;
  o.target = target;
  o.receiver_id = id;
  o.model_signature = ModelSignature(TestSpecs());
  o.min_backoff = absl::Milliseconds(10);
  o.max_backoff = absl::Milliseconds(100);
  o.fetch_timeout = absl::Seconds(5);
  return o;
}

}  // namespace asympo::broadcast::testing
