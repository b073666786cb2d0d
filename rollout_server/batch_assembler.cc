#include "rollout_server/batch_assembler.h"

#include <algorithm>
#include <utility>

#include <google/protobuf/io/coded_stream.h>

namespace asympo::rollout {

BatchAssembler::BatchAssembler(BatchAssemblerOptions options) : options_(std::move(options)) {
  options_.max_groups = std::max(1, options_.max_groups);
  pending_.set_source(options_.source);
}

bool BatchAssembler::TryAdd(v1::PromptGroup* group) {
  // A repeated message field costs its size plus a one-byte tag and the
  // varint of its length.
  const size_t size = group->ByteSizeLong();
  const size_t bytes =
      size + 1 + google::protobuf::io::CodedOutputStream::VarintSize64(static_cast<uint64_t>(size));
  if (pending_.groups_size() > 0 && (pending_.groups_size() >= options_.max_groups ||
                                     pending_bytes_ + bytes > options_.max_bytes)) {
    return false;
  }
  *pending_.add_groups() = std::move(*group);
  pending_bytes_ += bytes;
  return true;
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
