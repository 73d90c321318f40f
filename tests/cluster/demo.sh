#!/usr/bin/env bash
# demo.sh - `scripts/demo.sh --cluster`: the test suite's real cluster (tests/cluster/cluster.sh:
# control plane on this machine, three nodes in a VM) with Lace installed exactly as the
# README's Install section says, a few pods in the system and default Networks across the nodes,
# and the matrix of who reaches whom. Prints where to look next; LACE_DEMO_KEEP=1 keeps the
# cluster up until Enter is pressed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# shellcheck source=../../scripts/limits.sh
. scripts/limits.sh
# shellcheck source=cluster.sh
. tests/cluster/cluster.sh
[ "$(id -u)" = 0 ] || { csay "run as root (network namespaces, the VM's tap device)"; exit 1; }
scripts/install-helm.sh >/dev/null
HELM=$ROOT/.cache/bin/helm4
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' chart/Chart.yaml)
archive=$ROOT/.cache/image/lace-cni-$version-amd64.oci.tar
[ -s "$archive" ] || scripts/build-image.sh --out "$archive" >&2
CLUSTER_IMAGES=$(tests/cluster/images.sh | awk '{ print $3 }'; echo "$archive")
export LACE_CLUSTER_LIMIT=${LACE_CLUSTER_LIMIT:-$(limit_of vm:demo-cluster)}
trap cluster_down EXIT
cluster_up
h() { in_ns env KUBECONFIG="$CLUSTER_WORK/kubeconfig/admin.conf" "$HELM" "$@"; }
step() { echo; echo "== $*"; }

step "before Lace: nodes NotReady, CoreDNS Pending"
k get nodes
step "helm install lace ./chart --namespace kube-system --set controller.srv6LocatorPrefix=2001:db8:100::/48"
h install lace ./chart --namespace kube-system --set controller.srv6LocatorPrefix=2001:db8:100::/48 >/dev/null
step "helm install lace-networks ./chart-networks --namespace kube-system"
h install lace-networks ./chart-networks --namespace kube-system >/dev/null
k wait --for=condition=Ready node --all --timeout=600s >/dev/null
k -n kube-system wait --for=condition=Ready pod -l k8s-app=kube-dns --timeout=600s >/dev/null

step "pods in two Networks on two nodes (agnhost netexec on :8080)"
k create namespace demo >/dev/null
pod() { # NAMESPACE NAME NODE
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $2, namespace: $1}
spec:
  nodeName: $3
  terminationGracePeriodSeconds: 1
  containers:
  - name: agnhost
    image: registry.k8s.io/e2e-test-images/agnhost:2.66.1
    args: [netexec, --http-port=8080]
    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 2}
EOF
}
pod kube-system sys-a node-1; pod kube-system sys-b node-2
pod demo def-a node-1; pod demo def-b node-2
k -n kube-system wait --for=condition=Ready pod sys-a sys-b --timeout=600s >/dev/null
k -n demo wait --for=condition=Ready pod def-a def-b --timeout=600s >/dev/null
k get nodes,pods -A -o wide

step "who reaches whom (TCP :8080): system reaches itself; default reaches nothing, itself included"
declare -A NSOF=([sys-a]=kube-system [sys-b]=kube-system [def-a]=demo [def-b]=demo)
printf '%-8s' from; for d in sys-a sys-b def-a def-b; do printf '%-8s' "$d"; done; echo
for s in sys-a def-a; do
  printf '%-8s' "$s"
  for d in sys-a sys-b def-a def-b; do
    if [ "$s" = "$d" ]; then printf '%-8s' -; continue; fi
    ip=$(k -n "${NSOF[$d]}" get pod "$d" -o jsonpath='{.status.podIP}')
    if k -n "${NSOF[$s]}" exec "$s" -- /agnhost connect "$ip:8080" --timeout 3s >/dev/null 2>&1; then
      printf '%-8s' yes; else printf '%-8s' no; fi
  done
  echo
done

cat <<EOF

== where to look next
  kubectl (the cluster's admin; the API server is in network namespace $CLUSTER_NS):
    ip netns exec $CLUSTER_NS kubectl --kubeconfig $CLUSTER_WORK/kubeconfig/admin.conf get networks.lace.io,nodeallocations.lace.io
  a node's kernel state (ip, nft) through the VM:
    tests/cluster/node-exec.sh $CLUSTER_WORK node-1 nft list table inet lace
    tests/cluster/node-exec.sh $CLUSTER_WORK node-1 ip route show vrf lv-system
  logs: $CLUSTER_WORK/logs (control plane; per node containerd, kubelet, kube-proxy, pods/)
EOF
if [ "${LACE_DEMO_KEEP:-}" = 1 ]; then
  read -r -p "the cluster stays up until you press Enter " _
fi
