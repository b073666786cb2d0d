// libFuzzer target: Tokenizer::FromJson (common/tokenizer/tokenizer.h), the
// loader of a model directory's tokenizer.json (the rollout daemon,
// asympo-eval, asympo-tokenize and asympo-submit read one given on the
// command line). The input is the file. When it loads, a few fixed texts
// (added-token-like markers, digits, non-ASCII, invalid UTF-8) are encoded
// and decoded: every id Encode gives is a token that Decode accepts.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

constexpr std::string_view kTexts[] = {
    "Hello, world! 1234 <|im_start|>user\n<|endoftext|>",
    "  tabs\tand\r\nnewlines  ",
    "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x99\x82",
    "bad \xff\xfe utf-8 \xc3",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<asympo::Tokenizer>> tokenizer = asympo::Tokenizer::FromJson(json);
  if (!tokenizer.ok()) return 0;
  const asympo::Tokenizer& tok = **tokenizer;
  for (std::string_view text : kTexts) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok.Encode(text, special);
      for (int32_t id : ids) {
        ASYMPO_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
        ASYMPO_FUZZ_CHECK(tok.IdToToken(id).has_value());
      }
      ASYMPO_FUZZ_CHECK(tok.Decode(ids).ok());
      ASYMPO_FUZZ_CHECK(tok.DecodeBytes(ids, /*skip_special_tokens=*/true).ok());
    }
  }
  return 0;
}
