// asympo-submit: sends a JSONL file of scored prompt groups to a learner,
// exactly once, and waits until the learner confirms it trained them.
//
//   asympo-submit --learner=127.0.0.1:50051 --input=groups.jsonl
//   asympo-submit --learner=... --input=chat.jsonl --tokenizer=tokenizer.json
//
// One group per line: {"prompt_id": "q1", "prompt_tokens": [...] or "prompt":
// "text", "responses": [{"tokens": [...] or "text": "...", "reward": 1.0,
// "finish_reason": "stop", "behavior_logprobs": [...], "first_policy_version":
// 7, "last_policy_version": 8}, ...]} (all but the tokens and the reward
// optional; text needs --tokenizer). Every row is checked against the
// learner's limits before anything is sent; a bad row is reported as
// "<file>:<line>: <rule>" and not sent; every good row is.
//
// Windows are keyed by content, never by line numbers
// (rollout_server/submit/submit_state.h says exactly what is keyed by what): the
// good rows that are in no window yet form windows of --groups_per_batch
// rows in file order, one batch each, whose batch_id is derived from the
// rows' digests. A window is recorded in --state before it is first sent and
// its rows never go in another window: lines deleted, inserted or moved
// change nothing already sent, and a fixed row is new content, sent once.
//
// Accepted is not trained (docs/protocol.md, "Recovery after a learner
// restart"). Each accepted window is recorded with the reply's
// learner_incarnation and learner_version, and as trained only when
// GetStatus from that same incarnation reports recorded_through_version
// (--confirm=trained: trained_through_version) above that version; the run
// ends by waiting up to --confirm_timeout for it. A window not confirmed is
// sent again, with its batch_id and payload, whenever the learner is not the
// incarnation that accepted it: at the start of a rerun, and as soon as a
// reply or GetStatus shows a restarted learner. The learner answers those it
// had recorded as duplicates and queues those it lost.
//
// The learner's answers are read with the one Submit retry policy
// (common/submit_retry.h, docs/protocol.md "Retries"): backpressure and
// outages are waited out, within --retry_deadline per batch; a batch that is
// final (drop_batch) is reported as refused and the run goes on; a fatal
// answer (credentials, roles, no learner at the address) stops it.
//
// Exit status: 0 when every good row is confirmed trained and no row was
// bad; 1 when a row was bad or refused, or a window the restarted learner
// lost has rows no longer in the file (the rest was sent); 2 for a usage
// error, an unreadable file or state, or a learner that refuses the
// connection or cannot be reached; 3 when every row was accepted but some
// windows are not confirmed yet (a rerun confirms them or sends them again).
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "asympo/v1/learner.grpc.pb.h"
#include "common/batch_validation.h"
#include "common/flag_ranges.h"
#include "common/flag_usage.h"
#include "common/grpc_status.h"
#include "common/listener/host_port.h"
#include "common/security/tls.h"
#include "common/status_macros.h"
#include "common/submit_retry.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "rollout_server/submit/submit_rows.h"
#include "rollout_server/submit/submit_state.h"

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
          "Rows per window, one batch each (capped by the learner's max_groups_per_batch).");
ABSL_FLAG(std::string, source, "asympo-submit", "RolloutBatch.source, and the batch ids' prefix.");
ABSL_FLAG(std::string, run_id, "",
          "The batch ids' run part (default: the input file's name). Reruns of one file must "
          "keep it, and the --state that holds the run's random id part, to be deduplicated.");
ABSL_FLAG(std::string, state, "",
          "The run's record of windows formed, accepted and confirmed (JSON lines, fsynced), "
          "read by a rerun to resume (default: <input>.submitted; \"none\" keeps none).");
ABSL_FLAG(std::string, confirm, "recorded",
          "What confirms a window as trained: \"recorded\" (GetStatus.recorded_through_version: "
          "the learner's checkpoint holds it, so it survives a learner restart) or \"trained\" "
          "(trained_through_version: for a learner without --checkpoint_dir, which records "
          "nothing).");
ABSL_FLAG(absl::Duration, confirm_timeout, absl::Minutes(5),
          "How long the run waits at its end for the learner to confirm the windows it accepted "
          "(0: read GetStatus once). Windows left unconfirmed give exit status 3; a rerun "
          "confirms them, or sends them again if the learner restarted.");
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
ASYMPO_DURATION_FLAG_RANGE(confirm_timeout, absl::ZeroDuration(), absl::Hours(24 * 7));

namespace {

using submit::Row;
using submit::Window;
using submit::WindowState;

struct Tally {
  int64_t groups_sent = 0, duplicates = 0, resent_windows = 0, skipped_confirmed = 0,
          refused_rows = 0, bad_rows = 0;
  uint64_t version = 0;
  uint32_t queue = 0;
  bool waiting = false;
};

struct Run {
  std::string input, id_prefix;
  v1::Learner::Stub* stub = nullptr;
  submit::StateFile state;
  absl::flat_hash_map<std::string, const Row*> rows;  // the good rows, by key
  std::string incarnation;                            // the learner's, as last seen
  bool restarted = false;                  // a reply came from another incarnation: resend
  bool by_recorded = true;                 // --confirm=recorded
  absl::flat_hash_set<size_t> unsendable;  // windows to resend whose rows are gone
  Tally tally;
  int64_t lines = 0;
  absl::Time last_progress = absl::Now();
};

// Windows accepted (or formed) and not yet confirmed, that can still be.
struct Pending {
  int64_t windows = 0, groups = 0, confirmed_windows = 0, confirmed_groups = 0;
};

Pending PendingOf(const Run& run) {
  Pending p;
  for (size_t w = 0; w < run.state.windows().size(); ++w) {
    const Window& win = run.state.window(w);
    const auto groups = static_cast<int64_t>(win.keys.size());
    if (win.state == WindowState::kTrained) {
      ++p.confirmed_windows;
      p.confirmed_groups += groups;
    } else if (win.state != WindowState::kRefused && !run.unsendable.contains(w)) {
      ++p.windows;
      p.groups += groups;
    }
  }
  return p;
}

void Progress(Run* run, bool force) {
  const absl::Duration every = absl::GetFlag(FLAGS_progress_every);
  if (every <= absl::ZeroDuration() || (!force && absl::Now() - run->last_progress < every)) return;
  run->last_progress = absl::Now();
  const Tally& t = run->tally;
  const Pending p = PendingOf(*run);
  std::cerr << absl::StrFormat(
      "asympo-submit: %d rows, %d groups sent (%d duplicates, %d windows again), %d skipped as "
      "confirmed, %d bad, %d refused; %d windows confirmed, %d awaiting; learner version %d, "
      "queue %d%s\n",
      run->lines, t.groups_sent, t.duplicates, t.resent_windows, t.skipped_confirmed, t.bad_rows,
      t.refused_rows, p.confirmed_windows, p.windows, t.version, t.queue,
      t.waiting ? " (waiting: the learner's queue is full)" : "");
}

// Sends one batch through the Submit retry policy (docs/protocol.md,
// "Retries") until it is accepted (true, *reply set), dropped as final
// (false, *refusal set), or a fatal error or the spent --retry_deadline
// (returned).
absl::StatusOr<bool> SendBatch(v1::Learner::Stub* stub, const v1::RolloutBatch& batch, Tally* t,
                               std::string* refusal, v1::SubmitResponse* reply) {
  const absl::Time give_up = absl::Now() + absl::GetFlag(FLAGS_retry_deadline);
  SubmitBackoff backoff(absl::Milliseconds(100), absl::Seconds(10));
  const SubmitAttempt a = SubmitUntilSettled(
      *stub, batch, {absl::GetFlag(FLAGS_timeout), /*wait_for_ready=*/true}, backoff,
      [&](const SubmitAttempt& a) {
        t->waiting = a.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
        if (absl::Now() + a.wait > give_up) return false;
        absl::SleepFor(a.wait);
        return true;
      },
      reply);
  const grpc::Status& s = a.status;
  switch (a.decision) {
    case SubmitDecision::kAccepted:
      t->waiting = false;
      t->groups_sent += batch.groups_size();
      t->duplicates += static_cast<int64_t>(reply->duplicate_batches());
      t->version = reply->learner_version();
      t->queue = reply->queue_depth_groups();
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

// A learner that answers as another incarnation restarted: every window it
// did not confirm is to be sent again.
void SawIncarnation(Run* run, const std::string& incarnation) {
  if (incarnation == run->incarnation) return;
  if (!run->incarnation.empty()) {
    std::cerr << "asympo-submit: the learner restarted (incarnation " << incarnation << ", was "
              << run->incarnation << "): windows it did not confirm are sent again\n";
  }
  run->incarnation = incarnation;
  run->restarted = true;
}

// The file's lines of `win`'s rows that are still in it, for messages.
std::string LinesOf(const Run& run, const Window& win) {
  std::vector<int> lines;
  for (const std::string& k : win.keys) {
    if (auto it = run.rows.find(k); it != run.rows.end()) lines.push_back(it->second->line);
  }
  return absl::StrCat(run.input, ":", absl::StrJoin(lines, ","));
}

// Sends window `w` (`again`: a window sent before, with its batch_id) until
// it is accepted or refused.
absl::Status SendWindow(Run* run, size_t w, bool again) {
  const Window& win = run->state.window(w);
  v1::RolloutBatch batch;
  batch.set_source(absl::GetFlag(FLAGS_source));
  batch.set_batch_id(win.id);
  for (const std::string& k : win.keys) {
    auto it = run->rows.find(k);
    if (it == run->rows.end()) {
      std::cerr << run->input << ": window " << win.id << " (" << win.keys.size()
                << " rows) must be sent again, but row " << k
                << " is no longer in the file: not sent, and not confirmed\n";
      run->unsendable.insert(w);
      return absl::OkStatus();
    }
    *batch.add_groups() = it->second->group;
  }
  std::string refusal;
  v1::SubmitResponse reply;
  ASYMPO_ASSIGN_OR_RETURN(const bool accepted,
                          SendBatch(run->stub, batch, &run->tally, &refusal, &reply));
  if (again) ++run->tally.resent_windows;
  if (!accepted) {
    std::cerr << LinesOf(*run, win) << ": refused by the learner: " << refusal << "\n";
    run->tally.refused_rows += static_cast<int64_t>(win.keys.size());
    run->state.Refused(w);
    return absl::OkStatus();
  }
  run->state.Accepted(w, reply.learner_incarnation(), reply.learner_version());
  // A duplicate of a batch the restarted learner's checkpoint records in
  // full: confirmed now, not after that learner's next checkpoint.
  if (reply.recorded_duplicates() > 0) run->state.Trained(w);
  SawIncarnation(run, reply.learner_incarnation());
  Progress(run, false);
  return absl::OkStatus();
}

// Whether window `w` is to be sent (again): formed but never answered, or
// accepted by a learner incarnation that is gone.
bool NeedsSend(const Run& run, size_t w) {
  const Window& win = run.state.window(w);
  if (run.unsendable.contains(w)) return false;
  return win.state == WindowState::kFormed ||
         (win.state == WindowState::kAccepted && win.incarnation != run.incarnation);
}

// Sends again every window that needs it, until the learner stays the same
// incarnation through a whole pass.
absl::Status SendUnconfirmed(Run* run) {
  run->restarted = false;
  for (bool sent = true; sent;) {
    sent = false;
    for (size_t w = 0; w < run->state.windows().size(); ++w) {
      if (!NeedsSend(*run, w)) continue;
      ASYMPO_RETURN_IF_ERROR(SendWindow(run, w, /*again=*/true));
      sent = true;
    }
  }
  run->restarted = false;
  return absl::OkStatus();
}

// Forms windows of the good rows in no window yet, in file order, and sends
// each.
absl::Status SendNew(Run* run, const std::vector<Row>& rows, size_t per_window) {
  std::vector<const Row*> free;
  for (const Row& r : rows) {
    if (r.error.empty() && !run->state.Claimed(r.key)) free.push_back(&r);
  }
  for (size_t begin = 0; begin < free.size(); begin += per_window) {
    std::vector<std::string> keys;
    for (size_t i = begin; i < std::min(free.size(), begin + per_window); ++i) {
      keys.push_back(free[i]->key);
    }
    const size_t w = run->state.Formed(submit::WindowId(run->id_prefix, keys), keys);
    ASYMPO_RETURN_IF_ERROR(SendWindow(run, w, /*again=*/false));
    if (run->restarted) ASYMPO_RETURN_IF_ERROR(SendUnconfirmed(run));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::LearnerStatus> ReadStatus(v1::Learner::Stub* stub, absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(GrpcDeadline(timeout));
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

// Records as trained every accepted window that `st` confirms: from the
// incarnation that accepted it, a confirming version above its version.
// Recorded is also capped at checkpoint_version: a batch answered at the
// checkpoint's own version after it was written is not in it (learners
// report no more since recorded_through_version was capped; the cap keeps
// older ones safe).
void Confirm(Run* run, const v1::LearnerStatus& st) {
  const uint64_t through = run->by_recorded
                               ? std::min(st.recorded_through_version(), st.checkpoint_version())
                               : st.trained_through_version();
  run->tally.version = st.version();
  run->tally.queue = st.queue_depth_groups();
  for (size_t w = 0; w < run->state.windows().size(); ++w) {
    const Window& win = run->state.window(w);
    if (win.state == WindowState::kAccepted && !st.incarnation().empty() &&
        win.incarnation == st.incarnation() && win.version < through) {
      run->state.Trained(w);
    }
  }
}

// Reads GetStatus until every window is confirmed or --confirm_timeout is
// spent (once at least); sends again what a restarted learner lost.
absl::Status AwaitConfirmation(Run* run) {
  if (PendingOf(*run).windows == 0) return absl::OkStatus();
  const absl::Time give_up = absl::Now() + absl::GetFlag(FLAGS_confirm_timeout);
  SubmitBackoff backoff(absl::Milliseconds(50), absl::Seconds(1));
  for (;;) {
    const absl::Duration left = std::max(give_up - absl::Now(), absl::Seconds(1));
    const absl::StatusOr<v1::LearnerStatus> st =
        ReadStatus(run->stub, std::min(left, absl::GetFlag(FLAGS_timeout)));
    if (st.ok()) {
      SawIncarnation(run, st->incarnation());
      if (run->restarted) ASYMPO_RETURN_IF_ERROR(SendUnconfirmed(run));
      Confirm(run, *st);
    }
    if (PendingOf(*run).windows == 0 || absl::Now() >= give_up) return absl::OkStatus();
    Progress(run, false);
    absl::SleepFor(std::min(backoff.Next(std::nullopt), give_up - absl::Now()));
  }
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

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::StatusOr<std::unique_ptr<v1::Learner::Stub>> Connect() {
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
  return v1::Learner::NewStub(channel);
}

// Parses every row against the learner's limits, names the bad ones and
// keys the good ones (submit_state.h).
void ParseAll(Run* run, const Tokenizer* tok, const BatchLimits& limits, std::vector<Row>* rows) {
  std::vector<const v1::PromptGroup*> groups;
  for (Row& row : *rows) {
    submit::ParseRow(tok, limits, &row);
    if (!row.error.empty()) {
      std::cerr << run->input << ":" << row.line << ": " << row.error
                << " (not sent; fix the row and run again)\n";
      ++run->tally.bad_rows;
      continue;
    }
    groups.push_back(&row.group);
  }
  const std::vector<std::string> keys = submit::RowKeys(groups);
  size_t i = 0;
  for (Row& row : *rows) {
    if (!row.error.empty()) continue;
    row.key = keys[i++];
    run->rows[row.key] = &row;
  }
}

// The last line on stdout: what was sent, and what is confirmed and not.
int Summarize(Run* run) {
  Progress(run, true);
  const Tally& t = run->tally;
  const Pending p = PendingOf(*run);
  if (p.windows > 0) {
    std::cerr << "asympo-submit: " << p.windows << " windows (" << p.groups
              << " groups) accepted but not confirmed as " << absl::GetFlag(FLAGS_confirm)
              << " within --confirm_timeout: run again later; it confirms them, or sends them "
                 "again if the learner lost them\n";
  }
  std::cout << nlohmann::json{{"rows", run->lines},
                              {"groups_sent", t.groups_sent},
                              {"duplicates", t.duplicates},
                              {"resent_windows", t.resent_windows},
                              {"skipped_confirmed", t.skipped_confirmed},
                              {"bad_rows", t.bad_rows},
                              {"refused_rows", t.refused_rows},
                              {"windows_confirmed", p.confirmed_windows},
                              {"groups_confirmed", p.confirmed_groups},
                              {"windows_unconfirmed", p.windows},
                              {"groups_unconfirmed", p.groups},
                              {"windows_lost", run->unsendable.size()},
                              {"confirm", absl::GetFlag(FLAGS_confirm)},
                              {"learner_version", t.version},
                              {"learner_incarnation", run->incarnation},
                              {"check_only", absl::GetFlag(FLAGS_check_only)}}
                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
            << std::endl;
  if (t.bad_rows + t.refused_rows > 0 || !run->unsendable.empty()) return 1;
  return p.windows > 0 ? 3 : 0;
}

absl::StatusOr<int> Main() {
  Run run;
  run.input = absl::GetFlag(FLAGS_input);
  if (run.input.empty()) return absl::InvalidArgumentError("--input is required");
  ASYMPO_RETURN_IF_ERROR(CheckAddressFlag("learner", absl::GetFlag(FLAGS_learner)));
  const std::string confirm = absl::GetFlag(FLAGS_confirm);
  if (confirm != "recorded" && confirm != "trained") {
    return absl::InvalidArgumentError(
        absl::StrCat("--confirm=", confirm, ": expected recorded or trained"));
  }
  run.by_recorded = confirm == "recorded";
  std::unique_ptr<Tokenizer> tok;
  if (!absl::GetFlag(FLAGS_tokenizer).empty()) {
    ASYMPO_ASSIGN_OR_RETURN(tok, Tokenizer::FromFile(absl::GetFlag(FLAGS_tokenizer)));
  }
  ASYMPO_ASSIGN_OR_RETURN(std::vector<Row> rows, submit::ReadRows(run.input));
  run.lines = static_cast<int64_t>(rows.size());
  const std::string state =
      absl::GetFlag(FLAGS_state).empty() ? run.input + ".submitted" : absl::GetFlag(FLAGS_state);
  ASYMPO_RETURN_IF_ERROR(run.state.Open(absl::GetFlag(FLAGS_check_only) ? "none" : state));
  const std::string run_id =
      absl::GetFlag(FLAGS_run_id).empty() ? BaseName(run.input) : absl::GetFlag(FLAGS_run_id);
  // At most 40 + 1 + 32 + 1 + 12 + 1 + 32 = 119 bytes: within kMaxBatchIdBytes.
  run.id_prefix =
      absl::StrCat(absl::GetFlag(FLAGS_source).substr(0, 40), "/", run_id.substr(0, 32), "/",
                   run.state.run_nonce(), run.state.run_nonce().empty() ? "" : "/");
  ASYMPO_ASSIGN_OR_RETURN(auto stub, Connect());
  run.stub = stub.get();
  ASYMPO_ASSIGN_OR_RETURN(const v1::LearnerStatus st,
                          ReadStatus(stub.get(), absl::GetFlag(FLAGS_timeout)));
  const BatchLimits limits = LimitsOf(st);
  ParseAll(&run, tok.get(), limits, &rows);
  if (absl::GetFlag(FLAGS_check_only)) return Summarize(&run);
  for (const Row& r : rows) {
    if (r.error.empty() && run.state.Trained(r.key)) ++run.tally.skipped_confirmed;
  }
  run.incarnation = st.incarnation();
  Confirm(&run, st);
  ASYMPO_RETURN_IF_ERROR(SendUnconfirmed(&run));
  const auto per_window = static_cast<size_t>(
      std::min(absl::GetFlag(FLAGS_groups_per_batch), limits.max_groups_per_batch));
  ASYMPO_RETURN_IF_ERROR(SendNew(&run, rows, per_window));
  ASYMPO_RETURN_IF_ERROR(AwaitConfirmation(&run));
  return Summarize(&run);
}

}  // namespace
}  // namespace asympo

int main(int argc, char** argv) {
  asympo::SetProgramUsage(
      "asympo-submit: sends a JSONL file of scored prompt groups to an asympo-learner, "
      "exactly once, and confirms they were trained.\n"
      "  asympo-submit --learner=HOST:PORT --input=groups.jsonl [--tokenizer=tokenizer.json]\n"
      "Exit status: 0 all rows confirmed trained, 1 a row bad or refused, 2 usage or connection "
      "error, 3 rows accepted but not all confirmed yet (run again later).",
      "rollout_server/submit/submit_main.cc");
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
