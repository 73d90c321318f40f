//! The reconciler's memory against a real kernel: after the first reconcile it follows the
//! kernel through rtnetlink notifications instead of dumping, so what someone changes by hand
//! (or the kernel changes silently) must still be noticed and put back — exactly that, and
//! nothing foreign — and a gap in the notifications must make it dump again.
//!
//! One node namespace with an uplink (`eth0`, the underlay address) and two pods wired as the
//! CNI wires them, in Networks `a` and `b`; the plan comes from the real planner. After every
//! reconcile the reconciler's memory is compared with a fresh dump ([`Reconciler::memory_drift`]).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};
use lace::dataplane::{
    ApplyReport, Drift, KernelNexthop, NetnsTarget, Reconciler, ReconcilerOptions, ROUTE_PROTOCOL,
};
use lace::plan::{plan, DesiredNode, RouteKey};
use lace::state::{ObjectKey, PodAttachment};
use lace_netns_tests::cluster::{ipv4_cluster, underlay, TestNetwork};
use lace_netns_tests::pods::attach_pod;
use lace_netns_tests::{require_root_and_vrf, Netns};

/// (Network, second octet, SID function, pod host interface).
const NETS: [(&str, u8, u16, &str); 2] = [("a", 1, 1, "lp-a"), ("b", 2, 2, "lp-b")];
const TABLE_A: u32 = 1_000_001;
const TABLE_B: u32 = 1_000_002;

fn pod_addr(second: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, second, 1, 10)
}

/// Two nodes (only `n1` is programmed), Networks `a` and `b` reaching themselves; `pods`
/// names the Networks whose pod on `n1` is attached.
fn desired(pods: &[&str]) -> DesiredNode {
    desired_in(2, &[], pods)
}

/// [`desired`] in a cluster of `nodes` nodes, with the Networks `more` (name, second octet:
/// each reaching itself, with a pod on `n1` behind link `lp-<name>`, which the caller makes)
/// besides `a` and `b`.
fn desired_in(nodes: u16, more: &[(&'static str, u8)], pods: &[&str]) -> DesiredNode {
    let networks: Vec<TestNetwork> = NETS
        .iter()
        .map(|&(name, second, function, _)| (name, second, function))
        .chain(
            more.iter()
                .map(|&(name, second)| (name, second, u16::from(second))),
        )
        .map(|(name, second, function)| TestNetwork {
            name,
            second,
            function,
            reaches_itself: true,
        })
        .collect();
    let s = ipv4_cluster("n", nodes, &networks);
    let attached: Vec<PodAttachment> = NETS
        .iter()
        .filter(|(name, ..)| pods.contains(name))
        .map(|(name, second, _, ifname)| PodAttachment {
            pod: ObjectKey::new("test", format!("pod-{name}")),
            container_id: format!("c-{name}"),
            host_ifname: ifname.to_string(),
            network: name.to_string(),
            ips: vec![IpNet::V4(Ipv4Net::from(pod_addr(*second)))],
            host_ports: Vec::new(),
            bandwidth: None,
        })
        .chain(more.iter().map(|&(name, second)| PodAttachment {
            pod: ObjectKey::new("test", format!("pod-{name}")),
            container_id: format!("c-{name}"),
            host_ifname: format!("lp-{name}"),
            network: name.to_string(),
            ips: vec![IpNet::V4(Ipv4Net::from(pod_addr(second)))],
            host_ports: Vec::new(),
            bandwidth: None,
        }))
        .collect();
    plan("n1", &s, &attached).unwrap()
}

/// The node and its pods' namespaces (kept alive with it).
struct World {
    node: Netns,
    _pods: Vec<Netns>,
}

fn world(label: &str) -> World {
    let node = Netns::new(label).unwrap();
    node.ip("link add eth0 type dummy").unwrap();
    node.ip("link set eth0 up").unwrap();
    node.ip(&format!("-6 addr add {}/64 dev eth0 nodad", underlay(1)))
        .unwrap();
    let pods = NETS
        .iter()
        .map(|(name, second, _, ifname)| {
            let pod = Netns::new(&format!("{label}-{name}")).unwrap();
            attach_pod(&node, ifname, &pod, pod_addr(*second)).unwrap();
            pod
        })
        .collect();
    World { node, _pods: pods }
}

/// Everything of Lace's in `ns` as `ip` shows it, sorted: routes (both families, every table,
/// Lace's protocol), rules, VRFs with their tables, and which VRF each pod link is in.
fn lace_state(ns: &Netns) -> Vec<String> {
    let mut lines = Vec::new();
    for fam in ["-4", "-6"] {
        let routes = ns
            .ip(&format!(
                "{fam} route show table all proto {ROUTE_PROTOCOL}"
            ))
            .unwrap();
        lines.extend(routes.lines().map(|l| format!("route {}", l.trim())));
        lines.extend(
            ns.ip(&format!("{fam} rule show"))
                .unwrap()
                .lines()
                .map(|l| format!("rule {fam} {}", l.trim())),
        );
    }
    for l in ns.ip("-o -d link show").unwrap().lines() {
        let words: Vec<&str> = l.split_whitespace().collect();
        // `4: lp-b@if2: <...>`: a veth's name carries its peer's index.
        let name = words
            .get(1)
            .and_then(|n| n.trim_end_matches(':').split('@').next())
            .unwrap_or("");
        let after = |w: &str| {
            words
                .iter()
                .position(|x| *x == w)
                .and_then(|i| words.get(i + 1))
                .copied()
                .unwrap_or("-")
        };
        if name.starts_with("lv-") {
            lines.push(format!(
                "vrf {name} table {} {}",
                after("table"),
                after("state")
            ));
        } else if name.starts_with("lp-") {
            lines.push(format!("pod link {name} master {}", after("master")));
        }
    }
    lines.sort();
    lines
}

fn reconcile(rec: &Reconciler, plan: &DesiredNode) -> ApplyReport {
    let r = rec.reconcile(plan).unwrap();
    assert!(r.skipped.is_empty(), "skipped {:?}", r.skipped);
    // The kernel adds a device's own link-local address when the device comes up, a moment
    // after the write that brought it up, and notifies it; the reconciler's idle step (every
    // second) takes such notifications in. So the memory may trail the kernel for up to that
    // long; a real difference stays.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut drift = rec.memory_drift().unwrap();
    while !drift.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        drift = rec.memory_drift().unwrap();
    }
    assert!(
        drift.is_empty(),
        "the reconciler's memory differs from the kernel 3 s after {r:#?}:\n{}",
        drift.join("\n")
    );
    r
}

/// A reconcile that found nothing to do, from memory.
fn assert_quiet(rec: &Reconciler, plan: &DesiredNode) {
    let r = reconcile(rec, plan);
    assert_eq!(
        r.writes, 0,
        "an unchanged kernel was written to: {:#?}",
        r.sample
    );
    assert!(!r.full_dump, "nothing justified a full dump");
}

/// Lace's route in `table` whose next hop matches `f`.
fn route_in(
    rec: &Reconciler,
    table: u32,
    f: impl Fn(&KernelNexthop) -> bool,
) -> (RouteKey, KernelNexthop) {
    let observed = rec.observe(Default::default()).unwrap();
    observed
        .routes
        .into_iter()
        .find(|(k, nh)| k.table == table && f(nh))
        .unwrap_or_else(|| panic!("no such route in table {table}"))
}

#[test]
fn memory_hand_edits_and_silent_flushes_are_put_back_exactly() {
    require_root_and_vrf();
    let w = world("mem-edit");
    let n = &w.node;
    let plan = desired(&["a", "b"]);
    let rec = Reconciler::new(NetnsTarget::Path(n.path())).unwrap();
    let drifts: Arc<Mutex<Vec<Drift>>> = Arc::default();
    let sink = Arc::clone(&drifts);
    rec.on_drift(move |d| sink.lock().unwrap().push(d));

    let first = reconcile(&rec, &plan);
    assert!(first.writes > 0 && first.full_dump, "{first:#?}");
    assert_quiet(&rec, &plan);

    // Foreign state, some of it in Lace's tables: never Lace's to change.
    n.ip("link add keep0 type dummy").unwrap();
    n.ip("link set keep0 up").unwrap();
    n.ip("route add 192.0.2.0/24 dev keep0 proto static")
        .unwrap();
    n.ip(&format!(
        "route add blackhole 198.51.100.0/24 table {TABLE_A} proto static"
    ))
    .unwrap();
    n.ip("rule add pref 500 from 192.0.2.1 lookup 100").unwrap();
    assert_quiet(&rec, &plan);
    let programmed = lace_state(n);
    assert!(programmed.iter().any(|l| l == "pod link lp-b master lv-b"));
    assert_eq!(*drifts.lock().unwrap(), [], "foreign changes are no drift");

    // By hand: a route deleted, another changed, a rule deleted, a VRF deleted.
    let (gone, _) = route_in(
        &rec,
        TABLE_A,
        |nh| matches!(nh, KernelNexthop::Dev(d) if &**d == "lp-a"),
    );
    let (changed, _) = route_in(&rec, TABLE_A, |nh| {
        matches!(nh, KernelNexthop::Seg6Encap { .. })
    });
    // One batch, reconciled at once: most likely before the idle drain (every second)
    // looked. The edits are drift all the same, whichever of the two sees them first.
    let edits = format!(
        "route del {} table {}\n\
         route replace {} table {} metric {} proto {ROUTE_PROTOCOL} encap seg6 mode encap segs 2001:db8:100::9:9:0 dev eth0\n\
         rule del pref 990\n\
         link del lv-b\n",
        gone.dst, gone.table, changed.dst, changed.table, changed.metric
    );
    n.exec_stdin("ip", &["-batch", "-"], &edits).unwrap();
    let restore = reconcile(&rec, &plan);
    assert!(restore.writes > 0 && !restore.full_dump, "{restore:#?}");
    let seen = drifts.lock().unwrap().clone();
    assert!(
        seen.iter().any(|d| d.ops > 0),
        "hand edits repaired without a drift report: {seen:?}"
    );
    assert_eq!(lace_state(n), programmed, "{restore:#?}");
    // Exactly those were put back: every operation concerns one of them.
    let touched = [
        format!("{} table {} ", gone.dst, gone.table),
        format!("{} table {} ", changed.dst, changed.table),
        "rule add -4 pref 990".to_string(),
        "lv-b".to_string(),
        "lp-b".to_string(),
        format!("table {TABLE_B}"),
    ];
    for op in &restore.sample {
        assert!(
            touched.iter().any(|t| op.contains(t.as_str())),
            "{op} is none of the edited objects"
        );
    }
    assert_quiet(&rec, &plan);

    // A pod link going down and up again: IPv4 flushes its routes without a notification.
    n.ip("link set lp-a down").unwrap();
    n.ip("link set lp-a up").unwrap();
    assert_ne!(lace_state(n), programmed);
    let relink = reconcile(&rec, &plan);
    assert!(relink.writes > 0 && !relink.full_dump, "{relink:#?}");
    assert!(
        relink.sample.iter().all(|op| op.contains("lp-a")),
        "{relink:#?}"
    );
    assert_eq!(lace_state(n), programmed);
    assert_quiet(&rec, &plan);

    // The CNI deletes pod b's link and the plan drops the pod: its routes went with the
    // link, so there is nothing to delete.
    n.ip("link del lp-b").unwrap();
    let without_b = desired(&["a"]);
    let del = reconcile(&rec, &without_b);
    assert!(!del.sample.iter().any(|op| op.contains("lp-b")), "{del:#?}");
    assert_quiet(&rec, &without_b);
    let after_del = lace_state(n);

    // Foreign state untouched throughout.
    assert!(n.ip("link show keep0").is_ok());
    assert!(n
        .ip("route show proto static")
        .unwrap()
        .contains("192.0.2.0/24 dev keep0"));
    assert!(n
        .ip(&format!("route show table {TABLE_A}"))
        .unwrap()
        .contains("blackhole 198.51.100.0/24 proto static"));
    assert!(n.ip("rule show").unwrap().contains("500:"));

    // A reconciler started fresh against the programmed kernel writes nothing.
    drop(rec);
    let rec = Reconciler::new(NetnsTarget::Path(n.path())).unwrap();
    let fresh = reconcile(&rec, &without_b);
    assert!(fresh.full_dump);
    assert_eq!(fresh.writes, 0, "{:#?}", fresh.sample);
    assert_quiet(&rec, &without_b);
    assert_eq!(lace_state(n), after_del);
}

/// A first apply past the size whose messages a second thread builds and encodes while the
/// kernel takes the chunks (`Nl::batch_with`: more than 1,024 requests): every planned route
/// is in the kernel, the memory is what a dump shows, and nothing is written again. Once with
/// the routes read back from their notifications, once with a bulk threshold below the plan's
/// routes: the apply leaves the route groups and dumps the routes after it
/// (`watch::dump_after`). Then the memory must still follow route changes through
/// notifications: a Lace route deleted by hand is drift, reported without a reconcile.
#[test]
fn memory_a_first_apply_built_on_the_encoder_thread_installs_every_route() {
    require_root_and_vrf();
    for (label, bulk_routes, dumped) in [
        ("mem-large", ReconcilerOptions::default().bulk_routes, false),
        ("mem-bulk", 1000, true),
    ] {
        let w = world(label);
        let more = [("c", 3), ("d", 4), ("e", 5), ("f", 6)];
        for (name, _) in more {
            w.node
                .ip(&format!("link add lp-{name} type dummy"))
                .unwrap();
        }
        let plan = desired_in(250, &more, &["a", "b"]);
        let planned = plan.routes().count();
        assert!(planned > 1024, "{planned} routes: not past one batch");
        assert_eq!(planned > bulk_routes, dumped, "{planned} routes");
        let options = ReconcilerOptions {
            bulk_routes,
            ..Default::default()
        };
        let rec = Reconciler::with_options(NetnsTarget::Path(w.node.path()), options).unwrap();
        let drifts: Arc<Mutex<Vec<Drift>>> = Arc::default();
        let sink = Arc::clone(&drifts);
        rec.on_drift(move |d| sink.lock().unwrap().push(d));
        let first = reconcile(&rec, &plan);
        assert!(first.writes >= planned as u64, "{} writes", first.writes);
        assert_eq!(first.dumped_after, dumped, "{label}");
        let installed = lace_state(&w.node)
            .iter()
            .filter(|l| l.starts_with("route "))
            .count();
        assert_eq!(installed, planned, "Lace's routes in the kernel");
        assert_quiet(&rec, &plan);
        assert_eq!(
            *drifts.lock().unwrap(),
            [],
            "{label}: no drift of its own writes"
        );

        let (gone, _) = route_in(&rec, TABLE_A, |nh| {
            matches!(nh, KernelNexthop::Seg6Encap { .. })
        });
        w.node
            .ip(&format!("route del {} table {}", gone.dst, gone.table))
            .unwrap();
        // The idle drain (every second) takes the notification in.
        let deadline = Instant::now() + Duration::from_secs(5);
        while drifts.lock().unwrap().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let seen = drifts.lock().unwrap().clone();
        assert!(
            seen.iter()
                .any(|d| d.ops == 1 && d.summary.contains(&gone.dst.to_string())),
            "{label}: a route deleted by hand, unnoticed: {seen:?}"
        );
        let repair = reconcile(&rec, &plan);
        assert_eq!(repair.writes, 1, "{label}: {:#?}", repair.sample);
        assert!(!repair.full_dump && !repair.dumped_after, "{label}");
        assert_quiet(&rec, &plan);
    }
}

/// Foreign routes added at once behind the reconciler's back.
const ROUTES: u32 = 2000;

#[test]
fn memory_overrun_of_the_notification_socket_dumps_again_and_ends_correct() {
    require_root_and_vrf();
    let w = world("mem-overrun");
    let n = &w.node;
    let plan = desired(&["a", "b"]);
    // Room for some tens of notifications: enough for a quiet node between two drains,
    // not for the burst below.
    let rec = Reconciler::with_options(
        NetnsTarget::Path(n.path()),
        ReconcilerOptions {
            notification_buffer: 64 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    // The install's own notifications may overrun it: then the next reconcile dumps.
    reconcile(&rec, &plan);
    let again = reconcile(&rec, &plan);
    assert_eq!(again.writes, 0, "{:#?}", again.sample);
    assert_quiet(&rec, &plan);
    let programmed = lace_state(n);

    // Behind its back: a Lace route deleted among a burst of foreign changes.
    let (gone, nh) = route_in(&rec, TABLE_A, |nh| {
        matches!(nh, KernelNexthop::Seg6Encap { .. })
    });
    let mut batch = format!("route del {} table {}\n", gone.dst, gone.table);
    for i in 0..ROUTES {
        batch.push_str(&format!(
            "route add 203.0.{}.{}/32 dev eth0 table 100\n",
            i / 250,
            i % 250
        ));
    }
    n.exec_stdin("ip", &["-batch", "-"], &batch).unwrap();

    let resync = reconcile(&rec, &plan);
    assert!(
        resync.full_dump,
        "an overrun must make it dump: {resync:#?}"
    );
    assert_eq!(
        resync.sample,
        [format!(
            "route replace {} table {}{} {nh}",
            gone.dst,
            gone.table,
            gone.metric_suffix()
        )]
    );
    assert_eq!(lace_state(n), programmed);
    assert_quiet(&rec, &plan);
    assert_eq!(
        n.ip("route show table 100").unwrap().lines().count(),
        ROUTES as usize,
        "foreign routes untouched"
    );
}
