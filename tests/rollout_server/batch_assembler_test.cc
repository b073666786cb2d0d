#include "rollout_server/batch_assembler.h"

#include <gtest/gtest.h>

namespace asympo::rollout {
namespace {

v1::PromptGroup Group(int id, int tokens) {
  v1::PromptGroup g;
  g.set_prompt_id("p" + std::to_string(id));
  g.add_prompt_tokens(1);
  for (int r = 0; r < 2; ++r) {
    auto* resp = g.add_responses();
    for (int t = 0; t < tokens; ++t) resp->add_tokens(t);
  }
  return g;
}

TEST(BatchAssemblerTest, FillsUpToMaxGroupsKeepingOrder) {
  BatchAssembler a({"rollout-0", 3, 1 << 20});
  for (int i = 0; i < 3; ++i) {
    v1::PromptGroup g = Group(i, 4);
    EXPECT_TRUE(a.TryAdd(&g));
  }
  v1::PromptGroup fourth = Group(3, 4);
  EXPECT_FALSE(a.TryAdd(&fourth));
  EXPECT_EQ(fourth.prompt_id(), "p3") << "a group that does not fit is left untouched";
  auto batch = a.Flush();
  ASSERT_TRUE(batch.has_value());
  ASSERT_EQ(batch->groups_size(), 3);
  EXPECT_EQ(batch->source(), "rollout-0");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(batch->groups(i).prompt_id(), "p" + std::to_string(i));
  EXPECT_EQ(a.pending_groups(), 0);
  EXPECT_EQ(a.pending_bytes(), 0u);
  EXPECT_TRUE(a.TryAdd(&fourth));
}

TEST(BatchAssemblerTest, StopsBeforeItWouldExceedMaxBytesAndCountsTheWireSize) {
  v1::RolloutBatch probe;
  *probe.add_groups() = Group(0, 100);
  *probe.add_groups() = Group(1, 100);
  const size_t two = probe.ByteSizeLong();  // exactly what two groups cost on the wire
  BatchAssembler a({"", 100, two});
  v1::PromptGroup g0 = Group(0, 100), g1 = Group(1, 100), g2 = Group(2, 100);
  EXPECT_TRUE(a.TryAdd(&g0));
  EXPECT_TRUE(a.TryAdd(&g1));
  EXPECT_EQ(a.pending_bytes(), two);
  EXPECT_FALSE(a.TryAdd(&g2));  // a third would pass max_bytes
  auto batch = a.Flush();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->groups_size(), 2);
  EXPECT_LE(batch->ByteSizeLong(), two);
  EXPECT_FALSE(a.Flush().has_value());
}

TEST(BatchAssemblerTest, ALoneOversizeGroupFormsItsOwnBatch) {
  BatchAssembler a({"r", 100, 64});
  v1::PromptGroup big = Group(0, 200), small = Group(1, 1);
  EXPECT_TRUE(a.TryAdd(&big));
  EXPECT_FALSE(a.TryAdd(&small));
  auto batch = a.Flush();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->groups_size(), 1);
}

}  // namespace
}  // namespace asympo::rollout
