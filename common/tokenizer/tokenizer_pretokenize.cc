#include "common/tokenizer/tokenizer_pretokenize.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer_json.h"

namespace asympo {
namespace tokenizer_internal {
namespace {

// GPT-2's pre-tokenization regex, which ByteLevel applies when use_regex is
// true (its default).
constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

absl::Status UnsupportedType(absl::string_view where, const nlohmann::json& config,
                             absl::string_view supported) {
  const std::string type = TypeOf(config);
  return absl::InvalidArgumentError(absl::StrCat(
      where, " has type ", type.empty() ? config.dump() : absl::StrCat("\"", type, "\""),
      ", which is not supported; supported: ", supported));
}

absl::StatusOr<const nlohmann::json*> ArrayField(const nlohmann::json& config, const char* key,
                                                 absl::string_view where) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " is missing or not an array"));
  }
  return &*it;
}

}  // namespace

// ------------------------------------------------------------- Normalizer

absl::StatusOr<Normalizer> Normalizer::FromJson(const nlohmann::json& config) {
  Normalizer n;
  ASYMPO_RETURN_IF_ERROR(AddForms(config, "normalizer", &n.forms_));
  for (NormalForm form : n.forms_) ASYMPO_RETURN_IF_ERROR(CheckNormalizerAvailable(form));
  return n;
}

absl::Status Normalizer::AddForms(const nlohmann::json& config, const std::string& where,
                                  std::vector<NormalForm>* forms) {
  if (config.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(config);
  if (type == "Sequence") {
    ASYMPO_ASSIGN_OR_RETURN(const nlohmann::json* list, ArrayField(config, "normalizers", where));
    for (size_t i = 0; i < list->size(); ++i) {
      ASYMPO_RETURN_IF_ERROR(
          AddForms((*list)[i], absl::StrCat(where, ".normalizers[", i, "]"), forms));
    }
  } else if (type == "NFC") {
    forms->push_back(NormalForm::kNFC);
  } else if (type == "NFD") {
    forms->push_back(NormalForm::kNFD);
  } else if (type == "NFKC") {
    forms->push_back(NormalForm::kNFKC);
  } else if (type == "NFKD") {
    forms->push_back(NormalForm::kNFKD);
  } else {
    return UnsupportedType(where, config, "null, NFC, NFD, NFKC, NFKD, Sequence");
  }
  return absl::OkStatus();
}

std::string Normalizer::Apply(absl::string_view text) const {
  std::string out(text);
  for (NormalForm form : forms_) out = Normalize(form, out);
  return out;
}

// ----------------------------------------------------------- PreTokenizer

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const nlohmann::json& config) {
  auto pre = std::unique_ptr<PreTokenizer>(new PreTokenizer);
  ASYMPO_RETURN_IF_ERROR(AddStep(config, "pre_tokenizer", &pre->steps_));
  if (pre->steps_.empty() || !pre->steps_.back().byte_level) {
    return absl::InvalidArgumentError(
        "pre_tokenizer has no final ByteLevel step; only byte-level BPE tokenizers are "
        "supported");
  }
  for (size_t i = 0; i + 1 < pre->steps_.size(); ++i) {
    if (pre->steps_[i].byte_level) {
      return absl::InvalidArgumentError(
          "pre_tokenizer has a step after ByteLevel; ByteLevel must come last");
    }
  }
  return pre;
}

absl::Status PreTokenizer::AddStep(const nlohmann::json& config, const std::string& where,
                                   std::vector<Step>* steps) {
  const std::string type = TypeOf(config);
  if (type == "Sequence") {
    ASYMPO_ASSIGN_OR_RETURN(const nlohmann::json* list, ArrayField(config, "pretokenizers", where));
    for (size_t i = 0; i < list->size(); ++i) {
      ASYMPO_RETURN_IF_ERROR(
          AddStep((*list)[i], absl::StrCat(where, ".pretokenizers[", i, "]"), steps));
    }
    return absl::OkStatus();
  }
  Step step;
  if (type == "ByteLevel") {
    step.byte_level = true;
    bool add_prefix_space = true;  // Hugging Face's defaults.
    bool use_regex = true;
    ASYMPO_RETURN_IF_ERROR(ReadBool(config, "add_prefix_space", where, &add_prefix_space));
    ASYMPO_RETURN_IF_ERROR(ReadBool(config, "use_regex", where, &use_regex));
    step.add_prefix_space = add_prefix_space;
    if (use_regex) {
      ASYMPO_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern));
    }
  } else if (type == "Digits") {
    bool individual = false;
    ASYMPO_RETURN_IF_ERROR(ReadBool(config, "individual_digits", where, &individual));
    ASYMPO_ASSIGN_OR_RETURN(step.regex, Regex::Compile(individual ? "\\p{N}" : "\\p{N}+"));
  } else if (type == "Split") {
    auto pattern = config.find("pattern");
    if (pattern == config.end() || !pattern->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ".pattern is missing or not an object; it must be {\"Regex\": ...} or "
                       "{\"String\": ...}"));
    }
    if (auto re = pattern->find("Regex"); re != pattern->end() && re->is_string()) {
      auto compiled = Regex::Compile(re->get<std::string>());
      if (!compiled.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".pattern.Regex: ", compiled.status().message()));
      }
      step.regex = *std::move(compiled);
    } else if (auto str = pattern->find("String"); str != pattern->end() && str->is_string()) {
      ASYMPO_ASSIGN_OR_RETURN(step.regex, Regex::CompileLiteral(str->get<std::string>()));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ".pattern is ", pattern->dump(),
                                                     "; it must be {\"Regex\": ...} or "
                                                     "{\"String\": ...}"));
    }
    std::string behavior = "Isolated";
    ASYMPO_RETURN_IF_ERROR(ReadString(config, "behavior", where, &behavior));
    static const auto* const kBehaviors = new absl::flat_hash_map<std::string, Behavior>{
        {"Isolated", Behavior::kIsolated},
        {"Removed", Behavior::kRemoved},
        {"MergedWithPrevious", Behavior::kMergedWithPrevious},
        {"MergedWithNext", Behavior::kMergedWithNext},
        {"Contiguous", Behavior::kContiguous}};
    auto it = kBehaviors->find(behavior);
    if (it == kBehaviors->end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".behavior is \"", behavior,
                       "\", which is not supported; supported: Isolated, "
                       "Removed, MergedWithPrevious, MergedWithNext, Contiguous"));
    }
    step.behavior = it->second;
    ASYMPO_RETURN_IF_ERROR(ReadBool(config, "invert", where, &step.invert));
  } else {
    return UnsupportedType(where, config, "ByteLevel, Split, Digits, Sequence");
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

void PreTokenizer::Split(absl::string_view text, std::vector<std::string>* pieces) const {
  std::vector<std::string> current = {std::string(text)};
  std::vector<std::string> next;
  for (const Step& step : steps_) {
    next.clear();
    for (const std::string& piece : current) ApplyStep(step, piece, &next);
    current.swap(next);
  }
  for (std::string& piece : current) pieces->push_back(std::move(piece));
}

void PreTokenizer::ApplyStep(const Step& step, absl::string_view text,
                             std::vector<std::string>* out) {
  std::string prefixed;
  if (step.byte_level) {
    // Hugging Face adds the space to every piece that reaches ByteLevel.
    if (step.add_prefix_space && (text.empty() || text[0] != ' ')) {
      prefixed = absl::StrCat(" ", text);
      text = prefixed;
    }
    if (step.regex == nullptr) {
      if (!text.empty()) out->emplace_back(text);
      return;
    }
  }
  std::vector<std::pair<size_t, size_t>> matches;
  step.regex->FindAll(text, &matches);

  // The text as alternating segments: (begin, end, is_delimiter).
  std::vector<std::tuple<size_t, size_t, bool>> segments;
  size_t pos = 0;
  for (const auto& [b, e] : matches) {
    if (pos < b) segments.emplace_back(pos, b, step.invert);
    segments.emplace_back(b, e, !step.invert);
    pos = e;
  }
  if (pos < text.size()) segments.emplace_back(pos, text.size(), step.invert);

  std::vector<std::pair<size_t, size_t>> ranges;
  bool previous_delim = false;
  switch (step.behavior) {
    case Behavior::kIsolated:
      for (const auto& [b, e, delim] : segments) ranges.emplace_back(b, e);
      break;
    case Behavior::kRemoved:
      for (const auto& [b, e, delim] : segments) {
        if (!delim) ranges.emplace_back(b, e);
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const auto& [b, e, delim] : segments) {
        if (delim && !previous_delim && !ranges.empty()) {
          ranges.back().second = e;
        } else {
          ranges.emplace_back(b, e);
        }
        previous_delim = delim;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        const auto& [b, e, delim] = *it;
        if (delim && !previous_delim && !ranges.empty()) {
          ranges.back().first = b;
        } else {
          ranges.emplace_back(b, e);
        }
        previous_delim = delim;
      }
      std::reverse(ranges.begin(), ranges.end());
      break;
    case Behavior::kContiguous:
      for (const auto& [b, e, delim] : segments) {
        if (delim && previous_delim && !ranges.empty()) {
          ranges.back().second = e;
        } else {
          ranges.emplace_back(b, e);
        }
        previous_delim = delim;
      }
      break;
  }
  for (const auto& [b, e] : ranges) {
    if (e > b) out->emplace_back(text.substr(b, e - b));
  }
}

// ---------------------------------------------------------- PostProcessor

absl::StatusOr<PostProcessor> PostProcessor::FromJson(const nlohmann::json& config) {
  PostProcessor p;
  if (config.is_null()) return p;
  const std::string type = TypeOf(config);
  const std::string where = "post_processor";
  if (type == "ByteLevel") return p;  // Adjusts offsets only.
  if (type == "Sequence") {
    ASYMPO_ASSIGN_OR_RETURN(const nlohmann::json* list, ArrayField(config, "processors", where));
    for (const nlohmann::json& inner : *list) {
      ASYMPO_ASSIGN_OR_RETURN(PostProcessor q, FromJson(inner));
      // Each processor wraps what the previous ones produced.
      q.prefix.insert(q.prefix.end(), p.prefix.begin(), p.prefix.end());
      p.prefix = std::move(q.prefix);
      p.suffix.insert(p.suffix.end(), q.suffix.begin(), q.suffix.end());
    }
    return p;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* key : {"cls", "sep"}) {
      auto it = config.find(key);
      if (it == config.end() || !it->is_array() || it->size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " must be [token, id]"));
      }
      int32_t id = 0;
      ASYMPO_RETURN_IF_ERROR(ReadId((*it)[1], absl::StrCat(where, ".", key, "[1]"), &id));
      (std::string(key) == "cls" ? p.prefix : p.suffix).push_back(id);
    }
    return p;
  }
  if (type == "TemplateProcessing") {
    ASYMPO_ASSIGN_OR_RETURN(const nlohmann::json* single, ArrayField(config, "single", where));
    auto specials = config.find("special_tokens");
    bool seen_sequence = false;
    for (const nlohmann::json& item : *single) {
      if (item.contains("Sequence")) {
        const nlohmann::json& seq = item["Sequence"];
        if (seen_sequence || !seq.is_object() || seq.value("id", "") != "A") {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ".single has ", item.dump(), "; a single-sequence template holds \"A\" once"));
        }
        seen_sequence = true;
        continue;
      }
      auto special = item.find("SpecialToken");
      if (special == item.end() || !special->is_object() || !special->contains("id") ||
          !(*special)["id"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".single has ", item.dump(),
                         "; items must be {\"Sequence\": ...} or {\"SpecialToken\": ...}"));
      }
      const std::string name = (*special)["id"].get<std::string>();
      if (specials == config.end() || !specials->is_object() || !specials->contains(name) ||
          !(*specials)[name].contains("ids") || !(*specials)[name]["ids"].is_array()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".single uses special token \"", absl::CHexEscape(name),
                         "\", which special_tokens does not define with its ids"));
      }
      for (const nlohmann::json& id_json : (*specials)[name]["ids"]) {
        int32_t id = 0;
        ASYMPO_RETURN_IF_ERROR(
            ReadId(id_json, absl::StrCat(where, ".special_tokens[\"", name, "\"].ids"), &id));
        (seen_sequence ? p.suffix : p.prefix).push_back(id);
      }
    }
    if (!seen_sequence) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".single has no {\"Sequence\": {\"id\": \"A\"}}"));
    }
    return p;
  }
  return UnsupportedType(where, config,
                         "null, ByteLevel, TemplateProcessing, BertProcessing, "
                         "RobertaProcessing, Sequence");
}

}  // namespace tokenizer_internal
}  // namespace asympo
