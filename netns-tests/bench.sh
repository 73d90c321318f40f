#!/usr/bin/env bash
# netns-tests/bench.sh - the dataplane benchmark (netns-tests/benches/dataplane.rs): builds it
# in release mode on the host, runs it as root on a kernel with VRF + seg6local (the host's if
# capable, else the VM), prints its table. Not part of scripts/test.sh.
#
# usage: netns-tests/bench.sh [--routes N,N... | --nft-only] [with-kernel.sh options...]
#   --routes   encap route counts to install (default 10000,100000)
#   --nft-only no route benchmarks, only the nft one (full swap vs element update)
#   e.g. netns-tests/bench.sh --routes 10000 -t 900
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUTES=10000,100000 WITH=()
while [ $# -gt 0 ]; do
  case $1 in
    --routes) ROUTES=${2:?--routes needs a list}; shift 2;;
    --nft-only) ROUTES=; shift;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) WITH+=("$1"); shift;;
  esac
done
cd "$ROOT"
EXE=$(cargo bench -p lace-netns-tests --bench dataplane --no-run --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == "dataplane":
        print(msg["executable"])
')
[ -n "$EXE" ] || { echo "bench.sh: cargo built no dataplane bench executable" >&2; exit 1; }
exec "$ROOT/netns-tests/vm/with-kernel.sh" -t 1500 "${WITH[@]}" -- env LACE_BENCH_ROUTES="$ROUTES" "$EXE" --bench
