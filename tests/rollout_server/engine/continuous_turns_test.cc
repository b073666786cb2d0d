// ContinuousEngine's multi-turn requests: paused at the end of a turn,
// resumed with an environment's tokens (only those pre-filled), against a
// recomputation of every token without a cache.
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "rollout_server/engine/continuous_engine.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_policy.h"

namespace asympo::rollout {
namespace {

using ::asympo::testing::StatusIs;

// What an environment inserts after turn t of request r (then nothing: the
// episode ends after kTurns turns).
constexpr int kTurns = 3;
std::vector<int32_t> Inserted(int r, int turn) {
  if (turn == 1) return {};  // a turn answered with no tokens
  return {40 + r, 50 + turn, 7};
}

GenerationRequest Turns(int r) {
  GenerationRequest q;
  q.prompt = {1, 9, 12, 3};  // one prompt: the group shares its row
  q.params.max_new_tokens = 5;
  q.params.seed = 300 + static_cast<uint64_t>(r);
  q.params.temperature = r == 0 ? 0.0 : 1.0;
  q.params.stop_token_ids = {5, 17, 33};
  q.params.return_logprobs = true;
  q.multi_turn = true;
  q.response_budget = 40;
  return q;
}

// The episode recomputed without a cache: each turn samples from the whole
// sequence with the engine's sampler (step index = the response position)
// until a stop id or the turn's limit, then takes Inserted's tokens.
GenerationResult Recomputed(const PolicyModel& m, const GenerationRequest& q, int r) {
  torch::NoGradGuard no_grad;
  std::vector<int32_t> seq = q.prompt;
  GenerationResult out;
  for (int turn = 0; turn < kTurns; ++turn) {
    for (int i = 0; i < q.params.max_new_tokens; ++i) {
      const int64_t t = static_cast<int64_t>(seq.size());
      const torch::Tensor ids =
          torch::tensor(std::vector<int64_t>(seq.begin(), seq.end()), torch::kLong).unsqueeze(0);
      const torch::Tensor logits =
          m.Logits(m.Forward(ids, torch::arange(t, torch::kLong).unsqueeze(0),
                             torch::ones({1, t}, torch::kBool)))[0][t - 1];
      const int32_t tok = SampleToken(logits, q.params, static_cast<int64_t>(out.tokens.size()));
      out.tokens.push_back(tok);
      out.loss_mask.push_back(true);
      out.logprobs.push_back(torch::log_softmax(logits.to(torch::kFloat), 0)[tok].item<float>());
      seq.push_back(tok);
      const auto& stop = q.params.stop_token_ids;
      if (std::find(stop.begin(), stop.end(), tok) != stop.end()) break;
    }
    if (turn + 1 == kTurns) break;
    for (int32_t tok : Inserted(r, turn)) {
      out.tokens.push_back(tok);
      out.loss_mask.push_back(false);
      seq.push_back(tok);
    }
  }
  return out;
}

// Runs `n` episodes through `engine`, resuming each paused request with
// Inserted's tokens and ending it after kTurns turns; the last paused
// result of each.
std::vector<GenerationResult> RunEpisodes(ContinuousEngine& engine, int n) {
  std::map<uint64_t, int> request_of, turn_of;
  for (int r = 0; r < n; ++r) request_of[engine.Add(Turns(r)).value()] = r;
  std::vector<GenerationResult> out(static_cast<size_t>(n));
  while (!engine.idle()) {
    auto finished = engine.Step();
    EXPECT_TRUE(finished.ok()) << finished.status();
    if (!finished.ok()) break;
    for (ContinuousEngine::Finished& f : *finished) {
      EXPECT_TRUE(f.paused) << "a multi-turn request only pauses";
      const int r = request_of[f.id];
      const int turn = turn_of[f.id]++;
      out[static_cast<size_t>(r)] = f.result;
      if (turn + 1 == kTurns) {
        EXPECT_OK(engine.End(f.id));
      } else {
        EXPECT_OK(engine.Resume(f.id, Inserted(r, turn), Turns(r).params.max_new_tokens));
      }
    }
  }
  return out;
}

TEST(ContinuousTurnsTest, ResumedSequencesEqualAFullRecomputeWithAndWithoutKvReuse) {
  const auto m = ::asympo::testing::TinyPolicy(64, 11, 0.3);
  for (const bool reuse : {true, false}) {
    ContinuousOptions o;
    o.max_running_sequences = 4;
    o.reuse_kv = reuse;
    auto engine = ContinuousEngine::Create(m.get(), 0, o).value();
    const auto got = RunEpisodes(*engine, 3);
    for (int r = 0; r < 3; ++r) {
      const GenerationResult want = Recomputed(*m, Turns(r), r);
      const GenerationResult& g = got[static_cast<size_t>(r)];
      EXPECT_EQ(g.tokens, want.tokens) << "reuse_kv " << reuse << ", request " << r;
      EXPECT_EQ(g.loss_mask, want.loss_mask) << r;
      ASSERT_EQ(g.logprobs.size(), want.logprobs.size()) << "one log-prob per generated token";
      for (size_t j = 0; j < want.logprobs.size(); ++j) {
        EXPECT_NEAR(g.logprobs[j], want.logprobs[j], 1e-4) << r << "," << j;
      }
    }
    EXPECT_EQ(engine->stats().resumes, 3 * (kTurns - 1));
    EXPECT_EQ(engine->stats().prefills, 1) << "the group's prompt is pre-filled once";
    EXPECT_TRUE(engine->idle());
    if (reuse) {
      // Only the inserted tokens: 3 after turn 0, none after turn 1.
      EXPECT_EQ(engine->stats().resume_tokens, 3 * 3);
    } else {
      EXPECT_GT(engine->stats().resume_tokens, 3 * 3);
    }
  }
}

TEST(ContinuousTurnsTest, APausedSequenceHoldsItsSlotWhileOthersDecode) {
  const auto m = ::asympo::testing::TinyPolicy(64, 11, 0.3);
  ContinuousOptions o;
  o.max_running_sequences = 1;
  auto engine = ContinuousEngine::Create(m.get(), 0, o).value();
  ASSERT_OK_AND_ASSIGN(const uint64_t a, engine->Add(Turns(1)));
  GenerationRequest single;
  single.prompt = {1, 2};
  single.params.max_new_tokens = 3;
  ASSERT_OK_AND_ASSIGN(const uint64_t b, engine->Add(single));
  std::vector<ContinuousEngine::Finished> got;
  while (got.empty()) got = engine->Step().value();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].id, a);
  EXPECT_TRUE(got[0].paused);
  EXPECT_EQ(engine->paused(), 1);
  EXPECT_EQ(engine->running(), 1);
  // The slot stays taken: the waiting request is not admitted, and a step
  // with nothing decoding does nothing.
  const int64_t steps = engine->stats().decode_steps;
  EXPECT_TRUE(engine->Step().value().empty());
  EXPECT_EQ(engine->stats().decode_steps, steps);
  EXPECT_EQ(engine->waiting(), 1);
  ASSERT_OK(engine->End(a));
  EXPECT_THAT(engine->End(a), StatusIs(absl::StatusCode::kNotFound));
  std::vector<ContinuousEngine::Finished> rest;
  while (!engine->idle()) {
    std::vector<ContinuousEngine::Finished> step = engine->Step().value();
    for (auto& f : step) rest.push_back(std::move(f));
  }
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].id, b);
  EXPECT_FALSE(rest[0].paused);
  EXPECT_TRUE(rest[0].result.loss_mask.empty());
}

TEST(ContinuousTurnsTest, ResumeRefusesBadInputAndTheSequenceStaysPaused) {
  const auto m = ::asympo::testing::TinyPolicy(64, 11, 0.3);
  auto engine = ContinuousEngine::Create(m.get(), 0, ContinuousOptions()).value();
  GenerationRequest q = Turns(0);
  q.response_budget = 8;
  ASSERT_OK_AND_ASSIGN(const uint64_t id, engine->Add(q));
  std::vector<ContinuousEngine::Finished> got;
  while (got.empty()) got = engine->Step().value();
  const int64_t n = static_cast<int64_t>(got[0].result.tokens.size());
  EXPECT_THAT(engine->Resume(id + 1, {}, 4), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(engine->Resume(id, {64}, 4), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(engine->Resume(id, {-1}, 4), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(engine->Resume(id, std::vector<int32_t>(static_cast<size_t>(8 - n), 7), 4),
              StatusIs(absl::StatusCode::kInvalidArgument, "budget"));
  EXPECT_THAT(engine->Resume(id, {7}, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(engine->paused(), 1);
  // Room for the inserted tokens and one generated one: the turn is cut at
  // the budget.
  ASSERT_OK(engine->Resume(id, std::vector<int32_t>(static_cast<size_t>(7 - n), 7), 4));
  got.clear();
  while (got.empty()) got = engine->Step().value();
  EXPECT_TRUE(got[0].paused);
  EXPECT_EQ(got[0].result.tokens.size(), 8u);
  EXPECT_EQ(got[0].result.loss_mask.back(), true);
  ASSERT_OK(engine->End(id));
  EXPECT_TRUE(engine->idle());
  GenerationRequest over = Turns(0);
  over.response_budget = 3;  // below max_new_tokens 5
  EXPECT_THAT(engine->Add(over), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace asympo::rollout
