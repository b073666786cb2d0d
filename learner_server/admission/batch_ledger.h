// BatchLedger: what the learner knows of every batch id it remembers, so
// that a batch id names one payload and a batch is trained once across
// retries and restarts (docs/protocol.md, "Exactly-once" and "Recovery
// after a learner restart").
//
// Batch ids are one namespace per principal: a remembered id is the pair
// (principal, batch id), so that no principal can take, or learn anything
// from, another's ids. A batch restored from a checkpoint written before
// checkpoints named principals matches its id pushed by any principal.
//
// For each remembered id: the digest of the batch's groups (SHA-256 of
// their bytes), how many groups it has, which of them a training step
// consumed, and how many are still unresolved (queued or in a step; a
// group is resolved when a step trained or skipped it, or when it was
// dropped). A push of a known id is a duplicate when the digests agree and
// a conflict (refused, ALREADY_EXISTS naming the id) when they differ. A
// batch restored from a checkpoint with some groups untrained (the learner
// died after a step took part of it) is a resend: a push of it queues only
// the groups no step trained.
//
// The ledger also gives the trained-through version: every batch accepted
// at a version below it is resolved. Not thread-safe: GroupQueue holds it
// under its lock.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "asympo/v1/rollout.pb.h"
#include "common/model/checkpoint_meta.h"

namespace asympo::learner {

// The SHA-256 of a batch's groups (each group's deterministic serialization,
// length-prefixed, in order), 32 raw bytes. The batch's id and source are
// not part of it.
std::string BatchDigest(const google::protobuf::RepeatedPtrField<v1::PromptGroup>& groups);

// One batch as a checkpoint keeps it.
using RecordedBatch = CheckpointBatch;

class BatchLedger {
 public:
  enum class Seen {
    kNew,        // never seen (or forgotten): queue every group
    kDuplicate,  // the same payload was accepted: acknowledge, queue nothing
    kRecorded,   // a duplicate of a batch the restored checkpoint trained in full
    kConflict,   // another payload was accepted under this id: refuse
    kResend,     // restored with untrained groups: queue those only
  };

  // Remembers at most `window` ids, oldest forgotten first.
  explicit BatchLedger(int64_t window) : window_(window) {}

  // What a push by `principal` of `groups` groups with `digest` under `id`
  // is. For kResend, `*untrained` gets the indices to queue.
  Seen Check(const std::string& principal, const std::string& id, const std::string& digest,
             int32_t groups, std::vector<int32_t>* untrained) const;

  // A push of `id` (empty: a batch without an id) by `principal` was
  // queued: `queued` groups (every group, or a resend's untrained ones)
  // that arrived at `version`, unresolved until Resolve.
  void Accept(const std::string& principal, const std::string& id, const std::string& digest,
              int32_t groups, int32_t queued, uint64_t version);

  // Group `index` of `principal`'s batch `id`, arrived at `version`, left
  // the queue for good: trained by a step (`trained`), or skipped or
  // dropped.
  void Resolve(const std::string& principal, const std::string& id, int32_t index, uint64_t version,
               bool trained);

  // Every batch accepted at a version below this is resolved: `version`
  // (the learner's now) when nothing is unresolved, never more, so that a
  // batch accepted at `version` after this call is not counted in.
  uint64_t TrainedThrough(uint64_t version) const;

  // The batches of which a step trained at least one group, oldest first
  // (what a checkpoint keeps), and their restoration.
  std::vector<RecordedBatch> Recorded() const;
  void Restore(const std::vector<RecordedBatch>& batches);

  int64_t size() const { return static_cast<int64_t>(order_.size()); }

 private:
  struct Record {
    std::string digest;
    std::vector<bool> trained;  // by group index: one flag per group
    int32_t groups() const { return static_cast<int32_t>(trained.size()); }
    bool restored = false;  // from a checkpoint, its untrained groups not queued
  };
  // (principal, batch id); a batch from a checkpoint without principals
  // has kAnyPrincipal.
  using Key = std::pair<std::string, std::string>;
  Record* Remember(const Key& key);
  // The record of `principal`'s `id`, or of `id` from a checkpoint without
  // principals; nullptr when neither is remembered.
  const Record* Find(const std::string& principal, const std::string& id) const;
  Record* Find(const std::string& principal, const std::string& id);

  int64_t window_;
  absl::flat_hash_map<Key, Record> records_;
  std::deque<Key> order_;
  // Unresolved groups by the version they arrived at.
  std::map<uint64_t, int64_t> pending_;
};

}  // namespace asympo::learner
