"""11. `helm upgrade --reuse-values` of both charts to their next version under traffic (no lost
ping; the new version's labels change the pod templates, so every agent and the controller are
replaced, one node at a time). `helm uninstall` is check 13, after check 12's burst."""

import re
import shutil
import tempfile
from pathlib import Path

from conftest import AGENT_LABELS, SYSTEM_NS, CheckFailed
from test_06_controller import assert_no_forbidden
from test_08_agent_restart import ping_while, pingers


def next_version(src, dst):
    """A copy of the chart at src in dst with its patch version raised (a release's next version):
    dst."""
    shutil.copytree(src, dst)
    meta = dst / "Chart.yaml"
    text = meta.read_text()
    m = re.search(r"^version: *(\d+)\.(\d+)\.(\d+)", text, re.M)
    if not m:
        raise CheckFailed(f"{src}/Chart.yaml has no `version: X.Y.Z` line")
    major, minor, patch = m.groups()
    meta.write_text(text[:m.start()] + f"version: {major}.{minor}.{int(patch) + 1}" + text[m.end():])
    return dst


def test_upgrade_both_charts_under_traffic(cluster):
    work = Path(tempfile.mkdtemp(prefix="lace-next-chart-"))
    charts = {release: next_version(cluster.chart_dir / chart, work / chart)
              for release, chart in (("lace", "chart"), ("lace-networks", "chart-networks"))}
    old_agents = {p["metadata"]["name"] for p in cluster.pods(SYSTEM_NS, AGENT_LABELS)}

    def upgrade():
        for release, chart in charts.items():
            cluster.helm_run("upgrade", release, str(chart), "--namespace", SYSTEM_NS, "--reuse-values")
        cluster.k("-n", SYSTEM_NS, "rollout", "status", "daemonset/lace-node", "--timeout=900s", timeout=960)
        cluster.k("-n", SYSTEM_NS, "rollout", "status", "deployment/lace-controller", "--timeout=600s", timeout=660)
    p = pingers(cluster)
    sent, received, out = ping_while(cluster, "pinger-1", p["pinger-2"], upgrade)
    print(f"\npings pinger-1 -> pinger-2 during both upgrades: {sent} sent, {received} received")
    if received != sent:
        raise CheckFailed(f"expected no lost ping during helm upgrade, saw {sent} sent, {received} received")
    kept = old_agents & {p["metadata"]["name"] for p in cluster.pods(SYSTEM_NS, AGENT_LABELS)}
    if kept:
        raise CheckFailed(f"expected the upgrade to replace every agent pod, these are still there: {sorted(kept)}")
    shutil.rmtree(work, ignore_errors=True)
    assert_no_forbidden(cluster)
