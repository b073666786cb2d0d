#!/usr/bin/env bash
# Every script under deploy/ answers --help and -h with its usage and exits 0
# without installing or building anything: each runs from a copy of deploy/
# in a temporary folder, with every installer, build tool and container tool
# on the PATH replaced by a stub that records its call and fails. A script
# passes when it exits 0, prints a "usage:" line naming itself, no stub was
# called and the copy is unchanged (no build tree, download folder or cache
# written beside it). A control run of deploy/run_tests.sh without --help
# must call a stub, so the check cannot pass because the stubs are never
# reached.
#
#   script_help_test.sh SOURCE_DIR
set -uo pipefail
src=${1:?usage: script_help_test.sh SOURCE_DIR}
fail() { echo "FAIL: $*"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/asympo-script-help.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/deploy" "$tmp/deploy"
mkdir "$tmp/stubs"
calls=$tmp/stub-calls
for tool in apt apt-get aptitude dpkg dpkg-query sudo cmake ninja make ctest cc c++ gcc g++ \
            clang clang++ clang-14 nvcc podman docker buildah debootstrap pip pip3 npm npx \
            kubectl sbatch srun scancel nvidia-smi; do
  printf '#!/bin/sh\necho "%s $*" >>"%s"\nexit 97\n' "$tool" "$calls" >"$tmp/stubs/$tool"
  chmod +x "$tmp/stubs/$tool"
done
export PATH=$tmp/stubs:$PATH PYTHONDONTWRITEBYTECODE=1
# A CI run's leg file (deploy/ci_legs.sh) is the CI run's: the control run's
# stubbed legs must not land in its table.
unset CI_TIMES
# Every path and file checksum of the temporary folder but the stubs'.
snapshot() {
  (cd "$tmp" && find . -path ./stubs -prune -o -path ./stub-calls -prune -o -print | sort &&
     find . -path ./stubs -prune -o -type f -print0 | sort -z | xargs -0 md5sum)
}

mapfile -t scripts < <(cd "$tmp" && find deploy -type f \
  \( -name '*.sh' -o -name '*.py' -o -name '*.sbatch' \) | sort)
((${#scripts[@]} >= 10)) || fail "found only ${#scripts[@]} scripts under deploy/"
before=$(snapshot)
for script in "${scripts[@]}"; do
  name=${script##*/}
  runner=(bash)
  [[ $name != *.py ]] || runner=(/usr/bin/python3)
  [[ $script != deploy/kubernetes/base/learner-probe.sh ]] || runner=(sh)
  for flag in --help -h; do
    rm -f "$calls"
    out=$(cd "$tmp" && timeout 60 "${runner[@]}" "$script" "$flag" 2>"$tmp/stubs/stderr")
    rc=$?
    ((rc == 0)) || fail "$script $flag exits $rc: $(head -c 600 "$tmp/stubs/stderr")"
    [[ ! -s $calls ]] || fail "$script $flag ran $(tr '\n' ';' <"$calls") before answering"
    grep -q "^usage: .*$name" <<<"$out" ||
      fail "$script $flag prints no \"usage: ... $name\" line: $(head -c 300 <<<"$out")"
    [[ $(snapshot) == "$before" ]] ||
      fail "$script $flag wrote beside itself: $(diff <(echo "$before") <(snapshot) | head -n 5)"
  done
  echo "ok: $script --help, -h ($(wc -l <<<"$out") lines)"
done

# The control: without --help the test command installs and builds first,
# which the stubs record.
rm -f "$calls"
(cd "$tmp" && timeout 60 bash deploy/run_tests.sh >/dev/null 2>&1)
[[ -s $calls ]] || fail "the control run of deploy/run_tests.sh called no stub"
echo "control: deploy/run_tests.sh without --help ran $(head -n 1 "$calls" | cut -d' ' -f1) first"
echo "PASS: ${#scripts[@]} scripts answer --help and -h without installing or building"
