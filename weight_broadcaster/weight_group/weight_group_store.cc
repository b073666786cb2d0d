#include "weight_broadcaster/weight_group/weight_group_store.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace asympo::broadcast {
WireLimits StoreWireLimits() {
  WireLimits limits;
  limits.max_string_bytes = static_cast<int64_t>(kMaxStoreValueBytes);
  limits.max_bytes = 2 * static_cast<int64_t>(kMaxStoreValueBytes) + (64 << 10) +
                     kMaxStoreKeys * static_cast<int64_t>(kMaxStoreKeyBytes + 8);
  return limits;
}

bool IsStoreWait(const v1::GroupStoreRequest& r) {
  return r.op() == v1::GroupStoreRequest::OP_GET || r.op() == v1::GroupStoreRequest::OP_WAIT;
}

absl::Duration WaitOf(uint32_t ms, uint32_t cap) {
  return absl::Milliseconds(ms == 0 ? kDefaultWaitMs : std::min(ms, cap));
}

// A store request's limits: key count and sizes, value sizes.
grpc::Status CheckStoreRequest(const v1::GroupStoreRequest& r) {
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

}  // namespace asympo::broadcast
