//! Allocation benchmark: 5,000 nodes x 50 dual-stack Networks from scratch, re-running over
//! an unchanged cluster, and the incremental add of one node. Prints a table of wall time and
//! peak RSS (VmHWM, which only grows, so each row shows the peak so far; with existing allocations
//! the state holds one allocation while `allocate` builds the next).
//!
//! Run: `cargo bench -p lace --bench alloc`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use lace::alloc::{allocate, Allocation};
use lace::api::{NetworkSpec, Subnet};
use lace::state::{ClusterState, Node};

const NODES: u32 = 5_000;
const NETWORKS: u8 = 50;

fn node(i: u32) -> Node {
    let [_, a, b, c] = i.to_be_bytes();
    Node {
        labels: BTreeMap::new(),
        internal_ips: vec![
            IpAddr::V4(Ipv4Addr::new(172, a, b, c)),
            IpAddr::V6(Ipv6Addr::from(0xfd00_0fab_u128 << 96 | u128::from(i))),
        ],
    }
}

/// Network `net-<i>`: 10.<i>.0.0/16 in /29 blocks (8,192) and fd00:<i>::/48 in /64 blocks.
fn network(i: u8) -> NetworkSpec {
    let subnet = |cidr: String, block_prefix| Subnet {
        cidr: cidr.parse().unwrap(),
        block_prefix,
    };
    NetworkSpec {
        subnets: vec![
            subnet(format!("10.{i}.0.0/16"), 29),
            subnet(format!("fd00:{i:x}::/48"), 64),
        ],
        external: false,
        host_access: false,
    }
}

fn state() -> ClusterState {
    let mut s = ClusterState::default();
    s.config.srv6_locator_prefix = Some("2001:db8:100::/48".parse().unwrap());
    s.networks = (0..NETWORKS)
        .map(|i| (format!("net-{i:02}"), network(i)))
        .collect();
    s.nodes = (1..=NODES)
        .map(|i| (format!("node-{i:05}"), node(i)))
        .collect();
    s
}

fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn timed(f: impl FnOnce() -> Allocation) -> (Allocation, Duration) {
    let start = Instant::now();
    let alloc = black_box(f());
    (alloc, start.elapsed())
}

fn row(what: &str, d: Duration, alloc: &Allocation, s: &ClusterState) {
    // Blocks are derived from the node indices; counted here to show what the nodes hold.
    let blocks: usize = alloc
        .node_allocations
        .values()
        .map(|n| {
            s.networks
                .values()
                .map(|net| lace::alloc::node_blocks(n.index, &net.subnets).len())
                .sum::<usize>()
        })
        .sum();
    println!(
        "| {what:<38} | {:>9.1} | {:>13.1} | {:>7} |",
        d.as_secs_f64() * 1e3,
        vm_hwm_kib() as f64 / 1024.0,
        blocks
    );
}

fn main() {
    let mut s = state();
    println!("allocation, {NODES} nodes x {NETWORKS} dual-stack Networks");
    println!(
        "| {:<38} | {:>9} | {:>13} | {:>7} |",
        "step", "time ms", "peak RSS MiB", "blocks"
    );
    println!("|{:-<40}|{:->11}|{:->15}|{:->9}|", "", "", "", "");
    println!(
        "| {:<38} | {:>9} | {:>13.1} | {:>7} |",
        "cluster state built",
        "-",
        vm_hwm_kib() as f64 / 1024.0,
        0
    );

    let (alloc, d) = timed(|| allocate(&s).unwrap());
    row("from scratch", d, &alloc, &s);
    alloc.store_in(&mut s);

    let (alloc, d) = timed(|| allocate(&s).unwrap());
    row("re-run, nothing changed", d, &alloc, &s);
    assert_eq!(alloc.node_allocations, s.node_allocations);
    // The state holds one allocation and `allocate` builds the next: the peak is two.
    drop(alloc);

    s.nodes.insert("node-99999".to_string(), node(NODES + 1));
    let (alloc, d) = timed(|| allocate(&s).unwrap());
    row("one node added", d, &alloc, &s);
    assert_eq!(alloc.node_allocations["node-99999"].index, NODES + 1);
}
