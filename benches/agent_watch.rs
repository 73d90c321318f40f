//! `cargo bench -p lace --bench agent_watch`: the agent's Kubernetes source at scale, printed
//! as a table (no timed assertions).
//!
//! The cluster (default 5,000 nodes' allocations, 50 Networks each self-routed with an IPv4
//! /12 and /26 blocks, 10,000 Services with one EndpointSlice each, 100 pods on the planned
//! node) is served by the fake API server of the tests (`lace-fake-kube`) in a child
//! process over loopback HTTP, so its objects do not count in the agent's memory. The agent
//! side is the real `KubeSource` (kube client, watches, feeder), the real `Agent` and
//! reconcile loop, and a dataplane that only timestamps plans.
//!
//! Rows:
//! - **memory**, in a second child process: resident size before connecting (the
//!   baseline), and after every watch has listed, for an agent whose node is not allocated
//!   (the caches and the state handed over, no plan), VmRSS and peak (VmHWM);
//! - the same for the planned node (caches, state and its plan and planner);
//! - **time to the first plan applied** from start;
//! - **watch event → plan applied** for a new NetworkRoutingPolicy (p50/p99 over
//!   `--iterations`), against the baseline measured in the same run: the same change handed
//!   straight to `Agent::set_state` (planner rebuild and plan, no watch, no debounce).
//!
//! Anchor: Cilium's agent averages 438 MiB at 1,000 nodes / 50,000 pods. Target: < 100 MB.
//! Flags: `--nodes N --networks N --services N --iterations N`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lace::agent::cluster::{ApiServer, KubeSource};
use lace::agent::{Agent, PlanSink, StateSource};
use lace::plan::DesiredNode;
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug)]
struct Size {
    nodes: u32,
    networks: u32,
    services: u32,
    iterations: usize,
}

fn arg(args: &[String], name: &str, default: u32) -> u32 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn size(args: &[String]) -> Size {
    Size {
        nodes: arg(args, "--nodes", 5000),
        networks: arg(args, "--networks", 50),
        services: arg(args, "--services", 10_000),
        iterations: arg(args, "--iterations", 20) as usize,
    }
}

fn kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

// ---- the cluster (served by the child)

fn net(i: u32) -> String {
    format!("net-{i:03}")
}

/// Network `i`'s /12 (synthetic space from 16.0.0.0, as the plan benchmark) and the base
/// address of node index `n`'s /26 block in it.
fn block_base(i: u32, n: u32) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(
        16 + (i / 16) as u8,
        ((i % 16) * 16) as u8,
        0,
        0,
    ));
    Ipv4Addr::from(base + (n - 1) * 64)
}

fn lace(kind: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "lace.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec})
}

fn ns_selector(i: u32) -> Value {
    json!({"matchLabels": {"kubernetes.io/metadata.name": format!("ns-{i}")}})
}

fn cluster(s: Size) -> Vec<Value> {
    let mut out = Vec::new();
    for i in 0..s.networks {
        let cidr = format!("{}/12", block_base(i, 1));
        out.push(lace(
            "Network",
            &net(i),
            json!({"subnets": [{"cidr": cidr, "blockPrefix": 26}]}),
        ));
        out.push(lace(
            "NetworkAllocation",
            &net(i),
            json!({"function": i + 1}),
        ));
        out.push(lace(
            "NetworkRoutingPolicy",
            &format!("{}-to-self", net(i)),
            json!({"from": net(i), "to": net(i)}),
        ));
        out.push(lace(
            "NetworkBindingPolicy",
            &net(i),
            json!({"network": net(i), "priority": 10, "namespaceSelector": ns_selector(i)}),
        ));
        out.push(lace(
            "ServiceBindingPolicy",
            &net(i),
            json!({"network": net(i), "priority": 10, "namespaceSelector": ns_selector(i)}),
        ));
        out.push(json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": format!("ns-{i}"),
                                     "labels": {"kubernetes.io/metadata.name": format!("ns-{i}")}}}));
    }
    for i in 1..s.networks.min(6) {
        out.push(lace(
            "ServiceRoutingPolicy",
            &format!("{}-to-{}-services", net(i), net(i - 1)),
            json!({"from": net(i), "to": net(i - 1), "namespaceSelector": ns_selector(i - 1)}),
        ));
    }
    for n in 1..=s.nodes {
        out.push(lace(
            "NodeAllocation",
            &format!("node-{:04}", n - 1),
            json!({"index": n, "locator": format!("2001:db8:100::{n:x}:0:0/96"),
                   "underlay": {"ipv6": format!("fd00:fab::{n:x}")}}),
        ));
    }
    out.push(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-0000", "labels": {"kubernetes.io/os": "linux"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "fd00:fab::1"}]}}));
    for p in 0..100u32 {
        let i = p % s.networks;
        let ip = Ipv4Addr::from(u32::from(block_base(i, 1)) + 2 + p / s.networks);
        out.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-{p}"), "namespace": format!("ns-{i}"),
                         "labels": {"app": format!("app-{p}")}},
            "spec": {"nodeName": "node-0000"},
            "status": {"podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}}));
    }
    for k in 0..s.services {
        let i = k % s.networks;
        let ns = format!("ns-{i}");
        let name = format!("svc-{k}");
        let ip = Ipv4Addr::new(172, 16 + (k >> 16) as u8, (k >> 8) as u8, k as u8);
        out.push(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": {"clusterIP": ip.to_string(), "clusterIPs": [ip.to_string()],
                     "ports": [{"protocol": "TCP", "port": 80, "targetPort": 8080}]}}));
        let endpoints: Vec<Value> = (0..3)
            .map(|j| {
                let node = (k * 7 + j) % s.nodes + 1;
                let ip = Ipv4Addr::from(u32::from(block_base(i, node)) + 2);
                json!({"addresses": [ip.to_string()], "conditions": {"ready": true},
                       "nodeName": format!("node-{:04}", node - 1)})
            })
            .collect();
        out.push(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-abcde"), "namespace": ns,
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"protocol": "TCP", "port": 8080}]}),
        );
    }
    out
}

/// Child: serves the cluster on loopback and prints the port.
fn serve(s: Size) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fake = lace_fake_kube::FakeApi::new();
        for o in cluster(s) {
            fake.put(o);
        }
        let served = fake.serve().await.unwrap();
        println!("{}", served.addr.port());
        std::io::stdout().flush().unwrap();
        // Served until the parent kills this process.
        std::future::pending::<()>().await;
    });
}

// ---- the agent side

/// Timestamps every plan and notes whether it names a marker policy.
#[derive(Default)]
struct Stamps {
    marker: Mutex<Option<String>>,
    seen: Mutex<Option<Instant>>,
    applies: Mutex<Vec<Instant>>,
}

impl Stamps {
    fn record(&self, plan: &DesiredNode) {
        let now = Instant::now();
        self.applies.lock().unwrap().push(now);
        if let Some(m) = self.marker.lock().unwrap().clone() {
            if plan.render_nft().contains(&m) {
                self.seen.lock().unwrap().get_or_insert(now);
            }
        }
    }

    /// The time from `change` (which adds a policy named `marker`) to the first plan applied
    /// with it.
    fn until_applied(&self, marker: &str, change: impl FnOnce()) -> Duration {
        *self.seen.lock().unwrap() = None;
        *self.marker.lock().unwrap() = Some(marker.to_string());
        let t0 = Instant::now();
        change();
        let deadline = t0 + Duration::from_secs(120);
        loop {
            if let Some(t) = *self.seen.lock().unwrap() {
                return t - t0;
            }
            assert!(Instant::now() < deadline, "{marker}: never applied");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

struct Running {
    agent: Arc<Agent>,
    stamps: Arc<Stamps>,
    started: Instant,
    _state: tempfile::TempDir,
    _sa: tempfile::TempDir,
}

fn start_agent(rt: &tokio::runtime::Runtime, port: u16, node: &str) -> Running {
    let sa = tempfile::tempdir().unwrap();
    std::fs::write(sa.path().join("token"), "bench").unwrap();
    let api = ApiServer::new(Some(&format!("http://127.0.0.1:{port}")), sa.path()).unwrap();
    let source = Arc::new(KubeSource::new(node.into(), api));
    let stamps = Arc::new(Stamps::default());
    let state = tempfile::tempdir().unwrap();
    let _guard = rt.enter();
    let agent = Arc::new(Agent::new(
        node.into(),
        lace::agent::ipam::IpamStore::open(state.path()).unwrap(),
        {
            let stamps = Arc::clone(&stamps);
            Arc::new(PlanSink::new(move |plan| stamps.record(plan)))
        },
        source.clone(),
    ));
    let started = Instant::now();
    rt.spawn(Arc::clone(&source).run(Arc::clone(&agent)));
    rt.spawn(lace::agent::reconcile::run(
        Arc::clone(&agent),
        lace::agent::reconcile::DEFAULT_RESYNC,
    ));
    Running {
        agent,
        stamps,
        started,
        _state: state,
        _sa: sa,
    }
}

fn metrics(agent: &Agent) -> String {
    lace::telemetry::encode(lace::telemetry::Probes::registry(agent))
}

/// Child: an agent whose node is not allocated (caches and state, no plan); prints its
/// resident sizes (KiB) before and after every watch has listed.
fn caches_only(port: u16) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let before = kib("VmRSS:");
    let r = start_agent(&rt, port, "node-unallocated");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !metrics(&r.agent).contains("lace_state_updates_total 1\n") {
        assert!(Instant::now() < deadline, "never synced");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    println!("{before} {} {}", kib("VmRSS:"), kib("VmHWM:"));
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    // As `lace-agent run` does first (each child process starts here too).
    lace::sys::malloc::use_one_arena().unwrap();
    let args: Vec<String> = std::env::args().collect();
    let s = size(&args);
    if args.iter().any(|a| a == "--serve-fake") {
        return serve(s);
    }
    if let Some(i) = args.iter().position(|a| a == "--caches-only") {
        return caches_only(args[i + 1].parse().unwrap());
    }
    let me = std::env::current_exe().unwrap();
    let sizes = [
        "--nodes".to_string(),
        s.nodes.to_string(),
        "--networks".into(),
        s.networks.to_string(),
        "--services".into(),
        s.services.to_string(),
    ];
    let mut server = Command::new(&me)
        .arg("--serve-fake")
        .args(&sizes)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().expect("the fake API server's port");

    let mut caches = String::new();
    Command::new(&me)
        .args(["--caches-only", &port.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut caches)
        .unwrap();
    let c: Vec<u64> = caches
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let before = kib("VmRSS:");
    let r = start_agent(&rt, port, "node-0000");
    let deadline = Instant::now() + Duration::from_secs(300);
    while r.stamps.applies.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "never applied");
        std::thread::sleep(Duration::from_millis(5));
    }
    let first = r.stamps.applies.lock().unwrap()[0] - r.started;
    std::thread::sleep(Duration::from_millis(500));
    let (rss, hwm) = (kib("VmRSS:"), kib("VmHWM:"));

    // Watch event -> plan applied, and the same change straight into set_state.
    let client = poster(port);
    let mut watched = Vec::new();
    let mut direct = Vec::new();
    for k in 0..s.iterations {
        let (from, to) = (net(k as u32 % s.networks), net((k as u32 + 1) % s.networks));
        let name = format!("bench-watch-{k}");
        let policy = lace(
            "NetworkRoutingPolicy",
            &name,
            json!({"from": from, "to": to}),
        );
        watched.push(r.stamps.until_applied(&name, || client(&policy)));

        let name = format!("bench-direct-{k}");
        let mut state = (*r.agent.loaded().unwrap().state).clone();
        state.network_routes.insert(
            name.clone(),
            lace::api::NetworkRoutingPolicySpec {
                from: net((k as u32 + 2) % s.networks),
                to: net((k as u32 + 3) % s.networks),
            },
        );
        direct.push(
            r.stamps
                .until_applied(&name, || r.agent.set_state(Ok(state))),
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    watched.sort();
    direct.sort();
    let _ = server.kill();
    let _ = server.wait();

    let objects =
        s.networks * 6 + s.networks.min(6).saturating_sub(1) + s.nodes + 1 + 100 + 2 * s.services;
    println!();
    println!(
        "cluster: {} NodeAllocations, {} Networks, {} Services + {} EndpointSlices, 100 local pods ({objects} objects)",
        s.nodes, s.networks, s.services, s.services
    );
    println!("| measurement | value | baseline (same run) |");
    println!("|---|---:|---:|");
    println!(
        "| agent RSS, caches + state, node not allocated (no plan) | {} (peak {}) | {} before connecting |",
        mib(c[1]),
        mib(c[2]),
        mib(c[0])
    );
    println!(
        "| agent RSS, caches + state + plan of node-0000 | {} (peak {}) | {} before connecting |",
        mib(rss),
        mib(hwm),
        mib(before)
    );
    println!("| start → first plan applied | {} | |", ms(first));
    println!(
        "| watch event (new NetworkRoutingPolicy) → plan applied, p50 | {} | {} set_state → applied |",
        ms(percentile(&watched, 0.5)),
        ms(percentile(&direct, 0.5))
    );
    println!(
        "| watch event → plan applied, p99 (n={}) | {} | {} |",
        watched.len(),
        ms(percentile(&watched, 0.99)),
        ms(percentile(&direct, 0.99))
    );
    println!(
        "Anchor: Cilium's agent, 438 MiB average at 1,000 nodes / 50,000 pods. Target: < 100 MB."
    );
}

/// A minimal HTTP/1.1 POST of an object to the fake's control path.
fn poster(port: u16) -> impl Fn(&Value) {
    move |object: &Value| {
        let body = object.to_string();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "POST /fake/put HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 204"), "{out}");
    }
}
