//! Shared test fixtures of the dataplane: a cluster and its plan for node `n1`, a bare host
//! as observation finds it, a fake kernel ([`model`]) that applies operations the way the
//! reconciler's writes change the next observation, and the notifications the kernel would
//! send to describe a node. The diff's, the drift's and the cache's tests build on them.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVrf, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::observed::{
    HostRoute, KernelRoutes, LinkTc, NftState, ObservedLink, ObservedNode, ObservedRule,
    ObservedTbf, Redirect, RootQdisc,
};
use super::op::Op;
use crate::api::{
    NetworkAllocationSpec, NetworkRoutingPolicySpec, NetworkSpec, NodeAllocationSpec, Subnet,
};
use crate::plan::{plan, DesiredNode, MAIN_TABLE};
use crate::state::{ClusterState, ObjectKey, PodAttachment};

/// The link holding node `n1`'s underlay address.
pub const UPLINK: &str = "eth0";
/// The link of the host's default route.
pub const EGRESS: &str = "inet0";

/// The underlay IPv6 address of node `n<i>`.
pub fn ul(i: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, i)
}

/// Two nodes; `a` reaches itself and the external `internet`, `b` reaches nothing.
pub fn state(with_b: bool) -> ClusterState {
    let mut s = ClusterState::default();
    let nets: &[(&str, u8, u16)] = if with_b {
        &[("a", 1, 1), ("b", 2, 2)]
    } else {
        &[("a", 1, 1)]
    };
    for &(name, o, f) in nets {
        s.networks.insert(
            name.into(),
            NetworkSpec {
                subnets: vec![Subnet {
                    cidr: format!("10.{o}.0.0/16").parse().unwrap(),
                    block_prefix: 24,
                }],
                external: false,
                host_access: false,
            },
        );
        s.network_allocations
            .insert(name.into(), NetworkAllocationSpec { function: f });
    }
    s.networks.insert(
        "internet".into(),
        NetworkSpec {
            subnets: vec![],
            external: true,
            host_access: false,
        },
    );
    for (n, f, t) in [("a-a", "a", "a"), ("a-inet", "a", "internet")] {
        s.network_routes.insert(
            n.into(),
            NetworkRoutingPolicySpec {
                from: f.into(),
                to: t.into(),
            },
        );
    }
    for i in 1..=2u16 {
        s.node_allocations.insert(
            format!("n{i}"),
            NodeAllocationSpec {
                // Index i + 1: block i of every subnet (10.<o>.<i>.0/24).
                index: u32::from(i) + 1,
                locator: format!("2001:db8:100::{i}:0:0/96").parse().unwrap(),
                underlay: crate::api::Underlay {
                    ipv4: None,
                    ipv6: Some(ul(i)),
                },
            },
        );
    }
    s
}

pub fn desired(with_b: bool) -> DesiredNode {
    let mut pods = vec![PodAttachment {
        pod: ObjectKey::new("ns", "pa"),
        container_id: "c1".into(),
        host_ifname: "lp-pa".into(),
        network: "a".into(),
        ips: vec!["10.1.1.10/32".parse().unwrap()],
        host_ports: Vec::new(),
        bandwidth: None,
    }];
    if with_b {
        pods.push(PodAttachment {
            pod: ObjectKey::new("ns", "pb"),
            container_id: "c2".into(),
            host_ifname: "lp-pb".into(),
            network: "b".into(),
            ips: vec!["10.2.1.10/32".parse().unwrap()],
            host_ports: Vec::new(),
            bandwidth: None,
        });
    }
    plan("n1", &state(with_b), &pods).unwrap()
}

pub fn link(index: u32) -> ObservedLink {
    ObservedLink {
        index,
        vrf_table: None,
        sit: None,
        dummy: false,
        master: None,
        up: true,
        mtu: 1500,
    }
}

/// A host with an uplink, an egress link with the default route, the pod veths, and a
/// foreign link: nothing of Lace's.
pub fn bare_host() -> ObservedNode {
    ObservedNode {
        links: [
            ("lo", 1),
            (UPLINK, 2),
            (EGRESS, 3),
            ("lp-pa", 4),
            ("lp-pb", 5),
            ("keep0", 6),
        ]
        .into_iter()
        .map(|(n, i)| (n.to_string(), link(i)))
        .collect(),
        addrs: vec![(IpAddr::V6(ul(1)), 2)],
        routes: KernelRoutes::default(),
        host_routes: vec![
            HostRoute {
                dst: "0.0.0.0/0".parse().unwrap(),
                gateway: Some("198.51.100.2".parse().unwrap()),
                dev: Some(EGRESS.into()),
            },
            HostRoute {
                dst: "198.51.100.0/24".parse().unwrap(),
                gateway: None,
                dev: Some(EGRESS.into()),
            },
        ],
        rules: vec![],
        sysctls: BTreeMap::new(),
        tunsrc: None,
        nft: NftState::Absent,
        fou: None,
        tc: BTreeMap::new(),
    }
}

/// A fake kernel: applies `ops` to `o` the way the reconciler's writes change what the
/// next observation returns.
pub fn model(o: &mut ObservedNode, ops: &[Op]) {
    for op in ops {
        match op {
            Op::ReplaceLink { name } | Op::DelLink { name } => {
                o.tc.remove(name);
                if let Some(l) = o.links.remove(name) {
                    // Its addresses and the routes through it go with it.
                    o.addrs.retain(|(_, i)| *i != l.index);
                    o.routes.retain(|_, nh| nh.dev() != Some(name.as_str()));
                }
                // The fou ports are read only while a tunnel device exists.
                if matches!(op, Op::DelLink { .. }) && o.tunnels().next().is_none() {
                    o.fou = None;
                }
            }
            Op::AddVrf { name, table } => {
                let index = 100 + o.links.len() as u32;
                o.links.insert(
                    name.clone(),
                    ObservedLink {
                        vrf_table: Some(*table),
                        ..link(index)
                    },
                );
            }
            Op::AddDummy { name } => {
                let index = 100 + o.links.len() as u32;
                o.links.insert(
                    name.clone(),
                    ObservedLink {
                        dummy: true,
                        up: false,
                        ..link(index)
                    },
                );
            }
            Op::AddTunnel { name, sit, mtu } => {
                let index = 100 + o.links.len() as u32;
                o.links.insert(
                    name.clone(),
                    ObservedLink {
                        sit: Some(*sit),
                        up: false,
                        mtu: *mtu,
                        ..link(index)
                    },
                );
                // The kernel reads the fou ports once a tunnel exists.
                o.fou.get_or_insert_with(Vec::new);
            }
            Op::LinkUp { name } | Op::TunnelUp { name } => o.links.get_mut(name).unwrap().up = true,
            Op::SetMtu { name, mtu } => o.links.get_mut(name).unwrap().mtu = *mtu,
            Op::AddFou { listener, .. } => {
                let l = o.fou.get_or_insert_with(Vec::new);
                l.retain(|x| x.port != listener.port);
                l.push(*listener);
            }
            Op::DelFou { listener } => {
                if let Some(l) = &mut o.fou {
                    l.retain(|x| x.port != listener.port);
                }
            }
            Op::SetMaster { link, master } => {
                let m = o.links[master].index;
                let l = o.links.get_mut(link).unwrap();
                l.master = Some(m);
                // Enslaving an up link cycles it: its link-local addresses go.
                let (index, up) = (l.index, l.up);
                l.up = true;
                o.addrs
                    .retain(|(a, i)| !(up && *i == index && is_link_local(a)));
            }
            Op::AddAddress { link, addr } => {
                let index = o.links[link].index;
                o.addrs.push((addr.addr(), index));
            }
            Op::DelAddress { link, addr } => {
                let index = o.links[link].index;
                o.addrs.retain(|e| *e != (addr.addr(), index));
            }
            Op::Sysctl { key, value } => {
                o.sysctls.insert(key.clone(), Some(value.clone()));
            }
            Op::Tunsrc(a) => o.tunsrc = Some(*a),
            Op::NftSwap { tag, .. } | Op::NftUpdate { tag, .. } => {
                o.nft = NftState::Present {
                    tag: Some(tag.clone()),
                }
            }
            Op::AddRule(r) => o.rules.push(ObservedRule {
                rule: Some(*r),
                raw: Default::default(),
            }),
            Op::PutRoute { key, nh } => {
                o.routes.insert(*key, nh.clone());
            }
            Op::DelRoute { key, .. } => {
                o.routes.remove(key);
            }
            Op::DelRule(r) => o.rules.retain(|x| x != r.as_ref()),
            Op::NftDelete => o.nft = NftState::Absent,
            Op::AddShaper { name } => {
                let index = 100 + o.links.len() as u32;
                o.links.insert(name.clone(), link(index));
            }
            Op::PutTbf { link, bucket } => {
                // The kernel keeps the bucket as the time it fills in, in 64 ns ticks.
                let ns = u128::from(bucket.burst) * 1_000_000_000 / u128::from(bucket.rate);
                o.tc.entry(link.clone()).or_default().root = Some(RootQdisc::Tbf(ObservedTbf {
                    rate: bucket.rate,
                    limit: bucket.limit,
                    buffer_ticks: u32::try_from(ns / 64).unwrap(),
                }));
            }
            Op::AddIngressQdisc { link } => o.tc.entry(link.clone()).or_default().ingress = true,
            Op::AddRedirect { link, shaper } => {
                let to = o.links[shaper].index;
                o.tc.entry(link.clone()).or_default().redirect = Some(Redirect::To(to));
            }
            Op::DelRedirect { link } => {
                if let Some(t) = o.tc.get_mut(link) {
                    t.redirect = None;
                }
            }
            Op::DelTbf { link } => {
                if let Some(t) = o.tc.get_mut(link) {
                    t.root = None;
                }
            }
            Op::DelIngressQdisc { link } => {
                if let Some(t) = o.tc.get_mut(link) {
                    (t.ingress, t.redirect) = (false, None);
                }
            }
        }
        // Observation lists only links holding some of Lace's shaping.
        o.tc.retain(|_, t| *t != LinkTc::default());
    }
}

// --- What the kernel notifies --------------------------------------------------------------

/// `m` as one notification.
pub fn msg(m: RouteNetlinkMessage) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut n = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(m));
    n.finalize();
    n
}

/// `messages` as the kernel sends them: serialized and laid end to end, each padded to 4 bytes.
pub fn datagram(messages: &[NetlinkMessage<RouteNetlinkMessage>]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for m in messages {
        let start = bytes.len();
        bytes.resize(start + m.buffer_len(), 0);
        m.serialize(&mut bytes[start..]);
        bytes.resize((bytes.len() + 3) & !3, 0);
    }
    bytes
}

/// `ip addr add <ip> dev <index>` as notified.
pub fn addr_msg(ip: IpAddr, index: u32) -> AddressMessage {
    let mut a = AddressMessage::default();
    a.header.index = index;
    a.header.family = match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    a.attributes.push(AddressAttribute::Address(ip));
    a
}

/// A link message as the kernel notifies `name` of `o`.
pub fn link_of(o: &ObservedNode, name: &str) -> LinkMessage {
    let l = &o.links[name];
    let mut m = LinkMessage::default();
    m.header.index = l.index;
    if l.up {
        m.header.flags = LinkFlags::Up;
    }
    m.attributes.push(LinkAttribute::IfName(name.into()));
    m.attributes.push(LinkAttribute::Mtu(l.mtu));
    if let Some(master) = l.master {
        m.attributes.push(LinkAttribute::Controller(master));
    }
    if let Some(t) = l.vrf_table {
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Vrf),
            LinkInfo::Data(InfoData::Vrf(vec![InfoVrf::TableId(t)])),
        ]));
    }
    m
}

/// Link indices by name, as `o` holds them.
pub fn index_in(o: &ObservedNode) -> impl Fn(&str) -> Option<u32> + '_ {
    |name| o.links.get(name).map(|l| l.index)
}

/// Everything the kernel would notify to describe `o`, as Lace's writes produce it.
pub fn notified(o: &ObservedNode) -> Vec<NetlinkMessage<RouteNetlinkMessage>> {
    let mut out: Vec<_> = o
        .links
        .keys()
        .map(|n| msg(RouteNetlinkMessage::NewLink(link_of(o, n))))
        .collect();
    for (ip, i) in &o.addrs {
        out.push(msg(RouteNetlinkMessage::NewAddress(addr_msg(*ip, *i))));
    }
    for h in &o.host_routes {
        let mut r = RouteMessage::default();
        r.header.address_family = match h.dst {
            IpNet::V4(_) => AddressFamily::Inet,
            IpNet::V6(_) => AddressFamily::Inet6,
        };
        r.header.destination_prefix_length = h.dst.prefix_len();
        r.header.table = 254;
        r.header.kind = RouteType::Unicast;
        r.header.protocol = RouteProtocol::Boot;
        r.attributes.push(RouteAttribute::Table(MAIN_TABLE));
        if h.dst.prefix_len() > 0 {
            r.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(
                    h.dst.addr(),
                )));
        }
        if let Some(gw) = h.gateway {
            r.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        if let Some(dev) = &h.dev {
            r.attributes.push(RouteAttribute::Oif(o.links[dev].index));
        }
        out.push(msg(RouteNetlinkMessage::NewRoute(r)));
    }
    for (key, nh) in &o.routes {
        let r = super::msg::route(key, Some(nh), &index_in(o)).unwrap();
        out.push(msg(RouteNetlinkMessage::NewRoute(r)));
    }
    for rule in o.rules.iter().filter_map(|r| r.rule) {
        out.push(msg(RouteNetlinkMessage::NewRule(super::msg::rule(&rule))));
    }
    out
}

/// Whether `a` is an IPv6 unicast link-local address (`fe80::/10`).
fn is_link_local(a: &IpAddr) -> bool {
    matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local())
}
