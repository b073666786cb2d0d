#include "learner_server/admission/batch_ledger.h"

#include <algorithm>
#include <utility>

#include "common/security/x509.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace asympo::learner {

std::string BatchDigest(const google::protobuf::RepeatedPtrField<v1::PromptGroup>& groups) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    for (const v1::PromptGroup& g : groups) {
      out.WriteVarint64(g.ByteSizeLong());  // length-prefixed: groups cannot run together
      g.SerializeWithCachedSizes(&out);
    }
  }
  return security::Sha256(bytes);
}

namespace {

// No principal's name: names hold no NUL.
const std::string& AnyPrincipal() {
  static const std::string kAny("\0any", 4);
  return kAny;
}

}  // namespace

const BatchLedger::Record* BatchLedger::Find(const std::string& principal,
                                             const std::string& id) const {
  auto it = records_.find(Key(principal, id));
  if (it == records_.end()) it = records_.find(Key(AnyPrincipal(), id));
  return it == records_.end() ? nullptr : &it->second;
}

BatchLedger::Record* BatchLedger::Find(const std::string& principal, const std::string& id) {
  return const_cast<Record*>(std::as_const(*this).Find(principal, id));
}

BatchLedger::Seen BatchLedger::Check(const std::string& principal, const std::string& id,
                                     const std::string& digest, int32_t groups,
                                     std::vector<int32_t>* untrained) const {
  if (id.empty()) return Seen::kNew;
  const Record* found = Find(principal, id);
  if (found == nullptr) return Seen::kNew;
  const Record& r = *found;
  // A record without a digest (a checkpoint older than digests) cannot tell
  // payloads apart: as before, the id alone decides.
  if (r.digest.empty()) return Seen::kRecorded;
  if (r.digest != digest || r.groups() != groups) return Seen::kConflict;
  if (!r.restored) return Seen::kDuplicate;
  untrained->clear();
  for (int32_t i = 0; i < r.groups(); ++i) {
    if (!r.trained[static_cast<size_t>(i)]) untrained->push_back(i);
  }
  return untrained->empty() ? Seen::kRecorded : Seen::kResend;
}

BatchLedger::Record* BatchLedger::Remember(const Key& key) {
  auto [it, inserted] = records_.try_emplace(key);
  if (inserted) {
    order_.push_back(key);
    while (static_cast<int64_t>(order_.size()) > window_ && order_.front() != key) {
      records_.erase(order_.front());
      order_.pop_front();
    }
  }
  return &it->second;
}

void BatchLedger::Accept(const std::string& principal, const std::string& id,
                         const std::string& digest, int32_t groups, int32_t queued,
                         uint64_t version) {
  if (queued > 0) pending_[version] += queued;
  if (id.empty()) return;
  Record* r = Find(principal, id);
  if (r == nullptr) r = Remember(Key(principal, id));
  if (r->restored) {  // a resend: its untrained groups are queued again
    r->restored = false;
    return;
  }
  r->digest = digest;
  r->trained.assign(static_cast<size_t>(std::max(groups, 0)), false);
}

void BatchLedger::Resolve(const std::string& principal, const std::string& id, int32_t index,
                          uint64_t version, bool trained) {
  auto p = pending_.find(version);
  if (p != pending_.end() && --p->second <= 0) pending_.erase(p);
  if (!trained || id.empty()) return;
  Record* r = Find(principal, id);
  if (r == nullptr || index < 0 || index >= r->groups()) return;
  r->trained[static_cast<size_t>(index)] = true;
}

uint64_t BatchLedger::TrainedThrough(uint64_t version) const {
  return pending_.empty() ? version : std::min(version, pending_.begin()->first);
}

std::vector<RecordedBatch> BatchLedger::Recorded() const {
  std::vector<RecordedBatch> out;
  for (const Key& key : order_) {
    const Record& r = records_.at(key);
    RecordedBatch b{key.second, r.digest, r.groups(), {}};
    if (key.first != AnyPrincipal()) b.principal = key.first;
    for (int32_t i = 0; i < r.groups(); ++i) {
      if (r.trained[static_cast<size_t>(i)]) b.trained.push_back(i);
    }
    // A batch no step has trained any of is left out: a restart accepts it
    // again whole.
    if (!b.trained.empty() || r.groups() == 0) out.push_back(std::move(b));
  }
  return out;
}

void BatchLedger::Restore(const std::vector<RecordedBatch>& batches) {
  for (const RecordedBatch& b : batches) {
    if (b.id.empty()) continue;
    Record* r = Remember(Key(b.principal.value_or(AnyPrincipal()), b.id));
    r->digest = b.digest;
    const int32_t groups = b.digest.empty() ? 0 : std::max(b.groups, 0);
    r->trained.assign(static_cast<size_t>(groups), false);
    for (int32_t i : b.trained) {
      if (i >= 0 && i < groups) r->trained[static_cast<size_t>(i)] = true;
    }
    r->restored = true;
  }
}

}  // namespace asympo::learner
