#!/usr/bin/env bash
# vm-nodes.sh WORK - inside the cluster VM: the fabric and the test cluster's nodes, each a
# network namespace with its own mount and cgroup namespace running containerd, the kubelet and
# kube-proxy (tests/cluster/node.sh), as kind runs nodes as containers on one kernel. Runs until
# WORK/stop exists (tests/cluster/run.sh writes it), then stops the nodes.
#
# The fabric is a bridge holding the VM's NIC (the tap device in the control plane's network
# namespace on the host, 192.168.99.1 / fd00:99::1) and one veth per node: node-N is 192.168.99.1N and
# fd00:99::1N. WORK (shared with the host) holds cluster.env, the PKI and kubeconfigs the host
# made, the image archives list, and receives the nodes' logs (WORK/logs/NODE/).
set -euo pipefail
WORK=${1:?usage: vm-nodes.sh WORK}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=/dev/null
. "$WORK/cluster.env"
say() { echo "vm-nodes: $*"; }

modprobe virtio_net
for m in br_netfilter overlay nf_tables; do modprobe "$m" 2>/dev/null || true; done
ip link add fabric type bridge
# The bridge forwards at once (no STP learning delay) and does not filter through nftables.
ip link set fabric type bridge stp_state 0 forward_delay 0
sysctl -qw net.bridge.bridge-nf-call-iptables=0 net.bridge.bridge-nf-call-ip6tables=0 2>/dev/null || true
ip link set fabric up
ip link set eth0 master fabric
ip link set eth0 up

# Every controller the kernel has, for the nodes' cgroups (the kubelet needs cpu, memory, pids...).
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
  echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control
done

PIDS=()
i=0
for node in $NODES; do
  i=$((i + 1))
  ip netns add "$node"
  ip link add "fab-$i" type veth peer name eth0 netns "$node"
  ip link set "fab-$i" master fabric up
  ip -n "$node" link set lo up
  ip -n "$node" addr add "192.168.99.1$i/24" dev eth0
  ip -n "$node" addr add "fd00:99::1$i/64" dev eth0 nodad
  ip -n "$node" link set eth0 up
  ip -n "$node" route add default via 192.168.99.1
  ip -n "$node" -6 route add default via fd00:99::1
  # What the seed's kubeadm node image sets (ip_forward), and IPv6 forwarding for dual stack.
  ip netns exec "$node" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
  mkdir -p "/sys/fs/cgroup/lace-$node" "$WORK/logs/$node"
  # The node's processes start in its cgroup, which becomes the root of their cgroup
  # namespace; node.sh moves them into system.slice/*.
  (
    echo "$BASHPID" > "/sys/fs/cgroup/lace-$node/cgroup.procs"
    exec ip netns exec "$node" unshare --cgroup -- "$HERE/node.sh" "$WORK" "$node" "$i"
  ) > "$WORK/logs/$node/node.log" 2>&1 &
  PIDS+=($!)
done
say "nodes started: $NODES"

# Commands from the host (cluster.sh: in_vm): WORK/exec/N.sh runs here as root, its output goes
# to N.out and its exit status to N.rc (written last).
mkdir -p "$WORK/exec"
declare -A GONE=()
while [ ! -e "$WORK/stop" ]; do
  for p in "${PIDS[@]}"; do
    if [ -z "${GONE[$p]:-}" ] && ! kill -0 "$p" 2>/dev/null; then
      GONE[$p]=1; say "a node's script (pid $p) exited; the nodes' logs are in $WORK/logs"
    fi
  done
  for c in "$WORK"/exec/*.sh; do
    [ -e "$c" ] || continue
    n=${c%.sh}
    mv "$c" "$n.run"
    ( bash "$n.run" > "$n.out" 2>&1; echo $? > "$n.rc.tmp"; mv "$n.rc.tmp" "$n.rc" ) &
  done
  sleep 0.5
done
say "stop requested"
kill "${PIDS[@]}" 2>/dev/null || true
wait || true
