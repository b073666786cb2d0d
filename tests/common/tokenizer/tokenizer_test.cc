#include "common/tokenizer/tokenizer.h"

#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/tokenizer/tokenizer_text.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"

namespace asympo {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using tokenizer_internal::BytesToByteLevel;

// The Qwen2/Qwen3 pre-tokenization regex.
constexpr char kQwenPattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Ids of the extra tokens of the test vocabulary; bytes are ids 0..255
// (byte b has id b), then merges produce 256.., then added tokens.
enum : int32_t {
  kOSpace = 256,  // "oĠ": would merge "hello world" across pre-tokens.
  kHe,            // "he"
  kLl,            // "ll"
  kHell,          // "hell"
  kHello,         // "hello"
  kSpaceW,        // "Ġw"
  kOr,            // "or"
  kSpaceWor,      // "Ġwor"
  kSpaceWorl,     // "Ġworl"
  kSpaceWorld,    // "Ġworld"
  kAa,            // "aa"
  kBc,            // "bc" (ranked before "ab")
  kAb,            // "ab"
  kOneTwo,        // "12": digits are split one by one, so never used
  kSpaceSpace,    // "ĠĠ"
  kSpaceB,        // "Ġb"
  kXyz = 290,     // "xyz": in the vocabulary but no merge builds it
  kEnd = 300,     // "<|end|>", special
  kThink,         // "<think>", not special
  kMask,          // "<mask>", lstrip + rstrip
  kCat,           // "cat", single_word
  kEndOfText,     // "<|endoftext|>", special, shares a prefix with <|end|>
  kCafe,          // "café", normalized (matches NFD input too)
};

struct Options {
  nlohmann::json normalizer = {{"type", "NFC"}};
  nlohmann::json post_processor = {{"type", "ByteLevel"}};
  bool ignore_merges = false;
};

// A small tokenizer.json in the shape of Qwen3's.
std::string TestTokenizerJson(const Options& options = {}) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[BytesToByteLevel(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"o", "Ġ"}, {"h", "e"},   {"l", "l"},    {"he", "ll"},   {"hell", "o"}, {"Ġ", "w"},
      {"o", "r"}, {"Ġw", "or"}, {"Ġwor", "l"}, {"Ġworl", "d"}, {"a", "a"},    {"b", "c"},
      {"a", "b"}, {"1", "2"},   {"Ġ", "Ġ"},    {"Ġ", "b"}};
  nlohmann::json merge_list = nlohmann::json::array();
  int32_t id = 256;
  for (const auto& [l, r] : merges) {
    vocab[l + r] = id++;
    // Both serializations: "l r" strings and [l, r] pairs.
    if (id % 2) {
      merge_list.push_back(l + " " + r);
    } else {
      merge_list.push_back({l, r});
    }
  }
  vocab["xyz"] = kXyz;
  auto added = [](int32_t id, const char* content, bool special, bool normalized) {
    return nlohmann::json{{"id", id},          {"content", content}, {"single_word", false},
                          {"lstrip", false},   {"rstrip", false},    {"normalized", normalized},
                          {"special", special}};
  };
  nlohmann::json added_tokens = nlohmann::json::array(
      {added(kEnd, "<|end|>", true, false), added(kThink, "<think>", false, false),
       added(kMask, "<mask>", true, false), added(kCat, "cat", false, false),
       added(kEndOfText, "<|endoftext|>", true, false), added(kCafe, "caf\u00e9", false, true)});
  added_tokens[2]["lstrip"] = true;
  added_tokens[2]["rstrip"] = true;
  added_tokens[3]["single_word"] = true;
  nlohmann::json byte_level = {{"type", "ByteLevel"},
                               {"add_prefix_space", false},
                               {"trim_offsets", false},
                               {"use_regex", false}};
  nlohmann::json root = {{"version", "1.0"},
                         {"truncation", nullptr},
                         {"padding", nullptr},
                         {"added_tokens", added_tokens},
                         {"normalizer", options.normalizer},
                         {"pre_tokenizer",
                          {{"type", "Sequence"},
                           {"pretokenizers",
                            {{{"type", "Split"},
                              {"pattern", {{"Regex", kQwenPattern}}},
                              {"behavior", "Isolated"},
                              {"invert", false}},
                             byte_level}}}},
                         {"post_processor", options.post_processor},
                         {"decoder", byte_level},
                         {"model",
                          {{"type", "BPE"},
                           {"dropout", nullptr},
                           {"unk_token", nullptr},
                           {"continuing_subword_prefix", ""},
                           {"end_of_word_suffix", ""},
                           {"fuse_unk", false},
                           {"byte_fallback", false},
                           {"ignore_merges", options.ignore_merges},
                           {"vocab", vocab},
                           {"merges", merge_list}}}};
  return root.dump();
}

std::unique_ptr<Tokenizer> Load(const Options& options = {}) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(TestTokenizerJson(options));
  EXPECT_OK(tok);
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::vector<int32_t> Bytes(const std::string& s) {
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(s.data()),
                              reinterpret_cast<const unsigned char*>(s.data()) + s.size());
}

TEST(TokenizerTest, MergesByRankWithinPreTokens) {
  auto tok = Load();
  // "oĠ" has the best rank but "o" and " " are in different pre-tokens.
  EXPECT_THAT(tok->Encode("hello world"), ElementsAre(kHello, kSpaceWorld));
  // "bc" outranks "ab": rank order, not left to right.
  EXPECT_THAT(tok->Encode("abc"), ElementsAre('a', kBc));
  // Equal pairs merge leftmost first.
  EXPECT_THAT(tok->Encode("aaaaa"), ElementsAre(kAa, kAa, 'a'));
  // Unmergeable bytes stay single bytes; multi-byte characters too.
  EXPECT_EQ(tok->Encode("\xe4\xbd\xa0"), Bytes("\xe4\xbd\xa0"));
}

TEST(TokenizerTest, PreTokenizerRegexSplitsDigitsAndWhitespace) {
  auto tok = Load();
  // \p{N} takes one digit at a time, so the "12" merge never applies.
  EXPECT_THAT(tok->Encode("12"), ElementsAre('1', '2'));
  // \s+(?!\S) leaves the last space of a run to the word after it.
  EXPECT_THAT(tok->Encode("a   b"), ElementsAre('a', kSpaceSpace, kSpaceB));
  // Contractions split off case-insensitively: "I" + "'M".
  EXPECT_THAT(tok->Encode("I'M"), ElementsAre('I', '\'', 'M'));
}

TEST(TokenizerTest, RoundTripsText) {
  auto tok = Load();
  for (const std::string s :
       {"", "hello world", "  leading and trailing  \n\t", "tabs\t\tand\r\nnewlines\n\n",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c",  // 你好，世界
        "emoji \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb\xf0\x9f\x8f\xbd",
        "$\\frac{1}{2}$ 1234567890", "control \x01\x7f bytes"}) {
    absl::StatusOr<std::string> decoded = tok->Decode(tok->Encode(s));
    ASSERT_OK(decoded);
    EXPECT_EQ(*decoded, s);
  }
}

TEST(TokenizerTest, NormalizesToNfcBeforeEncoding) {
  auto tok = Load();
  const std::vector<int32_t> composed = tok->Encode("\u00e9");  // é
  EXPECT_EQ(composed, Bytes("\u00e9"));
  EXPECT_EQ(tok->Encode("e\u0301"), composed);  // e + combining acute
  EXPECT_EQ(*tok->Decode(tok->Encode("e\u0301")), "\u00e9");

  Options no_normalizer;
  no_normalizer.normalizer = nullptr;
  auto raw = Load(no_normalizer);
  EXPECT_EQ(raw->Encode("e\u0301"), Bytes("e\u0301"));
}

TEST(TokenizerTest, SplitsOnAddedTokensLongestFirst) {
  auto tok = Load();
  EXPECT_THAT(tok->Encode("hi<|end|>there"), ElementsAre('h', 'i', kEnd, 't', kHe, 'r', 'e'));
  EXPECT_THAT(tok->Encode("<|endoftext|><|end|>"), ElementsAre(kEndOfText, kEnd));
  EXPECT_THAT(tok->Encode("<think>\n"), ElementsAre(kThink, '\n'));
  // An unfinished token is ordinary text.
  EXPECT_EQ(tok->Encode("<|end"), Bytes("<|end"));
}

TEST(TokenizerTest, HonorsAddedTokenFlags) {
  auto tok = Load();
  // lstrip/rstrip: the whitespace around <mask> is swallowed.
  EXPECT_THAT(tok->Encode("a  <mask>  b"), ElementsAre('a', kMask, 'b'));
  // single_word: only outside words.
  EXPECT_THAT(tok->Encode("cat"), ElementsAre(kCat));
  EXPECT_THAT(tok->Encode("a cat."), ElementsAre('a', ' ', kCat, '.'));
  EXPECT_EQ(tok->Encode("concat"), Bytes("concat"));
  // normalized: "café" also matches its NFD spelling.
  EXPECT_THAT(tok->Encode("caf\u00e9"), ElementsAre(kCafe));
  EXPECT_THAT(tok->Encode("cafe\u0301"), ElementsAre(kCafe));
}

TEST(TokenizerTest, DecodeSkipsOnlySpecialTokensWhenAsked) {
  auto tok = Load();
  const std::vector<int32_t> ids = {kEnd, kThink, kHello, kEndOfText};
  EXPECT_EQ(*tok->Decode(ids), "<|end|><think>hello<|endoftext|>");
  EXPECT_EQ(*tok->Decode(ids, /*skip_special_tokens=*/true), "<think>hello");
  EXPECT_TRUE(tok->IsSpecial(kEnd));
  EXPECT_FALSE(tok->IsSpecial(kThink));
  EXPECT_FALSE(tok->IsSpecial(kHello));
}

TEST(TokenizerTest, DecodeReplacesPartialCharacters) {
  auto tok = Load();
  // The first two bytes of 你 (E4 BD A0).
  const std::vector<int32_t> ids = {'a', 0xE4, 0xBD};
  EXPECT_EQ(*tok->Decode(ids), "a\xef\xbf\xbd");
  EXPECT_EQ(*tok->DecodeBytes(ids), "a\xe4\xbd");
}

TEST(TokenizerTest, DecodeRejectsUnknownIdsNamingThem) {
  auto tok = Load();
  for (int32_t bad : {-1, 280, 100000}) {
    absl::StatusOr<std::string> s = tok->Decode({kHello, bad});
    ASSERT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            "token id " + std::to_string(bad) + " at position 1"))
        << bad;
  }
}

TEST(TokenizerTest, EncodeRepairsInvalidUtf8) {
  auto tok = Load();
  EXPECT_EQ(tok->Encode("a\xff"
                        "b"),
            tok->Encode("a\xef\xbf\xbd"
                        "b"));
}

TEST(TokenizerTest, LooksUpTokensAndIds) {
  auto tok = Load();
  EXPECT_EQ(tok->vocab_size(), kCafe + 1);
  EXPECT_EQ(tok->TokenToId("Ġworld"), kSpaceWorld);
  EXPECT_EQ(tok->TokenToId("<|end|>"), kEnd);
  EXPECT_EQ(tok->TokenToId("missing"), std::nullopt);
  EXPECT_EQ(tok->IdToToken(kSpaceWorld), "Ġworld");
  EXPECT_EQ(tok->IdToToken(kEnd), "<|end|>");
  EXPECT_EQ(tok->IdToToken(280), std::nullopt);  // A hole in the ids.
  EXPECT_EQ(tok->IdToToken(-3), std::nullopt);
  EXPECT_EQ(tok->added_tokens().size(), 6u);
}

TEST(TokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  EXPECT_EQ(Load()->Encode("xyz"), Bytes("xyz"));
  Options options;
  options.ignore_merges = true;
  EXPECT_THAT(Load(options)->Encode("xyz"), ElementsAre(kXyz));
}

TEST(TokenizerTest, TemplatePostProcessorAddsSpecialTokensOnRequest) {
  Options options;
  options.post_processor = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}}}},
      {"special_tokens",
       {{"<|end|>", {{"id", "<|end|>"}, {"ids", {kEnd}}, {"tokens", {"<|end|>"}}}},
        {"<|endoftext|>",
         {{"id", "<|endoftext|>"}, {"ids", {kEndOfText}}, {"tokens", {"<|endoftext|>"}}}}}}};
  auto tok = Load(options);
  EXPECT_THAT(tok->Encode("hello"), ElementsAre(kHello));
  EXPECT_THAT(tok->Encode("hello", /*add_special_tokens=*/true),
              ElementsAre(kEnd, kHello, kEndOfText));
}

TEST(TokenizerTest, IsSafeToShareAcrossThreads) {
  auto tok = Load();
  const std::string text = "hello world, aaaa abc <|end|> \xe4\xbd\xa0\xe5\xa5\xbd   12";
  const std::vector<int32_t> expected = tok->Encode(text);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) mismatches[t] += tok->Encode(text) != expected;
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

// ----------------------------------------------------------------- errors

absl::Status LoadError(const std::function<void(nlohmann::json*)>& mutate) {
  nlohmann::json root = nlohmann::json::parse(TestTokenizerJson());
  mutate(&root);
  return Tokenizer::FromJson(root.dump()).status();
}

TEST(TokenizerErrorsTest, NameWhatIsUnsupportedOrWrong) {
  struct Case {
    std::function<void(nlohmann::json*)> mutate;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json* j) { (*j)["model"]["type"] = "Unigram"; }, "\"Unigram\""},
      {[](nlohmann::json* j) { (*j)["model"]["byte_fallback"] = true; }, "byte_fallback"},
      {[](nlohmann::json* j) { (*j)["model"]["dropout"] = 0.1; }, "dropout"},
      {[](nlohmann::json* j) {
         (*j)["normalizer"] = {{"type", "Lowercase"}};
       },
       "\"Lowercase\""},
      {[](nlohmann::json* j) {
         (*j)["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "\"Whitespace\""},
      {[](nlohmann::json* j) { (*j)["pre_tokenizer"]["pretokenizers"].erase(1); },
       "no final ByteLevel"},
      {[](nlohmann::json* j) { (*j)["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Odd"; },
       "behavior is \"Odd\""},
      {[](nlohmann::json* j) {
         (*j)["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
       },
       "does not compile"},
      {[](nlohmann::json* j) {
         (*j)["decoder"] = {{"type", "WordPiece"}};
       },
       "ByteLevel decoder"},
      {[](nlohmann::json* j) {
         (*j)["post_processor"] = {{"type", "Custom"}};
       },
       "\"Custom\""},
      {[](nlohmann::json* j) { (*j)["model"]["merges"].push_back("he qq"); },
       "\"qq\" is not in model.vocab"},
      {[](nlohmann::json* j) { (*j)["model"]["merges"].push_back("nospace"); },
       "two tokens separated by one space"},
      {[](nlohmann::json* j) { (*j)["model"]["vocab"].erase("Ġ"); }, "byte 0x20"},
      {[](nlohmann::json* j) { (*j)["model"]["vocab"]["dup"] = 5; }, "gives id 5 to both"},
      {[](nlohmann::json* j) { (*j)["model"]["vocab"]["neg"] = -5; }, "token ids must be"},
      {[](nlohmann::json* j) { (*j)["model"]["vocab"]["huge"] = 2000000000; },
       "ids above 16777215 are not supported"},
      {[](nlohmann::json* j) {
         (*j)["model"]["merges"].push_back({"h", "e", "x"});
       },
       "model.merges[16] is malformed"},
      {[](nlohmann::json* j) { (*j)["model"]["vocab"] = nlohmann::json::array(); },
       "model.vocab is missing or not an object"},
      {[](nlohmann::json* j) { (*j)["added_tokens"][0]["content"] = 7; }, "added_tokens[0]"},
      {[](nlohmann::json* j) { j->erase("model"); }, "model is missing"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const absl::Status s = LoadError(cases[i].mutate);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, cases[i].message))
        << "case " << i << ": " << s;
  }
}

TEST(TokenizerErrorsTest, RejectsMalformedJson) {
  const absl::Status s = Tokenizer::FromJson("{\"model\": ").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "not valid JSON"));
}

TEST(TokenizerErrorsTest, MissingFileIsNotFoundNamingThePath) {
  const absl::Status s = Tokenizer::FromFile("/nonexistent/dir/tokenizer.json").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, "/nonexistent/dir/tokenizer.json"));
}

TEST(TokenizerErrorsTest, FileErrorsNameThePath) {
  const std::string path = ::testing::TempDir() + "/bad_tokenizer.json";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("{\"model\": {\"type\": \"WordPiece\"}}", f);
  std::fclose(f);
  const absl::Status s = Tokenizer::FromFile(path).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"WordPiece\""));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace asympo
