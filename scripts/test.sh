#!/usr/bin/env bash
# test.sh - THE test command: ./scripts/test.sh, as root on a Debian bookworm machine with a Rust
# toolchain (cargo, rustfmt, clippy). Idempotent: installs only what is missing.
#
# Tiers, in order, failing fast with the tier's name:
#   setup   netns-tests/vm/setup.sh (qemu, Debian kernels 6.1 + 6.12, nft, ip, ...)
#   fmt     cargo fmt --all --check
#   clippy  cargo clippy --workspace --all-targets -- -D warnings
#   unit    unit + integration tests of everything but the netns tests (cargo nextest if
#           installed, else cargo test), plus doc tests
#   netns   netns-tests/run --kernel 6.1 (all netns tests, in a VM unless the host can)
#   netns-6.12 netns-tests/run --kernel 6.12 with the tests that apply Lace's real ruleset
#              (three-node dataplane, nft element updates) besides smoke: newer kernels refuse
#              bytecode 6.1 accepts (nft_byteorder since 6.12.115)
#   datapath-6.1, datapath-6.12  tests/vm/datapath.sh in the VM on each kernel: golden plans
#              applied, real traffic
#   demo    scripts/demo.sh (the README's demo; fails if traffic differs from the policies)
#   charts  scripts/test-charts.sh
#   image   scripts/test-image.sh (builds the image with buildah + mmdebstrap, checks inside it)
# Then a table of tier timings and the total of tests passed/failed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

LOGDIR=$(mktemp -d /tmp/lace-test.XXXXXX)
trap 'rm -rf "$LOGDIR"' EXIT
TIERS=() TIMES=() PASSED=0 FAILED=0 COUNTS_OK=1 COUNT_NOTE=
T0=$EPOCHREALTIME
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", b-a}'; }

# tier NAME CMD... : banner, run with output teed to $LOGDIR/NAME.log, time it, fail fast.
tier() {
  local name=$1 start rc; shift
  echo
  echo "================================================================"
  echo "== tier $name: $*"
  echo "================================================================"
  start=$EPOCHREALTIME
  set +e
  "$@" 2>&1 | tee "$LOGDIR/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  TIERS+=("$name") TIMES+=("$(secs "$start" "$EPOCHREALTIME")")
  if [ "$rc" != 0 ]; then
    echo
    echo "test.sh: FAILED in tier '$name' (exit status $rc, after ${TIMES[-1]}s): $*"
    exit "$rc"
  fi
  echo "== tier $name passed in ${TIMES[-1]}s"
}

# Adds the passed/failed counts a tier printed to the totals.
#   libtest:  "test result: ok. 8 passed; 0 failed; ..."
#   nextest:  "Summary [   1.2s] 25 tests run: 25 passed, 0 skipped" (+ ", N failed")
#   netns:    "netns tests: 13 passed, 0 failed, 0 ignored on kernel ..."
#   charts:   a line "N passed, M failed"
count_libtest() {
  read -r p f < <(awk '/^test result:/ { for (k = 1; k < NF; k++) {
      if ($(k+1) ~ /^passed/) p += $k; if ($(k+1) ~ /^failed/) f += $k } } END { print p+0, f+0 }' "$1")
  PASSED=$((PASSED + p)) FAILED=$((FAILED + f))
}
count_nextest() {
  read -r p f < <(awk '/^ *Summary \[/ { for (k = 1; k < NF; k++) {
      if ($(k+1) ~ /^passed/) p = $k; if ($(k+1) ~ /^failed/) f = $k } } END { print p+0, f+0 }' "$1")
  PASSED=$((PASSED + p)) FAILED=$((FAILED + f))
}
count_netns() {
  read -r p f < <(awk '/^netns tests: / { p += $3; f += $5 } END { print p+0, f+0 }' "$1")
  PASSED=$((PASSED + p)) FAILED=$((FAILED + f))
}

# ---- setup
[ "$(id -u)" = 0 ] || { echo "test.sh: run as root (installs packages, runs netns tests)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "test.sh: cargo not found: install a Rust toolchain (rustup, https://rustup.rs) first" >&2; exit 1; }
for c in fmt clippy; do
  cargo "$c" --version >/dev/null 2>&1 || { echo "test.sh: 'cargo $c' missing: rustup component add $( [ $c = fmt ] && echo rustfmt || echo clippy )" >&2; exit 1; }
done
tier setup netns-tests/vm/setup.sh

# ---- static checks
tier fmt cargo fmt --all --check
tier clippy cargo clippy --workspace --all-targets -- -D warnings

# ---- unit tests (no root, no special kernel)
if cargo nextest --version >/dev/null 2>&1; then
  tier unit cargo nextest run --workspace --exclude lace-netns-tests --no-fail-fast --no-tests=warn
  count_nextest "$LOGDIR/unit.log"
else
  tier unit cargo test --workspace --exclude lace-netns-tests --lib --bins --tests
  count_libtest "$LOGDIR/unit.log"
fi
tier doc cargo test --workspace --exclude lace-netns-tests --doc
count_libtest "$LOGDIR/doc.log"

# ---- netns tests: real kernels
tier netns-6.1 netns-tests/run --kernel 6.1
count_netns "$LOGDIR/netns-6.1.log"
# Not the whole suite (time): smoke, plus the two tests that install the planner's nft ruleset
# and carry traffic through it. A filter that matches no test fails the tier.
tier netns-6.12 netns-tests/run --kernel 6.12 --filter smoke \
  --filter dataplane_three_nodes --filter nft_element_change
count_netns "$LOGDIR/netns-6.12.log"
# The planner's golden plans applied to namespaces with ip/nft, checked with real traffic
# (the only tier that sends Service traffic through the backend grants): on both kernels.
for k in 6.1 6.12; do
  tier datapath-$k netns-tests/vm/with-kernel.sh --kernel $k -t 900 -- bash tests/vm/datapath.sh
  read -r p f < <(awk '/^[0-9]+ passed, [0-9]+ failed$/ { p = $1; f = $3 } END { print p+0, f+0 }' "$LOGDIR/datapath-$k.log")
  PASSED=$((PASSED + p)) FAILED=$((FAILED + f))
done

# ---- the README's demo: 3 nodes, real agents, pods by the real CNI plugin, policy vs pings
tier demo scripts/demo.sh
read -r p f < <(awk '/^demo: [0-9]+ passed, [0-9]+ failed$/ { p = $2; f = $4 } END { print p+0, f+0 }' "$LOGDIR/demo.log")
PASSED=$((PASSED + p)) FAILED=$((FAILED + f))

# ---- charts (added by the charts work; run only when present)
if [ -f scripts/test-charts.sh ]; then
  tier charts bash scripts/test-charts.sh
  # pytest's closing line, e.g. "37 passed in 4.11s" (the tier passed, so nothing failed)
  n=$(grep -Eo '^[0-9]+ passed' "$LOGDIR/charts.log" | tail -1 | cut -d' ' -f1 || true)
  if [ -n "$n" ]; then
    PASSED=$((PASSED + n))
  else
    COUNTS_OK=0 COUNT_NOTE="scripts/test-charts.sh printed no pytest summary line"
  fi
fi

# ---- the image: built for real, checked from the inside (added by the image work)
tier image bash scripts/test-image.sh
n=$(grep -Eo '^[0-9]+ passed' "$LOGDIR/image.log" | tail -1 | cut -d' ' -f1 || true)
PASSED=$((PASSED + ${n:-0}))

# ---- summary
echo
echo "================================================================"
printf '%-14s %10s\n' tier seconds
for i in "${!TIERS[@]}"; do printf '%-14s %10s\n' "${TIERS[$i]}" "${TIMES[$i]}"; done
printf '%-14s %10s\n' total "$(secs "$T0" "$EPOCHREALTIME")"
echo "================================================================"
if [ "$COUNTS_OK" = 1 ]; then
  echo "$PASSED passed, $FAILED failed"
else
  echo "test.sh: all tiers passed; no overall test count ($COUNT_NOTE); see the tiers' 'test result:' lines"
fi
