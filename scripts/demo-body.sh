#!/usr/bin/env bash
# demo-body.sh - the Lace demo, run as root on a kernel with VRF + SRv6 (scripts/demo.sh runs it
# on the host or in a VM). Everything lives in network namespaces this script creates and
# removes again (also on Ctrl-C):
#
#   ld-fabric   a bridge joining the nodes' underlay (IPv6 fd00:fab::/64, IPv4 192.168.0.0/24;
#               with LACE_DEMO_UNDERLAY=ipv4 IPv4 only, the links' IPv6 on with link-local
#               addresses only; with ipv4-fou IPv6 disabled on every fabric link)
#   ld-node-N   three nodes, each with one real `lace-agent run` in standalone mode
#   ld-internet a host beyond node-1 (203.0.113.254, 2001:db8:cafe::254) that echoes the
#               address it sees
#   ld-p-NAME   one namespace per pod of examples/cluster, wired by exec'ing the real `lace`
#               CNI plugin exactly as containerd does; each pod gets an IPv4 and an IPv6
#               address (the example Networks are dual-stack) and runs a TCP echo server
#
# Then it prints the connectivity matrix per address family (expected from the policies vs
# observed with ICMP echo and a TCP exchange, so both new connections and their replies),
# masquerade towards the internet in both families, and each node's VRFs, routes and nft table.
#
# env: LACE_AGENT, LACE_CNI  the built lace-agent and lace binaries (scripts/demo.sh sets them)
#      LACE_DEMO_KEEP=1      leave everything up and wait for Ctrl-C before tearing down
#      LACE_DEMO_UNDERLAY    ipv6 (default), ipv4 or ipv4-fou: what the fabric between the nodes
#                            carries (see scripts/demo.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AGENT=${LACE_AGENT:?run through scripts/demo.sh}
CNI=${LACE_CNI:?run through scripts/demo.sh}
UNDERLAY=${LACE_DEMO_UNDERLAY:-ipv6}
W=$(mktemp -d /tmp/lace-demo.XXXXXX)
NODES=(1 2 3)
BG_PIDS=()
PODS=()            # "ns/name node network ip"
declare -A POD_IP POD_IP6 POD_IP6X POD_NET POD_NODE   # POD_IP6X: exploded, as socat reports it
INTERNET_IP=203.0.113.254 INTERNET_IP6=2001:db8:cafe::254

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

cleanup() {
  set +e
  trap - EXIT INT TERM
  if [ -n "${LACE_DEMO_KEEP:-}" ] && [ -z "${CLEANING:-}" ]; then
    echo "demo: everything is up (LACE_DEMO_KEEP); Ctrl-C to tear down"; CLEANING=1; sleep infinity
  fi
  say "teardown"
  for p in "${PODS[@]}"; do
    read -r key node _ <<<"$p"
    cni DEL "$key" "$node" >/dev/null 2>&1
    ip netns del "ld-p-${key#*/}" 2>/dev/null
  done
  for pid in "${BG_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  wait 2>/dev/null
  for ns in $(ip netns list | awk '/^ld-/{print $1}'); do ip netns del "$ns"; done
  rm -rf "$W"
  echo "demo: torn down; no ld-* namespace is left: $(ip netns list | grep -c '^ld-' || true) remain"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- topology -------------------------------------------------------------------------------
say "topology: 3 nodes on a fabric (underlay $UNDERLAY), an internet host beyond node-1"
ip netns add ld-fabric
nsx ld-fabric ip link add br0 type bridge
nsx ld-fabric ip link set br0 up
for i in "${NODES[@]}"; do
  n=ld-node-$i
  ip netns add "$n"
  nsx "$n" ip link set lo up
  ip link add eth0 netns "$n" type veth peer name n$i netns ld-fabric
  nsx ld-fabric ip link set n$i master br0 up
  nsx "$n" ip addr add 192.168.0.1$i/24 dev eth0
  case $UNDERLAY in
    ipv4-fou)
      # A fabric that carries no IPv6 at all.
      nsx "$n" sysctl -qw net.ipv6.conf.eth0.disable_ipv6=1
      nsx ld-fabric sysctl -qw net.ipv6.conf.n$i.disable_ipv6=1;;
    ipv4) ;;  # IPv4 addresses only; the links keep the kernel's IPv6 link-local addresses
    *) nsx "$n" ip addr add fd00:fab::$i/64 dev eth0 nodad;;
  esac
  nsx "$n" ip link set eth0 up
  # node-1 is the other nodes' way out (IPv4, and IPv6 where the fabric has it).
  [ "$i" = 1 ] || nsx "$n" ip route add default via 192.168.0.11
  [ "$i" = 1 ] || [ "$UNDERLAY" != ipv6 ] || nsx "$n" ip -6 route add default via fd00:fab::1
done
ip netns add ld-internet
nsx ld-internet ip link set lo up
ip link add eth1 netns ld-node-1 type veth peer name eth0 netns ld-internet
nsx ld-node-1 ip addr add 203.0.113.1/24 dev eth1
nsx ld-node-1 ip addr add 2001:db8:cafe::1/64 dev eth1 nodad
nsx ld-node-1 ip link set eth1 up
nsx ld-node-1 ip route add default via $INTERNET_IP
nsx ld-node-1 ip -6 route add default via $INTERNET_IP6
nsx ld-internet ip addr add $INTERNET_IP/24 dev eth0
nsx ld-internet ip addr add $INTERNET_IP6/64 dev eth0 nodad
nsx ld-internet ip link set eth0 up
nsx ld-internet ip route add 192.168.0.0/24 via 203.0.113.1
nsx ld-internet ip -6 route add fd00:fab::/64 via 2001:db8:cafe::1

# echo_server NS IP: answers every TCP connection to IP:8080 with the address it sees.
echo_server() {
  local ns=$1 ip=$2 listen
  case $ip in *:*) listen="TCP6-LISTEN:8080,bind=[$ip]";; *) listen="TCP4-LISTEN:8080,bind=$ip";; esac
  # -t: the client half-closes at once; wait for the forked echo (slow under TCG) anyway.
  nsx "$ns" socat -t5 "$listen,fork,reuseaddr" SYSTEM:'echo $SOCAT_PEERADDR' &
  BG_PIDS+=($!)
}
# tcp_peer NS IP: connects from NS to IP:8080, prints what the server saw (empty if no answer).
tcp_peer() {
  local ns=$1 ip=$2 target
  case $ip in *:*) target="TCP6:[$ip]:8080";; *) target="TCP4:$ip:8080";; esac
  # -t: after stdin's EOF, wait for the server's answer (forking the echo is slow under TCG).
  nsx "$ns" timeout 8 socat -t4 -T4 - "$target,connect-timeout=3" </dev/null 2>/dev/null | tr -d '[]' || true
}
echo_server ld-internet $INTERNET_IP
echo_server ld-internet $INTERNET_IP6

# ---- agents ---------------------------------------------------------------------------------
say "agents: one lace-agent per node, standalone mode on examples/cluster"
mkdir -p "$W/manifests"
cp "$ROOT"/examples/cluster/*.yaml "$W/manifests/"
if [ "$UNDERLAY" != ipv6 ]; then
  # The nodes have IPv4 InternalIPs only: drop the IPv6 ones, allocate again (locators and
  # blocks stay, the underlays change).
  python3 - "$W/manifests/nodes.yaml" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines(keepends=True)
out, skip = [], False
for i, l in enumerate(lines):
    if l.strip() == "- type: InternalIP" and ":" in lines[i + 1].split("address:")[-1]:
        skip = True
        continue
    if skip:
        skip = False
        continue
    out.append(l)
open(sys.argv[1], "w").write("".join(out))
PY
  "$AGENT" allocate --manifests "$W/manifests"
  grep -A3 'underlay:' "$W/manifests/lace-allocations.yaml" | grep -q ipv6 && {
    echo "demo: the allocation still lists IPv6 underlays" >&2; exit 1; }
fi
"$AGENT" validate --manifests "$W/manifests"
for i in "${NODES[@]}"; do
  d=$W/node-$i; mkdir -p "$d/bin" "$d/net.d"
  LACE_LOG=${LACE_LOG:-warn,lace::agent::paths=info} "$AGENT" run --node-name node-$i --manifests "$W/manifests" \
    --netns /run/netns/ld-node-$i --state-dir "$d/state" --socket "$d/cni.sock" \
    --cni-bin-dir "$d/bin" --cni-conf-dir "$d/net.d" --cni-bin-source "$CNI" \
    --metrics-addr 127.0.0.1:$((9960 + i)) 2>"$d/agent.log" &
  BG_PIDS+=($!)
done
for i in "${NODES[@]}"; do
  # The agent writes the conflist only once it can serve pods (that is when a node turns Ready).
  for _ in $(seq 900); do [ -s "$W/node-$i/net.d/10-lace.conflist" ] && break; sleep 0.2; done
  [ -s "$W/node-$i/net.d/10-lace.conflist" ] || {
    cat "$W/node-$i/agent.log"; dmesg | grep -iE 'oom|killed process' | tail -3
    echo "demo: agent of node-$i never became ready" >&2; exit 1; }
  echo "node-$i: agent ready, CNI installed: $(ls "$W/node-$i/bin") + $(ls "$W/node-$i/net.d")"
done
if [ "$UNDERLAY" = ipv4 ]; then
  # The agents find their peers on the bridge, add their link-local underlay addresses, probe
  # each other and switch each pair from fou to link-local once the peer answers (a second or
  # two): wait for it, then show what each agent logged and what `lace-agent plan --probe`
  # (read-only, on the node) says about each peer.
  for i in "${NODES[@]}"; do
    for _ in $(seq 150); do
      [ "$(nsx ld-node-$i ip -6 route show | grep -c '^2001:db8:100:.*/96 via fe80::4c61:6365:')" = 2 ] && break
      sleep 0.2
    done
  done
  say "underlay ipv4: each pair over IPv6 link-local (the agents' log, lace-agent plan --probe)"
  for i in "${NODES[@]}"; do
    sed 's/\x1b\[[0-9;]*m//g' "$W/node-$i/agent.log" | grep -o 'underlay: peer .*' \
      | sed "s/ node=.*//; s/^/node-$i agent: /" || true
    "$AGENT" plan --manifests "$W/manifests" --node node-$i --probe --netns /run/netns/ld-node-$i \
      | sed -n '/^## underlay/,/^$/p' | grep -E '^(peer|addr)' | sed "s/^/node-$i plan: /"
  done
fi

# cni VERB ns/name node: exec the plugin as containerd does (per-plugin config on stdin, with
# the conflist's name and cniVersion), print its stdout.
cni() {
  local verb=$1 key=$2 node=$3 d=$W/$3
  python3 - "$d/net.d/10-lace.conflist" <<'PY' >"$d/conf.json"
import json, sys
c = json.load(open(sys.argv[1]))
p = dict(c["plugins"][0]); p["name"] = c["name"]; p["cniVersion"] = c["cniVersion"]
print(json.dumps(p))
PY
  CNI_COMMAND=$verb CNI_CONTAINERID="demo-${key//\//-}" CNI_NETNS=/run/netns/ld-p-${key#*/} \
    CNI_IFNAME=eth0 CNI_PATH=$d/bin \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=${key%/*};K8S_POD_NAME=${key#*/}" \
    "$d/bin/lace" <"$d/conf.json"
}

# ---- pods -----------------------------------------------------------------------------------
say "pods: CNI ADD for every pod of the manifests (lace-agent policy says which Network)"
"$AGENT" policy --manifests "$W/manifests" >"$W/policy"
while read -r kind key node net _; do
  [ "$kind" = pod ] && [ "$net" != - ] || continue
  ip netns add "ld-p-${key#*/}"
  nsx "ld-p-${key#*/}" ip link set lo up
  out=$(cni ADD "$key" "$node") || { echo "$out"; echo "demo: ADD $key failed" >&2; exit 1; }
  read -r ip4 ip6 ip6x < <(python3 -c '
import ipaddress, json, sys
r = json.loads(sys.argv[1])
addr = [i["address"].split("/")[0] for i in r["ips"]]
v6 = next(a for a in addr if ":" in a)
print(next(a for a in addr if ":" not in a), v6, ipaddress.ip_address(v6).exploded)' "$out")
  PODS+=("$key $node $net $ip4"); POD_IP[$key]=$ip4 POD_IP6[$key]=$ip6 POD_IP6X[$key]=$ip6x
  POD_NET[$key]=$net POD_NODE[$key]=$node
  echo_server "ld-p-${key#*/}" "$ip4"
  echo_server "ld-p-${key#*/}" "$ip6"
  printf '%-26s %-7s %-9s %-14s %s\n' "$key" "$node" "$net" "$ip4" "$ip6"
done <"$W/policy"

# allowed FROM TO: a NetworkRoutingPolicy lets Network FROM open connections to Network TO.
allowed() { grep -q "^pair $1 $2 " "$W/policy"; }
# v6_out NODE: the node has an IPv6 way out (a default route); on the IPv4-only fabric only
# node-1 (with its own internet link) does.
v6_out() { [ -n "$(nsx "ld-$1" ip -6 route show default)" ]; }

# ---- matrix ---------------------------------------------------------------------------------
say "connectivity: expected from the policies (lace-agent policy) vs observed (ICMP echo, TCP)"
targets=("${!POD_IP[@]}"); IFS=$'\n' targets=($(sort <<<"${targets[*]}")); unset IFS
mkdir -p "$W/obs"
# Every source pod checks every target in both families, with ping (echo + reply) and a TCP
# exchange whose answer must be the source's own address (no NAT between pods; for the
# internet any answer counts). One background job per source pod and family.
PING_PIDS=()
for src in "${targets[@]}"; do
  for fam in 4 6; do
    ( for dst in "${targets[@]}" internet; do
        [ "$src" = "$dst" ] && continue
        if [ "$fam" = 4 ]; then ip=${POD_IP[$dst]:-$INTERNET_IP} me=${POD_IP[$src]}
        else ip=${POD_IP6[$dst]:-$INTERNET_IP6} me=${POD_IP6X[$src]}; fi
        if nsx "ld-p-${src#*/}" ping -c1 -W2 -q "$ip" >/dev/null 2>&1; then icmp=ok; else icmp=no; fi
        seen=$(tcp_peer "ld-p-${src#*/}" "$ip")
        if [ "$dst" = internet ] && [ -n "$seen" ] || [ "$seen" = "$me" ]; then tcp=ok; else tcp=no; fi
        echo "$dst $fam $icmp $tcp"
      done >"$W/obs/${src//\//_}.$fam" ) &
    PING_PIDS+=($!)
  done
done
wait "${PING_PIDS[@]}"
for src in "${targets[@]}"; do cat "$W/obs/${src//\//_}".[46] >"$W/obs/${src//\//_}"; done
mismatches=0 checks=0
for fam in 4 6; do
  echo; echo "IPv$fam:"
  printf '%-24s' "from \\ to"; for dst in "${targets[@]}" internet; do printf ' %-11s' "${dst#*/}"; done; echo
  for src in "${targets[@]}"; do
    printf '%-24s' "${src#*/} (${POD_NET[$src]})"
    for dst in "${targets[@]}" internet; do
      if [ "$src" = "$dst" ]; then printf ' %-11s' "·"; continue; fi
      read -r icmp tcp < <(awk -v d="$dst" -v f="$fam" '$1==d && $2==f {print $3, $4}' "$W/obs/${src//\//_}")
      to=${POD_NET[$dst]:-internet}
      if allowed "${POD_NET[$src]}" "$to"; then want=ok; else want=no; fi
      cell=$([ "$want" = ok ] && echo "✓" || echo "✗") bad=
      if [ "$want" = ok ] && [ "$to" = internet ] && [ "$fam" = 6 ] && ! v6_out "${POD_NODE[$src]}"; then
        want=no cell="∅"   # allowed, but the node itself has no IPv6 way out
      fi
      [ "$icmp" = "$want" ] || bad+=I
      [ "$tcp" = "$want" ] || bad+=T
      checks=$((checks + 2))
      if [ -n "$bad" ]; then cell="$cell!$bad"; mismatches=$((mismatches + ${#bad})); fi
      printf ' %-11s' "$cell"
    done
    echo
  done
done
echo "(✓ allowed, ✗ denied by policy, checked with ICMP and TCP; '!I' / '!T' mark an ICMP / TCP"
echo " observation that differs from the policy; ∅ allowed, but the pod's node has no IPv6 way out)"

say "masquerade: what the internet host sees"
for src in "${targets[@]}"; do
  allowed "${POD_NET[$src]}" internet || continue
  for fam in 4 6; do
    if [ "$fam" = 4 ]; then ip=$INTERNET_IP me=${POD_IP[$src]} shown=${POD_IP[$src]}
    else ip=$INTERNET_IP6 me=${POD_IP6X[$src]} shown=${POD_IP6[$src]}; fi
    if [ "$fam" = 6 ] && ! v6_out "${POD_NODE[$src]}"; then
      echo "${src} (${shown} on ${POD_NODE[$src]}): no IPv6 way out from ${POD_NODE[$src]}"; continue
    fi
    seen=$(tcp_peer "ld-p-${src#*/}" "$ip")
    echo "${src} (${shown} on ${POD_NODE[$src]}) appears as ${seen:-(no answer)}"
    checks=$((checks + 1))
    # Masqueraded: the internet sees an address that is not the pod's (its node's).
    if [ -z "$seen" ] || [ "$seen" = "$me" ]; then
      echo "  ! IPv$fam: not masqueraded" >&2; mismatches=$((mismatches + 1))
    fi
  done
done

# ---- underlay and MTU -------------------------------------------------------------------------
say "underlay $UNDERLAY: how the nodes reach each other, and the pods' MTU"
# Over IPv6 (global or link-local) a pod gets the fabric's 1500 minus SRv6 (64); over fou minus
# 28 more (IPv4 + UDP).
want_mtu=$([ "$UNDERLAY" = ipv4-fou ] && echo 1408 || echo 1436)
for i in "${NODES[@]}"; do
  n=ld-node-$i
  if [ "$UNDERLAY" = ipv4 ]; then
    echo "node-$i: $(nsx "$n" ip -6 addr show dev eth0 | grep -o 'inet6 fe80::4c61:6365:[^ ]*') on eth0 (its link-local underlay address), ip sr tunsrc: $(nsx "$n" ip sr tunsrc show)"
    echo "node-$i: metrics: $(python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "http://127.0.0.1:$((9960 + i))/metrics" 2>/dev/null | grep '^lace_underlay_peers{' | tr '\n' ' ')"
    checks=$((checks + 1))
    if nsx "$n" ip link show lu-ipv4 >/dev/null 2>&1 || [ "$(nsx "$n" ip -6 route show | grep -c '^2001:db8:100:.*/96 via fe80::4c61:6365:.* dev eth0')" != 2 ]; then
      echo "  ! node-$i does not reach both peers over link-local" >&2; mismatches=$((mismatches + 1))
    fi
  fi
  if [ "$UNDERLAY" = ipv4-fou ]; then
    echo "node-$i: $(nsx "$n" ip -d link show lu-ipv4 | sed -n '3p' | awk '{$1=$1; print}' | cut -d" " -f1-17)"
    echo "node-$i: ip fou show: $(nsx "$n" ip fou show); ip sr tunsrc: $(nsx "$n" ip sr tunsrc show)"
    nsx "$n" ip -s link show lu-ipv4 | awk '/RX:|TX:/ {getline; printf "  %s packets %s\n", (++k == 1 ? "decapsulated" : "encapsulated"), $2}'
  fi
  nsx "$n" ip -6 route show | grep -E '^2001:db8:100:.*/96 via' | sed "s/^/node-$i: /"
  for p in "${PODS[@]}"; do
    read -r key node _ <<<"$p"
    [ "$node" = "node-$i" ] || continue
    mtu=$(nsx "ld-p-${key#*/}" cat /sys/class/net/eth0/mtu)
    echo "node-$i: pod $key MTU $mtu"
    checks=$((checks + 1))
    [ "$mtu" = "$want_mtu" ] || { echo "  ! MTU $mtu, not $want_mtu" >&2; mismatches=$((mismatches + 1)); }
    break
  done
done

# ---- inspection -----------------------------------------------------------------------------
for i in "${NODES[@]}"; do
  n=ld-node-$i
  say "node-$i: ip vrf"
  nsx "$n" ip vrf show
  for vrf in $(nsx "$n" ip -br link show type vrf | awk '{print $1}'); do
    say "node-$i: ip route show vrf $vrf"
    nsx "$n" ip route show vrf "$vrf"
  done
  say "node-$i: ip -6 route (SIDs: seg6local; other nodes' locators)"
  nsx "$n" ip -6 route show | grep -E 'seg6local|2001:db8:100' || true
done
say "node-1: nft list table inet lace"
nsx ld-node-1 nft list table inet lace

if [ "$UNDERLAY" = ipv4 ]; then
  # Every change of path since the agents started (a pair that fell back to fou and returned
  # shows here), and the metrics counting them.
  say "underlay ipv4: every path change the agents logged"
  for i in "${NODES[@]}"; do
    sed 's/\x1b\[[0-9;]*m//g' "$W/node-$i/agent.log" | grep -o '^[^ ]* .*underlay: peer .*' \
      | sed -E 's/^([^ ]*) .*(underlay: peer .*)/\1 \2/; s/ node=.*//' | sed "s/^/node-$i: /" || true
    python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
      "http://127.0.0.1:$((9960 + i))/metrics" 2>/dev/null | grep '^lace_underlay_path_changes_total' | sed "s/^/node-$i: /"
  done
fi

say "result"
echo "demo: $((checks - mismatches)) passed, $mismatches failed"
if [ "$mismatches" = 0 ]; then
  echo "demo: the observed connectivity equals the policies (${#targets[@]} pods on ${#NODES[@]} nodes)"
else
  echo "demo: $mismatches observation(s) differ from the policies" >&2
  exit 1
fi
