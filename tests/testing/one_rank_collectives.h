// Test helper: ShardCollectives of a world of one rank (every collective a
// copy), for the sharded optimizers' tests without processes.
// tests/integration/data_parallel_test.py runs real worlds of 2 and 3.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/status.h"
#include "learner_server/optim/sharded_adamw.h"

namespace asympo::testing {

class OneRankCollectives : public learner::ShardCollectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status ReduceScatter(std::vector<at::Tensor>& inputs, at::Tensor& output) override {
    ++calls;
    output.copy_(inputs[0]);
    return absl::OkStatus();
  }
  absl::Status AllGather(at::Tensor& input, std::vector<at::Tensor>& outputs) override {
    outputs[0].copy_(input);
    return absl::OkStatus();
  }
  absl::Status GatherToRank0(at::Tensor& input, std::vector<at::Tensor>& outputs) override {
    ++gathers;
    outputs[0].copy_(input);
    return absl::OkStatus();
  }
  absl::Status ScatterFromRank0(std::vector<at::Tensor>& inputs, at::Tensor& output) override {
    output.copy_(inputs[0]);
    return absl::OkStatus();
  }
  absl::Status SumValues(std::vector<double>*) override { return absl::OkStatus(); }
  int calls = 0;    // reduce-scatters
  int gathers = 0;  // gathers to rank 0 (a fully sharded rank 0 reading whole units)
};

}  // namespace asympo::testing
