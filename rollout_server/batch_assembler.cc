#include "rollout_server/batch_assembler.h"

#include <algorithm>
#include <utility>

namespace asympo::rollout {

BatchAssembler::BatchAssembler(BatchAssemblerOptions options) : options_(std::move(options)) {
  options_.max_groups = std::max(1, options_.max_groups);
  pending_.set_source(options_.source);
}

std::optional<v1::RolloutBatch> BatchAssembler::Add(v1::PromptGroup group) {
  // A repeated message field costs its size plus a tag and a length prefix.
  const size_t bytes = group.ByteSizeLong() + 6;
  std::optional<v1::RolloutBatch> closed;
  if (pending_.groups_size() > 0 && pending_bytes_ + bytes > options_.max_bytes) {
    closed = Flush();
  }
  *pending_.add_groups() = std::move(group);
  pending_bytes_ += bytes;
  if (!closed.has_value() &&
      (pending_.groups_size() >= options_.max_groups || pending_bytes_ >= options_.max_bytes)) {
    closed = Flush();
  }
  return closed;
}

std::optional<v1::RolloutBatch> BatchAssembler::Flush() {
  if (pending_.groups_size() == 0) return std::nullopt;
  v1::RolloutBatch out = std::move(pending_);
  pending_ = v1::RolloutBatch();
  pending_.set_source(options_.source);
  pending_bytes_ = 0;
  return out;
}

}  // namespace asympo::rollout
