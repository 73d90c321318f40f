"""6. The controller: NodeAllocations and NetworkAllocations written by server-side apply with
field manager lace-controller and owner references, status conditions, Events; its pod deleted
and recreated moves no allocation; a deleted Node's allocation is garbage-collected; no 403 in
any Lace log."""

import json
import re

from conftest import AGENT_LABELS, CONTROLLER_LABELS, SYSTEM_NS, CheckFailed


def allocations(cluster):
    # kubectl leaves managedFields out of its output unless asked.
    nodes = {o["metadata"]["name"]: o
             for o in cluster.items("nodeallocations.lace.io", "--show-managed-fields")}
    nets = {o["metadata"]["name"]: o
            for o in cluster.items("networkallocations.lace.io", "--show-managed-fields")}
    return nodes, nets


def test_allocations_are_applied_server_side_and_owned(cluster):
    nodes, nets = allocations(cluster)
    want_nodes = set(cluster.nodes())
    assert want_nodes <= set(nodes), f"expected a NodeAllocation per node {sorted(want_nodes)}, saw {sorted(nodes)}"
    networks = {o["metadata"]["name"]: o for o in cluster.items("networks.lace.io")}
    assert set(networks) <= set(nets) | {n for n, o in networks.items() if o["spec"].get("external")}, (
        f"expected a NetworkAllocation per Network {sorted(networks)}, saw {sorted(nets)}"
    )
    for kind, objs, owner_kind in (("NodeAllocation", nodes, "Node"), ("NetworkAllocation", nets, "Network")):
        for name, o in objs.items():
            managers = {(m["manager"], m["operation"]) for m in o["metadata"].get("managedFields", [])}
            assert ("lace-controller", "Apply") in managers, (
                f"expected {kind} {name} written by server-side apply as lace-controller, saw managers {managers}")
            owners = [(r["kind"], r["name"]) for r in o["metadata"].get("ownerReferences", [])]
            assert (owner_kind, name) in owners, f"expected {kind} {name} owned by {owner_kind} {name}, saw {owners}"
    for name, o in networks.items():
        ready = cluster.condition(o, "Ready") or {}
        assert ready.get("status") == "True", f"expected Network {name} Ready=True, saw {ready}"
    events = cluster.items("events.events.k8s.io", "-A")
    mine = [(e.get("reason"), e["regarding"]["kind"]) for e in events
            if e.get("reportingController", "").startswith("lace") or e.get("deprecatedSource", {}).get("component", "").startswith("lace")]
    kinds = {k for r, k in mine if r == "Allocated"}
    assert {"Node", "Network"} <= kinds, f"expected Allocated Events on Nodes and Networks from lace-controller, saw {sorted(set(mine))}"
    print(f"\n{len(nodes)} NodeAllocations, {len(nets)} NetworkAllocations, {len(mine)} Events from the controller")


def test_controller_restart_moves_nothing(cluster):
    before = allocations(cluster)
    pods = cluster.pods(SYSTEM_NS, CONTROLLER_LABELS)
    assert len(pods) == 1, f"expected one controller pod, saw {[p['metadata']['name'] for p in pods]}"
    old = pods[0]["metadata"]["name"]
    cluster.k("-n", SYSTEM_NS, "delete", "pod", old)

    def replaced():
        ps = cluster.pods(SYSTEM_NS, CONTROLLER_LABELS)
        ready = [p["metadata"]["name"] for p in ps if p["metadata"]["name"] != old
                 and (cluster.condition(p, "Ready") or {}).get("status") == "True"]
        return bool(ready), [p["metadata"]["name"] for p in ps]
    cluster.wait("a new controller pod Ready", replaced, timeout=300)
    after = allocations(cluster)
    for b, a, kind in ((before[0], after[0], "NodeAllocation"), (before[1], after[1], "NetworkAllocation")):
        moved = {n: (b[n]["spec"], a.get(n, {}).get("spec")) for n in b if b[n]["spec"] != a.get(n, {}).get("spec")}
        rewritten = [n for n in b if b[n]["metadata"]["resourceVersion"] != a.get(n, {}).get("metadata", {}).get("resourceVersion")]
        assert not moved, f"expected no {kind} to change across a controller restart, saw {moved}"
        assert not rewritten, f"expected no {kind} to be written again after a restart, saw {rewritten}"


def test_deleted_node_allocation_is_garbage_collected(cluster):
    # A Node object without a kubelet (the real nodes keep running): allocated, then deleted.
    cluster.apply("""apiVersion: v1
kind: Node
metadata: {name: lace-check-gone, labels: {kubernetes.io/os: linux}}
spec: {taints: [{key: lace-check, effect: NoSchedule}]}
""")
    cluster.k("patch", "node", "lace-check-gone", "--subresource=status", "--type=merge", "-p",
              json.dumps({"status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.250"}]}}))
    cluster.wait("a NodeAllocation for Node lace-check-gone",
                 lambda: ("lace-check-gone" in allocations(cluster)[0], sorted(allocations(cluster)[0])), timeout=120)
    cluster.k("delete", "node", "lace-check-gone")
    cluster.wait("the NodeAllocation of the deleted Node lace-check-gone to be gone",
                 lambda: ("lace-check-gone" not in allocations(cluster)[0], sorted(allocations(cluster)[0])), timeout=120)
    # The agent DaemonSet made a pod for that Node too. It never runs (no kubelet) and nothing
    # removes it once the Node is gone (it stays Pending, seen for 180 s), so the check deletes
    # what it caused: later checks count and restart agent pods.
    real = set(cluster.nodes())

    def agents_only_on_real_nodes():
        stray = [p["metadata"]["name"] for p in cluster.pods(SYSTEM_NS, AGENT_LABELS)
                 if p["spec"].get("nodeName") not in real]
        for name in stray:
            cluster.k("-n", SYSTEM_NS, "delete", "pod", name, "--wait=false")
        return not stray, stray
    cluster.wait("no agent pod left for the deleted Node lace-check-gone", agents_only_on_real_nodes,
                 timeout=60)


def test_no_lace_component_was_denied(cluster):
    assert_no_forbidden(cluster)


# A 403 status or the word: not "403" inside a container id or an address.
FORBIDDEN = re.compile(r"\b403\b|[Ff]orbidden")


def assert_no_forbidden(cluster):
    found = []
    for sel in (AGENT_LABELS, CONTROLLER_LABELS):
        for p in cluster.pods(SYSTEM_NS, sel):
            for extra in ([], ["--previous"]):
                log = cluster.logs(SYSTEM_NS, p["metadata"]["name"], *extra)
                found += [f"{p['metadata']['name']}: {l[:200]}" for l in log.splitlines()
                          if FORBIDDEN.search(l)]
    if found:
        raise CheckFailed("expected no 403/Forbidden in any Lace log, saw:\n" + "\n".join(found[:20]))
