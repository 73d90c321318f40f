//! The planner's part for NodePort Services from outside the cluster (`lace::plan::ingress`),
//! on the golden cluster: `apps/web` (node port 30080, backends web-0 on node-1 and web-1 on
//! node-2, Network `default`) is granted from the `internet`, `apps/admin` (30081, backend
//! 10.20.2.3 on node-2) is not.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::net::IpAddr;

use ipnet::IpNet;
use lace::plan::ingress::{ingress_address, ingress_device};
use lace::plan::{
    plan, DesiredNode, Nexthop, INGRESS_MARK, MAIN_TABLE, RULE_PRIORITY_INGRESS_REPLY,
};

const T_DEFAULT: u32 = 1_000_001;

fn node(name: &str) -> DesiredNode {
    plan(name, &common::golden_cluster(), &[]).unwrap()
}

use common::planned_route as route;

use common::set_keys as elements;

/// Node `index`'s SID of `default` (function 1) in the golden cluster.
fn sid_default(index: u32) -> std::net::Ipv6Addr {
    format!("2001:db8:100::{index}:1:0").parse().unwrap()
}

#[test]
fn the_ingress_address_is_the_blocks_first_which_the_ipam_never_hands_out() {
    let a = |b: &str| ingress_address(b.parse::<IpNet>().unwrap());
    assert_eq!(
        a("10.20.1.0/24"),
        Some("10.20.1.0".parse::<IpAddr>().unwrap())
    );
    assert_eq!(
        a("fd00:20:0:1::/64"),
        Some("fd00:20:0:1::".parse().unwrap())
    );
    assert_eq!(
        a("10.20.1.0/31"),
        None,
        "every address of a /31 may be a pod's"
    );
    assert_eq!(a("10.20.1.1/32"), None);
    assert_eq!(a("fd00::1/128"), None);
    assert_eq!(ingress_device("lv-default"), "li-default");
    assert_eq!(ingress_device("lv-thirtee_002a"), "li-thirtee_002a");
}

#[test]
fn routes_from_the_main_table_into_the_vrf_and_to_remote_backends_through_the_ingress_device() {
    let d = node("node-1");
    assert_eq!(
        d.base.vrfs["lv-default"].ingress.as_deref(),
        Some("li-default")
    );
    assert_eq!(d.base.vrfs["lv-system"].ingress, None, "no NodePort grant");
    assert_eq!(
        route(&d, MAIN_TABLE, "10.20.0.0/16"),
        Some(Nexthop::Dev("lv-default".into())),
        "the Network's subnet, from the main table into its VRF"
    );
    assert_eq!(
        route(&d, T_DEFAULT, "10.20.2.2/32"),
        Some(Nexthop::Seg6EncapIngress {
            segs: sid_default(2),
            dev: "li-default".into()
        }),
        "web-1 on node-2, through the VRF's dummy slave"
    );
    assert_eq!(
        route(&d, T_DEFAULT, "10.20.2.3/32"),
        None,
        "apps/admin is granted to no one: its backend gets no route"
    );
    for (i, a) in [(2, "10.20.2.0/32"), (3, "10.20.3.0/32")] {
        assert!(
            matches!(route(&d, T_DEFAULT, a), Some(Nexthop::Seg6Encap { segs, .. }) if segs == sid_default(i)),
            "node-{i}'s ingress address {a} over SRv6 (replies), though default does not reach itself"
        );
    }
    assert_eq!(route(&d, T_DEFAULT, "10.20.1.0/32"), None, "its own");
    let rules: Vec<String> = d.base.rules.iter().map(|r| r.to_string()).collect();
    for fam in ["-4", "-6"] {
        assert!(rules.contains(&format!(
            "{fam} pref {RULE_PRIORITY_INGRESS_REPLY} fwmark {INGRESS_MARK:#x}/{INGRESS_MARK:#x} lookup {MAIN_TABLE}"
        )));
    }
    assert_eq!(
        d.base.sysctls.get("net.ipv6.conf.li-default.disable_ipv6"),
        Some(&"0".to_string())
    );
}

#[test]
fn the_ruleset_grants_the_node_port_of_the_granted_service_only() {
    let d = node("node-1");
    assert_eq!(
        elements(&d, "nodeports_v4"),
        ["tcp . 30080 . 10.20.1.2", "tcp . 30080 . 10.20.2.2"],
        "apps/web's node port to each of its backends; nothing of apps/admin (30081)"
    );
    assert_eq!(
        d.base.nft.set("ingress_snat_v4").unwrap().elements["10.20.0.0/16"]
            .value
            .as_deref(),
        Some("10.20.1.0"),
        "source NAT to node-1's ingress address in default"
    );
    assert_eq!(
        elements(&d, "ingress_v4"),
        ["10.20.1.0", "10.20.2.0", "10.20.3.0"]
    );
    assert_eq!(
        elements(&d, "ingress_backends_v4"),
        ["10.20.1.2 . tcp . 8080"]
    );
    let n2 = node("node-2");
    assert_eq!(
        elements(&n2, "ingress_backends_v4"),
        ["10.20.2.2 . tcp . 8080"],
        "node-2 accepts NodePort traffic through other nodes to web-1, not to admin's backend"
    );
    let nft = d.render_nft();
    for needle in [
        "ct direction reply ct status dnat jump nodeport_replies",
        "ct original ip saddr != @cluster_v4 meta mark set mark | 0x00000800",
        "type nat hook postrouting priority srcnat - 10;",
        "snat ip to ip daddr map @ingress_snat_v4",
        "ct protocol . ct original proto-dst . ip daddr @nodeports_v4 accept",
        "ip saddr @ingress_v4 ip daddr . ct protocol . th dport @ingress_backends_v4 accept",
    ] {
        assert!(nft.contains(needle), "{needle}");
    }
}

#[test]
fn without_a_grant_from_an_external_network_nothing_is_planned_for_node_ports() {
    let mut s = common::golden_cluster();
    s.service_routes.remove("internet-to-web");
    let d = plan("node-1", &s, &[]).unwrap();
    assert!(d.base.vrfs.values().all(|v| v.ingress.is_none()));
    assert_eq!(route(&d, MAIN_TABLE, "10.20.0.0/16"), None);
    assert_eq!(route(&d, T_DEFAULT, "10.20.2.0/32"), None);
    assert!(
        !matches!(
            route(&d, T_DEFAULT, "10.20.2.2/32"),
            Some(Nexthop::Seg6EncapIngress { .. })
        ),
        "no ingress route to web-1"
    );
    for set in [
        "nodeports_v4",
        "ingress_snat_v4",
        "ingress_v4",
        "ingress_backends_v4",
    ] {
        assert!(elements(&d, set).is_empty(), "{set}");
    }
    // The counted drop of forwarded traffic towards pods still stands in the way.
    assert!(d
        .render_nft()
        .contains("counter drop comment \"no Lace routing policy allows this new connection\""));
}

/// Every pod of the node, and only those, maps `pod . pod` to the ingress address of its own
/// block (the first address of this node's block of the pod's Network), in its family; a
/// hostNetwork pod and a pod whose IPs are not known yet have no element.
#[test]
fn hairpin_maps_send_each_local_pod_to_the_ingress_address_of_its_block() {
    let mut s = common::golden_cluster_netpol();
    let web0 = s
        .pods
        .get_mut(&lace::state::ObjectKey::new("apps", "web-0"))
        .unwrap();
    web0.host_network = true;
    let api0 = s
        .pods
        .get_mut(&lace::state::ObjectKey::new("tenant-a", "api-0"))
        .unwrap();
    api0.ips.clear();
    let d = plan("node-1", &s, &[]).unwrap();
    let map = |name: &str| -> Vec<(String, String)> {
        d.base
            .nft
            .set(name)
            .unwrap()
            .elements
            .iter()
            .map(|(k, e)| (k.clone(), e.value.clone().unwrap()))
            .collect()
    };
    assert_eq!(
        map("hairpin_v4"),
        [("10.10.1.2 . 10.10.1.2".to_string(), "10.10.1.0".to_string())],
        "coredns-0 only: web-0 is hostNetwork, api-0 has no IPs yet, the others live on node-2"
    );
    assert_eq!(
        map("hairpin_v6"),
        [(
            "fd00:10:0:1::2 . fd00:10:0:1::2".to_string(),
            "fd00:10:0:1::".to_string()
        )]
    );
    let n2 = plan("node-2", &s, &[]).unwrap();
    let keys = n2
        .base
        .nft
        .set("hairpin_v4")
        .unwrap()
        .elements
        .keys()
        .cloned()
        .collect::<Vec<_>>();
    assert!(
        keys.contains(&"10.20.2.2 . 10.20.2.2".to_string()),
        "{keys:?}"
    );
    assert!(n2
        .render_nft()
        .contains("ct status dnat snat ip to ip saddr . ip daddr map @hairpin_v4"));
}
