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
//! - scale (`LACE_BENCH_SCALE=NODESxNETWORKS`, e.g. 5000x50): a node of the plan bench's
//!   synthetic cluster (IPv4, every Network routed to itself). Fresh, without pods: its plan
//!   and first apply, then its first pod's attach. Then with its 30 pods (in 30 Networks: an
//!   agent starting on a loaded node), programmed from nothing: its plan, then the first apply
//!   by the real reconciler, the kernel's routes and rules and the kernel
//!   memory they took (`/proc/meminfo`, the FIB's slab caches) after it, and the re-applies;
//!   baselines: the same first apply at the kernel's own `net.ipv4.fib_sync_mem` (which the
//!   plan raises), and `ip -batch` adding the plan's encap routes alone into VRFs that exist,
//!   inline and through next hop objects (one per node), with the kernel's CPU.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};
use lace::dataplane::{NetnsTarget, Reconciler, ROUTE_PROTOCOL};
use lace::plan::{plan, DesiredNode, Nexthop, Planner, RouteKey, Underpath, FIB_SYNC_MEM};
use lace::state::{ClusterState, PodAttachment};
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
            RouteKey::new(VRF_TABLE, IpNet::V4(Ipv4Net::from(extra_dst(i)))),
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

/// How long `ip -force -batch` takes to run `commands` in `ns`: on past a failed command (the
/// kernel refuses seg6 routes with ENOMEM while its atomic per-CPU pool is empty, and `ip`
/// does not resend), so the caller counts what was installed.
fn ip_batch(ns: &Netns, commands: &str) -> Duration {
    ip_batch_cpu(ns, commands).0
}

/// [`ip_batch`], and the kernel's CPU for it: `ip`'s system time (the kernel handles each
/// netlink request inside the `sendmsg` that carries it, in the sender's context).
fn ip_batch_cpu(ns: &Netns, commands: &str) -> (Duration, f64) {
    let path = std::env::temp_dir().join(format!("lace-bench-{}.batch", std::process::id()));
    std::fs::write(&path, commands).unwrap();
    let (system0, t) = (cpu_times()[3], Instant::now());
    let _ = ns.ip(&format!("-force -batch {}", path.display()));
    let took = t.elapsed();
    let system = cpu_times()[3] - system0;
    let _ = std::fs::remove_file(&path);
    (took, system)
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
        // At the metric Lace gives the route: the kernel's work is the same.
        let key = RouteKey::new(VRF_TABLE, IpNet::V4(Ipv4Net::from(extra_dst(i))));
        batch.push_str(&format!(
            "route add {}/32 table {VRF_TABLE} proto {ROUTE_PROTOCOL} metric {} encap seg6 mode encap segs {} dev eth0\n",
            extra_dst(i),
            key.metric,
            extra_sid()
        ));
    }
    let ip_batch = ip_batch(&base, &batch);
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

/// What the kernel's memory holds, from `/proc/meminfo` (KiB) and `/proc/slabinfo` (objects).
struct KernelMemory {
    meminfo: Vec<(&'static str, u64)>,
    /// `None`: the cache is merged into another one (slab merging), so not listed by its name.
    slabs: Vec<(&'static str, Option<u64>)>,
}

/// The `/proc/meminfo` fields a route costs: slab objects and per-CPU allocations (each seg6
/// encap state holds a per-CPU dst cache).
const MEMINFO: [&str; 3] = ["Slab", "SUnreclaim", "Percpu"];
/// The FIB's own slab caches (IPv4 aliases and trie nodes, IPv6 tree nodes and routes).
const SLABS: [&str; 4] = ["ip_fib_alias", "ip_fib_trie", "fib6_nodes", "ip6_dst_cache"];

impl KernelMemory {
    fn read() -> Self {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let slabinfo = std::fs::read_to_string("/proc/slabinfo").unwrap();
        // meminfo: "Name:  value kB"; slabinfo: "name active_objs num_objs objsize ...".
        let field = |text: &str, name: &str| -> Option<u64> {
            text.lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|w| w.first().map(|f| f.trim_end_matches(':')) == Some(name))
                .and_then(|w| w.get(1)?.parse().ok())
        };
        Self {
            meminfo: MEMINFO
                .map(|n| {
                    let v = field(&meminfo, n);
                    (n, v.unwrap_or_else(|| panic!("no {n} in /proc/meminfo")))
                })
                .to_vec(),
            slabs: SLABS.map(|n| (n, field(&slabinfo, n))).to_vec(),
        }
    }

    /// `after - self`, one line.
    fn growth(&self, after: &Self) -> String {
        let mem = self
            .meminfo
            .iter()
            .zip(&after.meminfo)
            .map(|((n, a), (_, b))| format!("{n} +{:.1} MiB", (*b as f64 - *a as f64) / 1024.0));
        let slabs = self
            .slabs
            .iter()
            .zip(&after.slabs)
            .map(|((n, a), (_, b))| match (a, b) {
                (Some(a), Some(b)) => format!("{n} {:+} objects", *b as i64 - *a as i64),
                _ => format!("{n} merged into another cache"),
            });
        mem.chain(slabs).collect::<Vec<_>>().join(", ")
    }
}

/// This process's CPU time so far, from `/proc/self/stat`: user, system, its waited-for
/// children's (user + system; the `nft` and `ip` runs), and their system time alone, in seconds.
fn cpu_times() -> [f64; 4] {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command's closing parenthesis: state is field 3, utime 14 ... cstime 17.
    let rest: Vec<f64> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as f64;
    [
        rest[11] / tick,
        rest[12] / tick,
        (rest[13] + rest[14]) / tick,
        rest[14] / tick,
    ]
}

/// One IPv4 route dump on `sock` (of table `table` alone, on a socket with strict
/// checking), received and walked by its headers only (no decoding, nothing kept): the
/// kernel's own part of a dump. Returns the number of routes.
fn raw_dump(sock: &impl std::os::fd::AsRawFd, table: Option<u32>) -> usize {
    use nix::libc::{NLMSG_DONE, NLMSG_ERROR, NLM_F_DUMP, NLM_F_REQUEST, RTA_TABLE, RTM_GETROUTE};
    use nix::sys::socket::{recv, send, MsgFlags};
    // nlmsghdr (len, type, flags, seq 1, pid 0) + rtmsg (AF_INET, the rest 0) + RTA_TABLE.
    let len = 28 + table.map_or(0, |_| 8);
    let mut request = Vec::new();
    request.extend((len as u32).to_ne_bytes());
    request.extend(RTM_GETROUTE.to_ne_bytes());
    request.extend(((NLM_F_REQUEST | NLM_F_DUMP) as u16).to_ne_bytes());
    request.extend(1u32.to_ne_bytes());
    request.extend(0u32.to_ne_bytes());
    request.extend([nix::libc::AF_INET as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    if let Some(table) = table {
        request.extend(8u16.to_ne_bytes());
        request.extend(RTA_TABLE.to_ne_bytes());
        request.extend(table.to_ne_bytes());
    }
    let mut buf = vec![0u8; 1 << 20];
    send(sock.as_raw_fd(), &request, MsgFlags::empty()).unwrap();
    let mut routes = 0;
    loop {
        let n = recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
        let mut off = 0;
        while off + 16 <= n {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
            match i32::from(u16::from_ne_bytes([buf[off + 4], buf[off + 5]])) {
                NLMSG_DONE => return routes,
                NLMSG_ERROR => {
                    let code = i32::from_ne_bytes(buf[off + 16..off + 20].try_into().unwrap());
                    // A table the kernel does not have: none of its routes either.
                    assert!(
                        table.is_some() && code == -nix::libc::ENOENT,
                        "the raw route dump (table {table:?}) failed: {code}"
                    );
                    return routes;
                }
                _ => routes += 1,
            }
            off += (len.max(16) + 3) & !3;
        }
    }
}

/// The kernel's own part of a route dump: one IPv4 dump of every table in `ns` by a raw
/// netlink socket ([`raw_dump`]). Returns the time and the number of routes. The floor of a
/// fresh reconciler's observe when it reads every table (a resync).
fn raw_route_dump(ns: &Netns) -> (Duration, usize) {
    let sock = ns
        .enter(|| netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE).unwrap())
        .unwrap();
    let t = Instant::now();
    let routes = raw_dump(&sock, None);
    (t.elapsed(), routes)
}

/// The kernel's own part of the dumps a fresh reconciler reads its IPv4 routes with
/// (`observe::dump` with a plan): a dump of each table of `tables` ([`raw_dump`]), the
/// tables shared out between two strict-checking sockets, each read by a thread of its own
/// that takes the next table left. Returns the time and the number of routes.
fn raw_split_dump(ns: &Netns, tables: &[u32]) -> (Duration, usize) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let strict = || {
        let s = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE).unwrap();
        s.set_netlink_get_strict_chk(true).unwrap();
        s
    };
    let socks = ns.enter(|| [strict(), strict()]).unwrap();
    let next = AtomicUsize::new(0);
    let t = Instant::now();
    let routes: usize = std::thread::scope(|s| {
        let threads: Vec<_> = socks
            .iter()
            .map(|sock| {
                let next = &next;
                s.spawn(move || {
                    let mut routes = 0;
                    while let Some(&table) = tables.get(next.fetch_add(1, Ordering::Relaxed)) {
                        routes += raw_dump(sock, Some(table));
                    }
                    routes
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    (t.elapsed(), routes)
}

/// Lines of `ip ARGS` in `ns`.
fn count_lines(ns: &Netns, args: &str) -> usize {
    ns.ip(args).unwrap().lines().count()
}

/// A progress line on stderr (a run at scale takes minutes under TCG).
fn progress(since: Instant, what: &str) {
    eprintln!("dataplane bench: {:>7.1} s  {what}", secs(since.elapsed()));
}

/// The scenario's pods per node: node 1's are in 30 of the Networks.
const PODS_PER_NODE: u32 = 30;

/// [`node_ns`] with a dummy link for each of `pods`' host ends (the reconciler enslaves them
/// to their VRFs and routes the pods through them, as it does a pod's veth).
fn node_with_pods(label: &str, pods: &[PodAttachment]) -> Netns {
    let ns = node_ns(label);
    for p in pods {
        ns.ip(&format!("link add {} type dummy", p.host_ifname))
            .unwrap();
    }
    ns
}

/// A fresh node of the scenario, no pods yet: its plan and first apply. Then the first pod of
/// a Network: ADD's attach, which brings the Network's routes to the blocks it reaches, and
/// the reconcile after it, which must write nothing.
fn bench_fresh_node(state: &ClusterState, me: &str, first_pod: &PodAttachment) {
    let ns = node_with_pods("bench-fresh", std::slice::from_ref(first_pod));
    let t = Instant::now();
    let planner = Planner::new(me, state).unwrap();
    let empty = planner.plan(&[]).unwrap();
    let planned = t.elapsed();
    let rec = Reconciler::new(NetnsTarget::Path(ns.path())).unwrap();
    let t = Instant::now();
    let first = rec.reconcile(&empty).unwrap();
    let applied = t.elapsed();
    let with_pod = planner.plan(std::slice::from_ref(first_pod)).unwrap();
    let reach = (with_pod.base.pod_reach)
        .in_tables(&with_pod.served_tables, lace::plan::Tables::ALL)
        .count();
    let t = Instant::now();
    let attach = rec.attach(with_pod.clone()).unwrap();
    let attached = t.elapsed();
    assert!(
        attach.writes >= reach as u64,
        "the attach wrote {} for {reach} routes to blocks",
        attach.writes
    );
    let after = rec.reconcile(&with_pod).unwrap();
    assert_eq!(after.writes, 0, "after the ADD: {:?}", after.sample);
    row(
        "fresh node, no pods yet: plan + first apply",
        empty.routes().count(),
        planned + applied,
        "-",
        None,
    );
    row(
        "  its first pod of a Network: ADD's attach",
        reach,
        attached,
        "-",
        None,
    );
    println!(
        "|   fresh node: plan {:.3} s, first apply {:.3} s ({} writes; phases: {}); the attach wrote {} ({})",
        secs(planned),
        secs(applied),
        first.writes,
        first.phases,
        attach.writes,
        attach.phases
    );
}

fn bench_scale(nodes: u32, networks: u32) {
    let t0 = Instant::now();
    let sc = common::scenario(nodes, networks, PODS_PER_NODE, false);
    progress(t0, "cluster built");
    // Node 1 (index 1): its InternalIP is lone_node(_, 1)'s uplink address.
    let me = "node-0001";
    let local = common::scenario_attachments(&sc.state, 1, networks, PODS_PER_NODE);
    bench_fresh_node(&sc.state, me, &local[0]);
    progress(t0, "fresh node applied, its first pod attached");
    // The node with its pods (an agent starting on a loaded node, or every pod at once).
    let t = Instant::now();
    let desired = plan(me, &sc.state, &local).unwrap();
    let planned = t.elapsed();
    // Baseline: the same first apply at the kernel's own `net.ipv4.fib_sync_mem`. Only the
    // initial namespace has that sysctl: there (the host, the agent's namespace) the plan
    // raises it before the routes; the bench's nodes are namespaces of their own, where the
    // reconciler finds none to raise, so the bench raises it as the agent would. The
    // baseline's namespace stays until the end: tearing it down would compete for the CPUs.
    let sync_mem = FibSyncMem::read();
    let at_default_ns = node_with_pods("bench-sync-mem", &local);
    let t = Instant::now();
    Reconciler::new(NetnsTarget::Path(at_default_ns.path()))
        .unwrap()
        .reconcile(&desired)
        .unwrap();
    let install_at_default = t.elapsed();
    progress(t0, "applied at the kernel's fib_sync_mem");
    let lace_sync_mem = &desired.base.sysctls[FIB_SYNC_MEM];
    sync_mem.set(lace_sync_mem);
    let ns = node_with_pods("bench-scale", &local);
    let before = KernelMemory::read();
    let rec = Reconciler::new(NetnsTarget::Path(ns.path())).unwrap();
    let (cpu0, t) = (cpu_times(), Instant::now());
    let first = rec.reconcile(&desired).unwrap();
    let install = t.elapsed();
    let cpu: Vec<f64> = cpu_times().iter().zip(cpu0).map(|(b, a)| b - a).collect();
    let after = KernelMemory::read();
    progress(t0, "planned and applied");
    let plan_routes = desired.routes().count();
    let (routes4, routes6) = (
        count_lines(&ns, "-4 route show table all"),
        count_lines(&ns, "-6 route show table all"),
    );
    let rules = count_lines(&ns, "-4 rule show") + count_lines(&ns, "-6 rule show");
    assert!(
        routes4 + routes6 >= plan_routes,
        "the kernel holds {routes4} + {routes6} routes for a plan of {plan_routes}"
    );
    let reapply = median((0..REPEAT).map(|_| {
        let t = Instant::now();
        let again = rec.reconcile(&desired).unwrap();
        assert_eq!(again.writes, 0, "re-apply wrote {:?}", again.sample);
        t.elapsed()
    }));
    let mut restart_phases = Vec::new();
    let mut restart_cpu = Vec::new();
    let restart = median((0..REPEAT).map(|_| {
        let (cpu0, t) = (cpu_times(), Instant::now());
        let restarted = Reconciler::new(NetnsTarget::Path(ns.path())).unwrap();
        let fresh = restarted.reconcile(&desired).unwrap();
        let took = t.elapsed();
        let cpu = cpu_times();
        // Not timed: a restarted agent keeps its cache; the old process's memory goes with
        // its exit, not by freeing 300,000 routes one by one.
        drop(restarted);
        assert_eq!(fresh.writes, 0, "restart wrote {:?}", fresh.sample);
        assert!(fresh.full_dump);
        restart_phases.push(fresh.phases.to_string());
        restart_cpu.push(format!(
            "{:.2} s user, {:.2} s system",
            cpu[0] - cpu0[0],
            cpu[1] - cpu0[1]
        ));
        took
    }));
    let raw_dumps: Vec<(Duration, usize)> = (0..REPEAT).map(|_| raw_route_dump(&ns)).collect();
    let raw_routes = raw_dumps[0].1;
    let raw_dump = median(raw_dumps.into_iter().map(|(d, _)| d));
    let tables: Vec<u32> = desired.tables().into_iter().collect();
    let split_dumps: Vec<(Duration, usize)> =
        (0..REPEAT).map(|_| raw_split_dump(&ns, &tables)).collect();
    let split_routes = split_dumps[0].1;
    let split_dump = median(split_dumps.into_iter().map(|(d, _)| d));
    progress(t0, "re-applied");
    drop(rec);
    drop(ns);

    // Baseline: the plan's encap routes by `ip -batch` at their metrics, their VRFs created
    // beforehand; then the same routes through next hop objects (`ip nexthop`), one per node:
    // what a single SID per node for all Networks would allow, the most sharing there could
    // be. (One per SID, the plan's own, shares little: 1.16 routes each at 5,000 x 50, which
    // the plan bench counts; measured once by hand, its kernel CPU was 3.8x the inline
    // routes'.)
    let encaps: Vec<(&RouteKey, Ipv6Addr)> = desired
        .routes()
        .filter_map(|(k, nh)| match nh {
            Nexthop::Seg6Encap { segs, .. } => Some((k, *segs)),
            _ => None,
        })
        .collect();
    let inline: String = encaps
        .iter()
        .map(|(k, segs)| {
            format!(
                "route add {} table {} proto {ROUTE_PROTOCOL} metric {} encap seg6 mode encap segs {segs} dev eth0\n",
                k.dst, k.table, k.metric
            )
        })
        .collect();
    let via_nexthops = |sid_of: &dyn Fn(Ipv6Addr) -> Ipv6Addr| {
        let mut ids: HashMap<Ipv6Addr, usize> = HashMap::new();
        let mut nexthops = String::new();
        let mut routes = String::new();
        for (k, segs) in &encaps {
            let sid = sid_of(*segs);
            let next = ids.len() + 1;
            let id = *ids.entry(sid).or_insert_with(|| {
                nexthops.push_str(&format!(
                    "nexthop add id {next} encap seg6 mode encap segs {sid} dev eth0 proto {ROUTE_PROTOCOL}\n"
                ));
                next
            });
            routes.push_str(&format!(
                "route add {} table {} proto {ROUTE_PROTOCOL} metric {} nhid {id}\n",
                k.dst, k.table, k.metric
            ));
        }
        (ids.len(), nexthops + &routes)
    };
    // Any address of the node's locator (function 0, argument 1): the kernel only copies it.
    let (per_node, per_node_batch) =
        via_nexthops(&|segs| Ipv6Addr::from(u128::from(segs) & !0xffff_ffff | 1));
    let tables: std::collections::BTreeSet<u32> = encaps.iter().map(|(k, _)| k.table).collect();
    let batch = |name: &str, commands: &str| {
        let base = node_ns(name);
        for (i, t) in tables.iter().enumerate() {
            base.ip(&format!("link add lv-b{i} type vrf table {t}"))
                .unwrap();
        }
        progress(t0, &format!("ip -batch starts: {name}"));
        let (took, system) = ip_batch_cpu(&base, commands);
        let installed = count_lines(
            &base,
            &format!("-4 route show table all proto {ROUTE_PROTOCOL}"),
        );
        (took, system, installed)
    };
    let (ip_batch, ip_batch_system, ip_batch_installed) = batch("bench-scale-ip", &inline);
    let (per_node_took, per_node_system, per_node_installed) =
        batch("bench-nh-node", &per_node_batch);
    progress(t0, "ip -batch done");

    let what =
        format!("{nodes} x {networks}, node with its {PODS_PER_NODE} pods: plan + first apply");
    row(&what, plan_routes, planned + install, "-", None);
    row("  of which: plan", plan_routes, planned, "-", None);
    row(
        "  of which: first apply (reconciler)",
        plan_routes,
        install,
        "-",
        None,
    );
    // Every route and rule is in the kernel once the apply's last request is answered; the
    // settle after it only reads the routes back into the reconciler's memory.
    let p = first.phases;
    let installed = planned + p.observe + p.diff + p.apply;
    row(
        "  plan until the last route was written (no settle)",
        plan_routes,
        installed,
        "-",
        None,
    );
    row(
        "  first apply, fib_sync_mem as Lace sets it",
        plan_routes,
        install,
        "kernel's value",
        Some(install_at_default),
    );
    println!(
        "|   net.ipv4.fib_sync_mem: {} (the kernel's, the baseline's) vs {lace_sync_mem} (the plan's)",
        sync_mem.kernel
    );
    println!(
        "|   ip -batch installed {ip_batch_installed} of the {} encap routes (the rest refused)",
        encaps.len()
    );
    row(
        "  encap routes alone (ip -batch)",
        encaps.len(),
        ip_batch,
        "-",
        None,
    );
    row(
        "  the same via one nexthop object per node (ip -batch)",
        encaps.len(),
        per_node_took,
        "-",
        None,
    );
    println!(
        "|   the kernel's CPU (ip's system time) for the encap routes: {ip_batch_system:.1} s inline ({ip_batch_installed} installed); {per_node_system:.1} s via {per_node} nexthop objects, one per node ({per_node_installed} installed)"
    );
    row(
        "  re-apply unchanged, same reconciler (median)",
        plan_routes,
        reapply,
        "-",
        None,
    );
    row(
        "  re-apply unchanged, fresh reconciler (median)",
        plan_routes,
        restart,
        "-",
        None,
    );
    row(
        "  the kernel's IPv4 route dump alone (median)",
        raw_routes,
        raw_dump,
        "-",
        None,
    );
    row(
        "  the same, a dump per table on two sockets (median)",
        split_routes,
        split_dump,
        "-",
        None,
    );
    println!(
        "|   first apply: {} writes, {} encap routes; the kernel then held {routes4} IPv4 + {routes6} IPv6 routes and {rules} rules; ip -batch's encap routes alone took {:.2}x the reconciler's whole apply",
        first.writes,
        encaps.len(),
        secs(ip_batch) / secs(install),
    );
    println!(
        "|   first apply's phases: {}; its routes read back {}",
        first.phases,
        match first.dumped_after {
            true => "with a dump (a bulk apply)",
            false => "from their notifications",
        }
    );
    println!(
        "|   fresh reconciler's re-applies' phases: {}",
        restart_phases.join("; ")
    );
    println!(
        "|   CPU of the first apply: {:.1} s user (Lace), {:.1} s system (the kernel, for Lace's requests), {:.1} s children (nft)",
        cpu[0], cpu[1], cpu[2]
    );
    println!(
        "|   CPU of the fresh reconciler's re-applies: {}; the kernel's dump alone is {:.1}% of the install",
        restart_cpu.join("; "),
        100.0 * secs(raw_dump) / secs(install)
    );
    println!(
        "|   kernel memory of the first apply: {}",
        before.growth(&after)
    );
    println!(
        "|   plan + first apply {:.1} s, every route and rule installed after {:.1} s (target < 10 s); re-apply / install: same reconciler {:.1}% (target < 2%), fresh reconciler {:.1}% (target < 5%)",
        secs(planned + install),
        secs(installed),
        100.0 * secs(reapply) / secs(install),
        100.0 * secs(restart) / secs(install)
    );
    drop(at_default_ns);
}

/// `net.ipv4.fib_sync_mem` of the initial namespace (the bench's own), put back as it was
/// when dropped.
struct FibSyncMem {
    kernel: String,
}

impl FibSyncMem {
    const PATH: &str = "/proc/sys/net/ipv4/fib_sync_mem";

    fn read() -> Self {
        let kernel = std::fs::read_to_string(Self::PATH).unwrap_or_else(|e| {
            panic!(
                "reading {} (the bench runs in the initial namespace): {e}",
                Self::PATH
            )
        });
        Self {
            kernel: kernel.trim().to_string(),
        }
    }

    fn set(&self, value: &str) {
        std::fs::write(Self::PATH, value)
            .unwrap_or_else(|e| panic!("writing {value} to {}: {e}", Self::PATH));
    }
}

impl Drop for FibSyncMem {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.kernel);
    }
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
    // As `lace-agent run` does first, so that the reconciler runs on the agent's malloc set-up.
    lace::sys::malloc::use_one_arena().expect("limiting malloc to one arena");
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
    if let Ok(scale) = std::env::var("LACE_BENCH_SCALE") {
        let (nodes, networks) = scale
            .split_once('x')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .unwrap_or_else(|| {
                panic!("LACE_BENCH_SCALE={scale:?}: want NODESxNETWORKS, e.g. 5000x50")
            });
        bench_scale(nodes, networks);
        return;
    }
    bench_nft(1_000, 10_000);
}
