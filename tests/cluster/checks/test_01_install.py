"""1. Install as the README's Install section says: before, the nodes are NotReady and CoreDNS
Pending (any cluster without a CNI); with the plugin chart alone the nodes turn Ready with
NetworkUnavailable=False (LaceIsUp) but no pod gets an address (no Network binds it), and
`kubectl describe` says why; with the networks chart CoreDNS runs."""

import time

from conftest import AGENT_LABELS, E2E_NS, SYSTEM_NS, timestamp_seconds


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
    started = _first_agent_start(cluster)
    secs = time.time() - timestamp_seconds(started)
    cluster.state["agents_to_nodes_ready"] = secs
    print(f"\nagent pods started -> every node Ready (NetworkUnavailable=False): {secs:.0f} s")


def test_every_agent_keeps_its_heap_in_one_malloc_arena(cluster):
    # The image's libc is glibc, whose default is an arena per thread: the agent limits it to
    # one before its first thread (lace::sys::malloc) and logs what it did.
    agents = cluster.pods(SYSTEM_NS, AGENT_LABELS)
    assert agents, "expected the agent's pods after the install"
    for p in agents:
        name = p["metadata"]["name"]
        log = cluster.logs(SYSTEM_NS, name)
        said = [l for l in log.splitlines() if "malloc arenas" in l]
        assert said and "arenas=One" in said[0], (
            f"{name}: expected the log line 'malloc arenas arenas=One', saw "
            f"{said[:1] or log.splitlines()[:5]}")


def test_without_networks_pods_get_no_address_and_describe_says_why(cluster):
    # No Network exists yet: a pod's sandbox fails at CNI ADD with Lace's message, which the
    # kubelet records as an Event that `kubectl describe` shows.
    cluster.k("create", "namespace", E2E_NS)
    cluster.agnhost_pod(E2E_NS, "unbound", cluster.nodes()[0])

    def failed_sandbox():
        events = cluster.items("events", "-n", E2E_NS, "--field-selector",
                               "involvedObject.name=unbound,reason=FailedCreatePodSandBox")
        msgs = [e["message"] for e in events]
        return any("NetworkBindingPolicy" in m for m in msgs), msgs[-1:] or "no FailedCreatePodSandBox event"
    msg = cluster.wait("a FailedCreatePodSandBox event on the pod naming the missing NetworkBindingPolicy",
                       failed_sandbox, timeout=300)
    pod = cluster.kj("get", "pod", "-n", E2E_NS, "unbound")
    assert not pod["status"].get("podIP"), f"expected no address for {E2E_NS}/unbound, saw {pod['status'].get('podIP')}"
    described = cluster.k("-n", E2E_NS, "describe", "pod", "unbound")
    assert "matches no NetworkBindingPolicy" in described, (
        f"expected `kubectl describe pod` to say no NetworkBindingPolicy matches; it shows:\n{described[-1500:]}"
    )
    cluster.k("-n", E2E_NS, "delete", "pod", "unbound", "--wait=false")
    print(f"\nwhat `kubectl describe` shows: {msg}")


def test_networks_chart_brings_coredns_up(cluster):
    t0 = time.time()
    cluster.helm_run("install", "lace-networks", str(cluster.chart_dir / "chart-networks"),
                     "--namespace", SYSTEM_NS)
    cluster.wait_pods_ready(SYSTEM_NS, "k8s-app=kube-dns", 2, timeout=600)
    secs = time.time() - t0
    print(f"\nnetworks chart installed -> CoreDNS Running and Ready: {secs:.0f} s; agent pods "
          f"started -> every node Ready: {cluster.state.get('agents_to_nodes_ready', 0):.0f} s")


def _first_agent_start(cluster):
    agents = cluster.pods(SYSTEM_NS, AGENT_LABELS)
    return min(c["state"]["running"]["startedAt"] for p in agents
               for c in p["status"].get("containerStatuses", []) if "running" in c["state"])
