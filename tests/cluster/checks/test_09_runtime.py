"""9. The runtime executes the plugin: a deleted pod's address is freed (DEL), and STATUS / GC
are answered where the runtime calls them (read from the agent's metrics: containerd 2.x calls
STATUS on every CRI status poll; no containerd release calls GC or CHECK).

hostPorts: a pod's `ports[].hostPort` reaches Lace from the kubelet through the runtime
(containerd passes it as the `portMappings` capability the conflist declares) and is reached
from outside the cluster on the pod's node only, whatever the pod's Network; once the pod is
deleted the port is gone. From where these checks run, outside the cluster (as check 4's
NodePort): LACE_CHECKS_OUTSIDE=0 leaves it out, saying so.

Bandwidth: a pod's `kubernetes.io/ingress-bandwidth` / `egress-bandwidth` annotations reach
Lace from the kubelet through the runtime (the `bandwidth` capability) and shape the pod: the
agent pod's `tc` shows the token bucket filters on its node, and the pod's shaper goes with it.
(The rates themselves are measured with iperf3 by the netns test `bandwidth`.)"""

import os
import re

import pytest

from conftest import (AGENT_LABELS, AGNHOST, E2E_NS, SYSTEM_NS, CheckFailed, agent_metrics,
                      connects, metric)


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


def test_bandwidth_annotations_shape_the_pod_until_it_goes(cluster):
    node = cluster.nodes()[1]
    agent = next(p["metadata"]["name"] for p in cluster.pods(SYSTEM_NS, AGENT_LABELS)
                 if p["spec"].get("nodeName") == node)
    cluster.agnhost_pod(E2E_NS, "shaped", node, labels={"role": "shaped"},
                        annotations={"kubernetes.io/ingress-bandwidth": "10M",
                                     "kubernetes.io/egress-bandwidth": "20M"})
    try:
        cluster.wait_pods_ready(E2E_NS, "role=shaped", 1, timeout=300)
    except CheckFailed as e:
        raise CheckFailed(f"{e}; {cluster.pod_story(E2E_NS, 'shaped')}") from e

    # ADD shapes the pod before it answers, so the pod's Ready means its tbfs are there.
    out = cluster.exec(SYSTEM_NS, agent, "tc", "qdisc", "show", check=True).stdout
    shaped = dict(re.findall(r"qdisc tbf 4c: dev (\S+) root .*? rate (\S+)", out))
    # 10M towards the pod on its veth lp-X, 20M from it on its shaper ls-X.
    pairs = {dev[3:]: (rate, shaped.get("ls-" + dev[3:])) for dev, rate in shaped.items()
             if dev.startswith("lp-")}
    assert list(pairs.values()) == [("10Mbit", "20Mbit")], (
        f"expected one pod veth lp-X on {node} with a tbf of 10Mbit and its shaper ls-X with "
        f"20Mbit (the pod's ingress-bandwidth and egress-bandwidth annotations), saw {shaped} in "
        f"`tc qdisc show` of agent pod {agent}:\n{out}")
    shaper = "ls-" + next(iter(pairs))
    cluster.k("-n", E2E_NS, "delete", "pod", "shaped", "--timeout=300s", timeout=320)

    def gone():
        links = cluster.exec(SYSTEM_NS, agent, "ip", "-o", "link", "show", check=True).stdout
        return shaper not in links, [w for w in links.split() if w.startswith("ls-")]
    cluster.wait(f"the pod's shaper {shaper} gone from {node} with the pod", gone, timeout=60)
    print(f"\npod shaped on {node}: tbf 10Mbit towards it, 20Mbit from it on {shaper}; gone with the pod")
