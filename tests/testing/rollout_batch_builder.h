// Test helper: builds the RolloutBatch a test submits, so that each test
// says only what differs from the plain batch (its group count, responses
// per group, ids, tokens, rewards) instead of writing the loops again.
//
//   v1::RolloutBatch b = RolloutBatchBuilder(2, 3).Source("test").Build();
//   // 2 groups "p0", "p1", prompt {1, 2}; response r holds {3 + r},
//   // reward r.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "asympo/v1/rollout.pb.h"

namespace asympo::testing {

class RolloutBatchBuilder {
 public:
  RolloutBatchBuilder(int groups, int responses_per_group)
      : groups_(groups), responses_(responses_per_group) {}

  RolloutBatchBuilder& Source(std::string source) {
    source_ = std::move(source);
    return *this;
  }
  RolloutBatchBuilder& BatchId(std::string batch_id) {
    batch_id_ = std::move(batch_id);
    return *this;
  }
  // Group g's prompt id (default "p<g>").
  RolloutBatchBuilder& PromptIds(std::function<std::string(int g)> f) {
    prompt_id_ = std::move(f);
    return *this;
  }
  // Group g's prompt tokens (default {1, 2}).
  RolloutBatchBuilder& PromptTokens(std::function<std::vector<int32_t>(int g)> f) {
    prompt_tokens_ = std::move(f);
    return *this;
  }
  // Response r of group g's tokens (default {3 + r}).
  RolloutBatchBuilder& ResponseTokens(std::function<std::vector<int32_t>(int g, int r)> f) {
    response_tokens_ = std::move(f);
    return *this;
  }
  // Response r of group g's reward (default r).
  RolloutBatchBuilder& Rewards(std::function<float(int g, int r)> f) {
    reward_ = std::move(f);
    return *this;
  }

  v1::RolloutBatch Build() const {
    v1::RolloutBatch b;
    if (!source_.empty()) b.set_source(source_);
    if (!batch_id_.empty()) b.set_batch_id(batch_id_);
    for (int g = 0; g < groups_; ++g) {
      v1::PromptGroup* group = b.add_groups();
      group->set_prompt_id(prompt_id_(g));
      for (int32_t t : prompt_tokens_(g)) group->add_prompt_tokens(t);
      for (int r = 0; r < responses_; ++r) {
        v1::Response* response = group->add_responses();
        for (int32_t t : response_tokens_(g, r)) response->add_tokens(t);
        response->set_reward(reward_(g, r));
      }
    }
    return b;
  }

 private:
  int groups_;
  int responses_;
  std::string source_;
  std::string batch_id_;
  std::function<std::string(int)> prompt_id_ = [](int g) { return "p" + std::to_string(g); };
  std::function<std::vector<int32_t>(int)> prompt_tokens_ = [](int) {
    return std::vector<int32_t>{1, 2};
  };
  std::function<std::vector<int32_t>(int, int)> response_tokens_ = [](int, int r) {
    return std::vector<int32_t>{3 + r};
  };
  std::function<float(int, int)> reward_ = [](int, int r) { return static_cast<float>(r); };
};

}  // namespace asympo::testing
