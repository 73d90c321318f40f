"""5. Probes: pods with HTTP liveness and readiness probes become Ready and stay up through the
kubelet-only probe allowance (nothing else on the host reaches a pod); with
node.kubeletCgroupPath pointing at another cgroup (containerd's) the kubelet's probes are
refused and a new pod never becomes Ready; set back, it does."""

import os
import time

from conftest import AGENT_LABELS, E2E_NS, SYSTEM_NS, CheckFailed, timestamp_seconds

RIGHT = os.environ.get("LACE_KUBELET_CGROUP", "/sys/fs/cgroup/system.slice/kubelet.service")
WRONG = os.environ.get("LACE_WRONG_CGROUP", "/sys/fs/cgroup/system.slice/containerd.service")
PROBED = """    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 2, timeoutSeconds: 3}
"""


def restarts(cluster):
    return {p["metadata"]["name"]: sum(c["restartCount"] for c in p["status"]["containerStatuses"])
            for ns in (SYSTEM_NS, E2E_NS) for p in cluster.pods(ns, "app=lace-check")}


# How long the probed pods must have run: a few liveness periods.
STAYED_UP = 30


def test_probed_pods_are_ready_and_stay_up(cluster):
    before = restarts(cluster)
    # Check 2 made them minutes ago (the checks between take longer than this): wait only for
    # what the youngest lacks, as when this module runs alone.
    pods = [p for ns in (SYSTEM_NS, E2E_NS) for p in cluster.pods(ns, "app=lace-check")]
    started = [timestamp_seconds(p["status"]["startTime"])
               for p in pods if p["status"].get("startTime")]
    time.sleep(max(0.0, STAYED_UP - (time.time() - max(started, default=time.time()))))
    pods = [p for ns in (SYSTEM_NS, E2E_NS) for p in cluster.pods(ns, "app=lace-check")]
    not_ready = [p["metadata"]["name"] for p in pods
                 if (cluster.condition(p, "Ready") or {}).get("status") != "True"]
    after = restarts(cluster)
    assert not not_ready and after == before and not any(after.values()), (
        f"expected every probed pod Ready with no restarts; not Ready: {not_ready}, "
        f"restarts before {before}, after {after}"
    )


def upgrade_cgroup(cluster, path):
    cluster.helm_run("upgrade", "lace", str(cluster.chart_dir / "chart"), "--namespace", SYSTEM_NS,
                     "--reuse-values", "--set", f"node.kubeletCgroupPath={path}")
    # All agents replaced at once rather than one node at a time (the chart's maxUnavailable 1):
    # three rolling replacements under emulation took five minutes of the suite for the two
    # upgrades. Check 8 shows an agent's pod deleted under traffic loses nothing.
    def observed():
        ds = cluster.kj("-n", SYSTEM_NS, "get", "daemonset", "lace-node")
        seen = (ds["metadata"]["generation"], ds["status"].get("observedGeneration"))
        return seen[0] == seen[1], f"generation {seen[0]}, observed {seen[1]}"
    cluster.wait("the DaemonSet controller to see the new template", observed, timeout=120)
    cluster.k("-n", SYSTEM_NS, "delete", "pod", "-l", AGENT_LABELS, "--wait=false")
    cluster.k("-n", SYSTEM_NS, "rollout", "status", "daemonset/lace-node", "--timeout=900s",
              timeout=960)


def test_a_wrong_kubelet_cgroup_keeps_probed_pods_from_becoming_ready(cluster):
    node = cluster.nodes()[0]
    upgrade_cgroup(cluster, WRONG)
    try:
        cluster.agnhost_pod(E2E_NS, "probe-wrong", node, extra_spec=PROBED)
        def failing():
            p = cluster.kj("get", "pod", "-n", E2E_NS, "probe-wrong")
            running = any("running" in c["state"] for c in p["status"].get("containerStatuses", []))
            ready = (cluster.condition(p, "Ready") or {}).get("status")
            events = cluster.items("events", "-n", E2E_NS, "--field-selector",
                                   "involvedObject.name=probe-wrong,reason=Unhealthy")
            return running and ready != "True" and len(events) > 0, f"running={running} Ready={ready} Unhealthy events={len(events)}"
        cluster.wait(f"probe-wrong running but never Ready, its readiness probe failing, with "
                     f"node.kubeletCgroupPath={WRONG}", failing, timeout=300)
        p = cluster.kj("get", "pod", "-n", E2E_NS, "probe-wrong")
        if (cluster.condition(p, "Ready") or {}).get("status") == "True":
            raise CheckFailed(f"probe-wrong became Ready although the kubelet's cgroup is not {WRONG}")
    finally:
        upgrade_cgroup(cluster, RIGHT)
    cluster.wait_pods_ready(E2E_NS, "lace-check=true", len(cluster.pods(E2E_NS, "lace-check=true")),
                            timeout=300)
    cluster.k("-n", E2E_NS, "delete", "pod", "probe-wrong", "--wait=false")
