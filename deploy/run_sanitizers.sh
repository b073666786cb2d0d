#!/usr/bin/env bash
# The sanitizer legs (docs/security.md, "Sanitizers"), each in a build tree
# of its own, building only the test programs it runs:
#   asan       AddressSanitizer + UndefinedBehaviorSanitizer (undefined
#              behaviour fails the test), leaks checked: the unit tests of
#              common/ (batch validation, tokenizer, model files and
#              safetensors, daemon runtime and metrics endpoint), of the
#              weight broadcaster and NCCL transport, and the learner's
#              queue, service and checkpoint tests and the rollout daemon's
#              (with its multi-turn engine, episodes and environment client).
#   asan-full  the same over every unit test (the trainer and generation
#              numerics too; about twice as long).
#              Both leave out the tests that run the process out of file
#              descriptors (named *OutOfDescriptors*, the only tests of their
#              suites GrpcListenerDeathTest and CheckpointFailureTest, which
#              ctest runs one suite a process): UBSan checks a virtual
#              call's object through a pipe the first time it meets its type,
#              and without a descriptor for the pipe it reports a valid object
#              as having an invalid vptr (docs/security.md, "Sanitizers").
#   tsan       ThreadSanitizer: the learner's group queue (producers held
#              back, deadlines, the timer thread), the NCCL transport and its
#              watchdog (on the CPU stand-in of libnccl), the daemons' stop
#              signals, runtime and metrics endpoint. The tests that run gRPC
#              are left to asan: gRPC's own synchronisation is invisible to
#              ThreadSanitizer (docs/security.md, "Sanitizers").
# Debian's LibTorch, gRPC, protobuf and Abseil are not instrumented; the
# project's code is. tests/sanitizers/ holds the suppressions (each with its
# reason) and the Abseil annotations ThreadSanitizer needs.
#
#   ./deploy/run_sanitizers.sh            # asan then tsan (what CI runs)
#   ./deploy/run_sanitizers.sh asan       # or asan-full, tsan
#   JOBS=2 CTEST_ARGS="-R GroupQueue" ./deploy/run_sanitizers.sh tsan
set -euo pipefail
cd "$(dirname "$0")/.."

leg=${1:-all}
case $leg in
  asan | asan-full | tsan | all) ;;
  -h | --help)
    echo "usage: deploy/run_sanitizers.sh [asan | asan-full | tsan | all]   (default: all)"
    echo
    sed -n '2,28s/^# \{0,1\}//p' "$0"
    exit 0 ;;
  *) echo "run_sanitizers: unknown leg \"$leg\" (asan, asan-full, tsan or all)" >&2; exit 2 ;;
esac
jobs=${JOBS:-$(nproc)}
supp=$PWD/tests/sanitizers
# Timed legs (deploy/ci_legs.sh): printed by .ci/run when it set CI_TIMES.
source deploy/ci_legs.sh

./deploy/install_deps.sh >/dev/null

# configure <dir> <-O level> <sanitizer flags> [cmake options...]: line
# tables (stack traces with file:line at a fraction of -g's cost), no
# benchmarks. The asan legs build at -O0, which GCC compiles faster with
# the sanitizers than -O1 (the times: docs/security.md, "Sanitizers"); tsan
# stays at -O1, not measured at -O0 (its tests time deadlines).
configure() {
  local dir=$1 opt=$2 flags=$3
  shift 3
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt -g1" \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
    -DASYMPO_BUILD_BENCH=OFF "$@" >/dev/null
}

# run_ctest <dir> <exclude regex> <ctest args...>: the leg's tests, never
# those of programs it did not build (gtest_discover_tests names them
# <target>_NOT_BUILT).
run_ctest() {
  local dir=$1 exclude=$2
  shift 2
  # shellcheck disable=SC2086
  # Two slots a core, as deploy/run_tests.sh (tests/CMakeLists.txt, "scheduling").
  ctest --test-dir "$dir" --output-on-failure -j $((2 * jobs)) -E "_NOT_BUILT\$|$exclude" "$@" \
    ${CTEST_ARGS:-}
}

# The learner's queue (a program of its own, which links the admission room
# only), service and checkpoint tests and the rollout daemon's, without the
# numerics suites (tests/CMakeLists.txt, "sanitizers").
service_programs=(sanitizer_learner_tests sanitizer_queue_tests sanitizer_rollout_tests)

asan() {
  local dir=${ASAN_BUILD_DIR:-build-asan} programs=(common_tests security_tests tokenizer_tests model_tests)
  if [[ $1 == full ]]; then
    programs+=(learner_server_tests rollout_server_tests)
  else
    programs+=("${service_programs[@]}")
  fi
  configure "$dir" -O0 "-fsanitize=address,undefined -fno-sanitize-recover=all" \
    -DASYMPO_SANITIZER_TESTS=ON
  ci_leg "$leg build" cmake --build "$dir" -j "$jobs" -- daemon_tests weight_broadcaster_tests \
    nccl_tests asympo_fake_nccl "${programs[@]}"
  ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1" \
  LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp" \
    ci_leg "$leg tests" run_ctest "$dir" \
      '^(Layout|Prometheus|TokenizeCli)|^(GrpcListenerDeathTest|CheckpointFailureTest)$' \
      -L "unit|sanitizer"
}

tsan() {
  local dir=${TSAN_BUILD_DIR:-build-tsan}
  configure "$dir" -O1 "-fsanitize=thread" -DASYMPO_SANITIZER_TESTS=ON
  ci_leg "tsan build" cmake --build "$dir" -j "$jobs" -- daemon_tests nccl_tests \
    asympo_fake_nccl sanitizer_queue_tests
  # Abseil's mutexes made visible to ThreadSanitizer (tests/sanitizers/tsan_absl_mutex.cc),
  # preloaded so that gRPC's and Abseil's own calls go through it too.
  c++ -std=c++17 -O1 -g1 -fPIC -shared -o "$dir/libtsan_absl_mutex.so" \
    "$supp/tsan_absl_mutex.cc" -ldl -Wl,-z,lazy
  LD_PRELOAD=$PWD/$dir/libtsan_absl_mutex.so \
  TSAN_OPTIONS="suppressions=$supp/tsan.supp:second_deadlock_stack=1:halt_on_error=0" \
    ci_leg "tsan tests" run_ctest "$dir" '^$' -L 'unit|sanitizer' \
      -R '^(GroupQueue|Nccl|DaemonRuntime|StopSignals|MetricsEndpoint|RunName)'
}

case $leg in
  asan) asan subset ;;
  asan-full) leg=asan-full asan full ;;
  tsan) tsan ;;
  all) leg=asan asan subset; tsan ;;
esac
