//! Route classification from a message's bytes ([`RouteFields::parse`]) against the same
//! message decoded whole: every kind of route Lace writes, the kernel's attribute order, an
//! attribute Lace does not read, a host route, a foreign one and a cached clone, and seg6
//! routes in forms Lace never writes (which the fast read of the encapsulation leaves to the
//! library's parse). The one-pass read of a remote block's route ([`remote_block_route`])
//! against the general read, for the kernel's layout and every departure from it.

use std::collections::BTreeMap;

use netlink_packet_core::Emitable;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteCacheInfo, RouteFlags, RouteLwEnCapType, RouteLwTunnelEncap,
    RouteMessage, RouteProtocol, RouteScope, RouteSeg6IpTunnel, RouteType, Seg6Header, Seg6Mode,
};

use super::{classify_route, remote_block_route, route_from_bytes, Route, RouteFields};
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
    edit_seg6(&mut m, edit);
    as_the_kernel_sends(m)
}

/// Applies `edit` to the seg6 header of `m`'s encapsulation.
fn edit_seg6(m: &mut RouteMessage, edit: impl Fn(&mut Seg6Header)) {
    for a in &mut m.attributes {
        if let RouteAttribute::Encap(e) = a {
            for x in e.iter_mut() {
                if let RouteLwTunnelEncap::Seg6(RouteSeg6IpTunnel::Seg6(h)) = x {
                    edit(h);
                }
            }
        }
    }
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

/// Lace's route to a remote block as the kernel dumps and notifies it (`fib_dump_info`):
/// the table, the destination (none for a default route) and the priority (none when 0),
/// the output link, then the encapsulation and its type.
fn as_the_kernel_dumps(key: &RouteKey) -> RouteMessage {
    let nh = KernelNexthop::Seg6Encap {
        segs: "fd00:0:0:2::1".parse().unwrap(),
        dev: "eth0".into(),
    };
    let mut m = msg::route(key, Some(&nh), &index).unwrap();
    m.attributes.retain(|a| match a {
        RouteAttribute::Destination(_) => key.dst.prefix_len() > 0,
        RouteAttribute::Priority(p) => *p != 0,
        _ => true,
    });
    m.attributes.sort_by_key(|a| match a {
        RouteAttribute::Table(_) => 0,
        RouteAttribute::Destination(_) => 1,
        RouteAttribute::Priority(_) => 2,
        RouteAttribute::Oif(_) => 3,
        RouteAttribute::Encap(_) => 4,
        RouteAttribute::EncapType(_) => 5,
        _ => 6,
    });
    m
}

/// What the general read makes of `payload`: the route, or that it is malformed.
fn read_in_general(payload: &[u8]) -> Option<Route> {
    RouteFields::parse(payload)
        .ok()
        .map(|f| classify_route(&f, &names()))
}

#[test]
fn a_remote_blocks_route_as_the_kernel_sends_it_is_read_in_one_pass_as_in_general() {
    let segs = "fd00:0:0:2::1".parse().unwrap();
    for (dst, metric, table) in [
        ("10.1.2.0/24", 17, TABLE),
        ("10.1.2.3/32", 1, TABLE + 49),
        ("10.0.0.0/8", u32::MAX, MAIN_TABLE),
        ("0.0.0.0/0", 5, TABLE),
    ] {
        let key = RouteKey {
            table,
            dst: dst.parse().unwrap(),
            metric,
        };
        let nh = KernelNexthop::Seg6Encap {
            segs,
            dev: "eth0".into(),
        };
        let whole = bytes(&as_the_kernel_dumps(&key));
        // The last attribute's padding may be cut off with the message.
        for payload in [&whole[..], &whole[..whole.len() - 2]] {
            let read = remote_block_route(payload, &names());
            assert_eq!(read, Some((key, nh.clone())), "{dst}");
            assert_eq!(read_in_general(payload), Some(Route::Lace(key, nh.clone())));
            assert_eq!(
                route_from_bytes(payload, &names()).unwrap(),
                Route::Lace(key, nh.clone())
            );
        }
        // Cut anywhere else, it is not read in one pass.
        for len in 0..whole.len() - 2 {
            assert_eq!(
                remote_block_route(&whole[..len], &names()),
                None,
                "{len} bytes"
            );
        }
    }
}

#[test]
fn every_other_form_of_a_route_is_left_to_the_general_read() {
    let key = RouteKey {
        table: TABLE,
        dst: "10.1.2.0/24".parse().unwrap(),
        metric: 17,
    };
    type Edit = Box<dyn Fn(&mut RouteMessage)>;
    let attr = |edit: fn(&mut RouteAttribute)| -> Edit {
        Box::new(move |m| m.attributes.iter_mut().for_each(edit))
    };
    let seg6 = |edit: fn(&mut Seg6Header)| -> Edit { Box::new(move |m| edit_seg6(m, edit)) };
    let edits: Vec<(&str, Edit)> = vec![
        (
            "a metric of 0: no priority",
            Box::new(|m| {
                m.attributes
                    .retain(|a| !matches!(a, RouteAttribute::Priority(_)))
            }),
        ),
        (
            "a cached clone",
            Box::new(|m| m.header.flags = RouteFlags::Cloned),
        ),
        (
            "its uplink down (RTNH_F_LINKDOWN)",
            Box::new(|m| m.header.flags = RouteFlags::from_bits_retain(16)),
        ),
        (
            "another protocol",
            Box::new(|m| m.header.protocol = RouteProtocol::Boot),
        ),
        ("a TOS", Box::new(|m| m.header.tos = 4)),
        (
            "scope link",
            Box::new(|m| m.header.scope = RouteScope::Link),
        ),
        (
            "unreachable",
            Box::new(|m| m.header.kind = RouteType::Unreachable),
        ),
        (
            "a destination longer than IPv4's",
            Box::new(|m| m.header.destination_prefix_length = 33),
        ),
        (
            "a source prefix",
            Box::new(|m| m.header.source_prefix_length = 8),
        ),
        (
            "IPv6",
            Box::new(|m| {
                m.header.address_family = netlink_packet_route::AddressFamily::Inet6;
                m.header.destination_prefix_length = 64;
                for a in &mut m.attributes {
                    if let RouteAttribute::Destination(d) = a {
                        *d = RouteAddress::Inet6("fd00:1::".parse().unwrap());
                    }
                }
            }),
        ),
        (
            "a cache info after the rest",
            Box::new(|m| {
                m.attributes.push(RouteAttribute::CacheInfo(
                    RouteCacheInfo::parse(&[0; 32]).unwrap(),
                ))
            }),
        ),
        (
            "the type before the encapsulation (as Lace writes it)",
            Box::new(|m| m.attributes.swap(4, 5)),
        ),
        (
            "a gateway",
            Box::new(|m| {
                m.attributes.insert(
                    3,
                    RouteAttribute::Gateway(RouteAddress::Inet("192.168.1.1".parse().unwrap())),
                )
            }),
        ),
        (
            "an output link not in the names",
            attr(|a| {
                if let RouteAttribute::Oif(i) = a {
                    *i = 99
                }
            }),
        ),
        (
            "a table not Lace's",
            attr(|a| {
                if let RouteAttribute::Table(t) = a {
                    *t = 5
                }
            }),
        ),
        (
            "another encapsulation type",
            attr(|a| {
                if let RouteAttribute::EncapType(t) = a {
                    *t = RouteLwEnCapType::Seg6Local
                }
            }),
        ),
        ("mode inline", seg6(|h| h.mode = Seg6Mode::Inline)),
        (
            "two segments",
            seg6(|h| h.segments.insert(0, "fd00:0:0:3::1".parse().unwrap())),
        ),
        ("an HMAC TLV", seg6(|h| h.hmac = Some(7))),
    ];
    assert!(remote_block_route(&bytes(&as_the_kernel_dumps(&key)), &names()).is_some());
    for (what, edit) in edits {
        let mut m = as_the_kernel_dumps(&key);
        edit(&mut m);
        let payload = bytes(&m);
        assert_eq!(remote_block_route(&payload, &names()), None, "{what}");
        assert_eq!(
            route_from_bytes(&payload, &names()).ok(),
            read_in_general(&payload),
            "{what}"
        );
    }
}
