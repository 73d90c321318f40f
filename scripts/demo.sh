#!/usr/bin/env bash
# demo.sh - THE demo command: installs what the demo needs (Debian packages, the stock kernel
# for the VM), builds lace-agent and the lace CNI plugin, then runs scripts/demo-body.sh as root
# on a kernel with VRF + SRv6: the host's if it has them, else a throw-away VM booting Debian's
# stock kernel (netns-tests/vm/with-kernel.sh).
#
# usage: scripts/demo.sh [--kernel 6.1|6.12] [--host | --vm] [-t SECS (VM limit, default 1500)]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (installs packages, creates namespaces)" >&2; exit 1; }
command -v cargo >/dev/null || { echo "demo.sh: cargo not found: install a Rust toolchain (1.89+) first" >&2; exit 1; }
netns-tests/vm/setup.sh
echo "demo.sh: building lace-agent and the lace CNI plugin" >&2
cargo build -q -p lace -p lace-cni --bins
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
export LACE_AGENT=$TARGET_DIR/debug/lace-agent LACE_CNI=$TARGET_DIR/debug/lace
LACE_VM_PASSENV="${LACE_VM_PASSENV:-} LACE_AGENT LACE_CNI LACE_DEMO_KEEP LACE_LOG" \
  exec netns-tests/vm/with-kernel.sh -t 1500 "$@" -- scripts/demo-body.sh
