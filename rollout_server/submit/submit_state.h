// asympo-submit's windows and its state file (rollout_server/submit/submit_main.cc).
//
// What is keyed by what (line numbers and the file's name key nothing):
//   row key    GroupDigest of the row's group as sent (32 hex digits of the
//              SHA-256 of its deterministic protobuf serialization), plus
//              ".<n>" for the n-th repeat (n >= 1) of the same content in
//              the file: RowKeys.
//   window     a batch of rows that were in no window yet, in file order.
//              Its batch_id is "<source>/<run>/<run_nonce>/" and 32 hex
//              digits of the SHA-256 of its rows' keys in order (WindowId):
//              a retry or a resend of the window is the same id with the
//              same payload, a duplicate at the learner. Without a state
//              file (--state=none) there is no nonce: "<source>/<run>/".
//   state      JSON lines appended to the state file (each fsynced), a later
//              line about a window replacing what an earlier one said:
//       {"asympo_submit_state": 2}                      the first line
//       {"run_nonce": N}   12 random hex digits, written when the file is
//           created (or first opened by an asympo-submit that keeps one):
//           part of every later window's batch_id, so that nobody who
//           knows the file can tell its ids in advance
//       {"window": ID, "rows": [KEY, ...]}              written before the
//           window is first sent: these rows belong to it from then on,
//           never to another window
//       {"accepted": ID, "incarnation": I, "version": V}   the learner's
//           reply to it: learner_incarnation and learner_version
//       {"trained": ID}    confirmed: GetStatus of incarnation I reported
//           recorded_through_version (or, with --confirm=trained,
//           trained_through_version) above V
//       {"refused": ID}    a final refusal: its rows are free for a later
//           window
//
// Thread-compatible: one StateFile per run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "asympo/v1/rollout.pb.h"
#include "nlohmann/json.hpp"

namespace asympo::submit {

// 32 lowercase hex digits of the SHA-256 of `g`'s deterministic serialization.
std::string GroupDigest(const v1::PromptGroup& g);

// The keys of `groups` in file order: each one's GroupDigest, with ".<n>"
// for its n-th repeat.
std::vector<std::string> RowKeys(const std::vector<const v1::PromptGroup*>& groups);

// `prefix` and 32 hex digits of the SHA-256 of `keys` in order.
std::string WindowId(const std::string& prefix, const std::vector<std::string>& keys);

enum class WindowState { kFormed, kAccepted, kTrained, kRefused };

struct Window {
  std::string id;
  std::vector<std::string> keys;
  WindowState state = WindowState::kFormed;
  std::string incarnation;  // of the learner that accepted it last
  uint64_t version = 0;     // its learner_version in that reply
};

class StateFile {
 public:
  StateFile() = default;
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;
  ~StateFile();

  // Reads `path`, creating it with its header when it is missing or empty,
  // and keeps it open to append. "none" keeps the state in memory only.
  // INVALID_ARGUMENT naming the file and line for a line it cannot read, or
  // a file written by an asympo-submit that keyed windows by line numbers.
  absl::Status Open(const std::string& path);

  // The windows in the order they were formed.
  const std::vector<Window>& windows() const { return windows_; }
  const Window& window(size_t i) const { return windows_[i]; }
  // Whether the row with `key` is in a window that was not refused.
  bool Claimed(const std::string& key) const { return claimed_.contains(key); }
  // Whether it is in a window confirmed as trained.
  bool Trained(const std::string& key) const;
  // The run's random part of new windows' ids (empty with "none").
  const std::string& run_nonce() const { return run_nonce_; }

  // Each records one line (fsynced) and applies it. Formed returns the
  // window's index.
  size_t Formed(const std::string& id, const std::vector<std::string>& keys);
  void Accepted(size_t window, const std::string& incarnation, uint64_t version);
  void Trained(size_t window);
  void Refused(size_t window);

 private:
  absl::Status Apply(const std::string& line);
  void Append(const std::string& line);
  void Record(const nlohmann::json& j);

  std::string path_;
  std::string run_nonce_;
  int fd_ = -1;
  std::vector<Window> windows_;
  absl::flat_hash_map<std::string, size_t> by_id_;
  absl::flat_hash_map<std::string, size_t> claimed_;  // row key -> window
};

}  // namespace asympo::submit
