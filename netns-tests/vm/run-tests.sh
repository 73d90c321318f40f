#!/usr/bin/env bash
# run-tests.sh - runs netns test executables as root on the current kernel (host or VM) after
# check-kernel.sh; used by netns-tests/run.
#
# usage: run-tests.sh [--filter NAME] -- EXE...
# Prints each executable's libtest output, then one summary line
#   "netns tests: N passed, M failed, K ignored on kernel V"
# and fails if a capability is missing, any test failed, no test ran, or any test was ignored
# (a netns test that does not run must not look like a pass).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FILTER=()
while [ $# -gt 0 ]; do
  case $1 in
    --filter) FILTER=("$2"); shift 2;;
    --) shift; break;;
    *) break;;
  esac
done
[ $# -gt 0 ] || { echo "run-tests.sh: no test executables given" >&2; exit 2; }

"$HERE/check-kernel.sh" || { echo "run-tests.sh: kernel $(uname -r) cannot run the netns tests (see MISSING above)"; exit 1; }

passed=0 failed=0 ignored=0 rc=0
log=$(mktemp)
for exe in "$@"; do
  echo "---- $(basename "$exe") ${FILTER[*]}"
  "$exe" "${FILTER[@]}" 2>&1 | tee "$log"
  st=${PIPESTATUS[0]}
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
