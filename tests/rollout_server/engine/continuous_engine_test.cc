#include "rollout_server/engine/continuous_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "tests/rollout_server/engine/generation_test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_policy.h"

namespace asympo::rollout {
namespace {

using ::asympo::testing::StatusIs;

std::unique_ptr<PolicyModel> TinyEngineModel(uint64_t seed = 11) {
  return ::asympo::testing::TinyPolicy(64, seed, 0.3);
}

std::unique_ptr<ContinuousEngine> Engine(const PolicyModel& m, ContinuousOptions o) {
  return ContinuousEngine::Create(&m, 0, o).value();
}

ContinuousOptions Slots(int32_t n) {
  ContinuousOptions o;
  o.max_running_sequences = n;
  return o;
}

// Groups of `g` requests per prompt, lengths from 1 to 17 new tokens,
// greedy and sampled (with and without top-k/top-p), stop ids on some.
std::vector<GenerationRequest> Mixed(int groups, int g) {
  std::vector<GenerationRequest> rs;
  for (int p = 0; p < groups; ++p) {
    for (int i = 0; i < g; ++i) {
      GenerationRequest r;
      for (int t = 0; t <= (p * 5) % 7; ++t) r.prompt.push_back((p * 13 + t * 7) % 64);
      r.params.max_new_tokens = 1 + (p * 7 + i * 5) % 17;
      r.params.seed = 1000 + static_cast<uint64_t>(p * g + i);
      r.params.temperature = p % 3 == 0 ? 0.0 : 1.0;
      r.params.top_k = p % 3 == 2 ? 12 : 0;
      r.params.top_p = p % 3 == 2 ? 0.9 : 1.0;
      if (p % 2 == 1) r.params.stop_token_ids = {5, 17, 33};
      r.params.return_logprobs = true;
      rs.push_back(r);
    }
  }
  return rs;
}

TEST(ContinuousEngineTest, EqualsFullRecompute) {
  const auto m = TinyEngineModel();
  auto engine = Engine(*m, Slots(3));
  const auto reqs = Mixed(3, 2);
  ASSERT_OK_AND_ASSIGN(const auto got, engine->Generate(reqs));
  ASSERT_EQ(got.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerationResult ref = Recompute(*m, reqs[i]);
    EXPECT_EQ(got[i].tokens, ref.tokens) << "request " << i;
    ASSERT_EQ(got[i].logprobs.size(), ref.logprobs.size()) << i;
    for (size_t j = 0; j < ref.logprobs.size(); ++j) {
      EXPECT_NEAR(got[i].logprobs[j], ref.logprobs[j], 1e-4) << i << "," << j;
    }
  }
}

TEST(ContinuousEngineTest, ARequestGetsTheSameTokensAloneAsInABusyEngine) {
  const auto m = TinyEngineModel();
  const auto reqs = Mixed(6, 4);  // 24 requests through 5 slots
  auto busy = Engine(*m, Slots(5));
  ASSERT_OK_AND_ASSIGN(const auto together, busy->Generate(reqs));
  EXPECT_EQ(busy->stats().finished, 24);
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto alone = Engine(*m, Slots(5));
    ASSERT_OK_AND_ASSIGN(const auto one, alone->Generate({reqs[i]}));
    EXPECT_EQ(together[i].tokens, one[0].tokens) << "request " << i;
    EXPECT_EQ(together[i].finish_reason, one[0].finish_reason) << i;
  }
}

TEST(ContinuousEngineTest, SharedPromptsDecodeAsIndependentOnesWithOnePrefillPerGroup) {
  const auto m = TinyEngineModel();
  const auto reqs = Mixed(4, 4);
  ContinuousOptions shared = Slots(8), separate = Slots(8);
  separate.share_prompts = false;
  auto a = Engine(*m, shared), b = Engine(*m, separate);
  ASSERT_OK_AND_ASSIGN(const auto ra, a->Generate(reqs));
  ASSERT_OK_AND_ASSIGN(const auto rb, b->Generate(reqs));
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(ra[i].tokens, rb[i].tokens) << i;
    ASSERT_EQ(ra[i].logprobs.size(), rb[i].logprobs.size());
    for (size_t j = 0; j < ra[i].logprobs.size(); ++j) {
      EXPECT_NEAR(ra[i].logprobs[j], rb[i].logprobs[j], 1e-5);
    }
  }
  EXPECT_EQ(b->stats().prefills, 16);
  // Two groups of 4 fit the 8 slots at once; a group's prompt is pre-filled
  // again only if it was released (all of its running sequences finished)
  // before its last member started.
  EXPECT_LE(a->stats().prefills, 6);
  EXPECT_LT(a->stats().prompt_rows_peak, b->stats().prompt_rows_peak);
}

TEST(ContinuousEngineTest, FinishedSlotsAreRefilledAtOnce) {
  const auto m = TinyEngineModel();
  std::vector<GenerationRequest> reqs(9);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt = {static_cast<int32_t>(i + 1), 7};
    reqs[i].params.temperature = 0;
    reqs[i].params.max_new_tokens = i == 0 ? 40 : 4;  // one long, eight short
  }
  auto engine = Engine(*m, Slots(3));
  ASSERT_OK(engine->Generate(reqs).status());
  // The long one runs 40 steps while the two other slots take the short
  // ones, four at a time: 4 rounds of 4 steps = 16 < 40.
  EXPECT_EQ(engine->stats().decode_steps, 40);
  EXPECT_EQ(engine->stats().generated_tokens, 40 + 8 * 4);
}

TEST(ContinuousEngineTest, AWeightSwapChangesTokensOnlyAfterTheSwapStep) {
  const auto a = TinyEngineModel(11), b = TinyEngineModel(12);
  GenerationRequest r;
  r.prompt = {3, 4, 5};
  r.params.temperature = 0;
  r.params.max_new_tokens = 12;
  ASSERT_OK_AND_ASSIGN(const auto only_a, Engine(*a, Slots(2))->Generate({r}));
  ASSERT_OK_AND_ASSIGN(const auto only_b, Engine(*b, Slots(2))->Generate({r}));

  // Swapped before the first step: all of it is b's.
  auto early = Engine(*a, Slots(2));
  early->SetModel(b.get(), 7);
  ASSERT_OK_AND_ASSIGN(const auto all_b, early->Generate({r}));
  EXPECT_EQ(all_b[0].tokens, only_b[0].tokens);
  EXPECT_EQ(all_b[0].first_version, 7u);
  EXPECT_EQ(all_b[0].last_version, 7u);

  // Swapped after step 4 (tokens 0..3 sampled): token 4 is still sampled
  // from logits a computed, later ones from b's forward passes.
  constexpr size_t kSwap = 4;
  auto mid = Engine(*a, Slots(2));
  ASSERT_OK(mid->Add(r).status());
  for (size_t s = 0; s < kSwap; ++s) ASSERT_OK(mid->Step().status());
  mid->SetModel(b.get(), 1);
  std::vector<ContinuousEngine::Finished> done;
  while (!mid->idle()) {
    ASSERT_OK_AND_ASSIGN(auto f, mid->Step());
    for (auto& x : f) done.push_back(std::move(x));
  }
  ASSERT_EQ(done.size(), 1u);
  const auto& got = done[0].result;
  ASSERT_EQ(got.tokens.size(), 12u);
  for (size_t j = 0; j <= kSwap; ++j) EXPECT_EQ(got.tokens[j], only_a[0].tokens[j]) << j;
  EXPECT_NE(std::vector<int32_t>(got.tokens.begin() + kSwap + 1, got.tokens.end()),
            std::vector<int32_t>(only_a[0].tokens.begin() + kSwap + 1, only_a[0].tokens.end()));
  EXPECT_EQ(got.first_version, 0u);
  EXPECT_EQ(got.last_version, 1u);
  EXPECT_EQ(mid->stats().weight_swaps, 1);
}

TEST(ContinuousEngineTest, GrowsItsCacheWhenIdleAndKeepsFixedCapacities) {
  const auto m = TinyEngineModel();
  auto engine = Engine(*m, Slots(2));
  GenerationRequest r;
  r.prompt = {1, 2};
  r.params.max_new_tokens = 3;
  ASSERT_OK(engine->Generate({r}).status());
  r.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  r.params.max_new_tokens = 20;
  ASSERT_OK_AND_ASSIGN(const auto got, engine->Generate({r}));
  EXPECT_EQ(got[0].tokens, Recompute(*m, r).tokens);

  ContinuousOptions fixed = Slots(2);
  fixed.prompt_capacity = 4;
  fixed.response_capacity = 8;
  auto small = Engine(*m, fixed);
  EXPECT_THAT(small->Add(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "prompt (9 tokens) exceeds the engine's prompt_capacity 4"));
  r.prompt = {1};
  EXPECT_THAT(small->Add(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "max_new_tokens 20 exceeds the engine's response_capacity 8"));
}

TEST(ContinuousEngineTest, RejectsBadOptionsAndRequests) {
  const auto m = TinyEngineModel();
  ContinuousOptions o;
  o.max_running_sequences = 0;
  EXPECT_THAT(ContinuousEngine::Create(m.get(), 0, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_running_sequences is 0"));
  o = Slots(2);
  o.max_prompts = -1;
  EXPECT_THAT(ContinuousEngine::Create(m.get(), 0, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_prompts is -1"));
  auto engine = Engine(*m, Slots(2));
  GenerationRequest r;
  EXPECT_THAT(engine->Add(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "prompt is empty"));
  r.prompt = {64};
  EXPECT_THAT(engine->Add(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside the vocabulary [0, 64)"));
  r.prompt = {1};
  r.params.max_new_tokens = 600;
  EXPECT_THAT(engine->Generate({r}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "request 0: prompt (1 tokens) plus max_new_tokens (600)"));
  EXPECT_TRUE(engine->idle());
}

TEST(ContinuousEngineTest, ALibTorchErrorIsAStatusAndEmptiesTheEngine) {
  const auto m = TinyEngineModel();
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, t] : m->named_parameters()) {
      if (name.find("q_proj.weight") != std::string::npos) t.set_(torch::zeros({3, 5}));
    }
  }
  auto engine = Engine(*m, Slots(2));
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.params.max_new_tokens = 4;
  ASSERT_OK(engine->Add(r).status());
  EXPECT_THAT(engine->Step().status(), StatusIs(absl::StatusCode::kInternal, "generation: "));
  EXPECT_TRUE(engine->idle());
}

}  // namespace
}  // namespace asympo::rollout
