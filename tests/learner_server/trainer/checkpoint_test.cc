#include "learner_server/trainer/checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "common/model/safetensors.h"
#include "learner_server/trainer/trainer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_policy.h"

namespace asympo::learner {
namespace {

using ::asympo::testing::StatusIs;

std::unique_ptr<PolicyModel> Tiny(uint64_t seed) { return ::asympo::testing::TinyPolicy(32, seed); }

std::vector<QueuedGroup> CheckpointGroups() {
  std::vector<QueuedGroup> out;
  for (int g = 0; g < 3; ++g) {
    QueuedGroup q;
    q.group.add_prompt_tokens(1 + g);
    for (int r = 0; r < 3; ++r) {
      v1::Response* resp = q.group.add_responses();
      resp->add_tokens(4 + r + g);
      resp->add_tokens(9);
      resp->set_reward(r == g % 3 ? 1.0f : 0.0f);
    }
    out.push_back(q);
  }
  return out;
}

TrainerOptions CheckpointOptions() {
  TrainerOptions o;
  o.lr.peak_lr = 1e-2;
  return o;
}

void ExpectSameWeights(const PolicyModel& a, const PolicyModel& b) {
  for (size_t i = 0; i < a.named_parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(a.named_parameters()[i].second, b.named_parameters()[i].second))
        << a.named_parameters()[i].first;
  }
}

TEST(CheckpointTest, KillAndRestartResumesWeightsAndOptimizerBitExactly) {
  asympo::testing::ScopedTempDir tmp("checkpoint_test");
  // Run A: two steps, checkpoint, two more steps.
  auto a = Tiny(1);
  auto ta = Trainer::Create(CheckpointOptions(), a.get(), nullptr).value();
  ASSERT_OK(ta->Step(CheckpointGroups()));
  ASSERT_OK(ta->Step(CheckpointGroups()));
  const auto saved =
      SaveCheckpoint(tmp.path(), ta->version(), *a, ta->optimizer(), "--objective=asympo");
  ASSERT_OK(saved);
  const torch::Tensor draw_a = torch::rand({4});  // the CPU generator moves on after the save
  ASSERT_OK(ta->Step(CheckpointGroups()));
  ASSERT_OK(ta->Step(CheckpointGroups()));

  // Run B: a fresh process would start from other weights; restore, replay.
  auto b = Tiny(99);
  auto tb = Trainer::Create(CheckpointOptions(), b.get(), nullptr).value();
  const auto loaded = LoadLatestCheckpoint(tmp.path(), b.get(), &tb->optimizer());
  ASSERT_OK(loaded);
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->version, 2u);
  EXPECT_EQ((*loaded)->config, "--objective=asympo");
  tb->set_version((*loaded)->version);
  EXPECT_TRUE(torch::equal(torch::rand({4}), draw_a));  // RNG state restored
  ASSERT_OK(tb->Step(CheckpointGroups()));
  ASSERT_OK(tb->Step(CheckpointGroups()));
  EXPECT_EQ(tb->version(), ta->version());
  ExpectSameWeights(*a, *b);
  EXPECT_EQ(tb->optimizer().step_count(), ta->optimizer().step_count());
}

// Names under `root` other than the checkpoints' own (leftovers).
std::vector<std::string> Entries(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The final checkpoint at shutdown saves a version already saved: the new
// save replaces the old whole (exchanged in one rename), and nothing is left
// beside it.
TEST(CheckpointTest, SavingAVersionAgainReplacesIt) {
  asympo::testing::ScopedTempDir tmp("checkpoint_test");
  auto a = Tiny(1), b = Tiny(2);
  auto ta = Trainer::Create(CheckpointOptions(), a.get(), nullptr).value();
  auto tb = Trainer::Create(CheckpointOptions(), b.get(), nullptr).value();
  ASSERT_OK(SaveCheckpoint(tmp.path(), 3, *a, ta->optimizer(), "--first"));
  ASSERT_OK(SaveCheckpoint(tmp.path(), 3, *b, tb->optimizer(), "--second"));
  EXPECT_EQ(Entries(tmp.path()), std::vector<std::string>{"ckpt-000000000003"});
  auto c = Tiny(9);
  auto tc = Trainer::Create(CheckpointOptions(), c.get(), nullptr).value();
  const auto loaded = LoadLatestCheckpoint(tmp.path(), c.get(), &tc->optimizer());
  ASSERT_OK(loaded);
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->config, "--second");
  ExpectSameWeights(*b, *c);
}

// Without the exchange (a filesystem that lacks it), the old directory is
// set aside first. A kill between the two renames leaves it aside with no
// ckpt-<version>: the next restore puts it back and loads it; one left
// beside its replacement is removed.
TEST(CheckpointTest, ACommitInterruptedWithoutTheExchangeRestoresTheOldCheckpoint) {
  asympo::testing::ScopedTempDir tmp("checkpoint_test");
  const std::string root = tmp.path();
  auto a = Tiny(1), b = Tiny(2);
  auto ta = Trainer::Create(CheckpointOptions(), a.get(), nullptr).value();
  auto tb = Trainer::Create(CheckpointOptions(), b.get(), nullptr).value();
  ASSERT_OK(SaveCheckpoint(root + "/b", 3, *b, tb->optimizer(), "--second"));
  ASSERT_OK(SaveCheckpoint(root, 3, *a, ta->optimizer(), "--first"));
  const std::string dir = root + "/ckpt-000000000003", old = root + "/.old-ckpt-000000000003-1f";
  // The replacement path, whole.
  ASSERT_OK(CommitCheckpointDirectory(root + "/b/ckpt-000000000003", dir, old, /*exchange=*/false));
  EXPECT_EQ(Entries(root), (std::vector<std::string>{"b", "ckpt-000000000003"}));
  // Killed after the first rename: only the old one, aside.
  std::filesystem::rename(dir, old);
  auto c = Tiny(9);
  auto tc = Trainer::Create(CheckpointOptions(), c.get(), nullptr).value();
  auto loaded = LoadLatestCheckpoint(root, c.get(), &tc->optimizer());
  ASSERT_OK(loaded);
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->config, "--second");
  ExpectSameWeights(*b, *c);
  EXPECT_EQ(Entries(root), (std::vector<std::string>{"b", "ckpt-000000000003"}));
  // Killed after both renames, before the removal: the aside one goes.
  ASSERT_OK(SaveCheckpoint(root + "/b", 3, *a, ta->optimizer(), "--third"));
  std::filesystem::rename(root + "/b/ckpt-000000000003", old);
  loaded = LoadLatestCheckpoint(root, c.get(), &tc->optimizer());
  ASSERT_OK(loaded);
  EXPECT_EQ((*loaded)->config, "--second");
  EXPECT_EQ(Entries(root), (std::vector<std::string>{"b", "ckpt-000000000003"}));
}

// A checkpoint of the layout before every rank wrote its part: one
// state.safetensors (weights by name, moments by parameter index) whose
// CRC-32C meta.json records. It still loads, moments and all.
TEST(CheckpointTest, ACheckpointOfTheOldLayoutStillLoads) {
  asympo::testing::ScopedTempDir tmp("checkpoint_test");
  auto a = Tiny(1);
  auto ta = Trainer::Create(CheckpointOptions(), a.get(), nullptr).value();
  ASSERT_OK(ta->Step(CheckpointGroups()));
  const std::string dir = tmp.Path("ckpt-000000000001");
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : a->named_parameters()) tensors.emplace_back(name, t.detach());
  for (const auto& [name, t] : ta->optimizer().StateTensors()) {
    tensors.emplace_back("__optimizer__." + name, t);
  }
  ASSERT_OK(WriteSafetensors(dir + "/state.safetensors", tensors));
  const uint32_t crc = CheckpointFileCrc(dir + "/state.safetensors").value();
  std::ofstream(dir + "/meta.json")
      << "{\"version\": 1, \"optimizer_steps\": 1, \"crc32c\": " << crc
      << ", \"config\": \"--old\"}";
  auto b = Tiny(99);
  auto tb = Trainer::Create(CheckpointOptions(), b.get(), nullptr).value();
  const auto loaded = LoadLatestCheckpoint(tmp.path(), b.get(), &tb->optimizer()).value();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->config, "--old");
  ExpectSameWeights(*a, *b);
  ASSERT_EQ(tb->optimizer().StateTensors().size(), ta->optimizer().StateTensors().size());
  for (size_t i = 0; i < ta->optimizer().exp_avg().size(); ++i) {
    ASSERT_EQ(tb->optimizer().exp_avg()[i].defined(), ta->optimizer().exp_avg()[i].defined());
    if (!ta->optimizer().exp_avg()[i].defined()) continue;
    EXPECT_TRUE(torch::equal(tb->optimizer().exp_avg()[i], ta->optimizer().exp_avg()[i]));
    EXPECT_TRUE(torch::equal(tb->optimizer().exp_avg_sq()[i], ta->optimizer().exp_avg_sq()[i]));
  }
  EXPECT_EQ(tb->optimizer().step_count(), 1);
  // asympo-eval's reader too.
  const auto contents = ReadCheckpointDirectory(dir).value();
  EXPECT_EQ(contents.weights.size(), a->named_parameters().size());
}

TEST(CheckpointTest, ACorruptNewestCheckpointIsSkippedForTheOlderOne) {
  asympo::testing::ScopedTempDir tmp("checkpoint_test");
  auto m = Tiny(1);
  auto t = Trainer::Create(CheckpointOptions(), m.get(), nullptr).value();
  ASSERT_OK(t->Step(CheckpointGroups()));
  ASSERT_OK(SaveCheckpoint(tmp.path(), 1, *m, t->optimizer(), ""));
  auto snapshot = Tiny(1);
  ASSERT_OK(snapshot->LoadParameters(m->named_parameters()));
  ASSERT_OK(t->Step(CheckpointGroups()));
  const auto newest = SaveCheckpoint(tmp.path(), 2, *m, t->optimizer(), "").value();
  // Flip one byte near the end of the newest shard's data.
  {
    const std::string shard = newest.path + "/shard-00000-of-00001.safetensors";
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(shard)) - 3000);
    f.put('\x7f');
  }
  auto restored = Tiny(5);
  AdamW opt(restored->parameters(), {});
  const auto loaded = LoadLatestCheckpoint(tmp.path(), restored.get(), &opt).value();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->version, 1u);
  ExpectSameWeights(*restored, *snapshot);
}

TEST(CheckpointTest, ATruncatedCheckpointIsSkippedAndOldOnesArePruned) {
  asympo::testing::ScopedTempDir tmp("checkpoint_test");
  auto m = Tiny(1);
  AdamW opt(m->parameters(), {});
  for (uint64_t v = 1; v <= 4; ++v) ASSERT_OK(SaveCheckpoint(tmp.path(), v, *m, opt, "", 2));
  const auto all = ListCheckpoints(tmp.path());
  ASSERT_EQ(all.size(), 2u);  // keep_last = 2
  std::filesystem::resize_file(all[0] + "/shard-00000-of-00001.safetensors", 100);
  std::filesystem::create_directories(tmp.Path(".tmp-ckpt-000000000005-1"));  // a crashed save
  const auto loaded = LoadLatestCheckpoint(tmp.path(), m.get(), &opt).value();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->version, 3u);
  EXPECT_FALSE(std::filesystem::exists(tmp.Path(".tmp-ckpt-000000000005-1")));
  EXPECT_FALSE(LoadLatestCheckpoint(tmp.Path("none"), m.get(), &opt).value().has_value());
}

std::vector<std::string> IdsOf(const std::vector<CheckpointBatch>& batches) {
  std::vector<std::string> out;
  for (const CheckpointBatch& b : batches) out.push_back(b.id);
  return out;
}

TEST(CheckpointTest, TrainedBatchesRoundTripAndAMalformedListSkipsTheCheckpoint) {
  asympo::testing::ScopedTempDir tmp("checkpoint_test");
  auto m = Tiny(1);
  AdamW opt(m->parameters(), {});
  const std::string digest(32, '\xa5');
  const std::vector<CheckpointBatch> batches = {{"rollout-0/00ab/0", digest, 3, {0, 2}, "gen-1"},
                                                {"vllm \"3\"/\u00e9/17", digest, 1, {0}},
                                                {"", "", 0, {}, ""}};
  ASSERT_OK(SaveCheckpoint(tmp.path(), 1, *m, opt, "", 0, batches));
  const auto newest =
      SaveCheckpoint(tmp.path(), 2, *m, opt, "", 0, {CheckpointBatch{"x", "", 2, {1}}}).value();
  auto loaded = LoadLatestCheckpoint(tmp.path(), m.get(), &opt).value();
  ASSERT_TRUE(loaded.has_value());
  ASSERT_EQ(IdsOf(loaded->batches), std::vector<std::string>{"x"});
  EXPECT_EQ(loaded->batches[0].trained, std::vector<int32_t>{1});
  // A meta.json whose batches are malformed is not trusted.
  {
    std::ifstream in(newest.path + "/meta.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"trained\": [\n        1\n      ]");
    ASSERT_NE(at, std::string::npos) << text;
    text.replace(at, std::string("\"trained\": [\n        1\n      ]").size(), "\"trained\": [2]");
    std::ofstream(newest.path + "/meta.json", std::ios::trunc) << text;
  }
  loaded = LoadLatestCheckpoint(tmp.path(), m.get(), &opt).value();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->version, 1u);
  ASSERT_EQ(IdsOf(loaded->batches), IdsOf(batches));
  EXPECT_EQ(loaded->batches[0].digest, digest);
  EXPECT_EQ(loaded->batches[0].groups, 3);
  EXPECT_EQ(loaded->batches[0].trained, (std::vector<int32_t>{0, 2}));
  // The principal, when the batch had one (an older checkpoint's have none).
  EXPECT_EQ(loaded->batches[0].principal, std::optional<std::string>("gen-1"));
  EXPECT_FALSE(loaded->batches[1].principal.has_value());
  EXPECT_EQ(loaded->batches[2].principal, std::optional<std::string>(""));
  EXPECT_FALSE(ParseCheckpointMeta(
                   R"({"version": 4, "optimizer_steps": 4, "crc32c": 1,
                       "batches": [{"id": "a", "principal": 7}]})",
                   "m")
                   .ok());
}

TEST(CheckpointTest, AnOlderCheckpointsBatchIdsReadAsIdsWithoutDigests) {
  const auto meta = ParseCheckpointMeta(
      R"({"version": 4, "optimizer_steps": 4, "crc32c": 1, "batch_ids": ["a", "b"]})", "m");
  ASSERT_OK(meta.status());
  ASSERT_EQ(IdsOf(meta->batches), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(meta->batches[0].digest.empty());
  EXPECT_THAT(ParseCheckpointMeta(R"({"version": 4, "optimizer_steps": 4, "crc32c": 1,
      "batches": [{"id": "a", "digest": "zz"}]})",
                                  "m")
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, "batches[0]: digest is not 64 hex digits"));
}

// meta.json numbers that do not fit their fields were read modulo 2^n: a
// crc32c of 2^32 plus the true CRC passed the check, and an optimizer_steps
// of 2^63 became a negative step count (the properties of
// tests/fuzz/checkpoint_meta_fuzz.cc). Such a checkpoint is now skipped.
TEST(CheckpointTest, AMetaJsonWhoseNumbersDoNotFitTheirFieldsSkipsTheCheckpoint) {
  asympo::testing::ScopedTempDir tmp("checkpoint_test");
  auto m = Tiny(1);
  AdamW opt(m->parameters(), {});
  ASSERT_OK(SaveCheckpoint(tmp.path(), 1, *m, opt, "", 0));
  const auto newest = SaveCheckpoint(tmp.path(), 2, *m, opt, "", 0).value();
  nlohmann::json meta;
  std::ifstream(newest.path + "/meta.json") >> meta;
  const auto rewrite = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json changed = meta;
    changed[key] = value;
    std::ofstream(newest.path + "/meta.json", std::ios::trunc) << changed.dump(2);
  };
  for (const auto& [key, value] :
       {std::pair<const char*, nlohmann::json>{
            "crc32c", meta["crc32c"].get<uint64_t>() + (uint64_t{1} << 32)},
        {"optimizer_steps", uint64_t{1} << 63},
        {"optimizer_steps", -1}}) {
    rewrite(key, value);
    const auto loaded = LoadLatestCheckpoint(tmp.path(), m.get(), &opt).value();
    ASSERT_TRUE(loaded.has_value());
    EXPECT_EQ(loaded->version, 1u) << key << " " << value.dump();
  }
  rewrite("version", 2);  // the file as written loads again
  EXPECT_EQ(LoadLatestCheckpoint(tmp.path(), m.get(), &opt).value()->version, 2u);
}

// The reward monitor's state (learner_server/reward_monitor.h) rides in
// meta.json, so that a resumed learner keeps the reward peak it had.
TEST(CheckpointTest, TheRewardMonitorsStateRoundTrips) {
  asympo::testing::ScopedTempDir tmp("checkpoint_test");
  auto m = Tiny(1);
  AdamW opt(m->parameters(), {});
  ASSERT_OK(SaveCheckpoint(tmp.path(), 1, *m, opt, "", 0));
  const std::string state = R"({"fleet":{"peak":0.9,"suspected":true},"step":7})";
  ASSERT_OK(SaveCheckpoint(tmp.path(), 2, *m, opt, "", 0, {}, state));
  const auto loaded = LoadLatestCheckpoint(tmp.path(), m.get(), &opt).value();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(nlohmann::json::parse(loaded->reward_monitor), nlohmann::json::parse(state));
  EXPECT_THAT(ParseCheckpointMeta(R"({"version": 1, "optimizer_steps": 1, "crc32c": 1,
      "reward_monitor": [1]})",
                                  "m")
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, "m: reward_monitor is not an object"));
  EXPECT_EQ(ParseCheckpointMeta(R"({"version": 1, "optimizer_steps": 1, "crc32c": 1})", "m")
                ->reward_monitor,
            "");
  EXPECT_FALSE(SaveCheckpoint(tmp.path(), 3, *m, opt, "", 0, {}, "[1]").ok());
}

}  // namespace
}  // namespace asympo::learner
