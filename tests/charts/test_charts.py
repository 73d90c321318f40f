"""Chart checks: both charts rendered by the real helm 3 and helm 4, validated strictly against
the Kubernetes schemas (kubernetes-validate), the values checked against the installation
guide's contract, and the rendered Networks/policies loaded by Lace's own validator."""

import os
import pathlib
import subprocess
import tempfile

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = ROOT / ".cache" / "bin"
KUBE_VERSION = os.environ.get("LACE_KUBE_VERSION", "1.33.0")
HELMS = ["helm3", "helm4"]

# The values tables of the installation guide: the contract (name -> default).
PLUGIN_CONTRACT = {
    "controller.srv6LocatorPrefix": "",
    "image.repository": "ghcr.io/squ94wk/lace-cni",
    "image.tag": "",  # "chart appVersion": empty means appVersion
    "node.apiserverAddress": "",
    "node.kubeletCgroupPath": "/sys/fs/cgroup/system.slice/kubelet.service",
    "node.releasePinnedMaps": False,
    "cni.binDir": "/opt/cni/bin",
    "cni.confDir": "/etc/cni/net.d",
    "cni.confName": "10-lace.conflist",
}
NETWORKS_CONTRACT = {
    "systemNetwork.enabled": True,
    "defaultNetwork.enabled": True,
    "internetNetwork.enabled": True,
    "kubernetesServiceRouting.enabled": True,
    "internetRouting.enabled": False,
    "extraRoutingPolicies": {},
}
# "Each Network also exposes name, priority, and subnet/prefix values" (the external internet
# Network has no subnets, so only name and priority).
NETWORK_KEYS = {
    "systemNetwork": {"enabled", "name", "priority", "subnet", "prefix"},
    "defaultNetwork": {"enabled", "name", "priority", "subnet", "prefix"},
    "internetNetwork": {"enabled", "name", "priority"},
}


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def helm(binary, *args, check=True):
    res = subprocess.run([str(BIN / binary), *args], capture_output=True, text=True)
    if check and res.returncode != 0:
        raise AssertionError(f"{binary} {' '.join(args)} failed:\n{res.stderr}")
    return res


def render(binary, chart, *args):
    out = helm(binary, "template", "lace", str(ROOT / chart), "--namespace", "kube-system",
               "--kube-version", KUBE_VERSION, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def render_fails(binary, chart, *args):
    res = helm(binary, "template", "lace", str(ROOT / chart), "--namespace", "kube-system",
               "--kube-version", KUBE_VERSION, *args, check=False)
    assert res.returncode != 0, f"expected a render failure for {args}"
    return res.stderr


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: found {len(found)}"
    return found[0]


# ---------------------------------------------------------------- values contract

def test_plugin_values_are_the_contract():
    values = yaml.safe_load((ROOT / "chart/values.yaml").read_text())
    assert flatten(values) == PLUGIN_CONTRACT


def test_networks_values_are_the_contract():
    values = yaml.safe_load((ROOT / "chart-networks/values.yaml").read_text())
    flat = flatten(values)
    for key, default in NETWORKS_CONTRACT.items():
        assert flat[key] == default, key
    for net, keys in NETWORK_KEYS.items():
        assert set(values[net]) == keys, net
    top = set(values) - set(NETWORK_KEYS)
    assert top == {"kubernetesServiceRouting", "internetRouting", "extraRoutingPolicies"}


# ---------------------------------------------------------------- plugin chart

@pytest.mark.parametrize("h", HELMS)
def test_plugin_chart_lints(h):
    helm(h, "lint", str(ROOT / "chart"), "--kube-version", KUBE_VERSION,
         "--set", "controller.srv6LocatorPrefix=2001:db8:100::/48")


@pytest.mark.parametrize("h", HELMS)
def test_plugin_chart_deploys_what_the_guide_says(h):
    docs = render(h, "chart", "--set", "controller.srv6LocatorPrefix=2001:db8:100::/48")
    crds = {d["spec"]["names"]["kind"] for d in by_kind(docs, "CustomResourceDefinition")}
    assert {"Network", "NetworkBindingPolicy", "ServiceBindingPolicy", "NetworkRoutingPolicy",
            "ServiceRoutingPolicy"} <= crds
    for crd in by_kind(docs, "CustomResourceDefinition"):
        assert crd["spec"]["group"] == "lace.io"
        assert crd["spec"]["scope"] == "Cluster"

    ctrl = one(docs, "Deployment", "lace-controller")
    assert ctrl["spec"]["replicas"] == 1
    assert ctrl["spec"]["strategy"]["type"] == "Recreate"
    c = ctrl["spec"]["template"]["spec"]["containers"][0]
    assert "--srv6-locator-prefix=2001:db8:100::/48" in c["args"]
    assert c["image"] == "ghcr.io/squ94wk/lace-cni:0.1.0"

    ds = one(docs, "DaemonSet", "lace-node")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert {"operator": "Exists"} in pod["tolerations"]
    assert pod["hostNetwork"] is True
    assert pod["containers"][0]["securityContext"]["privileged"] is False
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1

    assert by_kind(docs, "ValidatingAdmissionPolicy")
    bindings = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    policies = {p["metadata"]["name"] for p in by_kind(docs, "ValidatingAdmissionPolicy")}
    assert {b["spec"]["policyName"] for b in bindings} == policies
    assert {r["metadata"]["name"] for r in by_kind(docs, "ClusterRole")} == {
        "lace-controller", "lace-node"}


@pytest.mark.parametrize("h", HELMS)
def test_plugin_values_flow_into_the_manifests(h):
    docs = render(h, "chart",
                  "--set", "image.repository=registry.local/lace", "--set", "image.tag=v9",
                  "--set", "cni.binDir=/usr/libexec/cni", "--set", "cni.confDir=/var/lib/cni/net.d",
                  "--set", "cni.confName=05-lace.conflist",
                  "--set", "node.kubeletCgroupPath=/sys/fs/cgroup/kubelet.slice",
                  "--set", "node.releasePinnedMaps=true",
                  "--set", "node.apiserverAddress=192.0.2.10:6443")
    ds = one(docs, "DaemonSet", "lace-node")
    pod = ds["spec"]["template"]["spec"]
    agent = pod["containers"][0]
    assert agent["image"] == "registry.local/lace:v9"
    assert "--cni-bin-dir=/host/usr/libexec/cni" in agent["args"]
    assert "--cni-conf-dir=/host/var/lib/cni/net.d" in agent["args"]
    assert "--cni-conf-name=05-lace.conflist" in agent["args"]
    assert "--kubelet-cgroup-path=/host/sys/fs/cgroup/kubelet.slice" in agent["args"]
    assert "--release-pinned-maps=true" in agent["args"]
    assert {"name": "LACE_APISERVER_ADDRESS", "value": "192.0.2.10:6443"} in agent["env"]
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"]}
    assert {"/usr/libexec/cni", "/var/lib/cni/net.d"} <= host_paths
    ctrl = one(docs, "Deployment", "lace-controller")["spec"]["template"]["spec"]["containers"][0]
    assert ctrl["image"] == "registry.local/lace:v9"


@pytest.mark.parametrize("h", HELMS)
def test_apiserver_lookup_is_empty_without_a_cluster(h):
    # `helm template` has no cluster: no address is baked in, the agent uses the in-cluster env.
    docs = render(h, "chart")
    agent = one(docs, "DaemonSet", "lace-node")["spec"]["template"]["spec"]["containers"][0]
    assert "LACE_APISERVER_ADDRESS" not in {e["name"] for e in agent["env"]}


@pytest.mark.parametrize("args,message", [
    (["--set", "controller.srv6LocatorPrefix=2001:db8::/100"], "leaves no bits for node locators"),
    (["--set", "controller.srv6LocatorPrefix=10.0.0.0/8"], "is not an IPv6 prefix"),
    (["--set", "cni.binDir=opt/cni/bin"], "cni.binDir"),
    (["--set", "cni.confName=lace.conf"], "cni.confName"),
    (["--set", "node.kubeletCgroupPath=/tmp/x"], "node.kubeletCgroupPath"),
])
def test_plugin_chart_rejects_bad_values(args, message):
    assert message in render_fails("helm3", "chart", *args)


# ---------------------------------------------------------------- networks chart

@pytest.mark.parametrize("h", HELMS)
def test_networks_defaults(h):
    docs = render(h, "chart-networks")
    nets = {d["metadata"]["name"]: d["spec"] for d in by_kind(docs, "Network")}
    assert set(nets) == {"system", "default", "internet"}
    assert nets["internet"] == {"external": True}
    routes = {(d["spec"]["from"], d["spec"]["to"]) for d in by_kind(docs, "NetworkRoutingPolicy")}
    # system reaches itself; default does not (and has no internet egress by default)
    assert routes == {("system", "system")}
    binds = {d["spec"]["network"]: d["spec"] for d in by_kind(docs, "NetworkBindingPolicy")}
    assert binds["system"]["priority"] > binds["default"]["priority"]
    assert binds["default"].get("namespaceSelector") is None and binds["default"].get("podSelector") is None
    svc_bind = one(docs, "ServiceBindingPolicy", "kubernetes")["spec"]
    assert svc_bind["network"] == "internet"
    assert svc_bind["services"] == [{"namespace": "default", "name": "kubernetes"}]
    srp = by_kind(docs, "ServiceRoutingPolicy")
    assert [(d["spec"]["from"], d["spec"]["to"]) for d in srp] == [("system", "internet")]


@pytest.mark.parametrize("h", HELMS)
def test_networks_toggles(h):
    docs = render(h, "chart-networks", "--set", "internetRouting.enabled=true",
                  "--set", "kubernetesServiceRouting.enabled=false")
    routes = {(d["spec"]["from"], d["spec"]["to"]) for d in by_kind(docs, "NetworkRoutingPolicy")}
    assert routes == {("system", "system"), ("default", "internet")}
    assert not by_kind(docs, "ServiceRoutingPolicy")

    docs = render(h, "chart-networks", "--set", "systemNetwork.enabled=false",
                  "--set", "kubernetesServiceRouting.enabled=false")
    assert "system" not in {d["metadata"]["name"] for d in by_kind(docs, "Network")}


@pytest.mark.parametrize("h", HELMS)
def test_networks_readdressing_and_dual_stack(h):
    docs = render(h, "chart-networks", "--set", "defaultNetwork.name=pods",
                  "--set", r"defaultNetwork.subnet=10.244.128.0/17\,fd00:10:244::/56",
                  "--set", r"defaultNetwork.prefix=25\,64", "--set", "defaultNetwork.priority=5")
    net = one(docs, "Network", "pods")["spec"]
    assert net["subnets"] == [{"cidr": "10.244.128.0/17", "blockPrefix": 25},
                              {"cidr": "fd00:10:244::/56", "blockPrefix": 64}]
    assert one(docs, "NetworkBindingPolicy", "pods")["spec"] == {"network": "pods", "priority": 5}


@pytest.mark.parametrize("h", HELMS)
def test_extra_routing_policies(h):
    docs = render(h, "chart-networks", "--set-json", (
        'extraRoutingPolicies={"tenant-to-system":{"matchKind":["pod","service"],'
        '"from":"tenant-a","to":"system"},"dns":{"matchKind":["service"],"from":"default",'
        '"to":"system","services":[{"namespace":"kube-system","name":"kube-dns"}]}}'))
    assert one(docs, "NetworkRoutingPolicy", "tenant-to-system")["spec"] == {
        "from": "tenant-a", "to": "system"}
    assert one(docs, "ServiceRoutingPolicy", "tenant-to-system")["spec"] == {
        "from": "tenant-a", "to": "system"}
    assert one(docs, "ServiceRoutingPolicy", "dns")["spec"]["services"] == [
        {"namespace": "kube-system", "name": "kube-dns"}]
    assert not [d for d in by_kind(docs, "NetworkRoutingPolicy") if d["metadata"]["name"] == "dns"]


@pytest.mark.parametrize("args,message", [
    (["--set-json", 'extraRoutingPolicies={"x":{"from":"a","to":"b"}}'], "matchKind"),
    (["--set-json", 'extraRoutingPolicies={"x":{"matchKind":["node"],"from":"a","to":"b"}}'],
     '"node" is neither pod nor service'),
    (["--set-json", 'extraRoutingPolicies={"x":{"matchKind":["pod"],"from":"a"}}'],
     "from and to are required"),
    (["--set-json", 'extraRoutingPolicies={"x":{"matchKind":["pod"],"from":"a","to":"b","services":[]}}'],
     "only apply to matchKind service"),
    (["--set", "systemNetwork.priority=5000"], "systemNetwork.priority: 5000 is outside"),
    (["--set", r"defaultNetwork.subnet=10.244.128.0/17\,fd00::/56"], "defaultNetwork.prefix"),
    (["--set", "internetNetwork.enabled=false"], "kubernetesServiceRouting.enabled needs"),
])
def test_networks_chart_rejects_bad_values(args, message):
    assert message in render_fails("helm3", "chart-networks", *args)


# ---------------------------------------------------------------- strict schema validation

@pytest.mark.parametrize("h", HELMS)
def test_rendered_core_objects_pass_strict_schema_validation(h, tmp_path):
    docs = render(h, "chart", "--set", "controller.srv6LocatorPrefix=2001:db8:100::/48",
                  "--set", "node.apiserverAddress=192.0.2.10:6443")
    core = [d for d in docs if not d["apiVersion"].startswith("lace.io/")]
    for i, d in enumerate(core):
        f = tmp_path / f"{i:02}-{d['kind']}.yaml"
        f.write_text(yaml.safe_dump(d))
    res = subprocess.run(["kubernetes-validate", "--strict", "--no-warn", "-k", KUBE_VERSION,
                          *sorted(str(p) for p in tmp_path.iterdir())],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_example_cluster_core_objects_pass_strict_schema_validation():
    # The standalone-mode manifests (demo, tests) must be objects a real API server accepts.
    example = ROOT / "examples" / "cluster"
    files = [p for p in sorted(example.glob("*.yaml")) if p.name != "lace-allocations.yaml"]
    core = [p for p in files
            if not any(d and d.get("apiVersion", "").startswith("lace.io/")
                       for d in yaml.safe_load_all(p.read_text()))]
    assert len(core) >= 4, core
    res = subprocess.run(["kubernetes-validate", "--strict", "--no-warn", "-k", KUBE_VERSION,
                          *map(str, core)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count(" passed for resource ") >= 20, res.stdout


def lace_agent(*args):
    binary = os.environ.get("LACE_AGENT", str(ROOT / "target" / "debug" / "lace-agent"))
    return subprocess.run([binary, *args], capture_output=True, text=True)


def write_docs(docs, directory):
    pathlib.Path(directory, "rendered.yaml").write_text(yaml.safe_dump_all(docs))


@pytest.mark.parametrize("args", [
    [],
    ["--set", "internetRouting.enabled=true"],
    ["--set", r"defaultNetwork.subnet=10.244.128.0/17\,fd00:10:244::/56",
     "--set", r"defaultNetwork.prefix=25\,64"],
])
def test_rendered_networks_pass_lace_validation(args, tmp_path):
    # The chart's output is checked by the Rust validator, the one source of truth.
    write_docs(render("helm3", "chart-networks", *args), tmp_path)
    res = lace_agent("validate", "--manifests", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "valid" in res.stdout


def test_lace_validation_catches_what_the_chart_cannot(tmp_path):
    # A policy naming a missing Network renders fine but is rejected by Lace.
    write_docs(render("helm3", "chart-networks", "--set-json",
                      'extraRoutingPolicies={"x":{"matchKind":["pod"],"from":"nope","to":"system"}}'),
               tmp_path)
    res = lace_agent("validate", "--manifests", str(tmp_path))
    assert res.returncode != 0
    assert "NetworkRoutingPolicy/x" in res.stderr and "nope" in res.stderr, res.stderr
