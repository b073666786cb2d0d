#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer_added_tokens.h"
#include "common/tokenizer/tokenizer_bpe.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/tokenizer_pretokenize.h"
#include "common/tokenizer/tokenizer_text.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace asympo {

using tokenizer_internal::AddedTokenMatcher;
using tokenizer_internal::AddedTokenPattern;
using tokenizer_internal::BpeModel;
using tokenizer_internal::Normalizer;
using tokenizer_internal::PostProcessor;
using tokenizer_internal::PreTokenizer;

namespace {

std::string Quoted(absl::string_view s) {
  constexpr size_t kMax = 64;
  const bool cut = s.size() > kMax;
  return absl::StrCat("\"", absl::CHexEscape(cut ? s.substr(0, kMax) : s), cut ? "...\"" : "\"");
}

absl::StatusOr<std::vector<Tokenizer::AddedToken>> ParseAddedTokens(const nlohmann::json& root) {
  std::vector<Tokenizer::AddedToken> tokens;
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return tokens;
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("added_tokens is ", it->type_name(), "; it must be an array"));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& t = (*it)[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object() || !t.contains("id") || !t.contains("content") ||
        !t["content"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " must be an object with an integer id and a string content"));
    }
    Tokenizer::AddedToken token;
    ASYMPO_RETURN_IF_ERROR(tokenizer_internal::ReadId(t["id"], where + ".id", &token.id));
    token.content = t["content"].get<std::string>();
    if (token.content.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".content is empty"));
    }
    ASYMPO_RETURN_IF_ERROR(tokenizer_internal::ValidateUtf8(token.content));
    ASYMPO_RETURN_IF_ERROR(tokenizer_internal::ReadBool(t, "special", where, &token.special));
    ASYMPO_RETURN_IF_ERROR(
        tokenizer_internal::ReadBool(t, "single_word", where, &token.single_word));
    ASYMPO_RETURN_IF_ERROR(tokenizer_internal::ReadBool(t, "lstrip", where, &token.lstrip));
    ASYMPO_RETURN_IF_ERROR(tokenizer_internal::ReadBool(t, "rstrip", where, &token.rstrip));
    // Hugging Face's default: special tokens match raw text, others normalized.
    token.normalized = !token.special;
    ASYMPO_RETURN_IF_ERROR(tokenizer_internal::ReadBool(t, "normalized", where, &token.normalized));
    tokens.push_back(std::move(token));
  }
  return tokens;
}

absl::Status CheckDecoder(const nlohmann::json& root) {
  auto it = root.find("decoder");
  const std::string type = it == root.end() ? "" : tokenizer_internal::TypeOf(*it);
  if (type == "ByteLevel") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("decoder is ", it == root.end() ? "missing" : it->dump().substr(0, 200),
                   "; only the ByteLevel decoder (byte-level BPE) is supported"));
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string message =
        absl::StrCat("tokenizer file ", path, ": cannot open (", std::strerror(err), ")");
    return err == EACCES ? absl::PermissionDeniedError(message) : absl::NotFoundError(message);
  }
  in.seekg(0, std::ios::end);
  std::string contents(static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0)), '\0');
  in.seekg(0, std::ios::beg);
  if (!in.read(contents.data(), static_cast<std::streamsize>(contents.size()))) {
    return absl::DataLossError(absl::StrCat("tokenizer file ", path, ": read failed"));
  }
  auto tokenizer = FromJson(contents);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat("tokenizer file ", path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json) {
  tokenizer_internal::BpeTables tables;
  ASYMPO_ASSIGN_OR_RETURN(
      const nlohmann::json root,
      tokenizer_internal::ParseTokenizerJson(absl::string_view(json.data(), json.size()), &tables));
  if (!root.is_object()) {
    return absl::InvalidArgumentError("the top level of a tokenizer.json must be an object");
  }
  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer);
  try {
    auto model = root.find("model");
    if (model == root.end()) {
      return absl::InvalidArgumentError("model is missing; a tokenizer.json needs one");
    }
    ASYMPO_ASSIGN_OR_RETURN(tok->model_, BpeModel::FromJson(*model, std::move(tables)));

    static const nlohmann::json kNull;
    auto section = [&](const char* key) -> const nlohmann::json& {
      auto it = root.find(key);
      return it == root.end() ? kNull : *it;
    };
    ASYMPO_ASSIGN_OR_RETURN(Normalizer normalizer, Normalizer::FromJson(section("normalizer")));
    tok->normalizer_ = std::make_unique<Normalizer>(std::move(normalizer));
    if (section("pre_tokenizer").is_null()) {
      return absl::InvalidArgumentError(
          "pre_tokenizer is null; byte-level BPE needs a ByteLevel pre-tokenizer");
    }
    ASYMPO_ASSIGN_OR_RETURN(tok->pre_tokenizer_, PreTokenizer::FromJson(section("pre_tokenizer")));
    ASYMPO_ASSIGN_OR_RETURN(PostProcessor post, PostProcessor::FromJson(section("post_processor")));
    tok->post_processor_ = std::make_unique<PostProcessor>(std::move(post));
    ASYMPO_RETURN_IF_ERROR(CheckDecoder(root));
    for (const char* key : {"truncation", "padding"}) {
      if (!section(key).is_null()) LOG(WARNING) << "tokenizer.json: " << key << " is ignored";
    }
    ASYMPO_ASSIGN_OR_RETURN(tok->added_tokens_, ParseAddedTokens(root));
  } catch (const nlohmann::json::exception& e) {
    // The readers check types first; this is a backstop for shapes they miss.
    return absl::InvalidArgumentError(absl::StrCat("malformed tokenizer.json: ", e.what()));
  }

  std::vector<AddedTokenPattern> raw, normalized;
  for (const AddedToken& t : tok->added_tokens_) {
    AddedTokenPattern p{t.content, t.id, t.single_word, t.lstrip, t.rstrip};
    if (t.normalized) {
      p.text = tok->normalizer_->Apply(p.text);
      normalized.push_back(std::move(p));
    } else {
      raw.push_back(std::move(p));
    }
  }
  tok->raw_matcher_ = std::make_unique<AddedTokenMatcher>(std::move(raw));
  tok->normalized_matcher_ = std::make_unique<AddedTokenMatcher>(std::move(normalized));
  ASYMPO_RETURN_IF_ERROR(tok->BuildIdTables());
  return tok;
}

absl::Status Tokenizer::BuildIdTables() {
  int32_t max_id = -1;
  for (const auto& [token, id] : model_->vocab()) max_id = std::max(max_id, id);
  for (const AddedToken& t : added_tokens_) max_id = std::max(max_id, t.id);
  // Tables are indexed by id; a stray huge id must not allocate gigabytes.
  constexpr int32_t kMaxId = (1 << 24) - 1;
  if (max_id > kMaxId) {
    return absl::InvalidArgumentError(absl::StrCat("the largest token id is ", max_id,
                                                   "; ids above ", kMaxId, " are not supported"));
  }
  const size_t n = static_cast<size_t>(max_id) + 1;
  id_to_token_.assign(n, std::string());
  kinds_.assign(n, Kind::kNone);

  for (const auto& [token, id] : model_->vocab()) {
    if (kinds_[id] != Kind::kNone) {
      return absl::InvalidArgumentError(absl::StrCat("model.vocab gives id ", id, " to both ",
                                                     Quoted(id_to_token_[id]), " and ",
                                                     Quoted(token), "; ids must be unique"));
    }
    kinds_[id] = Kind::kModel;
    id_to_token_[id] = token;
  }
  for (const AddedToken& t : added_tokens_) {
    if (kinds_[t.id] == Kind::kModel && id_to_token_[t.id] != t.content) {
      LOG(WARNING) << "tokenizer.json: added token " << Quoted(t.content) << " takes id " << t.id
                   << " from model token " << Quoted(id_to_token_[t.id]);
    } else if (kinds_[t.id] == Kind::kAdded || kinds_[t.id] == Kind::kSpecial) {
      return absl::InvalidArgumentError(absl::StrCat("added_tokens gives id ", t.id, " to both ",
                                                     Quoted(id_to_token_[t.id]), " and ",
                                                     Quoted(t.content)));
    }
    kinds_[t.id] = t.special ? Kind::kSpecial : Kind::kAdded;
    id_to_token_[t.id] = t.content;
    added_ids_[t.content] = t.id;
  }

  decoded_.clear();
  decoded_begin_.assign(n + 1, 0);
  std::string bytes;
  for (size_t id = 0; id < n; ++id) {
    decoded_begin_[id] = static_cast<uint32_t>(decoded_.size());
    const std::string& token = id_to_token_[id];
    // Model tokens are byte-level spelled; one outside that alphabet decodes
    // to itself, as in Hugging Face's ByteLevel decoder.
    if (kinds_[id] == Kind::kModel && tokenizer_internal::ByteLevelToBytes(token, &bytes)) {
      decoded_ += bytes;
    } else {
      decoded_ += token;
    }
  }
  decoded_begin_[n] = static_cast<uint32_t>(decoded_.size());
  return absl::OkStatus();
}

std::vector<int32_t> Tokenizer::Encode(std::string_view input, bool add_special_tokens) const {
  absl::string_view text(input.data(), input.size());
  std::string repaired;
  if (!tokenizer_internal::ValidateUtf8(text).ok()) {
    repaired = tokenizer_internal::RepairUtf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids = post_processor_->prefix;
  // Added tokens are found in the raw text first (those with normalized =
  // false, e.g. all special tokens), then in each normalized remainder.
  raw_matcher_->Split(text, [&](absl::string_view segment, int32_t id) {
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
    if (normalizer_->empty()) {
      EncodeNormalized(segment, &ids);
    } else {
      EncodeNormalized(normalizer_->Apply(segment), &ids);
    }
  });
  if (add_special_tokens) {
    ids.insert(ids.end(), post_processor_->suffix.begin(), post_processor_->suffix.end());
  }
  return ids;
}

void Tokenizer::EncodeNormalized(absl::string_view text, std::vector<int32_t>* ids) const {
  std::vector<std::string> pieces;
  normalized_matcher_->Split(text, [&](absl::string_view segment, int32_t id) {
    if (id >= 0) {
      ids->push_back(id);
      return;
    }
    pieces.clear();
    pre_tokenizer_->Split(segment, &pieces);
    for (const std::string& piece : pieces) model_->Tokenize(piece, ids);
  });
}

absl::StatusOr<std::string> Tokenizer::DecodeBytes(absl::Span<const int32_t> ids,
                                                   bool skip_special_tokens) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || kinds_[id] == Kind::kNone) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " at position ", i,
                                                     " is not in the vocabulary (ids 0..",
                                                     vocab_size() - 1, ")"));
    }
    if (skip_special_tokens && kinds_[id] == Kind::kSpecial) continue;
    out.append(decoded_, decoded_begin_[id], decoded_begin_[id + 1] - decoded_begin_[id]);
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  ASYMPO_ASSIGN_OR_RETURN(std::string bytes, DecodeBytes(ids, skip_special_tokens));
  if (tokenizer_internal::ValidateUtf8(bytes).ok()) return bytes;
  return tokenizer_internal::RepairUtf8(bytes);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view name) const {
  const absl::string_view token(name.data(), name.size());
  if (auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  if (auto it = model_->vocab().find(token); it != model_->vocab().end()) return it->second;
  return std::nullopt;
}

std::optional<std::string_view> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || kinds_[id] == Kind::kNone) return std::nullopt;
  return std::string_view(id_to_token_[id]);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && kinds_[id] == Kind::kSpecial;
}

}  // namespace asympo
