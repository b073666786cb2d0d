#include "common/tokenizer/tokenizer_added_tokens.h"

#include <algorithm>
#include <utility>

#include "common/tokenizer/tokenizer_text.h"

namespace asympo {
namespace tokenizer_internal {
namespace {

// The code point that ends text[0, end), or U+0000 when there is none.
char32_t LastCodePoint(absl::string_view text, size_t end) {
  if (end == 0) return 0;
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  char32_t cp = 0;
  return DecodeUtf8(text.substr(begin, end - begin), &cp) > 0 ? cp : 0;
}

char32_t FirstCodePoint(absl::string_view text, size_t begin) {
  if (begin >= text.size()) return 0;
  char32_t cp = 0;
  return DecodeUtf8(text.substr(begin), &cp) > 0 ? cp : 0;
}

// Start of the whitespace run that ends text[0, end).
size_t WhitespaceStartBefore(absl::string_view text, size_t end) {
  while (end > 0) {
    size_t begin = end - 1;
    while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
    char32_t cp = 0;
    if (DecodeUtf8(text.substr(begin, end - begin), &cp) <= 0 || !IsUnicodeWhitespace(cp)) break;
    end = begin;
  }
  return end;
}

// End of the whitespace run that starts at text[begin].
size_t WhitespaceEndAfter(absl::string_view text, size_t begin) {
  while (begin < text.size()) {
    char32_t cp = 0;
    const int n = DecodeUtf8(text.substr(begin), &cp);
    if (n <= 0 || !IsUnicodeWhitespace(cp)) break;
    begin += n;
  }
  return begin;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedTokenPattern> patterns) {
  terminal_.push_back(-1);
  for (AddedTokenPattern& p : patterns) {
    if (p.text.empty()) continue;
    const auto index = static_cast<int32_t>(patterns_.size());
    int32_t node = 0;
    for (char c : p.text) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
      auto [it, inserted] = children_.emplace(key, static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    // A repeated text keeps its first token, like the first of equal matches.
    if (terminal_[node] < 0) terminal_[node] = index;
    first_byte_[static_cast<unsigned char>(p.text[0])] = true;
    patterns_.push_back(std::move(p));
  }
}

int32_t AddedTokenMatcher::LongestAt(absl::string_view text, size_t pos) const {
  int32_t node = 0;
  int32_t found = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]);
    auto it = children_.find(key);
    if (it == children_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) found = terminal_[node];
  }
  return found;
}

void AddedTokenMatcher::Split(
    absl::string_view text,
    absl::FunctionRef<void(absl::string_view segment, int32_t id)> emit) const {
  size_t emitted = 0;  // Everything before this has been emitted.
  size_t pos = 0;      // Where the search for the next match resumes.
  while (!patterns_.empty() && pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const int32_t index = LongestAt(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedTokenPattern& p = patterns_[index];
    size_t begin = pos;
    size_t end = pos + p.text.size();
    // Matches do not overlap: a rejected one is skipped as a whole, as in
    // Hugging Face's leftmost-longest Aho-Corasick search.
    pos = end;
    if (p.single_word && (IsUnicodeWordChar(LastCodePoint(text, begin)) ||
                          IsUnicodeWordChar(FirstCodePoint(text, end)))) {
      continue;
    }
    if (p.lstrip) begin = std::max(WhitespaceStartBefore(text, begin), emitted);
    if (p.rstrip) end = WhitespaceEndAfter(text, end);
    pos = std::max(pos, end);
    if (emitted < begin) emit(text.substr(emitted, begin - emitted), -1);
    emit(text.substr(begin, end - begin), p.id);
    emitted = end;
  }
  if (emitted < text.size()) emit(text.substr(emitted), -1);
}

}  // namespace tokenizer_internal
}  // namespace asympo
