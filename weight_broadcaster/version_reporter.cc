#include "weight_broadcaster/version_reporter.h"

#include <utility>

#include <glog/logging.h>

#include "common/grpc_status.h"

namespace asympo::broadcast {

struct VersionReporter::Call {
  grpc::ClientContext ctx;
  v1::ReportVersionRequest request;
  v1::ReportVersionResponse response;
};

VersionReporter::VersionReporter(v1::WeightBroadcast::Stub* stub, absl::Duration timeout)
    : stub_(stub), timeout_(timeout) {}

VersionReporter::~VersionReporter() { Stop(); }

void VersionReporter::SetSession(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  session_id_ = session_id;
}

void VersionReporter::Report(uint64_t version, std::string error, std::string incarnation) {
  v1::ReportVersionRequest request;
  request.set_version(version);
  request.set_error(std::move(error));
  request.set_incarnation(std::move(incarnation));
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || session_id_.empty()) return;
    request.set_session_id(session_id_);
    if (busy_) {  // only the newest report matters
      next_ = std::move(request);
      return;
    }
    busy_ = true;
  }
  Start(std::move(request));
}

void VersionReporter::Start(v1::ReportVersionRequest request) {
  auto* call = new Call;
  call->request = std::move(request);
  call->ctx.set_deadline(GrpcDeadline(timeout_));
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      busy_ = false;
      delete call;
      return;
    }
    in_flight_ = &call->ctx;
    ++sent_;
  }
  stub_->async()->ReportVersion(&call->ctx, &call->request, &call->response,
                                [this, call](grpc::Status s) { Done(call, s); });
}

void VersionReporter::Done(Call* call, const grpc::Status& status) {
  if (!status.ok()) VLOG(1) << "ReportVersion failed: " << status.error_message();
  std::optional<v1::ReportVersionRequest> next;
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = nullptr;
    if (!stopped_ && next_.has_value()) {
      next = std::move(next_);
    } else {
      busy_ = false;
    }
    next_.reset();
  }
  delete call;
  if (next.has_value()) Start(*std::move(next));
}

void VersionReporter::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  next_.reset();
  if (in_flight_ != nullptr) in_flight_->TryCancel();
  mu_.Await(absl::Condition(
      +[](bool* busy) { return !*busy; }, &busy_));
}

int64_t VersionReporter::sent() const {
  absl::MutexLock lock(&mu_);
  return sent_;
}

}  // namespace asympo::broadcast
