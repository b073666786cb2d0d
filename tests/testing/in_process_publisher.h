// A WeightPublisher for tests: keeps a copy of the latest published weights
// (part by part, as the trainer makes them readable) and counts the
// publishes.
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
  absl::Status Publish(uint64_t version, const PolicyModel& model,
                       const learner::WeightParts& parts) override {
    at::NoGradGuard no_grad;
    const auto& named = model.named_parameters();
    std::vector<at::Tensor> copies(named.size());
    const absl::Status s = parts([&](const std::vector<size_t>& params) {
      for (const size_t i : params) copies[i] = named[i].second.clone();
      return absl::OkStatus();
    });
    weights_.clear();
    for (size_t i = 0; i < named.size(); ++i) weights_.emplace_back(named[i].first, copies[i]);
    version_ = version;
    ++publishes_;
    return s;
  }
  using learner::WeightPublisher::Publish;
  uint64_t version() const { return version_; }
  int64_t publishes() const { return publishes_; }
  const std::vector<std::pair<std::string, at::Tensor>>& weights() const { return weights_; }

 private:
  uint64_t version_ = 0;
  int64_t publishes_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> weights_;
};

}  // namespace asympo::testing
