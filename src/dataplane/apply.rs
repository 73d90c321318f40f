//! Runs [`Op`]s phase by phase. The netlink operations of one phase go out as one batch
//! ([`Nl::batch`]); after a phase with a failure nothing more is applied.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_route::link::{TunnelEncapFlags, TunnelEncapType};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteLwEnCapType, RouteLwTunnelEncap, RouteMessage,
    RouteProtocol, RouteScope, RouteSeg6IpTunnel, RouteSeg6LocalTunnel, RouteType, Seg6Header,
    Seg6LocalAction, Seg6Mode,
};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{LinkSit, LinkUnspec, LinkVrf};

use super::diff::Op;
use super::nl::Nl;
use super::{host, nft, observe, KernelNexthop, ObservedNode, OpFailure, ROUTE_PROTOCOL};
use crate::plan::{Family, RouteKey, Rule, RuleAction as PlanRuleAction};

/// Applies `ops` (in diff order); returns the number of writes issued and the failures.
pub fn apply(nl: &mut Nl, observed: &ObservedNode, ops: Vec<Op>) -> (u64, Vec<OpFailure>) {
    let mut index: HashMap<String, u32> = observed
        .links
        .iter()
        .map(|(n, l)| (n.clone(), l.index))
        .collect();
    let mut writes = 0u64;
    let mut failures = Vec::new();
    let mut links_changed = false;
    let mut ops = ops.into_iter().peekable();
    while let Some(first) = ops.next() {
        let phase = first.phase();
        let mut group = vec![first];
        while let Some(op) = ops.next_if(|o| o.phase() == phase) {
            group.push(op);
        }
        // Link indices of VRFs created in an earlier phase.
        if links_changed && phase >= 3 {
            links_changed = false;
            match observe::link_indices(nl) {
                Ok(i) => index = i,
                Err(e) => {
                    failures.push(OpFailure {
                        op: "reading link indices after creating VRFs".into(),
                        error: e.to_string(),
                    });
                    break;
                }
            }
        }
        links_changed |= phase <= 2;
        // A `sit` device with `encap fou` needs the fou module's encapsulation registered.
        if group.iter().any(|o| matches!(o, Op::AddTunnel { .. })) {
            if let Err(e) = super::fou::load() {
                failures.push(OpFailure {
                    op: "loading the kernel's fou support (for the SRv6-over-IPv4 device)".into(),
                    error: e,
                });
                break;
            }
        }
        let mut requests = Vec::new();
        let mut sent: Vec<Op> = Vec::new();
        for op in group {
            match op {
                Op::Sysctl { ref key, ref value } => {
                    writes += 1;
                    if let Err(e) = host::write_sysctl(key, value) {
                        failures.push(fail(&op, e));
                    }
                }
                Op::Tunsrc(a) => {
                    writes += 1;
                    if let Err(e) = super::seg6::tunsrc_set(a) {
                        failures.push(fail(&op, e));
                    }
                }
                Op::NftSwap { ref script, .. } | Op::NftElements { ref script, .. } => {
                    writes += 1;
                    if let Err(e) = nft::apply(script) {
                        failures.push(fail(&op, e));
                    }
                }
                Op::NftDelete => {
                    writes += 1;
                    if let Err(e) = nft::apply(&nft::delete_script()) {
                        failures.push(fail(&op, e));
                    }
                }
                Op::AddFou { listener, replace } => {
                    writes += 1 + u64::from(replace);
                    let done = match replace {
                        true => super::fou::del(listener.port, listener.family),
                        false => Ok(()),
                    }
                    .and_then(|()| super::fou::add(listener));
                    if let Err(e) = done {
                        failures.push(fail(&op, e));
                    }
                }
                Op::DelFou { listener } => {
                    writes += 1;
                    if let Err(e) = super::fou::del(listener.port, listener.family) {
                        failures.push(fail(&op, e));
                    }
                }
                _ => match message(&op, &index) {
                    Ok(m) => {
                        requests.push(m);
                        sent.push(op);
                    }
                    Err(e) => failures.push(fail(&op, e)),
                },
            }
        }
        if !requests.is_empty() {
            writes += requests.len() as u64;
            match nl.batch(requests) {
                Ok(acks) => {
                    for (op, ack) in sent.iter().zip(acks) {
                        if let Err(errno) = ack {
                            if !idempotent(op, errno) {
                                failures.push(fail(op, errno_text(errno)));
                            }
                        }
                    }
                }
                Err(e) => failures.push(OpFailure {
                    op: format!("{} netlink request(s), first: {}", sent.len(), sent[0]),
                    error: e.to_string(),
                }),
            }
        }
        if !failures.is_empty() {
            break;
        }
    }
    (writes, failures)
}

fn fail(op: &Op, error: impl Into<String>) -> OpFailure {
    OpFailure {
        op: op.to_string(),
        error: error.into(),
    }
}

fn errno_text(errno: i32) -> String {
    format!(
        "{} (errno {errno})",
        std::io::Error::from_raw_os_error(errno)
    )
}

/// The errors that mean "already as wanted": creating what exists, deleting what is gone.
fn idempotent(op: &Op, errno: i32) -> bool {
    match op {
        Op::AddVrf { .. } | Op::AddRule(_) | Op::AddAddress { .. } => errno == libc::EEXIST,
        // IPv4 answers a missing route with ESRCH, IPv6 with ENOENT; a deleted VRF takes its
        // device routes with it.
        Op::DelRoute { .. } | Op::DelRule(_) => errno == libc::ENOENT || errno == libc::ESRCH,
        Op::DelLink { .. } | Op::ReplaceLink { .. } => {
            errno == libc::ENODEV || errno == libc::ENOENT
        }
        _ => false,
    }
}

fn link_by_name(name: &str) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(name.to_string()));
    m
}

/// The netlink request (and its extra flags) for a netlink operation.
fn message(op: &Op, index: &HashMap<String, u32>) -> Result<(RouteNetlinkMessage, u16), String> {
    let idx = |name: &str| {
        index
            .get(name)
            .copied()
            .ok_or_else(|| format!("no link named {name}"))
    };
    Ok(match op {
        Op::AddVrf { name, table } => (
            RouteNetlinkMessage::NewLink(LinkVrf::new(name, *table).up().build()),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::AddTunnel { name, sit, mtu } => {
            let mut b = LinkSit::new(name)
                .mtu(*mtu)
                .remote(sit.remote.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED))
                .local(sit.local.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED))
                .ttl(sit.ttl)
                .pmtudisc(sit.pmtudisc)
                .encap_type(TunnelEncapType::from(sit.encap_type))
                .encap_sport(sit.encap_sport)
                .encap_dport(sit.encap_dport)
                .encap_flags(TunnelEncapFlags::from_bits_retain(sit.encap_flags));
            if sit.link != 0 {
                b = b.dev(sit.link);
            }
            (
                RouteNetlinkMessage::NewLink(b.down().build()),
                NLM_F_CREATE | NLM_F_EXCL,
            )
        }
        Op::LinkUp { name } | Op::TunnelUp { name } => (
            RouteNetlinkMessage::SetLink(LinkUnspec::new_with_name(name).up().build()),
            0,
        ),
        Op::SetMtu { name, mtu } => (
            RouteNetlinkMessage::SetLink(LinkUnspec::new_with_name(name).mtu(*mtu).build()),
            0,
        ),
        Op::SetMaster { link, master } => (
            RouteNetlinkMessage::SetLink(
                LinkUnspec::new_with_index(idx(link)?)
                    .controller(idx(master)?)
                    .build(),
            ),
            0,
        ),
        Op::AddAddress { link, addr } => (
            RouteNetlinkMessage::NewAddress(address_message(idx(link)?, addr)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::ReplaceLink { name } | Op::DelLink { name } => {
            (RouteNetlinkMessage::DelLink(link_by_name(name)), 0)
        }
        Op::AddRule(r) => (
            RouteNetlinkMessage::NewRule(rule_message(r)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::DelRule(r) => (RouteNetlinkMessage::DelRule(r.raw.clone()), 0),
        Op::PutRoute { key, nh } => (
            RouteNetlinkMessage::NewRoute(route_message(key, Some(nh), &idx)?),
            NLM_F_CREATE | NLM_F_REPLACE,
        ),
        Op::DelRoute { key, nh } => {
            let mut m = route_message(key, None, &idx)?;
            // IPv4 matches the scope on delete unless it is "nowhere" (any): Lace's device
            // routes have scope link, the others universe.
            m.header.scope = RouteScope::NoWhere;
            if *nh == KernelNexthop::Unreachable {
                m.header.kind = RouteType::Unreachable;
            }
            (RouteNetlinkMessage::DelRoute(m), 0)
        }
        Op::Sysctl { .. }
        | Op::Tunsrc(_)
        | Op::NftSwap { .. }
        | Op::NftElements { .. }
        | Op::NftDelete
        | Op::AddFou { .. }
        | Op::DelFou { .. } => return Err("not a netlink operation".into()),
    })
}

/// A route of Lace's: protocol [`ROUTE_PROTOCOL`], the key's table, and (when adding) the
/// next hop. Deletions carry the protocol, so the kernel never removes a foreign route.
pub(super) fn route_message(
    key: &RouteKey,
    nh: Option<&KernelNexthop>,
    idx: &dyn Fn(&str) -> Result<u32, String>,
) -> Result<RouteMessage, String> {
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
            m.attributes.push(RouteAttribute::Oif(idx(dev)?));
        }
        KernelNexthop::DevSrc { dev, src } => {
            if matches!((src, key.dst), (IpAddr::V4(_), IpNet::V4(_))) {
                m.header.scope = RouteScope::Link;
            }
            m.attributes
                .push(RouteAttribute::PrefSource(RouteAddress::from(*src)));
            m.attributes.push(RouteAttribute::Oif(idx(dev)?));
        }
        KernelNexthop::Via { via, dev } => {
            if matches!(
                (via, key.dst),
                (IpAddr::V4(_), IpNet::V6(_)) | (IpAddr::V6(_), IpNet::V4(_))
            ) {
                return Err(format!("gateway {via} of another family than {}", key.dst));
            }
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(*via)));
            m.attributes.push(RouteAttribute::Oif(idx(dev)?));
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
            m.attributes.push(RouteAttribute::Oif(idx(dev)?));
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
            m.attributes.push(RouteAttribute::Oif(idx(dev)?));
        }
        KernelNexthop::Unreachable => m.header.kind = RouteType::Unreachable,
        KernelNexthop::Unknown(s) => return Err(format!("cannot write route form {s}")),
    }
    Ok(m)
}

/// `ip addr add <addr> dev <index> nodad`: usable at once (no duplicate address detection),
/// as a route `src` must not be tentative.
fn address_message(index: u32, addr: &IpNet) -> AddressMessage {
    let mut m = AddressMessage::default();
    m.header.family = match addr {
        IpNet::V4(_) => AddressFamily::Inet,
        IpNet::V6(_) => AddressFamily::Inet6,
    };
    m.header.prefix_len = addr.prefix_len();
    m.header.index = index;
    m.header.flags = AddressHeaderFlags::Nodad;
    m.attributes.push(AddressAttribute::Address(addr.addr()));
    m.attributes
        .push(AddressAttribute::Flags(AddressFlags::Nodad));
    m
}

/// A rule of Lace's. The l3mdev rule has table 0 (the VRF driver's own form); tables above
/// 255 go in the `FRA_TABLE` attribute. Rules are Lace's by their priority band; the protocol
/// only helps a human reading `ip rule`.
fn rule_message(r: &Rule) -> RuleMessage {
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
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::underlay::{Ipv4Tunnel, FOU_PORT, IPV4_TUNNEL};
    use rtnetlink::packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};

    /// What the reconciler writes for the SRv6-over-IPv4 device reads back as what it planned
    /// (the netns tests check that the kernel's answer does too: re-applying writes nothing).
    #[test]
    fn the_tunnel_written_reads_back_as_planned() {
        let t = Ipv4Tunnel {
            local: "192.0.2.1".parse().unwrap(),
            address: None,
        };
        let sit = super::super::tunnel::planned_sit(&t);
        let op = Op::AddTunnel {
            name: IPV4_TUNNEL.into(),
            sit,
            mtu: 1472,
        };
        let (RouteNetlinkMessage::NewLink(m), flags) = message(&op, &HashMap::new()).unwrap()
        else {
            panic!("not a NewLink");
        };
        assert_eq!(flags, NLM_F_CREATE | NLM_F_EXCL);
        // Through the bytes the kernel gets, and back.
        let mut msg = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::from(RouteNetlinkMessage::NewLink(m)),
        );
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        let back = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf).unwrap();
        let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) = back.payload else {
            panic!("not a NewLink");
        };
        let (name, link) = observe::parse_link(&m).unwrap();
        assert_eq!(name, IPV4_TUNNEL);
        assert_eq!(link.sit, Some(sit));
        assert_eq!(link.mtu, 1472);
        assert!(!link.up, "created down, brought up after the ruleset");
        assert_eq!(sit.encap_dport, FOU_PORT);
        assert_eq!(sit.local, Some(t.local));
        assert_eq!(op.to_string(), "link add lu-ipv4 mtu 1472 type sit remote any local 192.0.2.1 ttl 0 pmtudisc encap 1 encap-sport 0 encap-dport 6076");
    }
}
