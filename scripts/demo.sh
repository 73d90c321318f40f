#!/usr/bin/env bash
# demo.sh - THE demo command: installs what the demo needs (Debian packages, the stock kernel
# for the VM), builds lace-agent and the lace CNI plugin, then runs scripts/demo-body.sh as root
# on a kernel with VRF + SRv6: the host's if it has them, else a throw-away VM booting Debian's
# stock kernel (netns-tests/vm/with-kernel.sh).
#
# usage: scripts/demo.sh [--underlay ipv6|ipv4|ipv4-fou] [--kernel 6.1|6.12] [--host | --vm] [-t SECS]
#        scripts/demo.sh --cluster
#   --cluster            instead: a real Kubernetes cluster (tests/cluster/demo.sh: the test
#                        suite's cluster, Lace installed with helm as the README says, pods in
#                        two Networks, the matrix); LACE_DEMO_KEEP=1 keeps it up
#   --underlay ipv6      (default) the nodes' fabric carries IPv6 (and IPv4): SRv6 natively
#   --underlay ipv4      the nodes have IPv4 InternalIPs only and share the bridge, whose links
#                        keep IPv6 on (link-local addresses only, the kernel's default): SRv6
#                        natively over IPv6 with link-local next hops
#   --underlay ipv4-fou  the same with IPv6 disabled on every fabric link: SRv6 rides in UDP
#                        over IPv4 (lu-ipv4, fou)
#   -t SECS  limit of the demo's run (default: vm:demo in scripts/time-limits)
# env: LACE_BIN_DIR  a directory holding lace-agent and lace built from this checkout: used
#                    instead of building them (scripts/test.sh passes the ones its test build
#                    made)
set -euo pipefail
UNDERLAY=ipv6 ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --cluster) shift; [ $# = 0 ] || { echo "demo.sh: --cluster takes no other argument" >&2; exit 2; }
               cd "$(dirname "${BASH_SOURCE[0]}")/.." && netns-tests/vm/setup.sh && exec tests/cluster/demo.sh;;
    --underlay) UNDERLAY=${2:?--underlay needs ipv6, ipv4 or ipv4-fou}; shift 2;;
    *) ARGS+=("$1"); shift;;
  esac
done
case $UNDERLAY in ipv6|ipv4|ipv4-fou) ;; *) echo "demo.sh: --underlay must be ipv6, ipv4 or ipv4-fou, not $UNDERLAY" >&2; exit 2;; esac
export LACE_DEMO_UNDERLAY=$UNDERLAY
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=limits.sh
. scripts/limits.sh
[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (installs packages, creates namespaces)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "demo.sh: cargo not found: install a Rust toolchain (1.89+) first" >&2; exit 1; }
netns-tests/vm/setup.sh
if [ -n "${LACE_BIN_DIR:-}" ]; then
  BIN=$LACE_BIN_DIR
  echo "demo.sh: using lace-agent and lace from $BIN (LACE_BIN_DIR)" >&2
else
  echo "demo.sh: building lace-agent and the lace CNI plugin" >&2
  cargo build -q -p lace -p lace-cni --bins
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug
fi
export LACE_AGENT=$BIN/lace-agent LACE_CNI=$BIN/lace
for b in "$LACE_AGENT" "$LACE_CNI"; do
  [ -x "$b" ] || { echo "demo.sh: $b is missing or not executable" >&2; exit 1; }
done
LACE_VM_PASSENV="${LACE_VM_PASSENV:-} LACE_AGENT LACE_CNI LACE_DEMO_KEEP LACE_LOG LACE_DEMO_UNDERLAY" \
  exec netns-tests/vm/with-kernel.sh -t "$(limit_of vm:demo)" "${ARGS[@]}" -- scripts/demo-body.sh
