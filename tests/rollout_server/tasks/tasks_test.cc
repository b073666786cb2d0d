#include "rollout_server/tasks/tasks.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_text.h"
#include "nlohmann/json.hpp"
#include "rollout_server/tasks/math_verifier.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo::rollout {
namespace {

using ::asympo::testing::StatusIs;
using synthetic::kBosId;
using synthetic::kEosId;
using synthetic::kFirstMarkerId;
using synthetic::kFirstSymbolId;
using synthetic::kSepId;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const char* const kSyntheticNames[] = {"copy", "reverse", "successor", "sort"};

std::unique_ptr<Task> MakeTask(const std::string& name, int64_t vocab = 64) {
  TaskOptions o;
  o.name = name;
  o.vocab_size = vocab;
  absl::StatusOr<std::unique_ptr<Task>> task = CreateTask(o);
  EXPECT_OK(task);
  return task.ok() ? *std::move(task) : nullptr;
}

// The prompt's symbols (alphabet indices), after checking the layout
// [BOS, marker, symbols..., SEP].
std::vector<int32_t> PromptSymbols(const TaskPrompt& p) {
  EXPECT_GE(p.prompt_tokens.size(), 3u);
  EXPECT_EQ(p.prompt_tokens.front(), kBosId);
  EXPECT_EQ(p.prompt_tokens.back(), kSepId);
  std::vector<int32_t> s;
  for (size_t i = 2; i + 1 < p.prompt_tokens.size(); ++i) {
    s.push_back(p.prompt_tokens[i] - kFirstSymbolId);
  }
  return s;
}

// The expected response (target ids, then EOS), written out here for each
// task independently of tasks.cc.
std::vector<int32_t> ExpectedResponse(const std::string& task, const TaskPrompt& p,
                                      int32_t alphabet = 4) {
  std::vector<int32_t> s = PromptSymbols(p);
  if (task == "reverse") {
    s = std::vector<int32_t>(s.rbegin(), s.rend());
  } else if (task == "successor") {
    for (int32_t& x : s) x = x + 1 == alphabet ? 0 : x + 1;
  } else if (task == "sort") {
    std::sort(s.begin(), s.end());
  } else {
    EXPECT_EQ(task, "copy");
  }
  for (int32_t& x : s) x += kFirstSymbolId;
  s.push_back(kEosId);
  return s;
}

TEST(TaskNamesTest, ListsEveryTaskWithADescription) {
  std::vector<std::string> names;
  for (const auto& [name, description] : TaskNames()) {
    names.push_back(name);
    EXPECT_FALSE(description.empty()) << name;
  }
  EXPECT_THAT(names, ElementsAre("copy", "reverse", "successor", "sort", "add", "add_tool", "math"));
}

TEST(TaskCreateTest, UnknownNameListsTheTasks) {
  TaskOptions o;
  o.name = "copyy";
  o.vocab_size = 64;
  absl::StatusOr<std::unique_ptr<Task>> task = CreateTask(o);
  ASSERT_THAT(task, StatusIs(absl::StatusCode::kInvalidArgument, "--task=copyy: no such task"));
  EXPECT_THAT(task.status().message(), HasSubstr("copy, reverse, successor, sort, add, add_tool, math"));
}

TEST(TaskCreateTest, RejectsNonPositiveVocabulary) {
  TaskOptions o;
  o.name = "copy";
  o.vocab_size = 0;
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("vocab_size is 0"));
}

TEST(TaskCreateTest, RejectsVocabularyTooSmallForTheAlphabet) {
  for (const char* name : kSyntheticNames) {
    TaskOptions o;
    o.name = name;
    o.vocab_size = kFirstSymbolId + 3;  // the default alphabet has 4 symbols
    absl::StatusOr<std::unique_ptr<Task>> task = CreateTask(o);
    ASSERT_THAT(task, StatusIs(absl::StatusCode::kInvalidArgument, "vocab_size is 11")) << name;
    o.vocab_size = kFirstSymbolId + 4;
    ASSERT_OK(CreateTask(o)) << name;
    EXPECT_EQ((*CreateTask(o))->min_vocab_size(), kFirstSymbolId + 4);
    // A larger alphabet needs a larger vocabulary.
    o.synthetic_alphabet_size = 5;
    EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("needs at least 13"));
  }
}

TEST(TaskCreateTest, SyntheticOptionErrorsNameTheOption) {
  TaskOptions o;
  o.name = "copy";
  o.vocab_size = 64;
  o.data_path = "rows.jsonl";
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("data_path is set"));
  o.data_path.clear();
  o.tokenizer_path = "tokenizer.json";
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("tokenizer_path is set"));
  o.tokenizer_path.clear();
  o.synthetic_alphabet_size = 1;
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("synthetic_alphabet_size is 1"));
  o.synthetic_alphabet_size = 0;
  o.synthetic_min_length = 5;
  o.synthetic_max_length = 3;
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("synthetic_min_length"));
  o.synthetic_min_length = -1;
  o.synthetic_max_length = 0;
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("synthetic_min_length"));
}

TEST(TaskSyntheticTest, PromptsAreDeterministicUnderASeedAndInsideTheVocabulary) {
  for (const char* name : kSyntheticNames) {
    std::unique_ptr<Task> a = MakeTask(name), b = MakeTask(name), c = MakeTask(name);
    std::mt19937_64 rng_a(7), rng_b(7), rng_c(8);
    bool any_difference = false;
    std::set<size_t> lengths;
    std::set<int32_t> markers;
    for (int i = 0; i < 200; ++i) {
      const TaskPrompt pa = a->NextPrompt(rng_a), pb = b->NextPrompt(rng_b);
      const TaskPrompt pc = c->NextPrompt(rng_c);
      EXPECT_EQ(pa.prompt_id, pb.prompt_id);
      EXPECT_EQ(pa.prompt_tokens, pb.prompt_tokens);
      EXPECT_EQ(pa.reference, pb.reference);
      any_difference |= pa.prompt_tokens != pc.prompt_tokens;
      for (int32_t id : pa.prompt_tokens) {
        EXPECT_GE(id, 0);
        EXPECT_LT(id, a->min_vocab_size());
      }
      const std::vector<int32_t> symbols = PromptSymbols(pa);
      for (int32_t s : symbols) {
        EXPECT_GE(s, 0);
        EXPECT_LT(s, 4);
      }
      lengths.insert(symbols.size());
      markers.insert(pa.prompt_tokens[1]);
      // The longest expected response fits in max_new_tokens.
      EXPECT_LE(ExpectedResponse(name, pa).size(), static_cast<size_t>(a->max_new_tokens()));
    }
    EXPECT_TRUE(any_difference) << name << ": seeds 7 and 8 gave the same prompts";
    EXPECT_THAT(lengths, ElementsAre(2u, 3u, 4u)) << name;
    ASSERT_EQ(markers.size(), 1u);
    EXPECT_GE(*markers.begin(), kFirstMarkerId);
    EXPECT_LT(*markers.begin(), kFirstSymbolId);
    EXPECT_THAT(a->stop_token_ids(), ElementsAre(kEosId));
  }
}

TEST(TaskSyntheticTest, TasksUseDistinctMarkers) {
  std::set<int32_t> markers;
  std::mt19937_64 rng(1);
  for (const char* name : kSyntheticNames) {
    markers.insert(MakeTask(name)->NextPrompt(rng).prompt_tokens[1]);
  }
  EXPECT_EQ(markers.size(), std::size(kSyntheticNames));
}

TEST(TaskSyntheticTest, ScoresHandMadeResponses) {
  for (const char* name : kSyntheticNames) {
    SCOPED_TRACE(name);
    std::unique_ptr<Task> task = MakeTask(name);
    std::mt19937_64 rng(3);
    for (int i = 0; i < 50; ++i) {
      const TaskPrompt p = task->NextPrompt(rng);
      const std::vector<int32_t> perfect = ExpectedResponse(name, p);
      const double n = static_cast<double>(perfect.size() - 1);  // target symbols
      auto score = [&](const std::vector<int32_t>& r) { return task->Score(p, r); };

      EXPECT_EQ(score(perfect).reward, 1.0);
      EXPECT_TRUE(score(perfect).correct);

      // One wrong symbol: n of the n + 1 positions right.
      std::vector<int32_t> partial = perfect;
      partial[0] = kFirstSymbolId + (partial[0] - kFirstSymbolId + 1) % 4;
      EXPECT_DOUBLE_EQ(score(partial).reward, n / (n + 1));
      EXPECT_FALSE(score(partial).correct);

      // Every symbol wrong, EOS in place: only the EOS position counts.
      std::vector<int32_t> wrong = perfect;
      for (size_t j = 0; j + 1 < wrong.size(); ++j) {
        wrong[j] = kFirstSymbolId + (wrong[j] - kFirstSymbolId + 1) % 4;
      }
      EXPECT_DOUBLE_EQ(score(wrong).reward, 1 / (n + 1));
      EXPECT_FALSE(score(wrong).correct);

      // Pad, BOS and SEP are never right.
      EXPECT_EQ(score(std::vector<int32_t>(perfect.size(), kSepId)).reward, 0.0);

      EXPECT_EQ(score({}).reward, 0.0);
      EXPECT_FALSE(score({}).correct);

      // The target without its stop token.
      const std::vector<int32_t> unstopped(perfect.begin(), perfect.end() - 1);
      EXPECT_DOUBLE_EQ(score(unstopped).reward, n / (n + 1));
      EXPECT_FALSE(score(unstopped).correct);

      // An extra symbol before EOS: n right out of n + 2 positions.
      std::vector<int32_t> extra = unstopped;
      extra.push_back(kFirstSymbolId);
      extra.push_back(kEosId);
      EXPECT_DOUBLE_EQ(score(extra).reward, n / (n + 2));
      EXPECT_FALSE(score(extra).correct);

      // Tokens after a correct EOS still count against the response.
      std::vector<int32_t> trailing = perfect;
      trailing.push_back(kFirstSymbolId);
      EXPECT_DOUBLE_EQ(score(trailing).reward, (n + 1) / (n + 2));
      EXPECT_FALSE(score(trailing).correct);

      // Stopping at once: position 0 expects a symbol, so nothing is right.
      EXPECT_EQ(score({kEosId}).reward, 0.0);
      EXPECT_FALSE(score({kEosId}).correct);
    }
  }
}

TEST(TaskSyntheticTest, RewardsStayInTheUnitInterval) {
  for (const char* name : kSyntheticNames) {
    std::unique_ptr<Task> task = MakeTask(name);
    std::mt19937_64 rng(11);
    for (int i = 0; i < 2000; ++i) {
      const TaskPrompt p = task->NextPrompt(rng);
      std::vector<int32_t> response(rng() % 9);
      // Mostly EOS and symbols, sometimes any id.
      const int32_t likely[] = {kEosId, kFirstSymbolId, kFirstSymbolId + 1, kFirstSymbolId + 2,
                                kFirstSymbolId + 3};
      for (int32_t& t : response) {
        t = rng() % 4 == 0 ? static_cast<int32_t>(rng() % 64) : likely[rng() % 5];
      }
      const TaskScore s = task->Score(p, response);
      EXPECT_GE(s.reward, 0.0);
      EXPECT_LE(s.reward, 1.0);
      EXPECT_EQ(s.correct, s.reward == 1.0) << name;
    }
  }
}

TEST(TaskSyntheticTest, AlphabetAndLengthOptionsChangeThePrompts) {
  TaskOptions o;
  o.name = "successor";
  o.vocab_size = 64;
  o.synthetic_alphabet_size = 6;
  o.synthetic_min_length = 5;
  o.synthetic_max_length = 5;
  absl::StatusOr<std::unique_ptr<Task>> task = CreateTask(o);
  ASSERT_OK(task);
  EXPECT_EQ((*task)->min_vocab_size(), kFirstSymbolId + 6);
  EXPECT_EQ((*task)->max_new_tokens(), 7);
  std::mt19937_64 rng(5);
  std::set<int32_t> seen;
  for (int i = 0; i < 100; ++i) {
    const TaskPrompt p = (*task)->NextPrompt(rng);
    const std::vector<int32_t> symbols = PromptSymbols(p);
    EXPECT_EQ(symbols.size(), 5u);
    seen.insert(symbols.begin(), symbols.end());
    // Symbol 5 wraps to 0 with 6 symbols.
    EXPECT_EQ((*task)->Score(p, ExpectedResponse("successor", p, 6)).reward, 1.0);
  }
  EXPECT_THAT(seen, ElementsAre(0, 1, 2, 3, 4, 5));
}

// The held-out split: a fixed quarter of the sequences that training never
// sees, in a fixed order.
TEST(TaskEvaluationTest, HeldOutPromptsAreNeverServedForTraining) {
  for (const char* name : kSyntheticNames) {
    std::unique_ptr<Task> task = MakeTask(name);
    ASSERT_NE(task, nullptr);
    const std::vector<TaskPrompt> held_out = task->EvaluationPrompts(0);
    std::set<std::vector<int32_t>> held;
    for (const TaskPrompt& p : held_out) {
      EXPECT_EQ(task->Score(p, ExpectedResponse(name, p, 4)).reward, 1.0) << p.prompt_id;
      held.insert(p.prompt_tokens);
    }
    // 4^2 + 4^3 + 4^4 = 336 sequences, about a quarter held out, all distinct.
    EXPECT_EQ(held.size(), held_out.size()) << name;
    EXPECT_GT(held_out.size(), 336u / 8) << name;
    EXPECT_LT(held_out.size(), 336u / 2) << name;
    std::mt19937_64 rng(7);
    std::set<std::vector<int32_t>> trained;
    for (int i = 0; i < 5000; ++i) {
      const TaskPrompt p = task->NextPrompt(rng);
      EXPECT_EQ(held.count(p.prompt_tokens), 0u) << name << " served " << p.prompt_id;
      trained.insert(p.prompt_tokens);
    }
    // Every other sequence is still drawn.
    EXPECT_EQ(trained.size() + held.size(), 336u) << name;
  }
}

TEST(TaskEvaluationTest, HeldOutPromptsAreFixedOrderedAndBounded) {
  std::unique_ptr<Task> task = MakeTask("reverse");
  const std::vector<TaskPrompt> all = task->EvaluationPrompts(0);
  const std::vector<TaskPrompt> again = MakeTask("reverse")->EvaluationPrompts(0);
  ASSERT_EQ(all.size(), again.size());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].prompt_tokens, again[i].prompt_tokens);
    EXPECT_EQ(all[i].prompt_id, absl::StrCat("reverse-eval-", i));
    if (i > 0) {
      EXPECT_GE(all[i].prompt_tokens.size(), all[i - 1].prompt_tokens.size());
    }
  }
  const std::vector<TaskPrompt> first5 = task->EvaluationPrompts(5);
  ASSERT_EQ(first5.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(first5[i].prompt_tokens, all[i].prompt_tokens);
}

TEST(TaskEvaluationTest, LargeSpacesDrawDistinctHeldOutPrompts) {
  TaskOptions o;
  o.name = "sort";
  o.vocab_size = 64;
  o.synthetic_alphabet_size = 20;
  o.synthetic_min_length = 6;
  o.synthetic_max_length = 10;
  absl::StatusOr<std::unique_ptr<Task>> task = CreateTask(o);
  ASSERT_OK(task);
  const std::vector<TaskPrompt> held_out = (*task)->EvaluationPrompts(300);
  ASSERT_EQ(held_out.size(), 300u);
  std::set<std::vector<int32_t>> held;
  for (const TaskPrompt& p : held_out) held.insert(p.prompt_tokens);
  EXPECT_EQ(held.size(), 300u);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 3000; ++i) {
    EXPECT_EQ(held.count((*task)->NextPrompt(rng).prompt_tokens), 0u);
  }
}

// A space too small to split (2 sequences) trains and evaluates on all.
TEST(TaskEvaluationTest, TinySpacesHaveNoSplit) {
  TaskOptions o;
  o.name = "copy";
  o.vocab_size = 64;
  o.synthetic_alphabet_size = 2;
  o.synthetic_min_length = 1;
  o.synthetic_max_length = 1;
  absl::StatusOr<std::unique_ptr<Task>> task = CreateTask(o);
  ASSERT_OK(task);
  EXPECT_EQ((*task)->EvaluationPrompts(0).size(), 2u);
  std::mt19937_64 rng(1);
  std::set<std::vector<int32_t>> trained;
  for (int i = 0; i < 100; ++i) trained.insert((*task)->NextPrompt(rng).prompt_tokens);
  EXPECT_EQ(trained.size(), 2u);
}

// ---------------------------------------------------------------------------
// The math task.

enum : int32_t { kImStart = 256, kImEnd, kEndOfText };

// A byte-level tokenizer.json without merges (byte b has id b) in the shape
// of Qwen3's, plus the chat tokens.
std::string WriteTokenizer(const testing::ScopedTempDir& dir, bool im_tokens = true,
                           bool end_of_text = true) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[tokenizer_internal::BytesToByteLevel(std::string(1, static_cast<char>(b)))] = b;
  }
  nlohmann::json added = nlohmann::json::array();
  auto add = [&](int32_t id, const char* content) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  };
  if (im_tokens) {
    add(kImStart, "<|im_start|>");
    add(kImEnd, "<|im_end|>");
  }
  if (end_of_text) add(kEndOfText, "<|endoftext|>");
  const nlohmann::json byte_level = {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", false},
                                     {"use_regex", true}};
  const nlohmann::json root = {{"version", "1.0"},
                               {"truncation", nullptr},
                               {"padding", nullptr},
                               {"added_tokens", added},
                               {"normalizer", nullptr},
                               {"pre_tokenizer", byte_level},
                               {"post_processor", nullptr},
                               {"decoder", byte_level},
                               {"model",
                                {{"type", "BPE"},
                                 {"dropout", nullptr},
                                 {"unk_token", nullptr},
                                 {"continuing_subword_prefix", ""},
                                 {"end_of_word_suffix", ""},
                                 {"fuse_unk", false},
                                 {"byte_fallback", false},
                                 {"ignore_merges", false},
                                 {"vocab", vocab},
                                 {"merges", nlohmann::json::array()}}}};
  const std::string path = dir.Path(absl::StrCat("tokenizer_", im_tokens, end_of_text, ".json"));
  std::ofstream(path) << root.dump();
  return path;
}

std::string WriteFile(const testing::ScopedTempDir& dir, const std::string& name,
                      const std::string& contents) {
  const std::string path = dir.Path(name);
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

std::vector<int32_t> Bytes(const std::string& s) {
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(s.data()),
                              reinterpret_cast<const unsigned char*>(s.data()) + s.size());
}

constexpr char kRows[] =
    "{\"prompt\": \"What is 2 + 3?\", \"answer\": \"5\"}\n"
    "\n"
    "{\"prompt\": \"Half of 9?\", \"answer\": \"9/2\", \"source\": \"hand\"}\r\n"
    "{\"prompt\": \"What is 6 * 7?\", \"answer\": \"42\"}\n";

TaskOptions MathOptions(const std::string& data, const std::string& tokenizer) {
  TaskOptions o;
  o.name = "math";
  o.vocab_size = 300;
  o.data_path = data;
  o.tokenizer_path = tokenizer;
  return o;
}

TEST(TaskMathTest, ServesEveryRowOncePerPassThroughTheTemplate) {
  testing::ScopedTempDir dir("math_task");
  TaskOptions o = MathOptions(WriteFile(dir, "rows.jsonl", kRows), WriteTokenizer(dir));
  o.math_max_new_tokens = 33;
  absl::StatusOr<std::unique_ptr<Task>> task = CreateTask(o);
  ASSERT_OK(task);
  EXPECT_EQ((*task)->name(), "math");
  EXPECT_EQ((*task)->max_new_tokens(), 33);
  EXPECT_EQ((*task)->min_vocab_size(), kEndOfText + 1);
  EXPECT_THAT((*task)->stop_token_ids(), ElementsAre(kImEnd));

  std::mt19937_64 rng(0);
  const std::map<std::string, std::string> answers = {
      {"math-1", "5"}, {"math-3", "9/2"}, {"math-4", "42"}};
  const std::map<std::string, std::string> questions = {
      {"math-1", "What is 2 + 3?"}, {"math-3", "Half of 9?"}, {"math-4", "What is 6 * 7?"}};
  for (int pass = 0; pass < 3; ++pass) {
    std::set<std::string> ids;
    for (int i = 0; i < 3; ++i) {
      const TaskPrompt p = (*task)->NextPrompt(rng);
      ids.insert(p.prompt_id);
      ASSERT_TRUE(answers.count(p.prompt_id)) << p.prompt_id;
      EXPECT_EQ(p.reference, answers.at(p.prompt_id));
      // <|im_start|> "user\n" question "\nPut ..." <|im_end|> "\n" <|im_start|> "assistant\n"
      std::vector<int32_t> expected = {kImStart};
      for (int32_t b :
           Bytes("user\n" + questions.at(p.prompt_id) + "\nPut the final answer in \\boxed{}.")) {
        expected.push_back(b);
      }
      expected.push_back(kImEnd);
      expected.push_back('\n');
      expected.push_back(kImStart);
      for (int32_t b : Bytes("assistant\n")) expected.push_back(b);
      EXPECT_EQ(p.prompt_tokens, expected);
    }
    EXPECT_EQ(ids.size(), 3u) << "pass " << pass << " repeated a row";
  }
}

TEST(TaskMathTest, EvaluationPromptsAreTheRowsInFileOrder) {
  testing::ScopedTempDir dir("math_eval");
  absl::StatusOr<std::unique_ptr<Task>> task =
      CreateTask(MathOptions(WriteFile(dir, "rows.jsonl", kRows), WriteTokenizer(dir)));
  ASSERT_OK(task);
  std::vector<std::string> ids;
  for (const TaskPrompt& p : (*task)->EvaluationPrompts(0)) ids.push_back(p.prompt_id);
  EXPECT_THAT(ids, ElementsAre("math-1", "math-3", "math-4"));
  EXPECT_EQ((*task)->EvaluationPrompts(2).size(), 2u);
  EXPECT_EQ((*task)->EvaluationPrompts(0)[1].reference, "9/2");
}

TEST(TaskMathTest, ShuffleFollowsTheSeed) {
  testing::ScopedTempDir dir("math_task");
  std::string rows;
  for (int i = 0; i < 20; ++i) {
    rows += absl::StrCat("{\"prompt\": \"q", i, "\", \"answer\": \"", i, "\"}\n");
  }
  const TaskOptions o = MathOptions(WriteFile(dir, "rows.jsonl", rows), WriteTokenizer(dir));
  auto order = [&](uint64_t seed) {
    std::unique_ptr<Task> task = *CreateTask(o);
    std::mt19937_64 rng(seed);
    std::vector<std::string> ids;
    for (int i = 0; i < 20; ++i) ids.push_back(task->NextPrompt(rng).prompt_id);
    return ids;
  };
  EXPECT_EQ(order(1), order(1));
  EXPECT_NE(order(1), order(2));
}

TEST(TaskMathTest, ScoresTheDecodedFinalAnswer) {
  testing::ScopedTempDir dir("math_task");
  absl::StatusOr<std::unique_ptr<Task>> task =
      CreateTask(MathOptions(WriteFile(dir, "rows.jsonl", kRows), WriteTokenizer(dir)));
  ASSERT_OK(task);
  TaskPrompt p;
  p.prompt_id = "math-3";
  p.reference = "9/2";
  auto response = [](const std::string& text) {
    std::vector<int32_t> ids = Bytes(text);
    ids.push_back(kImEnd);
    return ids;
  };
  TaskScore s = (*task)->Score(p, response("Half of 9 is \\boxed{\\frac{9}{2}}."));
  EXPECT_EQ(s.reward, 1.0);
  EXPECT_TRUE(s.correct);
  s = (*task)->Score(p, response("It is 4.5"));
  EXPECT_EQ(s.reward, 1.0);
  s = (*task)->Score(p, response("\\boxed{4}"));
  EXPECT_EQ(s.reward, 0.0);
  EXPECT_FALSE(s.correct);
  EXPECT_EQ((*task)->Score(p, {}).reward, 0.0);
  // An id the model has but the tokenizer does not: unreadable, no reward.
  std::vector<int32_t> beyond = Bytes("4.5");
  beyond.push_back(299);
  EXPECT_EQ((*task)->Score(p, beyond).reward, 0.0);
}

TEST(TaskMathTest, StopTokenDefaultsToTheTokenizersEos) {
  testing::ScopedTempDir dir("math_task");
  const std::string data = WriteFile(dir, "rows.jsonl", kRows);
  TaskOptions o = MathOptions(data, WriteTokenizer(dir, /*im_tokens=*/false));
  o.prompt_template = "Q: {prompt}\nA:";
  absl::StatusOr<std::unique_ptr<Task>> task = CreateTask(o);
  ASSERT_OK(task);
  EXPECT_THAT((*task)->stop_token_ids(), ElementsAre(kEndOfText));

  o.tokenizer_path = WriteTokenizer(dir);
  o.stop_token = "<|endoftext|>";
  ASSERT_OK(CreateTask(o));
  EXPECT_THAT((*CreateTask(o))->stop_token_ids(), ElementsAre(kEndOfText));

  o.stop_token = "<|eot|>";
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("stop_token \"<|eot|>\""));

  o.stop_token.clear();
  o.tokenizer_path = WriteTokenizer(dir, /*im_tokens=*/false, /*end_of_text=*/false);
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("stop_token is empty"));
}

TEST(TaskMathTest, OptionErrorsNameTheOption) {
  testing::ScopedTempDir dir("math_task");
  const std::string data = WriteFile(dir, "rows.jsonl", kRows);
  const std::string tokenizer = WriteTokenizer(dir);
  TaskOptions o = MathOptions(data, tokenizer);

  o.vocab_size = kEndOfText;  // one short
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("vocab_size is 258"));
  o.vocab_size = 300;

  o.prompt_template = "Question: {question}";
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("prompt_template has no \"{prompt}\""));
  o.prompt_template.clear();

  o.math_max_new_tokens = 0;
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("math_max_new_tokens"));
  o.math_max_new_tokens = 512;

  o.data_path.clear();
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("data_path is empty"));
  o.data_path = dir.Path("missing.jsonl");
  EXPECT_THAT(CreateTask(o), StatusIs(absl::StatusCode::kNotFound, "missing.jsonl"));
  o.data_path = data;

  o.tokenizer_path.clear();
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("tokenizer_path is empty"));

  // The default template needs the chat tokens.
  o.tokenizer_path = WriteTokenizer(dir, /*im_tokens=*/false);
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("no <|im_start|> token"));
}

TEST(TaskMathTest, BadJsonlLinesNameFileAndLine) {
  testing::ScopedTempDir dir("math_task");
  const std::string tokenizer = WriteTokenizer(dir);
  const std::string good = "{\"prompt\": \"1+1?\", \"answer\": \"2\"}\n";
  struct Case {
    std::string second_line;
    std::string message;
  };
  const Case kCases[] = {
      {"{\"prompt\": \"1+1?\", \"answer\": \"2\"", "not valid JSON"},
      {"[\"1+1?\", \"2\"]", "is array; each line must be a JSON object"},
      {"{\"answer\": \"2\"}", "field \"prompt\" is missing"},
      {"{\"prompt\": \"1+1?\"}", "field \"answer\" is missing"},
      {"{\"prompt\": \"1+1?\", \"answer\": 2}", "field \"answer\" is number; it must be a string"},
      {"{\"prompt\": null, \"answer\": \"2\"}", "field \"prompt\" is null"},
      {"{\"prompt\": \"1+1?\", \"answer\": \"  \"}", "field \"answer\" is empty"},
  };
  for (const Case& c : kCases) {
    const std::string data = WriteFile(dir, "bad.jsonl", good + c.second_line + "\n" + good);
    absl::Status s = CreateTask(MathOptions(data, tokenizer)).status();
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, data + ":2: ")) << c.second_line;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.second_line;
  }
  const std::string empty = WriteFile(dir, "empty.jsonl", "\n  \n");
  EXPECT_THAT(CreateTask(MathOptions(empty, tokenizer)).status().message(),
              HasSubstr("holds no rows"));
}

#ifdef ASYMPO_SOURCE_DIR
// The shipped sample: every row loads, and a response that boxes the row's
// answer earns reward 1 (so the answers are in a form the verifier reads).
TEST(TaskMathTest, SampleDatasetLoadsAndItsAnswersVerify) {
  testing::ScopedTempDir dir("math_task");
  const std::string data = std::string(ASYMPO_SOURCE_DIR) + "/deploy/tasks/math_sample.jsonl";
  absl::StatusOr<std::unique_ptr<Task>> task = CreateTask(MathOptions(data, WriteTokenizer(dir)));
  ASSERT_OK(task);
  std::ifstream in(data);
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line);
    const std::string answer = row["answer"];
    EXPECT_TRUE(NormalizeAnswer(answer).has_value()) << answer;
    EXPECT_EQ(MathReward("The answer is \\boxed{" + answer + "}.", answer), 1.0) << answer;
    ++rows;
  }
  EXPECT_GE(rows, 20);
  std::mt19937_64 rng(0);
  std::set<std::string> ids;
  for (int i = 0; i < rows; ++i) ids.insert((*task)->NextPrompt(rng).prompt_id);
  EXPECT_EQ(static_cast<int>(ids.size()), rows);
}
#endif

// With the real Qwen3 tokenizer.json (set ASYMPO_QWEN3_TOKENIZER to its
// path; the tokenizer reference test downloads one): the default template
// gives Qwen's chat ids and <|im_end|> stops.
TEST(TaskMathTest, Qwen3TokenizerFromEnvironment) {
  const char* path = std::getenv("ASYMPO_QWEN3_TOKENIZER");
  if (path == nullptr || *path == '\0') GTEST_SKIP() << "ASYMPO_QWEN3_TOKENIZER is not set";
  testing::ScopedTempDir dir("math_task");
  TaskOptions o = MathOptions(WriteFile(dir, "rows.jsonl", kRows), path);
  o.vocab_size = 151936;  // Qwen3's embedding rows
  absl::StatusOr<std::unique_ptr<Task>> task = CreateTask(o);
  ASSERT_OK(task);
  EXPECT_THAT((*task)->stop_token_ids(), ElementsAre(151645));  // <|im_end|>
  std::mt19937_64 rng(0);
  const TaskPrompt p = (*task)->NextPrompt(rng);
  EXPECT_EQ(p.prompt_tokens.front(), 151644);  // <|im_start|>
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(path);
  ASSERT_OK(tok);
  std::vector<int32_t> response = (*tok)->Encode("So the answer is \\boxed{" + p.reference + "}");
  response.push_back(151645);
  EXPECT_EQ((*task)->Score(p, response).reward, 1.0);
  o.vocab_size = 1000;
  EXPECT_THAT(CreateTask(o).status().message(), HasSubstr("vocab_size is 1000"));
}

}  // namespace
}  // namespace asympo::rollout
