//! Route classification from a message's bytes ([`RouteFields::parse`]) against the same
//! message decoded whole: every kind of route Lace writes, the kernel's attribute order, an
//! attribute Lace does not read, a host route, a foreign one and a cached clone, and seg6
//! routes in forms Lace never writes (which the fast read of the encapsulation leaves to the
//! library's parse). Links read from their bytes ([`link_message`]) against the same decoded
//! whole.

use std::collections::BTreeMap;

use netlink_packet_core::Emitable;
use netlink_packet_route::route::{
    RouteAttribute, RouteCacheInfo, RouteFlags, RouteLwTunnelEncap, RouteMessage, RouteProtocol,
    RouteSeg6IpTunnel, Seg6Header, Seg6Mode,
};

use netlink_packet_core::Parseable;
use netlink_packet_route::link::{
    AfSpecInet6, AfSpecUnspec, Inet6IfaceFlags, InfoData, InfoIpTunnel, InfoKind, InfoVrf,
    LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};

use super::{classify_route, link_message, parse_link, Route, RouteFields};
use crate::dataplane::msg;
use crate::dataplane::observed::{HostRoute, KernelNexthop, LinkName};
use crate::plan::{RouteKey, MAIN_TABLE};

const TABLE: u32 = 1_000_005;

fn names() -> BTreeMap<u32, LinkName> {
    [(2, "eth0".into()), (7, "lv-a".into())].into()
}

fn index(dev: &str) -> Option<u32> {
    names()
        .into_iter()
        .find(|(_, n)| **n == *dev)
        .map(|(i, _)| i)
}

/// The message's payload as the kernel sends it: `struct rtmsg` and the attributes.
fn bytes(m: &RouteMessage) -> Vec<u8> {
    let mut buf = vec![0; m.buffer_len()];
    m.emit(&mut buf);
    buf
}

/// The classification from the bytes, checked equal to the whole message's.
fn classified(m: &RouteMessage) -> Route {
    let from_bytes = classify_route(&RouteFields::parse(&bytes(m)).unwrap(), &names());
    assert_eq!(
        from_bytes,
        classify_route(&m.clone().into(), &names()),
        "{m:?}"
    );
    from_bytes
}

/// What the kernel sends beside what Lace wrote: `RTA_ENCAP` before `RTA_ENCAP_TYPE` (the
/// encapsulation is parsed once its type is known) and a cache info Lace does not read.
fn as_the_kernel_sends(mut m: RouteMessage) -> RouteMessage {
    let types: Vec<_> = m
        .attributes
        .iter()
        .filter(|a| matches!(a, RouteAttribute::EncapType(_)))
        .cloned()
        .collect();
    m.attributes
        .retain(|a| !matches!(a, RouteAttribute::EncapType(_)));
    m.attributes.extend(types);
    m.attributes.push(RouteAttribute::CacheInfo(
        RouteCacheInfo::parse(&[0; 32]).unwrap(),
    ));
    m
}

#[test]
fn every_route_lace_writes_classifies_from_its_bytes_as_written() {
    let v4 = |dst: &str| RouteKey {
        table: TABLE,
        dst: dst.parse().unwrap(),
        metric: 17,
    };
    let cases = [
        (
            v4("10.1.2.0/24"),
            KernelNexthop::Seg6Encap {
                segs: "fd00:0:0:2::1".parse().unwrap(),
                dev: "eth0".into(),
            },
        ),
        (
            RouteKey {
                table: MAIN_TABLE,
                dst: "fd00:0:0:1::2/128".parse().unwrap(),
                metric: 1024,
            },
            KernelNexthop::Seg6LocalDt46 {
                vrf_table: TABLE,
                dev: "lv-a".into(),
            },
        ),
        (
            v4("10.9.0.0/16"),
            KernelNexthop::Via {
                via: "192.168.1.1".parse().unwrap(),
                dev: "eth0".into(),
            },
        ),
        (
            v4("10.1.1.5/32"),
            KernelNexthop::DevSrc {
                dev: "lv-a".into(),
                src: "10.1.1.1".parse().unwrap(),
            },
        ),
        (v4("10.1.1.6/32"), KernelNexthop::Dev("lv-a".into())),
        (v4("0.0.0.0/0"), KernelNexthop::Unreachable),
    ];
    for (key, nh) in cases {
        let m = as_the_kernel_sends(msg::route(&key, Some(&nh), &index).unwrap());
        if let KernelNexthop::Seg6Encap { segs, .. } = &nh {
            // The remote blocks' routes, most of a node's: read without the library's parse.
            let fields = RouteFields::parse(&bytes(&m)).unwrap();
            assert_eq!((fields.seg6_encap, fields.encap), (Some(*segs), None));
        }
        assert_eq!(classified(&m), Route::Lace(key, nh));
    }
}

#[test]
fn host_foreign_and_cloned_routes_classify_from_their_bytes_as_decoded() {
    let key = RouteKey {
        table: MAIN_TABLE,
        dst: "192.168.1.0/24".parse().unwrap(),
        metric: 100,
    };
    let mut host = msg::route(&key, Some(&KernelNexthop::Dev("eth0".into())), &index).unwrap();
    host.header.protocol = RouteProtocol::Kernel;
    assert_eq!(
        classified(&host),
        Route::Host(
            (key.dst, 0, 100, Some(2)),
            HostRoute {
                dst: key.dst,
                gateway: None,
                dev: Some("eth0".into()),
            }
        )
    );

    let foreign_key = RouteKey {
        table: TABLE,
        ..key
    };
    let mut foreign = msg::route(&foreign_key, None, &index).unwrap();
    foreign.header.protocol = RouteProtocol::Boot;
    assert_eq!(classified(&foreign), Route::Foreign(foreign_key));

    let mut cloned = msg::route(
        &foreign_key,
        Some(&KernelNexthop::Dev("eth0".into())),
        &index,
    )
    .unwrap();
    cloned.header.flags = RouteFlags::Cloned;
    assert_eq!(classified(&cloned), Route::Other);
}

/// A remote block's route as Lace writes it.
fn encap_route() -> RouteMessage {
    let key = RouteKey {
        table: TABLE,
        dst: "10.1.2.0/24".parse().unwrap(),
        metric: 17,
    };
    let nh = KernelNexthop::Seg6Encap {
        segs: "fd00:0:0:2::1".parse().unwrap(),
        dev: "eth0".into(),
    };
    msg::route(&key, Some(&nh), &index).unwrap()
}

#[test]
fn a_truncated_route_message_is_a_decode_error() {
    let whole = bytes(&encap_route());
    assert!(RouteFields::parse(&whole[..whole.len() - 3]).is_err());
    assert!(
        RouteFields::parse(&whole[..8]).is_err(),
        "shorter than struct rtmsg"
    );
}

/// Lace's encap route with its seg6 header changed by `edit` (as someone editing it by hand).
fn edited_seg6(edit: impl Fn(&mut Seg6Header)) -> RouteMessage {
    let mut m = encap_route();
    for a in &mut m.attributes {
        if let RouteAttribute::Encap(e) = a {
            for x in e.iter_mut() {
                if let RouteLwTunnelEncap::Seg6(RouteSeg6IpTunnel::Seg6(h)) = x {
                    edit(h);
                }
            }
        }
    }
    as_the_kernel_sends(m)
}

fn is_unknown(r: &Route) -> bool {
    matches!(r, Route::Lace(_, KernelNexthop::Unknown(_)))
}

#[test]
fn a_seg6_route_in_another_form_than_lace_writes_is_unknown_from_bytes_and_decoded() {
    let inline = edited_seg6(|h| h.mode = Seg6Mode::Inline);
    assert!(is_unknown(&classified(&inline)), "mode inline");
    let two = edited_seg6(|h| h.segments.insert(0, "fd00:0:0:3::1".parse().unwrap()));
    assert!(is_unknown(&classified(&two)), "two segments");
    let hmac = edited_seg6(|h| h.hmac = Some(7));
    assert!(is_unknown(&classified(&hmac)), "an HMAC TLV");
    let mut tunsrc = edited_seg6(|_| {});
    for a in &mut tunsrc.attributes {
        if let RouteAttribute::Encap(e) = a {
            e.push(RouteLwTunnelEncap::Seg6(RouteSeg6IpTunnel::Src(
                "fd00::9".parse().unwrap(),
            )));
        }
    }
    // A per-route tunnel source (newer kernels): Lace writes none, the route still sends to
    // its segment; the library's parse reads it.
    assert!(
        matches!(
            classified(&tunsrc),
            Route::Lace(_, KernelNexthop::Seg6Encap { .. })
        ),
        "with a tunnel source"
    );
}

#[test]
fn attributes_of_the_kernels_lengths_are_read_from_bytes_and_others_left_to_the_library() {
    let m = encap_route();
    let mut fields = RouteFields::new(m.header.clone());
    assert!(fields.read(libc::RTA_TABLE, &TABLE.to_ne_bytes()));
    assert!(fields.read(libc::RTA_PRIORITY, &17u32.to_ne_bytes()));
    assert!(fields.read(libc::RTA_DST, &[10, 1, 2, 0]));
    assert_eq!(
        (fields.table, fields.priority, fields.dst),
        (TABLE, 17, Some("10.1.2.0".parse().unwrap()))
    );
    // An IPv6 address in an IPv4 route, a priority of two bytes: not what the kernel sends,
    // the library's to judge.
    assert!(!fields.read(libc::RTA_GATEWAY, &[0; 16]));
    assert!(!fields.read(libc::RTA_PRIORITY, &[1, 0]));
    // Which rejects them: the route is a decode error, as when the library read every field.
    for (kind, value) in [
        (libc::RTA_GATEWAY, &[0u8; 16][..]),
        (libc::RTA_PRIORITY, &[1, 0]),
    ] {
        let mut edited = bytes(&m);
        let len = 4 + value.len();
        edited.extend((len as u16).to_ne_bytes());
        edited.extend(kind.to_ne_bytes());
        edited.extend(value);
        edited.resize(edited.len() + (4 - len % 4) % 4, 0);
        assert!(RouteFields::parse(&edited).is_err(), "attribute {kind}");
    }
}

/// A link as the kernel dumps it: what Lace reads (name, MTU, master, kind and its data)
/// among attributes it does not (queue, address, the address families' configuration).
fn link(index: u32, up: bool, info: Vec<LinkInfo>, master: Option<u32>) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.header.index = index;
    m.header.flags = if up {
        LinkFlags::Up
    } else {
        LinkFlags::empty()
    };
    m.attributes
        .push(LinkAttribute::IfName(format!("link{index}")));
    m.attributes.push(LinkAttribute::TxQueueLen(1000));
    m.attributes.push(LinkAttribute::Mtu(1400 + index));
    m.attributes.extend(master.map(LinkAttribute::Controller));
    m.attributes
        .push(LinkAttribute::Address(vec![2, 0, 0, 0, 0, index as u8]));
    m.attributes
        .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(
            vec![AfSpecInet6::Flags(Inet6IfaceFlags::empty())],
        )]));
    if !info.is_empty() {
        m.attributes.push(LinkAttribute::LinkInfo(info));
    }
    m.attributes.push(LinkAttribute::Group(0));
    m
}

#[test]
fn a_link_read_from_its_bytes_is_the_link_decoded_whole() {
    let links = [
        link(1, true, vec![], None),
        link(
            7,
            false,
            vec![
                LinkInfo::Kind(InfoKind::Vrf),
                LinkInfo::Data(InfoData::Vrf(vec![InfoVrf::TableId(TABLE)])),
            ],
            None,
        ),
        link(9, true, vec![LinkInfo::Kind(InfoKind::Dummy)], Some(7)),
        link(
            11,
            true,
            vec![
                LinkInfo::Kind(InfoKind::SitTun),
                LinkInfo::Data(InfoData::IpTunnel(vec![
                    InfoIpTunnel::Local("192.0.2.1".parse().unwrap()),
                    InfoIpTunnel::Link(2),
                    InfoIpTunnel::Ttl(64),
                    InfoIpTunnel::EncapDPort(5555),
                ])),
            ],
            None,
        ),
    ];
    // Kept: name and MTU, the master and the kind where there are.
    for (m, kept) in links.into_iter().zip([2, 3, 4, 3]) {
        let mut buf = vec![0; m.buffer_len()];
        m.emit(&mut buf);
        let whole = parse_link(&LinkMessage::parse(&buf).unwrap());
        let read = link_message(&buf).unwrap();
        assert!(whole.is_some());
        assert_eq!(parse_link(&read), whole, "link {}", m.header.index);
        assert_eq!(read.attributes.len(), kept, "link {}", m.header.index);
        assert!(
            link_message(&buf[..buf.len() - 3]).is_err(),
            "a cut attribute"
        );
    }
    assert!(
        link_message(&[0; 8]).is_err(),
        "shorter than struct ifinfomsg"
    );
}

/// A dump for a plan reads the plan's tables, every VRF's (one the plan dropped still holds
/// routes to delete) and the tables Lace always owns, of Lace's tables only.
#[test]
fn a_plans_dump_reads_its_tables_every_vrfs_and_laces_own() {
    use crate::dataplane::observed::ObservedLink;
    use crate::plan::{HOST_ACCESS_TABLE, PROBE_TABLE};
    let vrf = |index, table| ObservedLink {
        index,
        vrf_table: Some(table),
        sit: None,
        dummy: false,
        master: None,
        up: true,
        mtu: 65575,
    };
    let links = BTreeMap::from([
        ("lv-planned".to_string(), vrf(10, TABLE)),
        ("lv-dropped".to_string(), vrf(11, TABLE + 7)),
        ("someones-vrf".to_string(), vrf(12, 100)),
        (
            "eth0".to_string(),
            ObservedLink {
                vrf_table: None,
                ..vrf(2, 0)
            },
        ),
    ]);
    let plan = [TABLE, TABLE + 1, MAIN_TABLE, 5].into();
    assert_eq!(
        super::ipv4_tables_to_read(&plan, &links),
        [
            MAIN_TABLE,
            TABLE,
            TABLE + 1,
            TABLE + 7,
            PROBE_TABLE,
            HOST_ACCESS_TABLE
        ]
        .into()
    );
    assert_eq!(
        super::ipv4_tables_to_read(&Default::default(), &BTreeMap::new()),
        [MAIN_TABLE, PROBE_TABLE, HOST_ACCESS_TABLE].into()
    );
}
