#!/usr/bin/env bash
# netns-tests/bench.sh - the dataplane benchmarks: builds one in release mode on the host, runs
# it as root on a kernel with VRF + seg6local (the host's if capable, else the VM), prints its
# table. Not part of scripts/test.sh.
#   default       netns-tests/benches/dataplane.rs: programming rate (routes, nft swaps)
#   --scale NxM   the same bench: a node of N nodes x M Networks (the plan bench's cluster)
#                 programmed from nothing (plan, first apply, kernel routes and memory,
#                 re-applies) vs ip -batch of its encap routes; give the VM memory (-m 6G)
#   --netpol      netns-tests/benches/netpol.rs: 1,000 pods and 300 NetworkPolicies on a node:
#                 a fresh node's programming, a policy or pod change -> applied (p50/p99, writes)
#   --throughput  netns-tests/benches/throughput.rs: one TCP stream pod to pod across nodes
#                 (iperf3), Lace's SRv6 vs native routing vs VXLAN, ratios vs native
#
# usage: netns-tests/bench.sh [--routes N,N... | --nft-only | --netpol | --scale NxM]
#                             [--throughput [--seconds S] [--repeats R] [--cases C,C...]
#                                           [--fabrics F,F]]
#                             [with-kernel.sh options...]
#   --routes   encap route counts to install (default 10000,100000)
#   --nft-only no route benchmarks, only the nft one (full swap vs element update)
#   --seconds  length of one iperf3 run (default 5); --repeats  runs per case (default 3)
#   --cases    throughput cases to run (default all: native,srv6,srv6-ll,ll-nonft,srv6-fou,srv6-sit,ipip-fou,vxlan4,vxlan6)
#   --fabrics  the fabrics to run them on (default both: veth = GSO packets cross whole,
#              nic = TSO off, packets of 1,500 bytes on the wire, GRO on the receiver)
#   e.g. netns-tests/bench.sh --routes 10000 -t 900
#        netns-tests/bench.sh --throughput --kernel 6.12
#        netns-tests/bench.sh --scale 5000x50 -m 6G
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=dataplane ROUTES=10000,100000 SCALE= SECONDS_=5 REPEATS=3 CASES= FABRICS= WITH=()
while [ $# -gt 0 ]; do
  case $1 in
    --routes) ROUTES=${2:?--routes needs a list}; shift 2;;
    --nft-only) ROUTES=; shift;;
    --scale) SCALE=${2:?--scale needs NODESxNETWORKS}; ROUTES=; shift 2;;
    --throughput) BENCH=throughput; shift;;
    --netpol) BENCH=netpol; shift;;
    --seconds) SECONDS_=${2:?--seconds needs a number}; shift 2;;
    --repeats) REPEATS=${2:?--repeats needs a number}; shift 2;;
    --cases) CASES=${2:?--cases needs a list}; shift 2;;
    --fabrics) FABRICS=${2:?--fabrics needs a list}; shift 2;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) WITH+=("$1"); shift;;
  esac
done
cd "$ROOT"
EXE=$(cargo bench -p lace-netns-tests --bench "$BENCH" --no-run --message-format=json-render-diagnostics | BENCH=$BENCH python3 -c '
import json, os, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == os.environ["BENCH"]:
        print(msg["executable"])
')
[ -n "$EXE" ] || { echo "bench.sh: cargo built no $BENCH bench executable" >&2; exit 1; }
exec "$ROOT/netns-tests/vm/with-kernel.sh" -t 1500 "${WITH[@]}" -- \
  env LACE_BENCH_ROUTES="$ROUTES" ${SCALE:+LACE_BENCH_SCALE="$SCALE"} LACE_BENCH_SECONDS="$SECONDS_" LACE_BENCH_REPEATS="$REPEATS" ${CASES:+LACE_BENCH_CASES="$CASES"} ${FABRICS:+LACE_BENCH_FABRICS="$FABRICS"} "$EXE" --bench
