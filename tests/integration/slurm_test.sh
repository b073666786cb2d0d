#!/bin/bash
# deploy/slurm/asympo.sbatch under a real Slurm: starts munged, slurmctld
# and slurmd (Debian's slurm-wlm and munge; needs root) with a generated
# configuration in a temporary folder, on ports of their own, and submits the
# batch script with the built-in tiny model on the CPU:
#
#   colocated  one node: 2 learner ranks (--dist_insecure) and 2 rollouts
#              side by side, --max_steps=30; the job completes with status 0,
#              both ranks stopped after 30 steps, both rollouts had groups
#              accepted, checkpoint 30 is written, the Prometheus target files
#              are there while the job runs and gone after it.
#   two_nodes  the same with the rollouts on a second node (a second slurmd
#              on this machine, node "localhost"); left out, saying why, when
#              that slurmd cannot start.
#   scancel    a run without --max_steps, stopped by `scancel --batch
#              --signal=INT` (the graceful stop) once it trains: every target
#              answers /metrics with the run's label, the learner checkpoints,
#              the job completes with status 0, no CANCELLED line.
#   rank_dies  learner rank 1 killed (SIGKILL) while training: rank 0
#              checkpoints and exits, the rollouts are stopped, the job FAILS.
#   rollouts_fail  every rollout refuses its flags: the learner is stopped,
#              the job FAILS saying why.
#   examples, time_limit, plain_scancel, early_stop: in slurm_scenarios.sh
#              (docs/cluster.md's CPU examples as written, with TLS and in
#              plaintext; a job stopped by its time limit; a plain scancel; a
#              graceful stop while the daemons start).
#
#   tests/integration/slurm_test.sh BUILD_DIR [SCENARIO...]   (default: all)
#
# The daemons run from BUILD_DIR/learner_server/asympo-learner and
# BUILD_DIR/rollout_server/asympo-rollout (copied first). Everything the test
# starts is stopped on exit; KEEP_SLURM_TEST_DIR=1 keeps its folder (logs,
# slurm.conf), which is also kept when it fails. SLURM_TEST_BUDGET (330 s)
# bounds all its waits together.
# Exit 0: passed; 1: failed; 77: skipped (Slurm or munge missing, not root,
# or the daemons cannot start here), with the reason printed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
sbatch_script=$here/../../deploy/slurm/asympo.sbatch
build=${1:?usage: slurm_test.sh BUILD_DIR [SCENARIO...]}
shift
scenarios=("$@")
((${#scenarios[@]})) ||
  scenarios=(colocated two_nodes scancel rank_dies rollouts_fail examples time_limit plain_scancel
             early_stop)

say() { printf '%s slurm_test: %s\n' "$(date +%H:%M:%S)" "$*"; }
# Every wait ends by this time (SLURM_TEST_BUDGET seconds from now), leaving
# the clean-up time before the ctest TIMEOUT (450 s) would kill the test
# without it.
budget_end=$((SECONDS + ${SLURM_TEST_BUDGET:-330}))
# deadline_in TIMEOUT: the deadline TIMEOUT seconds from now, capped by the budget.
deadline_in() { local t=$((SECONDS + $1)); echo $((t < budget_end ? t : budget_end)); }
skip() { say "SKIP: $*"; exit 77; }

# --- Prerequisites -----------------------------------------------------------

for tool in munged munge unmunge slurmctld slurmd sbatch squeue scontrol scancel sinfo; do
  command -v "$tool" >/dev/null ||
    skip "$tool is not installed (apt-get install slurm-wlm munge)"
done
[[ $(id -u) -eq 0 ]] || skip "slurmd must run as root to launch jobs; run the test as root"
node0=$(hostname -s)
getent hosts "$node0" >/dev/null ||
  skip "this host's name $node0 does not resolve (the job addresses node 0 by it)"
[[ -f $sbatch_script ]] || { say "FAIL: no batch script at $sbatch_script"; exit 1; }
for b in learner_server/asympo-learner rollout_server/asympo-rollout; do
  [[ -x $build/$b ]] || { say "FAIL: no executable $build/$b (build it first)"; exit 1; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/asympo-slurm.XXXXXX")
# munged wants every folder above its socket searchable by all.
chmod 755 "$tmp"
pids=()          # daemons started here, killed on exit
jobs_submitted=()

# Kills what is left of this test's cluster: processes whose environment
# names its slurm.conf (slurmstepd, job scripts, srun, the daemons' tasks)
# and copies of the daemons from $tmp/bin. This shell's own environment
# predates the export, so it is not among them.
kill_leftovers() {
  local exe pid
  for exe in /proc/[0-9]*/exe; do
    pid=${exe#/proc/}
    pid=${pid%/exe}
    [[ $pid != "$$" ]] || continue
    if [[ $(readlink "$exe" 2>/dev/null) == "$tmp/bin/"* ]] ||
       tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF "SLURM_CONF=$tmp/slurm.conf"
    then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

cleanup() {
  local rc=$? j pid i
  set +e
  for j in "${jobs_submitted[@]}"; do scancel "$j" 2>/dev/null; done
  # Give cancelled jobs a moment to end through Slurm, then stop the daemons.
  for ((i = 0; i < 20; i++)); do
    [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
    sleep 0.5
  done
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for ((i = 0; i < 20; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  kill_leftovers
  if [[ $rc -eq 0 && -z ${KEEP_SLURM_TEST_DIR:-} ]]; then
    rm -rf "$tmp"
  else
    say "logs kept in $tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

dump() {  # dump FILE...: the tail of each, for a failure's context
  local f
  for f in "$@"; do
    [[ -f $f ]] || continue
    echo "----- $f (tail)"
    tail -n 25 "$f"
  done
}
fail() {
  say "FAIL: $*"
  dump "$tmp"/log/slurmctld.log "$tmp"/log/slurmd-*.log
  exit 1
}

# The daemons run from a copy: a rebuild of BUILD_DIR during the test
# cannot change them under a running job.
mkdir -p "$tmp/bin"
cp "$build/learner_server/asympo-learner" "$build/rollout_server/asympo-rollout" "$tmp/bin/"

# --- Ports -------------------------------------------------------------------

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
base=
for ((try = 0; try < 50; try++)); do
  # Below the kernel's ephemeral range (32768 and up by default), where the
  # client side of every connection of the tests running beside this one
  # would otherwise take ports of the block after it was found free.
  candidate=$((10000 + (RANDOM % 350) * 64))
  ok=1
  for ((p = candidate; p < candidate + 64; p++)); do
    port_free "$p" || { ok=; break; }
  done
  if [[ -n $ok ]]; then base=$candidate; break; fi
done
[[ -n $base ]] || fail "found no 64 free TCP ports in a row"
ctld_port=$base
slurmd_ports=($((base + 1)) $((base + 2)))
# srun listens on ports of its own range: they must not be any scenario's.
srun_ports="$((base + 48))-$((base + 63))"
# Scenario k (0..8) uses ports base + 3 + 5k ... + 4 (learner gRPC,
# rendezvous, metrics, two rollouts' metrics), all below base + 48.
scenario_port() {
  (($1 <= 8)) || fail "scenario index $1: only 9 fit in the port block"
  echo $((base + 3 + 5 * $1 + $2))
}

# --- munge -------------------------------------------------------------------

mkdir -p "$tmp/munge-key" "$tmp/munge-run" "$tmp/log" "$tmp/state"
chmod 700 "$tmp/munge-key"
chmod 755 "$tmp/munge-run"
key=$tmp/munge-key/munge.key
if command -v mungekey >/dev/null; then
  mungekey --create --keyfile="$key" || fail "mungekey could not write $key"
else
  dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
fi
chmod 600 "$key"
socket=$tmp/munge-run/munge.socket.2
munged --foreground --socket="$socket" --key-file="$key" --log-file="$tmp/log/munged.log" \
  --pid-file="$tmp/munge-run/munged.pid" --seed-file="$tmp/munge-key/munged.seed" \
  >>"$tmp/log/munged.log" 2>&1 &
pids+=($!)
for ((i = 0; i < 40; i++)); do
  munge --socket="$socket" --no-input 2>/dev/null |
    unmunge --socket="$socket" >/dev/null 2>&1 && break
  kill -0 "${pids[-1]}" 2>/dev/null || break
  sleep 0.25
done
if ! munge --socket="$socket" --no-input 2>/dev/null |
     unmunge --socket="$socket" >/dev/null 2>&1; then
  dump "$tmp/log/munged.log"
  skip "munged did not start or does not answer on $socket"
fi
say "munged up ($socket)"

# --- Slurm -------------------------------------------------------------------

node1=localhost
two_nodes=1
[[ $node0 != "$node1" ]] || two_nodes=
cpus=$(nproc)
export SLURM_CONF=$tmp/slurm.conf
{
  cat <<EOF
# Generated by tests/integration/slurm_test.sh: a throw-away cluster.
ClusterName=asympotest
SlurmctldHost=$node0
SlurmctldPort=$ctld_port
SlurmdPort=${slurmd_ports[0]}
SrunPortRange=$srun_ports
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool-%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=600
NodeName=$node0 NodeAddr=127.0.0.1 Port=${slurmd_ports[0]} CPUs=$cpus RealMemory=1000
EOF
  if [[ -n $two_nodes ]]; then
    echo "NodeName=$node1 NodeAddr=127.0.0.1 Port=${slurmd_ports[1]} CPUs=$cpus RealMemory=1000"
  fi
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=60 State=UP"
} >"$SLURM_CONF"

slurmctld -D -i -f "$SLURM_CONF" >>"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node0" >>"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
if [[ -n $two_nodes ]]; then
  slurmd -D -f "$SLURM_CONF" -N "$node1" >>"$tmp/log/slurmd-$node1.out" 2>&1 &
  pids+=($!)
fi

node_state() { sinfo -h -N -n "$1" -o %t 2>/dev/null | head -n 1; }
deadline=$(deadline_in 30)
until [[ $(node_state "$node0") == idle ]]; do
  if ((SECONDS >= deadline)); then
    dump "$tmp"/log/slurmctld.* "$tmp"/log/slurmd*
    skip "Slurm did not come up here within 30 s (node $node0: $(node_state "$node0"))"
  fi
  sleep 0.5
done
if [[ -n $two_nodes ]]; then
  until [[ $(node_state "$node1") == idle ]]; do
    if ((SECONDS >= deadline + 10)); then
      dump "$tmp/log/slurmd-$node1.out" "$tmp/log/slurmd-$node1.log"
      say "note: the second slurmd (node $node1) did not come up; two_nodes is left out"
      two_nodes=
      break
    fi
    sleep 0.5
  done
fi
say "slurmctld and slurmd up: $(sinfo -h -N -o '%N/%t' | tr '\n' ' ')(SLURM_CONF=$SLURM_CONF)"

# --- One job -----------------------------------------------------------------

job_field() {  # job_field JOB FIELD: one field of `scontrol show job` (empty if none)
  local line
  line=$(scontrol show job "$1" -o 2>/dev/null) || return 0
  grep -o " $2=[^ ]*" <<<" $line" | head -n 1 | cut -d= -f2 || true
}

# run_job NAME K SBATCH_ARGS...: submits the script (ASYMPO_* settings from
# the environment), copies the Prometheus target files while it runs, and
# waits (at most 150 s) for its end. Sets $job, $shared and $out.
run_job() {
  local name=$1 k=$2
  shift 2
  shared=$tmp/$name
  out=$shared/job.out
  mkdir -p "$shared/targets-seen"
  export ASYMPO_SHARED=$shared ASYMPO_RUN_NAME=slurm-test-$name ASYMPO_BIN_DIR=$tmp/bin
  ASYMPO_PORT=$(scenario_port "$k" 0)
  MASTER_PORT=$(scenario_port "$k" 1)
  ASYMPO_LEARNER_METRICS_PORT=$(scenario_port "$k" 2)
  ASYMPO_ROLLOUT_METRICS_PORT=$(scenario_port "$k" 3)
  export ASYMPO_PORT MASTER_PORT ASYMPO_LEARNER_METRICS_PORT ASYMPO_ROLLOUT_METRICS_PORT
  # --time=10: the script's `#SBATCH --signal=B:USR1@300` then comes 5
  # minutes in, long after the job is over (with --time=5 it comes at once).
  # A --time in SBATCH_ARGS comes later and wins.
  job=$(sbatch --parsable --time=10 --output="$out" "$@" "$sbatch_script") ||
    fail "$name: sbatch refused the script"
  jobs_submitted+=("$job")
  say "$name: job $job submitted"
}

job_over() {  # job_over STATE: true for the states a job ends in
  case $1 in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | PREEMPTED | OUT_OF_MEMORY | \
      BOOT_FAIL | DEADLINE) return 0 ;;
  esac
  return 1
}

# wait_job TIMEOUT: waits for $job to leave the queue, keeping a copy of the
# target files seen meanwhile; fails after TIMEOUT seconds.
wait_job() {
  local deadline state f
  deadline=$(deadline_in "$1")
  while :; do
    for f in "$shared"/prometheus/*.json; do
      if [[ -f $f && ! -f $shared/targets-seen/${f##*/} ]]; then
        cp "$f" "$shared/targets-seen/" || true  # removed meanwhile: copied next time
      fi
    done
    state=$(job_field "$job" JobState)
    job_over "$state" && break
    if ((SECONDS >= deadline)); then
      scancel "$job"
      dump "$out" "$shared"/logs/*/*.log
      fail "job $job still $state after $1 s (or the test's time budget ran out)"
    fi
    sleep 0.5
  done
}

# check_job_ok: COMPLETED with exit 0, target files seen and removed.
check_job_ok() {
  local state exit_code
  state=$(job_field "$job" JobState)
  exit_code=$(job_field "$job" ExitCode)
  if [[ $state != COMPLETED || $exit_code != 0:0 ]]; then
    dump "$out" "$shared"/logs/*/*.log
    fail "job $job ended $state with exit code $exit_code (want COMPLETED, 0:0)"
  fi
  say "job $job COMPLETED, exit code $exit_code"
}

# check_targets LEARNER_NODE ROLLOUT_NODE: the files seen during the run
# name the right endpoints and labels, and none is left.
check_targets() {
  local dir=$shared/targets-seen learner_file rollout_file want
  learner_file=$dir/asympo-$job-learner.json
  rollout_file=$dir/asympo-$job-rollout.json
  [[ -f $learner_file && -f $rollout_file ]] ||
    fail "job $job: target files not seen during the run (seen: $(ls "$dir"))"
  want="\"run\": \"$ASYMPO_RUN_NAME\", \"slurm_job_id\": \"$job\""
  if ! grep -qF "[{\"targets\": [\"$1:$ASYMPO_LEARNER_METRICS_PORT\"]" "$learner_file" ||
     ! grep -qF "\"job\": \"asympo-learner\", $want" "$learner_file"; then
    fail "unexpected learner targets: $(cat "$learner_file")"
  fi
  local r0=$2:$ASYMPO_ROLLOUT_METRICS_PORT r1=$2:$((ASYMPO_ROLLOUT_METRICS_PORT + 1))
  if ! grep -qF "[{\"targets\": [\"$r0\", \"$r1\"]" "$rollout_file" ||
     ! grep -qF "\"job\": \"asympo-rollout\", $want" "$rollout_file"; then
    fail "unexpected rollout targets: $(cat "$rollout_file")"
  fi
  if command -v python3 >/dev/null; then
    python3 -c 'import json, sys; [json.load(open(f)) for f in sys.argv[1:]]' \
      "$learner_file" "$rollout_file" || fail "the target files are not JSON"
  fi
  [[ -z $(ls -A "$shared/prometheus") ]] ||
    fail "target files left after the job: $(ls -A "$shared/prometheus")"
  say "Prometheus targets written during the run and removed after it: $(cat "$rollout_file")"
}

# check_learner STEPS: both ranks stopped after STEPS steps, checkpoint STEPS.
check_learner() {
  local logs=$shared/logs/$job ckpt
  grep -q "stopped after $1 steps" "$logs/learner-rank0.log" ||
    { dump "$logs/learner-rank0.log"; fail "rank 0 did not stop after $1 steps"; }
  grep -q "rank 1 stopped with rank 0 after $1 steps" "$logs/learner-rank1.log" ||
    { dump "$logs/learner-rank1.log"; fail "rank 1 did not stop with rank 0"; }
  local dir=${checkpoints:-$shared/checkpoints}
  ckpt=$(printf '%s/ckpt-%012d' "$dir" "$1")
  [[ -d $ckpt ]] || fail "no checkpoint $ckpt (have: $(ls "$dir"))"
  say "learner: $(grep -o 'step 1 version.*' "$logs/learner-rank0.log" | cut -c1-60) ..."
  say "learner: $(grep -o 'stopped after.*' "$logs/learner-rank0.log")"
  say "checkpoint: ${ckpt#"$tmp"/}"
}

# check_rollouts NODE: two rollout logs, each with groups the learner took.
check_rollouts() {
  local logs=$shared/logs/$job f n=0 accepted
  for f in "$logs/rollout-$1-0.log" "$logs/rollout-$1-1.log"; do
    [[ -f $f ]] || fail "no rollout log $f (have: $(ls "$logs"))"
    accepted=$(grep -o 'groups generated, [0-9]* accepted' "$f" | grep -o '[0-9]* accepted' |
               cut -d' ' -f1 || true)
    [[ -n $accepted && $accepted -gt 0 ]] ||
      { dump "$f"; fail "rollout log $f shows no group accepted by the learner"; }
    say "rollout: $(grep -o 'rollout-[^ ]* stopped.*' "$f")"
    n=$((n + 1))
  done
  ((n == 2)) || fail "want 2 rollout logs, found $n"
}

# The settings shared by the scenarios: 2 learner ranks and 2 rollouts per
# node on the CPU, one LibTorch thread each.
export ASYMPO_DEVICE=cpu ASYMPO_GPUS_PER_NODE=2 ASYMPO_MODEL=tiny ASYMPO_TASK=copy
export ASYMPO_OBJECTIVE=asympo_stable ASYMPO_LR=1e-4 ASYMPO_STOP_TIMEOUT=20
export ASYMPO_LEARNER_ARGS="--threads=1 --dist_timeout=60s --checkpoint_every=10"
export ASYMPO_ROLLOUT_ARGS="--threads=1"
unset ASYMPO_ROLLOUT_NODES ASYMPO_PROMETHEUS_DIR ASYMPO_CHECKPOINT_DIR ASYMPO_LOG_DIR
# Plaintext on the test's loopback cluster, but for the co-located scenario,
# which runs with TLS, mTLS and a principals file.
export ASYMPO_INSECURE=1

scenario_colocated() {
  export ASYMPO_MAX_STEPS=30
  local certs=$tmp/certs
  "$here/../testing/make_certs.sh" "$certs" >/dev/null || fail "openssl could not make certificates"
  printf '{"principals": [{"name": "rollouts", "certificate": "rollout-1", "roles": %s}]}\n' \
    '["submit", "read_weights", "status"]' >"$certs/principals.json"
  # sbatch takes the environment at submission.
  export ASYMPO_INSECURE=0 ASYMPO_TLS_CERT=$certs/server.pem ASYMPO_TLS_KEY=$certs/server.key \
    ASYMPO_TLS_CA=$certs/ca.pem ASYMPO_TLS_SERVER_NAME=localhost \
    ASYMPO_TLS_CLIENT_CA=$certs/ca.pem ASYMPO_TLS_CLIENT_CERT=$certs/client.pem \
    ASYMPO_TLS_CLIENT_KEY=$certs/client.key ASYMPO_AUTH_FILE=$certs/principals.json
  run_job colocated 0 --nodes=1 --nodelist="$node0"
  export ASYMPO_INSECURE=1
  unset ASYMPO_TLS_CERT ASYMPO_TLS_KEY ASYMPO_TLS_CA ASYMPO_TLS_SERVER_NAME ASYMPO_TLS_CLIENT_CA \
    ASYMPO_TLS_CLIENT_CERT ASYMPO_TLS_CLIENT_KEY ASYMPO_AUTH_FILE
  wait_job 150
  check_job_ok
  check_learner 30
  check_rollouts "$node0"
  check_targets "$node0" "$node0"
  grep -q "rollouts co-located on $node0" "$out" || fail "the job did not co-locate: $(cat "$out")"
  grep -q "(mTLS, callers authenticated" "$shared/logs/$job/learner-rank0.log" ||
    fail "the learner did not serve mTLS with authenticated callers"
}

scenario_two_nodes() {
  if [[ -z $two_nodes ]]; then
    say "two_nodes: left out (no second slurmd on this machine)"
    return
  fi
  export ASYMPO_MAX_STEPS=30
  run_job two_nodes 1 --nodes=2
  wait_job 150
  check_job_ok
  # Node 0 of the job (the learner's) is the first of its sorted node list.
  local nodes
  mapfile -t nodes < <(scontrol show hostnames "$(job_field "$job" NodeList)")
  ((${#nodes[@]} == 2)) || fail "job $job ran on ${nodes[*]}, not on two nodes"
  check_learner 30
  check_rollouts "${nodes[1]}"
  check_targets "${nodes[0]}" "${nodes[1]}"
  grep -q "learner (2 ranks, cpu) on ${nodes[0]}:$ASYMPO_PORT, 2 rollouts on ${nodes[1]};" "$out" ||
    fail "unexpected layout: $(head -n 1 "$out")"
  [[ ! -e $shared/logs/$job/rollout-${nodes[0]}-0.log ]] || fail "a rollout ran on node 0"
}

scenario_scancel() {
  export ASYMPO_MAX_STEPS=0
  run_job scancel 2 --nodes=1 --nodelist="$node0"
  local rank0=$shared/logs/$job/learner-rank0.log f t
  wait_for_step 3
  # Every target answers /metrics, labelled with the run.
  for f in "$shared"/prometheus/*.json; do
    for t in $(grep -o '"[^"]*:[0-9]*"' "$f" | tr -d '"'); do
      metrics_have_run "$t" || fail "target $t (from ${f##*/}) has no run=\"$ASYMPO_RUN_NAME\""
    done
  done
  # Each rollout has had groups accepted before the cancel (on a loaded
  # machine a rollout's first batch can come after the learner's step 3).
  local deadline=$((SECONDS + 60))
  for t in $(grep -o '"[^"]*:[0-9]*"' "$shared/prometheus/asympo-$job-rollout.json" | tr -d '"'); do
    until (($(sent_groups "$t") > 0)); do
      ((SECONDS < deadline)) || fail "rollout $t had no group accepted within 60 s"
      sleep 0.5
    done
  done
  say "scancel: every target answers with run=\"$ASYMPO_RUN_NAME\"; scancel --batch --signal=INT"
  scancel --batch --signal=INT "$job"
  wait_job 90
  check_job_ok
  grep -q "got SIGINT" "$out" || fail "the script did not see SIGINT: $(cat "$out")"
  no_errors_in_output
  local steps
  steps=$(grep -o 'stopped after [0-9]* steps' "$rank0" | grep -o '[0-9]*' || true)
  [[ -n $steps ]] || { dump "$rank0"; fail "rank 0 did not stop cleanly"; }
  check_learner "$steps"
  check_rollouts "$node0"
  check_targets "$node0" "$node0"
}

# check_job_failed: the job FAILED with the exit code of the learner step,
# the target files are gone, the script said why.
check_job_failed() {
  local state exit_code
  state=$(job_field "$job" JobState)
  exit_code=$(job_field "$job" ExitCode)
  if [[ $state != FAILED || $exit_code == 0:0 ]]; then
    dump "$out" "$shared"/logs/*/*.log
    fail "job $job ended $state with exit code $exit_code (want FAILED, non-zero)"
  fi
  [[ -z $(ls -A "$shared/prometheus" 2>/dev/null) ]] ||
    fail "target files left after the job: $(ls -A "$shared/prometheus")"
  say "job $job FAILED, exit code $exit_code:" \
    "$(grep -o 'asympo.sbatch: error: .*' "$out" | head -n 1 | cut -c1-100)"
}

# pid_of LEARNER_RANK: the process of that rank of $job (from /proc).
pid_of() {
  local exe pid
  for exe in /proc/[0-9]*/exe; do
    pid=${exe#/proc/}
    pid=${pid%/exe}
    [[ $(readlink "$exe" 2>/dev/null) == "$tmp/bin/asympo-learner" ]] || continue
    if tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx "SLURM_PROCID=$1" &&
       tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx "SLURM_JOB_ID=$job"; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

# wait_for_step N: until rank 0 of $job has logged step N (at most 90 s).
wait_for_step() {
  local rank0=$shared/logs/$job/learner-rank0.log deadline
  deadline=$(deadline_in 90)
  until grep -q "step $1 version" "$rank0" 2>/dev/null; do
    ! job_over "$(job_field "$job" JobState)" ||
      { dump "$out" "$rank0"; fail "job $job ended before step $1"; }
    ((SECONDS < deadline)) || { dump "$out" "$rank0"; fail "job $job did not train in 90 s"; }
    sleep 0.5
  done
}

# A learner rank killed: rank 0 checkpoints and exits 2, the rollouts are
# stopped, the job fails.
scenario_rank_dies() {
  export ASYMPO_MAX_STEPS=0
  run_job rank_dies 3 --nodes=1 --nodelist="$node0"
  wait_for_step 3
  local pid
  pid=$(pid_of 1) || fail "found no process of learner rank 1 of job $job"
  say "rank_dies: kill -9 learner rank 1 (pid $pid)"
  kill -KILL "$pid"
  wait_job 90
  check_job_failed
  local rank0=$shared/logs/$job/learner-rank0.log steps ckpt
  grep -q "data parallel: .* failed" "$rank0" || fail "rank 0 did not report the lost rank"
  say "rank 0: $(grep -o 'data parallel: .*failed.*' "$rank0" | head -n 1 | cut -c1-90)"
  # Rank 0 saved its last completed step before it exited.
  steps=$(grep -o 'stopped after [0-9]* steps' "$rank0" | grep -o '[0-9]*' || true)
  [[ -n $steps ]] || { dump "$rank0"; fail "rank 0 did not stop by itself"; }
  ckpt=$(printf '%s/checkpoints/ckpt-%012d' "$shared" "$steps")
  [[ -d $ckpt ]] || fail "no checkpoint $ckpt after the lost rank"
  say "rank 0 stopped after $steps steps and wrote ${ckpt#"$tmp"/}"
  grep -q "rollout step ended" "$out" || fail "the rollouts were not stopped: $(cat "$out")"
}

# Every rollout fails at start: the learner is stopped, the job fails.
scenario_rollouts_fail() {
  export ASYMPO_MAX_STEPS=0 ASYMPO_ROLLOUT_ARGS="--threads=1 --task=no_such_task"
  run_job rollouts_fail 4 --nodes=1 --nodelist="$node0"
  wait_job 90
  export ASYMPO_ROLLOUT_ARGS="--threads=1"
  check_job_failed
  grep -q "every rollout ended" "$out" || fail "the script did not say why: $(cat "$out")"
  # Stopped once running, or while it still started (waiting for its second
  # rank, say): either way at once and saying so.
  grep -qE "stopped after 0 steps|stopped by a signal during start-up" \
    "$shared/logs/$job/learner-rank0.log" || fail "the learner did not stop cleanly"
}

# sent_groups HOST:PORT: a rollout's asympo_rollout_groups_sent_total (0
# when it cannot be read).
sent_groups() {
  local host=${1%:*} port=${1##*:} body
  # shellcheck disable=SC2016  # $0 and $1 are the inner shell's
  body=$(timeout 10 bash -c 'exec 3<>"/dev/tcp/$0/$1" &&
    printf "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n" "$0" >&3 && cat <&3' "$host" "$port" \
    2>/dev/null) || { echo 0; return; }
  awk '/^asympo_rollout_groups_sent_total/ { n += $NF } END { printf "%d\n", n }' <<<"$body"
}

# metrics_have_run HOST:PORT: GET /metrics (bash's /dev/tcp, no curl needed).
metrics_have_run() {
  local host=${1%:*} port=${1##*:} body
  # shellcheck disable=SC2016  # $0 and $1 are the inner shell's
  body=$(timeout 10 bash -c 'exec 3<>"/dev/tcp/$0/$1" &&
    printf "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n" "$0" >&3 && cat <&3' "$host" "$port" \
    2>/dev/null) || return 1
  grep -qF "run=\"$ASYMPO_RUN_NAME\"" <<<"$body"
}

# shellcheck source=tests/integration/slurm_scenarios.sh
source "$here/slurm_scenarios.sh"

start=$SECONDS
for s in "${scenarios[@]}"; do
  declare -F "scenario_$s" >/dev/null || fail "unknown scenario $s"
  "scenario_$s"
  say "$s: passed"
done
say "PASS: ${scenarios[*]} in $((SECONDS - start)) s"
