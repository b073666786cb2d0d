#include "weight_broadcaster/weight_group/weight_group_store.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace asympo::broadcast {
WireLimits StoreWireLimits() {
  WireLimits limits;
  limits.max_string_bytes = static_cast<int64_t>(kMaxStoreValueBytes);
  limits.max_bytes = 2 * static_cast<int64_t>(kMaxStoreValueBytes) + (64 << 10) +
                     kMaxStoreKeys * static_cast<int64_t>(kMaxStoreKeyBytes + 8);
  return limits;
}

grpc::Status CheckMemberToken(const std::string& token) {
  if (token.empty() || token.size() > kMaxMemberTokenBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("member_token must be 1 to ", kMaxMemberTokenBytes,
                                     " bytes (Join's reply gives it), not ", token.size()));
  }
  return grpc::Status::OK;
}

bool IsStoreWait(const v1::GroupStoreRequest& r) {
  return r.op() == v1::GroupStoreRequest::OP_GET || r.op() == v1::GroupStoreRequest::OP_WAIT;
}

absl::Duration WaitOf(uint32_t ms, uint32_t cap) {
  return absl::Milliseconds(ms == 0 ? kDefaultWaitMs : std::min(ms, cap));
}

// A store request's limits: key count and sizes, value sizes.
grpc::Status CheckStoreRequest(const v1::GroupStoreRequest& r) {
  grpc::Status status = CheckMemberToken(r.member_token());
  if (!status.ok()) return status;
  if (!v1::GroupStoreRequest::Op_IsValid(r.op()) ||
      r.op() == v1::GroupStoreRequest::OP_UNSPECIFIED) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("op must name a store operation (OP_SET to OP_NUM_KEYS), not ",
                                     static_cast<int>(r.op())));
  }
  const auto& keys = r.keys();
  if (keys.size() > kMaxStoreKeys) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("at most ", kMaxStoreKeys, " keys, not ", keys.size()));
  }
  for (const std::string& k : keys) {
    if (k.size() > kMaxStoreKeyBytes) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("a key of ", k.size(), " bytes (at most ", kMaxStoreKeyBytes, ")"));
    }
  }
  if (r.value().size() > kMaxStoreValueBytes || r.expected().size() > kMaxStoreValueBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("a value over ", kMaxStoreValueBytes, " bytes"));
  }
  const bool one_key = r.op() != v1::GroupStoreRequest::OP_CHECK &&
                       r.op() != v1::GroupStoreRequest::OP_WAIT &&
                       r.op() != v1::GroupStoreRequest::OP_NUM_KEYS;
  if (one_key && keys.size() != 1) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("this store operation takes one key, not ", keys.size()));
  }
  return grpc::Status::OK;
}

// One store operation on `store` (c10d's semantics).
grpc::Status RunStoreOp(c10d::Store& store, const v1::GroupStoreRequest& r,
                        v1::GroupStoreResponse* response) {
  const auto& keys = r.keys();
  const auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  const std::vector<std::string> key_list(keys.begin(), keys.end());
  try {
    switch (r.op()) {
      case v1::GroupStoreRequest::OP_SET:
        store.set(keys[0], bytes(r.value()));
        break;
      case v1::GroupStoreRequest::OP_GET:
      case v1::GroupStoreRequest::OP_WAIT: {
        const bool ready = store.check(key_list);
        response->set_ready(ready);
        if (ready && r.op() == v1::GroupStoreRequest::OP_GET) {
          const std::vector<uint8_t> v = store.get(keys[0]);
          response->set_value(std::string(v.begin(), v.end()));
        }
        break;
      }
      case v1::GroupStoreRequest::OP_ADD:
        response->set_number(store.add(keys[0], r.amount()));
        break;
      case v1::GroupStoreRequest::OP_COMPARE_SET: {
        const std::vector<uint8_t> v =
            store.compareSet(keys[0], bytes(r.expected()), bytes(r.value()));
        response->set_value(std::string(v.begin(), v.end()));
        break;
      }
      case v1::GroupStoreRequest::OP_CHECK:
        response->set_ready(store.check(key_list));
        break;
      case v1::GroupStoreRequest::OP_DELETE:
        response->set_number(store.deleteKey(keys[0]) ? 1 : 0);
        break;
      case v1::GroupStoreRequest::OP_NUM_KEYS:
        response->set_number(store.getNumKeys());
        break;
      default:
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("unknown store operation ", static_cast<int>(r.op())));
    }
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("store operation failed: ", what.substr(0, what.find('\n'))));
  }
  return grpc::Status::OK;
}

// --- GenerationStore. ---

namespace {

// The most bytes ADD's decimal text of an int64 takes.
constexpr int64_t kNumberBytes = 20;

bool Writes(v1::GroupStoreRequest::Op op) {
  return op == v1::GroupStoreRequest::OP_SET || op == v1::GroupStoreRequest::OP_ADD ||
         op == v1::GroupStoreRequest::OP_COMPARE_SET || op == v1::GroupStoreRequest::OP_DELETE;
}

grpc::Status Exhausted(const std::string& what, int64_t would, int64_t limit, const char* unit) {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat(what, " would hold ", would, " ", unit,
                                   " in the store of its generation, over its limit of ", limit));
}

}  // namespace

GenerationStore::GenerationStore(const WeightGroupOptions& options)
    : options_(options), store_(c10::make_intrusive<c10d::HashStore>()) {}

grpc::Status GenerationStore::RoomLocked(const std::string& member, const std::string& worker,
                                         const std::string& key, int64_t bytes,
                                         std::string* cause) {
  auto it = keys_.find(key);
  const bool new_key = it == keys_.end();
  const int64_t old = new_key ? 0 : it->second.bytes;
  const Usage& mine = by_member_[member];
  const std::string who = absl::StrCat("worker ", QuoteForMessage(worker));
  *cause = "store_bytes";
  if (total_.bytes - old + bytes > options_.max_store_bytes) {
    return Exhausted("the generation", total_.bytes - old + bytes, options_.max_store_bytes,
                     "bytes");
  }
  if (mine.bytes - old + bytes > options_.max_store_bytes_per_member) {
    return Exhausted(who, mine.bytes - old + bytes, options_.max_store_bytes_per_member, "bytes");
  }
  *cause = "store_keys";
  if (new_key && total_.keys >= options_.max_store_keys) {
    return Exhausted("the generation", total_.keys + 1, options_.max_store_keys, "keys");
  }
  if (new_key && mine.keys >= options_.max_store_keys_per_member) {
    return Exhausted(who, mine.keys + 1, options_.max_store_keys_per_member, "keys");
  }
  cause->clear();
  return grpc::Status::OK;
}

void GenerationStore::RecordLocked(const std::string& member, const std::string& key) {
  if (auto it = keys_.find(key); it != keys_.end()) {
    Usage& was = by_member_[it->second.member];
    was.bytes -= it->second.bytes;
    --was.keys;
    total_.bytes -= it->second.bytes;
    --total_.keys;
    keys_.erase(it);
  }
  if (!store_->check({key})) return;  // deleted
  const int64_t bytes = static_cast<int64_t>(key.size() + store_->get(key).size());
  keys_[key] = Key{member, bytes};
  Usage& mine = by_member_[member];
  mine.bytes += bytes;
  ++mine.keys;
  total_.bytes += bytes;
  ++total_.keys;
}

grpc::Status GenerationStore::Run(const std::string& member, const std::string& worker,
                                  const v1::GroupStoreRequest& r, v1::GroupStoreResponse* response,
                                  std::string* cause) {
  cause->clear();
  if (!Writes(r.op())) return RunStoreOp(*store_, r, response);
  absl::MutexLock lock(&mu_);
  const std::string& key = r.keys(0);
  auto it = keys_.find(key);
  // A key set through Store belongs to its member; one set but not
  // through Store, to rank 0.
  const bool theirs = it != keys_.end() ? it->second.member != member : store_->check({key});
  const bool add = r.op() == v1::GroupStoreRequest::OP_ADD;
  if (theirs && !add) {
    *cause = "store_key_owner";
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("key ", QuoteForMessage(key),
                                     " was set by another rank; a member sets, compare-sets and "
                                     "deletes only keys it set itself (ADD counts on any key)"));
  }
  if (r.op() != v1::GroupStoreRequest::OP_DELETE && !(add && theirs)) {
    const int64_t value =
        add ? kNumberBytes : static_cast<int64_t>(std::max(r.value().size(), r.expected().size()));
    grpc::Status room =
        RoomLocked(member, worker, key, static_cast<int64_t>(key.size()) + value, cause);
    if (!room.ok()) return room;
  }
  grpc::Status status = RunStoreOp(*store_, r, response);
  if (status.ok() && !theirs) RecordLocked(member, key);
  return status;
}

}  // namespace asympo::broadcast
