//! `cargo bench --bench plan`: plan() on synthetic clusters, printed as a table.
//!
//! Scenarios (the planner is single-threaded but for sorting a large node's routes, on two
//! threads):
//! - 100 nodes x 10 Networks x 30 pods per node (dual-stack, every Network self-routed, plus
//!   cross-Network pairs and Service grants);
//! - 5,000 nodes x 50 Networks (IPv4, every Network self-routed). The planned node has pods in
//!   30 of them, whose tables route the blocks they reach (189,962 remote-block routes); its
//!   base holds those of all 50, so that an ADD in another Network plans from it too.
//!
//! Columns: median wall time of a full `plan()`, peak resident memory during it (VmHWM from
//! /proc/self/status after resetting it through /proc/self/clear_refs, minus the resident size
//! before the plan, i.e. what planning itself added), and the incremental re-plan after one
//! pod change (`Planner::plan` with the cached pod-independent part) with the speedup.
//! `next hops` counts the plan's distinct next hops (device, gateway, encapsulation): the
//! `ip nexthop` objects its routes would need, so routes / next hops is what sharing objects
//! could save.
//! Targets: 5,000 x 50 under 1 s and 500 MiB; incremental at least 50x faster than full.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::*;
use lace::plan::{plan, Planner};

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut rows = Vec::new();
    for (nodes, networks, pods, dual, runs) in [(100, 10, 30, true, 15), (5000, 50, 30, false, 5)] {
        let sc = scenario(nodes, networks, pods, dual);
        let me = "node-0000";

        // Peak memory of one full plan, relative to the resident size before it.
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let rss_before = status_kib("VmRSS:");
        let d = plan(me, &sc.state, &sc.local).expect("synthetic cluster plans");
        let hwm = status_kib("VmHWM:");
        let rss_plan = hwm.saturating_sub(rss_before);
        let routes = d.routes().count();
        let remote_blocks = d
            .routes()
            .filter(|(k, nh)| {
                matches!(nh, lace::plan::Nexthop::Seg6Encap { .. })
                    && k.dst.prefix_len() < k.dst.max_prefix_len()
            })
            .count();
        let nexthops = d
            .routes()
            .map(|(_, nh)| nh)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        drop(d);

        let full = median(
            (0..runs)
                .map(|_| {
                    let t = Instant::now();
                    black_box(plan(me, black_box(&sc.state), &sc.local).expect("plans"));
                    t.elapsed()
                })
                .collect(),
        );

        // Incremental: one pod replaced (a new container id, interface and address).
        let planner = Planner::new(me, &sc.state).expect("planner");
        let mut changed = sc.local.clone();
        if let Some(last) = changed.last_mut() {
            last.container_id.push_str("-new");
            last.host_ifname = "lp-new".into();
        }
        let incr = median(
            (0..runs.max(50))
                .map(|_| {
                    let t = Instant::now();
                    black_box(planner.plan(black_box(&changed)).expect("plans"));
                    t.elapsed()
                })
                .collect(),
        );
        rows.push((
            sc.name,
            routes,
            remote_blocks,
            nexthops,
            full,
            rss_plan,
            hwm,
            incr,
            full.as_secs_f64() / incr.as_secs_f64().max(1e-9),
        ));
    }
    println!();
    println!(
        "| scenario | routes | remote-block routes | next hops | full plan (median) | peak RSS added by the plan | process peak RSS during the plan (state + plan) | incremental (1 pod) | speedup |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, routes, remote, nexthops, full, mem_kib, hwm_kib, incr, speedup) in rows {
        println!(
            "| {name} | {routes} | {remote} | {nexthops} ({:.2} routes each) | {:.1} ms | {:.1} MiB | {:.1} MiB | {:.1} µs | {speedup:.0}x |",
            routes as f64 / nexthops.max(1) as f64,
            full.as_secs_f64() * 1e3,
            mem_kib as f64 / 1024.0,
            hwm_kib as f64 / 1024.0,
            incr.as_secs_f64() * 1e6,
        );
    }
}
