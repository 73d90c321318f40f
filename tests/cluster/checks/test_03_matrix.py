"""3. The policy matrix across nodes (ICMP and TCP) with the networks chart's policies: the
system Network reaches itself; the default Network reaches nothing, itself included; the two
do not reach each other. A NetworkRoutingPolicy default -> default added while the pods run
opens default -> default within seconds, and removing it closes it again, without restarting
any pod."""

import time

from conftest import E2E_NS, SYSTEM_NS, CheckFailed

NRP = """apiVersion: lace.io/v1alpha1
kind: NetworkRoutingPolicy
metadata: {name: lace-check-default-to-default}
spec: {from: default, to: default}
"""


def matrix(cluster, sources):
    """{(src, proto, dst): reached} for every source pod against every other check pod."""
    ips = cluster.check_pods()
    result = {}
    for src in sources:
        ns = SYSTEM_NS if src.startswith("sys") else E2E_NS
        targets = {}
        for dst, ip in ips.items():
            if dst == src:
                continue
            targets[f"tcp {ip} 8080"] = (dst, "tcp")
            targets[f"icmp {ip}"] = (dst, "icmp")
        for t, ok in cluster.reach(ns, src, list(targets)).items():
            dst, proto = targets[t]
            result[(src, proto, dst)] = ok
    return result


def expect(result, allowed):
    wrong = [f"{s} -{p}-> {d}: {'reached' if ok else 'not reached'}, expected "
             f"{'reached' if allowed(s, d) else 'not reached'}"
             for (s, p, d), ok in sorted(result.items()) if ok != allowed(s, d)]
    if wrong:
        raise CheckFailed("the policy matrix differs from the policies:\n" + "\n".join(wrong))
    return len(result)


def networks_chart_policy(src, dst):
    return src.startswith("sys") and dst.startswith("sys")


def test_matrix_follows_the_networks_chart(cluster):
    sources = ["sys-1", "def-1"]
    n = expect(matrix(cluster, sources), networks_chart_policy)
    print(f"\n{n} checks (ICMP and TCP, across nodes) as the policies say")


def test_routing_policy_added_and_removed_while_pods_run(cluster):
    restarts_before = _restarts(cluster)
    cluster.apply(NRP)
    start = time.time()

    def opened():
        r = cluster.reach(E2E_NS, "def-1", [f"tcp {cluster.check_pods()['def-2']} 8080"])
        return all(r.values()), r
    cluster.wait("def-1 -> def-2 to connect after adding NetworkRoutingPolicy default -> default",
                 opened, timeout=60, interval=1)
    print(f"\nopened within {time.time() - start:.1f} s")
    expect(matrix(cluster, ["def-1"]), lambda s, d: d.startswith("def") or networks_chart_policy(s, d))

    cluster.k("delete", "networkroutingpolicy", "lace-check-default-to-default")
    start = time.time()

    def closed():
        r = cluster.reach(E2E_NS, "def-1", [f"tcp {cluster.check_pods()['def-2']} 8080"], timeout_s=2)
        return not any(r.values()), r
    cluster.wait("def-1 -> def-2 to stop connecting after deleting the policy", closed,
                 timeout=60, interval=1)
    print(f"closed within {time.time() - start:.1f} s")
    expect(matrix(cluster, ["def-1"]), networks_chart_policy)
    assert _restarts(cluster) == restarts_before, (
        f"expected no pod restarts, saw {restarts_before} before and {_restarts(cluster)} after"
    )


def _restarts(cluster):
    out = {}
    for ns in (SYSTEM_NS, E2E_NS):
        for p in cluster.pods(ns, "app=lace-check"):
            out[p["metadata"]["name"]] = (p["metadata"]["uid"],
                                          sum(c["restartCount"] for c in p["status"]["containerStatuses"]))
    return out
