"""The controller's ClusterRole grants exactly what its requests are authorized for: the set
its scenario tests record against the fake API server (controller/rbac-requests.txt, written
by `LACE_BLESS=1 cargo test -p lace-controller --test scenarios` and checked by that test).
Nothing missing (a request the API server would deny), nothing unused."""

import pathlib

import pytest

from test_charts import HELMS, ROOT, by_kind, one, render

RECORDED = ROOT / "controller" / "rbac-requests.txt"


def recorded():
    out = set()
    for line in RECORDED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            verb, group, resource = line.split()
            out.add((verb, "" if group == "core" else group, resource))
    return out


def granted(role):
    out = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule, rule
        for values in (rule["apiGroups"], rule["resources"], rule["verbs"]):
            assert "*" not in values, f"no wildcards: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((verb, group, resource))
    return out


def test_the_record_is_there_and_plausible():
    want = recorded()
    assert ("watch", "", "nodes") in want
    assert ("patch", "lace.io", "nodeallocations") in want
    assert ("create", "lace.io", "nodeallocations") in want, "apply creates"


@pytest.mark.parametrize("h", HELMS)
def test_controller_cluster_role_is_exactly_what_it_uses(h):
    docs = render(h, "chart", "--set", "controller.srv6LocatorPrefix=2001:db8:100::/48")
    role = one(docs, "ClusterRole", "lace-controller")
    have, want = granted(role), recorded()
    assert sorted(want - have) == [], "missing: the API server would deny these"
    assert sorted(have - want) == [], "granted but never used"

    binding = one(docs, "ClusterRoleBinding", "lace-controller")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "lace-controller"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "lace-controller",
                                    "namespace": "kube-system"}]
    deploy = one(docs, "Deployment", "lace-controller")
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "lace-controller"
    # No other Role or binding gives the controller's ServiceAccount more.
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for b in by_kind(docs, kind):
            if b["metadata"]["name"] != "lace-controller":
                assert {"kind": "ServiceAccount", "name": "lace-controller",
                        "namespace": "kube-system"} not in b.get("subjects", []), b["metadata"]


@pytest.mark.parametrize("h", HELMS)
def test_controller_deployment_runs_the_controller_with_its_flags(h):
    docs = render(h, "chart", "--set", "controller.srv6LocatorPrefix=2001:db8:100::/48",
                  "--set", "node.apiserverAddress=192.0.2.10:6443")
    c = one(docs, "Deployment", "lace-controller")["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["/usr/local/bin/lace-controller"]
    assert c["args"] == ["--srv6-locator-prefix=2001:db8:100::/48",
                         "--metrics-addr=0.0.0.0:9965", "--health-addr=0.0.0.0:9966"]
    env = {e["name"]: e for e in c["env"]}
    assert env["LACE_APISERVER_ADDRESS"]["value"] == "192.0.2.10:6443"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
