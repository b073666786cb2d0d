#include "common/model/sharded_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo {
namespace {

using ::asympo::testing::StatusIs;

// Two parameters: "a" (3 x 4) split between two writers, "b" (6 x 1M
// floats: its pieces span several CRC blocks) on rank 1 alone.
struct Written {
  std::vector<CheckpointParam> params{{"a", {3, 4}, true}, {"b", {6, 1 << 20}, false}};
  torch::Tensor a = torch::arange(12, torch::kFloat);
  torch::Tensor a_avg = torch::arange(12, torch::kFloat) * 0.5;
  torch::Tensor a_sq = torch::arange(12, torch::kFloat) * 0.25;
  torch::Tensor b = torch::randn({6 << 20});
  uint32_t crc = 0;

  void Write(const std::string& dir) {
    std::vector<StatePiece> rank0{{StateKind::kWeight, 0, 0, a.narrow(0, 0, 5)},
                                  {StateKind::kExpAvg, 0, 0, a_avg},
                                  {StateKind::kExpAvgSq, 0, 0, a_sq}};
    std::vector<StatePiece> rank1{{StateKind::kWeight, 0, 5, a.narrow(0, 5, 7)},
                                  {StateKind::kWeight, 1, 0, b.narrow(0, 0, 3 << 20)},
                                  {StateKind::kWeight, 1, 3 << 20, b.narrow(0, 3 << 20, 3 << 20)}};
    ASSERT_OK(WriteCheckpointShard(dir, 0, 2, params, rank0, torch::ones({4}, torch::kByte)));
    ASSERT_OK(WriteCheckpointShard(dir, 1, 2, params, rank1, torch::Tensor()));
    crc = WriteCheckpointManifest(dir, 2, "full", params).value();
  }
};

TEST(ShardedCheckpointTest, AnyRangeReadsBackAcrossPiecesAndFiles) {
  asympo::testing::ScopedTempDir tmp("sharded_checkpoint_test");
  Written w;
  w.Write(tmp.path());
  auto reader = CheckpointStateReader::Open(tmp.path(), w.crc, {}).value();
  EXPECT_EQ(reader->world_size(), 2);
  EXPECT_EQ(reader->dist_shard(), "full");
  ASSERT_EQ(reader->params().size(), 2u);
  EXPECT_TRUE(reader->Find("a")->moments);
  EXPECT_FALSE(reader->Find("b")->moments);
  // Elements 3..9 of a: across rank 0's and rank 1's pieces.
  ASSERT_OK(reader->Verify(StateKind::kWeight, "a", 3, 6));
  torch::Tensor part = torch::zeros({6});
  ASSERT_OK(reader->Read(StateKind::kWeight, "a", 3, part));
  EXPECT_TRUE(torch::equal(part, w.a.narrow(0, 3, 6)));
  // A range of b across its two pieces reads only the blocks around it.
  const int64_t before = reader->bytes_read();
  ASSERT_OK(reader->Verify(StateKind::kWeight, "b", (3 << 20) - 10, 20));
  EXPECT_LE(reader->bytes_read() - before, 2 * (int64_t{4} << 20));
  torch::Tensor mid = torch::zeros({20}, torch::kDouble);  // converted on the way
  ASSERT_OK(reader->Read(StateKind::kWeight, "b", (3 << 20) - 10, mid));
  EXPECT_TRUE(torch::equal(mid, w.b.narrow(0, (3 << 20) - 10, 20).to(torch::kDouble)));
  torch::Tensor sq = torch::zeros({12});
  ASSERT_OK(reader->Read(StateKind::kExpAvgSq, "a", 0, sq));
  EXPECT_TRUE(torch::equal(sq, w.a_sq));
  EXPECT_TRUE(torch::equal(reader->Rng().value(), torch::ones({4}, torch::kByte)));
}

TEST(ShardedCheckpointTest, ACorruptBlockOrAMissingRangeIsDataLossNamingIt) {
  asympo::testing::ScopedTempDir tmp("sharded_checkpoint_test");
  Written w;
  w.Write(tmp.path());
  const std::string shard = tmp.path() + "/" + CheckpointShardFileName(1, 2);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(shard)) - 100);
    f.put('\x7f');
  }
  auto reader = CheckpointStateReader::Open(tmp.path(), w.crc, {}).value();
  ASSERT_OK(reader->Verify(StateKind::kWeight, "b", 0, 100));  // far from the flipped byte
  EXPECT_THAT(reader->Verify(StateKind::kWeight, "b", (6 << 20) - 5, 5),
              StatusIs(absl::StatusCode::kDataLoss, "does not match its CRC-32C"));
  EXPECT_THAT(reader->Verify(StateKind::kExpAvg, "b", 0, 1),
              StatusIs(absl::StatusCode::kDataLoss, "lacks elements 0..1 of b's exp_avg"));
  // A manifest that meta.json's CRC does not vouch for is refused.
  EXPECT_THAT(CheckpointStateReader::Open(tmp.path(), w.crc + 1, {}).status(),
              StatusIs(absl::StatusCode::kDataLoss, "does not match meta.json's crc32c"));
  // And a shard of another size than the manifest says.
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 4);
  EXPECT_THAT(CheckpointStateReader::Open(tmp.path(), w.crc, {}).status(),
              StatusIs(absl::StatusCode::kDataLoss, "past the end of the file"));
}

TEST(ShardedCheckpointTest, AMissingRanksIndexFailsTheManifest) {
  asympo::testing::ScopedTempDir tmp("sharded_checkpoint_test");
  std::vector<CheckpointParam> params{{"a", {2}, false}};
  ASSERT_OK(WriteCheckpointShard(tmp.path(), 0, 2, params,
                                 {{StateKind::kWeight, 0, 0, torch::ones({1})}}, torch::Tensor()));
  EXPECT_THAT(WriteCheckpointManifest(tmp.path(), 2, "none", params).status(),
              StatusIs(absl::StatusCode::kDataLoss, "rank 1's part"));
  EXPECT_THAT(WriteCheckpointShard(tmp.path(), 1, 2, params,
                                   {{StateKind::kWeight, 0, 1, torch::ones({2})}}, torch::Tensor()),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside its parameter"));
}

}  // namespace
}  // namespace asympo
