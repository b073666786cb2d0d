// KeyedLimit: places of one kind (open streams, fetches under way,
// registrations) limited in all and per key (a principal, or a peer address
// where callers are anonymous), so that one key cannot take every place
// and lock the others out.
//
//   KeyedLimit streams(1024, 256);
//   if (streams.Acquire("team-a") != KeyedLimit::kTaken) refuse...;
//   ...
//   streams.Release("team-a");
//
// Not thread-safe: the owner holds its own lock around it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"

namespace asympo {

class KeyedLimit {
 public:
  // per_key 0: a quarter of `total`, at least 1; never above `total`.
  KeyedLimit(int64_t total, int64_t per_key)
      : total_(total),
        per_key_(std::min(total, per_key > 0 ? per_key : std::max<int64_t>(1, total / 4))) {}

  enum Result { kTaken, kFullInAll, kFullForKey };
  // Takes a place for `key` unless `key` holds per_key() or all hold
  // total().
  Result Acquire(const std::string& key) {
    auto it = held_.find(key);
    const int64_t mine = it == held_.end() ? 0 : it->second;
    if (mine >= per_key_) return kFullForKey;
    if (all_ >= total_) return kFullInAll;
    ++held_[key];
    ++all_;
    return kTaken;
  }
  // Gives back a place `key` took; no effect when it holds none.
  void Release(const std::string& key) {
    auto it = held_.find(key);
    if (it == held_.end()) return;
    if (--it->second == 0) held_.erase(it);
    --all_;
  }

  int64_t held(const std::string& key) const {
    auto it = held_.find(key);
    return it == held_.end() ? 0 : it->second;
  }
  int64_t held() const { return all_; }
  int64_t total() const { return total_; }
  int64_t per_key() const { return per_key_; }

 private:
  const int64_t total_;
  const int64_t per_key_;
  int64_t all_ = 0;
  absl::flat_hash_map<std::string, int64_t> held_;
};

}  // namespace asympo
