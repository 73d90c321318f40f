#!/usr/bin/env python3
"""Applies a rendered Lace plan (tests/golden/<node>.plan + .nft) to a network namespace with
plain `ip`/`sysctl`/`nft`, standing in for the reconciler so the plan's datapath can be checked
on a real kernel (see datapath.sh). Symbolic next hops are resolved as documented in
src/plan/mod.rs: `@uplink` is the given uplink device, `via @host-route` copies what the
namespace's main table resolves for the destination.

usage: apply_plan.py NETNS UPLINK PLAN_FILE NFT_FILE [ATTACH_CMD]
ATTACH_CMD runs (in the root namespace) once the VRFs exist and before the routes are added:
it creates the pods' veths and enslaves them (enslaving a device flushes its routes).
"""
import re
import subprocess
import sys

ns, uplink, plan_file, nft_file = sys.argv[1:5]
attach_cmd = sys.argv[5] if len(sys.argv) > 5 else None


def run(*cmd, ok_exists=False):
    full = ["ip", "netns", "exec", ns, *cmd]
    r = subprocess.run(full, capture_output=True, text=True)
    if r.returncode != 0 and not (ok_exists and "File exists" in r.stderr):
        sys.exit(f"apply_plan: {' '.join(full)}: {r.stderr.strip()}")
    return r.stdout


def host_route(dst, v6):
    fam = "-6" if v6 else "-4"
    if dst == "default":
        out = run("ip", fam, "route", "show", "default", "table", "main")
    else:
        out = run("ip", fam, "route", "get", dst.split("/")[0])
    m = re.search(r"via (\S+) dev (\S+)", out)
    if not m:
        sys.exit(f"apply_plan: no host route for {dst} in {ns}: {out!r}")
    return ["via", m.group(1), "dev", m.group(2)]


lines = open(plan_file).read().splitlines()
section, table, sysctls, routes = None, None, [], []
for line in lines:
    if not line.strip():
        continue
    if line.startswith("locator "):
        tunsrc = line.split("seg6 tunsrc ")[1].strip()
        continue
    if line.startswith("## "):
        section = line.split()[1]
        if section == "table":
            table = line.split()[2]
        continue
    if line.startswith("#"):
        continue
    if section == "underlay":
        # Peers say how they are reached; the routes below carry it. The SRv6-over-IPv4
        # device (goldens of the mixed cluster) is left to the reconciler's netns tests.
        if not line.startswith("peer "):
            sys.exit(f"apply_plan: not supported here: {line}")
    elif section == "sysctls":
        k, v = [x.strip() for x in line.split("=")]
        sysctls.append((k, v))
    elif section == "vrfs" and line.startswith("link "):
        # A VRF's ingress device: `link li-x type dummy master lv-x up`.
        _, name, _, kind, _, master, _ = line.split()
        run("ip", "link", "add", name, "type", kind)
        run("ip", "link", "set", name, "master", master, "up")
    elif section == "vrfs":
        name, _, _net, _, tid = line.split()[:5]
        run("ip", "link", "add", name, "type", "vrf", "table", tid)
        run("ip", "link", "set", name, "up")
    elif section == "rules":
        run("ip", *line.split()[:1], "rule", "add", *line.split()[1:], ok_exists=True)
    elif section == "table":
        routes.append((table, line))

run("ip", "sr", "tunsrc", "set", tunsrc)
# The ruleset first: it loads nf_conntrack, which owns net.netfilter.nf_hooks_lwtunnel.
run("nft", "-f", nft_file)
for k, v in sysctls:
    run("sysctl", "-qw", f"{k}={v}")

if attach_cmd and subprocess.run(["bash", "-c", attach_cmd]).returncode != 0:
    sys.exit(f"apply_plan: {attach_cmd} failed")
for table, line in routes:
    words = line.split()
    v6 = words[0] == "-6"
    if v6:
        words = words[1:]
    dst, nh = words[0], words[1:]
    fam = "-6" if v6 else "-4"
    if nh == ["unreachable"]:
        cmd = ["ip", fam, "route", "add", "unreachable", dst, "table", table]
    elif nh == ["via", "@host-route"]:
        cmd = ["ip", fam, "route", "add", dst, *host_route(dst, v6), "table", table]
    else:
        nh = [uplink if w == "@uplink" else w for w in nh]
        if v6 and "src" in nh and nh[nh.index("src") + 1].startswith("fe80:"):
            # A link-local source (IPv6 probe routes) is an address of the route's device,
            # which the reconciler adds first.
            src, dev = nh[nh.index("src") + 1], nh[nh.index("dev") + 1]
            run("ip", "-6", "addr", "add", f"{src}/64", "dev", dev, "nodad", ok_exists=True)
        cmd = ["ip", fam, "route", "add", dst, *nh, "table", table]
    run(*cmd)
print(f"apply_plan: {ns}: {len(routes)} routes applied")
