// asympo-tokenize: encodes text to token ids, decodes ids to text, and adds
// token-id fields to JSONL datasets, with a Hugging Face tokenizer.json.
//
//   asympo-tokenize --tokenizer=tokenizer.json --text="Hello world"
//   echo -n "Hello world" | asympo-tokenize --tokenizer=tokenizer.json
//   asympo-tokenize --tokenizer=tokenizer.json --decode --ids="9707 1879"
//   asympo-tokenize --tokenizer=tokenizer.json --jsonl_in=train.jsonl
//       --jsonl_out=train.tok.jsonl --field=prompt --out_field=prompt_tokens
//
// Exit status: 0 on success, 1 on a bad input (message on stderr naming it),
// 2 on a usage error.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flag_usage.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_text.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, tokenizer, "", "Path to a Hugging Face tokenizer.json (required).");
ABSL_FLAG(std::optional<std::string>, text, std::nullopt,
          "Text to encode. Without it (and without --jsonl_in) the text is read from stdin, "
          "all of it, trailing newline included.");
ABSL_FLAG(bool, decode, false,
          "Decode token ids to text instead of encoding. The ids come from --ids or stdin, "
          "separated by spaces, commas or newlines; the text is printed as is, no newline "
          "added.");
ABSL_FLAG(std::optional<std::string>, ids, std::nullopt,
          "Token ids for --decode, e.g. \"9707 1879\"; without it they are read from stdin.");
ABSL_FLAG(bool, add_special_tokens, false,
          "When encoding, add the post-processor's special tokens around the text (e.g. "
          "Llama-3's <|begin_of_text|>; Qwen3 adds none). Special tokens written in the text "
          "are always recognized.");
ABSL_FLAG(bool, skip_special_tokens, false,
          "When decoding, leave out added tokens marked special (e.g. <|im_end|>).");
ABSL_FLAG(std::string, jsonl_in, "",
          "JSONL mode: read one JSON object per line from this file, encode its --field "
          "string, and write the line with an added --out_field array of ids to --jsonl_out. "
          "Blank lines are skipped; other keys are kept in order.");
ABSL_FLAG(std::string, jsonl_out, "",
          "JSONL mode: output file (written to <path>.tmp, renamed when complete); \"-\" or "
          "empty writes to stdout.");
ABSL_FLAG(std::string, field, "prompt", "JSONL mode: the string field to encode.");
ABSL_FLAG(std::string, out_field, "prompt_tokens",
          "JSONL mode: the field that receives the token ids (replaced if present).");

namespace asympo {
namespace {

std::string ReadAll(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::Status RunEncode(const Tokenizer& tok) {
  const std::optional<std::string> flag_text = absl::GetFlag(FLAGS_text);
  const std::string text = flag_text ? *flag_text : ReadAll(std::cin);
  if (absl::Status s = tokenizer_internal::ValidateUtf8(text); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag_text ? "--text" : "stdin", ": ", s.message()));
  }
  const std::vector<int32_t> ids = tok.Encode(text, absl::GetFlag(FLAGS_add_special_tokens));
  std::cout << absl::StrJoin(ids, " ") << "\n";
  return absl::OkStatus();
}

absl::Status RunDecode(const Tokenizer& tok) {
  const std::optional<std::string> flag_ids = absl::GetFlag(FLAGS_ids);
  const std::string input = flag_ids ? *flag_ids : ReadAll(std::cin);
  const char* source = flag_ids ? "--ids" : "stdin";
  std::vector<int32_t> ids;
  for (absl::string_view word :
       absl::StrSplit(input, absl::ByAnyChar(" ,\t\r\n"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(word, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": \"", word, "\" is not a token id; ids are integers"));
    }
    ids.push_back(id);
  }
  absl::StatusOr<std::string> text = tok.Decode(ids, absl::GetFlag(FLAGS_skip_special_tokens));
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", text.status().message()));
  }
  std::cout << *text;
  return absl::OkStatus();
}

absl::Status RunJsonl(const Tokenizer& tok) {
  const std::string in_path = absl::GetFlag(FLAGS_jsonl_in);
  const std::string out_path = absl::GetFlag(FLAGS_jsonl_out);
  const std::string field = absl::GetFlag(FLAGS_field);
  const std::string out_field = absl::GetFlag(FLAGS_out_field);
  const bool add_special = absl::GetFlag(FLAGS_add_special_tokens);
  std::ifstream in(in_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--jsonl_in ", in_path, ": cannot open"));

  const bool to_stdout = out_path.empty() || out_path == "-";
  const std::string tmp_path = out_path + ".tmp";
  std::ofstream file;
  if (!to_stdout) {
    file.open(tmp_path, std::ios::binary | std::ios::trunc);
    if (!file) {
      return absl::PermissionDeniedError(
          absl::StrCat("--jsonl_out ", out_path, ": cannot write ", tmp_path));
    }
  }
  std::ostream& out = to_stdout ? std::cout : file;
  auto fail = [&](absl::Status s) {
    if (!to_stdout) {
      file.close();
      std::remove(tmp_path.c_str());
    }
    return s;
  };

  std::string line;
  int64_t line_no = 0, written = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string where = absl::StrCat(in_path, ":", line_no);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::ordered_json record;
    try {
      record = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return fail(absl::InvalidArgumentError(absl::StrCat(where, ": not valid JSON: ", e.what())));
    }
    if (!record.is_object()) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat(where, ": is ", record.type_name(), "; each line must be a JSON object")));
    }
    auto it = record.find(field);
    if (it == record.end() || !it->is_string()) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat(where, ": field \"", field, "\" is ",
                       it == record.end() ? std::string("missing") : std::string(it->type_name()),
                       "; it must be a string")));
    }
    record[out_field] = tok.Encode(it->get<std::string>(), add_special);
    out << record.dump() << "\n";
    ++written;
  }
  if (in.bad()) return fail(absl::DataLossError(absl::StrCat(in_path, ": read failed")));
  out.flush();
  if (!out)
    return fail(absl::DataLossError(absl::StrCat("--jsonl_out ", out_path, ": write failed")));
  if (!to_stdout) {
    file.close();
    if (std::rename(tmp_path.c_str(), out_path.c_str()) != 0) {
      return fail(absl::DataLossError(
          absl::StrCat("--jsonl_out ", out_path, ": cannot rename ", tmp_path, " into place")));
    }
  }
  LOG(INFO) << "asympo-tokenize: wrote " << written << " records to "
            << (to_stdout ? "stdout" : out_path);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  SetProgramUsage(
      "asympo-tokenize: encodes text to token ids, decodes ids to text, or adds token ids to "
      "a JSONL dataset, with a Hugging Face tokenizer.json (byte-level BPE).\n"
      "  asympo-tokenize --tokenizer=tokenizer.json --text=\"Hello\"\n"
      "  asympo-tokenize --tokenizer=tokenizer.json --decode --ids=\"9707 1879\"\n"
      "  asympo-tokenize --tokenizer=tokenizer.json --jsonl_in=in.jsonl --jsonl_out=out.jsonl "
      "--field=prompt --out_field=prompt_tokens",
      "common/tokenizer/tokenize_main.cc");
  if (absl::Status s = ParseFlagsAndStartLogging(argc, argv); !s.ok()) {
    std::cerr << "asympo-tokenize: " << s.message() << "\n";
    return 2;
  }

  const std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty()) {
    std::cerr << "asympo-tokenize: --tokenizer is required (path to tokenizer.json); see --help\n";
    return 2;
  }
  const bool jsonl = !absl::GetFlag(FLAGS_jsonl_in).empty();
  if (jsonl && (absl::GetFlag(FLAGS_decode) || absl::GetFlag(FLAGS_text))) {
    std::cerr << "asympo-tokenize: --jsonl_in cannot be combined with --decode or --text\n";
    return 2;
  }
  if (!absl::GetFlag(FLAGS_decode) && absl::GetFlag(FLAGS_ids)) {
    std::cerr << "asympo-tokenize: --ids is only used with --decode\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(path);
  if (!tok.ok()) {
    std::cerr << "asympo-tokenize: " << tok.status().message() << "\n";
    return 1;
  }
  absl::Status s = jsonl                         ? RunJsonl(**tok)
                   : absl::GetFlag(FLAGS_decode) ? RunDecode(**tok)
                                                 : RunEncode(**tok);
  if (!s.ok()) {
    std::cerr << "asympo-tokenize: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace asympo

int main(int argc, char** argv) { return asympo::Main(argc, argv); }
