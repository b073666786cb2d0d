// asympo-submit: sends a JSONL file of scored prompt groups to a learner.
//
//   asympo-submit --learner=127.0.0.1:50051 --input=groups.jsonl
//   asympo-submit --learner=... --input=chat.jsonl --tokenizer=tokenizer.json
//
// One group per line: {"prompt_id": "q1", "prompt_tokens": [...] or "prompt":
// "text", "responses": [{"tokens": [...] or "text": "...", "reward": 1.0,
// "finish_reason": "stop", "behavior_logprobs": [...], "first_policy_version":
// 7, "last_policy_version": 8}, ...]} (all but the tokens and the reward
// optional). Text needs
// --tokenizer. Every row is checked against the learner's limits before
// anything is sent; a bad row is reported as "<file>:<line>: <rule>".
//
// Lines are sent in windows of --groups_per_batch lines, one batch each,
// whose batch_id names the window and its bytes
// ("<source>/<run>/<first>-<last>/<crc32c>"): sending a window again (a
// retry, a rerun) trains it once. A window with a bad row is not sent. The
// ids of confirmed windows are appended to --state (fsynced), and a rerun
// skips them: an interrupted run resumes where it stopped, and a rerun after
// a row was fixed sends only what was not confirmed. The learner's answers
// are read with the one Submit retry policy (common/submit_retry.h, docs/protocol.md
// "Retries"): backpressure (RESOURCE_EXHAUSTED and its retry hint) and
// outages are waited out, within --retry_deadline per batch; a batch that is
// final (drop_batch) is reported as refused and the run goes on; a fatal
// answer (credentials, roles, no learner at the address) stops it.
//
// Exit status: 0 when every row was accepted; 1 when a row was bad or
// refused (the rest was sent); 2 for a usage error, an unreadable file or a
// learner that refuses the connection or cannot be reached.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "asympo/v1/learner.grpc.pb.h"
#include "common/batch_validation.h"
#include "common/crc32c.h"
#include "common/flag_ranges.h"
#include "common/flag_usage.h"
#include "common/grpc_status.h"
#include "common/security/tls.h"
#include "common/status_macros.h"
#include "common/submit_retry.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, learner, "127.0.0.1:50051", "The learner's host:port.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle the learner's certificate must chain to; enables TLS.");
ABSL_FLAG(std::string, tls_cert, "", "A PEM client certificate, for mTLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "The name the learner's certificate must carry, when it is not --learner's host.");
ABSL_FLAG(std::string, tls_token_file, "",
          "File whose first line is the bearer token sent with every call (never logged).");
ABSL_FLAG(bool, insecure, false,
          "Allow the bearer token to travel in plaintext beyond loopback (no --tls_ca).");
ABSL_FLAG(std::string, input, "", "The JSONL file of groups (required).");
ABSL_FLAG(std::string, tokenizer, "",
          "A Hugging Face tokenizer.json, for rows that give \"prompt\" or response \"text\" "
          "instead of token ids.");
ABSL_FLAG(int32_t, groups_per_batch, 16,
          "Lines per batch (capped by the learner's max_groups_per_batch).");
ABSL_FLAG(std::string, source, "asympo-submit", "RolloutBatch.source, and the batch ids' prefix.");
ABSL_FLAG(std::string, run_id, "",
          "The batch ids' run part (default: the input file's name). Reruns of one file must "
          "keep it to be deduplicated.");
ABSL_FLAG(std::string, state, "",
          "File of confirmed batch ids, appended as batches are accepted and read to resume "
          "(default: <input>.submitted; \"none\" keeps none).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60), "Deadline of one Submit call.");
ABSL_FLAG(absl::Duration, retry_deadline, absl::Minutes(10),
          "How long one batch is retried through backpressure and outages before the run "
          "stops with exit status 2 (what was confirmed stays confirmed).");
ABSL_FLAG(absl::Duration, progress_every, absl::Seconds(2),
          "Interval of the progress line on stderr (0: none).");
ABSL_FLAG(bool, check_only, false, "Check every row against the learner's limits; send nothing.");

namespace asympo {
// The documented ranges (--help shows them; a value outside is refused at
// start, before the options are read: they need no check of their own).
ASYMPO_FLAG_RANGE(groups_per_batch, 1, 65536);
ASYMPO_DURATION_FLAG_RANGE(timeout, absl::Milliseconds(1), absl::Hours(24));
ASYMPO_DURATION_FLAG_RANGE(retry_deadline, absl::ZeroDuration(), absl::Hours(24 * 7));
ASYMPO_DURATION_FLAG_RANGE(progress_every, absl::ZeroDuration(), absl::Hours(24));

namespace {

struct Row {
  int line = 0;
  std::string text;
  v1::PromptGroup group;
  std::string error;  // empty: good
};

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

// Parses one line into row->group, or sets row->error.
void ParseRow(const std::string& name, const Tokenizer* tok, const BatchLimits& limits, Row* row) {
  try {
    const nlohmann::json j = nlohmann::json::parse(row->text);
    if (!j.is_object()) throw std::runtime_error("the line is not a JSON object");
    v1::PromptGroup& g = row->group;
    if (j.contains("prompt_id") && !j["prompt_id"].is_string()) {
      throw std::runtime_error("prompt_id is not a string");
    }
    g.set_prompt_id(j.value("prompt_id", absl::StrCat(name, ":", row->line)));
    for (int32_t id : TokensOf(j, tok, "prompt_tokens", "prompt", "the prompt")) {
      g.add_prompt_tokens(id);
    }
    if (!j.contains("responses") || !j["responses"].is_array()) {
      throw std::runtime_error("\"responses\" is missing or not a list");
    }
    for (size_t i = 0; i < j["responses"].size(); ++i) {
      *g.add_responses() = ParseResponse(j["responses"][i], tok, absl::StrCat("response ", i));
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

struct Tally {
  int64_t groups_sent = 0, duplicates = 0, skipped_confirmed = 0, refused_rows = 0, bad_rows = 0;
  uint64_t version = 0;
  uint32_t queue = 0;
  bool waiting = false;
};

// Sends one batch through the Submit retry policy (docs/protocol.md,
// "Retries") until it is accepted (true), dropped as final (false, *refusal
// set), or a fatal error or the spent --retry_deadline (returned).
absl::StatusOr<bool> SendBatch(v1::Learner::Stub* stub, const v1::RolloutBatch& batch, Tally* t,
                               std::string* refusal) {
  const absl::Time give_up = absl::Now() + absl::GetFlag(FLAGS_retry_deadline);
  SubmitBackoff backoff(absl::Milliseconds(100), absl::Seconds(10));
  v1::SubmitResponse r;
  const SubmitAttempt a = SubmitUntilSettled(
      *stub, batch, {absl::GetFlag(FLAGS_timeout), /*wait_for_ready=*/true}, backoff,
      [&](const SubmitAttempt& a) {
        t->waiting = a.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
        if (absl::Now() + a.wait > give_up) return false;
        absl::SleepFor(a.wait);
        return true;
      },
      &r);
  const grpc::Status& s = a.status;
  switch (a.decision) {
    case SubmitDecision::kAccepted:
      t->waiting = false;
      t->groups_sent += batch.groups_size();
      t->duplicates += static_cast<int64_t>(r.duplicate_batches());
      t->version = r.learner_version();
      t->queue = r.queue_depth_groups();
      return true;
    case SubmitDecision::kDropBatch:
      *refusal = s.error_message();  // a retry could not pass
      return false;
    case SubmitDecision::kFatal:
      return absl::FailedPreconditionError(
          absl::StrCat("the learner refused batch ", batch.batch_id(), ": ",
                       GrpcCodeName(s.error_code()), ": ", s.error_message()));
    case SubmitDecision::kRetry:
      break;
  }
  return absl::UnavailableError(
      absl::StrCat("batch ", batch.batch_id(), " was not accepted within --retry_deadline (last: ",
                   GrpcCodeName(s.error_code()), ": ", s.error_message(), ")"));
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

class StateFile {
 public:
  absl::Status Open(const std::string& path) {
    if (path == "none") return absl::OkStatus();
    std::ifstream in(path);
    for (std::string id; std::getline(in, id);) {
      if (!id.empty()) confirmed_.insert(id);
    }
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) return absl::InvalidArgumentError(absl::StrCat("cannot write --state ", path));
    return absl::OkStatus();
  }
  ~StateFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool Confirmed(const std::string& id) const { return confirmed_.count(id) > 0; }
  void Confirm(const std::string& id) {
    if (fd_ < 0) return;
    const std::string line = id + "\n";
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size()) ||
        ::fsync(fd_) != 0) {
      std::cerr << "asympo-submit: warning: cannot record " << id << " in --state\n";
    }
  }
  size_t size() const { return confirmed_.size(); }

 private:
  std::set<std::string> confirmed_;
  int fd_ = -1;
};

absl::StatusOr<std::vector<Row>> ReadRows(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read --input ", path));
  std::vector<Row> rows;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    rows.push_back(Row{line, std::move(text), {}, {}});
  }
  return rows;
}

struct Run {
  std::string input, name, id_prefix;
  v1::Learner::Stub* stub = nullptr;
  StateFile state;
  Tally tally;
  int64_t lines = 0, done_lines = 0;
  absl::Time last_progress = absl::Now();
};

void Progress(Run* run, bool force) {
  const absl::Duration every = absl::GetFlag(FLAGS_progress_every);
  if (every <= absl::ZeroDuration() || (!force && absl::Now() - run->last_progress < every)) return;
  run->last_progress = absl::Now();
  const Tally& t = run->tally;
  std::cerr << absl::StrFormat(
      "asympo-submit: %d/%d rows, %d groups sent (%d duplicates), %d skipped as confirmed, %d bad, "
      "%d refused; learner version %d, queue %d%s\n",
      run->done_lines, run->lines, t.groups_sent, t.duplicates, t.skipped_confirmed, t.bad_rows,
      t.refused_rows, t.version, t.queue,
      t.waiting ? " (waiting: the learner's queue is full)" : "");
}

// Sends rows[begin, end) as one batch unless a row is bad or it was confirmed.
absl::Status SendWindow(Run* run, std::vector<Row>& rows, size_t begin, size_t end) {
  std::string bytes;
  for (size_t i = begin; i < end; ++i) absl::StrAppend(&bytes, rows[i].text, "\n");
  v1::RolloutBatch batch;
  batch.set_source(absl::GetFlag(FLAGS_source));
  batch.set_batch_id(absl::StrFormat("%s%d-%d/%08x", run->id_prefix, rows[begin].line,
                                     rows[end - 1].line, Crc32c(bytes.data(), bytes.size())));
  run->done_lines += static_cast<int64_t>(end - begin);
  bool bad = false;
  for (size_t i = begin; i < end; ++i) {
    if (rows[i].error.empty()) continue;
    std::cerr << run->input << ":" << rows[i].line << ": " << rows[i].error << "\n";
    ++run->tally.bad_rows;
    bad = true;
  }
  if (bad) {
    std::cerr << run->input << ":" << rows[begin].line << "-" << rows[end - 1].line
              << ": not sent (a bad row in its batch); fix the row and run again\n";
    return absl::OkStatus();
  }
  if (run->state.Confirmed(batch.batch_id())) {
    run->tally.skipped_confirmed += static_cast<int64_t>(end - begin);
    return absl::OkStatus();
  }
  for (size_t i = begin; i < end; ++i) *batch.add_groups() = std::move(rows[i].group);
  if (absl::GetFlag(FLAGS_check_only)) return absl::OkStatus();
  std::string refusal;
  ASYMPO_ASSIGN_OR_RETURN(const bool accepted, SendBatch(run->stub, batch, &run->tally, &refusal));
  if (!accepted) {
    std::cerr << run->input << ":" << rows[begin].line << "-" << rows[end - 1].line
              << ": refused by the learner: " << refusal << "\n";
    run->tally.refused_rows += static_cast<int64_t>(end - begin);
    return absl::OkStatus();
  }
  run->state.Confirm(batch.batch_id());
  Progress(run, false);
  return absl::OkStatus();
}

absl::StatusOr<v1::LearnerStatus> LearnerStatus(v1::Learner::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(absl::GetFlag(FLAGS_timeout)));
  ctx.set_wait_for_ready(true);
  v1::LearnerStatus st;
  const grpc::Status s = stub->GetStatus(&ctx, v1::GetStatusRequest(), &st);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "the learner at ", absl::GetFlag(FLAGS_learner),
        " did not answer GetStatus: ", GrpcCodeName(s.error_code()), ": ", s.error_message()));
  }
  return st;
}

BatchLimits LimitsOf(const v1::LearnerStatus& st) {
  BatchLimits l;
  l.vocab_size = st.limits().vocab_size();
  l.min_group_size = st.limits().min_group_size();
  l.max_group_size = st.limits().max_group_size();
  l.max_prompt_tokens = st.limits().max_prompt_tokens();
  l.max_response_tokens = st.limits().max_response_tokens();
  l.max_groups_per_batch = st.limits().max_groups_per_batch();
  l.require_behavior_logprobs = st.wants_behavior_logprobs();
  return l;
}

absl::StatusOr<int> Main() {
  Run run;
  run.input = absl::GetFlag(FLAGS_input);
  if (run.input.empty()) return absl::InvalidArgumentError("--input is required");
  const int32_t per_batch = absl::GetFlag(FLAGS_groups_per_batch);
  std::unique_ptr<Tokenizer> tok;
  if (!absl::GetFlag(FLAGS_tokenizer).empty()) {
    ASYMPO_ASSIGN_OR_RETURN(tok, Tokenizer::FromFile(absl::GetFlag(FLAGS_tokenizer)));
  }
  ASYMPO_ASSIGN_OR_RETURN(std::vector<Row> rows, ReadRows(run.input));
  run.lines = static_cast<int64_t>(rows.size());
  run.name = BaseName(run.input);
  const std::string run_id =
      absl::GetFlag(FLAGS_run_id).empty() ? run.name : absl::GetFlag(FLAGS_run_id);
  run.id_prefix =
      absl::StrCat(absl::GetFlag(FLAGS_source).substr(0, 40), "/", run_id.substr(0, 48), "/");
  const std::string state =
      absl::GetFlag(FLAGS_state).empty() ? run.input + ".submitted" : absl::GetFlag(FLAGS_state);
  ASYMPO_RETURN_IF_ERROR(run.state.Open(absl::GetFlag(FLAGS_check_only) ? "none" : state));
  security::ClientTlsOptions tls;
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  tls.token_file = absl::GetFlag(FLAGS_tls_token_file);
  tls.insecure = absl::GetFlag(FLAGS_insecure);
  prometheus::Registry tls_registry;  // asympo-submit exports no metrics
  ASYMPO_ASSIGN_OR_RETURN(
      auto channel, security::CreateClientChannel(absl::GetFlag(FLAGS_learner), tls, tls_registry));
  auto stub = v1::Learner::NewStub(channel);
  run.stub = stub.get();
  ASYMPO_ASSIGN_OR_RETURN(const v1::LearnerStatus st, LearnerStatus(stub.get()));
  const BatchLimits limits = LimitsOf(st);
  for (Row& row : rows) ParseRow(run.name, tok.get(), limits, &row);
  const size_t window = static_cast<size_t>(std::min(per_batch, limits.max_groups_per_batch));
  for (size_t begin = 0; begin < rows.size(); begin += window) {
    ASYMPO_RETURN_IF_ERROR(SendWindow(&run, rows, begin, std::min(rows.size(), begin + window)));
  }
  Progress(&run, true);
  const Tally& t = run.tally;
  std::cout << nlohmann::json{{"rows", run.lines},
                              {"groups_sent", t.groups_sent},
                              {"duplicates", t.duplicates},
                              {"skipped_confirmed", t.skipped_confirmed},
                              {"bad_rows", t.bad_rows},
                              {"refused_rows", t.refused_rows},
                              {"learner_version", t.version},
                              {"check_only", absl::GetFlag(FLAGS_check_only)}}
                   .dump()
            << std::endl;
  return t.bad_rows + t.refused_rows > 0 ? 1 : 0;
}

}  // namespace
}  // namespace asympo

int main(int argc, char** argv) {
  asympo::SetProgramUsage(
      "asympo-submit: sends a JSONL file of scored prompt groups to an asympo-learner, "
      "exactly once.\n"
      "  asympo-submit --learner=HOST:PORT --input=groups.jsonl [--tokenizer=tokenizer.json]\n"
      "Exit status: 0 all rows accepted, 1 a row bad or refused, 2 usage or connection error.",
      "rollout_server/submit_main.cc");
  if (absl::Status s = asympo::ParseFlagsAndStartLogging(argc, argv); !s.ok()) {
    std::cerr << "asympo-submit: " << s.message() << "\n";
    return 2;
  }
  absl::StatusOr<int> rc = asympo::Main();
  if (!rc.ok()) {
    std::cerr << "asympo-submit: " << rc.status().message() << "\n";
    return 2;
  }
  return *rc;
}
