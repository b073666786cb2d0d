#!/bin/sh
# Probes of an asympo-learner pod (POSIX sh and `date`, no other tool).
#
#   learner-probe.sh startup   every rank: the heartbeat file exists (the
#                              model is loaded, the ranks have met, the
#                              checkpoint is restored and the training loop
#                              has begun)
#   learner-probe.sh live      every rank: the heartbeat is at most
#                              ASYMPO_HEARTBEAT_MAX_AGE seconds old (600)
#   learner-probe.sh ready     rank 0: the gRPC port (50051) is listening;
#                              other ranks: the heartbeat file exists
#                              (the manifests probe rank 0's readiness
#                              with GET /ready on its metrics port
#                              instead: 503 while it makes no progress)
#   learner-probe.sh --help    this text
#
# The learner rewrites its --heartbeat_file (ASYMPO_HEARTBEAT_FILE, default
# /tmp/asympo-heartbeat) with "<unix seconds> <beats>" at most once a second
# while its training loop makes progress: after each step, while it waits
# idle for data, and (ranks other than 0) after each message from rank 0,
# which sends one at least every 200 ms while idle. A rank stuck in a step,
# a checkpoint or a collective stops rewriting it, and once it is older than
# ASYMPO_HEARTBEAT_MAX_AGE the liveness probe fails, on every rank that
# waits on the stuck one too (docs/cluster.md, "Probes").
# Only rank 0 serves gRPC and /metrics (docs/operations.md), so a
# tcpSocket or httpGet probe would fail on the other ranks forever. A port
# counts as listening when /proc/net/tcp or tcp6 (this pod's network
# namespace) has it in state 0A (LISTEN): what a tcpSocket probe checks.
set -eu
mode=${1:-}
# The container runtime sets HOSTNAME to the pod's name (asympo-learner-0,
# asympo-learner-worker-<i>); the rank is its ordinal plus
# ASYMPO_RANK_OFFSET (1 for the workers), as in the container's command.
# shellcheck disable=SC3028  # set in the environment, not by the shell
host=${HOSTNAME:-$(cat /proc/sys/kernel/hostname)}
rank=$((${host##*-} + ${ASYMPO_RANK_OFFSET:-0}))
beat_file=${ASYMPO_HEARTBEAT_FILE:-/tmp/asympo-heartbeat}
max_age=${ASYMPO_HEARTBEAT_MAX_AGE:-600}

usage() { sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//p;}' "$0"; }
fail() { echo "asympo-learner $host: $*" >&2; exit 1; }

# listening PORT: true when the port is in state LISTEN.
listening() {
  hex=$(printf '%04X' "$1")
  proc_net=${ASYMPO_PROC_NET:-/proc/net}
  for table in "$proc_net/tcp" "$proc_net/tcp6"; do
    [ -r "$table" ] || continue
    while read -r _ local _ state _; do
      case $local in
        *:"$hex") if [ "$state" = 0A ]; then return 0; fi ;;
      esac
    done < "$table"
  done
  return 1
}

beat_exists() {
  [ -f "$beat_file" ] || fail "no heartbeat $beat_file yet (still starting)"
}

beat_fresh() {
  beat_exists
  read -r beat_time beats < "$beat_file" || true
  case ${beat_time:-} in
    '' | *[!0-9]*) fail "heartbeat $beat_file holds no time" ;;
  esac
  age=$(($(date +%s) - beat_time))
  [ "$age" -le "$max_age" ] ||
    fail "the training loop last made progress ${age}s ago (beat ${beats:-?}), over" \
         "ASYMPO_HEARTBEAT_MAX_AGE=${max_age}s: a stalled step or collective"
}

case $mode in
  -h | --help) echo "usage: learner-probe.sh startup|live|ready"; echo; usage ;;
  startup) beat_exists ;;
  live) beat_fresh ;;
  ready)
    if [ "$rank" = 0 ]; then
      port=${ASYMPO_GRPC_PORT:-50051}
      listening "$port" || fail "nothing listens on port $port"
    else
      beat_exists
    fi ;;
  *) echo "usage: learner-probe.sh startup|live|ready|--help" >&2; exit 2 ;;
esac
