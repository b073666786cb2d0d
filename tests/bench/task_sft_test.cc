#include "bench/task_sft.h"

#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/model/model_config.h"
#include "common/model/model_io.h"
#include "rollout_server/engine/generation.h"
#include "rollout_server/tasks/addition_task.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo::bench {
namespace {

using ::asympo::testing::StatusIs;

std::unique_ptr<rollout::Task> MakeTask(const std::string& name) {
  rollout::TaskOptions o;
  o.name = name;
  o.vocab_size = 64;
  absl::StatusOr<std::unique_ptr<rollout::Task>> t = rollout::CreateTask(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

std::unique_ptr<PolicyModel> TinyModel(uint64_t seed = 3) {
  ModelOptions o;
  o.seed = seed;
  absl::StatusOr<std::unique_ptr<PolicyModel>> m =
      PolicyModel::CreateRandom(ModelConfig::Tiny(64), o);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

TEST(TaskSftTest, ReferenceResponsesAreCorrectAndVaryTheirOrder) {
  std::mt19937_64 rng(5);
  std::unique_ptr<rollout::Task> add = MakeTask("add");
  std::set<std::vector<int32_t>> seen;
  const rollout::TaskPrompt p = add->NextPrompt(rng);
  for (int i = 0; i < 50; ++i) {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> r, ReferenceResponse(*add, p, rng));
    EXPECT_TRUE(add->Score(p, r).correct);
    seen.insert(r);
  }
  EXPECT_GT(seen.size(), 3u) << "random operand orders";
  std::unique_ptr<rollout::Task> copy = MakeTask("copy");
  const rollout::TaskPrompt q = copy->NextPrompt(rng);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> r, ReferenceResponse(*copy, q, rng));
  EXPECT_TRUE(copy->Score(q, r).correct);
}

TEST(TaskSftTest, TrainsToTheTargetAndTheSavedModelLoadsBack) {
  std::unique_ptr<rollout::Task> copy = MakeTask("copy");
  std::unique_ptr<PolicyModel> model = TinyModel();
  SftOptions o;
  o.max_steps = 400;
  o.target_accuracy = 0.9;
  o.eval_every = 25;
  o.eval_prompts = 50;
  ASSERT_OK_AND_ASSIGN(SftResult r, RunSft(model.get(), copy.get(), o));
  EXPECT_TRUE(r.reached) << "greedy accuracy " << r.accuracy << " after " << r.steps << " steps";
  EXPECT_GE(r.accuracy, 0.9);
  EXPECT_LT(r.steps, 400);
  EXPECT_EQ(r.steps % 25, 0) << "stops at an evaluation";

  asympo::testing::ScopedTempDir dir("sft");
  ASSERT_OK(ExportPolicyModel(*model, dir.Path("base")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PolicyModel> loaded,
                       LoadPolicyModel(dir.Path("base"), ModelOptions()));
  for (size_t i = 0; i < model->named_parameters().size(); ++i) {
    EXPECT_TRUE(model->named_parameters()[i].second.equal(loaded->named_parameters()[i].second))
        << model->named_parameters()[i].first;
  }
}

TEST(TaskSftTest, BaseStatisticsDescribeTheSamples) {
  std::unique_ptr<rollout::Task> add = MakeTask("add");
  std::unique_ptr<PolicyModel> model = TinyModel();
  ASSERT_OK_AND_ASSIGN(BaseStatistics s, MeasureBase(*model, add.get(), 4, 6, 1));
  EXPECT_EQ(s.responses, 24);
  // A random model over 64 ids: close to ln 64 = 4.16 nats a token.
  EXPECT_GT(s.s_median, 3.0);
  EXPECT_LT(s.s_median, 5.5);
  EXPECT_LE(s.s_p10, s.s_median);
  EXPECT_GE(s.s_p90, s.s_median);
  EXPECT_GE(s.ratio_median, 1.0);
  EXPECT_GE(s.ratio_p90, s.ratio_median);
  EXPECT_NE(BaseStatisticsLine(s).find("S_g median="), std::string::npos);
}

TEST(TaskSftTest, MeanTokenKlIsZeroForTheSamplerAndPositiveForOtherWeights) {
  std::unique_ptr<rollout::Task> add = MakeTask("add");
  std::unique_ptr<PolicyModel> sampler = TinyModel(3);
  std::mt19937_64 rng(9);
  std::vector<rollout::GenerationRequest> requests;
  for (int i = 0; i < 8; ++i) {
    rollout::GenerationRequest r;
    r.prompt = add->NextPrompt(rng).prompt_tokens;
    r.params.max_new_tokens = 12;
    r.params.return_logprobs = true;
    r.params.seed = rng();
    requests.push_back(std::move(r));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<rollout::GenerationResult> results,
                       rollout::GenerationEngine(sampler.get()).Generate(requests));
  std::vector<std::vector<int32_t>> prompts, responses;
  std::vector<std::vector<float>> logprobs;
  for (size_t i = 0; i < results.size(); ++i) {
    prompts.push_back(requests[i].prompt);
    responses.push_back(results[i].tokens);
    logprobs.push_back(results[i].logprobs);
  }
  ASSERT_OK_AND_ASSIGN(double same, MeanTokenKl(*sampler, prompts, responses, logprobs));
  EXPECT_NEAR(same, 0.0, 1e-4) << "the weights that sampled";
  std::unique_ptr<PolicyModel> other = TinyModel(4);
  ASSERT_OK_AND_ASSIGN(double drift, MeanTokenKl(*other, prompts, responses, logprobs));
  EXPECT_GT(drift, 0.01) << "other weights";
  logprobs[0].pop_back();
  EXPECT_THAT(MeanTokenKl(*sampler, prompts, responses, logprobs),
              StatusIs(absl::StatusCode::kInvalidArgument, "log-probs"));
}

TEST(TaskSftTest, BadOptionsAreRefused) {
  std::unique_ptr<rollout::Task> copy = MakeTask("copy");
  std::unique_ptr<PolicyModel> model = TinyModel();
  SftOptions o;
  o.batch = 0;
  EXPECT_THAT(RunSft(model.get(), copy.get(), o),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be positive"));
}

}  // namespace
}  // namespace asympo::bench
