// Rank 0's port: who may call it and how (SetUpLearnerSecurity), and the
// gRPC server that serves the Learner and WeightBroadcast services on it
// through the learner's own listener (LearnerEndpoint).
#pragma once

#include <memory>

#include <prometheus/registry.h>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/listener/grpc_listener.h"
#include "common/security/authorizer.h"
#include "learner_server/admission/learner_service.h"
#include "learner_server/learner_options.h"
#include "weight_broadcaster/broadcast_sender.h"

namespace asympo::learner {

struct LearnerSecurity {
  std::unique_ptr<security::Authorizer> authorizer;
  std::shared_ptr<grpc::ServerCredentials> credentials;
};

// Builds the credentials (TLS files renewed or refused count in
// `registry`) and the authorizer from o->tls and o->auth, refuses a listen
// address the policy forbids (docs/security.md) and gates calls on their
// headers. Sets o->auth.client_ca_file and o->broadcast.authorizer, which
// then points into the result: it must outlive the sender.
absl::StatusOr<LearnerSecurity> SetUpLearnerSecurity(LearnerDaemonOptions* o,
                                                     prometheus::Registry& registry);

class LearnerEndpoint {
 public:
  // Serves `service`, `sender` and `weight_group` (when given) on o.listen_address with
  // `security`'s credentials, through a GrpcListener held to o's connection limits (counted in
  // asympo_learner_connections_total). `security`, `sender` and the service's queue, counters and
  // observer must outlive the endpoint. UNAVAILABLE when the address cannot be listened on (naming
  // it); INVALID_ARGUMENT naming a rule it breaks.
  static absl::StatusOr<std::unique_ptr<LearnerEndpoint>> Start(
      const LearnerDaemonOptions& o, const LearnerSecurity& security,
      std::unique_ptr<LearnerService> service, broadcast::BroadcastSender* sender,
      prometheus::Registry& registry, grpc::Service* weight_group = nullptr);
  // Closes the listener, then stops the server (2 s for calls in flight).
  ~LearnerEndpoint();

  // Stops the server: calls in flight get `deadline` to finish.
  void Stop(absl::Duration deadline);
  int port() const { return listener_->port(); }

 private:
  LearnerEndpoint() = default;

  std::unique_ptr<LearnerService> service_;
  std::unique_ptr<grpc::Server> server_;
  // Hands its connections to server_; destroyed first (~LearnerEndpoint).
  std::unique_ptr<GrpcListener> listener_;
};

}  // namespace asympo::learner
