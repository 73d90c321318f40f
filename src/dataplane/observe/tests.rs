//! Links read from their bytes ([`link_message`]) against the same decoded whole, and the
//! tables a dump for a plan reads.

use std::collections::BTreeMap;

use netlink_packet_core::{Emitable, Parseable};
use netlink_packet_route::link::{
    AfSpecInet6, AfSpecUnspec, Inet6IfaceFlags, InfoData, InfoIpTunnel, InfoKind, InfoVrf,
    LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};

use super::{link_message, parse_link};
use crate::plan::MAIN_TABLE;

const TABLE: u32 = 1_000_005;

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
