// A Hugging Face tokenizer.json byte-level BPE tokenizer (GPT-2, Llama-3,
// Qwen2/Qwen3): text <-> token ids, with the ids Hugging Face tokenizers gives.
//
// Encoding follows the tokenizer.json pipeline: the text is cut at added
// tokens (special tokens like <|im_start|>; leftmost-longest, honoring
// single_word/lstrip/rstrip/normalized), each remaining piece is normalized
// (NFC etc.), split by the pre-tokenizer (Split regexes, then ByteLevel), and
// each resulting word is encoded by BPE merges in rank order. Decoding maps
// byte-level tokens back to bytes; added tokens decode to their content.
//
// Supported: model BPE (merges as strings or pairs, ignore_merges, unk_token);
// normalizer null / NFC / NFD / NFKC / NFKD / Sequence; pre_tokenizer ByteLevel
// or a Sequence of Split / Digits ending in ByteLevel; decoder ByteLevel;
// post_processor null / ByteLevel / TemplateProcessing / Bert- and
// RobertaProcessing / Sequence (single sequences). Anything else is refused
// at load with an error naming it. truncation and padding are ignored.
//
// Thread-safe: after FromFile/FromJson every method is const and may be
// called from many threads at once (the BPE word cache has its own mutex).
//
//   ASYMPO_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromFile("tokenizer.json"));
//   std::vector<int32_t> ids = tok->Encode("<|im_start|>user\nHi<|im_end|>");
//   ASYMPO_ASSIGN_OR_RETURN(std::string text, tok->Decode(ids));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace asympo {
namespace tokenizer_internal {
class AddedTokenMatcher;
class BpeModel;
class Normalizer;
class PreTokenizer;
struct PostProcessor;
}  // namespace tokenizer_internal

class Tokenizer {
 public:
  // One entry of tokenizer.json's "added_tokens".
  struct AddedToken {
    int32_t id = 0;
    std::string content;
    bool special = false;      // Skipped by Decode(..., skip_special_tokens=true).
    bool single_word = false;  // Matches only outside words.
    bool lstrip = false;       // Swallows whitespace on its left.
    bool rstrip = false;       // Swallows whitespace on its right.
    bool normalized = false;   // Matched in normalized rather than raw text.
  };

  // Loads a tokenizer.json file. NOT_FOUND / PERMISSION_DENIED when it cannot
  // be read; INVALID_ARGUMENT naming the path and the offending field
  // otherwise (bad JSON, unsupported component, inconsistent vocabulary).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // The same from the file's contents.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. Added tokens in the text (special or not) become
  // their ids. With add_special_tokens, the post-processor's tokens are added
  // around the text (e.g. Llama-3's <|begin_of_text|>; nothing for Qwen3).
  // Text that is not valid UTF-8 is first repaired: each invalid sequence
  // becomes U+FFFD, as in Python's decode(errors="replace").
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = false) const;

  // Text of `ids`. Byte sequences that are not valid UTF-8 (a response cut in
  // the middle of a character) become U+FFFD. INVALID_ARGUMENT naming the id
  // and its position when an id is not in the vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;
  // As Decode, but returns the raw bytes, which may end in a partial UTF-8
  // character (for incremental decoding).
  absl::StatusOr<std::string> DecodeBytes(absl::Span<const int32_t> ids,
                                          bool skip_special_tokens = false) const;

  // One more than the largest id of any token, model or added (151669 for
  // Qwen3: the embedding matrix may be larger). Every id in [0, vocab_size())
  // is a token unless the file leaves holes.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }

  // Id of a token given as it is spelled in tokenizer.json: added tokens by
  // content ("<|im_end|>"), model tokens in byte-level form ("Ġthe"). nullopt
  // when there is none.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The reverse; the view lives as long as the Tokenizer. nullopt for ids
  // that are not tokens.
  std::optional<std::string_view> IdToToken(int32_t id) const;

  // True for the ids of added tokens marked special.
  bool IsSpecial(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }

 private:
  enum class Kind : uint8_t { kNone, kModel, kAdded, kSpecial };

  Tokenizer();
  absl::Status BuildIdTables();
  void EncodeNormalized(absl::string_view text, std::vector<int32_t>* ids) const;

  std::unique_ptr<tokenizer_internal::BpeModel> model_;
  std::unique_ptr<tokenizer_internal::Normalizer> normalizer_;
  std::unique_ptr<tokenizer_internal::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tokenizer_internal::PostProcessor> post_processor_;
  std::vector<AddedToken> added_tokens_;
  std::unique_ptr<tokenizer_internal::AddedTokenMatcher> raw_matcher_;
  std::unique_ptr<tokenizer_internal::AddedTokenMatcher> normalized_matcher_;
  absl::flat_hash_map<std::string, int32_t> added_ids_;  // content -> id

  // Indexed by id.
  std::vector<std::string> id_to_token_;
  std::vector<Kind> kinds_;
  // The bytes each id decodes to: decoded_[decoded_begin_[id], decoded_begin_[id + 1]).
  std::string decoded_;
  std::vector<uint32_t> decoded_begin_;
};

}  // namespace asympo
