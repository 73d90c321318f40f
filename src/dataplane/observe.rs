//! Reads the namespace's kernel state: links and IPv6 addresses (to name things and find the
//! uplink), Lace's routes and rules (by protocol, table and priority band), the host's
//! main-table routes (to resolve host routing), the plan's sysctls, `ip sr tunsrc` and the nft
//! table.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{
    InfoData, InfoVrf, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteLwTunnelEncap, RouteMessage, RouteProtocol,
    RouteSeg6IpTunnel, RouteSeg6LocalTunnel, RouteType, Seg6LocalAction,
};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};

use super::nl::{Nl, NlError};
use super::{host, HostRoute, KernelNexthop, ObservedLink, ObservedNode, ObservedRule};
use crate::plan::{
    Family, RouteKey, Rule, RuleAction as PlanRuleAction, MAIN_TABLE, PROBE_TABLE,
    RULE_PRIORITY_L3MDEV, RULE_PRIORITY_PROBE, VRF_TABLE_BASE,
};

/// What could not be observed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error(transparent)]
    Netlink(#[from] NlError),
    #[error("nft: {0}")]
    Nft(String),
    #[error("ip sr tunsrc: {0}")]
    Tunsrc(String),
}

/// Whether table id `table` is one Lace owns routes in.
pub fn lace_table(table: u32) -> bool {
    table == MAIN_TABLE || (VRF_TABLE_BASE..=PROBE_TABLE).contains(&table)
}

/// Observes everything; `sysctls` are the keys to read.
pub fn observe(nl: &mut Nl, sysctls: &BTreeSet<String>) -> Result<ObservedNode, ObserveError> {
    let links = dump_links(nl)?;
    let addrs = dump_addrs(nl)?;
    let names: BTreeMap<u32, String> = links.iter().map(|(n, l)| (l.index, n.clone())).collect();
    let mut routes = BTreeMap::new();
    let mut host_routes = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        for m in nl.dump("routes", RouteNetlinkMessage::GetRoute(req))? {
            let RouteNetlinkMessage::NewRoute(r) = m else {
                continue;
            };
            classify_route(&r, &names, &mut routes, &mut host_routes);
        }
    }
    let mut rules = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = RuleMessage::default();
        req.header.family = family;
        for m in nl.dump("rules", RouteNetlinkMessage::GetRule(req))? {
            let RouteNetlinkMessage::NewRule(r) = m else {
                continue;
            };
            if let Some(rule) = classify_rule(r) {
                rules.push(rule);
            }
        }
    }
    let sysctls = sysctls
        .iter()
        .map(|k| (k.clone(), host::read_sysctl(k)))
        .collect();
    Ok(ObservedNode {
        links,
        addrs,
        routes,
        host_routes,
        rules,
        sysctls,
        tunsrc: super::seg6::tunsrc_get().map_err(ObserveError::Tunsrc)?,
        nft: super::nft::observe().map_err(ObserveError::Nft)?,
    })
}

fn dump_links(nl: &mut Nl) -> Result<BTreeMap<String, ObservedLink>, NlError> {
    let mut out = BTreeMap::new();
    for m in nl.dump(
        "links",
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    )? {
        let RouteNetlinkMessage::NewLink(l) = m else {
            continue;
        };
        let mut name = None;
        let mut master = None;
        let mut vrf_table = None;
        for a in &l.attributes {
            match a {
                LinkAttribute::IfName(n) => name = Some(n.clone()),
                LinkAttribute::Controller(m) => master = Some(*m),
                LinkAttribute::LinkInfo(infos) => {
                    for i in infos {
                        if let LinkInfo::Data(InfoData::Vrf(v)) = i {
                            for x in v {
                                if let InfoVrf::TableId(t) = x {
                                    vrf_table = Some(*t);
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(name) = name {
            out.insert(
                name,
                ObservedLink {
                    index: l.header.index,
                    vrf_table,
                    master,
                    up: l.header.flags.contains(LinkFlags::Up),
                },
            );
        }
    }
    Ok(out)
}

fn dump_addrs(nl: &mut Nl) -> Result<Vec<(IpAddr, u32)>, NlError> {
    let mut out = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = AddressMessage::default();
        req.header.family = family;
        for m in nl.dump("addresses", RouteNetlinkMessage::GetAddress(req))? {
            let RouteNetlinkMessage::NewAddress(a) = m else {
                continue;
            };
            for attr in &a.attributes {
                // IFA_LOCAL is the local address on point-to-point links; IFA_ADDRESS otherwise.
                if let AddressAttribute::Local(ip) | AddressAttribute::Address(ip) = attr {
                    if !out.contains(&(*ip, a.header.index)) {
                        out.push((*ip, a.header.index));
                    }
                }
            }
        }
    }
    Ok(out)
}

fn addr_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// Sorts a dumped route into Lace's routes, the host's main-table routes, or neither.
fn classify_route(
    r: &RouteMessage,
    names: &BTreeMap<u32, String>,
    routes: &mut BTreeMap<RouteKey, KernelNexthop>,
    host_routes: &mut Vec<HostRoute>,
) {
    let mut table = u32::from(r.header.table);
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    let mut encap = None;
    let mut src = None;
    for a in &r.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(d) => dst = addr_of(d),
            RouteAttribute::Gateway(g) => gateway = addr_of(g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Encap(e) => encap = Some(e),
            RouteAttribute::PrefSource(p) => src = addr_of(p),
            _ => {}
        }
    }
    let len = r.header.destination_prefix_length;
    let dst = match (r.header.address_family, dst) {
        (_, Some(IpAddr::V4(a))) => Ipv4Net::new(a, len).ok().map(IpNet::V4),
        (_, Some(IpAddr::V6(a))) => Ipv6Net::new(a, len).ok().map(IpNet::V6),
        (AddressFamily::Inet, None) => Some(IpNet::V4(
            Ipv4Net::new(Ipv4Addr::UNSPECIFIED, 0).unwrap_or_default(),
        )),
        (AddressFamily::Inet6, None) => Some(IpNet::V6(
            Ipv6Net::new(Ipv6Addr::UNSPECIFIED, 0).unwrap_or_default(),
        )),
        _ => None,
    };
    let Some(dst) = dst else { return };
    let dev = oif.and_then(|i| names.get(&i).cloned());
    if r.header.protocol != RouteProtocol::Other(super::ROUTE_PROTOCOL) {
        if table == MAIN_TABLE && r.header.kind == RouteType::Unicast {
            host_routes.push(HostRoute { dst, gateway, dev });
        }
        return;
    }
    if !lace_table(table) {
        return;
    }
    let nh = match (r.header.kind, encap, gateway, dev) {
        (RouteType::Unreachable, ..) => KernelNexthop::Unreachable,
        (RouteType::Unicast, Some(e), None, Some(dev)) => parse_encap(e, dev),
        (RouteType::Unicast, None, Some(via), Some(dev)) => KernelNexthop::Via { via, dev },
        (RouteType::Unicast, None, None, Some(dev)) => match src {
            Some(src) => KernelNexthop::DevSrc { dev, src },
            None => KernelNexthop::Dev(dev),
        },
        (kind, e, g, d) => {
            KernelNexthop::Unknown(format!("type {kind:?} encap {e:?} gateway {g:?} dev {d:?}"))
        }
    };
    routes.insert(RouteKey { table, dst }, nh);
}

fn parse_encap(e: &[RouteLwTunnelEncap], dev: String) -> KernelNexthop {
    let mut segs = None;
    let mut action = None;
    let mut vrf_table = None;
    for x in e {
        match x {
            RouteLwTunnelEncap::Seg6(RouteSeg6IpTunnel::Seg6(h)) if h.segments.len() == 1 => {
                segs = h.segments.first().copied();
            }
            RouteLwTunnelEncap::Seg6Local(RouteSeg6LocalTunnel::Action(a)) => action = Some(*a),
            RouteLwTunnelEncap::Seg6Local(RouteSeg6LocalTunnel::VrfTable(t)) => {
                vrf_table = Some(*t)
            }
            _ => {}
        }
    }
    match (segs, action, vrf_table) {
        (Some(segs), None, None) => KernelNexthop::Seg6Encap { segs, dev },
        (None, Some(Seg6LocalAction::EndDt46), Some(vrf_table)) => {
            KernelNexthop::Seg6LocalDt46 { vrf_table, dev }
        }
        _ => KernelNexthop::Unknown(format!("encap {e:?} dev {dev}")),
    }
}

/// A rule in Lace's band, recognized as one of the planner's kinds when it is exactly one.
fn classify_rule(r: RuleMessage) -> Option<ObservedRule> {
    let mut priority = 0;
    let mut l3mdev = false;
    let mut table = u32::from(r.header.table);
    let mut mark = None;
    let mut mask = None;
    let mut other = false;
    for a in &r.attributes {
        match a {
            RuleAttribute::Priority(p) => priority = *p,
            RuleAttribute::L3MDev(on) => l3mdev = *on,
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::FwMark(m) => mark = Some(*m),
            RuleAttribute::FwMask(m) => mask = Some(*m),
            // Always reported; u32::MAX (-1) means "no suppression".
            RuleAttribute::SuppressPrefixLen(u32::MAX) | RuleAttribute::Protocol(_) => {}
            _ => other = true,
        }
    }
    if !(RULE_PRIORITY_PROBE..=RULE_PRIORITY_L3MDEV).contains(&priority) {
        return None;
    }
    let family = match r.header.family {
        AddressFamily::Inet => Family::V4,
        AddressFamily::Inet6 => Family::V6,
        _ => return Some(ObservedRule { rule: None, raw: r }),
    };
    let plain = !other
        && r.header.action == RuleAction::ToTable
        && r.header.dst_len == 0
        && r.header.src_len == 0
        && r.header.tos == 0
        && r.header.flags.is_empty();
    let action = match (plain, l3mdev, mark, mask) {
        (true, true, None, None) => Some(PlanRuleAction::L3mdev),
        (true, false, Some(mark), Some(mask)) => Some(PlanRuleAction::Fwmark { mark, mask, table }),
        _ => None,
    };
    Some(ObservedRule {
        rule: action.map(|action| Rule {
            priority,
            family,
            action,
        }),
        raw: r,
    })
}

/// Link name → index, re-read after VRFs were created.
pub fn link_indices(nl: &mut Nl) -> Result<std::collections::HashMap<String, u32>, NlError> {
    Ok(dump_links(nl)?
        .into_iter()
        .map(|(n, l)| (n, l.index))
        .collect())
}
