#include "weight_broadcaster/snapshot_delta.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "weight_broadcaster/delta_codec.h"
#include "weight_broadcaster/snapshot_manifest.h"

namespace asympo::broadcast {

int DeltaWordBytes(const v1::SnapshotManifest& manifest, int bucket) {
  uint64_t word = 8;
  for (const v1::TensorEntry& t : manifest.tensors()) {
    if (static_cast<int>(t.bucket()) == bucket)
      word = std::min<uint64_t>(word, DTypeSize(t.dtype()));
  }
  if (word == 0) word = 1;
  const uint64_t bytes = manifest.buckets(bucket).size_bytes();
  return bytes % word == 0 && kDeltaPieceBytes % word == 0 ? static_cast<int>(word) : 1;
}

namespace {

// The estimated fraction of the bucket's words that changed: every
// kDeltaSampleEvery-th piece compared (all of a bucket of one piece).
double SampledDensity(const char* base, const char* next, uint64_t bytes, int word) {
  uint64_t words = 0, changed = 0;
  for (uint64_t off = 0; off < bytes; off += kDeltaSampleEvery * kDeltaPieceBytes) {
    const uint64_t n = std::min<uint64_t>(kDeltaPieceBytes, bytes - off);
    changed += CountChangedWords(reinterpret_cast<const uint8_t*>(base + off),
                                 reinterpret_cast<const uint8_t*>(next + off), n, word);
    words += n / static_cast<uint64_t>(word);
  }
  return words == 0 ? 0.0 : static_cast<double>(changed) / static_cast<double>(words);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SnapshotDelta>> EncodeSnapshotDelta(
    const v1::SnapshotManifest& manifest, const std::vector<const char*>& base,
    const std::vector<const char*>& next, uint64_t base_version, int threads,
    std::vector<uint32_t>* next_crcs) {
  const size_t n = static_cast<size_t>(manifest.buckets_size());
  if (base.size() != n || next.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("a delta of ", n, " buckets from ", base.size(),
                                                   " and ", next.size(), " buckets"));
  }
  auto delta = std::make_shared<SnapshotDelta>();
  delta->base_version = base_version;
  delta->buckets.resize(n);
  next_crcs->assign(n, 0);
  for (size_t b = 0; b < n; ++b) {
    const int bucket = static_cast<int>(b);
    const uint64_t bytes = manifest.buckets(bucket).size_bytes();
    std::string& d = delta->buckets[b];
    const int word = DeltaWordBytes(manifest, bucket);
    if (SampledDensity(base[b], next[b], bytes, word) > kMaxDeltaDensity) {
      (*next_crcs)[b] = Crc32cOfMany({{next[b], static_cast<size_t>(bytes)}}, threads)[0];
      delta->bytes += bytes;  // travels whole
      continue;
    }
    absl::Status s = EncodeDeltaPieces(
        reinterpret_cast<const uint8_t*>(base[b]), reinterpret_cast<const uint8_t*>(next[b]),
        static_cast<size_t>(bytes), word, kDeltaPieceBytes, threads, &d, &(*next_crcs)[b]);
    if (!s.ok()) return s;
    if (d.size() > bytes / 2) {
      std::string().swap(d);  // travels whole
      delta->bytes += bytes;
    } else {
      d.shrink_to_fit();
      delta->bytes += d.size();
    }
  }
  return std::shared_ptr<const SnapshotDelta>(std::move(delta));
}

}  // namespace asympo::broadcast
