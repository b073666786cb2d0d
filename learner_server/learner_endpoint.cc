#include "learner_server/learner_endpoint.h"

#include <functional>

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/grpc_status.h"
#include "common/listener/host_port.h"
#include "common/security/call_gate.h"
#include "common/security/tls.h"
#include "common/status_macros.h"
#include "learner_server/learner_metrics.h"

namespace asympo::learner {

namespace {

// The counter of what the listener did with a connection.
prometheus::Counter& CounterOf(const ConnectionCounters& c, GrpcListenerEvent e) {
  switch (e) {
    case GrpcListenerEvent::kAccepted:
      return c.accepted;
    case GrpcListenerEvent::kRefusedAtLimit:
      return c.refused_at_limit;
    case GrpcListenerEvent::kRefusedWithoutDescriptors:
      return c.refused_no_descriptors;
    case GrpcListenerEvent::kRefusedAtPeerLimit:
      return c.refused_at_peer_limit;
    case GrpcListenerEvent::kClosedUnauthenticated:
      return c.closed_unauthenticated;
    case GrpcListenerEvent::kDescriptorExhaustion:
    case GrpcListenerEvent::kOtherAcceptError:
      break;
  }
  return c.accept_errors;
}

}  // namespace

absl::StatusOr<LearnerSecurity> SetUpLearnerSecurity(LearnerDaemonOptions* o,
                                                     prometheus::Registry& registry) {
  LearnerSecurity s;
  // asympo_tls_*: renewed files refused or taken.
  ASYMPO_ASSIGN_OR_RETURN(s.credentials, security::MakeServerCredentials(o->tls, registry));
  o->auth.client_ca_file = o->tls.client_ca_file;
  ASYMPO_ASSIGN_OR_RETURN(s.authorizer, security::Authorizer::Create(
                                            o->auth, RegisterRefusalCounters(registry), registry));
  // A malformed address is named as such, not refused as beyond loopback.
  ASYMPO_RETURN_IF_ERROR(SplitHostPort(o->listen_address, "--listen").status());
  ASYMPO_RETURN_IF_ERROR(security::CheckListenPolicy(o->listen_address, !o->tls.cert_file.empty(),
                                                     s.authorizer->authenticates(), o->insecure));
  o->broadcast.authorizer = s.authorizer.get();
  // Callers are authenticated on their headers, before gRPC reads a message.
  s.credentials = security::GateCallsOnMetadata(s.credentials, !o->tls.cert_file.empty(),
                                                o->listen_address, s.authorizer.get());
  if (!IsLoopbackAddress(o->listen_address) &&
      (o->tls.cert_file.empty() || !s.authorizer->authenticates())) {
    LOG(WARNING) << "--insecure: listening on " << o->listen_address
                 << (o->tls.cert_file.empty() ? " in plaintext" : "")
                 << (s.authorizer->authenticates() ? "" : " without client authentication")
                 << "; anyone who reaches the port can submit batches and read the weights";
  }
  return s;
}

absl::StatusOr<std::unique_ptr<LearnerEndpoint>> LearnerEndpoint::Start(
    const LearnerDaemonOptions& o, const LearnerSecurity& security,
    std::unique_ptr<LearnerService> service, broadcast::BroadcastSender* sender,
    prometheus::Registry& registry, grpc::Service* weight_group) {
  std::unique_ptr<LearnerEndpoint> e(new LearnerEndpoint());
  e->service_ = std::move(service);
  grpc::ServerBuilder builder;
  // Our own listener: gRPC's stops accepting for good after one EMFILE
  // (common/listener/grpc_listener.h).
  GrpcListenerOptions lo;
  lo.max_connections = o.max_connections;
  lo.max_connections_per_peer = o.max_connections_per_peer;
  lo.unauthenticated_grace = o.connection_auth_grace;
  const ConnectionCounters connections = RegisterConnectionCounters(registry);
  lo.on_event = [connections](GrpcListenerEvent e) { CounterOf(connections, e).Increment(); };
  absl::StatusOr<std::unique_ptr<GrpcListener>> listener =
      GrpcListener::Bind(o.listen_address, security.credentials, &builder, std::move(lo));
  const auto cannot_listen = [&](absl::string_view why) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", o.listen_address,
                     " (the port is in use, by another learner perhaps, or the address is not "
                     "one of this host's): ",
                     why));
  };
  if (absl::IsInvalidArgument(listener.status())) return listener.status();  // names the rule
  if (!listener.ok()) {
    return cannot_listen(absl::StripPrefix(
        listener.status().message(), absl::StrCat("cannot listen on ", o.listen_address, ": ")));
  }
  e->listener_ = *std::move(listener);
  security.authorizer->SetOnAuthorized(e->listener_->authorized_hook());
  connections.max_connections.Set(e->listener_->max_connections());
  builder.RegisterService(e->service_.get());
  builder.RegisterService(sender);
  if (weight_group != nullptr) builder.RegisterService(weight_group);
  builder.SetMaxReceiveMessageSize(static_cast<int>(e->service_->options().max_message_bytes));
  // Rollouts' weight receivers send keepalive pings every 20 s on their
  // announcement streams; allow them (and idle ones) without a GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  e->server_ = builder.BuildAndStart();
  if (e->server_ == nullptr) return cannot_listen("the gRPC server did not start");
  e->listener_->Start();
  return e;
}

LearnerEndpoint::~LearnerEndpoint() {
  listener_.reset();  // before the server: gRPC would leak what it is handed after
  if (server_) server_->Shutdown(GrpcDeadline(absl::Seconds(2)));
}

void LearnerEndpoint::Stop(absl::Duration deadline) { server_->Shutdown(GrpcDeadline(deadline)); }

}  // namespace asympo::learner
