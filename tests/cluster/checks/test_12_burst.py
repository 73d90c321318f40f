"""12. (The second half of item 2 of the checks.) 30 pods of one Deployment created at once: the
time from create to Ready (p50, max), each with its own address from the default Network, and
how long Lace's agents took for their ADDs.

It runs last with Lace installed, and its pods are never deleted. Deleting them, all at once
(CI on 566900d) or ten at a time (53d4799), saturated the emulated VM: containerd's first delete
of an exited task missed its 10 s deadline ("failed to drain init process ... io") and its
retries kept failing (containerd/containerd#10755), leaving pods Terminating for over ten
minutes. Left idle they cost the VM's CPU too (a shim and the kubelet's polling per pod): with
the burst in check 2, checks 3-11 took about twice as long (check 10: 762 s against 231 s)."""

import ipaddress
import time

from conftest import E2E_NS, PAUSE, agent_metrics, metric, timestamp_seconds
from test_02_addresses import DEFAULT_SUBNET

BURST = 30


def add_seconds(cluster):
    """Per node: (seconds the agent spent on CNI ADDs, how many), from its metrics."""
    out = {}
    for node in cluster.nodes():
        m = agent_metrics(cluster, node)
        out[node] = (metric(m, "lace_cni_request_duration_seconds_sum", verb="ADD"),
                     metric(m, "lace_cni_request_duration_seconds_count", verb="ADD"))
    return out


def test_a_burst_of_pods_gets_ready(cluster):
    before = add_seconds(cluster)
    cluster.apply(f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: burst, namespace: {E2E_NS}}}
spec:
  replicas: {BURST}
  selector: {{matchLabels: {{app: lace-burst}}}}
  template:
    metadata: {{labels: {{app: lace-burst}}}}
    spec:
      containers: [{{name: pause, image: "{PAUSE}"}}]
""")
    start = time.time()
    cluster.wait_pods_ready(E2E_NS, "app=lace-burst", BURST, timeout=900)
    took = time.time() - start
    pods = cluster.pods(E2E_NS, "app=lace-burst")
    latencies = sorted(timestamp_seconds(cluster.condition(p, "Ready")["lastTransitionTime"])
                       - timestamp_seconds(p["metadata"]["creationTimestamp"]) for p in pods)
    print(f"\n{len(pods)} pods of one Deployment created -> Ready: p50 "
          f"{latencies[len(latencies) // 2]:.0f} s, max {latencies[-1]:.0f} s "
          f"(all Ready after {took:.0f} s, on {len({p['spec']['nodeName'] for p in pods})} nodes)")
    after = add_seconds(cluster)
    spent = sum(after[n][0] - before[n][0] for n in after)
    adds = sum(after[n][1] - before[n][1] for n in after)
    print(f"Lace's agents handled their {adds:.0f} ADDs in {spent / max(adds, 1) * 1000:.0f} ms "
          "each on average (the rest of create -> Ready is the scheduler, kubelet and runtime)")
    v4 = [a["ip"] for p in pods for a in p["status"]["podIPs"] if ":" not in a["ip"]]
    assert len(v4) == BURST and len(set(v4)) == BURST, (
        f"expected {BURST} distinct IPv4 addresses, saw {sorted(v4)}")
    outside = [a for a in v4 if ipaddress.ip_address(a) not in DEFAULT_SUBNET]
    assert not outside, f"expected every burst pod in {DEFAULT_SUBNET}, saw {outside}"
    # The burst stays up until the cluster goes (check 13's uninstall leaves running pods be).
