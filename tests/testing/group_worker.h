// A worker of the learner's weight group inside a test's process: its c10d
// store is the learner's, reached through WeightGroup.Store (RpcStore), and
// its process group a real Gloo one, so that a test can form a generation
// and receive versions the way an engine does.
#pragma once

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include "asympo/v1/weight_group.grpc.pb.h"

namespace asympo::testing {

// Every operation is a Store call naming `token`; a failed call throws
// std::runtime_error with the learner's message. get and wait poll until
// the keys are set, for at most the store's timeout.
class RpcStore : public c10d::Store {
 public:
  RpcStore(std::shared_ptr<grpc::Channel> channel, std::string token,
           std::chrono::milliseconds timeout)
      : c10d::Store(timeout), stub_(v1::WeightGroup::NewStub(channel)), token_(std::move(token)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Call(v1::GroupStoreRequest::OP_SET, {key}, Text(value));
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& value) override {
    return Bytes(
        Call(v1::GroupStoreRequest::OP_COMPARE_SET, {key}, Text(value), Text(expected)).value());
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return Bytes(Waiting(v1::GroupStoreRequest::OP_GET, {key}, timeout_).value());
  }
  int64_t add(const std::string& key, int64_t amount) override {
    return Call(v1::GroupStoreRequest::OP_ADD, {key}, "", "", amount).number();
  }
  bool deleteKey(const std::string& key) override {
    return Call(v1::GroupStoreRequest::OP_DELETE, {key}).number() > 0;
  }
  bool check(const std::vector<std::string>& keys) override {
    return Call(v1::GroupStoreRequest::OP_CHECK, keys).ready();
  }
  int64_t getNumKeys() override { return Call(v1::GroupStoreRequest::OP_NUM_KEYS, {}).number(); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    Waiting(v1::GroupStoreRequest::OP_WAIT, keys, t);
  }

 private:
  static std::string Text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
  static std::vector<uint8_t> Bytes(const std::string& s) {
    return std::vector<uint8_t>(s.begin(), s.end());
  }
  v1::GroupStoreResponse Call(v1::GroupStoreRequest::Op op, const std::vector<std::string>& keys,
                              const std::string& value = "", const std::string& expected = "",
                              int64_t amount = 0, uint32_t wait_ms = 0) {
    v1::GroupStoreRequest r;
    r.set_member_token(token_);
    r.set_op(op);
    for (const std::string& k : keys) r.add_keys(k);
    r.set_value(value);
    r.set_expected(expected);
    r.set_amount(amount);
    r.set_wait_ms(wait_ms);
    grpc::ClientContext ctx;
    v1::GroupStoreResponse out;
    grpc::Status s = stub_->Store(&ctx, r, &out);
    if (!s.ok()) throw std::runtime_error("Store: " + s.error_message());
    return out;
  }
  v1::GroupStoreResponse Waiting(v1::GroupStoreRequest::Op op, const std::vector<std::string>& keys,
                                 std::chrono::milliseconds t) {
    const auto deadline = std::chrono::steady_clock::now() + t;
    while (true) {
      v1::GroupStoreResponse r = Call(op, keys, "", "", 0, 100);
      if (r.ready()) return r;
      if (std::chrono::steady_clock::now() >= deadline) {
        throw std::runtime_error("Store: keys not set in time");
      }
    }
  }

  std::unique_ptr<v1::WeightGroup::Stub> stub_;
  std::string token_;
};

}  // namespace asympo::testing
