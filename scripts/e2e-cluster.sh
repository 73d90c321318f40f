#!/usr/bin/env bash
# e2e-cluster.sh - Lace end to end on a real cluster you have: the same checks the test suite
# runs on its own cluster (tests/cluster/checks, see tests/cluster/run.sh), so the two cannot
# drift apart. The cluster must have no CNI yet (nodes NotReady, CoreDNS Pending), at least
# three schedulable Linux nodes, podSubnet covering 10.244.0.0/16 (kubeadm's samples), and
# kubectl and helm pointed at it; the checks install both charts from this checkout as the
# README's Install section says and uninstall them at the end.
#
#   scripts/e2e-cluster.sh [--kind CLUSTER] [--archive FILE] [--prefix 2001:db8:100::/48]
#                          [--set VALUE=X]... [PYTEST_ARGS...]
#   --kind CLUSTER  load the image archive into kind cluster CLUSTER first (on kubeadm nodes
#                   import it yourself: ctr -n k8s.io images import FILE, or push it to a
#                   registry the nodes pull from and --set image.repository=...)
#   --archive FILE  the image archive (default: the one scripts/build-image.sh wrote)
#   --prefix P      controller.srv6LocatorPrefix
#   --set V=X       more plugin chart values, e.g. node.kubeletCgroupPath=... where the kubelet
#                   does not run in /sys/fs/cgroup/system.slice/kubelet.service
# env: LACE_E2E_TEST  the upstream e2e.test binary for the NetworkPolicy check (default: e2e.test
#      on PATH, else built from its Go module when Go is installed; without Go, leave that check
#      out with -k 'not upstream')
#      LACE_CHECKS_OUTSIDE=0  leave out the NodePort checks from this machine (when it cannot
#      reach the nodes' InternalIPs); LACE_WRONG_CGROUP  an existing cgroup that is not the
#      kubelet's (default: containerd's), for the probe check
set -euo pipefail
cd "$(dirname "$0")/.."

kind_cluster='' archive='' prefix=2001:db8:100::/48 sets=() args=()
while [ $# -gt 0 ]; do
  case $1 in
    --kind) kind_cluster=$2; shift 2 ;;
    --archive) archive=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --set) sets+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
for tool in kubectl helm python3; do
  command -v "$tool" >/dev/null || { echo "e2e-cluster: $tool not found" >&2; exit 1; }
done
python3 -c 'import pytest' 2>/dev/null || python3 -m pip install -q pytest ||
  { echo "e2e-cluster: could not pip install pytest" >&2; exit 1; }

if [ -n "$kind_cluster" ]; then
  archive=${archive:-$(find .cache/image -maxdepth 1 -name 'lace-cni-*-amd64.oci.tar' 2>/dev/null | head -1)}
  [ -f "$archive" ] || { echo "e2e-cluster: no image archive; run scripts/build-image.sh" >&2; exit 1; }
  kind load image-archive "$archive" --name "$kind_cluster"
fi

for s in "${sets[@]}"; do
  case $s in node.kubeletCgroupPath=*) export LACE_KUBELET_CGROUP=${s#*=};; esac
done
export LACE_CHART_DIR=$PWD LACE_SRV6_PREFIX=$prefix
LACE_HELM_SET=$(IFS=,; echo "${sets[*]}")
export LACE_HELM_SET KUBECTL=kubectl HELM=helm
# The upstream NetworkPolicy e2e check needs the e2e.test binary of the Kubernetes version in
# scripts/k8s-versions (built from its Go module when Go is there).
if [ -z "${LACE_E2E_TEST:-}" ] && ! command -v e2e.test >/dev/null && command -v go >/dev/null; then
  LACE_E2E_TEST=$(scripts/k8s-components.sh --path e2e)/e2e.test && export LACE_E2E_TEST
fi
exec python3 -m pytest -p no:cacheprovider -s -ra -x "${args[@]:-tests/cluster/checks}"
