// asympo-submit's rows: one JSONL line each, parsed into the PromptGroup it
// sends and checked against the learner's limits (rollout_server/submit/submit_main.cc).
//
// Thread-compatible: pure functions over the rows they are given.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "asympo/v1/rollout.pb.h"
#include "common/batch_validation.h"
#include "common/tokenizer/tokenizer.h"

namespace asympo::submit {

struct Row {
  int line = 0;      // 1-based, for messages only: nothing is keyed by it
  std::string text;  // the line as read
  v1::PromptGroup group;
  std::string error;  // empty: good
  std::string key;    // RowKey (submit_state.h), set for good rows
};

// The non-blank lines of `path`; INVALID_ARGUMENT naming --input when it
// cannot be read.
absl::StatusOr<std::vector<Row>> ReadRows(const std::string& path);

// Parses row->text into row->group, or sets row->error to the rule it
// breaks (the learner's own message where it is a limit). `tok` may be null
// (rows of text are then bad). A row without "prompt_id" gets
// "row-<16 hex digits of its content's SHA-256>": its content, not its
// line, names it.
void ParseRow(const Tokenizer* tok, const BatchLimits& limits, Row* row);

}  // namespace asympo::submit
