// Compares common/tokenizer/tokenizer.h with reference token ids (run_reference.sh).
//
//   tokenizer_reference_check TOKENIZER_JSON CASES_JSONL
//
// Each case line holds {"source", "text", "ids", "ids_special", "decoded",
// "exact_round_trip"} from the reference implementation
// (reference_cases.mjs). For every case it requires:
//   - Encode(text) == ids and Encode(text, add_special_tokens) == ids_special;
//   - Decode(ids) == decoded (the reference's decode);
//   - Decode(Encode(text)) == text where exact_round_trip says so: texts that
//     are not NFC-stable come back NFC-normalized from a tokenizer with an NFC
//     normalizer, which the two checks above cover.
// Prints the first failures in detail, load and encode timings, and a final
// "N passed, M failed" line; exits 1 if any case failed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Case {
  std::string source;
  std::string text;
  std::vector<int32_t> ids;
  std::vector<int32_t> ids_special;
  std::string decoded;
  bool exact_round_trip = true;
};

std::string Show(const std::string& s) {
  constexpr size_t kMax = 160;
  return "\"" + absl::CHexEscape(s.size() > kMax ? s.substr(0, kMax) + "..." : s) + "\"";
}

std::string ShowIds(const std::vector<int32_t>& ids, size_t from) {
  const size_t begin = from > 3 ? from - 3 : 0;
  const size_t end = std::min(ids.size(), from + 8);
  std::vector<int32_t> part(ids.begin() + std::min(begin, ids.size()), ids.begin() + end);
  return absl::StrCat(begin > 0 ? "... " : "", absl::StrJoin(part, " "),
                      end < ids.size() ? " ..." : "", " (", ids.size(), " ids)");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: tokenizer_reference_check TOKENIZER_JSON CASES_JSONL\n";
    return 2;
  }
  std::vector<Case> cases;
  {
    std::ifstream in(argv[2]);
    if (!in) {
      std::cerr << "cannot open cases file " << argv[2] << "\n";
      return 2;
    }
    std::string line;
    int line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line.empty()) continue;
      try {
        const nlohmann::json j = nlohmann::json::parse(line);
        cases.push_back(Case{j.at("source").get<std::string>(), j.at("text").get<std::string>(),
                             j.at("ids").get<std::vector<int32_t>>(),
                             j.at("ids_special").get<std::vector<int32_t>>(),
                             j.at("decoded").get<std::string>(),
                             j.at("exact_round_trip").get<bool>()});
      } catch (const nlohmann::json::exception& e) {
        std::cerr << argv[2] << ":" << line_no << ": " << e.what() << "\n";
        return 2;
      }
    }
  }

  const auto load_start = Clock::now();
  auto tokenizer = asympo::Tokenizer::FromFile(argv[1]);
  const auto load_time = Clock::now() - load_start;
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 2;
  }
  const asympo::Tokenizer& tok = **tokenizer;
  std::cout << "loaded " << argv[1] << " (vocab_size " << tok.vocab_size() << ") in "
            << Ms(load_time) << " ms\n";

  // Encode everything once with a cold word cache, timing it.
  std::vector<std::vector<int32_t>> ours(cases.size());
  size_t bytes = 0, tokens = 0;
  const auto encode_start = Clock::now();
  for (size_t i = 0; i < cases.size(); ++i) {
    ours[i] = tok.Encode(cases[i].text);
    bytes += cases[i].text.size();
    tokens += ours[i].size();
  }
  const auto encode_time = Clock::now() - encode_start;

  int passed = 0, failed = 0, id_mismatch = 0, special_mismatch = 0, decode_mismatch = 0;
  int round_trips = 0, round_trip_failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::vector<std::string> problems;
    if (ours[i] != c.ids) {
      ++id_mismatch;
      size_t at = 0;
      while (at < ours[i].size() && at < c.ids.size() && ours[i][at] == c.ids[at]) ++at;
      problems.push_back(absl::StrCat("ids differ at ", at, "\n      ours: ", ShowIds(ours[i], at),
                                      "\n      reference: ", ShowIds(c.ids, at)));
    }
    const std::vector<int32_t> with_special = tok.Encode(c.text, /*add_special_tokens=*/true);
    if (with_special != c.ids_special) {
      ++special_mismatch;
      problems.push_back(absl::StrCat("with add_special_tokens, ours: ", ShowIds(with_special, 0),
                                      "\n      reference: ", ShowIds(c.ids_special, 0)));
    }
    absl::StatusOr<std::string> decoded = tok.Decode(c.ids);
    if (!decoded.ok() || *decoded != c.decoded) {
      ++decode_mismatch;
      problems.push_back(
          absl::StrCat("Decode(reference ids) = ",
                       decoded.ok() ? Show(*decoded) : std::string(decoded.status().message()),
                       ", reference decode = ", Show(c.decoded)));
    }
    if (c.exact_round_trip) {
      ++round_trips;
      absl::StatusOr<std::string> back = tok.Decode(ours[i]);
      if (!back.ok() || *back != c.text) {
        ++round_trip_failures;
        problems.push_back(
            absl::StrCat("Decode(Encode(text)) = ",
                         back.ok() ? Show(*back) : std::string(back.status().message())));
      }
    }
    if (problems.empty()) {
      ++passed;
      continue;
    }
    if (++failed <= 20) {
      std::cout << "FAIL " << c.source << " text " << Show(c.text) << "\n";
      for (const std::string& p : problems) std::cout << "    " << p << "\n";
    }
  }

  // Warm cache: the steady state of a long-running daemon.
  const auto warm_start = Clock::now();
  size_t warm_tokens = 0;
  for (const Case& c : cases) warm_tokens += tok.Encode(c.text).size();
  const auto warm_time = Clock::now() - warm_start;

  const double mb = bytes / 1e6;
  std::cout << "encoded " << cases.size() << " strings, " << bytes << " bytes, " << tokens
            << " tokens: cold cache " << Ms(encode_time) << " ms (" << mb / (Ms(encode_time) / 1e3)
            << " MB/s), warm cache " << Ms(warm_time) << " ms (" << mb / (Ms(warm_time) / 1e3)
            << " MB/s, " << warm_tokens / (Ms(warm_time) / 1e3) << " tokens/s)\n";
  std::cout << "ids identical: " << cases.size() - id_mismatch << "/" << cases.size()
            << "; with add_special_tokens: " << cases.size() - special_mismatch << "/"
            << cases.size()
            << "; decode of reference ids identical: " << cases.size() - decode_mismatch << "/"
            << cases.size() << "; exact round trips: " << round_trips - round_trip_failures << "/"
            << round_trips << " (the other " << cases.size() - round_trips
            << " texts are not NFC and come back normalized: compared by ids and decode)\n";
  std::cout << "tokenizer reference: " << passed << " passed, " << failed << " failed\n";
  return failed == 0 ? 0 : 1;
}
