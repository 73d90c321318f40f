"""4. Services through the real kube-proxy: a ClusterIP and NodePort Service whose backends run
on other nodes than the client, allowed and denied by ServiceRoutingPolicy; cluster DNS
(CoreDNS) from the system Network and, once granted, from the default Network.

NodePort is tried from where these checks run, outside the cluster (for the suite's cluster:
the control plane's namespace on the fabric): LACE_CHECKS_OUTSIDE=0 leaves those out, saying
so, where this machine cannot reach the nodes' InternalIPs."""

import os
import time

from conftest import E2E_NS, SYSTEM_NS, CheckFailed, connects

WEB = """apiVersion: v1
kind: Service
metadata: {name: web, namespace: lace-e2e}
spec:
  type: NodePort
  selector: {role: web}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: lace.io/v1alpha1
kind: ServiceBindingPolicy
metadata: {name: lace-check-web}
spec:
  network: default
  priority: 100
  services: [{namespace: lace-e2e, name: web}]
"""


def grant(name, src, dst, services):
    refs = ", ".join(f"{{namespace: {ns}, name: {n}}}" for ns, n in services)
    return f"""apiVersion: lace.io/v1alpha1
kind: ServiceRoutingPolicy
metadata: {{name: {name}}}
spec: {{from: {src}, to: {dst}, services: [{refs}]}}
"""


def test_cluster_ip_and_node_port_follow_service_routing_policies(cluster):
    backends = cluster.web_backends()
    cluster.apply(WEB)
    cluster.wait_pods_ready(E2E_NS, "role=web", backends, timeout=600)
    cip = cluster.kj("get", "service", "-n", E2E_NS, "web")["spec"]["clusterIP"]
    svc = f"tcp {cip} 80"

    def sees(want_sys, want_def):
        def probe():
            s = cluster.reach(SYSTEM_NS, "sys-1", [svc])[svc]
            d = cluster.reach(E2E_NS, "def-1", [svc])[svc]
            return (s, d) == (want_sys, want_def), f"sys-1 -> web: {s}, def-1 -> web: {d}"
        return probe

    # Bound to default, granted to no one: no pod outside default reaches it (default does not
    # reach itself either).
    cluster.wait("ClusterIP web denied to sys-1 and def-1 without a ServiceRoutingPolicy",
                 sees(False, False), timeout=60)
    cluster.apply(grant("lace-check-system-to-web", "system", "default", [(E2E_NS, "web")]))
    t0 = time.time()
    cluster.wait("ClusterIP web reached from sys-1 (granted to system), still denied to def-1",
                 sees(True, False), timeout=60, interval=1)
    print(f"\nClusterIP granted to system within {time.time() - t0:.1f} s")

    if os.environ.get("LACE_CHECKS_OUTSIDE", "1") == "0":
        print("NodePort from outside the cluster: left out (LACE_CHECKS_OUTSIDE=0)")
        return
    ips = [a["address"] for n in cluster.items("nodes") for a in n["status"]["addresses"]
           if a["type"] == "InternalIP" and ":" not in a["address"]]

    def node_ports(want):
        def probe():
            got = {ip: connects(ip, 30080) for ip in ips}
            return all(v == want for v in got.values()), got
        return probe
    cluster.wait("NodePort 30080 denied from outside the cluster without a grant from the "
                 "internet Network", node_ports(False), timeout=30)
    cluster.apply(grant("lace-check-internet-to-web", "internet", "default", [(E2E_NS, "web")]))
    t0 = time.time()
    cluster.wait("NodePort 30080 reached from outside on every node (backends on other nodes) "
                 "after ServiceRoutingPolicy internet -> default [web]", node_ports(True),
                 timeout=60, interval=1)
    print(f"NodePort granted to the outside within {time.time() - t0:.1f} s on {ips}")
    cluster.k("delete", "serviceroutingpolicy", "lace-check-internet-to-web")
    cluster.wait("NodePort 30080 denied again after deleting the grant", node_ports(False), timeout=60)


def test_dns_through_coredns_from_system_and_default(cluster):
    name = "kubernetes.default.svc.cluster.local"

    def resolves_from(ns, pod):
        def probe():
            r = lookup(cluster, ns, pod, name)
            return "rc=0" in r and "10.96.0.1" in r, r.strip()[-200:]
        return probe
    # Polled, as the grant below is: one lookup times out now and then on a loaded machine.
    cluster.wait(f"sys-1 (system Network) to resolve {name} to 10.96.0.1 through CoreDNS",
                 resolves_from(SYSTEM_NS, "sys-1"), timeout=60, interval=2)
    out = lookup(cluster, E2E_NS, "def-1", name)
    if "rc=0" in out:
        raise CheckFailed("expected def-1 (default Network, no grant) not to reach CoreDNS, "
                          f"but it resolved: {out.strip()}")
    cluster.apply("""apiVersion: lace.io/v1alpha1
kind: ServiceBindingPolicy
metadata: {name: lace-check-kube-dns}
spec:
  network: system
  priority: 100
  services: [{namespace: kube-system, name: kube-dns}]
""" + "---\n" + grant("lace-check-default-to-dns", "default", "system", [(SYSTEM_NS, "kube-dns")]))

    cluster.wait(f"def-1 to resolve {name} once kube-dns is bound to system and granted to "
                 "default", resolves_from(E2E_NS, "def-1"), timeout=60, interval=2)


def lookup(cluster, ns, pod, name):
    return cluster.in_pod(ns, pod, f"nslookup -timeout=2 {name}; echo rc=$?")

