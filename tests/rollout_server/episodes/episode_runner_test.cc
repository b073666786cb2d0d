// EpisodeRunner on a continuous engine: groups of episodes against the
// built-in calculator (what the learner receives: the transcript, its loss
// mask, the generated tokens' log-probs and versions) and against scripted
// environments that break the protocol (each failure ends the episode and
// drops its group, counted by reason).
#include "rollout_server/episodes/episode_runner.h"

#include <functional>
#include <limits>
#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "rollout_server/tasks/addition_task.h"
#include "rollout_server/tasks/calculator.h"
#include "tests/testing/episode_metrics.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_policy.h"

namespace asympo::rollout {
namespace {

using ::asympo::testing::StatusIs;

double FailedCount(prometheus::Registry& r, const std::string& reason) {
  for (const auto& family : r.Collect()) {
    if (family.name != "asympo_rollout_episodes_failed_total") continue;
    for (const auto& m : family.metric) {
      for (const auto& l : m.label) {
        if (l.name == "reason" && l.value == reason) return m.counter.value;
      }
    }
  }
  return 0;
}

struct Fixture {
  prometheus::Registry registry;
  std::unique_ptr<EpisodeMetrics> metrics = ::asympo::testing::TestEpisodeMetrics(registry);
  std::unique_ptr<PolicyModel> model = ::asympo::testing::TinyPolicy(64, 5, 0.3);
  std::unique_ptr<ContinuousEngine> engine;
  std::unique_ptr<Task> task;

  Fixture() {
    ContinuousOptions o;
    o.max_running_sequences = 8;
    engine = ContinuousEngine::Create(model.get(), 3, o).value();
    TaskOptions to;
    to.name = "add_tool";
    to.vocab_size = 64;
    task = CreateTask(to).value();
  }

  EpisodeOptions Options(int32_t budget, int32_t turns) {
    EpisodeOptions eo;
    eo.group_size = 4;
    eo.sampling.stop_token_ids = task->stop_token_ids();
    eo.sampling.max_new_tokens = 12;  // per turn
    eo.response_budget = budget;
    eo.max_turns = turns;
    return eo;
  }

  // Runs `runner` until it has no open group (RunToEnd); the groups it
  // completed.
  std::vector<v1::PromptGroup> Drain(EpisodeRunner& runner) {
    absl::StatusOr<std::vector<v1::PromptGroup>> out = runner.RunToEnd(*engine);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *std::move(out) : std::vector<v1::PromptGroup>();
  }
};

TEST(EpisodeRunnerTest, CalculatorEpisodesGiveTranscriptsWithTheirLossMasks) {
  Fixture f;
  EpisodeRunner runner(CreateBuiltinEnvironment(f.task.get()), f.Options(48, 6), f.metrics.get());
  std::mt19937_64 rng(1);
  std::vector<TaskPrompt> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(f.task->NextPrompt(rng));
    runner.StartGroup(prompts.back(), /*logprobs=*/true, rng);
  }
  const std::vector<v1::PromptGroup> groups = f.Drain(runner);
  ASSERT_EQ(groups.size(), 6u);
  EXPECT_TRUE(f.engine->idle()) << "every sequence ended";
  int64_t calls = 0;
  for (const v1::PromptGroup& g : groups) {
    ASSERT_EQ(g.responses_size(), 4);
    for (const v1::Response& r : g.responses()) {
      ASSERT_LE(r.tokens_size(), 48);
      int64_t generated = r.tokens_size();
      if (r.loss_mask_size() > 0) {
        ASSERT_EQ(r.loss_mask_size(), r.tokens_size());
        generated = std::count(r.loss_mask().begin(), r.loss_mask().end(), true);
      }
      EXPECT_EQ(r.behavior_logprobs_size(), generated) << "one log-prob per generated token";
      EXPECT_EQ(r.first_policy_version(), 3u);
      EXPECT_EQ(r.last_policy_version(), 3u);
      // Replays the transcript: after each generated CALL the calculator's
      // answer follows as inserted tokens, and nothing else is inserted.
      std::vector<int32_t> turn;
      std::optional<int32_t> previous;
      for (int j = 0; j < r.tokens_size(); ++j) {
        const bool inserted = r.loss_mask_size() > 0 && !r.loss_mask(j);
        ASSERT_FALSE(inserted) << "an inserted token where no CALL asked for one, at " << j;
        turn.push_back(r.tokens(j));
        if (r.tokens(j) != addition::kCallId || j + 1 == r.tokens_size()) continue;
        const std::vector<int32_t> answer = CalculatorAnswer(turn, &previous);
        ++calls;
        for (size_t a = 0; a < answer.size(); ++a) {
          ASSERT_LT(j + 1 + static_cast<int>(a), r.tokens_size());
          EXPECT_EQ(r.tokens(j + 1 + static_cast<int>(a)), answer[a]);
          EXPECT_FALSE(r.loss_mask(j + 1 + static_cast<int>(a)));
        }
        j += static_cast<int>(answer.size());
        turn.clear();
      }
      const TaskPrompt& p = *std::find_if(prompts.begin(), prompts.end(), [&](const TaskPrompt& q) {
        return q.prompt_id == g.prompt_id();
      });
      const std::vector<int32_t> transcript(r.tokens().begin(), r.tokens().end());
      EXPECT_EQ(r.reward(), f.task->Score(p, transcript).reward) << "the verifier's reward";
    }
  }
  EXPECT_GT(calls, 0) << "a random policy calls the calculator now and then";
  EXPECT_EQ(f.metrics->episodes.Value(), 24);
  EXPECT_GT(f.metrics->inserted_tokens.Value(), 0);
}

// An environment whose every call answers at once with what `step` says.
class Scripted : public Environment {
 public:
  using StepFn = std::function<absl::StatusOr<TurnAnswer>(const Turn&)>;
  explicit Scripted(StepFn step, std::optional<std::string> id = std::nullopt)
      : step_(std::move(step)), id_(std::move(id)) {}
  void Reset(const TaskPrompt&, uint32_t index, uint64_t, ResetDone done) override {
    done(id_.value_or(absl::StrCat("e", next_++, "-", index)));
  }
  void Step(const std::string&, const Turn& turn, StepDone done) override { done(step_(turn)); }
  void Close(const std::string&) override { ++closed; }
  std::string name() const override { return "scripted"; }
  int closed = 0;

 private:
  StepFn step_;
  const std::optional<std::string> id_;  // every Reset's answer, when set
  int next_ = 0;
};

TEST(EpisodeRunnerTest, EachProtocolBreachFailsTheEpisodeAndDropsItsGroup) {
  struct Case {
    std::string name;
    std::string reason;
    Scripted::StepFn step;
    double max_abs_reward = 0;  // the learner's, when the group started (0: none known)
    std::optional<std::string> id = std::nullopt;  // every Reset's answer
  };
  const auto done_with = [](double reward) {
    return [reward](const Turn&) { return TurnAnswer{{}, true, reward, false}; };
  };
  const std::vector<Case> cases = {
      {"deadline", "deadline", [](const Turn&) { return absl::DeadlineExceededError("late"); }},
      {"unavailable", "unavailable", [](const Turn&) { return absl::UnavailableError("gone"); }},
      {"not_done", "not_done",
       [](const Turn&) {
         return TurnAnswer{{7}, false, 0, false};
       }},
      {"overlong", "overlong",
       [](const Turn& t) {
         return TurnAnswer{std::vector<int32_t>(t.tokens_left, 7), false, 0, false};
       }},
      {"a token outside the vocabulary", "invalid_answer",
       [](const Turn&) {
         return TurnAnswer{{64}, false, 0, false};
       }},
      {"a reward that is not finite", "invalid_answer",
       done_with(std::numeric_limits<double>::quiet_NaN())},
      {"a reward beyond the learner's max_abs_reward", "invalid_answer", done_with(100.5), 100},
      {"an empty episode_id", "invalid_answer", done_with(1), 0, std::string()},
      {"an overlong episode_id", "invalid_answer", done_with(1), 0, std::string(257, 'x')},
      {"an answer marked invalid by the environment's client", "invalid_answer",
       [](const Turn&) { return InvalidAnswer("Step answered nonsense"); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Fixture f;
    auto env = std::make_unique<Scripted>(c.step, c.id);
    Scripted* scripted = env.get();
    EpisodeRunner runner(std::move(env), f.Options(40, 2), f.metrics.get());
    std::mt19937_64 rng(2);
    runner.StartGroup(f.task->NextPrompt(rng), false, rng, nullptr, c.max_abs_reward);
    EXPECT_TRUE(f.Drain(runner).empty()) << "the group is dropped";
    EXPECT_GE(FailedCount(f.registry, c.reason), 1);
    EXPECT_EQ(f.metrics->dropped.Value(), 1);
    // An episode_id that cannot name an episode is never sent back.
    EXPECT_EQ(scripted->closed, c.id.has_value() ? 0 : 4) << "every episode is closed";
    EXPECT_TRUE(f.engine->idle()) << "no sequence is left paused";
  }
}

TEST(EpisodeRunnerTest, AnEnvironmentThatRefusesTheDaemonStopsIt) {
  for (const absl::Status& refusal : {absl::UnauthenticatedError("a missing or wrong bearer token"),
                                      absl::PermissionDeniedError("not this client")}) {
    SCOPED_TRACE(refusal.ToString());
    Fixture f;
    auto env = std::make_unique<Scripted>(
        [&](const Turn&) -> absl::StatusOr<TurnAnswer> { return refusal; });
    EpisodeRunner runner(std::move(env), f.Options(40, 2), f.metrics.get());
    EXPECT_OK(runner.refused());
    std::mt19937_64 rng(5);
    runner.StartGroup(f.task->NextPrompt(rng), false, rng);
    EXPECT_TRUE(f.Drain(runner).empty());
    EXPECT_GE(FailedCount(f.registry, "refused"), 1);
    EXPECT_THAT(runner.refused(),
                StatusIs(absl::StatusCode::kFailedPrecondition, "--environment_token_file"));
    EXPECT_THAT(runner.refused().message(), ::testing::HasSubstr(refusal.message()));
  }
}

TEST(EpisodeRunnerTest, ARewardAtTheLearnersLimitIsKept) {
  Fixture f;
  auto env = std::make_unique<Scripted>([](const Turn&) -> absl::StatusOr<TurnAnswer> {
    return TurnAnswer{{}, true, -100, false};
  });
  EpisodeRunner runner(std::move(env), f.Options(40, 2), f.metrics.get());
  std::mt19937_64 rng(4);
  runner.StartGroup(f.task->NextPrompt(rng), false, rng, nullptr, /*max_abs_reward=*/100);
  const auto groups = f.Drain(runner);
  ASSERT_EQ(groups.size(), 1u);
  for (const v1::Response& r : groups[0].responses()) EXPECT_EQ(r.reward(), -100);
}

TEST(EpisodeRunnerTest, TheLastTurnIsFinalAndADoneAnswerEndsTheEpisode) {
  Fixture f;
  std::vector<Turn> turns;
  auto env = std::make_unique<Scripted>([&](const Turn& t) -> absl::StatusOr<TurnAnswer> {
    turns.push_back(t);
    if (t.final) return TurnAnswer{{}, true, 0.5, false};
    return TurnAnswer{{9, 10}, false, 0, false};
  });
  EpisodeRunner runner(std::move(env), f.Options(60, 3), f.metrics.get());
  std::mt19937_64 rng(3);
  runner.StartGroup(f.task->NextPrompt(rng), false, rng);
  const auto groups = f.Drain(runner);
  ASSERT_EQ(groups.size(), 1u);
  for (const v1::Response& r : groups[0].responses()) EXPECT_FLOAT_EQ(r.reward(), 0.5f);
  ASSERT_EQ(turns.size(), 12u) << "3 turns of 4 episodes";
  for (const Turn& t : turns) {
    EXPECT_EQ(t.final, t.index == 2) << "turn " << t.index;
    EXPECT_GT(t.tokens_left, 0u);
  }
}

TEST(EpisodeRunnerTest, RequestEpisodesComeBackInOrderEachAsItRunsAlone) {
  Fixture f;
  std::vector<GenerationRequest> requests;
  std::mt19937_64 rng(9);
  for (int i = 0; i < 16; ++i) {
    GenerationRequest r{f.task->NextPrompt(rng).prompt_tokens, {}};
    r.params.temperature = i % 4 == 0 ? 0.0 : 1.0;
    r.params.seed = 100 + static_cast<uint64_t>(i);
    r.params.max_new_tokens = f.task->max_new_tokens();
    r.params.stop_token_ids = f.task->stop_token_ids();
    requests.push_back(r);
  }
  ASSERT_OK_AND_ASSIGN(
      const std::vector<GenerationResult> together,
      RunRequestEpisodes(*f.model, CreateBuiltinEnvironment(f.task.get()), requests, 6));
  ASSERT_EQ(together.size(), requests.size());
  bool inserted = false;
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(
        const std::vector<GenerationResult> alone,
        RunRequestEpisodes(*f.model, CreateBuiltinEnvironment(f.task.get()), {requests[i]}, 6));
    EXPECT_EQ(together[i].tokens, alone[0].tokens) << "request " << i;
    EXPECT_EQ(together[i].loss_mask, alone[0].loss_mask) << "request " << i;
    for (bool b : together[i].loss_mask) inserted = inserted || !b;
  }
  EXPECT_TRUE(inserted) << "some episode called the calculator";
}

}  // namespace
}  // namespace asympo::rollout
