#include "weight_broadcaster/snapshot_manifest.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"

namespace asympo::broadcast {
namespace {

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

// numel * element size, or an error on overflow / bad dims.
absl::StatusOr<uint64_t> ByteSize(const std::string& name, v1::DType dtype,
                                  const google::protobuf::RepeatedField<int64_t>& shape) {
  const size_t elem = DTypeSize(dtype);
  if (elem == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", name, "\" has unknown dtype ", static_cast<int>(dtype)));
  }
  uint64_t bytes = elem;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\" has negative dimension ", d));
    }
    if (d != 0 && bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" is too large"));
    }
    bytes *= static_cast<uint64_t>(d);
  }
  return bytes;
}

}  // namespace

size_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return 4;
    case v1::DTYPE_BF16:
    case v1::DTYPE_F16:
      return 2;
    default:
      return 0;
  }
}

absl::StatusOr<v1::SnapshotManifest> PlanSnapshot(const std::vector<TensorSpec>& tensors,
                                                  uint64_t version, const PackingOptions& options) {
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0 ||
      options.alignment > kMaxAlignmentGap) {
    return absl::InvalidArgumentError(absl::StrCat("alignment must be a power of two up to ",
                                                   kMaxAlignmentGap, ", got ", options.alignment));
  }
  if (options.bucket_bytes == 0) {
    return absl::InvalidArgumentError("bucket_bytes must be positive");
  }
  v1::SnapshotManifest m;
  m.set_version(version);
  absl::flat_hash_set<std::string> seen;
  uint64_t used = 0;  // bytes used in the current (last) bucket
  for (const TensorSpec& spec : tensors) {
    if (spec.name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
    if (!seen.insert(spec.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", spec.name, "\" appears twice"));
    }
    v1::TensorEntry* e = m.add_tensors();
    e->set_name(spec.name);
    e->set_dtype(spec.dtype);
    e->mutable_shape()->Add(spec.shape.begin(), spec.shape.end());
    absl::StatusOr<uint64_t> bytes = ByteSize(spec.name, spec.dtype, e->shape());
    if (!bytes.ok()) return bytes.status();
    const uint64_t offset = AlignUp(used, options.alignment);
    if (m.buckets_size() == 0 || (used > 0 && offset + *bytes > options.bucket_bytes)) {
      m.add_buckets()->set_index(static_cast<uint32_t>(m.buckets_size() - 1));
      used = 0;
    }
    v1::BucketInfo* bucket = m.mutable_buckets(m.buckets_size() - 1);
    const uint64_t at = AlignUp(used, options.alignment);
    e->set_bucket(bucket->index());
    e->set_offset(at);
    e->set_size_bytes(*bytes);
    used = at + *bytes;
    bucket->set_size_bytes(used);
  }
  uint64_t total = 0;
  for (const auto& b : m.buckets()) total += b.size_bytes();
  m.set_total_bytes(total);
  m.set_model_signature(ModelSignature(tensors));
  return m;
}

absl::Status ValidateManifest(const v1::SnapshotManifest& m) {
  uint64_t total = 0;
  for (int i = 0; i < m.buckets_size(); ++i) {
    if (m.buckets(i).index() != static_cast<uint32_t>(i)) {
      return absl::InvalidArgumentError(absl::StrCat("bucket at position ", i, " has index ",
                                                     m.buckets(i).index(), "; expected ", i));
    }
    // The receiver allocates every bucket: sizes that wrap around 2^64 to
    // match total_bytes must not pass for a small snapshot.
    if (m.buckets(i).size_bytes() > std::numeric_limits<uint64_t>::max() - total) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket sizes add up to more than 2^64 bytes at bucket ", i));
    }
    total += m.buckets(i).size_bytes();
  }
  if (total != m.total_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_bytes is ", m.total_bytes(), " but the buckets hold ", total));
  }
  // Per bucket: (offset, end, tensor) spans, to find overlaps.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> spans(m.buckets_size());
  // The buckets hold the tensors and their alignment gaps, nothing more: a
  // manifest of small tensors in a huge bucket would make the receiver
  // allocate the bucket.
  uint64_t tensor_bytes = 0;
  absl::flat_hash_set<std::string> seen;
  for (const v1::TensorEntry& e : m.tensors()) {
    if (e.name().empty()) return absl::InvalidArgumentError("a tensor has an empty name");
    if (!seen.insert(e.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", e.name(), "\" appears twice"));
    }
    absl::StatusOr<uint64_t> bytes = ByteSize(e.name(), e.dtype(), e.shape());
    if (!bytes.ok()) return bytes.status();
    if (*bytes != e.size_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", e.name(), "\" declares ",
                                                     e.size_bytes(),
                                                     " bytes but its shape and "
                                                     "dtype need ",
                                                     *bytes));
    }
    if (e.bucket() >= static_cast<uint32_t>(m.buckets_size())) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", e.name(), "\" is in bucket ",
                                                     e.bucket(), " of ", m.buckets_size()));
    }
    const uint64_t cap = m.buckets(static_cast<int>(e.bucket())).size_bytes();
    if (e.offset() > cap || e.size_bytes() > cap - e.offset()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", e.name(), "\" spans bytes [",
                                                     e.offset(), ", ", e.offset() + e.size_bytes(),
                                                     ") beyond its bucket of ", cap, " bytes"));
    }
    spans[e.bucket()].emplace_back(e.offset(), e.offset() + e.size_bytes());
    tensor_bytes += e.size_bytes();  // each within its bucket, so no wrap
  }
  const uint64_t slack = static_cast<uint64_t>(m.tensors_size()) * kMaxAlignmentGap;
  if (total > tensor_bytes + slack) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the buckets hold ", total, " bytes for ", tensor_bytes, " bytes of tensors; at most ",
        kMaxAlignmentGap, " bytes of padding per tensor"));
  }
  for (size_t b = 0; b < spans.size(); ++b) {
    auto& s = spans[b];
    std::sort(s.begin(), s.end());
    for (size_t i = 1; i < s.size(); ++i) {
      if (s[i].first < s[i - 1].second) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensors overlap in bucket ", b, " at byte ", s[i].first));
      }
    }
  }
  return absl::OkStatus();
}

std::string ModelSignature(const std::vector<TensorSpec>& tensors) {
  uint32_t crc = 0;
  for (const TensorSpec& t : tensors) {
    std::string line = absl::StrCat(t.name, ":", static_cast<int>(t.dtype), ":");
    for (int64_t d : t.shape) absl::StrAppend(&line, d, ",");
    line.push_back('\n');
    crc = Crc32c(line.data(), line.size(), crc);
  }
  return absl::StrFormat("%zu-%08x", tensors.size(), crc);
}

}  // namespace asympo::broadcast
