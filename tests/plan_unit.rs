//! Table-driven planner tests on small hand-built clusters: no kernel, no API server.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use ipnet::IpNet;
use lace::plan::underlay::{Ipv4Tunnel, PeerPath};
use lace::plan::{
    plan, vrf_table, DesiredNode, Nexthop, PlanError, Planner, RouteKey, Underpath, MAIN_TABLE,
    PROBE_MARK, PROBE_MARK_MASK, PROBE_TABLE,
};
use lace::state::ClusterState;

fn key(table: u32, dst: &str) -> RouteKey {
    RouteKey::new(table, dst.parse::<IpNet>().unwrap())
}

fn encap(segs: &str) -> Nexthop {
    Nexthop::Seg6Encap {
        segs: segs.parse().unwrap(),
        underlay: Underpath::Ipv6,
    }
}

fn encap4(segs: &str) -> Nexthop {
    Nexthop::Seg6Encap {
        segs: segs.parse().unwrap(),
        underlay: Underpath::Fou,
    }
}

fn dev(d: &str) -> Nexthop {
    Nexthop::Dev(d.into())
}

// Golden cluster: functions default=1, system=2, tenant-a=3.
const T_DEFAULT: u32 = 1_000_001;
const T_SYSTEM: u32 = 1_000_002;
const T_TENANT: u32 = 1_000_003;

fn golden_node1() -> DesiredNode {
    plan("node-1", &golden_cluster(), &golden_attachments()).expect("plans")
}

#[test]
fn routes_table() {
    let d = golden_node1();
    let n2 = "2001:db8:ff::2";
    // (what, route key, expected next hop or None for "must be absent")
    let cases: Vec<(&str, RouteKey, Option<Nexthop>)> = vec![
        // Local SIDs, End.DT46 into each VRF.
        (
            "SID of system",
            key(MAIN_TABLE, "2001:db8:100::1:2:0/128"),
            Some(Nexthop::Seg6LocalDt46 {
                vrf_table: T_SYSTEM,
                vrf: "lv-system".into(),
            }),
        ),
        // Underlay: other nodes' locators in main only; the encapsulated packet's outer lookup
        // leaves the VRF by the locators' rule (pref 997), so no VRF table holds a copy.
        (
            "locator node-2 in main",
            key(MAIN_TABLE, "2001:db8:100::2:0:0/96"),
            Some(Nexthop::Underlay {
                via: n2.parse().unwrap(),
            }),
        ),
        (
            "no copy of locator node-2 in system's table",
            key(T_SYSTEM, "2001:db8:100::2:0:0/96"),
            None,
        ),
        (
            "own locator never routed",
            key(MAIN_TABLE, "2001:db8:100::1:0:0/96"),
            None,
        ),
        // system -> system (self-routed): remote blocks towards node-2's system SID.
        (
            "system reaches system v4",
            key(T_SYSTEM, "10.10.2.0/24"),
            Some(encap("2001:db8:100::2:2:0")),
        ),
        (
            "system reaches system v6",
            key(T_SYSTEM, "fd00:10:0:2::/64"),
            Some(encap("2001:db8:100::2:2:0")),
        ),
        // default does not reach itself: no remote default blocks in its table.
        (
            "default not self-routed",
            key(T_DEFAULT, "10.20.2.0/24"),
            None,
        ),
        (
            "default subnet unreachable",
            key(T_DEFAULT, "10.20.0.0/16"),
            Some(Nexthop::Unreachable),
        ),
        // tenant-a -> system allowed: tenant-a's table gets system's blocks (towards system's SID),
        (
            "tenant-a reaches system",
            key(T_TENANT, "10.10.2.0/24"),
            Some(encap("2001:db8:100::2:2:0")),
        ),
        // ...and system's table gets tenant-a's blocks (replies), towards tenant-a's SID.
        (
            "system replies to tenant-a",
            key(T_SYSTEM, "10.30.2.0/24"),
            Some(encap("2001:db8:100::2:3:0")),
        ),
        // Local cross-Network pairs: leaked routes between local VRFs.
        (
            "leak tenant-a -> system",
            key(T_TENANT, "10.10.1.0/24"),
            Some(dev("lv-system")),
        ),
        (
            "leak system -> tenant-a",
            key(T_SYSTEM, "10.30.1.0/24"),
            Some(dev("lv-tenant-a")),
        ),
        (
            "no leak tenant-a -> default",
            key(T_TENANT, "10.20.1.0/24"),
            None,
        ),
        // Isolation fallbacks.
        (
            "system unreachable default v4",
            key(T_SYSTEM, "0.0.0.0/0"),
            Some(Nexthop::Unreachable),
        ),
        (
            "tenant unreachable default v6",
            key(T_TENANT, "::/0"),
            Some(Nexthop::Unreachable),
        ),
        // default -> internet: host routing out of the VRF, the rest of the cluster unreachable.
        (
            "default egress",
            key(T_DEFAULT, "0.0.0.0/0"),
            Some(Nexthop::Host),
        ),
        (
            "egress cannot enter system",
            key(T_DEFAULT, "10.10.0.0/16"),
            Some(Nexthop::Unreachable),
        ),
        (
            "replies to default from main",
            key(MAIN_TABLE, "10.20.1.0/24"),
            Some(dev("lv-default")),
        ),
        (
            "no main route for tenant-a",
            key(MAIN_TABLE, "10.30.1.0/24"),
            None,
        ),
        // Service grants: default -> kube-dns (backends on node-2 and node-3, in system).
        (
            "dns backend on node-2",
            key(T_DEFAULT, "10.10.2.5/32"),
            Some(encap("2001:db8:100::2:2:0")),
        ),
        (
            "dns backend on node-3",
            key(T_DEFAULT, "10.10.3.5/32"),
            Some(encap("2001:db8:100::3:2:0")),
        ),
        (
            "dns replies: system has default's blocks",
            key(T_SYSTEM, "10.20.2.0/24"),
            Some(encap("2001:db8:100::2:1:0")),
        ),
        // system -> default/kubernetes (external, backend outside the cluster): host routing.
        (
            "kubernetes backend via host",
            key(T_SYSTEM, "192.0.2.10/32"),
            Some(Nexthop::Host),
        ),
        (
            "kubernetes replies from main",
            key(MAIN_TABLE, "10.10.1.0/24"),
            Some(dev("lv-system")),
        ),
        // Local pods: VRF table and probe table.
        (
            "pod route",
            key(T_TENANT, "10.30.1.2/32"),
            Some(dev("lp-api0")),
        ),
        (
            "pod route v6",
            key(T_TENANT, "fd00:30:0:1::2/128"),
            Some(dev("lp-api0")),
        ),
        (
            "probe route, from the node's IPv4 InternalIP",
            key(PROBE_TABLE, "10.20.1.2/32"),
            Some(Nexthop::DevSrc {
                dev: "lp-web0".into(),
                src: "198.51.100.1".parse().unwrap(),
            }),
        ),
        (
            "probe route v6, from the pod's gateway fe80::1 (an address of the veth, in the VRF)",
            key(PROBE_TABLE, "fd00:30:0:1::2/128"),
            Some(Nexthop::DevSrc {
                dev: "lp-api0".into(),
                src: "fe80::1".parse().unwrap(),
            }),
        ),
    ];
    for (what, k, want) in cases {
        assert_eq!(d.route(&k), want.as_ref(), "{what}: {k:?}");
    }
}

#[test]
fn vrfs_rules_and_sysctls() {
    let d = golden_node1();
    let vrfs: Vec<(&str, &str, u32)> = d
        .base
        .vrfs
        .iter()
        .map(|(n, v)| (n.as_str(), v.network.as_str(), v.table))
        .collect();
    assert_eq!(
        vrfs,
        vec![
            ("lv-default", "default", T_DEFAULT),
            ("lv-system", "system", T_SYSTEM),
            ("lv-tenant-a", "tenant-a", T_TENANT)
        ],
        "one VRF per internal Network, none for the external one"
    );
    let rules: Vec<String> = d.base.rules.iter().map(|r| r.to_string()).collect();
    assert_eq!(
        rules,
        vec![
            format!("-4 pref 990 fwmark {PROBE_MARK:#x}/{PROBE_MARK_MASK:#x} lookup {PROBE_TABLE}"),
            format!("-6 pref 990 fwmark {PROBE_MARK:#x}/{PROBE_MARK_MASK:#x} lookup {PROBE_TABLE}"),
            "-4 pref 995 fwmark 0x800/0x800 lookup 254".to_string(),
            "-6 pref 995 fwmark 0x800/0x800 lookup 254".to_string(),
            // The span of the three nodes' locators 2001:db8:100::{1,2,3}:0:0/96.
            "-6 pref 997 to 2001:db8:100::/94 lookup 254".to_string(),
            "-4 pref 1000 l3mdev".to_string(),
            "-6 pref 1000 l3mdev".to_string(),
        ]
    );
    for (k, v) in [
        ("net.vrf.strict_mode", "1"),
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.lv-system.rp_filter", "0"),
        ("net.ipv4.conf.lv-default.rp_filter", "0"),
        ("net.ipv4.tcp_l3mdev_accept", "1"),
        // Each VRF carries IPv6 (its SIDs), also where the host disables it by default.
        ("net.ipv6.conf.lv-system.disable_ipv6", "0"),
        ("net.ipv6.conf.lv-default.disable_ipv6", "0"),
    ] {
        assert_eq!(
            d.base.sysctls.get(k).map(String::as_str),
            Some(v),
            "sysctl {k}"
        );
    }
    assert_eq!(d.base.seg6_tunsrc, underlay(1));
}

#[test]
fn nft_elements_name_their_policies() {
    let d = golden_node1();
    let nft = &d.base.nft;
    let pairs = nft.set("pairs_v4").expect("pairs_v4");
    let cases = [
        (
            "10.10.0.0/16 . 10.10.0.0/16",
            Some("NetworkRoutingPolicy system-to-system"),
        ),
        (
            "10.30.0.0/16 . 10.10.0.0/16",
            Some("NetworkRoutingPolicy tenant-a-to-system"),
        ),
        // Replies flow back by conntrack; the reverse direction is not a new-connection grant.
        ("10.10.0.0/16 . 10.30.0.0/16", None),
        // default is not self-routed.
        ("10.20.0.0/16 . 10.20.0.0/16", None),
    ];
    for (k, want) in cases {
        assert_eq!(
            pairs.elements.get(k).map(|e| e.comment.as_str()),
            want,
            "pairs_v4 {k}"
        );
        if want.is_some() {
            assert_eq!(pairs.elements[k].value.as_deref(), Some("accept"));
        }
    }
    let egress = nft.set("egress_v4").expect("egress_v4");
    assert_eq!(
        egress.elements.keys().collect::<Vec<_>>(),
        vec!["10.20.0.0/16"]
    );
    let svc = nft.set("services_v4").expect("services_v4");
    assert_eq!(
        svc.elements
            .iter()
            .map(|(k, e)| (k.as_str(), e.comment.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (
                "10.10.0.0/16 . 10.96.0.1",
                "ServiceRoutingPolicy system-to-kubernetes: default/kubernetes"
            ),
            (
                "10.20.0.0/16 . 10.96.0.10",
                "ServiceRoutingPolicy default-to-dns: kube-system/kube-dns"
            ),
        ]
    );
    let ext = nft
        .set("services_external_v4")
        .expect("services_external_v4");
    assert_eq!(
        ext.elements.keys().collect::<Vec<_>>(),
        vec!["10.10.0.0/16 . 10.96.0.1"]
    );
    // Backends: only those on this node. node-1 has none; node-2 has 10.10.2.5.
    assert!(nft
        .set("backends_v4")
        .expect("backends_v4")
        .elements
        .is_empty());
    let d2 = plan("node-2", &golden_cluster(), &[]).expect("plans");
    assert_eq!(
        d2.base
            .nft
            .set("backends_v4")
            .expect("backends_v4")
            .elements
            .keys()
            .collect::<Vec<_>>(),
        vec!["10.20.0.0/16 . 10.10.2.5 . udp . 5353"]
    );
    // The guard admits SRv6 only from node underlays, towards this node's locator.
    assert_eq!(
        nft.set("local_sids")
            .unwrap()
            .elements
            .keys()
            .collect::<Vec<_>>(),
        vec!["2001:db8:100::1:0:0/96"]
    );
    assert_eq!(nft.set("node_underlays").unwrap().elements.len(), 3);
    // Every rule says why it exists.
    for c in &nft.chains {
        for r in &c.rules {
            assert!(
                !r.comment.is_empty(),
                "rule without comment in {}: {}",
                c.name,
                r.statement
            );
        }
    }
    // The last rule of each policy chain drops: no allow-all fall-through.
    for chain in ["from_pods", "to_pods", "from_host"] {
        let c = nft.chain(chain).unwrap();
        assert_eq!(
            c.rules.last().map(|r| r.statement.as_str()),
            Some("counter drop"),
            "{chain}"
        );
    }
}

#[test]
fn attachment_errors() {
    let s = golden_cluster();
    let cases: Vec<(&str, Vec<lace::state::PodAttachment>, &str)> = vec![
        (
            "external Network",
            vec![mk_attachment("a", "p", "internet", "lp-p", &["10.20.1.9"])],
            "pod a/p (container \"cid-p\") is attached to Network \"internet\", which has no VRF on node \"node-1\" (missing, external or not allocated)",
        ),
        (
            "unknown Network",
            vec![mk_attachment("a", "p", "nope", "lp-p", &["10.20.1.9"])],
            "pod a/p (container \"cid-p\") is attached to Network \"nope\", which has no VRF on node \"node-1\" (missing, external or not allocated)",
        ),
        (
            "address in another node's block",
            vec![mk_attachment("a", "p", "default", "lp-p", &["10.20.2.9"])],
            "pod a/p has address 10.20.2.9, outside node \"node-1\"'s blocks of Network \"default\"",
        ),
        (
            "duplicate address",
            vec![
                mk_attachment("a", "p", "default", "lp-p", &["10.20.1.9"]),
                mk_attachment("a", "q", "default", "lp-q", &["10.20.1.9"]),
            ],
            "address 10.20.1.9 is attached to both pod a/p and pod a/q",
        ),
    ];
    for (what, atts, msg) in cases {
        let err = plan("node-1", &s, &atts).expect_err(what);
        assert_eq!(err.to_string(), msg, "{what}");
    }
}

/// The plugin chart installed before any Network exists (the README's order): the node has no
/// VRF, so the vrf module may not be loaded and `net.vrf.strict_mode` may not exist; it is
/// planned with the first VRF (which the diff creates before writing sysctls).
#[test]
fn a_node_without_networks_plans_no_vrf_sysctl() {
    let mut s = golden_cluster();
    s.networks.clear();
    s.network_allocations.clear();
    s.network_bindings.clear();
    s.network_routes.clear();
    s.service_bindings.clear();
    s.service_routes.clear();
    let d = plan("node-1", &s, &[]).expect("plans");
    assert!(d.base.vrfs.is_empty());
    assert_eq!(d.base.sysctls.get("net.vrf.strict_mode"), None);
    assert_eq!(
        d.base
            .sysctls
            .get("net.ipv4.ip_forward")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(
        golden_node1()
            .base
            .sysctls
            .get("net.vrf.strict_mode")
            .map(String::as_str),
        Some("1")
    );
}

#[test]
fn state_errors() {
    let mut missing_fn = golden_cluster();
    missing_fn.network_allocations.remove("tenant-a");
    let mut dup = golden_cluster();
    dup.network_allocations
        .get_mut("tenant-a")
        .unwrap()
        .function = 2;
    let cases: Vec<(&str, ClusterState, &str, PlanError)> = vec![
        (
            "node without allocation",
            golden_cluster(),
            "node-9",
            PlanError::NodeNotAllocated {
                node: "node-9".into(),
            },
        ),
        (
            "Network without function",
            missing_fn,
            "node-1",
            PlanError::NetworkNotAllocated {
                network: "tenant-a".into(),
            },
        ),
        (
            "shared function",
            dup,
            "node-1",
            PlanError::DuplicateFunction {
                first: "system".into(),
                second: "tenant-a".into(),
                function: 2,
            },
        ),
    ];
    for (what, s, node, want) in cases {
        assert_eq!(plan(node, &s, &[]).expect_err(what), want, "{what}");
    }
}

#[test]
fn incremental_plan_equals_full_plan() {
    let s = golden_cluster();
    let planner = Planner::new("node-1", &s).expect("planner");
    let mut atts = golden_attachments();
    let first = planner.plan(&atts).expect("plan");
    assert_eq!(first, plan("node-1", &s, &atts).unwrap());
    atts.push(mk_attachment(
        "apps",
        "web-1",
        "default",
        "lp-web1",
        &["10.20.1.3"],
    ));
    atts.remove(0);
    let second = planner.plan(&atts).expect("plan");
    assert_eq!(second, plan("node-1", &s, &atts).unwrap());
    assert_eq!(
        second.route(&key(T_DEFAULT, "10.20.1.3/32")),
        Some(&dev("lp-web1"))
    );
    assert_eq!(
        second.route(&key(T_SYSTEM, "10.10.1.2/32")),
        None,
        "removed pod's route is gone"
    );
    assert_eq!(second.route(&key(PROBE_TABLE, "10.10.1.2/32")), None);
}

/// A Network's table routes the blocks it reaches only while the Network has a pod on the
/// node: only its local pods' packets are looked up there for them. Everything else of the
/// Network (VRF, SID, defaults, the ingress and Service routes) stays.
#[test]
fn a_network_routes_the_blocks_it_reaches_only_while_it_has_a_pod_here() {
    let s = golden_cluster();
    let planner = Planner::new("node-1", &s).expect("planner");
    let all = golden_attachments();
    let with = planner.plan(&all).unwrap();
    let without_tenant: Vec<_> = all
        .iter()
        .filter(|a| a.network != "tenant-a")
        .cloned()
        .collect();
    let without = planner.plan(&without_tenant).unwrap();
    let reach_of_tenant = [
        (key(T_TENANT, "10.10.2.0/24"), encap("2001:db8:100::2:2:0")),
        (key(T_TENANT, "10.30.2.0/24"), encap("2001:db8:100::2:3:0")),
        (
            key(T_TENANT, "fd00:30:0:2::/64"),
            encap("2001:db8:100::2:3:0"),
        ),
        (key(T_TENANT, "10.10.1.0/24"), dev("lv-system")),
    ];
    for (k, nh) in &reach_of_tenant {
        assert_eq!(with.route(k), Some(nh), "{k:?} with api-0 on the node");
        assert_eq!(without.route(k), None, "{k:?} without a tenant-a pod");
    }
    // system's table still routes tenant-a's blocks (replies to tenant-a's pods elsewhere).
    let reply = key(T_SYSTEM, "10.30.2.0/24");
    assert_eq!(without.route(&reply), with.route(&reply));
    assert!(without.route(&reply).is_some());
    // The rest is the same: only tenant-a's table and api-0's own routes differ.
    let differ: Vec<RouteKey> = with
        .routes()
        .filter(|(k, nh)| without.route(k) != Some(*nh))
        .map(|(k, _)| *k)
        .chain(
            without
                .routes()
                .filter(|(k, nh)| with.route(k) != Some(*nh))
                .map(|(k, _)| *k),
        )
        .collect();
    assert!(!differ.is_empty());
    for k in &differ {
        let api0 = ["10.30.1.2", "fd00:30:0:1::2"]
            .iter()
            .any(|a| k.dst == IpNet::from(a.parse::<std::net::IpAddr>().unwrap()));
        assert!(k.table == T_TENANT || api0, "{k:?} differs");
    }
    assert_eq!(without.base, with.base, "one base for both");
    assert_eq!(with.served_tables, [T_SYSTEM, T_DEFAULT, T_TENANT].into());
    assert_eq!(without.served_tables, [T_SYSTEM, T_DEFAULT].into());
    // With no pod at all, no VRF table routes another node's block (host routes to Service
    // backends and to the other nodes' ingress addresses stay: NodePort traffic uses them).
    let fresh = planner.plan(&[]).unwrap();
    let blocks: Vec<RouteKey> = fresh
        .routes()
        .filter(|(k, nh)| {
            let block = k.dst.prefix_len() < k.dst.max_prefix_len();
            k.table >= T_DEFAULT && block && matches!(nh, Nexthop::Seg6Encap { .. })
        })
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(blocks, Vec::<RouteKey>::new());
    let in_with = |k: &RouteKey| with.route(k).is_some();
    assert!(with.routes().filter(|(k, _)| k.table >= T_DEFAULT).count() > 10);
    assert!(in_with(&key(T_SYSTEM, "10.10.2.0/24")));
    // ...while the other nodes' locators and this node's SIDs are routed as always.
    assert!(fresh
        .route(&key(MAIN_TABLE, "2001:db8:100::2:0:0/96"))
        .is_some());
    assert!(fresh
        .route(&key(MAIN_TABLE, "2001:db8:100::1:3:0/128"))
        .is_some());
}

#[test]
fn routes_iterate_sorted_without_duplicates() {
    let d = golden_node1();
    let keys: Vec<RouteKey> = d.routes().map(|(k, _)| *k).collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "routes() must be strictly sorted"
    );
    let reach = d
        .base
        .pod_reach
        .in_tables(&d.served_tables, lace::plan::Tables::ALL)
        .count();
    assert!(reach > 0, "node-1's Networks route each other's blocks");
    assert_eq!(keys.len(), d.base.routes.len() + reach + d.pod_routes.len());
    assert!(keys
        .iter()
        .all(|k| k.table == MAIN_TABLE || k.table == PROBE_TABLE || k.table >= vrf_table(0)));
}

/// A plan's tables are those of its routes, VRFs and rules' lookups, and the tables Lace
/// always owns: a fresh reconciler reads no other (`observe::dump`).
#[test]
fn a_plans_tables_hold_every_route_vrf_and_rule_lookup_of_it() {
    let d = golden_node1();
    let tables = d.tables();
    let mut named: std::collections::BTreeSet<u32> = d.routes().map(|(k, _)| k.table).collect();
    named.extend(d.base.vrfs.values().map(|v| v.table));
    named.extend(d.base.rules.iter().filter_map(|r| match r.action {
        lace::plan::RuleAction::L3mdev => None,
        lace::plan::RuleAction::Fwmark { table, .. }
        | lace::plan::RuleAction::ToPrefix { table, .. }
        | lace::plan::RuleAction::FromHost { table } => Some(table),
    }));
    named.extend([MAIN_TABLE, PROBE_TABLE, PROBE_TABLE + 1]);
    assert_eq!(tables, named);
    assert!(d.base.vrfs.len() >= 2, "node-1 has VRFs");
    // The reach routes of a table no local pod is served by are not the plan's.
    let unserved: Vec<u32> = d
        .base
        .pod_reach
        .iter()
        .map(|(k, _)| k.table)
        .filter(|t| !d.served_tables.contains(t))
        .collect();
    for t in unserved {
        let elsewhere = d.base.routes.iter().any(|(k, _)| k.table == t)
            || d.base.vrfs.values().any(|v| v.table == t);
        assert_eq!(tables.contains(&t), elsewhere, "table {t}");
    }
}

/// The golden cluster with node-3 on IPv4 only: node-1 keeps IPv6 towards node-2 and carries
/// SRv6 over IPv4 towards node-3; node-3 uses IPv4 towards both, from its locator's address.
#[test]
fn mixed_cluster_uses_ipv6_where_both_have_it_and_ipv4_elsewhere() {
    let s = golden_cluster_mixed();
    let d = plan("node-1", &s, &golden_attachments()).expect("plans");
    let n2: std::net::Ipv6Addr = "2001:db8:ff::2".parse().unwrap();
    let n3: std::net::Ipv4Addr = "198.51.100.3".parse().unwrap();
    assert_eq!(
        d.base.peers.iter().collect::<Vec<_>>(),
        vec![
            (&"node-2".to_string(), &PeerPath::Ipv6(n2)),
            (&"node-3".to_string(), &PeerPath::Ipv4(n3)),
        ]
    );
    let cases: Vec<(&str, RouteKey, Option<Nexthop>)> = vec![
        (
            "locator node-2 over IPv6",
            key(MAIN_TABLE, "2001:db8:100::2:0:0/96"),
            Some(Nexthop::Underlay { via: n2 }),
        ),
        (
            "locator node-3 over IPv4, main",
            key(MAIN_TABLE, "2001:db8:100::3:0:0/96"),
            Some(Nexthop::Ipv4Tunnel { via: n3 }),
        ),
        (
            "no copy of locator node-3 in system's table",
            key(T_SYSTEM, "2001:db8:100::3:0:0/96"),
            None,
        ),
        (
            "system block on node-2: encap through the uplink",
            key(T_SYSTEM, "10.10.2.0/24"),
            Some(encap("2001:db8:100::2:2:0")),
        ),
        (
            "system block on node-3: encap through lu-ipv4",
            key(T_SYSTEM, "10.10.3.0/24"),
            Some(encap4("2001:db8:100::3:2:0")),
        ),
        (
            "system IPv6 block on node-3 too",
            key(T_SYSTEM, "fd00:10:0:3::/64"),
            Some(encap4("2001:db8:100::3:2:0")),
        ),
    ];
    for (what, k, want) in cases {
        assert_eq!(d.route(&k), want.as_ref(), "{what}");
    }
    // node-1 has an IPv6 InternalIP: it stays the outer source, the device holds no address.
    assert_eq!(d.base.seg6_tunsrc, underlay(1));
    assert_eq!(
        d.base.ipv4_tunnel,
        Some(Ipv4Tunnel {
            local: "198.51.100.1".parse().unwrap(),
            address: None
        })
    );
    assert_eq!(
        d.base
            .sysctls
            .get("net.ipv6.conf.lu-ipv4.disable_ipv6")
            .map(String::as_str),
        Some("0")
    );

    // node-3: everything over IPv4, from its locator's own address, which its device holds.
    let d3 = plan("node-3", &s, &[]).expect("plans");
    let src: std::net::Ipv6Addr = "2001:db8:100::3:0:0".parse().unwrap();
    assert_eq!(d3.base.seg6_tunsrc, src);
    assert_eq!(
        d3.base.ipv4_tunnel,
        Some(Ipv4Tunnel {
            local: n3,
            address: Some(src)
        })
    );
    for (peer, v4) in [("node-1", "198.51.100.1"), ("node-2", "198.51.100.2")] {
        assert_eq!(
            d3.base.peers[peer],
            PeerPath::Ipv4(v4.parse().unwrap()),
            "{peer}"
        );
    }
    // Every node's guard knows node-3's outer sources: its IPv4 InternalIP and the locator
    // address it encapsulates from; node-1's and node-2's IPv6 InternalIPs stay.
    for node in ["node-1", "node-2", "node-3"] {
        let nft = plan(node, &s, &[]).unwrap().base.nft.clone();
        let v6: Vec<&String> = nft.set("node_underlays").unwrap().elements.keys().collect();
        assert_eq!(
            v6,
            ["2001:db8:100::3:0:0", "2001:db8:ff::1", "2001:db8:ff::2"],
            "{node}"
        );
        let v4 = &nft.set("node_underlays_v4").unwrap().elements;
        assert_eq!(
            v4.keys().collect::<Vec<_>>(),
            ["198.51.100.1", "198.51.100.2", "198.51.100.3"]
        );
        assert_eq!(v4["198.51.100.3"].comment, "node node-3");
    }
}

/// A pair without a common family gets no routes, and the plan says so.
#[test]
fn peers_without_a_common_family_are_unreachable() {
    let mut s = golden_cluster_mixed();
    // node-1 loses its IPv4 underlay: it has only IPv6, node-3 only IPv4.
    s.node_allocations.get_mut("node-1").unwrap().underlay.ipv4 = None;
    let d = plan("node-1", &s, &[]).expect("plans");
    assert_eq!(d.base.peers["node-3"], PeerPath::NoCommonFamily);
    assert!(d.base.ipv4_tunnel.is_none());
    assert!(d.routes().all(|(k, _)| !"2001:db8:100::3:0:0/96"
        .parse::<IpNet>()
        .unwrap()
        .contains(&k.dst)
        && !"10.10.3.0/24".parse::<IpNet>().unwrap().contains(&k.dst)));
    assert!(d
        .render()
        .contains("peer node-3 unreachable: no common address family"));
    // node-2 still reaches node-3 over IPv4.
    let d2 = plan("node-2", &s, &[]).expect("plans");
    assert_eq!(
        d2.base.peers["node-3"],
        PeerPath::Ipv4("198.51.100.3".parse().unwrap())
    );
}

#[test]
fn route_metrics_spread_ipv4_vrf_routes_and_leave_the_rest_at_the_family_default() {
    assert_eq!(key(MAIN_TABLE, "10.1.0.0/16").metric, 0);
    assert_eq!(key(T_DEFAULT, "fd00::/64").metric, lace::plan::IPV6_METRIC);
    assert_eq!(key(MAIN_TABLE, "fd00::/64").metric, lace::plan::IPV6_METRIC);
    // 10,000 /24s of one table: the kernel's fib_info hash chains stay short only if the
    // metrics do not bunch up.
    let mut per_metric = std::collections::HashMap::<u32, usize>::new();
    for i in 0..10_000u32 {
        let dst = IpNet::V4(ipnet::Ipv4Net::new((0x0a00_0000 + (i << 8)).into(), 24).unwrap());
        let k = RouteKey::new(T_DEFAULT, dst);
        assert!((1..=65_536).contains(&k.metric), "{k:?}");
        *per_metric.entry(k.metric).or_default() += 1;
    }
    assert!(per_metric.len() > 9_000, "{} distinct", per_metric.len());
    assert!(per_metric.values().all(|n| *n <= 4), "{per_metric:?}");
    // The same destination in two tables (two Networks' routes to one block) is spread too.
    let other = key(T_SYSTEM, "10.20.2.0/24").metric;
    assert_ne!(key(T_DEFAULT, "10.20.2.0/24").metric, other);
    // Stable across releases: a changed metric rewrites every IPv4 VRF route on upgrade.
    assert_eq!(other, 3721);
}

/// The TCP MSS clamp towards peers on fou for now rewrites a pod's SYN-ACK as well as its SYN
/// (the peer's pod must send segments that fit fou too), and a SYN-ACK belongs to an
/// established flow: the clamp must come before `from_vrfs` accepts established flows.
#[test]
fn the_fou_mss_clamp_runs_before_established_flows_are_accepted() {
    let state = golden_cluster_mixed();
    let facts = lace::plan::underlay::UnderlayFacts {
        uplink_ipv6: true,
        on_link: ["node-1".to_string(), "node-2".to_string()].into(),
        answering: ["node-1".to_string()].into(),
        answered: ["node-1".to_string()].into(),
        uplink_mtu: Some(1500),
    };
    let node3 = lace::plan::plan_with("node-3", &state, &facts, &[]).unwrap();
    let rules = &node3.nft().chain("from_vrfs").unwrap().rules;
    let at = |what: &str| rules.iter().position(|r| r.statement.contains(what));
    let established = at(lace::plan::nft::ESTABLISHED).unwrap();
    for family in ["@fou_clamp_v4", "@fou_clamp_v6"] {
        let clamp = at(family).unwrap_or_else(|| panic!("no clamp to {family}: {rules:#?}"));
        assert!(clamp < established, "{rules:#?}");
    }
}
