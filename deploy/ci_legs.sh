# The legs of a test run, timed (sourced by deploy/run_tests.sh,
# deploy/run_sanitizers.sh, deploy/run_fuzz.sh and .ci/run). With CI_TIMES
# set to a file, each leg appends "name<TAB>seconds<TAB>result" to it and
# ci_report prints them all; without it, legs run untimed.
#
#   ci_leg NAME COMMAND...   runs COMMAND; its exit status is the leg's
#   ci_report                the table of $CI_TIMES (wall time per leg), then
#                            $CI_TIMES.failures (failed tests and why), if any

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then  # run rather than sourced
  case ${1:-} in
    -h | --help)
      echo "usage: source deploy/ci_legs.sh   (then: ci_leg NAME COMMAND...; ci_report)"
      sed -n '1,8s/^# \{0,1\}//p' "$0"
      exit 0 ;;
  esac
  echo "ci_legs.sh defines functions for other scripts to source; --help says which" >&2
  exit 2
fi

ci_leg() {
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  if [[ -n ${CI_TIMES:-} ]]; then
    printf '%s\t%d\t%s\n' "$name" $((SECONDS - start)) \
      "$([[ $rc == 0 ]] && echo ok || echo "failed (exit $rc)")" >>"$CI_TIMES"
  fi
  return $rc
}

ci_report() {
  [[ -n ${CI_TIMES:-} && -s $CI_TIMES ]] || return 0
  echo "== legs of this run (wall time) =="
  awk -F'\t' '{ printf "  %-28s %4dm%02ds  %s\n", $1, $2 / 60, $2 % 60, $3; total += $2 }
    END { printf "  %-28s %4dm%02ds\n", "total", total / 60, total % 60 }' "$CI_TIMES"
  if [[ -s $CI_TIMES.failures ]]; then
    echo "== failed tests, and why (the FAIL lines of their output) =="
    cat "$CI_TIMES.failures"
  fi
  rm -f "$CI_TIMES.failures"
}
