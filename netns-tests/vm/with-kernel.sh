#!/usr/bin/env bash
# with-kernel.sh - runs a command as root on a kernel that can run Lace's netns tests:
# on the host when its kernel passes check-kernel.sh (probed in a throw-away namespace),
# otherwise in a throw-away VM (vmrun.sh) sharing the repository (and an out-of-tree cargo
# target dir) read-write. Used by netns-tests/run and scripts/demo.sh.
#
# usage: with-kernel.sh [--kernel K] [--host | --vm] [-t SECS] [-m MEM] -- CMD [ARG...]
#   --kernel K  VM kernel: 6.1 | 6.12 | full version; implies --vm (default $LACE_VM_KERNEL or 6.1)
#   --host      run on the host, fail if its kernel lacks a capability
#   --vm        use the VM even if the host kernel could run CMD
#   -t SECS     hard time limit of the run, VM or host (default 600)
#   -m MEM      the VM's memory (vmrun.sh's default 2G)
# exit: CMD's status (124 timeout: the line before names the running test; 125 VM died).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
say() { echo "with-kernel: $*" >&2; }

KERNEL=${LACE_VM_KERNEL:-6.1} MODE=auto TIMEOUT=600 MEM=()
while [ $# -gt 0 ]; do
  case $1 in
    --kernel) KERNEL=${2:?--kernel needs a value}; MODE=vm; shift 2;;
    --host) MODE=host; shift;;
    --vm) MODE=vm; shift;;
    -t) TIMEOUT=${2:?-t needs seconds}; shift 2;;
    -m) MEM=(-m "${2:?-m needs a size}"); shift 2;;
    --) shift; break;;
    *) say "unknown argument: $1"; exit 2;;
  esac
done
[ $# -gt 0 ] || { say "no command given"; exit 2; }

if [ "$MODE" = auto ]; then
  if [ "$(id -u)" = 0 ] && "$HERE/check-kernel.sh" -q; then
    MODE=host; say "host kernel $(uname -r) has VRF + seg6local: running on the host"
  else
    MODE=vm; say "host kernel $(uname -r) cannot run netns tests (or not root): using a VM with kernel $KERNEL"
  fi
fi
if [ "$MODE" = host ]; then
  [ "$(id -u)" = 0 ] || { say "running on the host needs root"; exit 1; }
  exec "$HERE/timebox.py" -t "$TIMEOUT" --label "with-kernel (host kernel $(uname -r))" -- "$@"
fi
SHARE=(-w "$ROOT")
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case $(realpath -m "$TARGET_DIR")/ in "$ROOT"/*) ;; *) [ ! -d "$TARGET_DIR" ] || SHARE+=(-w "$TARGET_DIR");; esac
exec "$HERE/vmrun.sh" --kernel "$KERNEL" -t "$TIMEOUT" "${MEM[@]}" "${SHARE[@]}" -- "$@"
