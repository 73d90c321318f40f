#!/usr/bin/env bash
# demo.sh - THE demo command: builds what the demo needs on the host, then runs
# scripts/demo-body.sh as root on a kernel with VRF + SRv6: the host's if it has them, else a
# throw-away VM booting a stock Debian kernel (netns-tests/vm/with-kernel.sh).
#
# usage: scripts/demo.sh [--kernel 6.1|6.12] [--host | --vm]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
command -v cargo >/dev/null || { echo "demo.sh: cargo not found in PATH" >&2; exit 1; }
echo "demo.sh: building lace-netns-bed" >&2
cargo build -q -p lace-netns-tests --bin lace-netns-bed
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
export LACE_BED_BIN=$TARGET_DIR/debug/lace-netns-bed
LACE_VM_PASSENV="${LACE_VM_PASSENV:-} LACE_BED_BIN" exec netns-tests/vm/with-kernel.sh "$@" -- scripts/demo-body.sh
