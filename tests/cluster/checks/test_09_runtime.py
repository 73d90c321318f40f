"""9. The runtime executes the plugin: a deleted pod's address is freed (DEL), and STATUS / GC
are answered where the runtime calls them (read from the agent's metrics: containerd 2.x calls
STATUS on every CRI status poll; no containerd release calls GC or CHECK).

hostPorts: a pod's `ports[].hostPort` reaches Lace from the kubelet through the runtime
(containerd passes it as the `portMappings` capability the conflist declares) and is reached
from outside the cluster on the pod's node only, whatever the pod's Network; once the pod is
deleted the port is gone. From where these checks run, outside the cluster (as check 4's
NodePort): LACE_CHECKS_OUTSIDE=0 leaves it out, saying so."""

import os

import pytest

from conftest import AGNHOST, E2E_NS, CheckFailed, agent_metrics, connects, metric


def test_delete_frees_the_address_and_status_is_called(cluster):
    node = cluster.nodes()[2]
    before = agent_metrics(cluster, node)
    in_use = metric(before, "lace_addresses_in_use", network="default")
    cluster.agnhost_pod(E2E_NS, "short-lived", node)
    cluster.wait_pods_ready(E2E_NS, "lace-check=true", len(cluster.pods(E2E_NS, "lace-check=true")), timeout=300)
    during = metric(agent_metrics(cluster, node), "lace_addresses_in_use", network="default")
    assert during == in_use + 1, f"expected {in_use + 1} default addresses in use on {node} with the pod, saw {during}"
    cluster.k("-n", E2E_NS, "delete", "pod", "short-lived", "--timeout=300s", timeout=320)

    def freed():
        m = agent_metrics(cluster, node)
        return metric(m, "lace_addresses_in_use", network="default") == in_use, metric(m, "lace_addresses_in_use", network="default")
    cluster.wait(f"the pod's address freed on {node} after the pod was deleted", freed, timeout=120)
    after = agent_metrics(cluster, node)
    calls = {c: metric(after, "lace_cni_requests_total", verb=c) for c in ("ADD", "DEL", "STATUS", "GC", "CHECK")}
    print(f"\nCNI requests the runtime made on {node}: {calls}")
    assert calls["DEL"] >= 1 and calls["ADD"] >= 1, f"expected ADD and DEL on {node}, saw {calls}"
    assert calls["STATUS"] > metric(before, "lace_cni_requests_total", verb="STATUS"), (
        f"expected containerd to keep calling STATUS, saw {calls['STATUS']} after and "
        f"{metric(before, 'lace_cni_requests_total', verb='STATUS')} before")


HOST_PORT = 18080


def test_host_port_reached_from_outside_on_the_pods_node(cluster):
    if os.environ.get("LACE_CHECKS_OUTSIDE", "1") == "0":
        pytest.skip("hostPort from outside the cluster: left out (LACE_CHECKS_OUTSIDE=0)")
    nodes = cluster.nodes()
    node = nodes[1]
    ips = {n["metadata"]["name"]: a["address"] for n in cluster.items("nodes")
           for a in n["status"]["addresses"] if a["type"] == "InternalIP" and ":" not in a["address"]}
    cluster.apply(f"""apiVersion: v1
kind: Pod
metadata: {{name: host-port, namespace: {E2E_NS}, labels: {{lace-check: "true", role: host-port}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: agnhost
    image: {AGNHOST}
    args: [netexec, --http-port=8080]
    ports: [{{containerPort: 8080, hostPort: {HOST_PORT}}}]
""")
    try:
        cluster.wait_pods_ready(E2E_NS, "role=host-port", 1, timeout=300)
    except CheckFailed as e:
        raise CheckFailed(f"{e}; {cluster.pod_story(E2E_NS, 'host-port')}") from e

    def reached():
        got = {n: connects(ip, HOST_PORT) for n, ip in ips.items()}
        return got == {n: n == node for n in ips}, got
    cluster.wait(f"hostPort {HOST_PORT} reached from outside on {node} ({ips[node]}) and on no "
                 "other node (the pod is in the default Network, granted to no one)",
                 reached, timeout=60, interval=2)
    cluster.k("-n", E2E_NS, "delete", "pod", "host-port", "--timeout=300s", timeout=320)

    def gone():
        return not connects(ips[node], HOST_PORT), ips[node]
    cluster.wait(f"hostPort {HOST_PORT} on {node} gone with its pod", gone, timeout=60)
    print(f"\nhostPort {HOST_PORT} reached on {node} only, gone after the pod was deleted")
