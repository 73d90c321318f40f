"""9. The runtime executes the plugin: a deleted pod's address is freed (DEL), and STATUS / GC
are answered where the runtime calls them (read from the agent's metrics: containerd 2.x calls
STATUS on every CRI status poll; no containerd release calls GC or CHECK)."""

import re
import socket
import subprocess
import time
import urllib.request

from conftest import AGENT_LABELS, E2E_NS, SYSTEM_NS, CheckFailed


def agent_metrics(cluster, node):
    agent = next(p for p in cluster.pods(SYSTEM_NS, AGENT_LABELS) if p["spec"]["nodeName"] == node)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pf = subprocess.Popen([cluster.kubectl, "-n", SYSTEM_NS, "port-forward", f"pod/{agent['metadata']['name']}",
                           f"{port}:9964"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            except OSError:
                if time.time() > deadline:
                    raise CheckFailed(f"cannot read the agent's metrics on {node} through kubectl port-forward")
                time.sleep(1)
    finally:
        pf.terminate()
        pf.wait()


def metric(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r'([a-z_]+)(\{[^}]*\})? ([0-9.e+]+)', line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


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
    calls = {c: metric(after, "lace_cni_requests_total", command=c) for c in ("ADD", "DEL", "STATUS", "GC", "CHECK")}
    print(f"\nCNI requests the runtime made on {node}: {calls}")
    assert calls["DEL"] >= 1 and calls["ADD"] >= 1, f"expected ADD and DEL on {node}, saw {calls}"
    assert calls["STATUS"] > metric(before, "lace_cni_requests_total", command="STATUS"), (
        f"expected containerd to keep calling STATUS, saw {calls['STATUS']} after and "
        f"{metric(before, 'lace_cni_requests_total', command='STATUS')} before")
