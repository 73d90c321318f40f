//! Property tests of the planner on random clusters: reachability is exactly what the
//! NetworkRoutingPolicies allow (routes both ways, from the tables of the Networks with a pod on
//! the node; new connections one way) over the underlay
//! each pair of nodes has in common (IPv6 first, else IPv4, else none), names and table ids
//! are unique, and planning is a pure function.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv6Addr;

use common::*;
use ipnet::IpNet;
use lace::api::NetworkAllocationSpec;
use lace::plan::underlay::{link_local_address, PeerPath, UnderlayFacts, IPV4_TUNNEL};
use lace::plan::{plan, plan_with, sysctl_device, Nexthop, RouteKey, Underpath, IFNAME_MAX};
use lace::state::{ClusterState, PodAttachment};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    state: ClusterState,
    names: Vec<String>,
    pairs: BTreeSet<(usize, usize)>,
    local: Vec<PodAttachment>,
}

fn sid(locator_index: u32, function: u16) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(locator(locator_index).network()) | (u128::from(function) << 16))
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=5, 1u32..=4).prop_flat_map(|(nets, nodes)| {
        (
            prop::collection::btree_set("[a-z][a-z0-9-]{0,20}", nets),
            prop::collection::btree_set(0u16..=u16::MAX, nets),
            prop::collection::vec(any::<bool>(), nets),
            prop::collection::vec(any::<bool>(), nets * nets),
            prop::collection::vec(any::<bool>(), nets),
            // Per node: 0 dual-stack, 1 IPv4 only, 2 IPv6 only.
            prop::collection::vec(0u8..3, nodes as usize),
        )
            .prop_map(
                move |(names, functions, dual, pairs_bits, pods, families)| {
                    let names: Vec<String> = names.into_iter().collect();
                    let n = names.len();
                    let mut s = ClusterState::default();
                    for (i, name) in names.iter().enumerate() {
                        let v4 = format!("10.{}.0.0/16", i + 1);
                        let v6 = format!("fd00:{}::/48", i + 1);
                        let mut subnets = vec![(v4.as_str(), 24)];
                        if dual[i] {
                            subnets.push((v6.as_str(), 64));
                        }
                        s.networks.insert(name.clone(), mk_network(&subnets));
                    }
                    for (i, f) in families.iter().enumerate() {
                        mk_node_families(&mut s, &format!("n{i}"), i as u32, *f != 2, *f != 1);
                    }
                    alloc_all(&mut s);
                    // Random distinct SID functions instead of 1, 2, 3...
                    for (name, f) in names.iter().zip(&functions) {
                        s.network_allocations
                            .insert(name.clone(), NetworkAllocationSpec { function: *f });
                    }
                    let mut pairs = BTreeSet::new();
                    for a in 0..n {
                        for b in 0..n {
                            if pairs_bits[a * n + b] {
                                pairs.insert((a, b));
                                mk_route(&mut s, &format!("p-{a}-{b}"), &names[a], &names[b]);
                            }
                        }
                    }
                    let local = (0..n)
                        .filter(|i| pods[*i])
                        .map(|i| {
                            mk_attachment(
                                "ns",
                                &format!("pod{i}"),
                                &names[i],
                                &format!("lp-{i}"),
                                &[&format!("10.{}.0.9", i + 1)],
                            )
                        })
                        .collect();
                    Case {
                        state: s,
                        names,
                        pairs,
                        local,
                    }
                },
            )
    })
}

fn blocks_of(s: &ClusterState, node: &str, net: &str) -> Vec<IpNet> {
    lace::alloc::node_blocks(s.node_allocations[node].index, &s.networks[net].subnets)
}

fn table_of(d: &lace::plan::DesiredNode, net: &str) -> u32 {
    d.base
        .vrfs
        .values()
        .find(|v| v.network == net)
        .expect("VRF per Network")
        .table
}

fn vrf_of(d: &lace::plan::DesiredNode, net: &str) -> String {
    d.base
        .vrfs
        .iter()
        .find(|(_, v)| v.network == net)
        .expect("VRF per Network")
        .0
        .clone()
}

fn pair_key(s: &ClusterState, a: &str, b: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for sa in &s.networks[a].subnets {
        for sb in &s.networks[b].subnets {
            if matches!(sa.cidr, IpNet::V4(_)) == matches!(sb.cidr, IpNet::V4(_)) {
                keys.push(format!("{} . {}", sa.cidr, sb.cidr));
            }
        }
    }
    keys
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn allowed_pairs_route_both_ways_and_accept_one_way(c in case()) {
        let s = &c.state;
        let me = "n0";
        let d = plan(me, s, &c.local).expect("random cluster plans");
        // The locator number of each node (mk_node: allocation index = locator number + 1).
        let index: BTreeMap<&str, u32> = s.node_allocations.iter().map(|(k, v)| (k.as_str(), v.index - 1)).collect();
        let mine = s.node_allocations[me].underlay;
        // How the test expects each peer to be reached: the locator route and the encap's family.
        let path = |node: &str| -> Option<(Nexthop, Underpath)> {
            let peer = s.node_allocations[node].underlay;
            match (mine.ipv6, peer.ipv6, mine.ipv4, peer.ipv4) {
                (Some(_), Some(via), _, _) => Some((Nexthop::Underlay { via }, Underpath::Ipv6)),
                (_, _, Some(_), Some(via)) => Some((Nexthop::Ipv4Tunnel { via }, Underpath::Fou)),
                _ => None,
            }
        };
        let locators_rule = d.base.rules.iter().find_map(|r| match r.action {
            lace::plan::RuleAction::ToPrefix { dst, table: lace::plan::MAIN_TABLE }
                if r.priority == lace::plan::RULE_PRIORITY_LOCATORS => Some(dst),
            _ => None,
        });
        let pairs4 = d.base.nft.set("pairs_v4").unwrap();
        let pairs6 = d.base.nft.set("pairs_v6").unwrap();
        let has_element = |k: &str| pairs4.elements.contains_key(k) || pairs6.elements.contains_key(k);
        for (ai, a) in c.names.iter().enumerate() {
            for (bi, b) in c.names.iter().enumerate() {
                let allowed = c.pairs.contains(&(ai, bi));
                let reverse = c.pairs.contains(&(bi, ai));
                // nft: a new connection A -> B is accepted exactly when A -> B is allowed.
                for k in pair_key(s, a, b) {
                    prop_assert_eq!(has_element(&k), allowed, "pair element {} for {}->{}", k, a, b);
                }
                let ta = table_of(&d, a);
                let f_b = s.network_allocations[b].function;
                for (node, idx) in &index {
                    for blk in blocks_of(s, node, b) {
                        let got = d.route(&RouteKey::new(ta, blk));
                        // A's table routes B's blocks while A has a pod on this node.
                        let a_here = c.local.iter().any(|l| l.network == *a);
                        let want = if !(allowed || reverse) || !a_here {
                            None
                        } else if *node != me {
                            path(node).map(|(_, underlay)| Nexthop::Seg6Encap { segs: sid(*idx, f_b), underlay })
                        } else if a != b {
                            Some(Nexthop::Dev(vrf_of(&d, b)))
                        } else {
                            None // own local block: pods have host routes
                        };
                        prop_assert_eq!(got, want.as_ref(), "table of {} -> block {} of {} on {}", a, blk, b, node);
                        if want.is_some() && *node != me {
                            // The outer packet leaves the VRF by the locators' rule: the node's
                            // locator is in the main table, via its underlay address of the
                            // common family, within the rule's prefix, and in no VRF's table.
                            let main = RouteKey::new(lace::plan::MAIN_TABLE, IpNet::V6(locator(*idx)));
                            let via = path(node).map(|(nh, _)| nh);
                            prop_assert_eq!(d.route(&main), via.as_ref());
                            prop_assert!(locators_rule.is_some_and(|r| r.contains(&locator(*idx))), "{:?}", locators_rule);
                            prop_assert_eq!(d.route(&RouteKey::new(ta, IpNet::V6(locator(*idx)))), None);
                        }
                    }
                }
                if !(allowed || reverse) {
                    // Nothing in A's table leads into B except fallbacks and A's own local pods.
                    let b_subnets: Vec<IpNet> = s.networks[b].subnets.iter().map(|x| x.cidr).collect();
                    for (k, nh) in d.routes().filter(|(k, _)| k.table == ta) {
                        let into_b = b_subnets.iter().any(|sn| sn.contains(&k.dst));
                        let own_pod = a == b && matches!(nh, Nexthop::Dev(dev) if dev.starts_with("lp-"));
                        prop_assert!(!into_b || own_pod || *nh == Nexthop::Unreachable,
                            "disallowed {}->{} has route {:?} {:?}", a, b, k, nh);
                    }
                }
            }
        }
    }

    #[test]
    fn link_local_replaces_fou_exactly_where_the_facts_say_it_works(
        c in case(),
        ipv6 in any::<bool>(),
        on in prop::collection::vec(any::<bool>(), 4),
        ans in prop::collection::vec(any::<bool>(), 4),
    ) {
        let s = &c.state;
        let others: Vec<&String> = s.node_allocations.keys().filter(|n| *n != "n0").collect();
        let pick = |bits: &[bool]| -> BTreeSet<String> {
            others.iter().zip(bits).filter(|(_, b)| **b).map(|(n, _)| n.to_string()).collect()
        };
        let facts = UnderlayFacts { uplink_ipv6: ipv6, on_link: pick(&on), answering: pick(&ans), answered: Default::default(), uplink_mtu: None };
        let d = plan_with("n0", s, &facts, &c.local).expect("random cluster plans");
        let without = plan("n0", s, &c.local).expect("plans");
        let me = s.node_allocations["n0"].underlay;
        let mut expected_ll = false;
        for (node, a) in s.node_allocations.iter().filter(|(n, _)| *n != "n0") {
            let loc = RouteKey::new(lace::plan::MAIN_TABLE, IpNet::V6(a.locator));
            let got = (d.base.peers.get(node.as_str()), d.route(&loc));
            let works = ipv6 && facts.on_link.contains(node) && facts.answering.contains(node);
            match (me.ipv6.and(a.underlay.ipv6), me.ipv4.and(a.underlay.ipv4)) {
                (None, Some(v4)) if works => {
                    let via = link_local_address(a.underlay.ipv4.unwrap());
                    prop_assert_eq!(got, (Some(&PeerPath::LinkLocal(via)), Some(&Nexthop::LinkLocal { via })));
                    expected_ll = true;
                    let _ = v4;
                }
                (None, Some(_)) => {
                    expected_ll |= ipv6 && facts.on_link.contains(node);
                    prop_assert_eq!(got.0, without.base.peers.get(node.as_str()));
                }
                // IPv6 InternalIPs on both, or nothing in common: the facts change nothing.
                _ => prop_assert_eq!(got, (without.base.peers.get(node.as_str()), without.route(&loc))),
            }
        }
        // The node holds its own link-local address exactly while some pair uses or expects it.
        prop_assert_eq!(d.base.link_local, me.ipv4.filter(|_| expected_ll).map(link_local_address));
        // Encapsulation over link-local leaves through the IPv4 uplink, never lu-ipv4.
        for (_, nh) in d.routes() {
            if let Nexthop::Seg6Encap { underlay: Underpath::LinkLocal, .. } = nh {
                prop_assert!(d.base.peers.values().any(|p| matches!(p, PeerPath::LinkLocal(_))));
            }
        }
        // No facts, no link-local: the plan of `plan`.
        let none = plan_with("n0", s, &UnderlayFacts::default(), &c.local).expect("plans");
        prop_assert_eq!(none, without);
    }

    #[test]
    fn each_pair_uses_the_family_both_nodes_have(c in case()) {
        let s = &c.state;
        let d = plan("n0", s, &c.local).expect("random cluster plans");
        let me = s.node_allocations["n0"].underlay;
        let mut over_v4 = false;
        for (node, a) in s.node_allocations.iter().filter(|(n, _)| *n != "n0") {
            let loc = RouteKey::new(lace::plan::MAIN_TABLE, IpNet::V6(a.locator));
            let got = (d.base.peers.get(node.as_str()), d.route(&loc));
            match (me.ipv6.and(a.underlay.ipv6), me.ipv4.and(a.underlay.ipv4)) {
                (Some(v6), _) => prop_assert_eq!(got, (Some(&PeerPath::Ipv6(v6)), Some(&Nexthop::Underlay { via: v6 }))),
                (None, Some(v4)) => {
                    over_v4 = true;
                    prop_assert_eq!(got, (Some(&PeerPath::Ipv4(v4)), Some(&Nexthop::Ipv4Tunnel { via: v4 })));
                }
                (None, None) => prop_assert_eq!(got, (Some(&PeerPath::NoCommonFamily), None)),
            }
        }
        // The tunnel exists exactly when a peer is reached over IPv4; its source is an address
        // of this node that every peer knows.
        prop_assert_eq!(d.base.ipv4_tunnel.is_some(), over_v4);
        if let Some(t) = d.base.ipv4_tunnel {
            prop_assert_eq!(Some(t.local), me.ipv4);
            prop_assert_eq!(t.address, me.ipv6.is_none().then_some(d.base.seg6_tunsrc));
        }
        prop_assert_eq!(me.ipv6.unwrap_or(d.base.seg6_tunsrc), d.base.seg6_tunsrc);
        prop_assert!(d.base.locator.contains(&d.base.seg6_tunsrc) || me.ipv6.is_some());
        prop_assert_eq!(
            d.base.sysctls.contains_key(&format!("net.ipv6.conf.{IPV4_TUNNEL}.disable_ipv6")),
            over_v4
        );
        // Every node's outer sources are in the guard's sets, on every node.
        let v6 = d.base.nft.set("node_underlays").unwrap();
        let v4 = d.base.nft.set("node_underlays_v4").unwrap();
        for (node, a) in &s.node_allocations {
            let other = plan(node, s, &[]).expect("plans");
            prop_assert!(v6.elements.contains_key(&other.base.seg6_tunsrc.to_string()), "tunsrc of {}", node);
            if let Some(ip) = a.underlay.ipv4 {
                prop_assert!(v4.elements.contains_key(&ip.to_string()), "IPv4 of {}", node);
            }
        }
        prop_assert_eq!(v4.elements.len(), s.node_allocations.values().filter(|a| a.underlay.ipv4.is_some()).count());
    }

    #[test]
    fn names_and_tables_unique(c in case()) {
        let d = plan("n0", &c.state, &c.local).expect("plans");
        let names: BTreeSet<&String> = d.base.vrfs.keys().collect();
        let tables: BTreeSet<u32> = d.base.vrfs.values().map(|v| v.table).collect();
        let sids: BTreeSet<Ipv6Addr> = d.base.vrfs.values().map(|v| v.sid).collect();
        prop_assert_eq!(names.len(), c.names.len());
        prop_assert_eq!(tables.len(), c.names.len());
        prop_assert_eq!(sids.len(), c.names.len());
        for n in names {
            prop_assert!(n.len() <= IFNAME_MAX && n.starts_with("lv-"), "bad VRF name {:?}", n);
        }
    }

    /// IPv6 is switched on exactly on Lace's own devices that carry it (every VRF, the IPv4
    /// tunnel when there is one), whatever the host's default, and on nothing of the host's.
    #[test]
    fn ipv6_is_enabled_on_lace_s_devices_only(c in case()) {
        let d = plan("n0", &c.state, &c.local).expect("plans");
        let enabled: BTreeSet<&str> = d
            .base
            .sysctls
            .iter()
            .filter(|(k, _)| k.starts_with("net.ipv6.conf.") && k.ends_with(".disable_ipv6"))
            .map(|(k, v)| {
                assert_eq!(v, "0", "{k}");
                sysctl_device(k).unwrap()
            })
            .collect();
        let mut want: BTreeSet<&str> = d.base.vrfs.keys().map(String::as_str).collect();
        if d.base.ipv4_tunnel.is_some() {
            want.insert(IPV4_TUNNEL);
        }
        prop_assert_eq!(enabled, want);
    }

    #[test]
    fn plan_is_pure(c in case()) {
        let first = plan("n0", &c.state, &c.local).expect("plans");
        // A state that went through serialization (as from a cache or the API) plans the same.
        let copy: ClusterState = serde_json::from_str(&serde_json::to_string(&c.state).unwrap()).unwrap();
        let second = plan("n0", &copy, &c.local).expect("plans");
        prop_assert_eq!(first.render(), second.render());
        prop_assert_eq!(first.render_nft(), second.render_nft());
        prop_assert_eq!(&first, &second);
    }
}

/// Long Network names sharing a prefix still get distinct VRF names on a real plan.
#[test]
fn long_names_unique_in_a_plan() {
    let mut s = ClusterState::default();
    let names: Vec<String> = (0..40)
        .map(|i| format!("customer-environment-{i:02}"))
        .collect();
    for (i, n) in names.iter().enumerate() {
        s.networks.insert(
            n.clone(),
            mk_network(&[(&format!("10.{}.0.0/16", i + 1), 24)]),
        );
    }
    mk_node(&mut s, "n0", 0);
    alloc_all(&mut s);
    let d = plan("n0", &s, &[]).expect("plans");
    assert_eq!(d.base.vrfs.len(), 40);
    assert!(d.base.vrfs.keys().all(|n| n.len() <= IFNAME_MAX));
}
