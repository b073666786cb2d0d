// The normalizer, pre-tokenizer and post-processor sections of a
// tokenizer.json, as far as byte-level BPE tokenizers (GPT-2, Llama-3,
// Qwen2/Qwen3) use them.
//
// Internal to common/tokenizer/tokenizer.h. All classes are immutable after FromJson
// and thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer_text.h"
#include "nlohmann/json.hpp"

namespace asympo {
namespace tokenizer_internal {

// "normalizer": null, one of NFC/NFD/NFKC/NFKD, or a Sequence of them.
class Normalizer {
 public:
  // Anything else is INVALID_ARGUMENT naming the unsupported type.
  static absl::StatusOr<Normalizer> FromJson(const nlohmann::json& config);

  bool empty() const { return forms_.empty(); }
  // Applies the forms in order to `text` (valid UTF-8).
  std::string Apply(absl::string_view text) const;

 private:
  static absl::Status AddForms(const nlohmann::json& config, const std::string& where,
                               std::vector<NormalForm>* forms);
  std::vector<NormalForm> forms_;
};

// "pre_tokenizer": ByteLevel, or a Sequence of Split / Digits steps that ends
// with ByteLevel. Splits text into the pieces ("words") that BPE encodes
// separately; the pieces are raw bytes (ByteLevel's character mapping is left
// to the BPE model, which works on bytes).
class PreTokenizer {
 public:
  // INVALID_ARGUMENT names an unsupported type, split behavior or option,
  // a regex that does not compile, or a pipeline without a final ByteLevel.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromJson(const nlohmann::json& config);

  // Appends the pieces of `text` (valid UTF-8) to `pieces`; never empty ones.
  void Split(absl::string_view text, std::vector<std::string>* pieces) const;

 private:
  // Hugging Face's SplitDelimiterBehavior.
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    std::unique_ptr<Regex> regex;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel only.
    bool byte_level = false;
  };
  static absl::Status AddStep(const nlohmann::json& config, const std::string& where,
                              std::vector<Step>* steps);
  static void ApplyStep(const Step& step, absl::string_view text, std::vector<std::string>* out);

  std::vector<Step> steps_;
};

// "post_processor" as it affects ids of a single sequence: the special
// tokens added before and after it when add_special_tokens is true.
// Supports null, ByteLevel (no ids), TemplateProcessing, BertProcessing,
// RobertaProcessing and Sequence.
struct PostProcessor {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;

  static absl::StatusOr<PostProcessor> FromJson(const nlohmann::json& config);
};

}  // namespace tokenizer_internal
}  // namespace asympo
