#!/usr/bin/env bash
# The main job on one machine: installs the Debian packages that are missing,
# builds the two daemons and asympo-eval, then runs one asympo-learner and two asympo-rollout
# daemons on loopback with the built-in tiny model and a synthetic task
# (deploy/local_run.py; its flags pass through, see --help), and at the end
# evaluates the last checkpoint on the task's held-out prompts.
#
#   deploy/local_run.sh                  # 4000 steps, about 5 minutes on 2 cores
#   deploy/local_run.sh --max_steps 2000 --task reverse --objective spo
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
  case $arg in
    -h | --help)
      cat <<'EOF'
usage: deploy/local_run.sh [local_run.py flags]

Installs the missing Debian packages (deploy/install_deps.sh), builds
asympo-learner, asympo-rollout and asympo-eval in BUILD_DIR [build], then runs
deploy/local_run.py with the flags given. Its flags:

EOF
      exec /usr/bin/python3 deploy/local_run.py --help ;;
  esac
done
deploy/install_deps.sh
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target asympo-learner asympo-rollout asympo-eval
exec /usr/bin/python3 deploy/local_run.py --build_dir "$build_dir" "$@"
