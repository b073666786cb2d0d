#include "weight_broadcaster/snapshot_manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace asympo::broadcast {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<TensorSpec> Model() {
  return {{"embed", v1::DTYPE_BF16, {1000, 64}},  // 128000 bytes
          {"norm", v1::DTYPE_F32, {64}},          // 256
          {"proj", v1::DTYPE_F32, {64, 300}},     // 76800
          {"scalar", v1::DTYPE_F16, {}},          // 2
          {"head", v1::DTYPE_F32, {64, 1000}}};   // 256000
}

TEST(SnapshotManifestTest, PacksInOrderIntoAlignedBucketsWithoutSplittingTensors) {
  PackingOptions o;
  o.bucket_bytes = 200000;
  o.alignment = 64;
  const v1::SnapshotManifest m = PlanSnapshot(Model(), 7, o).value();
  EXPECT_EQ(m.version(), 7u);
  ASSERT_EQ(m.tensors_size(), 5);
  // embed + norm fit bucket 0; proj would overflow it; head is oversize.
  EXPECT_EQ(m.tensors(0).bucket(), 0u);
  EXPECT_EQ(m.tensors(0).offset(), 0u);
  EXPECT_EQ(m.tensors(1).bucket(), 0u);
  EXPECT_EQ(m.tensors(1).offset(), 128000u);
  EXPECT_EQ(m.tensors(2).bucket(), 1u);
  EXPECT_EQ(m.tensors(2).offset(), 0u);
  EXPECT_EQ(m.tensors(3).bucket(), 1u);
  EXPECT_EQ(m.tensors(3).offset(), 76800u);
  EXPECT_EQ(m.tensors(3).size_bytes(), 2u);
  EXPECT_EQ(m.tensors(4).bucket(), 2u);
  ASSERT_EQ(m.buckets_size(), 3);
  EXPECT_EQ(m.buckets(0).size_bytes(), 128256u);
  EXPECT_EQ(m.buckets(1).size_bytes(), 76802u);
  EXPECT_EQ(m.buckets(2).size_bytes(), 256000u);
  EXPECT_EQ(m.total_bytes(), 128256u + 76802u + 256000u);
  for (const auto& t : m.tensors()) EXPECT_EQ(t.offset() % 64, 0u) << t.name();
  EXPECT_OK(ValidateManifest(m));
}

TEST(SnapshotManifestTest, RejectsBadTensorsAndOptions) {
  auto specs = Model();
  specs.push_back(specs[1]);
  EXPECT_THAT(PlanSnapshot(specs, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor \"norm\" appears twice"));
  EXPECT_THAT(PlanSnapshot({{"x", v1::DTYPE_UNSPECIFIED, {2}}}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor \"x\" has unknown dtype"));
  EXPECT_THAT(PlanSnapshot({{"x", v1::DTYPE_F32, {2, -1}}}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative dimension -1"));
  PackingOptions o;
  o.alignment = 48;
  EXPECT_THAT(PlanSnapshot(Model(), 1, o),
              StatusIs(absl::StatusCode::kInvalidArgument, "alignment must be a power of two"));
}

TEST(SnapshotManifestTest, ValidationCatchesCorruptManifests) {
  const v1::SnapshotManifest good = PlanSnapshot(Model(), 3).value();
  v1::SnapshotManifest m = good;
  m.mutable_tensors(2)->set_offset(100);  // overlaps embed
  EXPECT_THAT(ValidateManifest(m),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensors overlap in bucket 0"));
  m = good;
  m.mutable_tensors(4)->set_size_bytes(4);
  EXPECT_THAT(ValidateManifest(m),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor \"head\" declares 4 bytes"));
  m = good;
  m.mutable_tensors(4)->set_offset(m.buckets(0).size_bytes());
  EXPECT_THAT(ValidateManifest(m),
              StatusIs(absl::StatusCode::kInvalidArgument, "beyond its bucket"));
  m = good;
  m.mutable_tensors(0)->set_bucket(9);
  EXPECT_THAT(ValidateManifest(m),
              StatusIs(absl::StatusCode::kInvalidArgument, "is in bucket 9 of 1"));
  m = good;
  m.set_total_bytes(1);
  EXPECT_THAT(ValidateManifest(m),
              StatusIs(absl::StatusCode::kInvalidArgument, "total_bytes is 1"));
  m = good;
  m.mutable_buckets(0)->set_index(4);
  EXPECT_THAT(ValidateManifest(m),
              StatusIs(absl::StatusCode::kInvalidArgument, "has index 4; expected 0"));
}

// Two buckets of 2^63 bytes and total_bytes 0 passed, and a receiver then
// tried to allocate both (found in review with the property that
// tests/fuzz/snapshot_manifest_fuzz.cc checks; its corpus keeps the input).
TEST(SnapshotManifestTest, ValidationRejectsBucketSizesThatWrapAround) {
  v1::SnapshotManifest m;
  m.add_buckets()->set_size_bytes(uint64_t{1} << 63);
  m.add_buckets()->set_size_bytes(uint64_t{1} << 63);
  m.mutable_buckets(1)->set_index(1);
  m.set_total_bytes(0);
  EXPECT_THAT(ValidateManifest(m),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "bucket sizes add up to more than 2^64 bytes at bucket 1"));
  m.set_total_bytes(uint64_t{1} << 63);
  m.mutable_buckets(1)->set_size_bytes(0);
  // Consistent now, but 2^63 bytes of buckets for no tensor at all.
  EXPECT_THAT(ValidateManifest(m), StatusIs(absl::StatusCode::kInvalidArgument,
                                            "at most 4096 bytes of padding per tensor"));
}

// A receiver allocates every bucket: buckets much larger than the tensors
// they hold (a 1 TiB bucket for a small model) are refused.
TEST(SnapshotManifestTest, ValidationRejectsBucketsLargerThanTheirTensors) {
  v1::SnapshotManifest m = PlanSnapshot(Model(), 1).value();
  ASSERT_OK(ValidateManifest(m));
  const uint64_t tib = uint64_t{1} << 40;
  m.mutable_buckets(0)->set_size_bytes(m.buckets(0).size_bytes() + tib);
  m.set_total_bytes(m.total_bytes() + tib);
  EXPECT_THAT(ValidateManifest(m),
              StatusIs(absl::StatusCode::kInvalidArgument, "bytes of padding per tensor"));
  PackingOptions wide;
  wide.alignment = 8192;
  EXPECT_THAT(PlanSnapshot(Model(), 1, wide),
              StatusIs(absl::StatusCode::kInvalidArgument, "alignment must be a power of two"));
  wide.alignment = 4096;
  EXPECT_OK(ValidateManifest(PlanSnapshot(Model(), 1, wide).value()));
}

TEST(SnapshotManifestTest, SignatureChangesWithAnyNameShapeOrDtype) {
  const std::string base = ModelSignature(Model());
  EXPECT_EQ(ModelSignature(Model()), base);
  auto renamed = Model();
  renamed[2].name = "proj2";
  auto reshaped = Model();
  reshaped[2].shape = {300, 64};
  auto retyped = Model();
  retyped[0].dtype = v1::DTYPE_F16;
  EXPECT_NE(ModelSignature(renamed), base);
  EXPECT_NE(ModelSignature(reshaped), base);
  EXPECT_NE(ModelSignature(retyped), base);
  EXPECT_EQ(PlanSnapshot(Model(), 1).value().model_signature(), base);
}

}  // namespace
}  // namespace asympo::broadcast
