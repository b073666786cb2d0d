#include "common/tokenizer/tokenizer_json.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"

namespace asympo {
namespace tokenizer_internal {
namespace {

// A SAX handler for nlohmann::json::sax_parse that builds the document tree
// like the library's own, except inside model.vocab and model.merges, whose
// entries go to BpeTables: a 150k-entry std::map of JSON values costs more
// than all the rest of loading.
class TokenizerSax {
 public:
  explicit TokenizerSax(BpeTables* tables) : tables_(tables) {}

  nlohmann::json& root() { return root_; }
  const absl::Status& status() const { return status_; }

  bool null() { return Leaf(nullptr); }
  bool boolean(bool v) { return Leaf(v); }
  bool number_integer(int64_t v) {
    if (mode_ == Mode::kVocab) return VocabId(v >= 0, static_cast<uint64_t>(v), std::to_string(v));
    return Leaf(v);
  }
  bool number_unsigned(uint64_t v) {
    if (mode_ == Mode::kVocab) return VocabId(true, v, std::to_string(v));
    return Leaf(v);
  }
  bool number_float(double v, const std::string& text) {
    if (mode_ == Mode::kVocab) return VocabId(false, 0, text);
    return Leaf(v);
  }
  bool string(std::string& s) {
    switch (mode_) {
      case Mode::kVocab:
        return VocabId(false, 0, absl::StrCat("\"", absl::CHexEscape(s), "\""));
      case Mode::kMerges:
        return MergeString(s);
      case Mode::kMergePair:
        pair_.push_back(std::move(s));
        return true;
      case Mode::kTree:
        return Leaf(std::move(s));
    }
    return false;
  }
  bool binary(nlohmann::json::binary_t& b) { return Leaf(nlohmann::json::binary(std::move(b))); }

  bool start_object(size_t /*elements*/) {
    if (mode_ == Mode::kVocab) return VocabId(false, 0, "an object");
    if (mode_ != Mode::kTree) return MergeBad();
    if (IsModelField("vocab")) {
      tables_->has_vocab = true;
      Leaf(nlohmann::json::object());  // A placeholder in the tree.
      mode_ = Mode::kVocab;
      return true;
    }
    return Open(nlohmann::json::object());
  }
  bool key(std::string& k) {
    if (mode_ == Mode::kVocab) {
      vocab_key_ = std::move(k);
    } else {
      key_ = std::move(k);
    }
    return true;
  }
  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kTree;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(size_t /*elements*/) {
    switch (mode_) {
      case Mode::kVocab:
        return VocabId(false, 0, "an array");
      case Mode::kMerges:
        mode_ = Mode::kMergePair;
        pair_.clear();
        return true;
      case Mode::kMergePair:
        return MergeBad();
      case Mode::kTree:
        break;
    }
    if (IsModelField("merges")) {
      tables_->has_merges = true;
      Leaf(nlohmann::json::array());
      mode_ = Mode::kMerges;
      return true;
    }
    return Open(nlohmann::json::array());
  }
  bool end_array() {
    switch (mode_) {
      case Mode::kMergePair:
        if (pair_.size() != 2) return MergeBad();
        tables_->merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        mode_ = Mode::kMerges;
        return true;
      case Mode::kMerges:
        mode_ = Mode::kTree;
        return true;
      default:
        stack_.pop_back();
        return true;
    }
  }
  bool parse_error(size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) {
    status_ = absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", e.what()));
    return false;
  }

 private:
  enum class Mode { kTree, kVocab, kMerges, kMergePair };
  struct Open_ {
    nlohmann::json* value;
    std::string key;  // The key it has in its parent object.
  };

  // Whether the value about to start is the field `name` of the top-level
  // "model" object.
  bool IsModelField(const char* name) const {
    return stack_.size() == 2 && stack_[0].value->is_object() && stack_[1].key == "model" &&
           stack_[1].value->is_object() && key_ == name;
  }

  // Where the next value goes; nullptr at the top.
  nlohmann::json* Place(nlohmann::json value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    nlohmann::json& parent = *stack_.back().value;
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    nlohmann::json& slot = parent[key_];
    slot = std::move(value);
    return &slot;
  }

  template <typename V>
  bool Leaf(V&& v) {
    if (mode_ == Mode::kVocab) return VocabId(false, 0, nlohmann::json(v).dump());
    if (mode_ != Mode::kTree) return MergeBad();
    Place(nlohmann::json(std::forward<V>(v)));
    return true;
  }

  bool Open(nlohmann::json container) {
    const bool in_object = !stack_.empty() && stack_.back().value->is_object();
    std::string key = in_object ? key_ : "";
    nlohmann::json* slot = Place(std::move(container));
    stack_.push_back(Open_{slot, std::move(key)});
    return true;
  }

  bool VocabId(bool non_negative, uint64_t v, const std::string& shown) {
    if (!non_negative || v > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("model.vocab[\"", absl::CHexEscape(vocab_key_), "\"] is ", shown,
                       "; token ids must be integers in [0, 2^31)"));
      return false;
    }
    tables_->vocab.insert_or_assign(std::move(vocab_key_), static_cast<int32_t>(v));
    return true;
  }

  bool MergeString(const std::string& s) {
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("model.merges[", tables_->merges.size(), "] is \"", absl::CHexEscape(s),
                       "\"; a merge string must be two tokens separated by one space"));
      return false;
    }
    tables_->merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    return true;
  }

  bool MergeBad() {
    status_ = absl::InvalidArgumentError(
        absl::StrCat("model.merges[", tables_->merges.size(),
                     "] is malformed; a merge must be \"left right\" or [\"left\", \"right\"]"));
    return false;
  }

  BpeTables* tables_;
  nlohmann::json root_;
  absl::Status status_;
  std::vector<Open_> stack_;
  std::string key_;
  std::string vocab_key_;
  Mode mode_ = Mode::kTree;
  std::vector<std::string> pair_;
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseTokenizerJson(absl::string_view text, BpeTables* tables) {
  TokenizerSax sax(tables);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!ok) {
    return sax.status().ok() ? absl::InvalidArgumentError("not valid JSON") : sax.status();
  }
  return std::move(sax.root());
}

}  // namespace tokenizer_internal
}  // namespace asympo
