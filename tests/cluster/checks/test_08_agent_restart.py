"""8. A node's agent pod deleted under traffic: pings between pods on different nodes lose
nothing while the DaemonSet replaces it (the datapath is the kernel's; the agent is only its
programmer)."""

import re
import time

from conftest import AGENT_LABELS, SYSTEM_NS, CheckFailed


def ping_while(cluster, src, dst_ip, action, interval=0.2):
    """Pings dst_ip from kube-system/src every `interval` s while action() runs; returns
    (sent, received, ping's output)."""
    # In the background of the pod's kept-open shell, stopped with the shell's own kill (the
    # image has no pkill, and kubectl exec forwards no signal to the remote process).
    # (The agnhost image has no /tmp.)
    cluster.in_pod(SYSTEM_NS, src, f"mkdir -p /tmp; ping -i {interval} -W 2 {dst_ip} >/tmp/lace-ping.out 2>&1 & "
                   "echo $! >/tmp/lace-ping.pid")
    try:
        time.sleep(5)
        action()
        time.sleep(5)
    finally:
        out = cluster.in_pod(SYSTEM_NS, src, "kill -INT $(cat /tmp/lace-ping.pid); sleep 1; "
                             "cat /tmp/lace-ping.out || echo 'the pod restarted during the check'")
    return (*ping_counts(out, f"ping from {src} to {dst_ip}"), out)


def ping_counts(out, what):
    """(sent, received) from ping's output. The request sent just before the interrupt has had no
    time for its reply (ping exits at once on SIGINT and counts it lost): it counts as neither,
    unless a later one was lost too."""
    sent = next((int(l.split()[0]) for l in out.splitlines() if "packets transmitted" in l), None)
    if sent is None:
        raise CheckFailed(f"{what} printed no summary:\n{out[-500:]}")
    # busybox's ping (the agnhost image's) numbers from seq=0, iputils' from icmp_seq=1.
    first = 1 if "icmp_seq=" in out else 0
    seqs = {int(m) - first for m in re.findall(r"bytes from .*seq=(\d+)", out)}
    if sent - 1 not in seqs and seqs == set(range(sent - 1)):
        return sent - 1, len(seqs)
    return sent, len(seqs)


def pingers(cluster):
    """Two pods without probes in the system Network, on the first two nodes: {name: IPv4}.
    The checks' probed pods are not used for traffic across restarts: check 5's wrong kubelet
    cgroup makes their liveness probes fail and the kubelet restart them for a while after."""
    if "pingers" not in cluster.state:
        nodes = cluster.nodes()
        for i, node in enumerate(nodes[:2], 1):
            cluster.agnhost_pod(SYSTEM_NS, f"pinger-{i}", node, labels={"app": "lace-pinger"})
        cluster.wait_pods_ready(SYSTEM_NS, "app=lace-pinger", 2, timeout=600)
        cluster.state["pingers"] = {n: [a for a in cluster.pod_ips(SYSTEM_NS, n) if ":" not in a][0]
                                    for n in ("pinger-1", "pinger-2")}
    return cluster.state["pingers"]


def test_agent_restart_loses_no_packet(cluster):
    nodes = cluster.nodes()
    agent = next(p for p in cluster.pods(SYSTEM_NS, AGENT_LABELS) if p["spec"].get("nodeName") == nodes[0])
    old = agent["metadata"]["name"]
    took = {}

    def restart():
        t0 = time.time()
        cluster.k("-n", SYSTEM_NS, "delete", "pod", old)

        def replaced():
            ps = [p for p in cluster.pods(SYSTEM_NS, AGENT_LABELS) if p["spec"].get("nodeName") == nodes[0]]
            ok = any(p["metadata"]["name"] != old and (cluster.condition(p, "Ready") or {}).get("status") == "True" for p in ps)
            return ok, [p["metadata"]["name"] for p in ps]
        cluster.wait(f"a new Ready agent on {nodes[0]}", replaced, timeout=300)
        took["s"] = time.time() - t0

    sent, received, out = ping_while(cluster, "pinger-1", pingers(cluster)["pinger-2"], restart)
    print(f"\nagent on {nodes[0]} replaced in {took.get('s', 0):.0f} s; pings pinger-1 -> pinger-2: {sent} sent, {received} received")
    if sent < 20 or received != sent:
        raise CheckFailed(f"expected no lost ping while the agent restarted, saw {sent} sent, {received} received:\n{out[-400:]}")
