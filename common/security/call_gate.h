// The call gate: where the learner authenticates its callers, a call is
// checked on its metadata (its bearer token, its connection's client
// certificate) before any of its message is read, and a refused call
// carries nothing further into the learner's memory.
//
// Why: the services authorize in their handlers, and gRPC reads a unary
// call's whole message (up to the 64 MiB receive limit) before it calls the
// handler; 48 anonymous 60 MB Submits held 1.2 GiB until each was refused.
// gRPC runs an AuthMetadataProcessor on every call of secure server
// credentials when the call's headers arrive, before the method is matched
// and any message is asked for; a refusal ends the call (RST_STREAM), and
// whatever the client still sends on that stream is dropped by the
// transport.
//
// Plaintext servers have no processor in gRPC (InsecureServerCredentials
// aborts on one). On a loopback address the gate serves plaintext through
// gRPC's local credentials (LOCAL_TCP) instead: the same bytes on the wire
// (no handshake; plaintext clients connect unchanged), connections only from
// this host's loopback, and a processor. Plaintext beyond loopback
// (--insecure with tokens) keeps the check in the handlers, after the
// message (logged at start).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "common/security/authorizer.h"

namespace asympo::security {

// The credentials to serve with: `credentials` (TLS when `tls`, else
// plaintext) with the gate installed where `authorizer` authenticates its
// callers; unchanged otherwise. `listen_address` decides the plaintext case
// (see above). `authorizer` must outlive the server.
std::shared_ptr<grpc::ServerCredentials> GateCallsOnMetadata(
    std::shared_ptr<grpc::ServerCredentials> credentials, bool tls,
    const std::string& listen_address, Authorizer* authorizer);

// The processor itself, for tests: refuses (UNAUTHENTICATED, counted by the
// authorizer) a call that carries no credentials the authorizer knows.
std::shared_ptr<grpc::AuthMetadataProcessor> MakeCallGate(Authorizer* authorizer);

}  // namespace asympo::security
