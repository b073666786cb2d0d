#!/usr/bin/env bash
# Builds the CPU image (deploy/container/Containerfile.cpu) with podman and
# checks it: every program starts, and a learner and a rollout daemon in two
# containers train the tiny model for 20 steps.
#
#   deploy/container/build_cpu_image.sh [TAG]        # default asympo-rl:0.1.0
#
# Where no registry can be reached, the Debian 12 base image is made here:
# `debootstrap --variant=minbase bookworm` against the machine's Debian
# mirror, imported as localhost/debian:bookworm (BASE picks another base).
# The host's limits are passed to the containers (podman's defaults ask for
# more open files and processes than a constrained host allows), and on a
# host whose cgroup v2 hierarchy has controllers beside v1 ("hybrid", which
# crun refuses) the build and the containers run under runc.
#
# Environment: BASE (base image), BUILD_JOBS (compilers at once, 2),
# MIRROR (Debian mirror for debootstrap), KEEP_BASE_DIR (keep the rootfs).
# Exits 77 with the reason when podman cannot build or run containers here.
set -euo pipefail
case ${1:-} in
  -h | --help)
    echo "usage: deploy/container/build_cpu_image.sh [TAG]"
    echo
    sed -n '2,17s/^# \{0,1\}//p' "$0"
    exit 0 ;;
  -*) echo "build_cpu_image: unknown option \"$1\" (--help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."

tag=${1:-asympo-rl:0.1.0}
base=${BASE:-localhost/debian:bookworm}
log() { printf 'build_cpu_image: %s\n' "$*"; }
skip() { log "SKIP: $*"; exit 77; }
die() { log "error: $*" >&2; exit 1; }

command -v podman >/dev/null || skip "podman is not installed (apt-get install podman runc)"

# --- Base image -------------------------------------------------------------
if ! podman image exists "$base"; then
  [[ $base == localhost/debian:bookworm ]] ||
    die "base image $base is not here; pull it, or leave BASE unset to debootstrap one"
  command -v debootstrap >/dev/null || skip "no base image and no debootstrap to make one"
  mirror=${MIRROR:-$(sed -n 's/^URIs: *//p; s/^deb \(\[[^]]*\] \)\?\(http[^ ]*\) bookworm .*/\2/p' \
    /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n 1)}
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs=$(mktemp -d /tmp/asympo-rootfs.XXXXXX)
  log "debootstrap bookworm from $mirror into $rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 ||
    die "debootstrap failed; see $rootfs.log"
  tar -C "$rootfs" -c . | podman import --message "debootstrap bookworm minbase" - "$base" \
    >/dev/null || die "podman import of $rootfs failed"
  [[ -n ${KEEP_BASE_DIR:-} ]] || rm -rf "$rootfs" "$rootfs.log"
fi

# --- How containers can run on this host ------------------------------------
nofile=$(ulimit -Hn)
[[ $nofile == unlimited ]] && nofile=1048576
# Lowered from podman's default (which a constrained host refuses) to what
# the daemons need: a few dozen threads each.
nproc=${ASYMPO_CONTAINER_NPROC:-4096}
opts=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" --network host)
runtime=()
if ! out=$(podman run --rm "${opts[@]}" "$base" true 2>&1); then
  if grep -q "hybrid mode" <<<"$out" && command -v runc >/dev/null &&
    podman --runtime runc run --rm "${opts[@]}" "$base" true >/dev/null 2>&1; then
    runtime=(--runtime runc)
    log "crun refuses this host's cgroups (hybrid v1/v2); using runc"
  else
    skip "podman cannot run a container here: $out"
  fi
fi
pod() { podman "${runtime[@]}" "$@"; }

# --- Build --------------------------------------------------------------------
start=$(date +%s)
log "building $tag from $base (BUILD_JOBS=${BUILD_JOBS:-2})"
pod build "${opts[@]}" --build-arg "BASE=$base" --build-arg "BUILD_JOBS=${BUILD_JOBS:-2}" \
  -f deploy/container/Containerfile.cpu -t "$tag" . || die "podman build failed"
log "built $tag in $(($(date +%s) - start)) s; $(pod image inspect --format \
  '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}')"

# --- Smoke test ---------------------------------------------------------------
for p in asympo-learner asympo-rollout asympo-eval asympo-tokenize asympo-plan; do
  v=$(pod run --rm "${opts[@]}" "$tag" "$p" --version) || die "$p --version failed in the image"
  log "$v"
done
pod run --rm "${opts[@]}" "$tag" asympo-rollout --help | grep -q -- "--learner" ||
  die "asympo-rollout --help lists no --learner"
[[ $(pod run --rm "${opts[@]}" "$tag" id -u) == 10001 ]] || die "the image does not run as 10001"

port=$((20000 + RANDOM % 20000))
name=asympo-smoke-$$
cleanup() { pod rm -f "$name-learner" "$name-rollout" >/dev/null 2>&1 || true; }
trap cleanup EXIT
pod run -d --name "$name-learner" "${opts[@]}" "$tag" asympo-learner --model=tiny \
  --max_prompt_tokens=512 --max_response_tokens=512 \
  --listen="127.0.0.1:$port" --metrics_address= --prompts_per_step=2 --max_steps=20 \
  --lr=1e-4 --run_name=container-smoke >/dev/null || die "the learner container did not start"
pod run -d --name "$name-rollout" "${opts[@]}" "$tag" asympo-rollout --model=tiny \
  --learner="127.0.0.1:$port" --metrics_address= --task=copy --id=smoke \
  --run_name=container-smoke >/dev/null || die "the rollout container did not start"
status=$(timeout 300 podman "${runtime[@]}" wait "$name-learner") ||
  die "the learner did not finish 20 steps within 300 s"
pod logs "$name-learner" 2>&1 | tail -n 3
[[ $status == 0 ]] || die "the learner container exited with $status"
pod logs "$name-learner" 2>&1 | grep -q "stopped after 20 steps" ||
  die "the learner's log shows no 20th step"
log "PASS: $tag: the programs start; a learner and a rollout container trained 20 steps"
