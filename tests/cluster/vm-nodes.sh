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
# The loop waits on a FIFO nobody writes (read -t, a builtin) instead of forking `sleep`
# twice a second: under emulation every fork costs the nodes CPU.
mkfifo /run/vm-nodes.tick
exec {TICK}<>/run/vm-nodes.tick
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
  read -r -t 0.5 -u "$TICK" _ || true
done
say "stop requested"

# Where the VM's CPU time went, for the run's output (cluster.sh prints WORK/logs/cpu-vm.txt):
# under emulation the nodes share two slow CPUs, and a check that waits is waiting for CPU.
cpu_report() {
  awk '/^cpu /{ printf "VM since boot: %.0f s busy, %.0f s idle (2 CPUs)\n", ($2+$3+$4+$7+$8+$9)/100, ($5+$6)/100 }' /proc/stat
  local node cg
  for node in $NODES; do
    printf '%s:' "$node"
    for cg in /sys/fs/cgroup/lace-"$node"/system.slice/*.service /sys/fs/cgroup/lace-"$node"/kubepods; do
      [ -r "$cg/cpu.stat" ] || continue
      awk -v n="${cg##*/}" '/^usage_usec/{ printf " %s %.0f s", n, $2/1e6 }' "$cg/cpu.stat"
    done
    echo
  done
  # Live processes by name, with the children they reaped (a shim's runc calls, containerd's CNI
  # plugin calls): /proc/PID/stat fields utime stime cutime cstime, after the ")" of the name.
  echo "live processes by name (own + reaped children's CPU):"
  for f in /proc/[0-9]*/stat; do cat "$f" 2>/dev/null; echo; done |
    sed -n 's/^[0-9]* (\(.*\)) \(.*\)$/\1\t\2/p' |
    awk -F'\t' '{ split($2, a, " "); cpu[$1] += (a[12] + a[13] + a[14] + a[15]) / 100 }
      END { for (c in cpu) if (cpu[c] >= 1) printf "  %-24s %7.0f s\n", c, cpu[c] }' | sort -k2 -n -r | head -20
}
cpu_report > "$WORK/logs/cpu-vm.txt" 2>&1 || true
kill "${PIDS[@]}" 2>/dev/null || true
wait || true
