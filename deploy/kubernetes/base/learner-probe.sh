#!/bin/sh
# Liveness and readiness of an asympo-learner pod (POSIX sh, no other tool).
#
#   learner-probe.sh live    rank 0: the /metrics port (9464) is listening
#   learner-probe.sh ready   rank 0: the gRPC port (50051) is listening
#
# Every rank runs the same pod template, but only rank 0 serves gRPC and
# /metrics (docs/operations.md): a tcpSocket or httpGet probe would fail on
# the other ranks forever. They listen on no fixed port, so their probes
# pass while the container runs; a rank that dies or hangs makes rank 0
# stop within --dist_timeout, and the StatefulSet restarts it.
# A port counts as listening when /proc/net/tcp or tcp6 (this pod's network
# namespace) has it in state 0A (LISTEN): what a tcpSocket probe checks.
# Rank 0 serves /metrics from its start and gRPC once the model is loaded,
# the ranks have met and the checkpoint is restored.
set -eu
mode=${1:-}
# The container runtime sets HOSTNAME to the pod's name (asympo-learner-<i>).
# shellcheck disable=SC3028  # set in the environment, not by the shell
host=${HOSTNAME:-$(cat /proc/sys/kernel/hostname)}
rank=${host##*-}
case $mode in
  live) port=${ASYMPO_METRICS_PORT:-9464} ;;
  ready) port=${ASYMPO_GRPC_PORT:-50051} ;;
  *) echo "usage: learner-probe.sh live|ready" >&2; exit 2 ;;
esac
[ "$rank" = 0 ] || exit 0
hex=$(printf '%04X' "$port")
proc_net=${ASYMPO_PROC_NET:-/proc/net}
for table in "$proc_net/tcp" "$proc_net/tcp6"; do
  [ -r "$table" ] || continue
  while read -r _ local _ state _; do
    case $local in
      *:"$hex") if [ "$state" = 0A ]; then exit 0; fi ;;
    esac
  done < "$table"
done
echo "asympo-learner rank 0 ($host): nothing listens on port $port" >&2
exit 1
