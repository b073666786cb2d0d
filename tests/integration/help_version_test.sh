#!/usr/bin/env bash
# A program's --help and --version, as an operator meets them: both exit 0
# and print to stdout; --help names the program once, lists its flags with
# their defaults, hides the test-only flags (--fault_*) and shows no source
# or build path, and lists every flag its source files define (a program
# whose flags live in several files lists them all); --version gives the
# project's version and the build.
#
#   help_version_test.sh BINARY PROJECT_VERSION SOURCE_DIR BUILD_DIR [FLAG_FILE...]
set -uo pipefail
bin=$1 version=$2 src=$3 build=$4
shift 4
name=$(basename "$bin")
fail() { echo "FAIL: $name: $*"; exit 1; }

help=$("$bin" --help 2>/dev/null) || fail "--help exits $?"
[[ $(head -n 1 <<<"$help") == "$name: "* ]] || fail "--help starts with \"$name: \""
grep -q "$name: $name" <<<"$help" && fail "--help names the program twice"
grep -q -- "--fault_" <<<"$help" && fail "--help lists a test-only flag"
grep -qF "$src" <<<"$help" && fail "--help shows the source path $src"
grep -qF "$build" <<<"$help" && fail "--help shows the build path $build"
grep -q "\.cc" <<<"$help" && fail "--help names a source file"
grep -q "(default: " <<<"$help" || fail "--help gives the defaults"
[[ $("$bin" -h 2>/dev/null) == "$help" ]] || fail "-h differs from --help"
for file in "$@"; do
  defined=$(tr '\n' ' ' <"$src/$file" | grep -o 'ABSL_FLAG( *[^,]*, *[a-z0-9_]*' | sed 's/.*, *//' |
    grep -v '^fault_')
  [[ -n $defined ]] || fail "$file defines no flag"
  for flag in $defined; do
    grep -q -- "^  --$flag " <<<"$help" || fail "--help lacks --$flag (defined in $file)"
  done
done

v=$("$bin" --version 2>/dev/null) || fail "--version exits $?"
[[ $v == "$name $version (ASymPO-RL, "*")" ]] || fail "--version says \"$v\""
grep -qi "debug" <<<"$v" && fail "--version says debug: \"$v\""
echo "PASS: $name --help and --version"
