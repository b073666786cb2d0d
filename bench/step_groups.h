// Steps of uniform groups for the memory benchmarks (memory_plan_bench,
// data_parallel_bench), and the memory plan they are checked against:
// every micro-batch holds micro_batch_tokens real tokens in sequences of
// `sequence` tokens, so that its rows are as long as the memory plan's
// (learner_server/plan/memory_plan.h).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "common/model/model_config.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/plan/memory_plan.h"

namespace asympo::bench {

// micro_batches x (micro_batch_tokens / sequence) sequences of `sequence`
// tokens (a quarter prompt), two responses a group, distinct rewards.
inline std::vector<learner::QueuedGroup> UniformStepGroups(int64_t micro_batches,
                                                           int64_t micro_batch_tokens,
                                                           int64_t sequence, int64_t vocab,
                                                           std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  const int64_t prompt = sequence / 4, response = sequence - prompt;
  const int64_t groups = micro_batches * (micro_batch_tokens / sequence) / 2;
  std::vector<learner::QueuedGroup> step;
  for (int64_t g = 0; g < groups; ++g) {
    learner::QueuedGroup q;
    for (int64_t t = 0; t < prompt; ++t) q.group.add_prompt_tokens(token(rng));
    for (int r = 0; r < 2; ++r) {
      auto* resp = q.group.add_responses();
      for (int64_t t = 0; t < response; ++t) resp->add_tokens(token(rng));
      resp->set_reward(static_cast<float>(r));
    }
    q.tokens = 2 * sequence;
    step.push_back(std::move(q));
  }
  return step;
}

// The memory plan of such steps as the benchmarks measure them: on the
// CPU in float32, without a publisher, checkpoints or workspace (neither
// exists there); the caller sets the world and sharding.
inline learner::PlanOptions CpuStepPlan(const ModelConfig& config, int64_t micro_batch_tokens,
                                        int64_t sequence, int64_t checkpoint_every,
                                        int64_t logprob_chunk_rows) {
  learner::PlanOptions o;
  o.model = config;
  o.device = learner::PlanDevice::kCpu;
  o.compute_dtype = learner::PlanDType::kFloat32;
  o.micro_batch_tokens = micro_batch_tokens;
  o.max_sequence_tokens = sequence;
  o.checkpoint_every = checkpoint_every;
  o.logprob_chunk_rows = logprob_chunk_rows;
  o.rank0 = false;
  o.checkpoints = false;
  o.workspace = false;
  return o;
}

}  // namespace asympo::bench
