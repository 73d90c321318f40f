#!/usr/bin/env bash
# cluster.sh - a real Kubernetes cluster for Lace's tests, from the components
# scripts/k8s-components.sh builds (versions: scripts/k8s-versions). Sourced by
# tests/cluster/run.sh and scripts/demo.sh --cluster; defines cluster_up and cluster_down.
#
# Where each part runs, and why:
# - The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and every
#   client (kubectl, helm, the checks) run on the host, natively, in a network namespace of
#   their own (lace-cluster-PID). Under the VM's software emulation (TCG) the API server took 97 s
#   to become ready and each kubectl call 2.5 s; natively 4.6 s and 0.06 s.
# - The nodes run in one QEMU VM booting Debian's stock kernel (VRF and seg6: the host kernel
#   has neither): each node a network namespace with its own mount and cgroup namespace
#   (tests/cluster/vm-nodes.sh, node.sh), as kind runs nodes as containers on one kernel. One
#   VM per node would split the host's two cores between three emulated kernels.
# - The VM's NIC is a tap device in the control plane's namespace (192.168.99.1/24, outside the
#   Service range 10.96.0.0/12, which kube-proxy drops traffic to unallocated addresses of;
#   fd00:99::1/64), bridged inside the VM to the nodes (192.168.99.11-13, fd00:99::11-13): the API
#   server reaches the kubelets and the nodes the API server, and no packet leaves the
#   namespace and the VM.
#
# Settings (environment): LACE_CLUSTER_NODES (default 3), LACE_CLUSTER_LIMIT (the VM's time
# limit, seconds), LACE_CLUSTER_MEM (VM memory, default 6G).
CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLUSTER_ROOT=$(cd "$CLUSTER_DIR/../.." && pwd)
CLUSTER_API=192.168.99.1

csay() { echo "cluster: $*" >&2; }
cdie() { csay "ERROR: $*"; return 1; }
# in_ns CMD...: CMD in the control plane's network namespace.
in_ns() { ip netns exec "$CLUSTER_NS" "$@"; }
# k ARGS...: kubectl as the cluster's admin.
k() { in_ns kubectl --kubeconfig "$CLUSTER_WORK/kubeconfig/admin.conf" "$@"; }

# in_vm SCRIPT: runs the shell script SCRIPT as root in the VM (vm-nodes.sh picks it up from
# WORK/exec), prints its output and returns its exit status. `ip netns exec node-1 ...` in it
# reaches a node.
in_vm() {
  local n=$CLUSTER_WORK/exec/$$-$RANDOM i
  mkdir -p "$CLUSTER_WORK/exec"
  printf '%s\n' "$1" > "$n.tmp" && mv "$n.tmp" "$n.sh"
  for i in $(seq 1200); do [ -e "$n.rc" ] && break; sleep 0.25; done
  [ -e "$n.rc" ] || { cdie "the VM did not run '$1' within 300 s"; return 1; }
  cat "$n.out"
  return "$(cat "$n.rc")"
}

# cluster_pki: certificates and kubeconfigs as kubeadm makes them (kubeadm's certs and
# kubeconfig phases), plus one client kubeconfig per node and kube-proxy.
cluster_pki() {
  local w=$CLUSTER_WORK n
  cat > "$w/kubeadm.yaml" <<EOF
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint: {advertiseAddress: $CLUSTER_API, bindPort: 6443}
nodeRegistration: {name: control-plane}
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: $K8S_VERSION
clusterName: lace-test
controlPlaneEndpoint: $CLUSTER_API:6443
certificatesDir: $w/pki
networking: {podSubnet: 10.244.0.0/16, serviceSubnet: 10.96.0.0/12, dnsDomain: cluster.local}
dns: {imageRepository: registry.k8s.io/coredns, imageTag: $COREDNS_VERSION}
EOF
  kubeadm init phase certs all --config "$w/kubeadm.yaml" > "$w/logs/kubeadm.log" 2>&1
  kubeadm init phase kubeconfig all --config "$w/kubeadm.yaml" --kubeconfig-dir "$w/kubeconfig" \
    >> "$w/logs/kubeadm.log" 2>&1
  for n in $CLUSTER_NODES; do
    kubeadm kubeconfig user --config "$w/kubeadm.yaml" --client-name "system:node:$n" \
      --org system:nodes > "$w/kubeconfig/$n.conf" 2>> "$w/logs/kubeadm.log"
  done
  kubeadm kubeconfig user --config "$w/kubeadm.yaml" --client-name system:kube-proxy \
    > "$w/kubeconfig/kube-proxy.conf" 2>> "$w/logs/kubeadm.log"
}

# cluster_start NAME CMD...: a control plane process in the namespace, logging to
# logs/NAME.log. `ip netns exec` execs CMD, so the recorded pid is CMD's own.
cluster_start() {
  local name=$1; shift
  ip netns exec "$CLUSTER_NS" "$@" > "$CLUSTER_WORK/logs/$name.log" 2>&1 &
  echo "$! $name" >> "$CLUSTER_WORK/pids"
}

cluster_control_plane() {
  local w=$CLUSTER_WORK p=$CLUSTER_WORK/pki
  cluster_start etcd etcd --data-dir "$w/etcd" --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --listen-metrics-urls http://127.0.0.1:2381
  # The flags kubeadm gives the API server (etcd on loopback without TLS), with
  # ValidatingAdmissionPolicy (GA, on by default) and RBAC.
  cluster_start kube-apiserver kube-apiserver --advertise-address="$CLUSTER_API" \
    --bind-address=0.0.0.0 --secure-port=6443 --etcd-servers=http://127.0.0.1:2379 \
    --allow-privileged=true --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction --client-ca-file="$p/ca.crt" \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
    --kubelet-client-certificate="$p/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$p/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --proxy-client-cert-file="$p/front-proxy-client.crt" --proxy-client-key-file="$p/front-proxy-client.key" \
    --requestheader-client-ca-file="$p/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-extra-headers-prefix=X-Remote-Extra- --requestheader-group-headers=X-Remote-Group \
    --requestheader-username-headers=X-Remote-User \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --service-cluster-ip-range=10.96.0.0/12
  local i
  for i in $(seq 120); do k get --raw /readyz >/dev/null 2>&1 && break; sleep 0.5; done
  k get --raw /readyz >/dev/null 2>&1 || { tail -20 "$w/logs/kube-apiserver.log" >&2; cdie "the API server did not become ready in 60 s (log above: $w/logs/kube-apiserver.log)"; return 1; }
  cluster_start kube-controller-manager kube-controller-manager \
    --kubeconfig="$w/kubeconfig/controller-manager.conf" \
    --authentication-kubeconfig="$w/kubeconfig/controller-manager.conf" \
    --authorization-kubeconfig="$w/kubeconfig/controller-manager.conf" \
    --bind-address=127.0.0.1 --client-ca-file="$p/ca.crt" --cluster-name=lace-test \
    --cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
    --controllers='*,bootstrapsigner,tokencleaner' --leader-elect=false \
    --requestheader-client-ca-file="$p/front-proxy-ca.crt" --root-ca-file="$p/ca.crt" \
    --service-account-private-key-file="$p/sa.key" --service-cluster-ip-range=10.96.0.0/12 \
    --use-service-account-credentials=true
  cluster_start kube-scheduler kube-scheduler --kubeconfig="$w/kubeconfig/scheduler.conf" \
    --authentication-kubeconfig="$w/kubeconfig/scheduler.conf" \
    --authorization-kubeconfig="$w/kubeconfig/scheduler.conf" \
    --bind-address=127.0.0.1 --leader-elect=false
  # What `kubeadm init` does after the control plane is up: admin.conf's group is cluster-admin
  # (super-admin.conf is system:masters), and the CoreDNS addon (Deployment, Service 10.96.0.10).
  # The API server's client certificate for the kubelets (exec, logs, port-forward) may use
  # their API, as kubeadm's RBAC grants it.
  in_ns kubectl --kubeconfig "$w/kubeconfig/super-admin.conf" create clusterrolebinding \
    kubeadm:cluster-admins --clusterrole=cluster-admin --group=kubeadm:cluster-admins >/dev/null
  in_ns kubectl --kubeconfig "$w/kubeconfig/super-admin.conf" create clusterrolebinding \
    kube-apiserver-kubelet-api-admin --clusterrole=system:kubelet-api-admin \
    --user=kube-apiserver-kubelet-client >/dev/null
  in_ns kubeadm init phase addon coredns --config "$w/kubeadm.yaml" \
    --kubeconfig "$w/kubeconfig/super-admin.conf" >> "$w/logs/kubeadm.log" 2>&1 ||
    { tail -5 "$w/logs/kubeadm.log" >&2; cdie "kubeadm could not install the CoreDNS addon"; }
}

# cluster_images_root: a tar of a containerd root holding the images of CLUSTER_IMAGES (OCI
# archives, one per line), made by the pinned containerd natively on the host, which every
# node's containerd starts from: `ctr images import` in the VM took three minutes for four
# images under emulation, here 3 s, and the tar unpacks in seconds. Cached by the archives'
# digests and containerd's version. Prints its path.
cluster_images_root() {
  local cache=${LACE_K8S_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lace-k8s}/images key out d a
  key=$( { containerd --version; printf '%s\n' "$CLUSTER_IMAGES" | sed '/^$/d' | xargs sha256sum | cut -d' ' -f1; } | sha256sum | cut -c1-16)
  out=$cache/containerd-root-$key.tar
  if [ ! -s "$out" ]; then
    d=$(mktemp -d /tmp/lace-images.XXXXXX)
    printf 'version = 3\nroot = "%s/root"\nstate = "%s/state"\ndisabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]\n[grpc]\n  address = "%s/state/containerd.sock"\n' \
      "$d" "$d" "$d" > "$d/config.toml"
    ip netns exec "$CLUSTER_NS" containerd --config "$d/config.toml" > "$d/containerd.log" 2>&1 &
    local cpid=$! i
    for i in $(seq 100); do [ -S "$d/state/containerd.sock" ] && break; sleep 0.1; done
    while read -r a; do
      [ -n "$a" ] || continue
      ctr --address "$d/state/containerd.sock" -n k8s.io images import "$a" > "$d/import.log" 2>&1 ||
        { cat "$d/import.log" >&2; kill "$cpid"; cdie "ctr images import $a failed"; return 1; }
    done <<< "$CLUSTER_IMAGES"
    kill "$cpid"; wait "$cpid" 2>/dev/null || true
    tar --xattrs -C "$d/root" -cf "$out.tmp" . && mv "$out.tmp" "$out"
    rm -rf "$d"
  fi
  echo "$out"
}

# cluster_up: everything, until every node is registered. Sets CLUSTER_NS, CLUSTER_WORK,
# CLUSTER_VM_PID. Images to import into every node: CLUSTER_IMAGES (archives, one per line).
cluster_up() {
  local nodes=${LACE_CLUSTER_NODES:-3} i
  CLUSTER_NODES=$(for i in $(seq "$nodes"); do echo -n "node-$i "; done)
  CLUSTER_NODES=${CLUSTER_NODES% }
  K8S_VERSION=$(awk '$1 == "kubernetes" { print $2 }' "$CLUSTER_ROOT/scripts/k8s-versions")
  COREDNS_VERSION=$(awk '$1 == "coredns" { print $2 }' "$CLUSTER_ROOT/scripts/k8s-versions")
  CLUSTER_PATH=$("$CLUSTER_ROOT/scripts/k8s-components.sh" --path kubernetes etcd containerd crictl coredns pause) || return 1
  export PATH=$CLUSTER_PATH:$PATH
  CLUSTER_WORK=$(mktemp -d /tmp/lace-cluster.XXXXXX)
  CLUSTER_NS=lace-cluster-$$
  mkdir -p "$CLUSTER_WORK"/{logs,kubeconfig,pki,etcd}
  : > "$CLUSTER_WORK/pids"
  ip netns add "$CLUSTER_NS"
  local images_root
  images_root=$(cluster_images_root) || return 1
  cat > "$CLUSTER_WORK/cluster.env" <<EOF
NODES="$CLUSTER_NODES"
PAUSE_IMAGE=registry.k8s.io/pause:3.10.1
IMAGES_ROOT=$images_root
export PATH=$CLUSTER_PATH:/usr/sbin:/usr/bin:/sbin:/bin
EOF
  csay "work dir $CLUSTER_WORK, namespace $CLUSTER_NS, nodes: $CLUSTER_NODES"
  in_ns ip link set lo up
  in_ns ip tuntap add dev lc-tap mode tap
  in_ns ip addr add "$CLUSTER_API/24" dev lc-tap
  in_ns ip addr add fd00:99::1/64 dev lc-tap nodad
  in_ns ip link set lc-tap up
  cluster_pki || { cdie "kubeadm could not make the PKI (see $CLUSTER_WORK/logs/kubeadm.log)"; return 1; }
  local t0=$EPOCHREALTIME
  cluster_control_plane || return 1
  csay "control plane ready in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')s"
  # The checkout is shared too: the VM has a /tmp of its own, so a checkout under /tmp (and
  # vm-nodes.sh in it) would not be there otherwise.
  ip netns exec "$CLUSTER_NS" "$CLUSTER_ROOT/netns-tests/vm/vmrun.sh" --tap lc-tap -m "${LACE_CLUSTER_MEM:-6G}" -c 2 \
    -t "${LACE_CLUSTER_LIMIT:-1800}" -w "$CLUSTER_WORK" -w "$CLUSTER_ROOT" \
    -- "$CLUSTER_DIR/vm-nodes.sh" "$CLUSTER_WORK" > "$CLUSTER_WORK/logs/vm.log" 2>&1 &
  CLUSTER_VM_PID=$!
  local want n
  want=$(echo "$CLUSTER_NODES" | wc -w)
  for i in $(seq 600); do
    n=$(k get nodes -o name 2>/dev/null | wc -l)
    [ "$n" -ge "$want" ] && break
    kill -0 "$CLUSTER_VM_PID" 2>/dev/null || { tail -30 "$CLUSTER_WORK/logs/vm.log" >&2; cdie "the VM exited before the nodes registered"; return 1; }
    sleep 1
  done
  [ "$n" -ge "$want" ] || { cdie "only $n of $want nodes registered in 600 s (logs: $CLUSTER_WORK/logs)"; return 1; }
  csay "$n nodes registered $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')s after the control plane started"
}

# cluster_down: stops the VM (asks it, then waits), the control plane, removes the namespace.
# Keeps CLUSTER_WORK's logs when LACE_CLUSTER_KEEP_LOGS=1 or the caller failed.
cluster_down() {
  [ -n "${CLUSTER_WORK:-}" ] || return 0
  touch "$CLUSTER_WORK/stop"
  if [ -n "${CLUSTER_VM_PID:-}" ]; then
    local i
    for i in $(seq 60); do kill -0 "$CLUSTER_VM_PID" 2>/dev/null || break; sleep 1; done
    kill "$CLUSTER_VM_PID" 2>/dev/null || true
  fi
  local pid name
  if [ -s "$CLUSTER_WORK/logs/cpu-vm.txt" ]; then
    csay "CPU time of the run:"
    sed 's/^/  /' "$CLUSTER_WORK/logs/cpu-vm.txt"
    printf '  control plane on the host:'
    while read -r pid name; do
      sed -n 's/^.*) [^ ]* \([^ ]* \)\{10\}\([0-9]*\) \([0-9]*\) .*$/\2 \3/p' "/proc/$pid/stat" 2>/dev/null |
        awk -v n="$name" '{ printf " %s %.0f s", n, ($1 + $2) / 100 }'
    done < "$CLUSTER_WORK/pids"
    echo
  fi
  while read -r pid name; do kill "$pid" 2>/dev/null || true; done < "$CLUSTER_WORK/pids"
  sleep 1
  while read -r pid name; do kill -9 "$pid" 2>/dev/null || true; done < "$CLUSTER_WORK/pids"
  ip netns del "$CLUSTER_NS" 2>/dev/null || true
}
