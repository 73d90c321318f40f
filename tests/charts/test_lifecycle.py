"""Install, `helm upgrade --reuse-values` from the previous chart version, and uninstall, as
the installation guide describes them, with the real helm 3 and helm 4 against a Kubernetes
API server. No kube-apiserver can run here, so the server is tests/charts/fake_apiserver.py:
real discovery, generic object storage, the patch types helm sends and helm's release Secrets.
That gives real evidence of what helm itself does (which objects it creates, patches and
deletes, that `lookup` reads a live EndpointSlice, that the CRDs come with an upgrade because
they are templated, that values are reused) without claiming what only a real API server does
(admission, schema validation: test_kube_versions.py and test_admission_cel.py cover those).
The server serves no OpenAPI documents, so helm's client-side schema check is switched off
(--disable-openapi-validation).

The previous chart version is the charts as last committed with another version than the
working tree's: the newest commit touching chart/ or chart-networks/ whose chart/Chart.yaml
says another version, both charts extracted from git at that commit."""

import subprocess

import pytest
import yaml

from fake_apiserver import SERVER_FIELDS, FakeAPIServer
from test_charts import BIN, HELMS, ROOT

PREFIX = "controller.srv6LocatorPrefix=2001:db8:100::/48"
APISERVER = "192.0.2.10"  # documentation address: only ever a string in a manifest


def chart_version(text):
    return yaml.safe_load(text)["version"]


@pytest.fixture(scope="module")
def previous(tmp_path_factory):
    current = chart_version((ROOT / "chart/Chart.yaml").read_text())
    revs = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%H", "--", "chart",
                           "chart-networks"],
                          capture_output=True, text=True, check=True).stdout.split()
    for rev in revs:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:chart/Chart.yaml"],
                              capture_output=True, text=True, check=True).stdout
        if chart_version(text) != current:
            out = tmp_path_factory.mktemp("previous")
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "chart",
                                      "chart-networks"], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
            return out, chart_version(text)
    pytest.fail(f"no commit with a chart version other than {current} (a shallow clone?)")


class Cluster:
    def __init__(self, server, h, tmp_path):
        self.server, self.h = server, h
        for ns in ("kube-system", "default"):
            server.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        server.seed({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": "kubernetes", "namespace": "default"},
                     "addressType": "IPv4", "endpoints": [{"addresses": [APISERVER]}],
                     "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]})
        self.seeded = set(self.keys())
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.env = {"KUBECONFIG": str(server.kubeconfig(tmp_path / "kubeconfig")),
                    "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def helm(self, *args, check=True):
        extra = ["--disable-openapi-validation"] if args[0] in ("install", "upgrade") else []
        res = subprocess.run([str(BIN / self.h), *args, "--namespace", "kube-system", *extra],
                             capture_output=True, text=True, env=self.env, timeout=300)
        if check:
            assert res.returncode == 0, f"helm {' '.join(args)}:\n{res.stderr}"
        return res

    def keys(self):
        return {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
                for o in self.server.objects.values()}

    def live(self):
        """Every object helm made, without what the server adds."""
        out = {}
        for o in self.server.objects.values():
            key = (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
            if key in self.seeded or o["kind"] == "Secret":
                continue
            o = {k: v for k, v in o.items() if k != "status"}
            o["metadata"] = {k: v for k, v in o["metadata"].items() if k not in SERVER_FIELDS}
            out[key] = o
        return out


def crds_of(text):
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(text)
            if d and d["kind"] == "CustomResourceDefinition"}


def manifest(cluster, release):
    return cluster.helm("get", "manifest", release).stdout


@pytest.mark.parametrize("h", HELMS)
def test_upgrade_from_the_previous_version_equals_a_fresh_install(h, previous, tmp_path):
    prev_dir, prev_version = previous
    with FakeAPIServer() as a, FakeAPIServer() as b:
        old = Cluster(a, h, tmp_path / "a")
        old.helm("install", "lace", str(prev_dir / "chart"), "--set", PREFIX)
        old.helm("install", "lace-networks", str(prev_dir / "chart-networks"))
        old_crds = crds_of(manifest(old, "lace"))
        before = len(a.log)
        up = old.helm("upgrade", "lace", str(ROOT / "chart"), "--reuse-values")
        old.helm("upgrade", "lace-networks", str(ROOT / "chart-networks"), "--reuse-values")
        assert "upgraded" in up.stdout  # NOTES.txt
        # --reuse-values kept what the user set at install.
        values = yaml.safe_load(old.helm("get", "values", "lace", "-o", "yaml").stdout)
        assert values == {"controller": {"srv6LocatorPrefix": "2001:db8:100::/48"}}
        # The CRDs are templated, so they are part of the upgraded release, and helm wrote
        # each one whose definition changed since the previous version.
        new_crds = crds_of(manifest(old, "lace"))
        assert len(new_crds) == 7
        written = {p.rsplit("/", 1)[1] for m, p, _ in a.log[before:]
                   if m in ("PATCH", "PUT", "POST") and "/customresourcedefinitions/" in p}
        changed = {n for n in new_crds if old_crds.get(n) != new_crds[n]}
        assert changed <= written, f"CRDs changed but not written: {changed - written}"
        assert prev_version != yaml.safe_load((ROOT / "chart/Chart.yaml").read_text())["version"]

        fresh = Cluster(b, h, tmp_path / "b")
        fresh.helm("install", "lace", str(ROOT / "chart"), "--set", PREFIX)
        fresh.helm("install", "lace-networks", str(ROOT / "chart-networks"))
        for release in ("lace", "lace-networks"):
            assert manifest(old, release) == manifest(fresh, release), release
        # And what the server holds after helm's patches is what a fresh install created.
        upgraded, installed = old.live(), fresh.live()
        assert upgraded.keys() == installed.keys()
        for key in installed:
            assert upgraded[key] == installed[key], key
        # `lookup` read the live default/kubernetes EndpointSlice and baked it in.
        agent = a.get("DaemonSet", "lace-node", "kube-system")
        env = agent["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "LACE_APISERVER_ADDRESS", "value": f"{APISERVER}:6443"} in env


@pytest.mark.parametrize("h", HELMS)
def test_install_and_uninstall_as_the_guide_says(h, tmp_path):
    with FakeAPIServer() as s:
        c = Cluster(s, h, tmp_path)
        out = c.helm("install", "lace", str(ROOT / "chart"), "--set", PREFIX).stdout
        assert "Install the networks chart" in out and "pods get no addresses" in out
        kinds = {k for k, _, _ in c.keys() - c.seeded}
        assert {"CustomResourceDefinition", "Deployment", "DaemonSet", "ClusterRole",
                "ClusterRoleBinding", "ServiceAccount", "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding"} <= kinds
        crds = {o["metadata"]["name"] for o in s.of_kind("CustomResourceDefinition")}
        assert len(crds) == 7, crds
        c.helm("install", "lace-networks", str(ROOT / "chart-networks"))
        assert {o["metadata"]["name"] for o in s.of_kind("Network")} == {
            "system", "default", "internet"}

        c.helm("uninstall", "lace-networks")
        assert not s.of_kind("Network") and not s.of_kind("NetworkBindingPolicy")
        before = len(s.log)
        c.helm("uninstall", "lace")
        # Uninstalling the plugin chart deletes the CRDs (and so everything of their kinds).
        deleted = {p.rsplit("/", 1)[1] for m, p, _ in s.log[before:]
                   if m == "DELETE" and "/customresourcedefinitions/" in p}
        assert deleted == crds
        # Nothing of either release is left in the cluster, helm's records included.
        assert c.keys() == c.seeded


@pytest.mark.parametrize("h", HELMS)
def test_networks_chart_before_the_plugin_chart_fails_clearly(h, tmp_path):
    with FakeAPIServer() as s:
        c = Cluster(s, h, tmp_path)
        res = c.helm("install", "lace-networks", str(ROOT / "chart-networks"), check=False)
        assert res.returncode != 0
        assert 'no matches for kind "Network"' in res.stderr and "CRDs" in res.stderr
        assert not s.of_kind("Network")
