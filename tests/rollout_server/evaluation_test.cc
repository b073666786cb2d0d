#include "rollout_server/evaluation.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/model/checkpoint_files.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "rollout_server/tasks/tasks.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_policy.h"

namespace asympo::rollout {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<PolicyModel> TinyOfVocab(uint64_t seed, int64_t vocab = 16) {
  return ::asympo::testing::TinyPolicy(vocab, seed);
}

std::unique_ptr<Task> Copy(int64_t vocab = 16) {
  TaskOptions o;
  o.name = "copy";
  o.vocab_size = vocab;
  absl::StatusOr<std::unique_ptr<Task>> t = CreateTask(o);
  EXPECT_OK(t);
  return t.ok() ? *std::move(t) : nullptr;
}

TEST(PassAtKTest, MatchesTheUnbiasedEstimator) {
  EXPECT_DOUBLE_EQ(PassAtK(10, 0, 1), 0.0);
  EXPECT_DOUBLE_EQ(PassAtK(10, 3, 1), 0.3);
  EXPECT_DOUBLE_EQ(PassAtK(8, 1, 8), 1.0);
  EXPECT_DOUBLE_EQ(PassAtK(8, 0, 8), 0.0);
  // 1 - C(2, 2) / C(4, 2) = 1 - 1/6.
  EXPECT_NEAR(PassAtK(4, 2, 2), 5.0 / 6.0, 1e-12);
  // 1 - C(7, 3) / C(10, 3) = 1 - 35/120.
  EXPECT_NEAR(PassAtK(10, 3, 3), 1.0 - 35.0 / 120.0, 1e-12);
}

TEST(EvaluateTest, ReportsAreConsistentAndReproducible) {
  std::unique_ptr<PolicyModel> model = TinyOfVocab(3);
  std::unique_ptr<Task> task = Copy();
  const GenerationEngine engine(model.get());
  const std::vector<TaskPrompt> prompts = task->EvaluationPrompts(12);
  EvaluationOptions o;
  o.k = 4;
  o.seed = 9;
  o.prompts_per_batch = 5;
  absl::StatusOr<EvaluationReport> a = Evaluate(engine, *task, prompts, o);
  ASSERT_OK(a);
  EXPECT_EQ(a->prompts, 12);
  EXPECT_EQ(a->samples, 4);
  ASSERT_EQ(a->per_prompt.size(), 12u);
  // The report is the mean of its rows, recomputed here.
  double mean_at_k = 0, pass_at_k = 0, greedy = 0, greedy_reward = 0, greedy_length = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const PromptEvaluation& p = a->per_prompt[i];
    EXPECT_EQ(p.prompt_id, prompts[i].prompt_id);
    const TaskScore s = task->Score(prompts[i], p.greedy_tokens);
    EXPECT_EQ(s.correct, p.greedy_correct);
    EXPECT_DOUBLE_EQ(s.reward, p.greedy_reward);
    mean_at_k += p.samples_correct / 4.0;
    pass_at_k += p.samples_correct > 0 ? 1 : 0;
    greedy += p.greedy_correct ? 1 : 0;
    greedy_reward += p.greedy_reward;
    greedy_length += static_cast<double>(p.greedy_tokens.size());
  }
  EXPECT_NEAR(a->mean_at_k, mean_at_k / 12, 1e-12);
  EXPECT_NEAR(a->pass_at_k, pass_at_k / 12, 1e-12);
  EXPECT_NEAR(a->greedy_accuracy, greedy / 12, 1e-12);
  EXPECT_NEAR(a->greedy_reward, greedy_reward / 12, 1e-12);
  EXPECT_NEAR(a->greedy_mean_length, greedy_length / 12, 1e-12);
  EXPECT_LE(a->mean_at_k, a->pass_at_k);
  EXPECT_GT(a->mean_length, 0);

  // The same seed gives the same samples whatever the batching.
  o.prompts_per_batch = 12;
  absl::StatusOr<EvaluationReport> b = Evaluate(engine, *task, prompts, o);
  ASSERT_OK(b);
  EXPECT_EQ(b->mean_length, a->mean_length);
  EXPECT_EQ(b->sample_reward, a->sample_reward);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(b->per_prompt[i].greedy_tokens, a->per_prompt[i].greedy_tokens);
    EXPECT_EQ(b->per_prompt[i].samples_correct, a->per_prompt[i].samples_correct);
  }
  const nlohmann::json j = nlohmann::json::parse(EvaluationJson(*a, true));
  EXPECT_EQ(j["prompts"], 12);
  EXPECT_EQ(j["per_prompt"].size(), 12u);
  EXPECT_DOUBLE_EQ(j["pass_at_k"].get<double>(), a->pass_at_k);
  EXPECT_THAT(EvaluationSummary(*a), HasSubstr("mean@4="));
}

TEST(EvaluateTest, GreedyOnlyWithKZero) {
  std::unique_ptr<PolicyModel> model = TinyOfVocab(1);
  std::unique_ptr<Task> task = Copy();
  const GenerationEngine engine(model.get());
  EvaluationOptions o;
  o.k = 0;
  absl::StatusOr<EvaluationReport> r = Evaluate(engine, *task, task->EvaluationPrompts(3), o);
  ASSERT_OK(r);
  EXPECT_EQ(r->samples, 0);
  EXPECT_EQ(r->mean_length, 0);
  EXPECT_GT(r->greedy_mean_length, 0);
  EXPECT_THAT(EvaluationSummary(*r), ::testing::Not(HasSubstr("pass@")));
}

TEST(EvaluateTest, RejectsBadOptionsByName) {
  std::unique_ptr<PolicyModel> model = TinyOfVocab(1);
  std::unique_ptr<Task> task = Copy();
  const GenerationEngine engine(model.get());
  const std::vector<TaskPrompt> prompts = task->EvaluationPrompts(2);
  EvaluationOptions o;
  o.k = 4;
  o.samples = 2;
  EXPECT_THAT(Evaluate(engine, *task, prompts, o).status().message(), HasSubstr("samples is 2"));
  o = EvaluationOptions();
  o.k = -1;
  EXPECT_THAT(Evaluate(engine, *task, prompts, o).status().message(), HasSubstr("k is -1"));
  o = EvaluationOptions();
  o.prompts_per_batch = 0;
  EXPECT_THAT(Evaluate(engine, *task, prompts, o).status().message(),
              HasSubstr("prompts_per_batch"));
  o = EvaluationOptions();
  EXPECT_THAT(Evaluate(engine, *task, {}, o).status().message(), HasSubstr("no prompts"));
}

// A checkpoint directory as the learner writes it (learner_server/
// checkpoint.cc): the weights, an optimizer tensor, meta.json with the CRC.
std::string WriteCheckpoint(const std::string& root, uint64_t version, const PolicyModel& model,
                            const std::string& config) {
  const std::string dir = absl::StrFormat("%s/ckpt-%012d", root, version);
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : model.named_parameters()) tensors.emplace_back(name, t.detach());
  tensors.emplace_back(std::string(kCheckpointOptimizerPrefix) + "m.0", torch::zeros({3}));
  const std::string state = dir + "/" + kCheckpointStateFile;
  EXPECT_OK(WriteSafetensors(state, tensors));
  const std::string bytes = testing::ReadFile(state);
  nlohmann::json meta = {{"version", version},
                         {"optimizer_steps", 1},
                         {"crc32c", Crc32c(bytes.data(), bytes.size())},
                         {"config", config}};
  std::ofstream(dir + "/" + kCheckpointMetaFile) << meta.dump();
  return dir;
}

bool SameWeights(const PolicyModel& a, const PolicyModel& b) {
  for (size_t i = 0; i < a.named_parameters().size(); ++i) {
    if (!torch::equal(a.named_parameters()[i].second, b.named_parameters()[i].second)) {
      return false;
    }
  }
  return true;
}

TEST(LoadModelForEvaluationTest, ReadsTheNewestValidCheckpointAndTheLearnersFlags) {
  testing::ScopedTempDir root("eval_ckpt");
  std::unique_ptr<PolicyModel> old_weights = TinyOfVocab(11), new_weights = TinyOfVocab(12);
  const std::string config = "--model=tiny\n--tiny_vocab_size=16\n--objective=asympo\n";
  const std::string old_dir = WriteCheckpoint(root.path(), 100, *old_weights, config);
  const std::string new_dir = WriteCheckpoint(root.path(), 200, *new_weights, config);

  EvaluationModelSource source;
  source.checkpoint = root.path();
  std::string described;
  absl::StatusOr<std::unique_ptr<PolicyModel>> m =
      LoadModelForEvaluation(source, ModelOptions(), &described);
  ASSERT_OK(m);
  EXPECT_EQ((*m)->config().vocab_size, 16);
  EXPECT_TRUE(SameWeights(**m, *new_weights));
  EXPECT_THAT(described, HasSubstr("version 200"));

  // A corrupt newest checkpoint is skipped for the one before.
  std::ofstream(new_dir + "/" + kCheckpointStateFile, std::ios::app) << "x";
  m = LoadModelForEvaluation(source, ModelOptions(), &described);
  ASSERT_OK(m);
  EXPECT_TRUE(SameWeights(**m, *old_weights));

  // Named directly, the corrupt one is an error that says why.
  source.checkpoint = new_dir;
  EXPECT_THAT(LoadModelForEvaluation(source, ModelOptions(), nullptr).status().message(),
              HasSubstr("CRC-32C"));
}

TEST(LoadModelForEvaluationTest, ErrorsNameTheMismatch) {
  testing::ScopedTempDir root("eval_ckpt_bad");
  std::unique_ptr<PolicyModel> weights = TinyOfVocab(5, 16);
  WriteCheckpoint(root.path(), 7, *weights, "--model=tiny\n--tiny_vocab_size=16\n");
  EvaluationModelSource source;
  source.checkpoint = root.path();
  source.tiny_vocab_size = 32;  // not what the learner had
  EXPECT_THAT(LoadModelForEvaluation(source, ModelOptions(), nullptr).status().message(),
              HasSubstr("does not fit the tiny model (vocabulary 32)"));
  source.checkpoint = root.path() + "/absent";
  EXPECT_THAT(LoadModelForEvaluation(source, ModelOptions(), nullptr).status().message(),
              HasSubstr("neither a checkpoint directory"));
}

TEST(CheckpointConfigFlagTest, ReadsBothFlagForms) {
  EXPECT_EQ(CheckpointConfigFlag("--model=/m\n--seed=3\n", "model"), "/m");
  EXPECT_EQ(CheckpointConfigFlag("--model\n/m2\n", "model"), "/m2");
  EXPECT_EQ(CheckpointConfigFlag("--models=x\n", "model"), "");
  EXPECT_EQ(CheckpointConfigFlag("", "model"), "");
}

}  // namespace
}  // namespace asympo::rollout
