// Text primitives for the tokenizer (common/tokenizer/tokenizer.h): UTF-8 checking and
// repair, Unicode normalization (ICU), the GPT-2 byte-level alphabet, and a
// PCRE2 regex that reads Hugging Face tokenizer.json patterns.
//
// Internal to the tokenizer; exposed in a header so that tests can reach it.
// Everything here is thread-safe: free functions are pure, and a compiled
// Regex is immutable and may be used by many threads at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// PCRE2's compiled-pattern type, kept out of this header (pcre2.h needs a
// macro set before it is included).
struct pcre2_real_code_8;

namespace asympo {
namespace tokenizer_internal {

// ---------------------------------------------------------------- UTF-8

// Decodes the code point at the start of `s` (non-empty). Returns its length
// in bytes (1..4) and sets *cp; or, when `s` does not start with a valid UTF-8
// sequence (overlong forms, surrogates and values above U+10FFFF are invalid),
// returns minus the length of the maximal invalid prefix (-1..-3), the span
// that a lossy decoder replaces with one U+FFFD.
int DecodeUtf8(absl::string_view s, char32_t* cp);

// Appends the UTF-8 encoding of `cp` (a Unicode scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string* out);

// OK when `s` is valid UTF-8; otherwise INVALID_ARGUMENT naming the byte
// offset of the first invalid sequence.
absl::Status ValidateUtf8(absl::string_view s);

// Returns `s` with every maximal invalid subsequence replaced by U+FFFD, as
// Python's bytes.decode(errors="replace") and Rust's from_utf8_lossy do.
std::string RepairUtf8(absl::string_view s);

// True for the code points with the Unicode White_Space property (what
// Hugging Face's Rust regexes mean by \s).
bool IsUnicodeWhitespace(char32_t cp);

// True for the code points Hugging Face's Rust regexes mean by \w:
// Alphabetic, marks, decimal numbers, connector punctuation, Join_Control.
bool IsUnicodeWordChar(char32_t cp);

// ------------------------------------------------------- normalization

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

// OK when ICU's data for `form` can be loaded (checked once at load time, so
// that Normalize can treat a failure as impossible).
absl::Status CheckNormalizerAvailable(NormalForm form);

// Returns `s` (valid UTF-8) in the normal form `form`. ASCII and text that is
// already normalized are returned without conversion.
std::string Normalize(NormalForm form, absl::string_view s);

// ------------------------------------------------------ byte-level alphabet

// GPT-2's reversible map from bytes to printable code points: the printable
// Latin-1 bytes map to themselves, the other 68 to U+0100.. in byte order.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> byte_to_char;
  std::array<int16_t, 324> char_to_byte;  // -1 where no byte maps there.
};
const ByteLevelAlphabet& GetByteLevelAlphabet();

// The byte-level spelling of raw bytes, e.g. " the" -> "Ġthe".
std::string BytesToByteLevel(absl::string_view bytes);

// Reverses BytesToByteLevel. Returns false, leaving *out unspecified, when
// `token` holds a character outside the byte-level alphabet.
bool ByteLevelToBytes(absl::string_view token, std::string* out);

// --------------------------------------------------------------- regex

// A PCRE2 pattern compiled in UTF + UCP mode (\p{L}, \p{N}, look-ahead,
// (?i:...)), JIT-compiled where the platform allows.
class Regex {
 public:
  // Compiles a pattern written for Hugging Face tokenizers. \s and \S are
  // rewritten to \p{White_Space} / \P{White_Space} so that they mean what they
  // mean there (PCRE2's own \s also takes U+180E and leaves out nothing else).
  // INVALID_ARGUMENT names the pattern and PCRE2's message with its offset.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(absl::string_view pattern);

  // Compiles `literal` to match itself exactly.
  static absl::StatusOr<std::unique_ptr<Regex>> CompileLiteral(absl::string_view literal);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the byte spans [begin, end) of the successive non-overlapping,
  // non-empty matches in `text` (valid UTF-8) to `spans`.
  void FindAll(absl::string_view text, std::vector<std::pair<size_t, size_t>>* spans) const;

 private:
  explicit Regex(pcre2_real_code_8* code) : code_(code) {}
  static absl::StatusOr<std::unique_ptr<Regex>> CompileRaw(absl::string_view pattern,
                                                           uint32_t options);
  pcre2_real_code_8* code_;
};

// Rewrites \s and \S in a Hugging Face pattern to the White_Space property.
// Exposed for tests.
std::string TranslateHfPattern(absl::string_view pattern);

}  // namespace tokenizer_internal
}  // namespace asympo
