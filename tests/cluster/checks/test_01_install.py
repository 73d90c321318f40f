"""1. Install as the README's Install section says: before, the nodes are NotReady and CoreDNS
Pending (any cluster without a CNI); with the plugin chart alone the nodes turn Ready with
NetworkUnavailable=False (LaceIsUp) but no pod gets an address (no Network binds it), and
`kubectl describe` says why; with the networks chart CoreDNS runs."""

import time

from conftest import SYSTEM_NS, AGENT_LABELS, CheckFailed


def test_before_install_nodes_are_not_ready_and_coredns_pending(cluster):
    nodes = cluster.items("nodes")
    assert len(nodes) >= 3, f"expected at least 3 nodes, saw {[n['metadata']['name'] for n in nodes]}"
    ready = {n["metadata"]["name"]: (cluster.condition(n, "Ready") or {}).get("status") for n in nodes}
    assert all(v != "True" for v in ready.values()), (
        f"expected every node NotReady before a CNI is installed, saw Ready conditions {ready}"
    )
    dns = cluster.pods(SYSTEM_NS, "k8s-app=kube-dns")
    phases = {p["metadata"]["name"]: p["status"].get("phase") for p in dns}
    assert dns and all(v == "Pending" for v in phases.values()), (
        f"expected the CoreDNS pods Pending before a CNI is installed, saw {phases}"
    )


def test_plugin_chart_turns_nodes_ready(cluster):
    args = ["install", "lace", str(cluster.chart_dir / "chart"), "--namespace", SYSTEM_NS,
            "--set", f"controller.srv6LocatorPrefix={cluster.prefix}"]
    for s in cluster.helm_set:
        args += ["--set", s]
    cluster.helm_run(*args)
    cluster.state["installed_at"] = time.time()

    def ready():
        seen = {}
        for n in cluster.items("nodes"):
            r = cluster.condition(n, "Ready") or {}
            nu = cluster.condition(n, "NetworkUnavailable") or {}
            seen[n["metadata"]["name"]] = (
                f"Ready={r.get('status')} NetworkUnavailable={nu.get('status')}/{nu.get('reason')}"
            )
        ok = all(v.startswith("Ready=True") and "NetworkUnavailable=False/LaceIsUp" in v
                 for v in seen.values())
        return ok, seen
    cluster.wait("every node Ready with NetworkUnavailable=False (reason LaceIsUp)", ready, timeout=600)


def test_without_networks_pods_get_no_address_and_describe_says_why(cluster):
    # No Network exists yet: CoreDNS is scheduled now that the nodes are Ready, and its sandbox
    # fails at CNI ADD with Lace's message, which the kubelet records as an Event.
    def failed_sandbox():
        events = cluster.items("events", "-n", SYSTEM_NS, "--field-selector",
                               "reason=FailedCreatePodSandBox")
        msgs = [e["message"] for e in events if e["involvedObject"]["name"].startswith("coredns")]
        return any("NetworkBindingPolicy" in m for m in msgs), msgs[-1:] or "no FailedCreatePodSandBox event"
    msg = cluster.wait("a FailedCreatePodSandBox event on CoreDNS naming the missing NetworkBindingPolicy",
                       failed_sandbox, timeout=300)
    pod = cluster.pods(SYSTEM_NS, "k8s-app=kube-dns")[0]
    assert not pod["status"].get("podIP"), f"expected no address for {pod['metadata']['name']}, saw {pod['status'].get('podIP')}"
    described = cluster.k("-n", SYSTEM_NS, "describe", "pod", pod["metadata"]["name"])
    assert "NetworkBindingPolicy" in described, (
        f"expected `kubectl describe pod` to say no NetworkBindingPolicy matches; it shows:\n{described[-1500:]}"
    )
    print(f"\nwhat `kubectl describe` shows: {msg}")


def test_networks_chart_brings_coredns_up(cluster):
    cluster.helm_run("install", "lace-networks", str(cluster.chart_dir / "chart-networks"),
                     "--namespace", SYSTEM_NS)
    cluster.wait_pods_ready(SYSTEM_NS, "k8s-app=kube-dns", 2, timeout=600)
    agents = cluster.pods(SYSTEM_NS, AGENT_LABELS)
    started = min(c["state"]["running"]["startedAt"] for p in agents
                  for c in p["status"]["containerStatuses"] if "running" in c["state"])
    dns = cluster.pods(SYSTEM_NS, "k8s-app=kube-dns")
    ready = max(cluster.condition(p, "Ready")["lastTransitionTime"] for p in dns)
    secs = _seconds(ready) - _seconds(started)
    cluster.state["agents_to_coredns"] = secs
    print(f"\nagent pods started -> CoreDNS Running and Ready: {secs:.0f} s "
          f"(first agent container {started}, last CoreDNS Ready {ready})")
    if secs < 0:
        raise CheckFailed(f"CoreDNS was Ready ({ready}) before any agent ran ({started})")


def _seconds(ts):
    return time.mktime(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ"))
