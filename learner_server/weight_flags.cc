// asympo-learner's flags of the weight broadcast and the weight group
// (learner_flags.h).
#include <algorithm>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/daemon/daemon_main.h"
#include "common/flag_ranges.h"
#include "common/listener/host_port.h"
#include "common/status_macros.h"
#include "learner_server/learner_flags.h"

ABSL_FLAG(int32_t, max_fetches_per_principal, 0,
          "Weight fetches one principal (one peer address without authentication) may have under "
          "way at once, of the 256 in all. 0: a quarter of them.");
ABSL_FLAG(int32_t, max_registrations_per_principal, 0,
          "Weight receivers one principal (one peer address without authentication) may hold "
          "registered at once, of the 4096 in all. 0: a quarter of them.");
// Weight broadcast.
ABSL_FLAG(int64_t, broadcast_every, 1,
          "Publish the weights to the rollout daemons every N versions (0: only at start).");
ABSL_FLAG(int64_t, broadcast_bucket_mb, 256, "Snapshot bucket size in MiB.");
ABSL_FLAG(std::string, snapshot_staging, "device",
          "Where each published version is staged: \"device\" (a copy in --dtype on the "
          "model's device, then one transfer to pinned host memory) or \"host\" (no device "
          "buffer: each tensor is converted and copied straight into pinned host memory, for a "
          "device with little memory to spare; not with the NCCL transport).");
ABSL_FLAG(bool, weight_deltas, true,
          "Delta versions (docs/protocol.md, \"Delta versions\"): each published version also "
          "holds what changed since the one published before, and a receiver holding that one "
          "fetches only the change (rebuilt and checked against the same CRCs). Costs the "
          "learner an encoding pass per version and up to half a snapshot of host memory, and a "
          "receiver one more snapshot of host memory.");
ABSL_FLAG(int64_t, delta_keyframe_every, 32,
          "With --weight_deltas: every Nth published version has no delta and goes whole to "
          "everyone.");
ABSL_FLAG(int64_t, broadcast_chunk_kb, 4032,
          "Chunk size of gRPC snapshot transfers when a receiver does not ask for one (the "
          "default leaves room for the message's header under gRPC's default 4 MiB receive "
          "limit, so that any default client can read it).");
ABSL_FLAG(int64_t, broadcast_nccl_world_size, 0,
          "NCCL weight transport: the learner plus this many minus one rollout daemons that "
          "ask for NCCL (--weight_transport=nccl) form one communicator, fixed at start. "
          "0: gRPC only. Needs libnccl, libcudart and a GPU; falls back to gRPC without them.");
ABSL_FLAG(absl::Duration, broadcast_nccl_timeout, absl::Seconds(60),
          "NCCL watchdog: the longest one NCCL wait may take before the communicator is "
          "aborted and every receiver falls back to gRPC.");
ABSL_FLAG(absl::Duration, broadcast_fetch_idle_timeout, absl::Minutes(1),
          "A snapshot fetch whose receiver takes no chunk for this long is cancelled.");
ABSL_FLAG(std::string, weight_group, "off",
          "A collective group for weight updates that external engine workers join "
          "(WeightGroup on the gRPC port, docs/protocol.md \"Weight group\"): gloo, nccl "
          "(the learner on a GPU) or off.");
ABSL_FLAG(std::string, weight_group_address, "127.0.0.1",
          "Where the learner's end of the weight group's collectives listens (Gloo: a host "
          "name or address of this machine). Their traffic is not encrypted: an address beyond "
          "loopback is the operator's explicit choice.");
ABSL_FLAG(absl::Duration, weight_group_timeout, absl::Seconds(60),
          "Weight group: timeout of the rendezvous and of each bucket's broadcast.");
ABSL_FLAG(absl::Duration, weight_group_ready_timeout, absl::Seconds(60),
          "Weight group: a member that does not ask for the next version within this of the "
          "first one that asked (or makes no call for this long) is left out of the next "
          "generation.");
ABSL_FLAG(absl::Duration, weight_group_join_window, absl::Seconds(2),
          "Weight group: how long a new generation gathers joining workers.");
// Fault injection, for tests and drills.
ABSL_FLAG(std::vector<std::string>, fault_corrupt_broadcast_versions, {},
          "Testing only: corrupt one byte of these versions' snapshots in transit "
          "(receivers must detect it and keep their weights).");
ABSL_FLAG(std::vector<std::string>, fault_corrupt_delta_versions, {},
          "Testing only: corrupt one byte of these versions' deltas in transit, over gRPC and "
          "the weight group (receivers must detect it and fetch the version whole).");
ABSL_FLAG(absl::Duration, fault_broadcast_chunk_delay, absl::ZeroDuration(),
          "Testing only: sleep this long before sending each snapshot chunk.");

// The documented ranges (--help shows them; a value outside is refused at start).
ASYMPO_FLAG_RANGE(max_fetches_per_principal, 0, 256);
ASYMPO_FLAG_RANGE(max_registrations_per_principal, 0, 4096);
ASYMPO_FLAG_RANGE(broadcast_every, 1, 1e9);
ASYMPO_FLAG_RANGE(broadcast_bucket_mb, 1, 4096);
ASYMPO_FLAG_RANGE(broadcast_chunk_kb, 1, 1 << 20);
ASYMPO_FLAG_RANGE(delta_keyframe_every, 1, 1e6);
ASYMPO_FLAG_RANGE(broadcast_nccl_world_size, 0, 4096);
ASYMPO_DURATION_FLAG_RANGE(broadcast_nccl_timeout, absl::Milliseconds(1), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(broadcast_fetch_idle_timeout, absl::Milliseconds(1), absl::Hours(24));
ASYMPO_DURATION_FLAG_RANGE(weight_group_timeout, absl::Milliseconds(100), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(weight_group_ready_timeout, absl::Milliseconds(100), absl::Hours(1));
ASYMPO_DURATION_FLAG_RANGE(weight_group_join_window, absl::ZeroDuration(), absl::Minutes(10));
ASYMPO_DURATION_FLAG_RANGE(fault_broadcast_chunk_delay, absl::ZeroDuration(), absl::Hours(1));

namespace asympo::learner {

using daemon::ParseIntListFlag;

absl::Status BroadcastFlags(LearnerDaemonOptions* o) {
  o->broadcast_every = absl::GetFlag(FLAGS_broadcast_every);
  const std::string staging = absl::GetFlag(FLAGS_snapshot_staging);
  if (staging != "device" && staging != "host") {
    return absl::InvalidArgumentError(
        absl::StrCat("--snapshot_staging=", staging, ": expected device or host"));
  }
  o->snapshot_staging_host = staging == "host";
  broadcast::BroadcastSenderOptions& b = o->broadcast;
  const int64_t bucket_mb = absl::GetFlag(FLAGS_broadcast_bucket_mb);
  o->snapshots.packing.bucket_bytes = static_cast<uint64_t>(bucket_mb) << 20;
  const int64_t chunk_kb = absl::GetFlag(FLAGS_broadcast_chunk_kb);
  if (chunk_kb <= 0 || (chunk_kb << 10) > b.max_chunk_bytes_cap) {
    return absl::InvalidArgumentError(absl::StrCat("--broadcast_chunk_kb=", chunk_kb,
                                                   ": expected 1..", b.max_chunk_bytes_cap >> 10));
  }
  b.default_chunk_bytes = static_cast<uint32_t>(chunk_kb << 10);
  ASYMPO_RETURN_IF_ERROR(ParseIntListFlag(absl::GetFlag(FLAGS_fault_corrupt_broadcast_versions),
                                          "fault_corrupt_broadcast_versions", &b.corrupt_versions,
                                          uint64_t{0}));
  ASYMPO_RETURN_IF_ERROR(ParseIntListFlag(absl::GetFlag(FLAGS_fault_corrupt_delta_versions),
                                          "fault_corrupt_delta_versions", &b.corrupt_delta_versions,
                                          uint64_t{0}));
  b.chunk_delay = absl::GetFlag(FLAGS_fault_broadcast_chunk_delay);
  o->snapshots.delta_keyframe_every =
      absl::GetFlag(FLAGS_weight_deltas)
          ? static_cast<int>(std::clamp<int64_t>(absl::GetFlag(FLAGS_delta_keyframe_every), 1, 1e6))
          : 0;
  const int64_t nccl_world = absl::GetFlag(FLAGS_broadcast_nccl_world_size);
  if (nccl_world != 0 && (nccl_world < 2 || nccl_world > 4096)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--broadcast_nccl_world_size=", nccl_world,
                     ": expected 0 (gRPC only) or 2..4096 (the learner plus the NCCL receivers)"));
  }
  b.nccl_world_size = static_cast<int>(nccl_world);
  b.nccl.timeout = absl::GetFlag(FLAGS_broadcast_nccl_timeout);
  b.fetch_idle_timeout = absl::GetFlag(FLAGS_broadcast_fetch_idle_timeout);
  // Each principal's share of the fetches and registrations.
  b.max_fetches_per_principal = absl::GetFlag(FLAGS_max_fetches_per_principal);
  b.max_sessions_per_principal = absl::GetFlag(FLAGS_max_registrations_per_principal);
  // NCCL rank 0 is the learner's own GPU.
  if (o->model_options.device.is_cuda()) {
    b.nccl_device = std::max(0, int{o->model_options.device.index()});
  }
  const std::string group = absl::GetFlag(FLAGS_weight_group);
  if (group != "off" && group != "gloo" && group != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight_group=", group, ": expected off, gloo or nccl"));
  }
  if (group == "nccl" && !o->model_options.device.is_cuda()) {
    return absl::InvalidArgumentError(
        "--weight_group=nccl broadcasts from the learner's GPU: it needs --device=cuda");
  }
  o->weight_group_enabled = group != "off";
  broadcast::WeightGroupOptions& g = o->weight_group;
  g.backend = group;
  g.address = absl::GetFlag(FLAGS_weight_group_address);
  if (o->weight_group_enabled && g.address.empty()) {
    return absl::InvalidArgumentError("--weight_group_address is empty");
  }
  if (o->weight_group_enabled && g.backend == "gloo" && !IsLoopbackAddress(g.address)) {
    LOG(WARNING) << "--weight_group_address=" << g.address
                 << ": the weight group's collectives leave this host unencrypted; anyone who "
                    "reaches that address can read the weights";
  }
  g.timeout = absl::GetFlag(FLAGS_weight_group_timeout);
  g.ready_timeout = absl::GetFlag(FLAGS_weight_group_ready_timeout);
  g.join_window = absl::GetFlag(FLAGS_weight_group_join_window);
  g.corrupt_delta_versions = o->broadcast.corrupt_delta_versions;
  return absl::OkStatus();
}

}  // namespace asympo::learner
