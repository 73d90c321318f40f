//! The controller at 5,000-node scale, against the fake API server of the tests
//! (`lace-fake-kube`, in process; requests counted by verb and resource): 5,000 dual-stack nodes x 50
//! dual-stack Networks (+ a binding and a routing policy per Network) from scratch, then one
//! more node, one more Network, and a restart. For each step: wall time, API writes by
//! resource, Kubernetes Events, and the watch events every agent receives because of the
//! controller's writes (changes to the kinds agents watch: the Lace kinds and Nodes).
//!
//! Baseline, measured in the same run: the pure allocator (`lace::alloc::allocate`) on the
//! same objects, the floor the controller's pass adds its API round trips to. For reference,
//! computed rather than measured: with the former `NodeAllocation.blocks` design one new
//! Network rewrote every NodeAllocation (nodes writes, nodes x nodes watch events).
//!
//! Run: `cargo bench -p lace-controller --bench scale`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lace_fake_kube::{FakeApi, Recorded};
use serde_json::{json, Value};
use support::{network, node, policy, Harness, PREFIX};

const NODES: u32 = 5_000;
const NETWORKS: u32 = 50;
/// The collections agents watch that the controller writes to.
const AGENT_WATCHED: [&str; 8] = [
    "/api/v1/nodes",
    "/apis/lace.io/v1alpha1/networks",
    "/apis/lace.io/v1alpha1/networkbindingpolicies",
    "/apis/lace.io/v1alpha1/servicebindingpolicies",
    "/apis/lace.io/v1alpha1/networkroutingpolicies",
    "/apis/lace.io/v1alpha1/serviceroutingpolicies",
    "/apis/lace.io/v1alpha1/networkallocations",
    "/apis/lace.io/v1alpha1/nodeallocations",
];

fn bench_node(i: u32) -> Value {
    let [_, a, b, c] = i.to_be_bytes();
    node(
        &format!("node-{i:05}"),
        &[&format!("172.{a}.{b}.{c}"), &format!("fd00:fab::{i:x}")],
    )
}

fn bench_network(i: u32) -> Vec<Value> {
    let name = format!("net-{i:02}");
    vec![
        network(
            &name,
            &[
                (&format!("10.{i}.0.0/16"), 29),
                (&format!("fd00:{i:x}::/48"), 64),
            ],
        ),
        policy(
            "NetworkBindingPolicy",
            &name,
            json!({"network": name, "priority": i, "namespaceSelector": {"matchLabels": {"team": name}}}),
        ),
        policy(
            "NetworkRoutingPolicy",
            &name,
            json!({"from": name, "to": name}),
        ),
    ]
}

/// What one step cost.
struct Row {
    step: &'static str,
    time: Duration,
    writes: BTreeMap<String, usize>,
    events: usize,
    agent_events: usize,
    largest: usize,
    /// Objects written more than once.
    twice: usize,
}

/// `verb resource` of a write, without the object's name.
fn write_key(w: &Recorded) -> String {
    format!("{} {}", w.verb, w.resource)
}

/// Events the controller's writes caused in the collections agents watch: each write that
/// changed such an object is one watch event to every agent watching it.
fn agent_events(writes: &[Recorded]) -> usize {
    writes
        .iter()
        .filter(|w| {
            w.path != "/api/v1/nodes"
                && AGENT_WATCHED
                    .iter()
                    .any(|c| w.path.starts_with(&format!("{c}/")))
        })
        .count()
        + writes
            .iter()
            .filter(|w| w.path.starts_with("/api/v1/nodes/"))
            .count()
}

fn row(step: &'static str, time: Duration, writes: Vec<Recorded>) -> Row {
    let events = writes.iter().filter(|w| w.path.contains("/events")).count();
    let api: Vec<Recorded> = writes
        .into_iter()
        .filter(|w| !w.path.contains("/events"))
        .collect();
    let mut by = BTreeMap::new();
    let mut per_object: BTreeMap<&str, usize> = BTreeMap::new();
    for w in &api {
        *by.entry(write_key(w)).or_insert(0) += 1;
        *per_object.entry(&w.path).or_insert(0) += 1;
    }
    let twice = per_object.values().filter(|n| **n > 1).count();
    Row {
        step,
        time,
        largest: api
            .iter()
            .map(|w| serde_json::to_vec(&w.body).unwrap().len())
            .max()
            .unwrap_or(0),
        agent_events: agent_events(&api),
        writes: by,
        events,
        twice,
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench());
}

async fn bench() {
    let fake = FakeApi::new();
    let mut docs: Vec<Value> = (1..=NODES).map(bench_node).collect();
    docs.extend((0..NETWORKS).flat_map(bench_network));
    let mut state = lace::state::ClusterState::default();
    state.config.srv6_locator_prefix = Some(PREFIX.parse().unwrap());
    for doc in &docs {
        fake.put(doc.clone());
    }
    // The baseline: the pure allocator over the same Nodes and Networks.
    let dir = tempfile::tempdir().unwrap();
    let yaml: String = docs
        .iter()
        .map(|d| format!("---\n{}", serde_saphyr::to_string(d).unwrap()))
        .collect();
    std::fs::write(dir.path().join("cluster.yaml"), yaml).unwrap();
    let loaded = lace::load::load_dir(dir.path()).unwrap();
    state.nodes = loaded.nodes;
    state.networks = loaded.networks;
    let start = Instant::now();
    let alloc = std::hint::black_box(lace::alloc::allocate(&state).unwrap());
    let baseline = start.elapsed();
    assert_eq!(alloc.node_allocations.len(), NODES as usize);

    let mut rows = Vec::new();
    let start = Instant::now();
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    rows.push(row("from scratch", start.elapsed(), fake.take_writes()));

    let start = Instant::now();
    fake.put(bench_node(NODES + 1));
    h.settle().await;
    rows.push(row("+1 node", start.elapsed(), fake.take_writes()));

    let start = Instant::now();
    for doc in bench_network(NETWORKS) {
        fake.put(doc);
    }
    h.settle().await;
    rows.push(row(
        "+1 Network (+2 policies)",
        start.elapsed(),
        fake.take_writes(),
    ));
    h.stop().await.unwrap();

    let start = Instant::now();
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    rows.push(row("restart (relist)", start.elapsed(), fake.take_writes()));
    h.stop().await.unwrap();

    println!("lace-controller, {NODES} dual-stack nodes x {NETWORKS} dual-stack Networks (+1 binding and +1 routing policy each), fake API server");
    println!(
        "baseline: lace::alloc::allocate on the same objects: {:.1} ms",
        baseline.as_secs_f64() * 1e3
    );
    println!();
    println!(
        "{:<26} {:>9} {:>8} {:>8} {:>13} {:>9}  writes by verb and resource",
        "step", "time", "writes", "Events", "agent events", "largest"
    );
    for r in &rows {
        let total: usize = r.writes.values().sum();
        let detail: Vec<String> = r.writes.iter().map(|(k, n)| format!("{n} {k}")).collect();
        println!(
            "{:<26} {:>7.2} s {:>8} {:>8} {:>13} {:>7} B  {}",
            r.step,
            r.time.as_secs_f64(),
            total,
            r.events,
            r.agent_events,
            r.largest,
            if detail.is_empty() {
                "-".to_string()
            } else {
                detail.join(", ")
            }
        );
    }
    println!();
    let scratch: usize = rows[0].writes.values().sum();
    println!(
        "from scratch: {scratch} API writes, each to a different object ({} written twice): one per NodeAllocation ({NODES}) and NetworkAllocation ({NETWORKS}), one status per Network ({NETWORKS}) and policy ({}); {:.2} s (target < 10 s)",
        rows[0].twice,
        NETWORKS * 2,
        rows[0].time.as_secs_f64()
    );
    println!(
        "former design (NodeAllocation.blocks), computed: +1 Network = {NODES} NodeAllocation writes, {NODES} events per agent, {} cluster-wide",
        u64::from(NODES) * u64::from(NODES)
    );
}
