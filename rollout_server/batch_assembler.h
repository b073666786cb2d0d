// Groups scored prompt groups into RolloutBatch messages for submission.
//
// A generator produces one PromptGroup at a time; sending each alone wastes
// round trips, while waiting too long makes the data stale. The assembler
// closes a batch when it holds max_groups groups or max_bytes of serialized
// data, whichever comes first. Not thread-safe: one per submitting thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "asympo/v1/rollout.pb.h"

namespace asympo::rollout {

struct BatchAssemblerOptions {
  // Source label stamped on every batch (RolloutBatch.source).
  std::string source;
  // Close a batch at this many groups (at least 1).
  int max_groups = 16;
  // ...or when its serialized size reaches this many bytes. A single group
  // larger than this still forms a batch of its own.
  size_t max_bytes = 4 << 20;
};

class BatchAssembler {
 public:
  explicit BatchAssembler(BatchAssemblerOptions options);

  // Adds a group. Returns the batch it closed, if adding it filled one: the
  // returned batch never exceeds the limits, except a lone oversize group.
  std::optional<v1::RolloutBatch> Add(v1::PromptGroup group);

  // Returns the open batch if it has any group (for example on a timer or at
  // shutdown), leaving the assembler empty.
  std::optional<v1::RolloutBatch> Flush();

  int pending_groups() const { return pending_.groups_size(); }
  size_t pending_bytes() const { return pending_bytes_; }

 private:
  BatchAssemblerOptions options_;
  v1::RolloutBatch pending_;
  size_t pending_bytes_ = 0;
};

}  // namespace asympo::rollout
