//! Kubernetes NetworkPolicy at scale on one node, in a network namespace (root; run by
//! `netns-tests/bench.sh --netpol`, in the VM when the host kernel lacks VRF). Prints one
//! table; every ratio compares two numbers measured in the same run on the same kernel.
//!
//! The node holds 1,000 pods of 50 Kubernetes namespaces (four Networks, a /24 block of each)
//! and the cluster 300 NetworkPolicies, six per namespace: default-deny ingress, a named port
//! from pods of the namespace, a port range from namespaces by label, an ipBlock with
//! `except`, egress to DNS only, and pods by label of namespaces by label.
//!
//! - fresh node: `plan()` and the reconciler's first apply into an empty namespace (VRFs,
//!   routes, the whole nft table), what an agent does on a new node;
//! - one change each, planned (`plan()`) and applied by the reconciler that applied the one
//!   before (what the running agent does), p50 / p99 of both together, with the writes and the
//!   nft transaction each made: a policy's port range changed, a policy's peers changed (another
//!   pod selector), a policy added and removed again, a pod's labels changed (it joins and
//!   leaves a selector);
//! - the baselines: the policy added and removed applied as a replace of the whole table (what
//!   a reconciler without memory of the table does, as after a restart): `plan()` and `nft -f`
//!   of the whole table; and the same update's commands run with `nft -f` alone (what of the
//!   apply time is nft's).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{np_port, selector};
use lace::dataplane::{ApplyReport, NetnsTarget, Reconciler};
use lace::plan::{plan, DesiredNode};
use lace::state::{
    ClusterState, ContainerPort, Namespace, NetworkPolicy, ObjectKey, Pod, PolicyPeer, PolicyRule,
    PortRef,
};
use lace_netns_tests::cluster::{ipv4_cluster, lone_node, TestNetwork};
use lace_netns_tests::require_root_and_vrf;

const PODS: u32 = 1_000;
const NAMESPACES: u32 = 50;
/// Changes of each kind (half of them there, half back).
const ROUNDS: usize = 20;
const NETWORKS: [TestNetwork; 4] = [
    TestNetwork {
        name: "net-a",
        second: 1,
        function: 1,
        reaches_itself: true,
    },
    TestNetwork {
        name: "net-b",
        second: 2,
        function: 2,
        reaches_itself: true,
    },
    TestNetwork {
        name: "net-c",
        second: 3,
        function: 3,
        reaches_itself: true,
    },
    TestNetwork {
        name: "net-d",
        second: 4,
        function: 4,
        reaches_itself: true,
    },
];

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn ns_name(i: u32) -> String {
    format!("ns-{i:02}")
}

/// Pod `k` of the node: namespace `k % 50`, Network `k % 4`; with `j = k / 50` (its index in
/// its namespace) labels `app=app-<j % 5>` and `tier=web|db` (`j` even or odd); a named port
/// `http` (TCP 8080).
fn pod(k: u32) -> (ObjectKey, Pod) {
    let net = k % 4;
    let ip = format!("10.{}.1.{}", 1 + net, 2 + k / 4).parse().unwrap();
    let j = k / NAMESPACES;
    let app = format!("app-{}", j % 5);
    let tier = if j.is_multiple_of(2) { "web" } else { "db" };
    (
        ObjectKey::new(ns_name(k % NAMESPACES), format!("pod-{k:04}")),
        Pod {
            labels: labels(&[("app", &app), ("tier", tier)]),
            node: "n1".into(),
            ips: vec![ip],
            host_network: false,
            ports: vec![ContainerPort {
                name: "http".into(),
                protocol: "TCP".into(),
                port: 8080,
            }],
        },
    )
}

/// The six policies of namespace `i`.
fn policies(i: u32) -> Vec<(String, NetworkPolicy)> {
    let team = |t: u32| selector(&[("team", &format!("team-{}", t % 10))]);
    vec![
        (
            "default-deny".into(),
            NetworkPolicy {
                ingress_isolation: true,
                ..Default::default()
            },
        ),
        (
            "named-port".into(),
            NetworkPolicy {
                pod_selector: selector(&[("app", "app-0")]),
                ingress_isolation: true,
                ingress: vec![PolicyRule {
                    peers: vec![PolicyPeer::Pods {
                        namespace_selector: None,
                        pod_selector: Some(selector(&[("app", "app-1")])),
                    }],
                    ports: vec![np_port("TCP", PortRef::Name("http".into()), None)],
                }],
                ..Default::default()
            },
        ),
        (
            "port-range".into(),
            NetworkPolicy {
                pod_selector: selector(&[("app", "app-2")]),
                ingress_isolation: true,
                ingress: vec![PolicyRule {
                    peers: vec![PolicyPeer::Pods {
                        namespace_selector: Some(team(i + 1)),
                        pod_selector: None,
                    }],
                    ports: vec![np_port("TCP", PortRef::Number(8080), Some(8090))],
                }],
                ..Default::default()
            },
        ),
        (
            "ip-block".into(),
            NetworkPolicy {
                pod_selector: selector(&[("app", "app-3")]),
                ingress_isolation: true,
                ingress: vec![PolicyRule {
                    peers: vec![PolicyPeer::IpBlock {
                        cidr: "10.0.0.0/8".parse().unwrap(),
                        except: vec![format!("10.{}.0.0/16", 1 + i % 4).parse().unwrap()],
                    }],
                    ports: vec![np_port("TCP", PortRef::Number(443), None)],
                }],
                ..Default::default()
            },
        ),
        (
            "dns-only".into(),
            NetworkPolicy {
                egress_isolation: true,
                egress: vec![PolicyRule {
                    peers: vec![PolicyPeer::Pods {
                        namespace_selector: Some(selector(&[(
                            "kubernetes.io/metadata.name",
                            "ns-00",
                        )])),
                        pod_selector: Some(selector(&[("app", "app-4")])),
                    }],
                    ports: vec![
                        np_port("UDP", PortRef::Number(53), None),
                        np_port("TCP", PortRef::Number(53), None),
                    ],
                }],
                ..Default::default()
            },
        ),
        (
            "web-from-teams".into(),
            NetworkPolicy {
                pod_selector: selector(&[("app", "app-4")]),
                ingress_isolation: true,
                ingress: vec![PolicyRule {
                    peers: vec![PolicyPeer::Pods {
                        namespace_selector: Some(team(i + 3)),
                        pod_selector: Some(selector(&[("tier", "web")])),
                    }],
                    ports: Vec::new(),
                }],
                ..Default::default()
            },
        ),
    ]
}

fn cluster() -> ClusterState {
    let mut s = ipv4_cluster("n", 2, &NETWORKS);
    for i in 0..NAMESPACES {
        let name = ns_name(i);
        s.namespaces.insert(
            name.clone(),
            Namespace {
                labels: labels(&[
                    ("kubernetes.io/metadata.name", &name),
                    ("team", &format!("team-{}", i % 10)),
                ]),
            },
        );
        for (policy, p) in policies(i) {
            s.network_policies.insert(ObjectKey::new(&name, &policy), p);
        }
    }
    s.pods.extend((0..PODS).map(pod));
    s
}

fn node_plan(s: &ClusterState) -> DesiredNode {
    plan("n1", s, &[]).unwrap()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The `q`-quantile (nearest rank) of `times`.
fn quantile(times: &[Duration], q: f64) -> Duration {
    let mut t = times.to_vec();
    t.sort_unstable();
    t[((t.len() as f64 * q).ceil() as usize).clamp(1, t.len()) - 1]
}

/// A change and its way back.
struct Change {
    name: &'static str,
    there: ClusterState,
    back: ClusterState,
}

fn changes(base: &ClusterState) -> Vec<Change> {
    let mut out = Vec::new();
    let range = ObjectKey::new("ns-07", "port-range");
    let mut s = base.clone();
    let rule = &mut s.network_policies.get_mut(&range).unwrap().ingress[0];
    rule.ports[0].end_port = Some(8100);
    out.push(Change {
        name: "a policy's port range changed",
        there: s,
        back: base.clone(),
    });

    let named = ObjectKey::new("ns-07", "named-port");
    let mut s = base.clone();
    let rule = &mut s.network_policies.get_mut(&named).unwrap().ingress[0];
    rule.peers = vec![PolicyPeer::Pods {
        namespace_selector: None,
        pod_selector: Some(selector(&[("app", "app-3")])),
    }];
    out.push(Change {
        name: "a policy's peers changed",
        there: s,
        back: base.clone(),
    });

    let mut s = base.clone();
    let extra = policies(7).swap_remove(1).1;
    s.network_policies
        .insert(ObjectKey::new("ns-07", "extra"), extra);
    out.push(Change {
        name: "a policy added / removed",
        there: s,
        back: base.clone(),
    });

    let mut s = base.clone();
    let (key, _) = pod(7);
    s.pods.get_mut(&key).unwrap().labels = labels(&[("app", "app-1"), ("tier", "web")]);
    out.push(Change {
        name: "a pod's labels changed",
        there: s,
        back: base.clone(),
    });
    out
}

/// One planned and applied change: (plan time, apply time, report).
fn apply(rec: &Reconciler, s: &ClusterState) -> (Duration, Duration, ApplyReport) {
    let t = Instant::now();
    let p = node_plan(s);
    let planned = t.elapsed();
    let t = Instant::now();
    let report = rec.reconcile(&p).unwrap();
    (planned, t.elapsed(), report)
}

/// One line of the table.
fn row(what: &str, plan: Duration, apply: Duration, all: &[Duration], writes: &str, op: &str) {
    println!(
        "| {what:<34} | {:>7.3} | {:>7.3} | {:>7.3} | {:>7.3} | {writes:>6} | {op:<90} |",
        secs(plan),
        secs(apply),
        secs(quantile(all, 0.5)),
        secs(quantile(all, 0.99)),
    );
}

/// The nft operation of a report, shortened for the table.
fn nft_op(r: &ApplyReport) -> String {
    r.sample
        .iter()
        .find(|op| op.starts_with("nft "))
        .map(|op| op.split(" (lace-plan").next().unwrap_or(op).to_string())
        .unwrap_or_else(|| "-".into())
}

fn main() {
    // `cargo bench` passes `--bench`; a plain run (e.g. `cargo test --benches`) is a no-op.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    require_root_and_vrf();
    println!(
        "kernel {}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    let base = cluster();
    let t = Instant::now();
    let full = node_plan(&base);
    let plan_time = t.elapsed();
    let sets = full.base.nft.sets.len();
    let elements: usize = full.base.nft.sets.iter().map(|s| s.elements.len()).sum();
    let rules: usize = full.base.nft.chains.iter().map(|c| c.rules.len()).sum();
    println!(
        "{PODS} pods, {} NetworkPolicies on node n1: {sets} sets, {elements} elements, {rules} rules",
        base.network_policies.len()
    );

    // Warm-up: the first VRF, nft table and seg6 route load kernel modules.
    {
        let ns = lone_node("bench-np-warm", 1).unwrap();
        let rec = Reconciler::new(NetnsTarget::Path(ns.path())).unwrap();
        rec.reconcile(&full).unwrap();
    }

    let ns = lone_node("bench-np", 1).unwrap();
    let rec = Reconciler::new(NetnsTarget::Path(ns.path())).unwrap();
    let t = Instant::now();
    let first = rec.reconcile(&full).unwrap();
    let install = t.elapsed();

    println!(
        "| {:<34} | {:>7} | {:>7} | {:>7} | {:>7} | {:>6} | {:<90} |",
        "what (p50 / p99 of 20, seconds)",
        "plan",
        "apply",
        "total",
        "p99",
        "writes",
        "nft transaction (the first)"
    );
    println!("|{}|", "-".repeat(178));
    row(
        "fresh node",
        plan_time,
        install,
        &[plan_time + install],
        &first.writes.to_string(),
        &nft_op(&first),
    );

    let mut in_place = Duration::ZERO;
    for c in changes(&base) {
        let (mut plans, mut applies, mut totals, mut writes) = (vec![], vec![], vec![], vec![]);
        let mut op = String::new();
        for round in 0..ROUNDS {
            let s = if round.is_multiple_of(2) {
                &c.there
            } else {
                &c.back
            };
            let (planned, applied, report) = apply(&rec, s);
            assert!(report.writes > 0, "{}: nothing written", c.name);
            plans.push(planned);
            applies.push(applied);
            totals.push(planned + applied);
            writes.push(report.writes);
            if round == 0 {
                op = nft_op(&report);
            }
        }
        assert_eq!(rec.reconcile(&full).unwrap().writes, 0, "converged");
        if c.name == "a policy added / removed" {
            in_place = quantile(&applies, 0.5);
        }
        writes.sort_unstable();
        row(
            c.name,
            quantile(&plans, 0.5),
            quantile(&applies, 0.5),
            &totals,
            &writes[writes.len() / 2].to_string(),
            &op,
        );
    }

    // Baseline: the policy added / removed again as a replace of the whole table (what a
    // reconciler without memory of the table does): plan, then `nft -f` of the whole table.
    let added = &changes(&base)[2];
    let (mut plans, mut applies, mut totals) = (vec![], vec![], vec![]);
    for round in 0..ROUNDS / 2 {
        let s = if round.is_multiple_of(2) {
            &added.there
        } else {
            &base
        };
        let t = Instant::now();
        let text = node_plan(s).render_nft();
        let planned = t.elapsed();
        let t = Instant::now();
        ns.exec_stdin("nft", &["-f", "-"], &text).unwrap();
        plans.push(planned);
        applies.push(t.elapsed());
        totals.push(planned + t.elapsed());
    }
    let replaced = quantile(&applies, 0.5);
    // And the reconciler's update of that change without the reconciler: `nft -f` of the same
    // commands into a table installed by `nft -f` in another namespace.
    let raw = lone_node("bench-np-raw", 1).unwrap();
    let there = node_plan(&added.there);
    raw.exec_stdin("nft", &["-f", "-"], &full.render_nft())
        .unwrap();
    let forth = full.base.nft.changes(&there.base.nft).unwrap().render();
    let back = there.base.nft.changes(&full.base.nft).unwrap().render();
    let nft_alone: Vec<Duration> = (0..ROUNDS)
        .map(|round| {
            let script = if round.is_multiple_of(2) {
                &forth
            } else {
                &back
            };
            let t = Instant::now();
            raw.exec_stdin("nft", &["-f", "-"], script).unwrap();
            t.elapsed()
        })
        .collect();
    row(
        "the update's nft -f alone",
        Duration::ZERO,
        quantile(&nft_alone, 0.5),
        &nft_alone,
        "1",
        "nft -f of the same commands, no reconciler",
    );
    row(
        "baseline: added / removed, replace",
        quantile(&plans, 0.5),
        replaced,
        &totals,
        "1",
        "nft -f of the whole table",
    );
    println!(
        "|   a policy added / removed, applied in place vs replacing the table: {:.2}x the time",
        secs(in_place) / secs(replaced)
    );
}
