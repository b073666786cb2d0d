// What a WeightReceiver is given, checked, and the channel it talks to the
// learner's broadcaster on (broadcast_receiver.h).
#pragma once

#include <memory>

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "weight_broadcaster/broadcast_receiver.h"

namespace asympo::broadcast {

// INVALID_ARGUMENT naming the option (and the rollout's flag) that is wrong:
// an empty target, a receiver id out of 1 to 128 bytes, backoffs out of
// order, a fetch timeout that is not positive; or the TLS files' error.
absl::Status ValidateReceiverOptions(const WeightReceiverOptions& o);

// The receiver's channel: a subchannel of its own (not shared with other
// receivers in the process), reconnecting on the receiver's own backoff
// schedule, with keepalive pings. `o` passed ValidateReceiverOptions.
std::shared_ptr<grpc::Channel> ReceiverChannel(const WeightReceiverOptions& o,
                                               prometheus::Registry& tls_registry);

}  // namespace asympo::broadcast
