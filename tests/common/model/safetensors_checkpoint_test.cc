#include "common/model/safetensors_checkpoint.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo {
namespace {

namespace fs = std::filesystem;
using ::asympo::testing::DirEntries;
using ::asympo::testing::ReadFile;
using ::asympo::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Tensors = std::vector<std::pair<std::string, at::Tensor>>;
using Shapes = std::map<std::string, std::vector<int64_t>>;

class SafetensorsCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { gen_ = at::make_generator<at::CPUGeneratorImpl>(/*seed=*/99); }

  std::string Path(const std::string& name) const { return tmp_.Path(name); }
  at::Tensor Randn(at::IntArrayRef shape, at::ScalarType dtype = at::kFloat) {
    return at::randn(shape, gen_, at::TensorOptions().dtype(at::kFloat)).to(dtype);
  }
  // Five tensors of 4 KiB, 4 KiB, 2 KiB, 2 KiB and 64 bytes.
  Tensors SmallModel() {
    return {{"model.embed_tokens.weight", Randn({32, 32})},
            {"model.layers.0.mlp.up_proj.weight", Randn({32, 32})},
            {"model.layers.0.self_attn.q_proj.weight", Randn({32, 32}, at::kBFloat16)},
            {"model.layers.0.self_attn.k_proj.weight", Randn({32, 32}, at::kHalf)},
            {"model.norm.weight", Randn({16})}};
  }

  asympo::testing::ScopedTempDir tmp_{"safetensors_checkpoint_test"};
  const std::string dir_ = tmp_.path();
  at::Generator gen_;
};

TEST_F(SafetensorsCheckpointTest, ShardedRoundTripWritesTheHuggingFaceLayout) {
  const Tensors tensors = SmallModel();
  const std::string out = Path("ckpt");
  // 4 KiB + 4 KiB would pass 5 KiB: shards {embed}, {up}, {q, k, norm}.
  ASSERT_OK(WriteShardedSafetensors(out, tensors, 5 * 1024, {{"version", "3"}}));
  EXPECT_THAT(DirEntries(out),
              ElementsAre("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                          "model-00003-of-00003.safetensors", "model.safetensors.index.json"));

  const std::string index_text = ReadFile(out + "/model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(index_text);
  EXPECT_EQ(index["metadata"]["total_size"], 4096 + 4096 + 2048 + 2048 + 64);
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.layers.0.mlp.up_proj.weight"],
            "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.norm.weight"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"].size(), 5u);
  // json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers writes it.
  EXPECT_EQ(index_text.rfind("{\n  \"metadata\": {\n    \"total_size\": 12352\n  },\n", 0), 0u);
  EXPECT_EQ(index_text.back(), '\n');

  auto checkpoint = SafetensorsCheckpoint::Open(out);
  ASSERT_OK(checkpoint);
  EXPECT_TRUE((*checkpoint)->sharded());
  EXPECT_EQ((*checkpoint)->FilePaths().size(), 3u);
  EXPECT_EQ((*checkpoint)->size(), 5u);
  EXPECT_EQ((*checkpoint)->metadata().at("version"), "3");
  EXPECT_EQ((*checkpoint)->metadata().at("format"), "pt");
  EXPECT_EQ((*checkpoint)->index_metadata().at("total_size"), "12352");
  for (const auto& [name, expected] : tensors) {
    SCOPED_TRACE(name);
    auto got = (*checkpoint)->Get(name);
    ASSERT_OK(got);
    EXPECT_EQ(got->scalar_type(), expected.scalar_type());
    EXPECT_TRUE(at::equal(*got, expected));
  }
  EXPECT_TRUE(at::equal(*(*checkpoint)->Get("model.layers.0.self_attn.q_proj.weight", at::kFloat),
                        tensors[2].second.to(at::kFloat)));
  EXPECT_THAT((*checkpoint)->Get("nope"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(SafetensorsCheckpointTest, OneShardWritesModelSafetensorsWithoutIndex) {
  const std::string out = Path("ckpt");
  ASSERT_OK(WriteShardedSafetensors(out, SmallModel(), int64_t{1} << 30));
  EXPECT_THAT(DirEntries(out), ElementsAre("model.safetensors"));
  for (const std::string& path : {out, out + "/model.safetensors"}) {
    auto checkpoint = SafetensorsCheckpoint::Open(path);
    ASSERT_OK(checkpoint);
    EXPECT_FALSE((*checkpoint)->sharded());
    EXPECT_TRUE((*checkpoint)->index_metadata().empty());
    EXPECT_EQ((*checkpoint)->size(), 5u);
  }
}

TEST_F(SafetensorsCheckpointTest, TensorLargerThanTheLimitGetsItsOwnShard) {
  const std::string out = Path("ckpt");
  ASSERT_OK(WriteShardedSafetensors(out, {{"big", Randn({100})}, {"small", Randn({2})}}, 16));
  auto checkpoint = SafetensorsCheckpoint::Open(out);
  ASSERT_OK(checkpoint);
  EXPECT_EQ((*checkpoint)->FilePaths().size(), 2u);
}

TEST_F(SafetensorsCheckpointTest, RewritingInTheOtherLayoutRemovesStaleFiles) {
  const std::string out = Path("ckpt");
  ASSERT_OK(WriteShardedSafetensors(out, SmallModel(), 5 * 1024));
  ASSERT_OK(WriteShardedSafetensors(out, SmallModel(), 9 * 1024));  // 2 shards now
  EXPECT_THAT(DirEntries(out),
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                          "model.safetensors.index.json"));
  std::ofstream(out + "/config.json") << "{}";  // not ours: kept
  ASSERT_OK(WriteShardedSafetensors(out, SmallModel(), int64_t{1} << 30));
  EXPECT_THAT(DirEntries(out), ElementsAre("config.json", "model.safetensors"));
  ASSERT_OK(WriteShardedSafetensors(out, SmallModel(), 5 * 1024));
  EXPECT_THAT(DirEntries(out),
              ElementsAre("config.json", "model-00001-of-00003.safetensors",
                          "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                          "model.safetensors.index.json"));
}

TEST_F(SafetensorsCheckpointTest, WriterRejectsBadArguments) {
  EXPECT_THAT(WriteShardedSafetensors(Path("c"), SmallModel(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const absl::Status s =
      WriteShardedSafetensors(Path("c"), {{"a", Randn({1})}, {"a", Randn({1})}}, 2);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor 'a' appears twice"));
  // A bad tensor in the last shard is refused before the first is written.
  const absl::Status complex = WriteShardedSafetensors(
      Path("c"), {{"ok", Randn({64})}, {"z", at::zeros({64}, at::kComplexFloat)}}, 16);
  EXPECT_THAT(complex, StatusIs(absl::StatusCode::kInvalidArgument, "tensor 'z'"));
  EXPECT_FALSE(fs::exists(Path("c")));
}

TEST_F(SafetensorsCheckpointTest, ChecksTheExpectedTensorSet) {
  const std::string out = Path("ckpt");
  ASSERT_OK(WriteShardedSafetensors(out, SmallModel(), 5 * 1024));
  auto checkpoint = SafetensorsCheckpoint::Open(out);
  ASSERT_OK(checkpoint);
  Shapes expected;
  for (const auto& [name, tensor] : SmallModel()) expected[name] = tensor.sizes().vec();
  EXPECT_OK((*checkpoint)->CheckTensors(expected));

  expected.erase("model.norm.weight");               // unexpected in the file
  expected["lm_head.weight"] = {32, 32};             // missing from the file
  expected["model.embed_tokens.weight"] = {64, 32};  // wrong shape
  const TensorSetDiff diff = (*checkpoint)->Compare(expected);
  EXPECT_THAT(diff.missing, ElementsAre("lm_head.weight"));
  EXPECT_THAT(diff.unexpected, ElementsAre("model.norm.weight"));
  ASSERT_EQ(diff.wrong_shape.size(), 1u);
  EXPECT_THAT(diff.wrong_shape[0].actual, ElementsAre(32, 32));
  const absl::Status s = (*checkpoint)->CheckTensors(expected);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("does not match the expected tensors: 1 missing (lm_head.weight); "
                        "1 unexpected (model.norm.weight); 1 with the wrong shape "
                        "(model.embed_tokens.weight: [32, 32] in the checkpoint, [64, 32] "
                        "expected)"));
}

TEST_F(SafetensorsCheckpointTest, ListsAFewNamesWithCountsWhenManyDiffer) {
  const std::string out = Path("ckpt");
  ASSERT_OK(WriteShardedSafetensors(out, SmallModel(), int64_t{1} << 20));
  auto checkpoint = SafetensorsCheckpoint::Open(out);
  ASSERT_OK(checkpoint);
  Shapes expected;
  for (const auto& [name, tensor] : SmallModel()) expected[name] = tensor.sizes().vec();
  for (int i = 0; i < 12; ++i) expected[absl::StrCat("extra.", 10 + i)] = {1};
  const std::string message((*checkpoint)->CheckTensors(expected).message());
  EXPECT_THAT(message, HasSubstr("12 missing (extra.10, extra.11, extra.12, extra.13, extra.14 "
                                 "and 7 more)"));
}

TEST_F(SafetensorsCheckpointTest, ReportsAMissingShardNamedByTheIndex) {
  const std::string out = Path("ckpt");
  ASSERT_OK(WriteShardedSafetensors(out, SmallModel(), 5 * 1024));
  fs::remove(out + "/model-00002-of-00003.safetensors");
  const absl::Status s = SafetensorsCheckpoint::Open(out).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, "model.safetensors.index.json"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("maps 1 tensors (model.layers.0.mlp.up_proj.weight) to shard "
                        "'model-00002-of-00003.safetensors', which does not exist"));
}

TEST_F(SafetensorsCheckpointTest, RejectsAnIndexThatDisagreesWithItsShards) {
  const std::string out = Path("ckpt");
  ASSERT_OK(WriteShardedSafetensors(out, SmallModel(), 5 * 1024));
  const std::string index_path = out + "/model.safetensors.index.json";
  nlohmann::json index = nlohmann::json::parse(ReadFile(index_path));
  const nlohmann::json original = index;

  index["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors";
  std::ofstream(index_path, std::ios::trunc) << index.dump();
  absl::Status s = SafetensorsCheckpoint::Open(out).status();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("maps tensor 'model.norm.weight' to shard "
                        "'model-00001-of-00003.safetensors', which does not hold it"));

  index = original;
  index["weight_map"].erase("model.norm.weight");
  std::ofstream(index_path, std::ios::trunc) << index.dump();
  s = SafetensorsCheckpoint::Open(out).status();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("shard 'model-00003-of-00003.safetensors' holds tensor "
                        "'model.norm.weight', which the index does not list"));

  index = original;
  index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  std::ofstream(index_path, std::ios::trunc) << index.dump();
  s = SafetensorsCheckpoint::Open(out).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a plain file name"));

  std::ofstream(index_path, std::ios::trunc) << "{\"weight_map\": [";
  s = SafetensorsCheckpoint::Open(out).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "not valid JSON"));
}

TEST_F(SafetensorsCheckpointTest, ReportsADirectoryWithoutACheckpoint) {
  fs::create_directories(Path("empty"));
  absl::Status s = SafetensorsCheckpoint::Open(Path("empty")).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound,
                          "holds neither model.safetensors.index.json nor model.safetensors"));
  EXPECT_THAT(SafetensorsCheckpoint::Open(Path("absent")), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace asympo
