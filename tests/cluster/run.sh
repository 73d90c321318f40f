#!/usr/bin/env bash
# run.sh - the cluster tier: Lace installed with helm into a real Kubernetes cluster and checked
# with tests/cluster/checks (the same checks scripts/e2e-cluster.sh runs on a user's cluster).
#
# Builds what is missing first: the Kubernetes components and the upstream e2e suites' binary
# from Go modules (scripts/k8s-components.sh, cached by version), the test images (tests/cluster/images.sh) and
# Lace's image (scripts/build-image.sh, the archive the image tier leaves in .cache/image).
# Then tests/cluster/cluster.sh brings up the control plane on the host and three nodes in the
# VM, the checks install both charts as the README says and uninstall them at the end.
#
# usage: tests/cluster/run.sh [PYTEST_ARGS...]   (e.g. -k probes; default: every check)
# env: LACE_CLUSTER_KEEP=1   keep the cluster running after the checks until Enter is pressed
#      (the KUBECONFIG and namespace to use are printed)
#      LACE_CLUSTER_LIMIT    the VM's time limit in seconds (default: vm:cluster in
#                            scripts/time-limits)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# shellcheck source=../../scripts/limits.sh
. scripts/limits.sh
# shellcheck source=cluster.sh
. tests/cluster/cluster.sh
T0=$EPOCHREALTIME
secs() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.0f", b-a}'; }

[ "$(id -u)" = 0 ] || { csay "run as root (network namespaces, the VM's tap device)"; exit 1; }
python3 -c 'import pytest' 2>/dev/null || python3 -m pip install -q --disable-pip-version-check pytest ||
  { csay "could not pip install pytest"; exit 1; }
scripts/install-helm.sh >/dev/null
HELM=$ROOT/.cache/bin/helm4

version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' chart/Chart.yaml)
LACE_ARCHIVE=${LACE_IMAGE_ARCHIVE:-$ROOT/.cache/image/lace-cni-$version-amd64.oci.tar}
if [ ! -s "$LACE_ARCHIVE" ]; then
  csay "building Lace's image ($LACE_ARCHIVE is missing)"
  scripts/build-image.sh --out "$LACE_ARCHIVE" >&2
fi
t=$EPOCHREALTIME
CLUSTER_IMAGES=$(tests/cluster/images.sh | awk '{ print $3 }'; echo "$LACE_ARCHIVE")
# The upstream e2e suites' binary, for the check that runs their NetworkPolicy tests.
LACE_E2E_TEST=${LACE_E2E_TEST:-$(scripts/k8s-components.sh --path e2e)/e2e.test}
csay "components and images ready in $(secs "$t")s"

export LACE_CLUSTER_LIMIT=${LACE_CLUSTER_LIMIT:-$(limit_of vm:cluster)}
trap 'rc=$?; [ $rc = 0 ] || csay "logs of the failed run: $CLUSTER_WORK/logs"; [ $rc != 0 ] || rm_work=1; cluster_down; [ -z "${rm_work:-}" ] || rm -rf "$CLUSTER_WORK"; exit $rc' EXIT
t=$EPOCHREALTIME
cluster_up
UP=$(secs "$t")

set +e
ip netns exec "$CLUSTER_NS" env KUBECONFIG="$CLUSTER_WORK/kubeconfig/admin.conf" HELM="$HELM" \
  KUBECTL="$(command -v kubectl)" LACE_CHART_DIR="$ROOT" LACE_CHECKS_STARTED="${T0%.*}" \
  LACE_E2E_TEST="$LACE_E2E_TEST" \
  python3 -m pytest -p no:cacheprovider -s -ra -x --durations=0 "${@:-tests/cluster/checks}"
rc=$?
set -e
csay "cluster up in ${UP}s; the whole run took $(secs "$T0")s"
if [ "${LACE_CLUSTER_KEEP:-}" = 1 ]; then
  echo "cluster kept: ip netns exec $CLUSTER_NS kubectl --kubeconfig $CLUSTER_WORK/kubeconfig/admin.conf get nodes"
  read -r -p "press Enter to stop it " _
fi
exit $rc
