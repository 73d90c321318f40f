"""13. `helm uninstall` of both charts, after check 11's upgrade: the CRDs and every Lace object are
gone, running pods keep their connectivity until recreated, and what stays on a node is exactly
what the README lists (the CNI binary and conflist, Lace's loopback copy and its settings where
it installed one, the pinned BPF link, Lace's interfaces)."""

from conftest import AGNHOST, SYSTEM_NS, CheckFailed
from test_08_agent_restart import pingers

CRDS = ["networks.lace.io", "networkbindingpolicies.lace.io", "servicebindingpolicies.lace.io",
        "networkroutingpolicies.lace.io", "serviceroutingpolicies.lace.io",
        "networkallocations.lace.io", "nodeallocations.lace.io"]


def test_uninstall_removes_lace_objects_and_leaves_what_the_readme_lists(cluster):
    to = pingers(cluster)["pinger-2"]
    cluster.helm_run("uninstall", "lace-networks", "--namespace", SYSTEM_NS)
    cluster.helm_run("uninstall", "lace", "--namespace", SYSTEM_NS, "--wait", "--timeout=600s")

    def gone():
        left = [c for c in CRDS if cluster.run([cluster.kubectl, "get", "crd", c], check=False).returncode == 0]
        return not left, left
    cluster.wait("every lace.io CRD (and with it every Lace object) gone", gone, timeout=300)
    # The DaemonSet's and Deployment's pods go after them: the garbage collector deletes them,
    # then each node's kubelet stops them and removes them.
    def chart_objects(kinds):
        return cluster.items(kinds, "-A", "-l", "app.kubernetes.io/name=lace-cni")

    def deleted():
        left = [f"{o['kind']}/{o['metadata']['name']}" for o in chart_objects(
                    "all,serviceaccounts,clusterroles,clusterrolebindings,"
                    "validatingadmissionpolicies,validatingadmissionpolicybindings")
                if o["kind"] != "Pod" or "deletionTimestamp" not in o["metadata"]
                or o["metadata"].get("finalizers")]
        return not left, left
    cluster.wait("every object of the lace-cni chart deleted (its pods Terminating, without "
                 "finalizers, at most)", deleted, timeout=300)
    def pods_gone():
        left = [o["metadata"]["name"] for o in chart_objects("pods")]
        return not left, left
    try:
        cluster.wait("the lace-cni chart's pods gone", pods_gone, timeout=300)
    except CheckFailed as e:
        # Deleted, without a finalizer, and past their 30 s grace period: only the node's
        # kubelet and runtime can still hold them. On a saturated VM containerd misses its
        # deadline to stop a task and retries for longer than any wait here (see check 12,
        # containerd/containerd#10755). Say so, with each pod's story, and remove them as an
        # operator would.
        for o in chart_objects("pods"):
            ns, name = o["metadata"]["namespace"], o["metadata"]["name"]
            print(f"\n{e}: {cluster.pod_story(ns, name)}; force-deleting it")
            cluster.k("-n", ns, "delete", "pod", name, "--force", "--grace-period=0", check=False)
    # Running pods keep their connectivity until recreated.
    r = cluster.reach(SYSTEM_NS, "pinger-1", [f"tcp {to} 8080", f"icmp {to}"])
    assert all(r.values()), f"expected pinger-1 -> pinger-2 to keep working after uninstall, saw {r}"

    node = cluster.nodes()[0]
    cluster.apply(f"""apiVersion: v1
kind: Pod
metadata: {{name: lace-check-leftovers, namespace: kube-system}}
spec:
  nodeName: {node}
  hostNetwork: true
  restartPolicy: Never
  tolerations: [{{operator: Exists}}]
  containers:
  - name: ls
    image: {AGNHOST}
    command: [sh, -c, "ls /host/opt/cni/bin; ls /host/etc/cni/net.d; echo ==; ls -R /host/sys/fs/bpf; echo ==; ip -o link | cut -d: -f2"]
    volumeMounts:
    - {{name: bin, mountPath: /host/opt/cni/bin}}
    - {{name: conf, mountPath: /host/etc/cni/net.d}}
    - {{name: bpf, mountPath: /host/sys/fs/bpf}}
  volumes:
  - {{name: bin, hostPath: {{path: /opt/cni/bin}}}}
  - {{name: conf, hostPath: {{path: /etc/cni/net.d}}}}
  - {{name: bpf, hostPath: {{path: /sys/fs/bpf}}}}
""")
    cluster.wait("the leftovers listing to finish",
                 lambda: (cluster.kj("get", "pod", "-n", SYSTEM_NS, "lace-check-leftovers")["status"]["phase"] == "Succeeded",
                          cluster.kj("get", "pod", "-n", SYSTEM_NS, "lace-check-leftovers")["status"]["phase"]), timeout=300)
    out = cluster.logs(SYSTEM_NS, "lace-check-leftovers")
    files, bpf, links = (part.split() for part in out.split("=="))
    want_files = {"lace", "10-lace.conflist", "loopback", "lace-loopback.json"}
    assert set(files) == want_files, f"expected exactly {sorted(want_files)} in the CNI dirs on {node}, saw {sorted(files)}"
    assert "kubelet-probe-link" in bpf, f"expected the pinned probe link under /sys/fs/bpf/lace on {node}, saw {bpf}"
    lace_links = [l.split("@")[0] for l in links if l.startswith(("lv-", "lp-", "lu-"))]
    assert any(l.startswith("lv-") for l in lace_links) and any(l.startswith("lp-") for l in lace_links), (
        f"expected Lace's VRFs (lv-) and pod veths (lp-) to stay on {node}, saw links {links}")
    print(f"\nleft on {node}: {sorted(files)}, /sys/fs/bpf/lace/kubelet-probe-link, links {lace_links}")
    cluster.k("-n", SYSTEM_NS, "delete", "pod", "lace-check-leftovers", "--wait=false")
