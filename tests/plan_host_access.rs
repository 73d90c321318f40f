//! The planner's part for Networks with `hostAccess` (`lace::plan::host_access`), on the golden
//! cluster with `tenant-a` (10.30.0.0/16 + fd00:30::/48, function 3, routes to itself) given
//! `hostAccess`: node-1 holds its pod api-0, the other Networks stay closed to the host.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::net::{IpAddr, Ipv6Addr};

use lace::plan::{
    plan, DesiredNode, Family, Nexthop, Rule, RuleAction, Underpath, HOST_ACCESS_TABLE,
    POD_GATEWAY_V6, PROBE_TABLE, RULE_PRIORITY_HOST_ACCESS,
};
use lace::state::ClusterState;

const T_TENANT: u32 = 1_000_003;

fn cluster(host_access: bool) -> ClusterState {
    let mut s = common::golden_cluster();
    s.networks.get_mut("tenant-a").unwrap().host_access = host_access;
    s
}

fn node1(host_access: bool) -> DesiredNode {
    plan(
        "node-1",
        &cluster(host_access),
        &common::golden_attachments(),
    )
    .unwrap()
}

use common::planned_route as route;

fn routes_in(d: &DesiredNode, table: u32) -> Vec<String> {
    d.base
        .routes
        .iter()
        .map(|(k, _)| k)
        .chain(d.pod_routes.keys())
        .filter(|k| k.table == table)
        .map(|k| k.dst.to_string())
        .collect()
}

use common::set_keys as elements;

/// Node `index`'s SID of `tenant-a` (function 3).
fn sid_tenant(index: u32) -> Ipv6Addr {
    format!("2001:db8:100::{index}:3:0").parse().unwrap()
}

fn encap(index: u32) -> Nexthop {
    Nexthop::Seg6Encap {
        segs: sid_tenant(index),
        underlay: Underpath::Ipv6,
    }
}

#[test]
fn host_processes_take_their_own_table_by_a_rule_for_locally_sent_packets_only() {
    let d = node1(true);
    for family in [Family::V4, Family::V6] {
        let rule = Rule {
            priority: RULE_PRIORITY_HOST_ACCESS,
            family,
            action: RuleAction::FromHost {
                table: HOST_ACCESS_TABLE,
            },
        };
        assert!(d.base.rules.contains(&rule), "{:?}", d.base.rules);
    }
    assert_eq!(
        d.base
            .rules
            .iter()
            .find(|r| r.priority == RULE_PRIORITY_HOST_ACCESS)
            .unwrap()
            .to_string(),
        format!("-4 pref 996 iif lo lookup {HOST_ACCESS_TABLE}")
    );
    assert_eq!(HOST_ACCESS_TABLE, PROBE_TABLE + 1);
    let without = node1(false);
    assert!(
        !without
            .base
            .rules
            .iter()
            .any(|r| r.priority == RULE_PRIORITY_HOST_ACCESS),
        "no Network with hostAccess, no rule: {:?}",
        without.base.rules
    );
    assert!(routes_in(&without, HOST_ACCESS_TABLE).is_empty());
}

#[test]
fn the_table_holds_the_networks_local_pods_and_the_other_nodes_blocks_of_it_only() {
    let d = node1(true);
    let mut got = routes_in(&d, HOST_ACCESS_TABLE);
    got.sort();
    let mut want = vec![
        "10.30.1.2/32",
        "10.30.2.0/24",
        "10.30.3.0/24",
        "fd00:30:0:1::2/128",
        "fd00:30:0:2::/64",
        "fd00:30:0:3::/64",
    ];
    want.sort();
    assert_eq!(
        got, want,
        "tenant-a's only: not system's or default's pods and blocks"
    );
    // The local pod as the kubelet's probes reach it: from the InternalIP, fe80::1 for IPv6.
    assert_eq!(
        route(&d, HOST_ACCESS_TABLE, "10.30.1.2/32"),
        Some(Nexthop::DevSrc {
            dev: "lp-api0".into(),
            src: "198.51.100.1".parse().unwrap()
        })
    );
    assert_eq!(
        route(&d, HOST_ACCESS_TABLE, "fd00:30:0:1::2/128"),
        Some(Nexthop::DevSrc {
            dev: "lp-api0".into(),
            src: IpAddr::V6(POD_GATEWAY_V6)
        })
    );
    // The other nodes' blocks, encapsulated towards their SIDs of the Network.
    assert_eq!(route(&d, HOST_ACCESS_TABLE, "10.30.2.0/24"), Some(encap(2)));
    assert_eq!(
        route(&d, HOST_ACCESS_TABLE, "fd00:30:0:3::/64"),
        Some(encap(3))
    );
}

#[test]
fn the_networks_table_routes_the_other_nodes_internal_ips_back_to_them() {
    let d = node1(true);
    assert_eq!(route(&d, T_TENANT, "198.51.100.2/32"), Some(encap(2)));
    assert_eq!(route(&d, T_TENANT, "2001:db8:ff::3/128"), Some(encap(3)));
    assert_eq!(
        route(&d, T_TENANT, "198.51.100.1/32"),
        None,
        "the node's own address is local: the local table delivers replies to it"
    );
    let without = node1(false);
    assert_eq!(route(&without, T_TENANT, "198.51.100.2/32"), None);
    assert_eq!(
        route(&d, 1_000_002, "198.51.100.2/32"),
        None,
        "system has no hostAccess"
    );
}

#[test]
fn the_ruleset_lets_host_processes_and_other_nodes_in_after_network_policy() {
    let d = node1(true);
    assert_eq!(elements(&d, "host_access_v4"), ["10.30.0.0/16"]);
    assert_eq!(elements(&d, "host_access_v6"), ["fd00:30::/48"]);
    assert_eq!(
        elements(&d, "nodes_v4"),
        ["198.51.100.1", "198.51.100.2", "198.51.100.3"]
    );
    assert_eq!(
        elements(&d, "nodes_v6"),
        ["2001:db8:ff::1", "2001:db8:ff::2", "2001:db8:ff::3"]
    );
    let without = node1(false);
    for set in ["host_access_v4", "host_access_v6", "nodes_v4", "nodes_v6"] {
        assert!(elements(&without, set).is_empty(), "{set}");
    }
    let text = d.base.nft.render();
    let chain = |name: &str| -> String {
        let start = text.find(&format!("\tchain {name} {{")).unwrap();
        let end = start + text[start..].find("\n\t}").unwrap();
        text[start..end].to_string()
    };
    let from_host = chain("from_host");
    let accept = from_host.find("ip daddr @host_access_v4 accept").unwrap();
    assert!(
        accept < from_host.find("counter drop").unwrap(),
        "{from_host}"
    );
    let to_pods = chain("to_pods");
    let from_nodes = to_pods
        .find("ip saddr @nodes_v4 ip daddr @host_access_v4 accept")
        .unwrap();
    assert!(
        from_nodes < to_pods.find("counter drop").unwrap(),
        "{to_pods}"
    );
    assert!(chain("from_pods").contains("ip6 saddr @nodes_v6 ip6 daddr @host_access_v6 accept"));
}

#[test]
fn network_policy_comes_before_the_nodes_accept() {
    let mut s = common::golden_cluster_netpol();
    for spec in s.networks.values_mut().filter(|n| !n.external) {
        spec.host_access = true;
    }
    let d = plan("node-1", &s, &[]).unwrap();
    let text = d.base.nft.render();
    let start = text.find("\tchain to_pods {").unwrap();
    let to_pods = &text[start..start + text[start..].find("\n\t}").unwrap()];
    let isolation = to_pods.find("jump").unwrap();
    let from_nodes = to_pods.find("@nodes_v4").unwrap();
    assert!(isolation < from_nodes, "{to_pods}");
}

/// An agent knows only its own Node object; the other nodes' addresses come from their
/// NodeAllocations (found missing in the real cluster: only the node's own address was let in).
#[test]
fn the_other_nodes_addresses_come_from_their_allocations_as_an_agent_sees_them() {
    let mut s = cluster(true);
    s.nodes.retain(|name, _| name == "node-1");
    let d = plan("node-1", &s, &common::golden_attachments()).unwrap();
    assert_eq!(
        elements(&d, "nodes_v4"),
        ["198.51.100.1", "198.51.100.2", "198.51.100.3"]
    );
    assert_eq!(route(&d, T_TENANT, "198.51.100.3/32"), Some(encap(3)));
    assert_eq!(route(&d, T_TENANT, "2001:db8:ff::2/128"), Some(encap(2)));
}
