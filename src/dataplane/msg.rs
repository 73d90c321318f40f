//! The rtnetlink requests Lace sends, one builder per kernel object, separate from their
//! execution ([`super::nl::Nl::batch`]): the reconciler's operations ([`super::apply`]) and
//! the CNI's pod-side work ([`super::pod`]) build their messages here, so a route, an address
//! or a link change looks the same to the kernel whoever asks for it. Each builder names its
//! `ip` equivalent. Types are `netlink-packet-route` 0.34's.

use std::net::IpAddr;
use std::os::fd::RawFd;

use ipnet::IpNet;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::link::{
    InfoData, InfoIpTunnel, InfoKind, InfoVeth, InfoVrf, LinkAttribute, LinkFlags, LinkInfo,
    LinkMessage, TunnelEncapFlags, TunnelEncapType,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteLwEnCapType, RouteLwTunnelEncap, RouteMessage,
    RouteProtocol, RouteScope, RouteSeg6IpTunnel, RouteSeg6LocalTunnel, RouteType, Seg6Header,
    Seg6LocalAction, Seg6Mode,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::AddressFamily;

use super::observed::{KernelNexthop, SitLink, ROUTE_PROTOCOL};
use crate::plan::{Family, RouteKey, Rule, RuleAction as PlanRuleAction};

/// Why a request cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    /// The request names a device the caller knows no index of.
    #[error("no link named {0}")]
    NoLink(String),
    /// A route's gateway is not of its destination's address family.
    #[error("gateway {via} of another family than {dst}")]
    GatewayFamily { via: IpAddr, dst: IpNet },
    /// A next hop Lace reads but never writes ([`KernelNexthop::Unknown`]).
    #[error("cannot write route form {0}")]
    Unwritable(String),
    /// An operation that is not a netlink request (a sysctl, an nft run, ...).
    #[error("not a netlink operation")]
    NotNetlink,
}

fn family(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

/// The link called `name` (`ip link show <name>`, `ip link del <name>`): the kernel looks
/// links up by `IFLA_IFNAME` when the index is 0.
pub fn link_by_name(name: &str) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(name.to_string()));
    m
}

/// The link with index `index` (`ip link show dev <index>`).
pub fn link_by_index(index: u32) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.header.index = index;
    m
}

/// `ip link add <name> type vrf table <table>` and up.
pub fn vrf(name: &str, table: u32) -> LinkMessage {
    let mut m = link_by_name(name);
    m.header.flags = LinkFlags::Up;
    m.header.change_mask = LinkFlags::Up;
    m.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Vrf),
        LinkInfo::Data(InfoData::Vrf(vec![InfoVrf::TableId(table)])),
    ]));
    m
}

/// `ip link add <name> type dummy`, down (enslaving it to its VRF brings it up).
pub fn dummy(name: &str) -> LinkMessage {
    let mut m = link_by_name(name);
    m.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
            InfoKind::Dummy,
        )]));
    m
}

/// `ip link add <name> type ifb` and up: a pod's shaper.
pub fn ifb(name: &str) -> LinkMessage {
    let mut m = link_by_name(name);
    m.header.flags = LinkFlags::Up;
    m.header.change_mask = LinkFlags::Up;
    m.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]));
    m
}

/// `ip link add <name> mtu <mtu> type sit remote <remote|any> local <local|any> [dev <link>]
/// ttl <ttl> [no]pmtudisc encap <type> encap-sport <sport> encap-dport <dport>`, down (it is
/// brought up once the guard that protects it is in place).
pub fn sit(name: &str, sit: &SitLink, mtu: u32) -> LinkMessage {
    let any = std::net::Ipv4Addr::UNSPECIFIED;
    let mut m = link_by_name(name);
    m.header.change_mask = LinkFlags::Up;
    m.attributes.push(LinkAttribute::Mtu(mtu));
    let mut data = vec![
        InfoIpTunnel::Remote(IpAddr::V4(sit.remote.unwrap_or(any))),
        InfoIpTunnel::Local(IpAddr::V4(sit.local.unwrap_or(any))),
        InfoIpTunnel::Ttl(sit.ttl),
        InfoIpTunnel::PMtuDisc(sit.pmtudisc),
        InfoIpTunnel::EncapType(TunnelEncapType::from(sit.encap_type)),
        InfoIpTunnel::EncapSPort(sit.encap_sport),
        InfoIpTunnel::EncapDPort(sit.encap_dport),
        InfoIpTunnel::EncapFlags(TunnelEncapFlags::from_bits_retain(sit.encap_flags)),
    ];
    if sit.link != 0 {
        data.push(InfoIpTunnel::Link(sit.link));
    }
    m.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::SitTun),
        LinkInfo::Data(InfoData::IpTunnel(data)),
    ]));
    m
}

/// `ip link set <name> mtu <mtu>`.
pub fn set_mtu(name: &str, mtu: u32) -> LinkMessage {
    let mut m = link_by_name(name);
    m.attributes.push(LinkAttribute::Mtu(mtu));
    m
}

/// `ip link set <name> up`.
pub fn link_up(name: &str) -> LinkMessage {
    let mut m = link_by_name(name);
    m.header.flags = LinkFlags::Up;
    m.header.change_mask = LinkFlags::Up;
    m
}

/// `ip link set dev <index> master <master> up`: the kernel enslaves first, then brings the
/// link up, so a link that was down is not cycled.
pub fn enslave_up(index: u32, master: u32) -> LinkMessage {
    let mut m = link_by_index(index);
    m.header.flags = LinkFlags::Up;
    m.header.change_mask = LinkFlags::Up;
    m.attributes.push(LinkAttribute::Controller(master));
    m
}

/// `ip link add <name> mtu <mtu> type veth peer name <peer> mtu <mtu> address <peer_mac>
/// netns <peer_ns>`: one request makes the pair with the peer already in the namespace of
/// file descriptor `peer_ns`.
pub fn veth(name: &str, peer: &str, mtu: u32, peer_mac: [u8; 6], peer_ns: RawFd) -> LinkMessage {
    let mut p = link_by_name(peer);
    p.attributes.push(LinkAttribute::Mtu(mtu));
    p.attributes.push(LinkAttribute::Address(peer_mac.to_vec()));
    p.attributes.push(LinkAttribute::NetNsFd(peer_ns));
    let mut m = link_by_name(name);
    m.attributes.push(LinkAttribute::Mtu(mtu));
    m.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Veth),
        LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(p))),
    ]));
    m
}

/// `ip addr add <addr> dev <index>`, with `nodad` for IPv6: usable at once (no duplicate
/// address detection), as a route `src` or a pod's only address must not be tentative.
pub fn address(index: u32, addr: &IpNet) -> AddressMessage {
    let mut m = AddressMessage::default();
    m.header.family = family(addr.addr());
    m.header.prefix_len = addr.prefix_len();
    m.header.index = index;
    m.attributes.push(AddressAttribute::Address(addr.addr()));
    if addr.addr().is_ipv4() {
        // IPv4 requires the local address (what `ip` sends as both).
        m.attributes.push(AddressAttribute::Local(addr.addr()));
    } else {
        m.header.flags = AddressHeaderFlags::Nodad;
        m.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    m
}

/// `ip neigh replace <ip> lladdr <mac> dev <index> nud permanent` (send with
/// `NLM_F_CREATE | NLM_F_REPLACE`).
pub fn permanent_neighbour(index: u32, ip: IpAddr, mac: &[u8]) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = family(ip);
    m.header.ifindex = index;
    m.header.state = NeighbourState::Permanent;
    m.header.kind = RouteType::Unspec;
    m.attributes.push(NeighbourAttribute::Destination(match ip {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    }));
    m.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
    m
}

/// A route of Lace's: protocol [`ROUTE_PROTOCOL`], the key's table and metric, and (when
/// adding) the next hop, devices resolved by `idx` (`None`: no such link); e.g. `ip route
/// replace <dst> table <table> dev <dev> proto 76 metric <metric>`. Deletions carry the
/// protocol, so the kernel never removes a foreign route.
pub fn route(
    key: &RouteKey,
    nh: Option<&KernelNexthop>,
    idx: &dyn Fn(&str) -> Option<u32>,
) -> Result<RouteMessage, MsgError> {
    let index = |dev: &str| idx(dev).ok_or_else(|| MsgError::NoLink(dev.to_string()));
    let mut m = RouteMessage::default();
    let h = &mut m.header;
    h.address_family = match key.dst {
        IpNet::V4(_) => AddressFamily::Inet,
        IpNet::V6(_) => AddressFamily::Inet6,
    };
    h.destination_prefix_length = key.dst.prefix_len();
    h.table = u8::try_from(key.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    h.protocol = RouteProtocol::Other(ROUTE_PROTOCOL);
    h.scope = RouteScope::Universe;
    h.kind = RouteType::Unicast;
    let a = &mut m.attributes;
    a.push(RouteAttribute::Table(key.table));
    // Also on deletes, to name the one route (IPv4's metric 0 matches any: the lowest first).
    a.push(RouteAttribute::Priority(key.metric));
    if key.dst.prefix_len() > 0 {
        a.push(RouteAttribute::Destination(RouteAddress::from(
            key.dst.network(),
        )));
    }
    let Some(nh) = nh else { return Ok(m) };
    match nh {
        KernelNexthop::Dev(dev) => {
            if matches!(key.dst, IpNet::V4(_)) {
                // What `ip route add <v4> dev X` does: a directly connected destination.
                m.header.scope = RouteScope::Link;
            }
            m.attributes.push(RouteAttribute::Oif(index(dev)?));
        }
        KernelNexthop::DevSrc { dev, src } => {
            if matches!((src, key.dst), (IpAddr::V4(_), IpNet::V4(_))) {
                m.header.scope = RouteScope::Link;
            }
            m.attributes
                .push(RouteAttribute::PrefSource(RouteAddress::from(*src)));
            m.attributes.push(RouteAttribute::Oif(index(dev)?));
        }
        KernelNexthop::Via { via, dev } => {
            if matches!(
                (via, key.dst),
                (IpAddr::V4(_), IpNet::V6(_)) | (IpAddr::V6(_), IpNet::V4(_))
            ) {
                return Err(MsgError::GatewayFamily {
                    via: *via,
                    dst: key.dst,
                });
            }
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(*via)));
            m.attributes.push(RouteAttribute::Oif(index(dev)?));
        }
        KernelNexthop::Seg6Encap { segs, dev } => {
            let mut header = Seg6Header::default();
            header.mode = Seg6Mode::Encap;
            header.segments = vec![*segs];
            m.attributes
                .push(RouteAttribute::EncapType(RouteLwEnCapType::Seg6));
            m.attributes
                .push(RouteAttribute::Encap(vec![RouteLwTunnelEncap::Seg6(
                    RouteSeg6IpTunnel::Seg6(header),
                )]));
            m.attributes.push(RouteAttribute::Oif(index(dev)?));
        }
        KernelNexthop::Seg6LocalDt46 { vrf_table, dev } => {
            m.attributes
                .push(RouteAttribute::EncapType(RouteLwEnCapType::Seg6Local));
            m.attributes.push(RouteAttribute::Encap(vec![
                RouteLwTunnelEncap::Seg6Local(RouteSeg6LocalTunnel::Action(
                    Seg6LocalAction::EndDt46,
                )),
                RouteLwTunnelEncap::Seg6Local(RouteSeg6LocalTunnel::VrfTable(*vrf_table)),
            ]));
            m.attributes.push(RouteAttribute::Oif(index(dev)?));
        }
        KernelNexthop::Unreachable => m.header.kind = RouteType::Unreachable,
        KernelNexthop::Unknown(s) => return Err(MsgError::Unwritable(s.clone())),
    }
    Ok(m)
}

/// `ip route del <dst> table <table> proto 76 metric <metric>` (`unreachable` when `nh` is):
/// any scope, so link-scope device routes match too.
pub fn route_delete(key: &RouteKey, nh: &KernelNexthop) -> RouteMessage {
    // Without a next hop the builder never fails.
    let mut m = route(key, None, &|_| Some(0)).unwrap_or_default();
    // IPv4 matches the scope on delete unless it is "nowhere" (any): Lace's device routes
    // have scope link, the others universe.
    m.header.scope = RouteScope::NoWhere;
    if *nh == KernelNexthop::Unreachable {
        m.header.kind = RouteType::Unreachable;
    }
    m
}

/// A rule of Lace's: `ip rule add pref <p> l3mdev`, `ip rule add pref <p> fwmark <m>/<mask>
/// lookup <table> proto 76`, `ip rule add pref <p> iif lo lookup <table> proto 76` or
/// `ip -6 rule add pref <p> to <prefix> lookup <table> proto 76`. The l3mdev rule has table 0 (the VRF driver's own form); tables
/// above 255 go in the `FRA_TABLE` attribute. Rules are Lace's by their priority band; the
/// protocol only helps a human reading `ip rule`.
pub fn rule(r: &Rule) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = match r.family {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    };
    m.header.action = RuleAction::ToTable;
    m.header.table = 0;
    m.attributes.push(RuleAttribute::Priority(r.priority));
    match r.action {
        PlanRuleAction::L3mdev => {
            // Exactly the VRF driver's rule (protocol kernel), so the kernel sees a duplicate
            // (EEXIST) instead of adding a second copy next to the one it made.
            m.attributes
                .push(RuleAttribute::Protocol(RouteProtocol::Kernel));
            m.attributes.push(RuleAttribute::L3MDev(true));
        }
        PlanRuleAction::Fwmark { mark, mask, table } => {
            m.attributes
                .push(RuleAttribute::Protocol(RouteProtocol::Other(
                    ROUTE_PROTOCOL,
                )));
            m.attributes.push(RuleAttribute::Table(table));
            m.attributes.push(RuleAttribute::FwMark(mark));
            m.attributes.push(RuleAttribute::FwMask(mask));
        }
        PlanRuleAction::FromHost { table } => {
            m.attributes
                .push(RuleAttribute::Protocol(RouteProtocol::Other(
                    ROUTE_PROTOCOL,
                )));
            m.attributes.push(RuleAttribute::Table(table));
            m.attributes.push(RuleAttribute::Iifname("lo".into()));
        }
        PlanRuleAction::ToPrefix { dst, table } => {
            m.header.dst_len = dst.prefix_len();
            m.attributes
                .push(RuleAttribute::Protocol(RouteProtocol::Other(
                    ROUTE_PROTOCOL,
                )));
            m.attributes.push(RuleAttribute::Table(table));
            m.attributes
                .push(RuleAttribute::Destination(dst.network().into()));
        }
    }
    m
}
