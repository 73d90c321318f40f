#!/usr/bin/env bash
# run-tests.sh - runs netns test executables as root on the current kernel (host or VM) after
# check-kernel.sh; used by netns-tests/run.
#
# usage: run-tests.sh [--jobs N] [--filter NAME]... -- EXE[:SECS]...
# A test runs if its name contains any NAME (libtest filters; all tests without --filter).
# An executable given with :SECS runs under that limit (timebox.py: on timeout it names the test
# in flight and prints the process tree, so a hung child shows what it waits for); the others
# go on, and one hang costs its own limit, not the whole run's. N executables run at once
# (default 2: the VM has 2 CPUs).
# Prints each executable's libtest output when it ends, then one summary line
#   "netns tests: N passed, M failed, K ignored on kernel V"
# and fails if a capability is missing, any test failed, no test ran, a NAME matched no test
# (a renamed test must not silently drop out of a tier), or any test was ignored (a netns test
# that does not run must not look like a pass).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FILTER=() JOBS=2
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) JOBS=${2:?--jobs needs a count}; shift 2;;
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

# Executables run --jobs at a time (default 2, the VM's CPUs), longest limit first so
# the long ones do not end up last; tests inside one executable run one at a time
# (--test-threads=1: a test's own namespaces, agents and timings stay its own). Under TCG one
# executable leaves the VM about half idle while its tests wait; two fill it. What two
# executables could share is named apart: namespaces carry the test process's pid, cgroups and
# bpffs pins the test's name. Each executable's output is printed whole when it ends (a block
# per executable, not interleaved lines), followed by "run-tests.sh: time SECONDS TEST" per test.
WORK=$(mktemp -d)
ORDER=()
while read -r _ k; do ORDER+=("$k"); done < <(for k in "${!EXES[@]}"; do echo "${LIMITS[$k]:-0} $k"; done | sort -rn -k1,1 -k2,2n)

# run_one K: executable K, output to $WORK/K.log, per-test times to $WORK/K.times; its status
# and time in $WORK/K.done.
run_one() {
  local k=$1 exe=${EXES[$1]} lim=${LIMITS[$1]:-86400} start st
  start=$EPOCHREALTIME
  "$HERE/timebox.py" -t "$lim" --ps --times "$WORK/$k.times" --label "run-tests.sh: $(basename "$exe")" -- \
    "$exe" --test-threads=1 "${FILTER[@]}" > "$WORK/$k.log" 2>&1
  st=$?
  echo "$st $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')" > "$WORK/$k.done"
}

passed=0 failed=0 ignored=0 rc=0
# report K: executable K's block, and its counts added up.
report() {
  local k=$1 exe st took p f i
  exe=$(basename "${EXES[$1]}")
  read -r st took < "$WORK/$k.done"
  echo "---- $exe ${FILTER[*]}"
  cat "$WORK/$k.log"
  [ "$st" != 124 ] || echo "run-tests.sh: $exe TIMED OUT after its ${LIMITS[$k]}s limit"
  [ ! -f "$WORK/$k.times" ] || awk '{ printf "run-tests.sh: time %s %s\n", $1, $2 }' "$WORK/$k.times"
  echo "---- $exe: ${took}s"
  [ "$st" = 0 ] || { rc=1; echo "run-tests.sh: $exe exited with status $st"; }
  # "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out; ..."
  read -r p f i < <(awk '/^test result:/ { for (k = 1; k <= NF; k++) {
      if ($(k+1) ~ /^passed/) p += $k; if ($(k+1) ~ /^failed/) f += $k; if ($(k+1) ~ /^ignored/) i += $k } }
    END { print p+0, f+0, i+0 }' "$WORK/$k.log")
  passed=$((passed + p)) failed=$((failed + f)) ignored=$((ignored + i))
}

declare -A RUNNING=()  # pid -> executable index
next=0
while [ "$next" -lt "${#ORDER[@]}" ] || [ "${#RUNNING[@]}" -gt 0 ]; do
  if [ "$next" -lt "${#ORDER[@]}" ] && [ "${#RUNNING[@]}" -lt "$JOBS" ]; then
    k=${ORDER[$next]} next=$((next + 1))
    run_one "$k" &
    RUNNING[$!]=$k
    echo "---- $(basename "${EXES[$k]}") started (${#RUNNING[@]} running)"
    continue
  fi
  wait -n -p done_pid "${!RUNNING[@]}"
  report "${RUNNING[$done_pid]}"
  unset "RUNNING[$done_pid]"
done
rm -rf "$WORK"
echo "netns tests: $passed passed, $failed failed, $ignored ignored on kernel $(uname -r)"
if [ $((passed + failed)) -eq 0 ]; then
  echo "run-tests.sh: FAIL: no netns test ran${FILTER:+ (filter '${FILTER[*]}' matched nothing)}"; rc=1
fi
if [ "$ignored" -gt 0 ]; then
  echo "run-tests.sh: FAIL: $ignored netns test(s) are #[ignore]d; netns tests must run"; rc=1
fi
exit $rc
