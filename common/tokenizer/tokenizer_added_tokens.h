// Finds a tokenizer's added tokens (special tokens such as <|im_start|>, and
// other tokens added to the vocabulary) in text, the way Hugging Face
// tokenizers does: leftmost-longest matches, with the single_word, lstrip and
// rstrip options.
//
// Internal to common/tokenizer/tokenizer.h. Immutable after construction; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

namespace asympo {
namespace tokenizer_internal {

// How one added token is matched.
struct AddedTokenPattern {
  std::string text;  // What to find (the content, normalized if "normalized").
  int32_t id = 0;
  bool single_word = false;  // Only when not inside a word (\w on either side).
  bool lstrip = false;       // Swallows the whitespace before it.
  bool rstrip = false;       // Swallows the whitespace after it.
};

class AddedTokenMatcher {
 public:
  // Empty patterns are ignored.
  explicit AddedTokenMatcher(std::vector<AddedTokenPattern> patterns);

  bool empty() const { return patterns_.empty(); }

  // Cuts `text` into segments that together cover it, in order, and calls
  // `emit(segment, id)` for each: id is the added token's id for a match
  // (whose segment includes any stripped whitespace), -1 for text between
  // matches. Empty segments are not emitted.
  void Split(absl::string_view text,
             absl::FunctionRef<void(absl::string_view segment, int32_t id)> emit) const;

 private:
  // The longest pattern starting at text[pos], or -1.
  int32_t LongestAt(absl::string_view text, size_t pos) const;

  std::vector<AddedTokenPattern> patterns_;
  // Byte trie over the patterns: (node << 8 | byte) -> child node; node 0 is
  // the root. terminal_[node] is the index of the pattern ending there, or -1.
  absl::flat_hash_map<uint64_t, int32_t> children_;
  std::vector<int32_t> terminal_;
  bool first_byte_[256] = {};
};

}  // namespace tokenizer_internal
}  // namespace asympo
