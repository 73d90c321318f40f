#!/bin/bash
# Real-kernel check of the planner's datapath: two nodes of the golden cluster (node-1, node-2)
# and an "internet" host as network namespaces, each node programmed from its golden plan
# (tests/golden/node-*.plan/.nft) by apply_plan.py, then real traffic checks what the
# policies allow and deny. Needs a kernel with VRF + seg6 (Debian's linux-image-amd64):
#   netns-tests/vm/with-kernel.sh --kernel 6.1 -- bash tests/vm/datapath.sh   (a tier of scripts/test.sh)
# Everything stays inside namespaces this script creates.
set -u
cd "$(dirname "$0")/../.."
modprobe -a vrf veth nf_tables nft_masq nft_chain_nat nf_conntrack nft_ct nft_nat 2>/dev/null
pass=0 fail=0
ok() { echo "ok   - $*"; pass=$((pass + 1)); }
bad() { echo "FAIL - $*"; fail=$((fail + 1)); }
expect() { # expect ok|deny DESCRIPTION CMD...
  local want=$1 what=$2; shift 2
  if "$@" >/dev/null 2>&1; then got=ok; else got=deny; fi
  [ "$got" = "$want" ] && ok "$what ($want)" || bad "$what: wanted $want, got $got"
}

for ns in n1 n2 inet; do ip netns del $ns 2>/dev/null; ip netns add $ns; ip -n $ns link set lo up; done
# Underlay n1 <-> n2 (IPv6 only), n1 <-> internet (IPv4 egress + an IPv6 link for the guard test).
ip link add eth-u netns n1 type veth peer name eth-u netns n2
ip -n n1 addr add 2001:db8:ff::1/64 dev eth-u nodad
ip -n n2 addr add 2001:db8:ff::2/64 dev eth-u nodad
ip -n n1 link set eth-u up; ip -n n2 link set eth-u up
ip link add eth-i netns n1 type veth peer name e1 netns inet
ip -n n1 addr add 203.0.113.1/24 dev eth-i
ip -n n1 addr add 2001:db8:ee::1/64 dev eth-i nodad
ip -n inet addr add 203.0.113.254/24 dev e1
ip -n inet addr add 2001:db8:ee::2/64 dev e1 nodad
ip -n n1 link set eth-i up; ip -n inet link set e1 up
ip -n inet addr add 192.0.2.10/32 dev lo
ip -n n1 route add default via 203.0.113.254
# node-2 reaches the outside through node-1 (IPv4 on the underlay link).
ip -n n1 addr add 198.51.100.1/24 dev eth-u
ip -n n2 addr add 198.51.100.2/24 dev eth-u
ip -n n2 route add default via 198.51.100.1

# A pod: its own namespace, a veth whose host end is enslaved to the Network's VRF, static
# neighbours for the gateways in the pod (as the CNI writes them) and for IPv4 on the host,
# and a default route via a link-local gateway. The host resolves IPv6 pods by neighbour
# discovery, as with the CNI.
mkpod() { # NODE IFNAME VRF IPV4 [IPV6]
  local node=$1 ifn=$2 vrf=$3 ip4=$4 ip6=${5:-} p=p-$2
  ip netns del $p 2>/dev/null; ip netns add $p; ip -n $p link set lo up
  ip link add $ifn netns $node type veth peer name eth0 netns $p
  ip -n $node link set $ifn master $vrf && ip -n $node link set $ifn up && ip -n $p link set eth0 up || return 1
  local hmac pmac
  hmac=$(ip -n $node -br link show $ifn | awk '{print $3}')
  pmac=$(ip -n $p -br link show eth0 | awk '{print $3}')
  ip -n $p addr add $ip4/32 dev eth0
  ip -n $p route add 169.254.1.1 dev eth0
  ip -n $p neigh add 169.254.1.1 lladdr $hmac dev eth0
  ip -n $p route add default via 169.254.1.1 dev eth0
  ip -n $node neigh add $ip4 lladdr $pmac dev $ifn
  if [ -n "$ip6" ]; then
    ip -n $p -6 addr add $ip6/128 dev eth0 nodad
    ip -n $p -6 neigh add fe80::1 lladdr $hmac dev eth0
    ip -n $p -6 route add default via fe80::1 dev eth0
  fi
}
export -f mkpod
python3 tests/vm/apply_plan.py n1 eth-u tests/golden/node-1.plan tests/golden/node-1.nft \
  'mkpod n1 lp-coredns0 lv-system 10.10.1.2 fd00:10:0:1::2 && mkpod n1 lp-web0 lv-default 10.20.1.2 && mkpod n1 lp-api0 lv-tenant-a 10.30.1.2 fd00:30:0:1::2' || exit 1
python3 tests/vm/apply_plan.py n2 eth-u tests/golden/node-2.plan tests/golden/node-2.nft \
  'mkpod n2 lp-coredns1 lv-system 10.10.2.5 fd00:10:0:2::5 && mkpod n2 lp-web1 lv-default 10.20.2.2 && mkpod n2 lp-api1 lv-tenant-a 10.30.2.2 fd00:30:0:2::2' || exit 1

# kube-proxy stand-in on node-1: Service DNAT before Lace's prerouting chain.
ip netns exec n1 nft -f - <<'NFT'
table ip kubeproxy {
  chain pre { type nat hook prerouting priority dstnat; policy accept;
    ip daddr 10.96.0.10 udp dport 53 dnat to 10.10.2.5:5353
    ip daddr 10.96.0.1 tcp dport 443 dnat to 192.0.2.10:6443
  }
}
NFT

P="ping -c1 -W3"
# Waits until NETNS has a listening socket on PROTO (t|u) PORT: TCG emulation is slow.
listening() { for _ in $(seq 100); do ip netns exec $1 ss -Hln$2 "sport = :$3" | grep -q . && return 0; sleep 0.2; done; return 1; }
px() { local p=$1; shift; ip netns exec p-$p "$@"; }
expect ok   "system node-1 -> system node-2 (self-routed, v4)"   px lp-coredns0 $P 10.10.2.5
expect ok   "system node-1 -> system node-2 (self-routed, v6)"   px lp-coredns0 $P fd00:10:0:2::5
expect ok   "tenant-a node-1 -> system node-2 (allowed pair)"   px lp-api0 $P 10.10.2.5
expect deny "system node-2 -> tenant-a node-1 (reverse of a pair)" px lp-coredns1 $P 10.30.1.2
expect ok   "tenant-a node-1 -> tenant-a node-2 (v6)"            px lp-api0 $P fd00:30:0:2::2
expect deny "default node-1 -> default node-2 (not self-routed)" px lp-web0 $P 10.20.2.2
expect ok   "tenant-a -> system on node-1 (leaked route)"        px lp-api0 $P 10.10.1.2
expect deny "system -> tenant-a on node-1 (reverse, local)"      px lp-coredns0 $P 10.30.1.2
expect deny "default -> system on node-1 (no policy)"           px lp-web0 $P 10.10.1.2
expect ok   "default -> internet (egress, masqueraded)"          px lp-web0 $P 192.0.2.10
expect deny "tenant-a -> internet (no egress policy)"            px lp-api0 $P 192.0.2.10
expect deny "default -> node-1's own address"                    px lp-web0 $P 203.0.113.1

# Service grants (UDP via the kube-proxy stand-in): default may reach kube-dns, tenant-a not.
ip netns exec p-lp-coredns1 python3 -c '
import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 5353))
while True:
    d, a = s.recvfrom(100); s.sendto(b"pong:" + d, a)' &
srv=$!
ip netns exec inet python3 -c '
import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("192.0.2.10", 6443)); s.listen()
while True:
    c, _ = s.accept(); c.sendall(b"apiserver\n"); c.close()' &
api=$!
listening p-lp-coredns1 u 5353; listening inet t 6443
udp() { px $1 python3 -c '
import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
s.sendto(b"ping", ("10.96.0.10", 53)); sys.exit(0 if s.recv(100) == b"pong:ping" else 1)'; }
tcp() { px $1 python3 -c '
import socket, sys; s = socket.create_connection(("10.96.0.1", 443), timeout=3)
sys.exit(0 if s.recv(100) == b"apiserver\n" else 1)'; }
expect ok   "default node-1 -> kube-dns backend on node-2 (ServiceRoutingPolicy)" udp lp-web0
expect ok   "tenant-a node-1 -> kube-dns (its backends are system pods: tenant-a-to-system)" udp lp-api0
expect deny "default node-1 -> kube-dns backend directly, ICMP (no grant)" px lp-web0 $P 10.10.2.5
expect ok   "system node-1 -> default/kubernetes on internet (host routing)" tcp lp-coredns0
expect deny "tenant-a node-1 -> default/kubernetes (no grant)"             tcp lp-api0
kill $srv $api 2>/dev/null

# Kubelet probes: only marked host sockets reach pods.
expect ok   "node-1 host -> tenant-a pod with the probe mark" ip netns exec n1 $P -m $((0x1000)) 10.30.1.2
expect deny "node-1 host -> tenant-a pod without the mark"    ip netns exec n1 $P 10.30.1.2
# IPv6 probes leave from fe80::1, which the plan puts on the pod veth's host end (in the VRF).
expect ok   "node-1 host -> tenant-a pod, IPv6, with the probe mark" ip netns exec n1 $P -m $((0x1000)) fd00:30:0:1::2
expect deny "node-1 host -> tenant-a pod, IPv6, without the mark"    ip netns exec n1 $P fd00:30:0:1::2
# A kubelet-like TCP probe (HTTP GET stand-in) from an unbound, marked host socket; the pod
# serves IPv4 and IPv6 on one socket.
ip netns exec p-lp-api0 python3 -c '
import socket; s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0); s.bind(("::", 8080)); s.listen()
while True:
    c, _ = s.accept(); c.sendall(b"healthy\n"); c.close()' &
hz=$!
# A host service on node-1 (any address, both families): pods must not reach it.
ip netns exec n1 python3 -c '
import socket; s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", 2222)); s.listen()
while True:
    c, _ = s.accept(); c.sendall(b"healthy\n"); c.close()' &
hs=$!
listening p-lp-api0 t 8080; listening n1 t 2222
# tcpget NETNS MARK|none ADDR PORT [IFNAME]: a TCP client (IFNAME: scope of a link-local ADDR).
tcpget() { ip netns exec $1 python3 -c '
import socket, sys
fam = socket.AF_INET6 if ":" in sys.argv[2] else socket.AF_INET
s = socket.socket(fam); s.settimeout(3)
if sys.argv[1] == "mark": s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, 0x1000)
addr = (sys.argv[2], int(sys.argv[3]))
if len(sys.argv) > 4: addr += (0, socket.if_nametoindex(sys.argv[4]))
s.connect(addr); sys.exit(0 if s.recv(100) == b"healthy\n" else 1)' "${@:2}"; }
expect ok   "kubelet TCP probe (marked socket) -> tenant-a pod"        tcpget n1 mark 10.30.1.2 8080
expect deny "unmarked host TCP socket -> tenant-a pod"                 tcpget n1 none 10.30.1.2 8080
expect ok   "kubelet TCP probe (marked socket) -> tenant-a pod, IPv6"  tcpget n1 mark fd00:30:0:1::2 8080
expect deny "unmarked host TCP socket -> tenant-a pod, IPv6"           tcpget n1 none fd00:30:0:1::2 8080
expect deny "system pod -> tenant-a pod's probe port, IPv6 (no policy)" tcpget p-lp-coredns0 none fd00:30:0:1::2 8080
# The probe source is the pods' gateway: it must not open the host to them.
lla=$(ip -n n1 -6 -o addr show dev lp-api0 scope link | awk '{print $4}' | cut -d/ -f1 | grep -vx fe80::1 | head -1)
expect ok   "node-1 reaches its own service on [::1]:2222 (control)"   tcpget n1 none ::1 2222
expect deny "tenant-a pod -> host service via its gateway fe80::1"     tcpget p-lp-api0 none fe80::1 2222 eth0
expect deny "tenant-a pod -> host service via the veth's ${lla:-?}"    tcpget p-lp-api0 none "${lla:-fe80::dead}" 2222 eth0
[ -n "$lla" ] || bad "lp-api0 has no auto-generated link-local address to test with"
d=$(ip netns exec n1 nft list chain inet lace pods_to_host | grep -o 'packets [0-9]*' | awk '{print $2}')
[ "${d:-0}" -gt 0 ] && ok "pods_to_host drop counter on node-1 = $d" || bad "pods_to_host drop counter on node-1 = ${d:-?}"
kill $hz $hs 2>/dev/null

# SRv6 ingress guard: a non-node sends an encapsulated packet to node-1's system SID.
ip -n inet -6 route add 2001:db8:100::1:0:0/96 via 2001:db8:ee::1
ip -n inet route add 10.10.1.0/24 encap seg6 mode encap segs 2001:db8:100::1:2:0 dev e1
expect deny "SRv6 from a non-node address into system" ip netns exec inet $P 10.10.1.2
g=$(ip netns exec n1 nft list chain inet lace prerouting | grep 'daddr @local_sids ip6 saddr != ' | grep -o 'packets [0-9]*' | awk '{print $2}')
[ "${g:-0}" -gt 0 ] && ok "guard counter on node-1 = $g" || bad "guard counter on node-1 = ${g:-?}"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
