#include "weight_broadcaster/receiver_channel.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/security/tls.h"

namespace asympo::broadcast {
namespace {

constexpr size_t kMaxReceiverIdBytes = 128;

int Millis(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT_MAX));
}

}  // namespace

absl::Status ValidateReceiverOptions(const WeightReceiverOptions& options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError(
        "the learner's address (the rollout's --learner, WeightReceiverOptions.target) is empty");
  }
  if (options.receiver_id.empty() || options.receiver_id.size() > kMaxReceiverIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("receiver_id must be 1 to ", kMaxReceiverIdBytes,
                                                   " bytes, got ", options.receiver_id.size()));
  }
  if (options.min_backoff <= absl::ZeroDuration() || options.max_backoff < options.min_backoff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backoff must satisfy 0 < min <= max, got min ", absl::FormatDuration(options.min_backoff),
        " max ", absl::FormatDuration(options.max_backoff)));
  }
  if (options.fetch_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("fetch_timeout must be positive");
  }
  prometheus::Registry unexported;  // this channel is only a check
  if (absl::Status s =
          security::CreateClientChannel(options.target, options.tls, unexported).status();
      !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> ReceiverChannel(const WeightReceiverOptions& o,
                                               prometheus::Registry& tls_registry) {
  grpc::ChannelArguments args;
  const int64_t max_message =
      std::max<int64_t>(64 << 20, o.max_chunk_bytes) + (1 << 20);  // + manifest headroom
  args.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(max_message, INT_MAX)));
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Millis(o.min_backoff));
  // Also gRPC's minimum connect timeout: below a second, a handshake with a
  // learner that is busy starting up times out again and again.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, Millis(o.max_backoff));
  // A learner host that vanishes without closing the connection ends the
  // announcement stream within about 30 s (the learner permits pings every
  // 10 s, learner_daemon.cc).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Start checked that the channel can be made (its files and policy).
  return security::CreateClientChannel(o.target, o.tls, tls_registry, args).value();
}

}  // namespace asympo::broadcast
