"""The checks Lace must pass on a real Kubernetes cluster, shared by the test suite's own cluster
(tests/cluster/run.sh) and a user's cluster (scripts/e2e-cluster.sh), so the two cannot drift
apart. They talk to the cluster only through kubectl and helm, as a user does.

They expect a cluster without any CNI (nodes NotReady), install both charts themselves and
leave them uninstalled at the end. The modules run in file order (pytest's default); each
numbered module is one group of checks of issue 20 and builds on the state the earlier ones
leave. Every failure says what was expected and what was seen.

Environment:
  KUBECTL, HELM             the binaries (default: kubectl, helm from PATH)
  LACE_CHART_DIR            where chart/ and chart-networks/ are (default: this checkout)
  LACE_SRV6_PREFIX          controller.srv6LocatorPrefix (default 2001:db8:100::/48)
  LACE_HELM_SET             extra `--set` values for the plugin chart, comma-separated (e.g.
                            node.kubeletCgroupPath=... where the kubelet is not in the default)
  LACE_CHECKS_STARTED       epoch seconds the cluster was started (for the printed timings)
"""

import base64
import calendar
import json
import os
import re
import select
import shlex
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SYSTEM_NS = "kube-system"
E2E_NS = "lace-e2e"
AGNHOST = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
PAUSE = "registry.k8s.io/pause:3.10.1"
# Everything Lace-made in a cluster: names and label of what the charts install.
AGENT_LABELS = "app.kubernetes.io/name=lace-cni,app.kubernetes.io/component=node"
CONTROLLER_LABELS = "app.kubernetes.io/name=lace-cni,app.kubernetes.io/component=controller"


class CheckFailed(AssertionError):
    pass


class Cluster:
    """kubectl and helm, with waits that report what they saw last."""

    def __init__(self):
        self.kubectl = os.environ.get("KUBECTL", "kubectl")
        self.helm = os.environ.get("HELM", "helm")
        self.chart_dir = Path(os.environ.get("LACE_CHART_DIR", ROOT))
        self.prefix = os.environ.get("LACE_SRV6_PREFIX", "2001:db8:100::/48")
        self.helm_set = [s for s in os.environ.get("LACE_HELM_SET", "").split(",") if s]
        self.started = float(os.environ.get("LACE_CHECKS_STARTED", time.time()))
        self.state = {}

    # ---- commands
    def run(self, argv, check=True, timeout=180, input=None):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
        if check and p.returncode != 0:
            raise CheckFailed(
                f"`{shlex.join(argv)}` failed with exit status {p.returncode}:\n"
                f"{p.stderr.strip() or p.stdout.strip()}"
            )
        return p

    def k(self, *args, check=True, timeout=180, input=None):
        return self.run([self.kubectl, *args], check=check, timeout=timeout, input=input).stdout

    def kj(self, *args):
        return json.loads(self.k(*args, "-o", "json"))

    def items(self, *args):
        return self.kj("get", *args)["items"]

    def apply(self, manifest):
        return self.k("apply", "-f", "-", input=manifest)

    def helm_run(self, *args, timeout=600):
        return self.run([self.helm, *args], timeout=timeout).stdout

    def exec(self, ns, pod, *cmd, check=False, timeout=120):
        return self.run([self.kubectl, "-n", ns, "exec", pod, "--", *cmd], check=check, timeout=timeout)

    def logs(self, ns, pod, *args):
        return self.k("-n", ns, "logs", pod, *args, check=False)

    # ---- waiting
    def wait(self, what, probe, timeout=300, interval=2):
        """Polls `probe` until it returns (ok, seen) with ok true; fails naming `what` and the
        last thing seen."""
        deadline = time.time() + timeout
        seen = None
        while True:
            try:
                ok, seen = probe()
            except (subprocess.SubprocessError, CheckFailed, json.JSONDecodeError, KeyError) as e:
                ok, seen = False, f"error: {e}"
            if ok:
                return seen
            if time.time() > deadline:
                raise CheckFailed(f"expected {what} within {timeout}s; last seen: {seen}")
            time.sleep(interval)

    # ---- objects
    def node_names(self):
        return sorted(n["metadata"]["name"] for n in self.items("nodes"))

    def condition(self, obj, ctype):
        for c in obj.get("status", {}).get("conditions", []):
            if c["type"] == ctype:
                return c
        return None

    def pods(self, ns, selector):
        return self.items("pods", "-n", ns, "-l", selector)

    def wait_pods_ready(self, ns, selector, count, timeout=300):
        def probe():
            pods = self.pods(ns, selector)
            ready = [p for p in pods if (self.condition(p, "Ready") or {}).get("status") == "True"]
            seen = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
            return len(ready) >= count, seen
        return self.wait(f"{count} Ready pod(s) {selector} in {ns}", probe, timeout)

    def agnhost_pod(self, ns, name, node, labels=None, args=None, extra_spec="", annotations=None):
        labels = {"lace-check": "true", **(labels or {})}
        label_yaml = ", ".join(f"{k}: {json.dumps(v)}" for k, v in labels.items())
        annotation_yaml = ", ".join(f"{k}: {json.dumps(v)}" for k, v in (annotations or {}).items())
        args = args or ["netexec", "--http-port=8080", "--udp-port=8081"]
        self.apply(
            f"""apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {{{label_yaml}}}, annotations: {{{annotation_yaml}}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  tolerations: [{{operator: Exists}}]
  containers:
  - name: agnhost
    image: {AGNHOST}
    args: {json.dumps(args)}
    ports: [{{name: http, containerPort: 8080}}]
{extra_spec}"""
        )

    def web_backends(self):
        """Check 4's Service backends, web-N on every node but the first (where the clients
        run): created with check 2's pods, so their start overlaps that batch's (each batch of
        pods costs 40-60 s under emulation); idempotent, so check 4 run alone makes them too.
        Returns how many there are."""
        nodes = self.nodes()
        for i, node in enumerate(nodes[1:], 2):
            self.agnhost_pod(E2E_NS, f"web-{i}", node, labels={"role": "web"},
                             extra_spec="    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 2}\n")
        return len(nodes) - 1

    def check_pods(self):
        """The agnhost pods test_02 made ({name: IPv4}), from the cluster if this session did
        not make them (a module run on its own)."""
        if "ips" not in self.state:
            ips = {}
            for ns in (SYSTEM_NS, E2E_NS):
                for p in self.pods(ns, "app=lace-check"):
                    v4 = [i["ip"] for i in p["status"].get("podIPs", []) if ":" not in i["ip"]]
                    if v4:
                        ips[p["metadata"]["name"]] = v4[0]
            self.state["ips"] = ips
        return self.state["ips"]

    def nodes(self):
        if "nodes" not in self.state:
            self.state["nodes"] = self.node_names()
        return self.state["nodes"]

    def pod_ips(self, ns, name):
        pod = self.kj("get", "pod", "-n", ns, name)
        return [i["ip"] for i in pod["status"].get("podIPs", [])]

    def pod_story(self, ns, pod):
        """What a failure in pod needs beside its own message: phase, each container's state,
        restarts and last termination, and the pod's latest events."""
        try:
            p = self.kj("get", "pod", "-n", ns, pod)
        except (CheckFailed, subprocess.SubprocessError, json.JSONDecodeError) as e:
            return f"{ns}/{pod}: not readable ({e})"
        parts = [f"{ns}/{pod}: phase {p['status'].get('phase')}"]
        for c in p["status"].get("containerStatuses", []):
            last = c.get("lastState", {}).get("terminated")
            parts.append(f"container {c['name']}: state {list(c.get('state', {}))}, "
                         f"restarts {c.get('restartCount')}"
                         + (f", last ended {last.get('finishedAt')} ({last.get('reason')}, "
                            f"exit {last.get('exitCode')})" if last else ""))
        events = self.run([self.kubectl, "-n", ns, "get", "events", "--field-selector",
                           f"involvedObject.name={pod}", "--sort-by=.lastTimestamp", "-o",
                           "custom-columns=LAST:.lastTimestamp,REASON:.reason,MESSAGE:.message",
                           "--no-headers"], check=False).stdout.strip().splitlines()
        parts.append("events: " + (" | ".join(events[-6:]) or "none"))
        return "; ".join(parts)

    def shell(self, ns, pod):
        """A shell kept open in pod (one `kubectl exec` for many commands: each exec costs
        seconds under emulation); reopened when it died."""
        shells = self.state.setdefault("shells", {})
        sh = shells.get((ns, pod))
        if sh is None or sh.poll() is not None:
            sh = subprocess.Popen([self.kubectl, "-n", ns, "exec", "-i", pod, "--", "sh"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
            shells[(ns, pod)] = sh
        return sh

    def in_pod(self, ns, pod, script, timeout=180):
        """Runs the shell script in pod (through shell()); returns its output."""
        sh = self.shell(ns, pod)
        marker = f"__lace_check_done_{time.time_ns()}__".encode()
        try:
            sh.stdin.write(f"{{ {script}\n}} 2>&1; echo {marker.decode()}\n".encode())
            sh.stdin.flush()
        except BrokenPipeError:
            self.state["shells"].pop((ns, pod), None)
            raise CheckFailed(f"the shell in {ns}/{pod} closed; {self.pod_story(ns, pod)}")
        # Raw reads: select() sees only the pipe, not what a buffered reader already took in.
        out, deadline = b"", time.time() + timeout
        while (marker + b"\n") not in out:
            left = deadline - time.time()
            if left <= 0 or not select.select([sh.stdout], [], [], left)[0]:
                sh.kill()
                raise CheckFailed(f"no answer from {ns}/{pod} within {timeout}s to: {script}; "
                                  f"{self.pod_story(ns, pod)}")
            chunk = os.read(sh.stdout.fileno(), 65536)
            if not chunk:
                self.state["shells"].pop((ns, pod), None)
                raise CheckFailed(f"the shell in {ns}/{pod} ended: {out.decode(errors='replace')[-300:]}; "
                                  f"{self.pod_story(ns, pod)}")
            out += chunk
        return out[:out.index(marker + b"\n")].decode(errors="replace")

    def reach(self, ns, pod, targets, timeout_s=3):
        """From pod, tries each target ("tcp IP PORT" or "icmp IP") at the same time (a denied
        target costs its whole timeout: one after another they added minutes to the checks);
        returns {target: True/False}."""
        script = []
        for t in targets:
            parts = t.split()
            if parts[0] == "tcp":
                host = f"[{parts[1]}]" if ":" in parts[1] else parts[1]
                cmd = f"/agnhost connect {host}:{parts[2]} --timeout {timeout_s}s"
            else:
                cmd = f"ping -c 1 -W {timeout_s} {parts[1]}"
            # Each verdict is one short write, so the lines of parallel probes never interleave.
            script.append(f"( if {cmd} >/dev/null 2>&1; then echo 'ok {t}'; else echo 'no {t}'; fi ) &")
        script.append("wait")
        text = self.in_pod(ns, pod, "\n".join(script), timeout=120 + len(targets) * 2 + timeout_s)
        out = {}
        for line in text.splitlines():
            verdict, _, target = line.partition(" ")
            out[target] = verdict == "ok"
        missing = [t for t in targets if t not in out]
        if missing:
            raise CheckFailed(f"{ns}/{pod} did not report {missing}: {text.strip()[-300:]}")
        return out


@pytest.fixture(scope="session")
def cluster():
    c = Cluster()
    yield c
    for sh in c.state.get("shells", {}).values():
        sh.kill()


def timestamp_seconds(ts):
    """Seconds since the epoch of a Kubernetes timestamp ("2026-12-03T15:04:26Z")."""
    return calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ"))


def b64(s):
    return base64.b64encode(s.encode()).decode()


def agent_metrics(cluster, node):
    """The /metrics text of the agent on node (through kubectl port-forward)."""
    agent = next(p for p in cluster.pods(SYSTEM_NS, AGENT_LABELS) if p["spec"].get("nodeName") == node)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pf = subprocess.Popen([cluster.kubectl, "-n", SYSTEM_NS, "port-forward", f"pod/{agent['metadata']['name']}",
                           f"{port}:9964"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            except OSError:
                if time.time() > deadline:
                    raise CheckFailed(f"cannot read the agent's metrics on {node} through kubectl port-forward")
                time.sleep(1)
    finally:
        pf.terminate()
        pf.wait()


def metric(text, name, **labels):
    """The sum of the samples of name in a /metrics text whose labels include labels."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r'([a-z_]+)(\{[^}]*\})? ([0-9.e+]+)', line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def connects(ip, port):
    """Whether a TCP connection from here (outside the cluster) to ip:port opens within 3 s."""
    try:
        with socket.create_connection((ip, port), timeout=3):
            return True
    except OSError:
        return False
