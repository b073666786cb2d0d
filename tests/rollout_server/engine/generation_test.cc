#include "rollout_server/engine/generation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "tests/rollout_server/engine/generation_test_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_policy.h"

namespace asympo::rollout {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<PolicyModel> TinyGenerationModel() {
  return ::asympo::testing::TinyPolicy(64, 11, 0.3);
}

std::vector<GenerationRequest> Requests() {
  std::vector<GenerationRequest> rs;
  const std::vector<std::vector<int32_t>> prompts = {{3, 4, 5}, {9}, {10, 11, 12, 13, 14, 15, 16}};
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.params.max_new_tokens = 12;
    r.params.seed = 100 + i;
    r.params.temperature = i == 0 ? 0.0 : 1.0;  // one greedy, two sampled
    r.params.top_k = i == 2 ? 20 : 0;
    r.params.top_p = i == 2 ? 0.9 : 1.0;
    r.params.return_logprobs = true;
    rs.push_back(r);
  }
  return rs;
}

TEST(GenerationTest, CachedBatchedGenerationEqualsFullRecompute) {
  const auto m = TinyGenerationModel();
  const GenerationEngine engine(m.get());
  const auto reqs = Requests();
  const auto got = engine.Generate(reqs).value();
  ASSERT_EQ(got.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerationResult ref = Recompute(*m, reqs[i]);
    EXPECT_EQ(got[i].tokens, ref.tokens) << "request " << i;
    ASSERT_EQ(got[i].logprobs.size(), ref.logprobs.size());
    for (size_t j = 0; j < ref.logprobs.size(); ++j) {
      EXPECT_NEAR(got[i].logprobs[j], ref.logprobs[j], 1e-4) << i << "," << j;
    }
    EXPECT_EQ(got[i].finish_reason, v1::FINISH_REASON_LENGTH);
  }
}

TEST(GenerationTest, AFixedSeedGivesTheSameTokens) {
  const auto m = TinyGenerationModel();
  const GenerationEngine engine(m.get());
  auto reqs = Requests();
  const auto a = engine.Generate(reqs).value();
  const auto b = engine.Generate(reqs).value();
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(a[i].tokens, b[i].tokens);
  reqs[1].params.seed = 999;
  const auto c = engine.Generate(reqs).value();
  EXPECT_NE(a[1].tokens, c[1].tokens);
  EXPECT_EQ(a[0].tokens, c[0].tokens);  // other rows unaffected
}

TEST(GenerationTest, StopsAtAStopTokenAndKeepsIt) {
  const auto m = TinyGenerationModel();
  const GenerationEngine engine(m.get());
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.params.temperature = 0;
  r.params.max_new_tokens = 10;
  const auto free_run = engine.Generate({r}).value()[0];
  r.params.stop_token_ids = {free_run.tokens[2]};
  const auto stopped = engine.Generate({r}).value()[0];
  const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[2]);
  const size_t expect_len = static_cast<size_t>(first - free_run.tokens.begin()) + 1;
  EXPECT_EQ(stopped.tokens.size(), expect_len);
  EXPECT_EQ(stopped.tokens.back(), free_run.tokens[2]);
  EXPECT_EQ(stopped.finish_reason, v1::FINISH_REASON_STOP);
  EXPECT_TRUE(stopped.logprobs.empty());
}

TEST(GenerationTest, TopKOneAndTinyTopPAreGreedy) {
  const auto m = TinyGenerationModel();
  const GenerationEngine engine(m.get());
  GenerationRequest greedy;
  greedy.prompt = {7, 8};
  greedy.params.temperature = 0;
  greedy.params.max_new_tokens = 8;
  GenerationRequest top_k = greedy, top_p = greedy;
  top_k.params.temperature = 1.5;
  top_k.params.top_k = 1;
  top_p.params.temperature = 1.5;
  top_p.params.top_p = 1e-6;
  const auto out = engine.Generate({greedy, top_k, top_p}).value();
  EXPECT_EQ(out[1].tokens, out[0].tokens);
  EXPECT_EQ(out[2].tokens, out[0].tokens);
}

TEST(GenerationTest, RejectsBadRequests) {
  const auto m = TinyGenerationModel();
  const GenerationEngine engine(m.get());
  GenerationRequest r;
  r.prompt = {};
  EXPECT_THAT(std::string(engine.Generate({r}).status().message()), HasSubstr("prompt is empty"));
  r.prompt = {64};
  EXPECT_THAT(std::string(engine.Generate({r}).status().message()),
              HasSubstr("prompt token 64 is outside the vocabulary [0, 64)"));
  r.prompt = {1};
  r.params.top_p = 0;
  EXPECT_THAT(std::string(engine.Generate({r}).status().message()), HasSubstr("top_p is 0"));
  r.params.top_p = 1;
  r.params.max_new_tokens = 600;
  EXPECT_THAT(std::string(engine.Generate({r}).status().message()),
              HasSubstr("exceeds max_position_embeddings 512"));
}

TEST(GenerationTest, ALibTorchErrorComesBackAsAStatus) {
  const auto m = TinyGenerationModel();
  {
    // A weight of the wrong shape makes the forward pass throw c10::Error.
    at::NoGradGuard no_grad;
    for (const auto& [name, t] : m->named_parameters()) {
      if (name.find("q_proj.weight") != std::string::npos) t.set_(torch::zeros({3, 5}));
    }
  }
  const GenerationEngine engine(m.get());
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.params.max_new_tokens = 4;
  absl::StatusOr<std::vector<GenerationResult>> out = engine.Generate({r});
  ASSERT_THAT(out, StatusIs(absl::StatusCode::kInternal, "generation: "));
  EXPECT_THAT(std::string(out.status().message()), ::testing::Not(HasSubstr("frame #")))
      << "LibTorch's backtrace stays out of the message";
}

}  // namespace
}  // namespace asympo::rollout
