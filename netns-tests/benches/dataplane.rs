//! Dataplane programming rate, in network namespaces (root; run by `netns-tests/bench.sh`, in
//! the VM when the host kernel lacks VRF). Prints one table; every ratio compares two numbers
//! measured in the same run on the same kernel.
//!
//! - routes: a plan with N extra seg6 encap routes in one VRF, installed by the reconciler
//!   into a fresh namespace (everything included: observe, diff, VRF, nft, sysctls, routes), vs
//!   `ip -batch` adding the same N routes into a namespace where the VRF already exists; then
//!   re-applying the unchanged plan (zero writes) with the same reconciler (what the agent
//!   does: its memory is kept current by notifications, nothing is dumped) and with a fresh
//!   one (a restart: full dumps), each the median of a few runs.
//! - nft: a ruleset with 1,000 Network pairs and 10,000 Service grants: first install (full
//!   swap) vs `nft -f` of the same text; a one-element change (one Service grant) as the
//!   element update a reconciler that knows the table makes, vs the full swap one without
//!   that memory (a restarted one) makes.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};
use lace::dataplane::{NetnsTarget, Reconciler, ROUTE_PROTOCOL};
use lace::plan::{plan, DesiredNode, Nexthop, RouteKey, Underpath};
use lace_netns_tests::cluster::{ipv4_cluster, lone_node, TestNetwork};
use lace_netns_tests::{require_root_and_vrf, Netns};

const VRF_TABLE: u32 = 1_000_001;

/// Two nodes, one Network `bench` (function 1) that reaches itself.
fn small_plan() -> DesiredNode {
    let s = ipv4_cluster(
        "n",
        2,
        &[TestNetwork {
            name: "bench",
            second: 0,
            function: 1,
            reaches_itself: true,
        }],
    );
    plan("n1", &s, &[]).unwrap()
}

/// The `i`-th extra /32 (in 10.128.0.0/9, outside the plan's own blocks).
fn extra_dst(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a80_0000 + i)
}

fn extra_sid() -> Ipv6Addr {
    "2001:db8:100::2:1:0".parse().unwrap()
}

/// `base` plus `n` encap routes in the VRF.
fn with_routes(base: &DesiredNode, n: u32) -> DesiredNode {
    let mut b = (*base.base).clone();
    let extra = (0..n).map(|i| {
        (
            RouteKey {
                table: VRF_TABLE,
                dst: IpNet::V4(Ipv4Net::from(extra_dst(i))),
            },
            Nexthop::Seg6Encap {
                segs: extra_sid(),
                underlay: Underpath::Ipv6,
            },
        )
    });
    b.routes = b
        .routes
        .iter()
        .map(|(k, nh)| (*k, nh.clone()))
        .chain(extra)
        .collect();
    DesiredNode {
        base: Arc::new(b),
        ..base.clone()
    }
}

fn node_ns(label: &str) -> Netns {
    lone_node(label, 1).unwrap()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn row(what: &str, n: usize, lace: Duration, base_name: &str, base: Option<Duration>) {
    let ratio = base
        .map(|b| format!("{:.2}x", secs(b) / secs(lace)))
        .unwrap_or_else(|| "-".into());
    let rate = n as f64 / secs(lace);
    println!(
        "| {what:<44} | {n:>7} | {:>9.3} | {rate:>10.0} | {base_name:<18} | {:>9} | {ratio:>6} |",
        secs(lace),
        base.map(|b| format!("{:.3}", secs(b)))
            .unwrap_or_else(|| "-".into()),
    );
}

/// How often the re-applies are measured.
const REPEAT: usize = 3;

/// The median of `times` (the VM shares its CPU: medians, not single runs).
fn median(times: impl IntoIterator<Item = Duration>) -> Duration {
    let mut t: Vec<Duration> = times.into_iter().collect();
    t.sort();
    t[t.len() / 2]
}

fn bench_routes(n: u32) {
    let plan = with_routes(&small_plan(), n);
    let ns = node_ns(&format!("bench-r{n}"));
    let rec = Reconciler::new(NetnsTarget::Path(ns.path())).unwrap();
    let t = Instant::now();
    let first = rec.reconcile(&plan).unwrap();
    let install = t.elapsed();
    assert!(first.writes >= u64::from(n));
    // The median of a few re-applies: each is short, and the VM shares its CPUs.
    let reapply = median((0..REPEAT).map(|_| {
        let t = Instant::now();
        let again = rec.reconcile(&plan).unwrap();
        let took = t.elapsed();
        assert_eq!(again.writes, 0, "re-apply wrote {:?}", again.sample);
        assert!(
            !again.full_dump,
            "the same reconciler re-applied from a full dump"
        );
        took
    }));
    let restart = median((0..REPEAT).map(|_| {
        let t = Instant::now();
        let restarted = Reconciler::new(NetnsTarget::Path(ns.path())).unwrap();
        let fresh = restarted.reconcile(&plan).unwrap();
        let took = t.elapsed();
        assert_eq!(fresh.writes, 0, "restart wrote {:?}", fresh.sample);
        assert!(fresh.full_dump);
        took
    }));
    let keys = plan.base.sysctls.keys().cloned().collect();
    let t = Instant::now();
    let observed = rec.observe(keys).unwrap();
    let observe = t.elapsed();
    let t = Instant::now();
    let d = lace::dataplane::diff(Some(&plan), &observed, None).unwrap();
    let diff = t.elapsed();
    assert!(d.ops.is_empty());

    // Baseline: the same routes with `ip -batch`, VRF created beforehand (not timed).
    let base = Netns::new(&format!("bench-i{n}")).unwrap();
    base.ip("link add eth0 type dummy").unwrap();
    base.ip("link set eth0 up").unwrap();
    base.ip(&format!("link add lv-bench type vrf table {VRF_TABLE}"))
        .unwrap();
    let mut batch = String::with_capacity(n as usize * 100);
    for i in 0..n {
        batch.push_str(&format!(
            "route add {}/32 table {VRF_TABLE} proto {ROUTE_PROTOCOL} encap seg6 mode encap segs {} dev eth0\n",
            extra_dst(i),
            extra_sid()
        ));
    }
    let path = std::env::temp_dir().join(format!("lace-bench-{n}.batch"));
    std::fs::write(&path, batch).unwrap();
    let t = Instant::now();
    base.ip(&format!("-batch {}", path.display())).unwrap();
    let ip_batch = t.elapsed();
    let _ = std::fs::remove_file(&path);
    let count = base
        .ip(&format!(
            "route show table {VRF_TABLE} proto {ROUTE_PROTOCOL}"
        ))
        .unwrap()
        .lines()
        .count();
    assert_eq!(count, n as usize, "ip -batch installed {count} routes");

    row(
        "install plan + N encap routes (reconciler)",
        n as usize,
        install,
        "ip -batch",
        Some(ip_batch),
    );
    row(
        "re-apply unchanged, same reconciler (median)",
        n as usize,
        reapply,
        "-",
        None,
    );
    row(
        "re-apply unchanged, fresh reconciler (median)",
        n as usize,
        restart,
        "-",
        None,
    );
    row(
        "  of which: observe (dumps, nft, sysctls)",
        n as usize,
        observe,
        "-",
        None,
    );
    row("  of which: diff (pure)", n as usize, diff, "-", None);
    println!(
        "|   re-apply / install: same reconciler {:.1}% (target < 2%), fresh reconciler {:.1}% (target < 5%)",
        100.0 * secs(reapply) / secs(install),
        100.0 * secs(restart) / secs(install)
    );
}

/// A plan whose nft ruleset carries `pairs` Network-pair and `grants` Service elements.
fn nft_plan(pairs: u32, grants: u32, extra: bool) -> DesiredNode {
    let base = small_plan();
    let mut b = (*base.base).clone();
    for s in &mut b.nft.sets {
        match s.name.as_str() {
            "pairs_v4" => {
                for i in 0..pairs {
                    let (x, y) = (i / 32, i % 32);
                    s.add(
                        // Outside the plan's own 10.0.0.0/8 pair: intervals must not overlap.
                        format!("100.64.{x}.0/24 . 100.65.{y}.0/24"),
                        Some("accept"),
                        &format!("NetworkRoutingPolicy bench-{i}"),
                    );
                }
            }
            "services_v4" => {
                for i in 0..grants + u32::from(extra) {
                    let svc = Ipv4Addr::from(0xac10_0000 + i); // 172.16.0.0/12
                    s.add(
                        format!("100.66.{}.0/24 . {svc}", i % 200),
                        None,
                        &format!("ServiceRoutingPolicy bench: ns/svc-{i}"),
                    );
                }
            }
            _ => {}
        }
    }
    DesiredNode {
        base: Arc::new(b),
        ..base
    }
}

/// Rounds of each one-element change (the VM shares its CPU: medians, not single runs).
const NFT_ROUNDS: usize = 5;

fn bench_nft(pairs: u32, grants: u32) {
    let ns = node_ns("bench-nft");
    let rec = Reconciler::new(NetnsTarget::Path(ns.path())).unwrap();
    let full = nft_plan(pairs, grants, false);
    let changed = nft_plan(pairs, grants, true);
    let t = Instant::now();
    rec.reconcile(&full).unwrap();
    let install = t.elapsed();
    // One Service grant added and removed by a reconciler that wrote the table: element
    // updates.
    let mut updates = Vec::new();
    for i in 0..2 * NFT_ROUNDS {
        let (plan, sign) = if i % 2 == 0 {
            (&changed, "0 element(s) deleted, 1 added")
        } else {
            (&full, "1 element(s) deleted, 0 added")
        };
        let t = Instant::now();
        let one = rec.reconcile(plan).unwrap();
        updates.push(t.elapsed());
        assert_eq!(one.writes, 1, "one nft transaction: {:?}", one.sample);
        assert!(
            one.sample[0].starts_with(&format!("nft update table inet lace: {sign}")),
            "{:?}",
            one.sample
        );
    }
    let t = Instant::now();
    let none = rec.reconcile(&full).unwrap();
    let reapply = t.elapsed();
    assert_eq!(none.writes, 0);
    // The same changes by reconcilers without memory of the table (as after a restart whose
    // plan differs from the kernel's): full swaps.
    drop(rec);
    let mut swaps = Vec::new();
    for i in 0..NFT_ROUNDS {
        let fresh = Reconciler::new(NetnsTarget::Path(ns.path())).unwrap();
        let plan = if i % 2 == 0 { &changed } else { &full };
        let t = Instant::now();
        let one = fresh.reconcile(plan).unwrap();
        swaps.push(t.elapsed());
        assert_eq!(one.writes, 1, "one nft transaction: {:?}", one.sample);
        assert!(
            one.sample[0].starts_with("nft replace table inet lace"),
            "{:?}",
            one.sample
        );
    }
    let (update, swap) = (median(updates), median(swaps));

    // Baseline: `nft -f` of the same text in another namespace.
    let base = Netns::new("bench-nft-b").unwrap();
    let text = full.render_nft();
    let t = Instant::now();
    base.exec_stdin("nft", &["-f", "-"], &text).unwrap();
    let nft_f = t.elapsed();
    // The floor of any change through the binary: starting `nft` (from a thread in the
    // namespace, as the reconciler does) for a command that only lists the tables.
    let nft_start = median((0..NFT_ROUNDS).map(|_| {
        ns.enter(|| {
            let t = Instant::now();
            let out = Command::new("nft").args(["list", "tables"]).output();
            assert!(out.is_ok_and(|o| o.status.success()), "nft list tables");
            t.elapsed()
        })
        .unwrap()
    }));
    let n = (pairs + grants) as usize;
    row(
        "nft: first install (reconcile, full swap)",
        n,
        install,
        "nft -f same text",
        Some(nft_f),
    );
    row(
        "nft: one-element change, full swap (median)",
        n,
        swap,
        "nft -f same text",
        Some(nft_f),
    );
    row(
        "nft: one-element change, update (median)",
        n,
        update,
        "one-element swap",
        Some(swap),
    );
    row("nft: re-apply unchanged (0 writes)", n, reapply, "-", None);
    row("nft: `nft list tables` (median)", n, nft_start, "-", None);
}

fn main() {
    // `cargo bench` passes `--bench`; a plain run (e.g. `cargo test --benches`) is a no-op.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    require_root_and_vrf();
    // Empty: the nft part only.
    let sizes: Vec<u32> = match std::env::var("LACE_BENCH_ROUTES") {
        Ok(v) => v
            .split(',')
            .filter(|x| !x.trim().is_empty())
            .map(|x| {
                x.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("LACE_BENCH_ROUTES: {x:?}: {e}"))
            })
            .collect(),
        Err(_) => vec![10_000, 100_000],
    };
    println!(
        "kernel {}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "| {:<44} | {:>7} | {:>9} | {:>10} | {:<18} | {:>9} | {:>6} |",
        "what", "N", "lace s", "N/s", "baseline", "base s", "ratio"
    );
    println!("|{}|", "-".repeat(125));
    // Warm-up: the first VRF, nft table and seg6 route load kernel modules; keep that out of
    // the measured installs.
    {
        let ns = node_ns("bench-warm");
        let rec = Reconciler::new(NetnsTarget::Path(ns.path())).unwrap();
        rec.reconcile(&with_routes(&small_plan(), 10)).unwrap();
    }
    for n in sizes {
        bench_routes(n);
    }
    bench_nft(1_000, 10_000);
}
