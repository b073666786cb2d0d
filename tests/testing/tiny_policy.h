// Test helper: a small random policy (ModelConfig::Tiny) for the tests that
// need a model but not a particular one. Deterministic for a seed.
//
//   auto model = TinyPolicy(/*vocab=*/64, /*seed=*/11, /*init_std=*/0.3);
#pragma once

#include <cstdint>
#include <memory>

#include "common/model/model_config.h"
#include "common/model/policy_model.h"

namespace asympo::testing {

// A Tiny(vocab) model initialized with `seed` and `init_std` (ModelOptions'
// default when not given), on the CPU in float32. Crashes the test when it
// cannot be built (a tiny CPU model always can).
inline std::unique_ptr<PolicyModel> TinyPolicy(int64_t vocab, uint64_t seed = 0,
                                               double init_std = ModelOptions().init_std) {
  ModelOptions o;
  o.seed = seed;
  o.init_std = init_std;
  return PolicyModel::CreateRandom(ModelConfig::Tiny(vocab), o).value();
}

}  // namespace asympo::testing
