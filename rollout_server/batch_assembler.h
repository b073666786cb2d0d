// Groups scored prompt groups into RolloutBatch messages for submission.
//
// Sending each group alone wastes round trips; a batch too large for the
// learner's receive limit is refused. The assembler fills one batch up to
// max_groups groups or max_bytes of serialized data, whichever comes first.
// The submit client (submit_client.h) fills a batch from its buffer with
// TryAdd until a group no longer fits, then sends Flush(). Not thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "asympo/v1/rollout.pb.h"

namespace asympo::rollout {

struct BatchAssemblerOptions {
  // Source label stamped on every batch (RolloutBatch.source).
  std::string source;
  // The most groups in a batch (at least 1).
  int max_groups = 16;
  // The most serialized bytes in a batch. A single group larger than this
  // still forms a batch of its own.
  size_t max_bytes = 4 << 20;
};

class BatchAssembler {
 public:
  explicit BatchAssembler(BatchAssemblerOptions options);

  // Moves `*group` into the open batch if it fits (the batch holds fewer
  // than max_groups and stays within max_bytes, or is empty). Returns false
  // and leaves `*group` as it was when it does not fit: the batch is full.
  bool TryAdd(v1::PromptGroup* group);

  // Returns the open batch if it has any group, leaving the assembler empty.
  std::optional<v1::RolloutBatch> Flush();

  int pending_groups() const { return pending_.groups_size(); }
  // Serialized size of the open batch (its groups with their framing).
  size_t pending_bytes() const { return pending_bytes_; }

 private:
  BatchAssemblerOptions options_;
  v1::RolloutBatch pending_;
  size_t pending_bytes_ = 0;
};

}  // namespace asympo::rollout
