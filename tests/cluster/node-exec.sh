#!/usr/bin/env bash
# node-exec.sh WORK NODE CMD... - runs CMD as root on NODE of a running test cluster (the
# cluster's work directory WORK, printed by tests/cluster/cluster.sh), in the node's network
# namespace inside the VM: how to look at a node's `ip` and `nft` state.
set -euo pipefail
# shellcheck source=cluster.sh
. "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
CLUSTER_WORK=${1:?usage: node-exec.sh WORK NODE CMD...}
node=${2:?usage: node-exec.sh WORK NODE CMD...}
shift 2
[ $# -gt 0 ] || { echo "node-exec: no command given" >&2; exit 2; }
in_vm "ip netns exec $(printf %q "$node") $(printf ' %q' "$@")"
