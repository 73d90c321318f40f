#!/usr/bin/env bash
# test.sh - THE test command: ./scripts/test.sh, as root on a Debian bookworm machine with a Rust
# toolchain (cargo, rustfmt, clippy). Idempotent: installs only what is missing.
#
# Tiers, in order, failing fast with the tier's name:
#   setup   netns-tests/vm/setup.sh (qemu, Debian kernels 6.1 + 6.12, nft, ip, ...)
#   fmt     cargo fmt --all --check
#   clippy  cargo clippy --workspace --all-targets -- -D warnings
#   unit    unit + integration tests of everything but the netns tests (cargo nextest if
#           installed, else cargo test); builds every test executable of the workspace, the
#           netns ones and the lace / lace-agent binaries included, so later tiers build nothing
#   doc     doc tests
#   netns-6.1  netns-tests/run --kernel 6.1: every netns test executable, in one VM (the
#              containerd one with crictl and a pause image built on the host first)
#   netns-6.12 netns-tests/run --kernel 6.12 with the tests that apply Lace's real ruleset
#              (three-node dataplane, nft element updates, NetworkPolicy, hostPorts) besides
#              smoke: newer
#              kernels refuse bytecode 6.1 accepts (nft_byteorder since 6.12.115)
#   demo    scripts/demo.sh (the README's demo; fails if traffic differs from the policies)
#   charts  scripts/test-charts.sh
#   image   scripts/test-image.sh (builds the image with buildah + mmdebstrap, checks inside it);
#           its release binaries are built in the background from the netns tiers on, at nice
#           19: under TCG the VMs leave CPU time idle while tests wait, and the build takes only
#           that (the image tier's own build then waits for cargo's lock until it ends: 154 s in
#           CI of dfca9ba, once the netns VMs ran two executables at a time and left less idle)
#   cluster tests/cluster/run.sh: a real Kubernetes cluster (control plane on this machine,
#           three nodes in the VM), Lace installed with helm as the README says, the checks of
#           tests/cluster/checks. Its components (Kubernetes, etcd, containerd, CoreDNS, from Go
#           modules; scripts/k8s-components.sh, cached by version outside the repository) are
#           built in the background from the start, at nice 19 like the release binaries
# Every tier runs under its time limit, `tier:NAME` in scripts/time-limits (a tier without
# one fails before anything runs); the netns tiers under the limits of their build and of each
# VM run (build:netns, netns:*). At the end (also after a failure): a table of each tier's time
# next to its limit (per VM run for the netns tiers), and the total of tests passed/failed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# shellcheck source=limits.sh
. scripts/limits.sh
TIMEBOX=$ROOT/netns-tests/vm/timebox.py

LOGDIR=$(mktemp -d /tmp/lace-test.XXXXXX)
ROWS=() PASSED=0 FAILED=0 COUNTS_OK=1 COUNT_NOTE= DONE=0
T0=$EPOCHREALTIME
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", b-a}'; }

# row NAME SECONDS LIMIT: one line of the closing table.
row() { ROWS+=("$1|$2|$3"); }

summary() {
  local r name took limit mark total_limit=0
  echo
  echo "================================================================"
  printf '%-16s %9s %7s %5s\n' tier seconds limit used
  for r in "${ROWS[@]}"; do
    IFS='|' read -r name took limit <<< "$r"
    mark=
    if [ -n "$limit" ] && [ "$limit" != - ]; then
      used=$(awk -v t="$took" -v l="$limit" 'BEGIN{printf "%d%%", 100 * t / l}')
      # A run that needs more than half its limit fails on the next busy day.
      awk -v t="$took" -v l="$limit" 'BEGIN{exit !(t > l / 2)}' &&
        mark="  MORE THAN HALF: raise it in scripts/time-limits (2x the time measured here)"
      case $name in "  "*) ;; *) total_limit=$((total_limit + limit));; esac
    else
      used=
    fi
    printf '%-16s %9s %7s %5s%s\n' "$name" "$took" "$limit" "$used" "$mark"
  done
  printf '%-16s %9s %7s\n' total "$(secs "$T0" "$EPOCHREALTIME")" "$total_limit"
  echo "================================================================"
}

finish() {
  local rc=$?
  # The background release build, if still running (a tier failed first): its whole session.
  [ -z "${IMAGE_BUILD_PID:-}" ] || kill -- -"$IMAGE_BUILD_PID" 2>/dev/null || true
  [ -z "${K8S_BUILD_PID:-}" ] || kill -- -"$K8S_BUILD_PID" 2>/dev/null || true
  summary
  if [ "$DONE" = 1 ]; then
    if [ "$COUNTS_OK" = 1 ]; then
      echo "$PASSED passed, $FAILED failed"
    else
      echo "test.sh: all tiers passed; no overall test count ($COUNT_NOTE); see the tiers' 'test result:' lines"
    fi
  fi
  rm -rf "$LOGDIR"
  exit "$rc"
}

banner() {
  echo
  echo "================================================================"
  echo "== tier $*"
  echo "================================================================"
}

# tier NAME CMD... : banner, run CMD under tier:NAME's limit with output teed to
# $LOGDIR/NAME.log, time it, fail fast.
tier() {
  local name=$1 limit start rc took; shift
  limit=$(limit_of "tier:$name")
  banner "$name (limit ${limit}s): $*"
  start=$EPOCHREALTIME
  set +e
  "$TIMEBOX" -t "$limit" --label "test.sh: tier $name" -- "$@" 2>&1 | tee "$LOGDIR/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  took=$(secs "$start" "$EPOCHREALTIME")
  row "$name" "$took" "$limit"
  if [ "$rc" != 0 ]; then
    echo
    echo "test.sh: FAILED in tier '$name' (exit status $rc, after ${took}s of its ${limit}s limit): $*"
    exit "$rc"
  fi
  echo "== tier $name passed in ${took}s (limit ${limit}s)"
}

# netns_tier NAME ARGS... : netns-tests/run ARGS as tier NAME. Its limit is that of its build
# and of each VM run (netns-tests/run enforces them, and adds them up); the table shows them.
netns_tier() {
  local name=$1 start rc took limit; shift
  banner "$name: netns-tests/run $*"
  start=$EPOCHREALTIME
  set +e
  netns-tests/run "$@" 2>&1 | tee "$LOGDIR/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  took=$(secs "$start" "$EPOCHREALTIME")
  limit=$(sed -n 's/^netns-tests\/run: the whole run took .* of its \([0-9]*\)s limit.*/\1/p' "$LOGDIR/$name.log")
  row "$name" "$took" "${limit:--}"
  # "netns-tests/run: cni took 180.3s of its 900s limit: passed"
  while read -r part ptook plimit; do
    row "  $part" "$ptook" "$plimit"
  done < <(sed -n 's/^netns-tests\/run: \([^ ]*\) took \([0-9.]*\)s of its \([0-9]*\)s limit.*/\1 \2 \3/p' "$LOGDIR/$name.log")
  if [ "$rc" != 0 ]; then
    echo
    echo "test.sh: FAILED in tier '$name' (exit status $rc, after ${took}s): netns-tests/run $*"
    exit "$rc"
  fi
  echo "== tier $name passed in ${took}s${limit:+ (limit ${limit}s)}"
}

# Adds the passed/failed counts a tier printed to the totals.
#   libtest:  "test result: ok. 8 passed; 0 failed; ..."
#   nextest:  "Summary [   1.2s] 25 tests run: 25 passed, 0 skipped" (+ ", N failed")
#   netns:    "netns tests: 13 passed, 0 failed, 0 ignored on kernel ..." (one per VM run)
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

# ---- preconditions; every tier below has a limit (checked now, not when the tier is reached)
[ "$(id -u)" = 0 ] || { echo "test.sh: run as root (installs packages, runs netns tests)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "test.sh: cargo not found: install a Rust toolchain (rustup, https://rustup.rs) first" >&2; exit 1; }
for c in fmt clippy; do
  cargo "$c" --version >/dev/null 2>&1 || { echo "test.sh: 'cargo $c' missing: rustup component add $( [ $c = fmt ] && echo rustfmt || echo clippy )" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "test.sh: python3 missing (apt-get install python3)" >&2; exit 1; }
command -v go >/dev/null || [ -x /usr/local/go/bin/go ] ||
  { echo "test.sh: Go not found (go in PATH or /usr/local/go/bin): install Go 1.26 or newer; the netns tier builds crictl from its Go module (scripts/k8s-components.sh)" >&2; exit 1; }
for name in $(sed -n 's/^ *tier \([A-Za-z0-9._-]*\) .*/\1/p' "${BASH_SOURCE[0]}"); do
  limit_of "tier:$name" >/dev/null || { echo "test.sh: tier '$name' has no time limit (see above)" >&2; exit 1; }
done
trap finish EXIT

# ---- cargo's outputs outside the clone, kept between runs like the Go components: a fresh clone
# then compiles its own five crates, not the ~400 dependencies (debug and release). The
# workspace's own artifacts are cleaned first (a fresh clone rebuilds them anyway), so the cache
# holds one copy of them, not one per clone. One run at a time owns it; a run that finds it
# taken builds in the clone. A CARGO_TARGET_DIR of the caller's is used as it is.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  CARGO_CACHE=${LACE_CARGO_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lace-cargo}
  mkdir -p "$CARGO_CACHE"
  exec 8>"$CARGO_CACHE/.lock"
  if flock -n 8; then
    export CARGO_TARGET_DIR=$CARGO_CACHE/target
    cargo clean --quiet -p lace -p lace-cni -p lace-controller -p lace-fake-kube -p lace-netns-tests
    echo "test.sh: cargo builds into $CARGO_TARGET_DIR ($(du -sh "$CARGO_TARGET_DIR" 2>/dev/null | cut -f1 || echo empty))"
  else
    exec 8>&-
    echo "test.sh: $CARGO_CACHE is in use by another test.sh run: building in the clone"
  fi
fi

tier setup netns-tests/vm/setup.sh

# ---- the real cluster's components and images, in the background from now on (see the
# header): a first build takes ~12 minutes of two cores, a cached one a second. The cluster tier
# waits for it (each component's build holds a lock).
setsid nice -n 19 bash -c '{ echo 19 > /proc/self/autogroup; } 2>/dev/null
  { scripts/k8s-components.sh kubernetes etcd containerd crictl coredns pause e2e && tests/cluster/images.sh; } > "$1" 2>&1; echo "$? $EPOCHREALTIME" > "$2"' \
  k8s-components "$LOGDIR/k8s-components.log" "$LOGDIR/k8s-components.done" &
K8S_BUILD_PID=$! K8S_BUILD_START=$EPOCHREALTIME

# ---- static checks
tier fmt cargo fmt --all --check
tier clippy cargo clippy --workspace --all-targets -- -D warnings

# ---- unit tests (no root, no special kernel). Both build the whole workspace's tests (the
# netns executables too): one build, which every later tier reuses.
if cargo nextest --version >/dev/null 2>&1; then
  tier unit cargo nextest run --workspace -E 'not package(lace-netns-tests)' --no-fail-fast --no-tests=warn
  count_nextest "$LOGDIR/unit.log"
else
  tier unit sh -c 'cargo test --workspace --no-run && cargo test --workspace --exclude lace-netns-tests --lib --bins --tests'
  count_libtest "$LOGDIR/unit.log"
fi
tier doc cargo test --workspace --exclude lace-netns-tests --doc
count_libtest "$LOGDIR/doc.log"
# The demo and the chart tests run the binaries that build made (another `cargo build` of them
# would resolve features without the dev-dependencies: a second build of half the tree).
export LACE_BIN_DIR=${CARGO_TARGET_DIR:-$ROOT/target}/debug

# ---- the image's release binaries, in the background (see the header); the image tier's
# row is followed by this build's own time. Its own session is its own scheduler autogroup where
# the kernel has them (as is each tier's, under timebox.py), and nice counts only inside a
# group: the group itself is lowered too, or the build would take half the CPUs from the VMs.
setsid nice -n 19 bash -c '{ echo 19 > /proc/self/autogroup; } 2>/dev/null
  scripts/image-parts.sh binaries amd64 "$1" > "$2" 2>&1; echo "$? $EPOCHREALTIME" > "$3"' \
  image-binaries "$LOGDIR/image-binaries" "$LOGDIR/image-binaries.log" "$LOGDIR/image-binaries.done" &
IMAGE_BUILD_PID=$! IMAGE_BUILD_START=$EPOCHREALTIME

# ---- netns tests: real kernels
netns_tier netns-6.1 --kernel 6.1
count_netns "$LOGDIR/netns-6.1.log"
# Not the whole suite (time): smoke, plus the tests that install the planner's nft ruleset and
# carry traffic through it (NetworkPolicy's sets and rules in the third, hostPorts' DNAT in the
# fourth: 6.12 looks a VRF slave's `fib daddr type` up in the VRF, which 6.1 does not). A filter that
# matches no test fails the tier.
netns_tier netns-6.12 --kernel 6.12 --filter smoke --filter dataplane_three_nodes --filter nft_element_change --filter network_policies_deny_all --filter host_ports_from_outside
count_netns "$LOGDIR/netns-6.12.log"

# ---- the README's demo: 3 nodes, real agents, pods by the real CNI plugin, policy vs pings
tier demo scripts/demo.sh
read -r p f < <(awk '/^demo: [0-9]+ passed, [0-9]+ failed$/ { p = $2; f = $4 } END { print p+0, f+0 }' "$LOGDIR/demo.log")
PASSED=$((PASSED + p)) FAILED=$((FAILED + f))

# ---- charts
tier charts bash scripts/test-charts.sh
# pytest's closing line, e.g. "37 passed in 4.11s" (the tier passed, so nothing failed)
n=$(grep -Eo '^[0-9]+ passed' "$LOGDIR/charts.log" | tail -1 | cut -d' ' -f1 || true)
if [ -n "$n" ]; then
  PASSED=$((PASSED + n))
else
  COUNTS_OK=0 COUNT_NOTE="scripts/test-charts.sh printed no pytest summary line"
fi

# ---- the image: built for real, checked from the inside
tier image bash scripts/test-image.sh
if [ -f "$LOGDIR/image-binaries.done" ] && read -r brc bend < "$LOGDIR/image-binaries.done"; then
  row "  binaries (bg)" "$(secs "$IMAGE_BUILD_START" "$bend")" -
  if [ "$brc" != 0 ]; then
    # The image tier built them itself and passed: worth seeing, not a failure.
    echo "test.sh: the background release build failed (exit $brc); its log ends:"
    tail -20 "$LOGDIR/image-binaries.log"
  fi
fi
n=$(grep -Eo '^[0-9]+ passed' "$LOGDIR/image.log" | tail -1 | cut -d' ' -f1 || true)
PASSED=$((PASSED + ${n:-0}))

# ---- Lace in a real Kubernetes cluster, installed with helm from the image just built
tier cluster tests/cluster/run.sh
if [ -f "$LOGDIR/k8s-components.done" ] && read -r krc kend < "$LOGDIR/k8s-components.done"; then
  row "  components (bg)" "$(secs "$K8S_BUILD_START" "$kend")" -
  [ "$krc" = 0 ] || { echo "test.sh: the background component build failed (exit $krc); its log ends:"; tail -20 "$LOGDIR/k8s-components.log"; }
fi
n=$(grep -Eo '[0-9]+ passed' "$LOGDIR/cluster.log" | tail -1 | cut -d' ' -f1 || true)
PASSED=$((PASSED + ${n:-0}))
DONE=1
