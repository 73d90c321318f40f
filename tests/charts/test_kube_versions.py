"""Every manifest both charts render, for the Kubernetes minors the chart supports (its
kubeVersion floor, 1.33, through the newest kubernetes-validate knows, 1.37), validated
strictly: core objects by kubernetes-validate --strict against that minor's schemas, Lace's
own objects (the networks chart) against the CRDs the plugin chart renders, with unknown
fields rejected as the API server's strict field validation (kubectl's default) does."""

import copy
import subprocess

import jsonschema
import pytest
import yaml

from test_charts import HELMS, ROOT, by_kind, helm

VERSIONS = ["1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"]
PLUGIN_VALUES = [
    ["--set", "controller.srv6LocatorPrefix=2001:db8:100::/48"],
    ["--set", "controller.srv6LocatorPrefix=2001:db8:100::/48",
     "--set", "node.apiserverAddress=192.0.2.10:6443", "--set", "node.releasePinnedMaps=true",
     "--set", "image.tag=dev"],
]
NETWORKS_VALUES = [
    [],
    ["--set", "internetRouting.enabled=true",
     "--set", r"defaultNetwork.subnet=10.244.128.0/17\,fd00:10:244::/56",
     "--set", r"defaultNetwork.prefix=25\,64",
     "--set-json", ('extraRoutingPolicies={"t":{"matchKind":["pod","service"],"from":"default",'
                    '"to":"system"},"dns":{"matchKind":["service"],"from":"default","to":"system",'
                    '"services":[{"namespace":"kube-system","name":"kube-dns"}],'
                    '"serviceSelector":{"matchExpressions":[{"key":"k8s-app","operator":"Exists"}]}}}')],
]


def render(h, chart, version, args):
    out = helm(h, "template", "lace", str(ROOT / chart), "--namespace", "kube-system",
               "--kube-version", version, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def strict(schema):
    """The schema with unknown fields rejected wherever the CRD does not preserve them."""
    schema = copy.deepcopy(schema)

    def walk(s):
        if not isinstance(s, dict):
            return
        if s.get("type") == "object" and "properties" in s \
                and not s.get("x-kubernetes-preserve-unknown-fields") \
                and "additionalProperties" not in s:
            s["additionalProperties"] = False
        for v in s.values():
            if isinstance(v, dict):
                walk(v)
            elif isinstance(v, list):
                for i in v:
                    walk(i)
    walk(schema)
    # apiVersion, kind and metadata are the API server's (TypeMeta, ObjectMeta), not the CRD's.
    schema.setdefault("properties", {}).update(
        apiVersion={"type": "string"}, kind={"type": "string"}, metadata={"type": "object"})
    return schema


def kubernetes_validate(version, docs, tmp_path):
    assert docs
    files = []
    for i, d in enumerate(docs):
        f = tmp_path / f"{i:02}-{d['kind']}.yaml"
        f.write_text(yaml.safe_dump(d))
        files.append(str(f))
    res = subprocess.run(["kubernetes-validate", "--strict", "--no-warn", "-k", version, *files],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count(" passed for resource ") >= len(docs), res.stdout


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("h", HELMS)
def test_every_rendered_manifest_validates(h, version, tmp_path):
    plugin = [render(h, "chart", version, args) for args in PLUGIN_VALUES]
    crds = {(c["spec"]["group"], c["spec"]["names"]["kind"]): c
            for c in by_kind(plugin[0], "CustomResourceDefinition")}
    networks = [render(h, "chart-networks", version, args) for args in NETWORKS_VALUES]
    core = [d for docs in plugin + networks for d in docs
            if not d["apiVersion"].startswith("lace.io/")]
    kubernetes_validate(version, core, tmp_path)
    lace = [d for docs in plugin + networks for d in docs if d["apiVersion"].startswith("lace.io/")]
    kinds = set()
    for d in lace:
        group, version_name = d["apiVersion"].split("/")
        crd = crds[(group, d["kind"])]
        served = [v for v in crd["spec"]["versions"] if v["name"] == version_name and v["served"]]
        assert served, f"{d['kind']}: {version_name} is not served"
        jsonschema.validate(d, strict(served[0]["schema"]["openAPIV3Schema"]))
        kinds.add(d["kind"])
    assert kinds == {"Network", "NetworkBindingPolicy", "ServiceBindingPolicy",
                     "NetworkRoutingPolicy", "ServiceRoutingPolicy"}


def test_the_strict_crd_check_rejects_unknown_fields():
    # The check above must be able to fail: a typo in a rendered Network is caught.
    docs = render("helm3", "chart", "1.33.0", PLUGIN_VALUES[0])
    crd = next(c for c in by_kind(docs, "CustomResourceDefinition")
               if c["spec"]["names"]["kind"] == "Network")
    schema = strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    bad = {"apiVersion": "lace.io/v1alpha1", "kind": "Network", "metadata": {"name": "x"},
           "spec": {"subnets": [{"cidr": "10.0.0.0/8", "blockPrefx": 24}]}}
    with pytest.raises(jsonschema.ValidationError, match="blockPrefx"):
        jsonschema.validate(bad, schema)
