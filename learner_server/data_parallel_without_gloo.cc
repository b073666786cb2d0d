// DataParallel in a build without Gloo's headers (a CUDA LibTorch whose
// wheel ships none; CMake says so): a world of more than one rank is refused
// at start with this message, and a single process trains as ever.
#include <torch/csrc/distributed/c10d/Store.hpp>
#include "learner_server/data_parallel.h"

namespace asympo::learner {
namespace {

absl::Status Unavailable() {
  return absl::FailedPreconditionError(
      "this asympo-learner was built without Gloo's headers (gloo/algorithm.h was not found "
      "beside its LibTorch), so it cannot run more than one rank; see docs/operations.md, "
      "\"Several learner ranks\"");
}

}  // namespace

struct DataParallel::Group {};

DataParallel::DataParallel(const DataParallelOptions& options) : options_(options) {}
DataParallel::~DataParallel() = default;

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(const DataParallelOptions&) {
  return Unavailable();
}
absl::Status DataParallel::SendHeader(StepMessage::Kind, const StepTotals&,
                                      const std::vector<int64_t>&) {
  return Unavailable();
}
absl::Status DataParallel::SendIdle() { return Unavailable(); }
absl::Status DataParallel::SendStop() { return Unavailable(); }
absl::Status DataParallel::SendGather() { return Unavailable(); }
absl::StatusOr<StepMessage> DataParallel::SendStep(const std::vector<QueuedGroup>&) {
  return Unavailable();
}
absl::StatusOr<StepMessage> DataParallel::Receive() { return Unavailable(); }
absl::Status DataParallel::BroadcastState(PolicyModel*, AdamW*, uint64_t*, bool) {
  return Unavailable();
}
absl::Status DataParallel::SumValues(std::vector<double>*) { return Unavailable(); }
absl::Status DataParallel::SumGradients(const std::vector<at::Tensor>&) { return Unavailable(); }
absl::Status DataParallel::ReduceScatter(std::vector<at::Tensor>&, at::Tensor&) {
  return Unavailable();
}
absl::Status DataParallel::AllGather(at::Tensor&, std::vector<at::Tensor>&) {
  return Unavailable();
}
absl::Status DataParallel::GatherToRank0(at::Tensor&, std::vector<at::Tensor>&) {
  return Unavailable();
}
absl::Status DataParallel::ScatterFromRank0(std::vector<at::Tensor>&, at::Tensor&) {
  return Unavailable();
}

}  // namespace asympo::learner
