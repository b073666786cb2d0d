#!/usr/bin/env bash
# The Kubernetes manifests in deploy/kubernetes, checked offline: renders the
# base, every overlay and monitoring/ with `kubectl kustomize`, validates
# every object against the Kubernetes API (and the Prometheus operator's
# CRDs) with kubernetes_validate.cjs, proves that the validator rejects
# broken objects, checks the project's own rules (flags the daemons know,
# ranks and WORLD_SIZE, Services, GPUs, security settings), that
# monitoring/prometheus-rule.yaml is deploy/prometheus/alerts.yml
# (sync_rules.py --check), and the learner's probe script.
#
#   kubernetes_test.sh SOURCE_DIR [BUILD_DIR]
#
# With BUILD_DIR the flags are checked against the daemons' --help
# ($BUILD_DIR/learner_server/asympo-learner, .../rollout_server/asympo-rollout);
# without it, against the ABSL_FLAG definitions in the source.
# The validator (npm packages kubernetes-models, @kubernetes-models/
# prometheus-operator, typescript, yaml; pinned below) is installed once into
# ${ASYMPO_NPM_CACHE:-~/.cache/asympo-k8s}, outside the source tree.
# KUBECTL picks the kubectl binary (default: kubectl on PATH).
# Exits 77 (skipped) without kubectl, node or npm, or when the validator is
# not installed yet and the npm registry cannot be reached.
set -euo pipefail

skip() { echo "SKIP: kubernetes_test: $*"; exit 77; }
die() { echo "FAIL: kubernetes_test: $*" >&2; exit 1; }

(($# >= 1 && $# <= 2)) || die "usage: kubernetes_test.sh SOURCE_DIR [BUILD_DIR]"
src=$(cd "$1" && pwd) || die "no source directory $1"
build=${2:-}
k8s=$src/deploy/kubernetes
here=$src/tests/integration
[[ -d $k8s/base ]] || die "$k8s/base does not exist"

# --- tools ---------------------------------------------------------------
kubectl=${KUBECTL:-$(command -v kubectl || true)}
[[ -n $kubectl && -x $kubectl ]] ||
  skip "kubectl not found (Debian: apt-get install kubernetes-client)"
timeout 60 "$kubectl" kustomize --help >/dev/null 2>&1 ||
  skip "$kubectl has no 'kustomize' command (kubectl 1.14 or newer needed)"
command -v node >/dev/null || skip "node not found (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null || skip "npm not found (Debian: apt-get install npm)"
node_version=$(node -e 'process.stdout.write(process.versions.node)' 2>/dev/null) ||
  skip "node does not run"
IFS=. read -r node_major node_minor _ <<<"$node_version"
((node_major > 14 || (node_major == 14 && node_minor >= 17))) ||
  skip "node $node_version is older than 14.17 (typescript 5.9 needs it)"
command -v python3 >/dev/null || die "python3 not found (deploy/kubernetes/sync_rules.py)"

# --- the validator, cached outside the tree ------------------------------
packages=(kubernetes-models@4.5.1 @kubernetes-models/prometheus-operator@4.4.4
          typescript@5.9.3 yaml@2.8.1)
prefix=${ASYMPO_NPM_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/asympo-k8s}
mkdir -p "$prefix" || die "cannot create the npm cache $prefix"
stamp=$prefix/.asympo-packages
install_validator() {
  if [[ -f $stamp && $(cat "$stamp") == "${packages[*]}" ]]; then return 0; fi
  echo "kubernetes_test: installing ${packages[*]} into $prefix"
  if ! timeout 60 npm view --silent --fetch-retries=0 "${packages[0]}" version >/dev/null 2>&1; then
    skip "the npm registry cannot be reached to install ${packages[*]}"
  fi
  rm -f "$stamp"
  timeout 300 npm install --prefix "$prefix" --no-audit --no-fund --ignore-scripts \
    --save-exact --loglevel=error "${packages[@]}" ||
    die "npm install --prefix $prefix ${packages[*]} failed (exit $?)"
  echo "${packages[*]}" >"$stamp"
}
if command -v flock >/dev/null; then
  exec 9>"$prefix/.lock"
  timeout 600 flock 9 || die "timed out waiting for the lock on $prefix"
fi
install_validator

tmp=$(mktemp -d "${TMPDIR:-/tmp}/asympo-k8s.XXXXXX")
work=$(mktemp -d "$prefix/check.XXXXXX")
trap 'rm -rf "$tmp" "$work"' EXIT

# --- render --------------------------------------------------------------
start=$SECONDS
renders=()
dirs=(base)
for d in "$k8s"/overlays/*/; do dirs+=("overlays/$(basename "$d")"); done
dirs+=(monitoring)
for d in "${dirs[@]}"; do
  out=$tmp/$(tr / _ <<<"$d").yaml
  if ! timeout 60 "$kubectl" kustomize "$k8s/$d" >"$out" 2>"$out.err"; then
    cat "$out.err" >&2
    die "kubectl kustomize deploy/kubernetes/$d failed"
  fi
  # kustomize 5 warns that bases/patchesStrategicMerge are deprecated; they
  # are there for kustomize 2.0.3. Any other message is shown.
  grep -v -e "^# Warning: 'bases' is deprecated" \
          -e "^# Warning: 'patchesStrategicMerge' is deprecated" "$out.err" >&2 || true
  [[ -s $out ]] || die "kubectl kustomize deploy/kubernetes/$d rendered nothing"
  echo "rendered deploy/kubernetes/$d: $(grep -c '^kind:' "$out") objects"
  renders+=("$d=$out")
done
[[ ${#dirs[@]} -ge 5 ]] || die "expected at least the overlays cpu-tiny, gpu and tls"

# --- the flags each daemon knows -----------------------------------------
help_flags() {  # BINARY: the flags its --help lists
  [[ -x $1 ]] || die "$1 is missing: build it or leave BUILD_DIR out"
  local help
  help=$(timeout 60 "$1" --help) || die "$1 --help failed"
  sed -n 's/^  --\([a-z0-9_]*\) (default: .*/\1/p' <<<"$help"
  echo flagfile
}
source_flags() {  # FILES: the ABSL_FLAG names they define, test-only ones left out
  cat "$@" | tr '\n' ' ' | grep -o 'ABSL_FLAG( *[^,]*, *[a-z0-9_]*' |
    sed 's/.*, *//' | grep -v '^fault_'
  echo flagfile
}
if [[ -n $build ]]; then
  help_flags "$build/learner_server/asympo-learner" >"$tmp/learner.flags"
  help_flags "$build/rollout_server/asympo-rollout" >"$tmp/rollout.flags"
  flag_source="--help of $build"
else
  source_flags "$src"/learner_server/*.cc >"$tmp/learner.flags"
  source_flags "$src/rollout_server/main.cc" >"$tmp/rollout.flags"
  flag_source="ABSL_FLAG definitions"
fi
for d in learner rollout; do
  n=$(grep -c . "$tmp/$d.flags" || true)
  ((n > 20)) || die "found only $n asympo-$d flags in the $flag_source"
  echo "asympo-$d: $n flags from the $flag_source"
done

# --- validate ------------------------------------------------------------
passed=0
failed=0
set +e
timeout 300 node "$here/kubernetes_validate.cjs" --prefix "$prefix" --work "$work" \
  --alerts "$src/deploy/prometheus/alerts.yml" \
  --learner-flags "$tmp/learner.flags" --rollout-flags "$tmp/rollout.flags" \
  "${renders[@]}" >"$tmp/validate.out" 2>&1
rc=$?
set -e
grep -v '^RESULT ' "$tmp/validate.out" || true
result=$(grep '^RESULT ' "$tmp/validate.out" || true)
if [[ $result =~ passed=([0-9]+)\ failed=([0-9]+) ]]; then
  passed=${BASH_REMATCH[1]} failed=${BASH_REMATCH[2]}
fi
if [[ -z $result || ($rc -ne 0 && $failed -eq 0) ]]; then
  die "kubernetes_validate.cjs stopped (exit $rc) before it finished"
fi

# --- with a build: the pods run here, as a kubelet would start them ------
if [[ -n $build ]]; then
  pod_renders=()
  for r in "${renders[@]}"; do [[ $r == monitoring=* ]] || pod_renders+=("$r"); done
  set +e
  # The Secrets of overlays/tls hold placeholders: real ones, as an operator
  # would fill them in (the certificate names 127.0.0.1, where the rollout
  # dials the learner here).
  secrets=$tmp/secrets
  mkdir -p "$secrets/asympo-learner-tls" "$secrets/asympo-rollout-credentials"
  "$here/../testing/make_certs.sh" "$tmp/certs" >/dev/null || die "make_certs.sh failed"
  cp "$tmp/certs/server.pem" "$secrets/asympo-learner-tls/tls.crt"
  cp "$tmp/certs/server.key" "$secrets/asympo-learner-tls/tls.key"
  cp "$tmp/certs/ca.pem" "$secrets/asympo-rollout-credentials/ca.crt"
  token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  echo "$token" >"$secrets/asympo-rollout-credentials/token"
  printf '{"principals": [{"name": "rollouts", "token_sha256": "%s", %s}]}\n' \
    "$(printf %s "$token" | sha256sum | cut -d' ' -f1)" \
    '"roles": ["submit", "read_weights", "status"]' >"$secrets/asympo-learner-tls/principals.json"
  timeout 420 node "$here/kubernetes_pods.cjs" --prefix "$prefix" --build "$build" \
    --work "$tmp/pods" --secrets "$secrets" "${pod_renders[@]}" >"$tmp/pods.out" 2>&1
  rc=$?
  set -e
  grep -v '^RESULT ' "$tmp/pods.out" || true
  result=$(grep '^RESULT ' "$tmp/pods.out" || true)
  [[ $result =~ passed=([0-9]+)\ failed=([0-9]+) ]] ||
    die "kubernetes_pods.cjs stopped (exit $rc) before it finished"
  passed=$((passed + BASH_REMATCH[1])) failed=$((failed + BASH_REMATCH[2]))
fi

ok() { passed=$((passed + 1)); echo "PASS: $*"; }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }

# --- the PrometheusRule is generated from alerts.yml ---------------------
if python3 "$k8s/sync_rules.py" --check; then
  ok "sync_rules.py --check: monitoring/prometheus-rule.yaml is alerts.yml"
else
  bad "sync_rules.py --check"
fi

# --- the learner's probe script, on made-up /proc/net tables ------------
probe=$k8s/base/learner-probe.sh
net=$tmp/net
mkdir -p "$net"
hdr='  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid'
{ echo "$hdr"
  echo '   0: 00000000:24F8 00000000:0000 0A 00000000:00000000 00:00000000 00000000 10001'
  echo '   1: 0100007F:C383 0100007F:9C40 01 00000000:00000000 00:00000000 00000000 10001'
} >"$net/tcp"
{ echo "$hdr"
  echo '   0: 00000000000000000000000000000000:C383 00000000000000000000000000000000:0000 0A 0'
} >"$net/tcp6"
# BEAT: the heartbeat file's line, "none" for no file.
probe_case() {  # WANT_RC HOST MODE TCP6 BEAT [RANK_OFFSET]: one run of the probe
  local want=$1 host=$2 mode=$3 tables=$4 beat=$5 offset=${6:-0} got
  mkdir -p "$tmp/net-$tables"
  cp "$net/tcp" "$tmp/net-$tables/tcp"
  [[ $tables == with6 ]] && cp "$net/tcp6" "$tmp/net-$tables/tcp6"
  rm -f "$tmp/beat"
  [[ $beat == none ]] || echo "$beat" >"$tmp/beat"
  set +e
  HOSTNAME=$host ASYMPO_PROC_NET=$tmp/net-$tables ASYMPO_HEARTBEAT_FILE=$tmp/beat \
    ASYMPO_HEARTBEAT_MAX_AGE=600 ASYMPO_RANK_OFFSET=$offset sh "$probe" "$mode" >/dev/null 2>&1
  got=$?
  set -e
  [[ $got == "$want" ]] || echo "$host $mode ($tables, beat $beat): exit $got, want $want"
}
now=$(date +%s)
probe_problems=$(
  probe_case 1 asympo-learner-0 startup with6 none        # still loading
  probe_case 0 asympo-learner-0 startup with6 "$now 1"    # the loop has begun
  probe_case 0 asympo-learner-2 live no6 "$((now - 30)) 9"  # every rank, by its beat
  probe_case 1 asympo-learner-2 live no6 "$((now - 700)) 9" # stalled past 600 s
  probe_case 1 asympo-learner-0 live with6 "$((now - 601)) 9"
  probe_case 1 asympo-learner-0 live with6 none
  probe_case 1 asympo-learner-0 live with6 "garbage"
  probe_case 0 asympo-learner-0 ready with6 "$now 1"      # 50051 listens (tcp6 only)
  probe_case 1 asympo-learner-0 ready no6 "$now 1"        # 50051 only as a connection
  probe_case 0 asympo-learner-3 ready no6 "$now 1"        # other ranks: their beat
  probe_case 1 asympo-learner-3 ready no6 none
  probe_case 0 asympo-learner-worker-0 ready no6 "$now 1" 1  # rank 1, not rank 0
  probe_case 2 asympo-learner-0 bogus with6 none
  probe_case 0 asympo-learner-0 --help with6 none
)
if [[ -z $probe_problems ]]; then
  ok "learner-probe.sh: startup at the first beat, liveness by its age on every rank," \
     "readiness by rank 0's port"
else
  bad "learner-probe.sh: $probe_problems"
fi

kubectl_version=$("$kubectl" version --client 2>/dev/null | grep -o 'v[0-9][0-9.]*' | head -n 1)
echo "kubernetes_test: ${#dirs[@]} renderings by kubectl ${kubectl_version:-?}" \
  "(node $(node --version))," \
  "checked in $((SECONDS - start)) s"
echo "$passed passed, $failed failed"
((failed == 0))
