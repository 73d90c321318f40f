#!/usr/bin/env bash
# netns-tests/bench-cni.sh - the CNI latency benchmark (netns-tests/benches/cni_latency.rs):
# builds `lace` and `lace-agent` as the image ships them (scripts/image-parts.sh) and the bench
# on the host, runs it as root on a kernel with VRF (the host's if capable, else the VM) and
# prints its table: ADD/DEL p50/p99 of Lace, ptp + host-local and bridge + host-local (Debian's
# containernetworking-plugins, from /usr/lib/cni: netns-tests/vm/setup.sh installs them),
# sequential and concurrent, each plugin's bare start (VERSION p50), and the agent's memory.
# Not part of scripts/test.sh.
#
# usage: netns-tests/bench-cni.sh [--pods N] [--concurrent N] [--rss-pods N]
#                                 [--plugins lace,ptp,bridge] [--before DIR]
#                                 [with-kernel.sh options...]
#   --pods        sequential pods per plugin (default 200)
#   --concurrent  pods added at once per plugin (default 50)
#   --rss-pods    pods attached to Lace for the agent's memory reading (default 500)
#   --plugins     which plugins to measure (default lace,ptp,bridge)
#   --before DIR  also measure the `lace` and `lace-agent` in DIR (an older build, e.g. the
#                 usr/local/bin of an earlier `scripts/image-parts.sh binaries`) as
#                 "lace (before)"
#   e.g. netns-tests/bench-cni.sh --pods 50 --concurrent 10 --rss-pods 100 -t 900
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENVS=() WITH=()
while [ $# -gt 0 ]; do
  case $1 in
    --pods) ENVS+=("LACE_BENCH_PODS=${2:?--pods needs a number}"); shift 2;;
    --concurrent) ENVS+=("LACE_BENCH_CONCURRENT=${2:?--concurrent needs a number}"); shift 2;;
    --rss-pods) ENVS+=("LACE_BENCH_RSS_PODS=${2:?--rss-pods needs a number}"); shift 2;;
    --plugins) ENVS+=("LACE_BENCH_PLUGINS=${2:?--plugins needs a list}"); shift 2;;
    --before) ENVS+=("LACE_BENCH_BEFORE_DIR=$(realpath "${2:?--before needs a directory}")"); shift 2;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) WITH+=("$1"); shift;;
  esac
done
cd "$ROOT"
[ -x /usr/lib/cni/ptp ] && [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || {
  echo "bench-cni.sh: /usr/lib/cni lacks ptp, bridge or host-local: run netns-tests/vm/setup.sh" >&2
  exit 1
}
# The binaries as the image ships them (the plugin static), built the image's way, in the
# cargo target dir (the VM sees it; its /tmp is its own).
BIN=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/bench-cni-bin
scripts/image-parts.sh binaries amd64 "$BIN"
EXE=$(cargo bench -p lace-netns-tests --bench cni_latency --no-run --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == "cni_latency":
        print(msg["executable"])
')
[ -n "$EXE" ] || { echo "bench-cni.sh: cargo built no cni_latency bench executable" >&2; exit 1; }
"$ROOT/netns-tests/vm/with-kernel.sh" -t 1500 "${WITH[@]}" -- \
  env LACE_BIN_DIR="$BIN/usr/local/bin" ${ENVS[@]+"${ENVS[@]}"} "$EXE" --bench
