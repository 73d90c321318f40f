//! The drift tests: a node to which Lace applied a plan, as the reconciler's memory holds it
//! (built from notifications), then changed: Lace's own echoes and foreign changes are not
//! drift, changes to what Lace applied are.

use netlink_packet_core::{NetlinkMessage, NLM_F_REPLACE};
use netlink_packet_route::link::{LinkAttribute, LinkFlags};
use netlink_packet_route::route::{RouteMessage, RouteProtocol};
use netlink_packet_route::rule::{RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::*;
use crate::dataplane::diff::diff;
use crate::dataplane::fixtures::{
    addr_msg, bare_host, desired, index_in, link, link_of, model, msg, notified,
};
use crate::dataplane::observe::HostRoutes;
use crate::dataplane::observed::KernelNexthop;
use crate::dataplane::watch::cache::Cache;
use crate::plan::{RouteKey, MAIN_TABLE};

/// `ip route add <dst> dev <dev> table <table>`: a foreign route (`proto boot`).
fn foreign_route(o: &ObservedNode, table: u32, dst: &str, dev: &str) -> RouteMessage {
    let key = RouteKey::new(table, dst.parse().unwrap());
    let mut r =
        crate::dataplane::msg::route(&key, Some(&KernelNexthop::Dev(dev.into())), &index_in(o))
            .unwrap();
    r.header.protocol = RouteProtocol::Boot;
    r
}

fn replacing(mut m: NetlinkMessage<RouteNetlinkMessage>) -> NetlinkMessage<RouteNetlinkMessage> {
    m.header.flags |= NLM_F_REPLACE;
    m
}

/// A node to which Lace applied `desired(true)`, as its memory holds it (built from
/// notifications), and what Lace applied.
fn applied() -> (Cache, Applied, ObservedNode) {
    let d = desired(true);
    let mut o = bare_host();
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    model(&mut o, &ops);
    let mut c = Cache::new(
        ObservedNode {
            sysctls: o.sysctls.clone(),
            tunsrc: o.tunsrc,
            fou: o.fou.clone(),
            nft: o.nft.clone(),
            ..ObservedNode::default()
        },
        HostRoutes::new(),
        None,
    );
    c.apply_all(notified(&o)).unwrap();
    assert_eq!(c.node.routes, o.routes, "the memory holds what was applied");
    assert_eq!(c.node.links, o.links);
    let mut a = Applied::default();
    a.reconciled(Some(Applied::of(d, &o)));
    assert_eq!(a.drift(&c.node), None, "nothing changed yet");
    (c, a, o)
}

fn after(
    c: &mut Cache,
    a: &mut Applied,
    m: Vec<NetlinkMessage<RouteNetlinkMessage>>,
) -> Option<Drift> {
    c.apply_all(m).unwrap();
    a.drift(&c.node)
}

#[test]
fn lace_s_own_writes_echoing_back_are_not_drift() {
    let (mut c, mut a, o) = applied();
    // Every write of the apply, notified (again, late), some as replaces.
    let echoes: Vec<_> = notified(&o).into_iter().map(replacing).collect();
    assert_eq!(after(&mut c, &mut a, notified(&o)), None);
    assert_eq!(after(&mut c, &mut a, echoes), None);
}

#[test]
fn changes_to_foreign_objects_are_not_drift() {
    let (mut c, mut a, o) = applied();
    let table = 1_000_001;
    let mut down = link_of(&o, "keep0");
    down.header.flags = LinkFlags::empty();
    let mut foreign_rule = RuleMessage::default();
    foreign_rule.header.family = AddressFamily::Inet;
    foreign_rule.attributes.push(RuleAttribute::Priority(500));
    let changes = vec![
        // A foreign route in Lace's VRF table and in the main table, added and gone.
        msg(RouteNetlinkMessage::NewRoute(foreign_route(
            &o,
            table,
            "192.0.2.0/24",
            "keep0",
        ))),
        msg(RouteNetlinkMessage::NewRoute(foreign_route(
            &o,
            MAIN_TABLE,
            "203.0.113.0/24",
            "keep0",
        ))),
        msg(RouteNetlinkMessage::DelRoute(foreign_route(
            &o,
            table,
            "192.0.2.0/24",
            "keep0",
        ))),
        // A rule outside Lace's band, a foreign link going down, an address on it.
        msg(RouteNetlinkMessage::NewRule(foreign_rule.clone())),
        msg(RouteNetlinkMessage::DelRule(foreign_rule)),
        msg(RouteNetlinkMessage::NewLink(down)),
        msg(RouteNetlinkMessage::NewAddress(addr_msg(
            "198.18.0.1".parse().unwrap(),
            o.links["keep0"].index,
        ))),
    ];
    assert_eq!(after(&mut c, &mut a, changes), None);
}

#[test]
fn lace_s_objects_changed_by_someone_else_are_drift() {
    let (_, _, o) = applied();
    let (key, nh) = o
        .routes
        .iter()
        .find(|(_, nh)| matches!(nh, KernelNexthop::Seg6Encap { .. }))
        .map(|(k, nh)| (*k, nh.clone()))
        .unwrap();
    let lace =
        |nh: &KernelNexthop| crate::dataplane::msg::route(&key, Some(nh), &index_in(&o)).unwrap();
    let mut replaced_by_foreign = lace(&nh);
    replaced_by_foreign.header.protocol = RouteProtocol::Static;
    let rule = o.rules[0].rule.unwrap();
    let mut pod_down = link_of(&o, "lp-pa");
    pod_down.header.flags = LinkFlags::empty();
    let cases: Vec<(&str, Vec<NetlinkMessage<RouteNetlinkMessage>>, &str)> = vec![
        (
            "a route deleted",
            vec![msg(RouteNetlinkMessage::DelRoute(lace(&nh)))],
            "route replace",
        ),
        (
            "a route rewritten",
            vec![replacing(msg(RouteNetlinkMessage::NewRoute(lace(
                &KernelNexthop::Dev("keep0".into()),
            ))))],
            "route replace",
        ),
        (
            "a route replaced by another protocol's",
            vec![replacing(msg(RouteNetlinkMessage::NewRoute(
                replaced_by_foreign,
            )))],
            "route replace",
        ),
        (
            "a rule deleted",
            vec![msg(RouteNetlinkMessage::DelRule(
                crate::dataplane::msg::rule(&rule),
            ))],
            "rule add",
        ),
        (
            "the VRF deleted",
            vec![msg(RouteNetlinkMessage::DelLink(link_of(&o, "lv-a")))],
            "link add lv-a",
        ),
        (
            "a pod veth down (its routes flushed)",
            vec![msg(RouteNetlinkMessage::NewLink(pod_down))],
            "link set lp-pa up",
        ),
    ];
    for (what, changes, op) in cases {
        let (mut c, mut a, _) = applied();
        let drift = after(&mut c, &mut a, changes);
        assert!(
            drift
                .as_ref()
                .is_some_and(|d| d.ops > 0 && d.summary.contains(op)),
            "{what}: {drift:?}"
        );
    }
}

#[test]
fn a_pod_veth_that_appears_after_the_reconcile_looked_is_left_to_its_add() {
    let d = desired(true);
    let mut o = bare_host();
    // The reconcile looked while pod b's ADD had its address but no veth yet.
    o.links.remove("lp-pb");
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    model(&mut o, &ops);
    let mut a = Applied::default();
    a.reconciled(Some(Applied::of(d.clone(), &o)));
    // Then the veth appears (the ADD's pod side), not set up yet.
    o.links.insert("lp-pb".into(), link(5));
    assert_eq!(a.drift(&o), None, "the ADD's own work in progress");
    // The ADD's attach: now it is part of what Lace applied.
    let mut pods = d.clone();
    pods.pod_routes
        .retain(|_, nh| matches!(nh, crate::plan::Nexthop::Dev(x) | crate::plan::Nexthop::DevSrc { dev: x, .. } if x == "lp-pb"));
    let ops = crate::dataplane::diff::attach(&pods, &o, &o.tc)
        .unwrap()
        .ops;
    model(&mut o, &ops);
    a.attached(&pods);
    assert_eq!(a.drift(&o), None);
    o.routes.retain(|k, _| k.table != d.base.vrfs["lv-b"].table);
    assert!(a.drift(&o).is_some(), "pod b's routes deleted by hand");
}

/// The first pod of Network `a` brings `a`'s routes to the blocks it reaches: once attached,
/// they are part of what Lace applied (their deletion by hand is drift), not foreign routes
/// of Lace's that a reconcile would delete.
#[test]
fn a_network_s_first_pod_makes_its_routes_to_blocks_part_of_what_was_applied() {
    let d = desired(false);
    let mut none = d.clone();
    none.pod_routes.clear();
    none.served_tables.clear();
    let mut o = bare_host();
    let ops = diff(Some(&none), &o, None).unwrap().ops;
    model(&mut o, &ops);
    let mut a = Applied::default();
    a.reconciled(Some(Applied::of(none, &o)));
    let ops = crate::dataplane::diff::attach(&d, &o, &o.tc).unwrap().ops;
    model(&mut o, &ops);
    let a_table = d.base.vrfs["lv-a"].table;
    let remote = RouteKey::new(a_table, "10.1.2.0/24".parse().unwrap());
    assert!(o.routes.contains_key(&remote), "{ops:#?}");
    a.attached(&d);
    assert_eq!(a.drift(&o), None);
    o.routes.remove(&remote);
    assert!(
        a.drift(&o).is_some(),
        "a's route to n2's block deleted by hand"
    );
}

#[test]
fn a_deleted_pod_is_not_drift_and_its_retried_add_is_the_add_s() {
    let (mut c, mut a, o) = applied();
    let del = msg(RouteNetlinkMessage::DelLink(link_of(&o, "lp-pb")));
    assert_eq!(after(&mut c, &mut a, vec![del]), None, "CNI DEL");
    // A retried ADD of the same container: the veth is back, not set up yet.
    let mut back = link_of(&o, "lp-pb");
    back.attributes
        .retain(|x| !matches!(x, LinkAttribute::Controller(_)));
    back.header.flags = LinkFlags::empty();
    assert_eq!(
        after(
            &mut c,
            &mut a,
            vec![msg(RouteNetlinkMessage::NewLink(back))]
        ),
        None
    );
}

#[test]
fn notifications_that_cannot_be_followed_make_drift_without_operations() {
    let (mut c, mut a, o) = applied();
    let mut renamed = link_of(&o, "lp-pa");
    renamed
        .attributes
        .retain(|x| !matches!(x, LinkAttribute::IfName(_)));
    renamed
        .attributes
        .push(LinkAttribute::IfName("lp-zz".into()));
    assert!(c
        .apply_all(vec![msg(RouteNetlinkMessage::NewLink(renamed))])
        .is_err());
    // The session drops the memory and reports; an error of the plan itself is drift
    // too (a reconcile reports it properly).
    let mut no_uplink = c.node.clone();
    no_uplink.addrs.clear();
    let d = a.drift(&no_uplink).unwrap();
    assert_eq!(d.ops, 0);
    assert!(d.summary.contains("underlay"), "{d:?}");
}
