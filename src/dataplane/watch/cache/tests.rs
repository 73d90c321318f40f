//! The cache's tests: notifications replayed into a node, in order, change it as the kernel
//! changes itself (the routes a link takes with it, the sources that go), and a stream it
//! cannot follow is an error.

use std::net::Ipv4Addr;

use ipnet::IpNet;
use netlink_packet_core::{DoneMessage, NetlinkHeader};
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVrf, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::rule::{RuleAttribute, RuleMessage};
use netlink_packet_route::AddressFamily;

use super::*;
use crate::dataplane::fixtures::{addr_msg, msg};
use crate::dataplane::observed::{HostRoute, KernelRoutes};
use crate::plan::MAIN_TABLE;

const VRF_TABLE: u32 = 1_000_001;
/// Links of the test node: (name, index, VRF table).
const LINKS: [(&str, u32, Option<u32>); 4] = [
    ("lo", 1, None),
    ("eth0", 2, None),
    ("lp-a", 4, None),
    ("lv-a", 10, Some(VRF_TABLE)),
];

fn link_msg(name: &str, index: u32, up: bool) -> LinkMessage {
    let mut l = LinkMessage::default();
    l.header.index = index;
    if up {
        l.header.flags = LinkFlags::Up;
    }
    l.attributes.push(LinkAttribute::IfName(name.into()));
    if let Some((_, _, Some(t))) = LINKS.iter().find(|(n, ..)| *n == name) {
        l.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Vrf),
            LinkInfo::Data(InfoData::Vrf(vec![InfoVrf::TableId(*t)])),
        ]));
    }
    l
}

fn index_of(name: &str) -> Option<u32> {
    LINKS.iter().find(|(n, ..)| *n == name).map(|(_, i, _)| *i)
}

/// A route as Lace writes it (what the kernel notifies has the same meaning).
fn lace_route(key: RouteKey, nh: &KernelNexthop) -> RouteMessage {
    crate::dataplane::msg::route(&key, Some(nh), &index_of).unwrap()
}

/// `default via <gw> dev eth0 metric <metric>` in the main table, not Lace's.
fn host_route(gw: [u8; 4], metric: u32) -> RouteMessage {
    let mut r = RouteMessage::default();
    r.header.address_family = AddressFamily::Inet;
    r.header.table = 254;
    r.header.kind = netlink_packet_route::route::RouteType::Unicast;
    r.attributes.push(RouteAttribute::Table(MAIN_TABLE));
    r.attributes
        .push(RouteAttribute::Gateway(RouteAddress::from(IpAddr::from(
            gw,
        ))));
    r.attributes.push(RouteAttribute::Oif(2));
    r.attributes.push(RouteAttribute::Priority(metric));
    r
}

fn key(table: u32, dst: &str) -> RouteKey {
    RouteKey::new(table, dst.parse::<IpNet>().unwrap())
}

fn v4(s: &str) -> IpAddr {
    IpAddr::V4(s.parse::<Ipv4Addr>().unwrap())
}

/// The routes of the test node: one through each link, and one through none.
fn routes() -> Vec<(RouteKey, KernelNexthop)> {
    vec![
        (
            key(VRF_TABLE, "10.1.1.10/32"),
            KernelNexthop::Dev("lp-a".into()),
        ),
        (
            key(VRF_TABLE, "10.1.2.0/24"),
            KernelNexthop::Seg6Encap {
                segs: "2001:db8:100::2:1:0".parse().unwrap(),
                dev: "eth0".into(),
            },
        ),
        (
            key(MAIN_TABLE, "2001:db8:100::1:1:0/128"),
            KernelNexthop::Seg6LocalDt46 {
                vrf_table: VRF_TABLE,
                dev: "lv-a".into(),
            },
        ),
        (
            key(MAIN_TABLE, "2001:db8:ff::/64"),
            KernelNexthop::Via {
                via: "2001:db8:ff::9".parse().unwrap(),
                dev: "eth0".into(),
            },
        ),
        (
            key(crate::plan::PROBE_TABLE, "10.1.1.10/32"),
            KernelNexthop::DevSrc {
                dev: "lp-a".into(),
                src: v4("192.0.2.1"),
            },
        ),
        (key(VRF_TABLE, "0.0.0.0/0"), KernelNexthop::Unreachable),
    ]
}

/// The test node as a dump would find it, built by replaying notifications into an
/// empty cache.
fn node() -> Cache {
    let mut c = Cache::new(ObservedNode::default(), HostRoutes::new(), None);
    let mut m: Vec<_> = LINKS
        .iter()
        .map(|(n, i, _)| msg(RouteNetlinkMessage::NewLink(link_msg(n, *i, true))))
        .collect();
    for (ip, i) in [
        (v4("10.9.0.1"), 2),
        ("2001:db8:ff::1".parse().unwrap(), 2),
        (v4("192.0.2.1"), 1),
    ] {
        m.push(msg(RouteNetlinkMessage::NewAddress(addr_msg(ip, i))));
    }
    for (k, nh) in routes() {
        m.push(msg(RouteNetlinkMessage::NewRoute(lace_route(k, &nh))));
    }
    m.push(msg(RouteNetlinkMessage::NewRoute(host_route(
        [10, 9, 0, 254],
        0,
    ))));
    c.apply_all(m).unwrap();
    c
}

fn has(c: &Cache, k: &str) -> bool {
    c.node.routes.keys().any(|x| x.dst.to_string() == k)
}

#[test]
fn replayed_notifications_build_what_lace_wrote() {
    let c = node();
    assert_eq!(
        c.node.routes,
        routes().into_iter().collect::<KernelRoutes>(),
        "every route Lace writes reads back as the same next hop"
    );
    assert_eq!(c.node.links["lv-a"].vrf_table, Some(VRF_TABLE));
    assert_eq!(c.node.link_name(4), Some("lp-a"));
    assert_eq!(
        c.node.host_routes,
        vec![HostRoute {
            dst: "0.0.0.0/0".parse().unwrap(),
            gateway: Some(v4("10.9.0.254")),
            dev: Some("eth0".into())
        }]
    );
}

#[test]
fn changes_apply_in_order() {
    let mut c = node();
    let k = key(VRF_TABLE, "10.7.0.0/16");
    let a = KernelNexthop::Dev("lp-a".into());
    let b = KernelNexthop::Dev("eth0".into());
    let new = |nh| msg(RouteNetlinkMessage::NewRoute(lace_route(k, nh)));
    let del = |nh| msg(RouteNetlinkMessage::DelRoute(lace_route(k, nh)));
    c.apply_all(vec![new(&a), del(&a)]).unwrap();
    assert!(!c.node.routes.contains_key(&k), "added then deleted");
    c.apply_all(vec![del(&a), new(&a), new(&b)]).unwrap();
    assert_eq!(c.node.routes[&k], b, "the later replace wins");
}

#[test]
fn a_deleted_link_takes_its_routes_and_addresses_and_nothing_else() {
    let mut c = node();
    c.apply_all(vec![msg(RouteNetlinkMessage::DelLink(link_msg(
        "lp-a", 4, false,
    )))])
    .unwrap();
    assert!(!c.node.links.contains_key("lp-a"));
    assert!(
        !has(&c, "10.1.1.10/32"),
        "both routes through lp-a are gone"
    );
    assert_eq!(c.node.routes.len(), routes().len() - 2);
    // The VRF goes too: its seg6local route, not the VRF table's routes via other links.
    c.apply_all(vec![msg(RouteNetlinkMessage::DelLink(link_msg(
        "lv-a", 10, true,
    )))])
    .unwrap();
    assert!(!has(&c, "2001:db8:100::1:1:0/128"));
    assert!(has(&c, "10.1.2.0/24") && has(&c, "0.0.0.0/0"));
    c.apply_all(vec![msg(RouteNetlinkMessage::DelLink(link_msg(
        "eth0", 2, true,
    )))])
    .unwrap();
    assert!(
        !c.node.addrs.iter().any(|(_, i)| *i == 2),
        "eth0's addresses went with it"
    );
    assert!(
        c.node.host_routes.is_empty(),
        "the host's default via eth0 too"
    );
    assert_eq!(
        c.node.routes.keys().collect::<Vec<_>>(),
        vec![&key(VRF_TABLE, "0.0.0.0/0")],
        "only the unreachable route is through no link"
    );
}

#[test]
fn a_link_going_down_takes_its_routes_and_coming_up_brings_none_back() {
    let mut c = node();
    let down = msg(RouteNetlinkMessage::NewLink(link_msg("eth0", 2, false)));
    let up = msg(RouteNetlinkMessage::NewLink(link_msg("eth0", 2, true)));
    c.apply_all(vec![down, up]).unwrap();
    assert!(c.node.links["eth0"].up);
    assert!(!has(&c, "10.1.2.0/24") && !has(&c, "2001:db8:ff::/64"));
    assert!(c.node.host_routes.is_empty());
    assert!(has(&c, "10.1.1.10/32"), "lp-a's routes stay");
    // A link notified again while up (e.g. a new master) keeps its routes.
    let mut c = node();
    c.apply_all(vec![msg(RouteNetlinkMessage::NewLink(link_msg(
        "lp-a", 4, true,
    )))])
    .unwrap();
    assert_eq!(c.node.routes.len(), routes().len());
}

#[test]
fn the_last_ipv4_address_of_a_link_takes_its_ipv4_routes() {
    let mut c = node();
    let add = msg(RouteNetlinkMessage::NewAddress(addr_msg(v4("10.9.0.2"), 2)));
    let del = |ip| msg(RouteNetlinkMessage::DelAddress(addr_msg(v4(ip), 2)));
    c.apply_all(vec![add, del("10.9.0.1")]).unwrap();
    assert_eq!(
        c.node.routes.len(),
        routes().len(),
        "eth0 still has 10.9.0.2"
    );
    c.apply_all(vec![del("10.9.0.2")]).unwrap();
    assert!(!has(&c, "10.1.2.0/24"), "IPv4 via eth0 gone");
    assert!(c.node.host_routes.is_empty());
    assert!(has(&c, "2001:db8:ff::/64"), "IPv6 via eth0 stays");
}

#[test]
fn a_source_address_going_away_marks_its_routes_for_rewriting() {
    let mut c = node();
    c.apply_all(vec![msg(RouteNetlinkMessage::DelAddress(addr_msg(
        v4("192.0.2.1"),
        1,
    )))])
    .unwrap();
    let k = key(crate::plan::PROBE_TABLE, "10.1.1.10/32");
    assert!(
        matches!(&c.node.routes[&k], KernelNexthop::Unknown(s) if s.contains("192.0.2.1")),
        "{:?}",
        c.node.routes[&k]
    );
    assert_eq!(
        c.node
            .routes
            .values()
            .filter(|nh| matches!(nh, KernelNexthop::Unknown(_)))
            .count(),
        1
    );
}

#[test]
fn host_routes_are_replaced_by_identity() {
    let mut c = node();
    let gw = |n: &Cache| {
        let mut g: Vec<_> = n.node.host_routes.iter().map(|h| h.gateway).collect();
        g.sort();
        g
    };
    c.apply_all(vec![
        msg(RouteNetlinkMessage::NewRoute(host_route(
            [10, 9, 0, 253],
            0,
        ))),
        msg(RouteNetlinkMessage::NewRoute(host_route(
            [10, 9, 0, 252],
            100,
        ))),
    ])
    .unwrap();
    assert_eq!(
        gw(&c),
        [Some(v4("10.9.0.252")), Some(v4("10.9.0.253"))],
        "the first replaced, the second added"
    );
    c.apply_all(vec![msg(RouteNetlinkMessage::DelRoute(host_route(
        [10, 9, 0, 253],
        0,
    )))])
    .unwrap();
    assert_eq!(gw(&c), [Some(v4("10.9.0.252"))]);
}

#[test]
fn one_prefix_through_several_links_is_several_host_routes_until_replaced() {
    let mut c = node();
    let via = |oif: u32| {
        let mut r = host_route([10, 9, 0, 254], 0);
        r.attributes
            .retain(|a| !matches!(a, RouteAttribute::Oif(_)));
        r.attributes.push(RouteAttribute::Oif(oif));
        r
    };
    let devs = |c: &Cache| {
        let mut d: Vec<_> = c.node.host_routes.iter().map(|h| h.dev.clone()).collect();
        d.sort();
        d
    };
    c.apply_all(vec![msg(RouteNetlinkMessage::NewRoute(via(4)))])
        .unwrap();
    assert_eq!(devs(&c), [Some("eth0".into()), Some("lp-a".into())]);
    c.apply_all(vec![msg(RouteNetlinkMessage::DelRoute(via(4)))])
        .unwrap();
    assert_eq!(
        devs(&c),
        [Some("eth0".to_string())],
        "the other link's stays"
    );
    let mut replace = msg(RouteNetlinkMessage::NewRoute(via(4)));
    replace.header.flags |= NLM_F_REPLACE;
    c.apply_all(vec![replace]).unwrap();
    assert_eq!(
        devs(&c),
        [Some("lp-a".to_string())],
        "replaced, whatever its link"
    );
}

#[test]
fn addresses_under_duplicate_detection_are_not_usable_yet() {
    use netlink_packet_route::address::AddressFlags;
    let mut c = node();
    let ip: IpAddr = "2001:db8:ff::5".parse().unwrap();
    let mut tentative = addr_msg(ip, 2);
    tentative
        .attributes
        .push(AddressAttribute::Flags(AddressFlags::Tentative));
    c.apply_all(vec![msg(RouteNetlinkMessage::NewAddress(
        tentative.clone(),
    ))])
    .unwrap();
    assert!(!c.node.addrs.contains(&(ip, 2)));
    c.apply_all(vec![msg(RouteNetlinkMessage::NewAddress(addr_msg(ip, 2)))])
        .unwrap();
    assert!(c.node.addrs.contains(&(ip, 2)), "detection completed");
    c.apply_all(vec![msg(RouteNetlinkMessage::NewAddress(tentative))])
        .unwrap();
    assert!(!c.node.addrs.contains(&(ip, 2)), "detection restarted");
}

#[test]
fn rules_follow_and_multicast_rules_are_not_lace_s() {
    let mut c = node();
    let rule = |family| {
        let mut r = RuleMessage::default();
        r.header.family = family;
        r.attributes.push(RuleAttribute::Priority(1000));
        r.attributes.push(RuleAttribute::L3MDev(true));
        r
    };
    c.apply_all(vec![
        msg(RouteNetlinkMessage::NewRule(rule(AddressFamily::Inet))),
        msg(RouteNetlinkMessage::NewRule(rule(AddressFamily::Other(
            128,
        )))),
        msg(RouteNetlinkMessage::NewRule(rule(AddressFamily::Inet))),
    ])
    .unwrap();
    assert_eq!(c.node.rules.len(), 1, "{:?}", c.node.rules);
    c.apply_all(vec![msg(RouteNetlinkMessage::DelRule(rule(
        AddressFamily::Inet,
    )))])
    .unwrap();
    assert!(c.node.rules.is_empty());
}

#[test]
fn renames_and_unexpected_messages_make_the_stream_untrusted() {
    let mut c = node();
    let err = c
        .apply_all(vec![msg(RouteNetlinkMessage::NewLink(link_msg(
            "lp-b", 4, true,
        )))])
        .unwrap_err();
    assert!(err.contains("lp-a was renamed lp-b"), "{err}");
    let err = c
        .apply_all(vec![msg(RouteNetlinkMessage::NewLink(link_msg(
            "lp-a", 5, true,
        )))])
        .unwrap_err();
    assert!(err.contains("lp-a has index 5"), "{err}");
    let err = c
        .apply_all(vec![msg(RouteNetlinkMessage::NewNeighbour(
            NeighbourMessage::default(),
        ))])
        .unwrap_err();
    assert!(err.contains("unexpected notification"), "{err}");
    let mut done = NetlinkMessage::new(
        NetlinkHeader::default(),
        NetlinkPayload::<RouteNetlinkMessage>::Done(DoneMessage::default()),
    );
    done.finalize();
    assert!(c.apply_all(vec![done]).is_err());
    // A route notification shorter than `struct rtmsg`: read from its bytes, it fails.
    let mut short = Vec::new();
    short.extend(20u32.to_ne_bytes());
    short.extend(libc::RTM_NEWROUTE.to_ne_bytes());
    short.extend([0; 14]); // flags, sequence, port; 4 bytes of payload
    let err = c
        .apply_stream(crate::dataplane::nl::RawMessages::new(&short))
        .unwrap_err();
    assert!(err.contains("a notified route"), "{err}");
}

#[test]
fn forgetting_what_an_apply_deleted() {
    let mut c = node();
    let k = key(VRF_TABLE, "10.1.2.0/24");
    c.forget(Deleted::Route(k));
    assert!(!c.node.routes.contains_key(&k));
    c.forget(Deleted::Link("lv-a".into()));
    assert!(!c.node.links.contains_key("lv-a"));
    assert!(!has(&c, "2001:db8:100::1:1:0/128"));
    assert!(c.node.link_name(10).is_none());
}

/// A cache covers the tables its dump read, and of any other table only none of Lace's; a
/// cache of every table covers all.
#[test]
fn a_cache_covers_the_lace_tables_its_dump_read() {
    let read = [MAIN_TABLE, VRF_TABLE].into();
    let c = Cache::new(ObservedNode::default(), HostRoutes::new(), Some(read));
    assert!(c.covers(Some(&[VRF_TABLE].into())));
    assert!(
        c.covers(Some(&[MAIN_TABLE, VRF_TABLE, 100].into())),
        "100 is not Lace's"
    );
    assert!(!c.covers(Some(&[VRF_TABLE, VRF_TABLE + 1].into())));
    assert!(!c.covers(None), "a job that needs every table");
    let all = Cache::new(ObservedNode::default(), HostRoutes::new(), None);
    assert!(all.covers(None));
    assert!(all.covers(Some(&[VRF_TABLE + 1].into())));
}
