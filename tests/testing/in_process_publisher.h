// A WeightPublisher for tests: keeps a copy of the latest published weights
// and counts the publishes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "learner_server/trainer/trainer.h"

namespace asympo::testing {

class InProcessPublisher : public learner::WeightPublisher {
 public:
  void Publish(uint64_t version, const PolicyModel& model) override {
    at::NoGradGuard no_grad;
    weights_.clear();
    for (const auto& [name, t] : model.named_parameters()) weights_.emplace_back(name, t.clone());
    version_ = version;
    ++publishes_;
  }
  uint64_t version() const { return version_; }
  int64_t publishes() const { return publishes_; }
  const std::vector<std::pair<std::string, at::Tensor>>& weights() const { return weights_; }

 private:
  uint64_t version_ = 0;
  int64_t publishes_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> weights_;
};

}  // namespace asympo::testing
