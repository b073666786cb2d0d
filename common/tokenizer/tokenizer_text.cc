#include "common/tokenizer/tokenizer_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace asympo {
namespace tokenizer_internal {

// ---------------------------------------------------------------- UTF-8

int DecodeUtf8(absl::string_view s, char32_t* cp) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  char32_t value;
  if (b0 < 0xC2) {
    return -1;  // Continuation byte or overlong 2-byte lead.
  } else if (b0 < 0xE0) {
    need = 1;
    value = b0 & 0x1F;
  } else if (b0 < 0xF0) {
    need = 2;
    value = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // Overlong.
    if (b0 == 0xED) hi = 0x9F;  // Surrogates.
  } else if (b0 < 0xF5) {
    need = 3;
    value = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // Overlong.
    if (b0 == 0xF4) hi = 0x8F;  // Above U+10FFFF.
  } else {
    return -1;
  }
  for (int i = 1; i <= need; ++i) {
    if (static_cast<size_t>(i) >= n) return -i;
    const unsigned char c = p[i];
    const unsigned char l = i == 1 ? lo : 0x80;
    const unsigned char h = i == 1 ? hi : 0xBF;
    if (c < l || c > h) return -i;
    value = (value << 6) | (c & 0x3F);
  }
  *cp = value;
  return need + 1;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

absl::Status ValidateUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    const int n = DecodeUtf8(s.substr(i), &cp);
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("invalid UTF-8 at byte %d (0x%02X); text must be valid UTF-8", i,
                          static_cast<unsigned char>(s[i])));
    }
    i += n;
  }
  return absl::OkStatus();
}

std::string RepairUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    const int n = DecodeUtf8(s.substr(i), &cp);
    if (n > 0) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      AppendUtf8(0xFFFD, &out);
      i += -n;
    }
  }
  return out;
}

bool IsUnicodeWhitespace(char32_t cp) {
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

bool IsUnicodeWordChar(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  switch (u_charType(c)) {
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

// ------------------------------------------------------- normalization
namespace {

const UNormalizer2* GetNormalizer(NormalForm form, UErrorCode* err) {
  switch (form) {
    case NormalForm::kNFC:
      return unorm2_getNFCInstance(err);
    case NormalForm::kNFD:
      return unorm2_getNFDInstance(err);
    case NormalForm::kNFKC:
      return unorm2_getNFKCInstance(err);
    case NormalForm::kNFKD:
      return unorm2_getNFKDInstance(err);
  }
  *err = U_ILLEGAL_ARGUMENT_ERROR;
  return nullptr;
}

bool IsAscii(absl::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

absl::Status CheckNormalizerAvailable(NormalForm form) {
  UErrorCode err = U_ZERO_ERROR;
  GetNormalizer(form, &err);
  if (U_FAILURE(err)) {
    return absl::InternalError(
        absl::StrCat("ICU could not load its normalization data: ", u_errorName(err)));
  }
  return absl::OkStatus();
}

std::string Normalize(NormalForm form, absl::string_view s) {
  if (IsAscii(s)) return std::string(s);  // ASCII is invariant under all four forms.
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* norm = GetNormalizer(form, &err);
  CHECK(U_SUCCESS(err)) << "ICU normalizer: " << u_errorName(err);

  // UTF-8 -> UTF-16 (ICU's working encoding); the input is valid UTF-8.
  std::vector<UChar> src(s.size() + 1);
  int32_t src_len = 0;
  u_strFromUTF8(src.data(), static_cast<int32_t>(src.size()), &src_len, s.data(),
                static_cast<int32_t>(s.size()), &err);
  CHECK(U_SUCCESS(err)) << "u_strFromUTF8: " << u_errorName(err);

  if (unorm2_isNormalized(norm, src.data(), src_len, &err) && U_SUCCESS(err)) {
    return std::string(s);
  }
  err = U_ZERO_ERROR;
  // NFKC/NFKD can grow text up to 18x per code point; retry at the size ICU
  // reports when the first guess is short.
  std::vector<UChar> dst(src_len * 3 + 16);
  int32_t dst_len = unorm2_normalize(norm, src.data(), src_len, dst.data(),
                                     static_cast<int32_t>(dst.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    dst.resize(dst_len);
    dst_len = unorm2_normalize(norm, src.data(), src_len, dst.data(),
                               static_cast<int32_t>(dst.size()), &err);
  }
  CHECK(U_SUCCESS(err)) << "unorm2_normalize: " << u_errorName(err);

  std::string out(static_cast<size_t>(dst_len) * 3, '\0');
  int32_t out_len = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &out_len, dst.data(), dst_len, &err);
  CHECK(U_SUCCESS(err)) << "u_strToUTF8: " << u_errorName(err);
  out.resize(out_len);
  return out;
}

// ------------------------------------------------------ byte-level alphabet

const ByteLevelAlphabet& GetByteLevelAlphabet() {
  static const ByteLevelAlphabet* const kAlphabet = [] {
    auto* a = new ByteLevelAlphabet;
    a->char_to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      a->byte_to_char[b] = c;
      a->char_to_byte[c] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return *kAlphabet;
}

std::string BytesToByteLevel(absl::string_view bytes) {
  const ByteLevelAlphabet& alphabet = GetByteLevelAlphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) AppendUtf8(alphabet.byte_to_char[static_cast<unsigned char>(b)], &out);
  return out;
}

bool ByteLevelToBytes(absl::string_view token, std::string* out) {
  const ByteLevelAlphabet& alphabet = GetByteLevelAlphabet();
  out->clear();
  size_t i = 0;
  while (i < token.size()) {
    char32_t cp;
    const int n = DecodeUtf8(token.substr(i), &cp);
    if (n < 0 || cp >= alphabet.char_to_byte.size() || alphabet.char_to_byte[cp] < 0) {
      return false;
    }
    out->push_back(static_cast<char>(alphabet.char_to_byte[cp]));
    i += n;
  }
  return true;
}

// --------------------------------------------------------------- regex

std::string TranslateHfPattern(absl::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    const char next = pattern[++i];
    if (next == 's') {
      out += "\\p{White_Space}";
    } else if (next == 'S') {
      out += "\\P{White_Space}";
    } else {
      out.push_back('\\');
      out.push_back(next);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::CompileRaw(absl::string_view pattern,
                                                         uint32_t options) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    options | PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(
        "regex \"", pattern, "\" does not compile: ", reinterpret_cast<const char*>(message),
        " at offset ", error_offset));
  }
  // Without JIT (unsupported CPU, or no executable memory) PCRE2 interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(code));
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(absl::string_view pattern) {
  return CompileRaw(TranslateHfPattern(pattern), 0);
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::CompileLiteral(absl::string_view literal) {
  return CompileRaw(literal, PCRE2_LITERAL);
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::FindAll(absl::string_view text, std::vector<std::pair<size_t, size_t>>* spans) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
  CHECK(md != nullptr) << "out of memory";
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start < text.size()) {
    // The text was validated (or repaired) before it got here.
    int rc = pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                       nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      // Resource limits only: the tokenizer patterns cannot backtrack
      // catastrophically. Leave the rest of the text unmatched.
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      LOG(ERROR) << "regex match failed at byte " << start << ": "
                 << reinterpret_cast<const char*>(message);
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] > ov[0]) {
      spans->emplace_back(ov[0], ov[1]);
      start = ov[1];
    } else {
      // Empty match: step over one code point.
      start = ov[0] + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
        ++start;
      }
    }
  }
  pcre2_match_data_free(md);
}

}  // namespace tokenizer_internal
}  // namespace asympo
