"""9. The runtime executes the plugin: a deleted pod's address is freed (DEL), and STATUS / GC
are answered where the runtime calls them (read from the agent's metrics: containerd 2.x calls
STATUS on every CRI status poll; no containerd release calls GC or CHECK)."""

from conftest import E2E_NS, agent_metrics, metric


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
