# Scenarios of tests/integration/slurm_test.sh (sourced by it; they use its
# helpers and its cluster):
#
#   examples       docs/cluster.md's CPU examples exactly as written (the
#                  block after its "slurm_test.sh: the CPU examples" marker):
#                  one in plaintext (ASYMPO_INSECURE=1), one with TLS and a
#                  bearer token, one after the other from one submit folder
#                  holding deploy/slurm/asympo.sbatch, build/ and tls/, with
#                  nothing but the ports added to the environment. Each has
#                  a checkpoint directory of its own; both COMPLETED with
#                  exit code 0 after their 50 steps from version 0 (neither
#                  resumed the other), checkpoint 50 written in its own
#                  directory, no error line in the job's output.
#   time_limit     --time=5: the script warns that the stop signal comes at
#                  once, Slurm sends it (SIGUSR1, #SBATCH --signal=B:USR1@300),
#                  the learner checkpoints, and the job ends FAILED with exit
#                  code 75:0, never COMPLETED, saying it was the time limit.
#   plain_scancel  a plain `scancel <job>` while it trains: the job ends
#                  CANCELLED, and its output has no "Invalid job id" and no
#                  scancel error.
#   early_stop     `scancel --batch --signal=INT` as soon as the script runs,
#                  while the daemons load: the script waits until they are
#                  ready, then stops them; the job ends COMPLETED 0:0, rank 0
#                  stopped cleanly and checkpointed, no error line (a daemon
#                  signalled while it loads would die with the signal's
#                  status and no checkpoint).
# shellcheck shell=bash disable=SC2154  # node0, node1, tmp, here, sbatch_script: slurm_test.sh's

# no_errors_in_output: the job's output has no error line of Slurm's.
no_errors_in_output() {
  if grep -E "CANCELLED|Invalid job id|scancel: error|srun: error|slurmstepd.*error" "$out"; then
    fail "job $job: error lines in its output (above)"
  fi
}

# make_example_tls DIR: what the TLS example reads from tls/: a CA, a
# certificate naming both nodes of the cluster (Slurm picks the job's) and its key, a token and the principals file
# that names the token's SHA-256.
make_example_tls() {
  local d=$1 hash
  (
    cd "$d" || exit 1
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
      -out ca.pem -subj "/CN=example CA" -days 2 -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null &&
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout learner.key \
      -out learner.csr -subj "/CN=$node0" 2>/dev/null &&
    printf 'subjectAltName=DNS:%s,DNS:%s\nextendedKeyUsage=serverAuth\n' "$node0" "$node1" \
      >learner.ext &&
    openssl x509 -req -in learner.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -extfile learner.ext -out learner.pem 2>/dev/null
  ) || fail "openssl could not make the example's certificates"
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$d/rollout.token"
  hash=$(tr -d '\n' <"$d/rollout.token" | sha256sum | cut -d' ' -f1)
  printf '{"principals": [{"name": "rollouts", "token_sha256": "%s", %s}]}\n' "$hash" \
    '"roles": ["submit", "read_weights", "status"]' >"$d/principals.json"
  echo >>"$d/rollout.token"
}

# run_example N K COMMAND: COMMAND from a submit folder of its own, with no
# ASYMPO_* setting of the test's but the ports of scenario K.
run_example() {
  local n=$1 k=$2 command=$3 submitted
  local ex=$tmp/examples  # one folder for both, as a user runs them
  mkdir -p "$ex/deploy/slurm" "$ex/build/learner_server" "$ex/build/rollout_server" "$ex/tls"
  cp "$sbatch_script" "$ex/deploy/slurm/asympo.sbatch"
  ln -sf "$tmp/bin/asympo-learner" "$ex/build/learner_server/asympo-learner"
  ln -sf "$tmp/bin/asympo-rollout" "$ex/build/rollout_server/asympo-rollout"
  [[ -f $ex/tls/rollout.token ]] || make_example_tls "$ex/tls"
  submitted=$(
    for v in $(compgen -e); do [[ $v != ASYMPO_* ]] || unset "$v"; done
    ASYMPO_PORT=$(scenario_port "$k" 0)
    MASTER_PORT=$(scenario_port "$k" 1)
    ASYMPO_LEARNER_METRICS_PORT=$(scenario_port "$k" 2)
    ASYMPO_ROLLOUT_METRICS_PORT=$(scenario_port "$k" 3)
    export ASYMPO_PORT MASTER_PORT ASYMPO_LEARNER_METRICS_PORT ASYMPO_ROLLOUT_METRICS_PORT
    cd "$ex" && bash -c "$command"
  ) || fail "example $n: sbatch refused it: $command"
  job=${submitted##* }
  [[ $job =~ ^[0-9]+$ ]] || fail "example $n: sbatch said \"$submitted\""
  jobs_submitted+=("$job")
  shared=$ex/runs/slurm
  out=$ex/asympo-$job.out
  mkdir -p "$shared/targets-seen"
  say "example $n: job $job submitted as written: $(tr -s ' \\\n' ' ' <<<"$command")"
}

scenario_examples() {
  local docs=$here/../../docs/cluster.md block cmds=() cur="" line i
  block=$(awk '/<!-- slurm_test.sh: the CPU examples/ { m = 1; next }
               m && /^```sh/ { on = 1; next }
               on && /^```/ { exit }
               on { print }' "$docs")
  while IFS= read -r line; do
    if [[ -n $line ]]; then cur+="$line"$'\n'; continue; fi
    [[ -z $cur ]] || cmds+=("$cur")
    cur=""
  done <<<"$block"
  [[ -z $cur ]] || cmds+=("$cur")
  ((${#cmds[@]} == 2)) || fail "want 2 CPU examples in $docs, found ${#cmds[@]}"
  [[ ${cmds[0]} == *ASYMPO_INSECURE=1* && ${cmds[1]} == *ASYMPO_TLS_CERT=* ]] ||
    fail "the CPU examples of $docs are not one plaintext and one TLS run"
  local dirs=() examples_dir=$tmp/examples checkpoints
  for i in 0 1; do
    dirs+=("$(grep -o 'ASYMPO_CHECKPOINT_DIR=[^ ]*' <<<"${cmds[i]}" | cut -d= -f2)")
  done
  [[ -n ${dirs[0]} && ${dirs[0]} != "${dirs[1]}" ]] ||
    fail "the CPU examples of $docs share a checkpoint directory: the second resumes the first"
  for i in 0 1; do
    run_example $((i + 1)) $((5 + i)) "${cmds[i]}"
    wait_job 150
    check_job_ok
    checkpoints=${dirs[i]/\$PWD/$examples_dir}
    grep -q "starting from version 0" "$shared/logs/$job/learner-rank0.log" ||
      fail "example $((i + 1)) did not start afresh: $(grep -o 'resumed from.*' \
        "$shared/logs/$job/learner-rank0.log")"
    check_learner 50
    check_rollouts "$(job_field "$job" NodeList)"  # one node, of Slurm's choice
    no_errors_in_output
  done
  grep -q "(TLS, callers authenticated" "$shared/logs/$job/learner-rank0.log" ||
    fail "the TLS example's learner did not serve TLS with authenticated callers"
}

scenario_time_limit() {
  export ASYMPO_MAX_STEPS=0
  run_job time_limit 7 --nodes=1 --nodelist="$node0" --time=5
  [[ $(job_field "$job" TimeLimit) == 00:05:00 ]] ||
    fail "job $job has time limit $(job_field "$job" TimeLimit), not 5 minutes"
  # Slurm sends the signal when it next checks the time limits (every 30 s
  # or so), then the learner finishes its step.
  wait_job 150
  local state exit_code rank0=$shared/logs/$job/learner-rank0.log steps
  state=$(job_field "$job" JobState)
  exit_code=$(job_field "$job" ExitCode)
  if [[ $state != FAILED || $exit_code != 75:0 ]]; then
    dump "$out" "$rank0"
    fail "job $job ended $state with exit code $exit_code (want FAILED, 75:0)"
  fi
  grep -q "warning: the job has .* left" "$out" || fail "no warning about the short --time: $(cat "$out")"
  grep -q "got SIGUSR1: the time limit is near" "$out" || fail "no SIGUSR1 from Slurm: $(cat "$out")"
  grep -q "stopped by the time limit" "$out" || fail "the script did not say why: $(cat "$out")"
  steps=$(grep -o 'stopped after [0-9]* steps' "$rank0" | grep -o '[0-9]*' || true)
  [[ -n $steps ]] || { dump "$rank0"; fail "rank 0 did not stop cleanly"; }
  check_learner "$steps"
  no_errors_in_output
  say "time_limit: FAILED 75:0 after $steps steps: $(grep -o 'stopped by the time limit.*' "$out" |
    cut -c1-80)"
}

scenario_plain_scancel() {
  export ASYMPO_MAX_STEPS=0
  run_job plain_scancel 8 --nodes=1 --nodelist="$node0"
  wait_for_step 3
  scancel "$job"
  wait_job 90
  local state
  state=$(job_field "$job" JobState)
  [[ $state == CANCELLED ]] || { dump "$out"; fail "job $job ended $state, not CANCELLED"; }
  if grep -E "Invalid job id|scancel: error" "$out"; then
    fail "job $job: scancel errors in its output (above)"
  fi
  say "plain_scancel: CANCELLED; output: $(grep -c . "$out") lines, no scancel error"
}

scenario_early_stop() {
  export ASYMPO_MAX_STEPS=0
  # Scenario 2's ports (scancel's job ended long before).
  run_job early_stop 2 --nodes=1 --nodelist="$node0"
  local rank0=$shared/logs/$job/learner-rank0.log steps deadline
  deadline=$(deadline_in 60)
  until grep -q "asympo.sbatch: job $job" "$out" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "job $job did not start in 60 s"
    sleep 0.1
  done
  # Slurm may drop a signal sent to a batch step that slurmstepd has not
  # yet marked running, though the script already writes (seen once in
  # CI: no "got SIGINT", the job trained on). An operator sends it again;
  # so does the test, until the script says it got it.
  local tries=0
  until grep -q "got SIGINT" "$out" 2>/dev/null; do
    ((tries < 5)) || fail "job $job: no \"got SIGINT\" after $tries scancel --batch --signal=INT"
    ((tries == 0)) || say "early_stop: no \"got SIGINT\" after 2 s; scancel --batch again"
    scancel --batch --signal=INT "$job"
    tries=$((tries + 1))
    deadline=$(deadline_in 2)
    until grep -q "got SIGINT" "$out" 2>/dev/null || ((SECONDS >= deadline)); do sleep 0.1; done
  done
  wait_job 90
  check_job_ok
  grep -q "the daemons are still starting" "$out" ||
    fail "the stop did not wait for the daemons: $(cat "$out")"
  no_errors_in_output
  steps=$(grep -o 'stopped after [0-9]* steps' "$rank0" | grep -o '[0-9]*' || true)
  [[ -n $steps ]] || { dump "$rank0"; fail "rank 0 did not stop cleanly"; }
  check_learner "$steps"
  say "early_stop: COMPLETED after $steps steps; the stop waited for the daemons"
}
