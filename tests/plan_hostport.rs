//! The planner's part for hostPorts (`lace::plan::hostport`), on node-1 of the golden cluster
//! with [`common::golden_attachments_host_ports`]: web-0 (`default`, 10.20.1.2) maps 8080/TCP
//! on every address and 8443/TCP on 192.0.2.10; coredns-0 (`system`, 10.10.1.2 and
//! fd00:10:0:1::2) maps 5353/UDP on every address and 5354/UDP on 2001:db8::10.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use lace::hostport::{HostPort, Protocol};
use lace::plan::{plan, DesiredNode, Nexthop, RouteKey, MAIN_TABLE};

fn node1(attachments: &[lace::state::PodAttachment]) -> DesiredNode {
    plan("node-1", &common::golden_cluster(), attachments).unwrap()
}

/// `key => value  # comment` of every element of `set` in the plan's ruleset.
fn elements(d: &DesiredNode, set: &str) -> Vec<String> {
    d.nft()
        .set(set)
        .unwrap_or_else(|| panic!("no set {set}"))
        .elements
        .iter()
        .map(|(k, e)| match &e.value {
            Some(v) => format!("{k} => {v}  # {}", e.comment),
            None => format!("{k}  # {}", e.comment),
        })
        .collect()
}

fn main_route(d: &DesiredNode, dst: &str) -> Option<Nexthop> {
    d.route(&RouteKey::new(MAIN_TABLE, dst.parse().unwrap()))
        .cloned()
}

#[test]
fn each_mapping_is_one_map_element_naming_the_pod_in_its_family() {
    let d = node1(&common::golden_attachments_host_ports());
    assert_eq!(
        elements(&d, "hostports_any_v4"),
        [
            "tcp . 8080 => 10.20.1.2 . 80  # pod apps/web-0",
            "udp . 5353 => 10.10.1.2 . 53  # pod kube-system/coredns-0",
        ]
    );
    assert_eq!(
        elements(&d, "hostports_any_v6"),
        ["udp . 5353 => fd00:10:0:1::2 . 53  # pod kube-system/coredns-0"],
        "web-0 has no IPv6 address"
    );
    assert_eq!(
        elements(&d, "hostports_v4"),
        ["192.0.2.10 . tcp . 8443 => 10.20.1.2 . 443  # pod apps/web-0"]
    );
    assert_eq!(
        elements(&d, "hostports_v6"),
        ["2001:db8::10 . udp . 5354 => fd00:10:0:1::2 . 53  # pod kube-system/coredns-0"],
        "a hostIP maps its own family only"
    );
    assert_eq!(
        elements(&d, "hostport_pods_v4"),
        [
            "tcp . 8080 . 10.20.1.2  # pod apps/web-0",
            "tcp . 8443 . 10.20.1.2  # pod apps/web-0",
            "udp . 5353 . 10.10.1.2  # pod kube-system/coredns-0",
        ]
    );
    let text = d.render_nft();
    assert!(
        text.contains("tcp . 8080 comment \"pod apps/web-0\" : 10.20.1.2 . 80"),
        "{text}"
    );
}

#[test]
fn mapped_pods_are_routed_from_the_main_table_into_their_vrf() {
    let d = node1(&common::golden_attachments_host_ports());
    assert_eq!(
        main_route(&d, "10.20.1.2/32"),
        Some(Nexthop::Dev("lv-default".into()))
    );
    assert_eq!(
        main_route(&d, "10.10.1.2/32"),
        Some(Nexthop::Dev("lv-system".into()))
    );
    assert_eq!(
        main_route(&d, "fd00:10:0:1::2/128"),
        Some(Nexthop::Dev("lv-system".into()))
    );
    assert_eq!(
        main_route(&d, "10.30.1.2/32"),
        None,
        "api-0 has no hostPort"
    );
}

#[test]
fn without_host_ports_the_plan_is_the_base_and_the_maps_are_declared_empty() {
    let d = node1(&common::golden_attachments());
    assert!(std::ptr::eq(d.nft(), &d.base.nft), "no copy of the ruleset");
    for set in [
        "hostports_v4",
        "hostports_v6",
        "hostports_any_v4",
        "hostports_any_v6",
        "hostport_pods_v4",
        "hostport_pods_v6",
    ] {
        assert_eq!(elements(&d, set), Vec::<String>::new(), "{set}");
    }
    assert_eq!(main_route(&d, "10.20.1.2/32"), None);
    // The node's InternalIPs, by which pods reach hostPorts.
    let state = common::golden_cluster();
    for (set, v6) in [("node_ips_v4", false), ("node_ips_v6", true)] {
        let want: Vec<String> = state.nodes["node-1"]
            .internal_ips
            .iter()
            .filter(|ip| ip.is_ipv6() == v6)
            .map(|ip| format!("{ip}  # node node-1"))
            .collect();
        assert!(!want.is_empty(), "the golden node-1 has {set} addresses");
        assert_eq!(elements(&d, set), want, "{set}");
    }
    // The rules are in the base: a pod with a hostPort changes elements only, never chains.
    let with = node1(&common::golden_attachments_host_ports());
    assert_eq!(with.nft().chains, d.nft().chains);
    // Before kube-proxy's DNAT (priority dstnat, -100).
    for (chain, priority) in [("hostports", "dstnat - 10"), ("hostports_local", "-110")] {
        let c = d.nft().chain(chain).unwrap();
        assert_eq!(c.hook.as_ref().unwrap().priority, priority, "{chain}");
    }
}

#[test]
fn a_port_two_pods_map_stays_with_the_first() {
    let mut atts = common::golden_attachments();
    let web = HostPort {
        protocol: Protocol::Tcp,
        host_port: 8080,
        container_port: 80,
        host_ip: None,
    };
    atts[1].host_ports = vec![web.clone()];
    atts[2].host_ports = vec![HostPort {
        container_port: 8000,
        ..web
    }];
    let d = node1(&atts);
    assert_eq!(
        elements(&d, "hostports_any_v4"),
        ["tcp . 8080 => 10.20.1.2 . 80  # pod apps/web-0"]
    );
    assert_eq!(
        main_route(&d, "10.30.1.2/32"),
        None,
        "not for the address whose port web-0 holds"
    );
    // api-0's IPv6 address has the port to itself.
    assert_eq!(
        elements(&d, "hostports_any_v6"),
        ["tcp . 8080 => fd00:30:0:1::2 . 8000  # pod tenant-a/api-0"]
    );
}
