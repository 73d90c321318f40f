#!/usr/bin/env bash
# e2e-cluster.sh - Lace end to end on a real cluster you have (kind with containerd, or a
# kubeadm cluster with podSubnet 10.244.0.0/16 and no other CNI), with kubectl and helm pointed
# at it and at least two schedulable Linux nodes. It cannot run in this repository's CI (no
# API server there). It:
#   1. loads the image archive (kind load image-archive; on kubeadm nodes import it yourself:
#      ctr -n k8s.io images import FILE),
#   2. installs both charts with the installation guide's commands (from ./chart*),
#   3. waits for the nodes to be Ready and CoreDNS Running,
#   4. starts agnhost pods in two Networks (system: kube-system; default: namespace lace-e2e)
#      on two nodes, with HTTP readiness probes (the kubelet probe path), and checks the policy
#      matrix: system -> system and default -> system (an extra routing policy) connect,
#      nothing connects to default,
#   5. runs helm upgrade --reuse-values on both charts and checks the matrix again,
#   6. deletes the pods, uninstalls both charts, and lists what the guide says stays on a node
#      (CNI binary and conflist, pinned BPF objects, Lace's interfaces).
#
#   scripts/e2e-cluster.sh [--kind CLUSTER] [--archive FILE] [--prefix 2001:db8:100::/48]
set -euo pipefail
cd "$(dirname "$0")/.."

kind_cluster='' archive='' prefix=2001:db8:100::/48
while [ $# -gt 0 ]; do
  case $1 in
    --kind) kind_cluster=$2; shift 2 ;;
    --archive) archive=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "e2e-cluster: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for tool in kubectl helm; do
  command -v "$tool" >/dev/null || { echo "e2e-cluster: $tool not found" >&2; exit 1; }
done
NS=kube-system E2E=lace-e2e AGNHOST=registry.k8s.io/e2e-test-images/agnhost:2.53
FAILED=0
step() { echo; echo "== $*"; }
check() { # check WHAT CMD...: run CMD, report and count
  local what=$1; shift
  if "$@" >/dev/null 2>&1; then echo "ok   $what"; else echo "FAIL $what"; FAILED=$((FAILED + 1)); fi
}

step "image"
if [ -n "$kind_cluster" ]; then
  archive=${archive:-$(find .cache/image -maxdepth 1 -name 'lace-cni-*-amd64.oci.tar' 2>/dev/null | head -1)}
  [ -f "$archive" ] || { echo "e2e-cluster: no image archive; run scripts/build-image.sh" >&2; exit 1; }
  kind load image-archive "$archive" --name "$kind_cluster"
else
  echo "not kind: the nodes must have the image (ctr -n k8s.io images import ARCHIVE) or pull it"
fi

step "install (the guide's commands, charts from this checkout)"
helm install lace ./chart --namespace "$NS" --set controller.srv6LocatorPrefix="$prefix"
helm install lace-networks ./chart-networks --namespace "$NS" --set-json \
  'extraRoutingPolicies={"e2e-default-to-system":{"matchKind":["pod"],"from":"default","to":"system"}}'

step "nodes Ready, CoreDNS Running"
kubectl -n "$NS" rollout status daemonset/lace-node --timeout=300s
kubectl -n "$NS" rollout status deployment/lace-controller --timeout=300s
kubectl wait --for=condition=Ready node --all --timeout=300s
kubectl -n "$NS" wait --for=condition=Ready pod -l k8s-app=kube-dns --timeout=300s

step "pods in two Networks on two nodes"
mapfile -t nodes < <(kubectl get nodes -o jsonpath='{range .items[?(@.spec.unschedulable!=true)]}{.metadata.name}{"\n"}{end}' | head -2)
[ ${#nodes[@]} = 2 ] || { echo "e2e-cluster: needs two schedulable nodes" >&2; exit 1; }
kubectl create namespace "$E2E" --dry-run=client -o yaml | kubectl apply -f -
pod() { # pod NAMESPACE NAME NODE
  kubectl apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $2, namespace: $1, labels: {app: lace-e2e}}
spec:
  nodeName: $3
  tolerations: [{operator: Exists}]
  containers:
    - name: agnhost
      image: $AGNHOST
      args: [netexec, --http-port=8080]
      readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 2}
YAML
}
pod "$NS" e2e-sys-0 "${nodes[0]}"; pod "$NS" e2e-sys-1 "${nodes[1]}"
pod "$E2E" e2e-def-0 "${nodes[0]}"; pod "$E2E" e2e-def-1 "${nodes[1]}"
# Ready means the kubelet's probes reached every pod, including those nobody else may reach.
kubectl -n "$NS" wait --for=condition=Ready pod -l app=lace-e2e --timeout=300s
kubectl -n "$E2E" wait --for=condition=Ready pod -l app=lace-e2e --timeout=300s
ip_of() { kubectl -n "$1" get pod "$2" -o jsonpath='{.status.podIP}'; }
declare -A IP NSOF=([e2e-sys-0]=$NS [e2e-sys-1]=$NS [e2e-def-0]=$E2E [e2e-def-1]=$E2E)
for p in "${!NSOF[@]}"; do IP[$p]=$(ip_of "${NSOF[$p]}" "$p"); echo "$p ${IP[$p]}"; done

matrix() {
  local src dst want
  for src in e2e-sys-0 e2e-def-0; do
    for dst in e2e-sys-0 e2e-sys-1 e2e-def-0 e2e-def-1; do
      [ "$src" = "$dst" ] && continue
      case $dst in e2e-sys-*) want=connects ;; *) want=refused ;; esac
      local connect=(kubectl -n "${NSOF[$src]}" exec "$src" -- /agnhost connect "${IP[$dst]}:8080" --timeout=3s)
      if [ $want = connects ]; then
        check "$src -> $dst connects" "${connect[@]}"
      else
        check "$src -> $dst is refused" bash -c '! "$@"' _ "${connect[@]}"
      fi
    done
  done
}
matrix

step "helm upgrade --reuse-values"
helm upgrade lace ./chart --namespace "$NS" --reuse-values
helm upgrade lace-networks ./chart-networks --namespace "$NS" --reuse-values
kubectl -n "$NS" rollout status daemonset/lace-node --timeout=300s
kubectl -n "$NS" rollout status deployment/lace-controller --timeout=300s
matrix

step "uninstall"
kubectl -n "$NS" delete pod -l app=lace-e2e --wait=true
kubectl delete namespace "$E2E" --wait=true
helm uninstall lace-networks --namespace "$NS"
helm uninstall lace --namespace "$NS"
check "the CRDs are gone" bash -c '! kubectl get crd networks.lace.io'

step "what stays behind on ${nodes[0]} (until reboot or manual cleanup)"
kubectl debug "node/${nodes[0]}" --profile=sysadmin --image=busybox:1.36 --attach --quiet -- \
  chroot /host sh -c 'ls -l /opt/cni/bin/lace /etc/cni/net.d/10-lace.conflist; [ ! -e /opt/cni/bin/lace-loopback.json ] || ls -l /opt/cni/bin/loopback /opt/cni/bin/lace-loopback.json; ls -R /sys/fs/bpf/lace; ip -br link | grep -E "^(lv-|lp-)" || true'

echo
echo "e2e-cluster: $FAILED check(s) failed"
[ "$FAILED" = 0 ]
