#include "common/security/call_gate.h"

#include <utility>

#include <glog/logging.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include "common/grpc_status.h"
#include "common/listener/host_port.h"

namespace asympo::security {
namespace {

class CallGate final : public grpc::AuthMetadataProcessor {
 public:
  explicit CallGate(Authorizer* authorizer) : authorizer_(authorizer) {}

  // A hash and a map lookup, or a certificate check the authorizer caches:
  // run inline on gRPC's thread rather than handed to a thread pool.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* /*consumed_auth_metadata*/,
                       OutputMetadata* /*response_metadata*/) override {
    // Nothing is consumed: the handler authorizes again, with the role.
    absl::string_view header;
    const absl::string_view* authorization = nullptr;
    auto it = auth_metadata.find("authorization");
    if (it != auth_metadata.end()) {
      header = absl::string_view(it->second.data(), it->second.size());
      authorization = &header;
    }
    absl::StatusOr<const Principal*> p = authorizer_->Authenticate(authorization, context);
    return p.ok() ? grpc::Status::OK : ToGrpcStatus(p.status());
  }

 private:
  Authorizer* const authorizer_;
};

}  // namespace

std::shared_ptr<grpc::AuthMetadataProcessor> MakeCallGate(Authorizer* authorizer) {
  return std::make_shared<CallGate>(authorizer);
}

std::shared_ptr<grpc::ServerCredentials> GateCallsOnMetadata(
    std::shared_ptr<grpc::ServerCredentials> credentials, bool tls,
    const std::string& listen_address, Authorizer* authorizer) {
  if (authorizer == nullptr || !authorizer->authenticates()) return credentials;
  if (!tls) {
    if (!IsLoopbackAddress(listen_address)) {
      LOG(WARNING) << "plaintext beyond loopback (--insecure): callers are authenticated after "
                      "their message was read, not before";
      return credentials;
    }
    credentials = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  }
  credentials->SetAuthMetadataProcessor(MakeCallGate(authorizer));
  return credentials;
}

}  // namespace asympo::security
