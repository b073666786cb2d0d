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

TEST(BatchAssemblerTest, ClosesABatchAtMaxGroupsKeepingOrder) {
  BatchAssembler a({"rollout-0", 3, 1 << 20});
  EXPECT_FALSE(a.Add(Group(0, 4)).has_value());
  EXPECT_FALSE(a.Add(Group(1, 4)).has_value());
  auto batch = a.Add(Group(2, 4));
  ASSERT_TRUE(batch.has_value());
  ASSERT_EQ(batch->groups_size(), 3);
  EXPECT_EQ(batch->source(), "rollout-0");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(batch->groups(i).prompt_id(), "p" + std::to_string(i));
  EXPECT_EQ(a.pending_groups(), 0);
}

TEST(BatchAssemblerTest, ClosesABatchBeforeItWouldExceedMaxBytes) {
  const size_t group_bytes = Group(0, 100).ByteSizeLong() + 6;
  BatchAssembler a({"r", 100, group_bytes * 2 + 10});
  EXPECT_FALSE(a.Add(Group(0, 100)).has_value());
  EXPECT_FALSE(a.Add(Group(1, 100)).has_value());
  auto batch = a.Add(Group(2, 100));  // a third would pass max_bytes
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->groups_size(), 2);
  EXPECT_LE(batch->ByteSizeLong(), group_bytes * 2 + 10);
  EXPECT_EQ(a.pending_groups(), 1);
  auto rest = a.Flush();
  ASSERT_TRUE(rest.has_value());
  EXPECT_EQ(rest->groups(0).prompt_id(), "p2");
  EXPECT_FALSE(a.Flush().has_value());
}

TEST(BatchAssemblerTest, ALoneOversizeGroupFormsItsOwnBatch) {
  BatchAssembler a({"r", 100, 64});
  auto batch = a.Add(Group(0, 200));
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->groups_size(), 1);
}

}  // namespace
}  // namespace asympo::rollout
