"""2. Pods get their addresses from the Network their binding policy picks: kube-system pods
from the system Network (10.244.0.0/18), others from the default Network (10.244.128.0/17).
Creates the agnhost pods the later checks use: sys-N in kube-system and def-N in lace-e2e, one
per node, each serving HTTP on 8080 with readiness and liveness probes (and check 4's Service
backends, which start beside them but are not waited for here). The 30-pod burst of this item
is check 12, run just before the uninstall (see there why)."""

import ipaddress
import time

from conftest import E2E_NS, SYSTEM_NS, timestamp_seconds

SYSTEM_SUBNET = ipaddress.ip_network("10.244.0.0/18")
DEFAULT_SUBNET = ipaddress.ip_network("10.244.128.0/17")
# The liveness probe tolerates a minute of slow answers: under emulation, with the burst's 30
# sandboxes starting on the VM's two CPUs, CI once saw sys-1 stopped (restarted?) mid-check.
PROBES = """    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 2, timeoutSeconds: 3}
    livenessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 5, timeoutSeconds: 10, failureThreshold: 12}
"""


def test_pods_get_addresses_from_their_networks(cluster):
    nodes = cluster.node_names()
    cluster.state["nodes"] = nodes
    start = time.time()
    pods = []
    for i, node in enumerate(nodes, 1):
        for ns, prefix in ((SYSTEM_NS, "sys"), (E2E_NS, "def")):
            name = f"{prefix}-{i}"
            cluster.agnhost_pod(ns, name, node, labels={"app": "lace-check"}, extra_spec=PROBES)
            pods.append((ns, name))
    cluster.web_backends()  # check 4's, started now beside these
    cluster.wait_pods_ready(SYSTEM_NS, "app=lace-check", len(nodes), timeout=600)
    cluster.wait_pods_ready(E2E_NS, "app=lace-check", len(nodes), timeout=600)
    took = time.time() - start
    # Pod create -> Ready, per pod (the kubelet's own timestamps).
    latencies = []
    for ns, name in pods:
        p = cluster.kj("get", "pod", "-n", ns, name)
        latencies.append(timestamp_seconds(cluster.condition(p, "Ready")["lastTransitionTime"])
                         - timestamp_seconds(p["metadata"]["creationTimestamp"]))
    latencies.sort()
    print(f"\n{len(pods)} pods created -> Ready: p50 {latencies[len(latencies) // 2]:.0f} s, "
          f"max {latencies[-1]:.0f} s (all Ready after {took:.0f} s)")
    ips = {}
    for ns, name in pods:
        got = cluster.pod_ips(ns, name)
        want = SYSTEM_SUBNET if ns == SYSTEM_NS else DEFAULT_SUBNET
        v4 = [a for a in got if ipaddress.ip_address(a).version == 4]
        assert v4 and all(ipaddress.ip_address(a) in want for a in v4), (
            f"expected {ns}/{name} to get an address in {want} (its Network), saw {got}"
        )
        ips[name] = v4[0]
    cluster.state["ips"] = ips
