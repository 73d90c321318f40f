"""10. Kubernetes NetworkPolicy, judged by the upstream e2e tests (`[sig-network] Netpol`, the
`e2e.test` binary of k8s.io/kubernetes at the tested version: scripts/k8s-components.sh e2e). The
e2e namespaces (the framework labels each one `e2e-run`) are bound to Network `k8s-e2e`, which
reaches itself and its own Services (tests/cluster/upstream-e2e-network.yaml), as the Kubernetes
network model these tests assume; their NetworkPolicies then restrict inside it. FOCUS is the
subset that fits the suite's time: each test takes minutes here (three namespaces, nine pods,
every pod probing every pod's Service through `kubectl exec`), and the two run at once, each in
its own e2e.test process. Prints passed / failed / skipped from the
suite's JUnit reports; every focused test must have run and passed.

Env: LACE_E2E_TEST, the e2e.test binary (default: e2e.test on PATH); without one this check
fails and says how to build it. LACE_E2E_FOCUS, a ginkgo focus regex that replaces FOCUS, to run
other upstream tests by hand in the same Network (e.g. the sig-network conformance tests:
'\\[sig-network\\].*\\[Conformance\\]'), LACE_E2E_SKIP a skip regex, LACE_E2E_TIMEOUT the
seconds e2e.test may take (default 2700), LACE_E2E_PROCS how many e2e.test processes share the
focused tests (default 1; each gets every N-th test of a dry run's list): the check then passes
when at least one test passed and none failed (with LACE_E2E_PROCS, when every listed test ran,
or skipped itself as upstream's node-pod SCTP test does, and none failed)."""

import os
import re
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from conftest import ROOT, SYSTEM_NS, CheckFailed

NETWORK = ROOT / "tests/cluster/upstream-e2e-network.yaml"
# One test each of: default deny both ways, and a namespace selector. ipBlock with except, named
# ports, a pod whose labels change and UDP ports are left to the netns test `netpol` and the
# planner's tests: every upstream test probes every pod from every pod through `kubectl exec`,
# each probe a process started in a container of the emulated nodes. Three at once took
# 341-469 s each on one day and 536-851 s on another (CI of 6787791, over its 90 minutes); the
# ipBlock one went.
FOCUS = [
    "server and client should support a 'default-deny-all' policy",
    "server and client should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
]


def e2e_binary():
    path = os.environ.get("LACE_E2E_TEST") or shutil.which("e2e.test")
    if not path:
        raise CheckFailed(
            "no upstream e2e.test binary: build it with `scripts/k8s-components.sh e2e` (Go) and "
            "put its bin directory on PATH, or set LACE_E2E_TEST to it")
    return path


def shard(binary, focus, skip, procs):
    """The tests a by-hand focus (and skip) selects, from a dry run of e2e.test, dealt round-robin
    into `procs` ginkgo focus regexes, each matching the ends of its tests' full texts (what ginkgo
    matches holds more before them: a `^` matches nothing)."""
    out = subprocess.run([binary, "--provider=skeleton", "--ginkgo.dry-run", "--ginkgo.v", "--ginkgo.no-color",
                          f"--ginkgo.focus={focus}", *skip], capture_output=True, text=True, timeout=300).stdout
    # Each spec's line: its full text, then its labels in one bracket ("[sig-network, Feature:X]").
    names = sorted({m.group(1) for m in re.finditer(r"^(\[sig-[^\]]*\] .*?) \[[^\[\]]*\]$", out, re.M)})
    if not names:
        raise CheckFailed(f"LACE_E2E_FOCUS {focus!r} selects no upstream test (dry run of {binary})")
    groups = [names[i::procs] for i in range(min(procs, len(names)))]
    # Go's regexp refuses Python's escaped spaces and dashes: escape only its metacharacters.
    escape = lambda n: re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", n)  # noqa: E731
    return names, ["(?:" + "|".join(escape(n) for n in g) + ")$" for g in groups]


def junit_results(report_dir):
    """(name, outcome, seconds) of every test in the JUnit report (its `[It]` specs, not the suite's set-up
    and report nodes), outcome passed / failed / skipped (not selected) / timedout (cut by the suite's
    timeout) / "declined: REASON" (selected, and skipped by the test itself, e.g. upstream's
    node-pod SCTP test: "Skipping SCTP node to pod test until DialFromNode supports SCTP")."""
    results = []
    for f in sorted(Path(report_dir).glob("junit*.xml")):
        for case in ET.parse(f).getroot().iter("testcase"):
            if not case.get("name", "").startswith("[It]"):
                continue
            skipped = case.find("skipped")
            if skipped is not None:
                why = skipped.get("message") or "skipped"
                outcome = "skipped" if why == "skipped" else "declined: " + why.removeprefix("skipped - ")
            elif case.get("status") == "timedout":
                outcome = "timedout"
            elif case.find("failure") is not None or case.find("error") is not None:
                outcome = "failed"
            else:
                outcome = "passed"
            results.append((case.get("name", ""), outcome, float(case.get("time") or 0)))
    return results


def unready_system_pods(cluster):
    """kube-system pods that are neither Ready nor done: the e2e suite waits for none to be left
    before its first test (10 minutes, then it fails)."""
    bad = []
    for p in cluster.items("pods", "-n", SYSTEM_NS):
        phase = p.get("status", {}).get("phase")
        ready = (cluster.condition(p, "Ready") or {}).get("status") == "True"
        if phase != "Succeeded" and not (phase == "Running" and ready):
            bad.append(f"{p['metadata']['name']} ({phase})")
    return bad


def test_upstream_networkpolicy_e2e(cluster):
    binary = e2e_binary()
    cluster.wait("every kube-system pod Running and Ready (the e2e suite's precondition)",
                 lambda: (not (b := unready_system_pods(cluster)), b), timeout=300)
    cluster.k("apply", "-f", str(NETWORK))
    try:
        def ready():
            net = cluster.kj("get", "networks.lace.io", "k8s-e2e")
            c = cluster.condition(net, "Ready") or {}
            return c.get("status") == "True", net.get("status")
        cluster.wait("Network k8s-e2e Ready", ready, timeout=120)
        report = tempfile.mkdtemp(prefix="lace-e2e-netpol-")
        by_hand = bool(os.environ.get("LACE_E2E_FOCUS"))
        skip = [f"--ginkgo.skip={os.environ['LACE_E2E_SKIP']}"] if os.environ.get("LACE_E2E_SKIP") else []
        procs = int(os.environ.get("LACE_E2E_PROCS") or 1)
        if by_hand and procs > 1:
            listed, focus = shard(binary, os.environ["LACE_E2E_FOCUS"], skip, procs)
            print(f"\n{len(listed)} upstream tests in {len(focus)} processes")
        else:
            listed, focus = (None, [os.environ["LACE_E2E_FOCUS"]]) if by_hand else (FOCUS, FOCUS)
        limit = int(os.environ.get("LACE_E2E_TIMEOUT") or 2700)
        # FOCUS's tests each in an e2e.test process of its own, all at once: each creates its
        # own namespaces, and one alone leaves the emulated nodes' CPUs idle while it waits
        # for pods and probes (a by-hand focus runs in one process).
        runs = []
        t = time.time()
        for i, f in enumerate(focus):
            out = Path(report, str(i))
            out.mkdir()
            argv = [binary, f"--kubeconfig={os.environ.get('KUBECONFIG', '')}", "--provider=skeleton",
                    f"--ginkgo.focus={f}", *skip, f"--ginkgo.timeout={limit - 60}s",
                    "--ginkgo.no-color", f"--report-dir={out}", "--disable-log-dump"]
            log = open(out / "e2e.log", "w")
            runs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True), log, out))
        codes = []
        for proc, log, _ in runs:
            try:
                codes.append(proc.wait(timeout=max(1, limit - (time.time() - t))))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
            log.close()
        took = time.time() - t
        # Every process reports every test: a test counts as run where some process ran it.
        results = [r for _, _, out in runs for r in junit_results(out)]
        ran = [(n, o, secs) for n, o, secs in results if o != "skipped"]
        # Each test's outcome over all processes: where one ran it, that one's.
        per_test = {n: o for n, o, _ in results if o == "skipped"} | {n: o for n, o, _ in ran}
        counts = {o: sum(1 for x in per_test.values() if x.split(":")[0] == o)
                  for o in ("passed", "failed", "timedout", "declined", "skipped")}
        asked = os.environ["LACE_E2E_FOCUS"] if by_hand else " or ".join(focus)
        print(f"\nupstream e2e ({asked}; {took:.0f}s): {counts['passed']} passed, "
              f"{counts['failed']} failed, {counts['timedout']} timed out, {counts['declined']} skipped "
              f"by the test itself, {counts['skipped']} not selected; log and JUnit in {report}")
        for name, outcome, secs in ran:
            print(f"  {outcome} in {secs:.0f}s: {name}")
        failed = [n for n, o, _ in ran if o != "passed" and not o.startswith("declined")]
        # A test that skips itself has not run: fine by hand (reported), not for FOCUS.
        counted = [n for n, o, _ in ran if not (o.startswith("declined") and not by_hand)]
        missing = [f for f in listed if not any(f in n for n in counted)] if listed else (
            [] if any(o == "passed" for _, o, _ in ran) else focus)
        if failed or missing or any(codes):
            tails = "\n".join(f"--- {out}/e2e.log ends:\n" + "\n".join(
                (out / "e2e.log").read_text(errors="replace").splitlines()[-25:])
                for (_, _, out), code in zip(runs, codes) if code != 0)
            raise CheckFailed(
                f"expected every focused upstream test to run and pass; failed: {failed}, "
                f"not run (a focus matching no test: renamed upstream?): {missing}, e2e.test exit "
                f"statuses {codes}\n{tails}")
    finally:
        cluster.k("delete", "-f", str(NETWORK), "--ignore-not-found", "--timeout=120s", check=False, timeout=150)
