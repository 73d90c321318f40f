#!/usr/bin/env bash
# run-tests.sh - runs netns test executables as root on the current kernel (host or VM) after
# check-kernel.sh; used by netns-tests/run.
#
# usage: run-tests.sh [--filter NAME]... -- EXE[:SECS]...
# A test runs if its name contains any NAME (libtest filters; all tests without --filter).
# An executable given with :SECS runs under that limit (timebox.py: on timeout it names the test
# in flight and prints the process tree, so a hung child shows what it waits for); then the
# next executable runs, and one hang costs its own limit, not the whole run's.
# Prints each executable's libtest output, then one summary line
#   "netns tests: N passed, M failed, K ignored on kernel V"
# and fails if a capability is missing, any test failed, no test ran, a NAME matched no test
# (a renamed test must not silently drop out of a tier), or any test was ignored (a netns test
# that does not run must not look like a pass).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FILTER=()
while [ $# -gt 0 ]; do
  case $1 in
    --filter) FILTER+=("${2:?--filter needs a test name}"); shift 2;;
    --) shift; break;;
    *) break;;
  esac
done
[ $# -gt 0 ] || { echo "run-tests.sh: no test executables given" >&2; exit 2; }

EXES=() LIMITS=()
for arg in "$@"; do
  if [[ $arg == *:* ]]; then EXES+=("${arg%:*}") LIMITS+=("${arg##*:}"); else EXES+=("$arg") LIMITS+=(""); fi
done

for f in "${FILTER[@]}"; do
  n=0
  for exe in "${EXES[@]}"; do
    n=$((n + $("$exe" --list --format terse "$f" | grep -c ': test$')))
  done
  [ "$n" -gt 0 ] || { echo "run-tests.sh: FAIL: --filter '$f' matches no test"; exit 1; }
done

"$HERE/check-kernel.sh" || { echo "run-tests.sh: kernel $(uname -r) cannot run the netns tests (see MISSING above)"; exit 1; }

passed=0 failed=0 ignored=0 rc=0
log=$(mktemp)
for k in "${!EXES[@]}"; do
  exe=${EXES[$k]} lim=${LIMITS[$k]}
  echo "---- $(basename "$exe") ${FILTER[*]}"
  start=$EPOCHREALTIME
  # One test at a time: netns tests share host-global kernel state (cgroups, bpffs pins,
  # the VM's 2 CPUs), and under emulation parallel tests only trade speed for flakiness.
  run=("$exe" --test-threads=1 "${FILTER[@]}")
  [ -z "$lim" ] || run=("$HERE/timebox.py" -t "$lim" --ps --label "run-tests.sh: $(basename "$exe")" -- "${run[@]}")
  "${run[@]}" 2>&1 | tee "$log"
  st=${PIPESTATUS[0]}
  [ "$st" != 124 ] || [ -z "$lim" ] || echo "run-tests.sh: $(basename "$exe") TIMED OUT after its ${lim}s limit"
  awk -v a="$start" -v b="$EPOCHREALTIME" -v e="$(basename "$exe")" 'BEGIN{printf "---- %s: %.1fs\n", e, b-a}'
  [ "$st" = 0 ] || { rc=1; echo "run-tests.sh: $(basename "$exe") exited with status $st"; }
  # "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out; ..."
  read -r p f i < <(awk '/^test result:/ { for (k = 1; k <= NF; k++) {
      if ($(k+1) ~ /^passed/) p += $k; if ($(k+1) ~ /^failed/) f += $k; if ($(k+1) ~ /^ignored/) i += $k } }
    END { print p+0, f+0, i+0 }' "$log")
  passed=$((passed + p)) failed=$((failed + f)) ignored=$((ignored + i))
done
rm -f "$log"
echo "netns tests: $passed passed, $failed failed, $ignored ignored on kernel $(uname -r)"
if [ $((passed + failed)) -eq 0 ]; then
  echo "run-tests.sh: FAIL: no netns test ran${FILTER:+ (filter '${FILTER[*]}' matched nothing)}"; rc=1
fi
if [ "$ignored" -gt 0 ]; then
  echo "run-tests.sh: FAIL: $ignored netns test(s) are #[ignore]d; netns tests must run"; rc=1
fi
exit $rc
