#!/usr/bin/env bash
# The project's test command (README.md, .ci/run): installs whatever Debian
# packages are missing, configures and builds everything, and runs every test
# but the container image build (label container).
#
#   ./deploy/run_tests.sh                 # as root, or as a user with sudo
#   BUILD_DIR=build-x ./deploy/run_tests.sh
#   CTEST_ARGS="-L unit" ./deploy/run_tests.sh
set -euo pipefail
for arg in "$@"; do
  case $arg in
    -h | --help)
      cat <<'EOF'
usage: deploy/run_tests.sh [-h|--help]

Installs the missing Debian packages (deploy/install_deps.sh), configures and
builds everything in BUILD_DIR, and runs every test but label container.

Environment:
  BUILD_DIR    the build tree [build]
  JOBS         compilers at once [nproc]; ctest gets two slots a core
               (2 * JOBS; tests/CMakeLists.txt, "scheduling")
  CTEST_ARGS   ctest's selection [-LE container], e.g. "-L unit"
EOF
      exit 0 ;;
    *) echo "run_tests: unknown argument \"$arg\" (it takes none; --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

# Each leg is timed (deploy/ci_legs.sh); the times are printed at the end,
# here or, when .ci/run set CI_TIMES, at the end of the whole CI run.
source deploy/ci_legs.sh
if [[ -z ${CI_TIMES:-} ]]; then
  CI_TIMES=$(mktemp)
  trap 'ci_report; rm -f "$CI_TIMES"' EXIT
fi

ci_leg install ./deploy/install_deps.sh
ci_leg configure cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
ci_leg build cmake --build "$build_dir" -j "$jobs"
# The container image build (label container, about 15 minutes) is a heavy
# leg run by hand: CTEST_ARGS="-L container" deploy/run_tests.sh. ctest
# gets two slots a core: a test holds two for each core it keeps busy and
# one when it mostly waits, and the slowest start first (PROCESSORS and
# COST, tests/CMakeLists.txt, "scheduling").
rc=0
# shellcheck disable=SC2086
ci_leg ctest ctest --test-dir "$build_dir" --output-on-failure -j $((2 * jobs)) \
  ${CTEST_ARGS:--LE container} 2>&1 | tee "$build_dir/ctest_output.log" || rc=$?
python3 deploy/ci_times.py ctest "$build_dir" "$build_dir/ctest_output.log" || true
# Why each failed test failed, printed again after the legs' table at the
# very end of the run (ci_report), where a truncated CI log still shows it.
if ((rc != 0)); then
  python3 deploy/ci_times.py failures "$build_dir/ctest_output.log" >>"$CI_TIMES.failures" || true
fi
exit $rc
