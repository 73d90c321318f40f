#!/usr/bin/env bash
# node.sh WORK NODE INDEX - one node of the test cluster, inside the VM: run by vm-nodes.sh in
# the node's network namespace (and the mount namespace `ip netns exec` gives it) as the first
# process of a new cgroup namespace rooted at the node's cgroup.
#
# What makes it a node of its own, as a container makes a kind node:
# - its own cgroup2 mount (the namespace's view: the node's cgroup is its /), with the kubelet,
#   containerd and kube-proxy in system.slice/kubelet.service, containerd.service and
#   kube-proxy.service as on a systemd host, so the chart's default node.kubeletCgroupPath
#   (/sys/fs/cgroup/system.slice/kubelet.service) is where this kubelet really runs;
# - its own bpffs, and tmpfs over every directory a node keeps state in (containerd's root must
#   not be on the VM's overlay root);
# - an empty /opt/cni/bin and /etc/cni/net.d: nothing but Lace's agent puts a plugin there.
set -euo pipefail
WORK=${1:?} NODE=${2:?} I=${3:?}
# shellcheck source=/dev/null
. "$WORK/cluster.env"
LOG=$WORK/logs/$NODE
say() { echo "node.sh $NODE: $*"; }
IP4=192.168.99.1$I IP6=fd00:99::1$I

mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /sys/fs/cgroup/system.slice/{node.scope,containerd.service,kubelet.service,kube-proxy.service}
echo $$ > /sys/fs/cgroup/system.slice/node.scope/cgroup.procs
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
  echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control
done
mount -t bpf bpf /sys/fs/bpf
mount --make-shared /sys/fs/bpf
for d in /var/lib/kubelet /var/lib/containerd /run/containerd /etc/cni/net.d /opt/cni/bin \
         /var/lib/lace /run/lace /var/log/containers /run/netns /run/nri /etc/lace-node; do
  mkdir -p "$d"
  mount -t tmpfs -o mode=755 "tmpfs-$NODE" "$d"
done
# Container logs where the host sees them (WORK is shared with it).
mkdir -p /var/log/pods "$LOG/pods"
mount --bind "$LOG/pods" /var/log/pods
mount --make-shared /run/netns
mount --make-rshared /var/lib/kubelet
echo "nameserver 192.168.99.1" > /etc/lace-node/resolv.conf

# service UNIT CMD...: CMD in system.slice/UNIT, in the background, logging to LOG/UNIT.log,
# started again 2 s after it exits (systemd's Restart=always, as kubeadm's units have).
service() {
  local unit=$1; shift
  (
    echo "$BASHPID" > "/sys/fs/cgroup/system.slice/$unit/cgroup.procs"
    while :; do "$@"; echo "node.sh: $1 exited with status $?; restarting in 2 s"; sleep 2; done
  ) >> "$LOG/${unit%.service}.log" 2>&1 &
}

cat > /etc/lace-node/containerd.toml <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "$PAUSE_IMAGE"
# containerd 2.4 samples every container's CPU through its shim every second by default; under
# emulation that was the shims' largest cost (check 1: shims 98 s of CPU, 37 s at 30 s, the
# kubelet's housekeeping interval below).
[plugins.'io.containerd.cri.v1.runtime']
  stats_collect_period = "30s"
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/opt/cni/bin"]
  conf_dir = "/etc/cni/net.d"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = false
EOF
# The images: a containerd root the host made (cluster.sh, cluster_images_root).
tar --xattrs -C /var/lib/containerd -xf "$IMAGES_ROOT"
service containerd.service containerd --config /etc/lace-node/containerd.toml
for _ in $(seq 240); do ctr version >/dev/null 2>&1 && break; sleep 0.5; done
ctr version >/dev/null 2>&1 || { say "containerd did not start in 120 s"; tail -20 "$LOG/containerd.log"; exit 1; }

cat > /etc/lace-node/kubelet.yaml <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $WORK/pki/ca.crt}
authorization: {mode: Webhook}
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
resolvConf: /etc/lace-node/resolv.conf
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
rotateCertificates: false
# tmpfs everywhere: no disk pressure evictions, no image garbage collection.
evictionHard: {memory.available: "50Mi", nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%", imagefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
protectKernelDefaults: false
serializeImagePulls: false
# Under emulation every periodic poll costs ~10x: container state from the runtime's events
# instead of a relist every second (containerd 2.x serves them), node status every 20 s.
featureGates: {EventedPLEG: true}
nodeStatusReportFrequency: 1m
nodeStatusUpdateFrequency: 20s
EOF
service kubelet.service kubelet --config /etc/lace-node/kubelet.yaml \
  --kubeconfig "$WORK/kubeconfig/$NODE.conf" --hostname-override "$NODE" --node-ip "$IP4,$IP6" \
  --housekeeping-interval 30s -v 1

cat > /etc/lace-node/kube-proxy.yaml <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: $NODE
clientConnection: {kubeconfig: $WORK/kubeconfig/kube-proxy.conf}
clusterCIDR: 10.244.0.0/16
bindAddress: 0.0.0.0
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0}
EOF
service kube-proxy.service kube-proxy --config /etc/lace-node/kube-proxy.yaml
say "containerd, kubelet and kube-proxy started"
wait
