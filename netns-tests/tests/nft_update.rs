//! A policy change that changes only set elements reaches the kernel as an element update of
//! table `inet lace`, not as a replace of the table: one node, two pods of Network `default`
//! on it, and a NetworkRoutingPolicy `default → default` added and removed again.
//!
//! Proven with the kernel's own bookkeeping: the handles of the table, its chains, rules and
//! sets stay the same (a replaced table gets new ones), the nft part is one write, ping between
//! the pods follows the policy, the next reconcile writes nothing, and a restarted reconciler
//! (no memory) writes nothing either and then applies the next change as an element update too.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net};
use lace::dataplane::{ApplyReport, NetnsTarget, Reconciler, SAMPLE_OPS};
use lace::plan::{plan, DesiredNode};
use lace::state::{ObjectKey, PodAttachment};
use lace_netns_tests::cluster::{ipv4_cluster, underlay, TestNetwork};
use lace_netns_tests::nft::handles;
use lace_netns_tests::pods::attach_pod;
use lace_netns_tests::{require_root_and_vrf, Topology};

/// (pod namespace label, host interface, address), all on node 1 in Network `default`.
const PODS: [(&str, &str, Ipv4Addr); 2] = [
    ("pod-a", "lp-a", Ipv4Addr::new(10, 1, 1, 10)),
    ("pod-b", "lp-b", Ipv4Addr::new(10, 1, 1, 11)),
];

/// Network `default` on two nodes (node 2 exists only in the plan); with `self_policy`, it
/// reaches itself.
fn desired(self_policy: bool) -> DesiredNode {
    let s = ipv4_cluster(
        "node",
        2,
        &[TestNetwork {
            name: "default",
            second: 1,
            function: 1,
            reaches_itself: self_policy,
        }],
    );
    let pods: Vec<PodAttachment> = PODS
        .iter()
        .map(|(label, host_if, addr)| PodAttachment {
            pod: ObjectKey::new("test", *label),
            container_id: format!("c-{label}"),
            host_ifname: (*host_if).into(),
            network: "default".into(),
            ips: vec![IpNet::V4(Ipv4Net::from(*addr))],
            host_ports: Vec::new(),
            bandwidth: None,
        })
        .collect();
    plan("node1", &s, &pods).unwrap()
}

/// The nft operations a reconcile did, without their tags (the policy also adds or removes
/// routes towards the Network's block on node 2; each operation is one write).
fn nft_ops(report: &ApplyReport) -> Vec<&str> {
    assert!(report.sample.len() < SAMPLE_OPS, "{:#?}", report.sample);
    assert_eq!(report.writes, report.sample.len() as u64);
    report
        .sample
        .iter()
        .filter(|op| op.starts_with("nft "))
        .map(|op| op.split(" (lace-plan ").next().unwrap_or(op))
        .collect()
}

fn pings(w: &Topology) -> bool {
    w.ns("pod-a")
        .unwrap()
        .exec("ping", &["-c", "1", "-W", "2", &PODS[1].2.to_string()])
        .is_ok()
}

#[test]
fn nft_element_change_updates_the_table_in_place_and_survives_a_restart() {
    require_root_and_vrf();
    let mut w = Topology::new();
    for l in ["node1", "pod-a", "pod-b"] {
        w.add(l).unwrap();
    }
    let node = w.ns("node1").unwrap();
    node.ip("link add eth0 type dummy").unwrap();
    node.ip("link set eth0 up").unwrap();
    node.ip(&format!("-6 addr add {}/64 dev eth0 nodad", underlay(1)))
        .unwrap();
    for (label, host_if, addr) in PODS {
        attach_pod(node, host_if, w.ns(label).unwrap(), addr).unwrap();
    }
    let (closed, open) = (desired(false), desired(true));
    let changes = closed.base.nft.element_changes(&open.base.nft).unwrap();
    assert_eq!(
        (changes.deleted.len(), changes.added.len()),
        (0, 1),
        "the policy adds one pair element"
    );

    let rec = Reconciler::new(NetnsTarget::Path(node.path())).unwrap();
    assert!(rec.reconcile(&closed).unwrap().writes > 0);
    assert!(!pings(&w), "no policy lets default reach itself yet");
    let before = handles(node);
    assert!(before.len() > 10, "{before:#?}");

    let report = rec.reconcile(&open).unwrap();
    assert_eq!(
        nft_ops(&report),
        ["nft update table inet lace: 0 element(s) deleted, 1 added"],
        "{:#?}",
        report.sample
    );
    assert_eq!(handles(node), before, "table, chains, rules and sets kept");
    assert!(
        pings(&w),
        "the added pair element lets default reach itself"
    );
    assert_eq!(rec.reconcile(&open).unwrap().writes, 0, "converged");

    // A restarted reconciler knows nothing: it finds the plan's tag and writes nothing...
    drop(rec);
    let rec = Reconciler::new(NetnsTarget::Path(node.path())).unwrap();
    assert_eq!(rec.reconcile(&open).unwrap().writes, 0, "restart");
    assert!(pings(&w));
    // ...and having found it, applies the next change as an element update as well.
    let report = rec.reconcile(&closed).unwrap();
    assert_eq!(
        nft_ops(&report),
        ["nft update table inet lace: 1 element(s) deleted, 0 added"],
        "{:#?}",
        report.sample
    );
    assert_eq!(handles(node), before, "table, chains, rules and sets kept");
    assert!(!pings(&w), "the pair element is gone");
    assert_eq!(rec.reconcile(&closed).unwrap().writes, 0, "converged");

    // A hand edit of set plan (a second element): the tag is no longer one Lace reads as its
    // own, so the next change replaces the table instead of updating elements.
    node.exec(
        "nft",
        &["add", "element", "inet", "lace", "plan", "{", "\"x\"", "}"],
    )
    .unwrap();
    let report = rec.reconcile(&open).unwrap();
    assert_eq!(
        nft_ops(&report),
        ["nft replace table inet lace"],
        "an untagged table is replaced: {:#?}",
        report.sample
    );
    assert_ne!(handles(node), before, "a replace makes a new table");
    assert!(pings(&w));
    assert_eq!(rec.reconcile(&open).unwrap().writes, 0, "converged");
}
