#include "rollout_server/submit/submit_rows.h"

#include <cstdint>
#include <fstream>
#include <optional>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "rollout_server/submit/submit_state.h"

namespace asympo::submit {
namespace {

std::vector<int32_t> TokensOf(const nlohmann::json& j, const Tokenizer* tok, const char* ids_key,
                              const char* text_key, const std::string& what) {
  if (j.contains(ids_key)) {
    const nlohmann::json& ids = j[ids_key];
    if (!ids.is_array()) throw std::runtime_error(what + " " + ids_key + " is not a list");
    std::vector<int32_t> out;
    for (const auto& v : ids) {
      if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
        throw std::runtime_error(
            absl::StrCat(what, " ", ids_key, " holds ", v.dump(), ", not a token id"));
      }
      out.push_back(v.get<int32_t>());
    }
    return out;
  }
  if (!j.contains(text_key)) {
    throw std::runtime_error(
        absl::StrCat(what, " has neither \"", ids_key, "\" nor \"", text_key, "\""));
  }
  if (!j[text_key].is_string()) throw std::runtime_error(what + " " + text_key + " is not text");
  if (tok == nullptr) {
    throw std::runtime_error(
        absl::StrCat(what, " gives \"", text_key, "\": tokenizing it needs --tokenizer"));
  }
  return tok->Encode(j[text_key].get<std::string>());
}

v1::Response ParseResponse(const nlohmann::json& r, const Tokenizer* tok, const std::string& what) {
  if (!r.is_object()) throw std::runtime_error(what + " is not an object");
  v1::Response out;
  for (int32_t id : TokensOf(r, tok, "tokens", "text", what)) out.add_tokens(id);
  if (!r.contains("reward") || !r["reward"].is_number()) {
    throw std::runtime_error(what + " has no numeric \"reward\"");
  }
  out.set_reward(r["reward"].get<float>());
  if (r.contains("finish_reason")) {
    const std::string f =
        r["finish_reason"].is_string() ? r["finish_reason"].get<std::string>() : "?";
    if (f == "stop") {
      out.set_finish_reason(v1::FINISH_REASON_STOP);
    } else if (f == "length") {
      out.set_finish_reason(v1::FINISH_REASON_LENGTH);
    } else {
      throw std::runtime_error(what + " finish_reason is not \"stop\" or \"length\"");
    }
  }
  if (r.contains("behavior_logprobs")) {
    if (!r["behavior_logprobs"].is_array()) {
      throw std::runtime_error(what + " behavior_logprobs is not a list");
    }
    for (const auto& v : r["behavior_logprobs"]) {
      if (!v.is_number()) throw std::runtime_error(what + " behavior_logprobs holds a non-number");
      out.add_behavior_logprobs(v.get<float>());
    }
  }
  // The policy versions that sampled the response's first and last token
  // (docs/protocol.md, "Policy lag"); the ordering is checked with the
  // learner's rules (ValidateBatch).
  const auto version = [&](const char* key) -> std::optional<uint64_t> {
    if (!r.contains(key)) return std::nullopt;
    if (!r[key].is_number_unsigned()) {
      throw std::runtime_error(absl::StrCat(what, " ", key, " is not a non-negative integer"));
    }
    return r[key].get<uint64_t>();
  };
  if (const auto v = version("first_policy_version")) out.set_first_policy_version(*v);
  if (const auto v = version("last_policy_version")) out.set_last_policy_version(*v);
  return out;
}

}  // namespace

void ParseRow(const Tokenizer* tok, const BatchLimits& limits, Row* row) {
  try {
    const nlohmann::json j = nlohmann::json::parse(row->text);
    if (!j.is_object()) throw std::runtime_error("the line is not a JSON object");
    v1::PromptGroup& g = row->group;
    if (j.contains("prompt_id") && !j["prompt_id"].is_string()) {
      throw std::runtime_error("prompt_id is not a string");
    }
    for (int32_t id : TokensOf(j, tok, "prompt_tokens", "prompt", "the prompt")) {
      g.add_prompt_tokens(id);
    }
    if (!j.contains("responses") || !j["responses"].is_array()) {
      throw std::runtime_error("\"responses\" is missing or not a list");
    }
    for (size_t i = 0; i < j["responses"].size(); ++i) {
      *g.add_responses() = ParseResponse(j["responses"][i], tok, absl::StrCat("response ", i));
    }
    if (!j.contains("prompt_id")) {
      g.set_prompt_id(absl::StrCat("row-", GroupDigest(g).substr(0, 16)));
    } else {
      g.set_prompt_id(j["prompt_id"].get<std::string>());
    }
    v1::RolloutBatch one;
    *one.add_groups() = g;
    const absl::Status s = ValidateRolloutBatch(one, limits);
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  } catch (const nlohmann::json::parse_error& e) {
    const std::string what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
    const size_t at = what.find("] ");
    row->error = "not valid JSON: " + (at == std::string::npos ? what : what.substr(at + 2));
  } catch (const std::exception& e) {
    row->error = e.what();
  }
}

absl::StatusOr<std::vector<Row>> ReadRows(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read --input ", path));
  std::vector<Row> rows;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    rows.push_back(Row{line, std::move(text), {}, {}, {}});
  }
  return rows;
}

}  // namespace asympo::submit
