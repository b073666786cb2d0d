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
  JOBS         compilers and tests at once [nproc]
  CTEST_ARGS   ctest's selection [-LE container], e.g. "-L unit"
EOF
      exit 0 ;;
    *) echo "run_tests: unknown argument \"$arg\" (it takes none; --help)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

./deploy/install_deps.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build_dir" -j "$jobs"
# shellcheck disable=SC2086
# The container image build (label container, about 15 minutes) is a heavy
# leg run by hand: CTEST_ARGS="-L container" deploy/run_tests.sh.
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" ${CTEST_ARGS:--LE container}
