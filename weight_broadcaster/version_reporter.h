// ReportVersion calls of a weight receiver, asynchronous and coalesced: at
// most one call is in flight, and of the reports made meanwhile only the
// newest is sent after it (the learner needs the receiver's current state,
// not its history). Reports made without a session are dropped: the
// version then travels with the next Register.
//
// Thread-safe. Stop() cancels the call in flight, drops what is waiting and
// waits until gRPC has called back, so the reporter may be destroyed after.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "asympo/v1/weight_broadcast.grpc.pb.h"

namespace asympo::broadcast {

class VersionReporter {
 public:
  // `stub` must outlive the reporter.
  explicit VersionReporter(v1::WeightBroadcast::Stub* stub,
                           absl::Duration timeout = absl::Seconds(10));
  ~VersionReporter();  // Stop()

  // The session reports go to (empty: none; reports are dropped).
  void SetSession(const std::string& session_id);
  // Reports that the receiver samples with `version`; a non-empty `error`
  // says why a newer version was not taken.
  // `incarnation`: the learner incarnation that made `version`.
  void Report(uint64_t version, std::string error, std::string incarnation = "");
  // Cancels and waits, as above. Later reports are dropped. Idempotent.
  void Stop();
  // Calls sent so far (for tests).
  int64_t sent() const;

 private:
  struct Call;
  void Start(v1::ReportVersionRequest request);
  void Done(Call* call, const grpc::Status& status);

  v1::WeightBroadcast::Stub* const stub_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::string session_id_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a call was started and has not called back
  std::optional<v1::ReportVersionRequest> next_ ABSL_GUARDED_BY(mu_);
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace asympo::broadcast
