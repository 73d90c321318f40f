//! Reads the namespace's kernel state: links and addresses (to name things and find the
//! uplinks), Lace's routes and rules (by protocol, table and priority band), the host's
//! main-table routes (to resolve host routing), the plan's sysctls, `ip sr tunsrc`, the nft
//! table, (while a Lace tunnel device exists) the fou receive ports, and the pods' shaping
//! (qdiscs and filters on pod veths and shapers).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};

use ipnet::Ipv6Net;
use netlink_packet_core::{DecodeError, ParseableParametrized};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::link::{
    InfoData, InfoIpTunnel, InfoKind, InfoVrf, LinkAttribute, LinkExtentMask, LinkFlags,
    LinkHeader, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{RouteAttribute, RouteMessage};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::nl::{Nl, NlError, RawAttrs};
use super::observed::{
    push_to_runs, HostRoute, KernelRoutes, LinkName, LinkTc, NftState, ObservedLink, ObservedNode,
    ObservedRule, Redirect, SitLink, TableRun,
};
use super::rawnl::RawNlError;
use super::tc::{self, Qdisc};
use super::{fou, host, nft, seg6};
use crate::plan::shaping::SHAPER_PREFIX;
use crate::plan::POD_LINK_PREFIX;
use crate::plan::{
    Family, Rule, RuleAction as PlanRuleAction, HOST_ACCESS_TABLE, MAIN_TABLE, PROBE_TABLE,
    RULE_PRIORITY_L3MDEV, RULE_PRIORITY_PROBE,
};
pub use route::{classify_route, lace_table, route_from_bytes, HostRouteId, Route};

/// What could not be observed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error(transparent)]
    Netlink(#[from] NlError),
    #[error("nft: {0}")]
    Nft(#[source] RawNlError),
    #[error("ip sr tunsrc: {0}")]
    Tunsrc(#[source] RawNlError),
    #[error("ip fou show: {0}")]
    Fou(#[source] RawNlError),
    #[error("tc qdisc show and tc filter show (the pods' bandwidth): {0}")]
    Tc(#[source] NlError),
}

/// Observes everything with full dumps; `sysctls` are the keys to read.
pub fn observe(nl: &mut Nl, sysctls: &BTreeSet<String>) -> Result<ObservedNode, ObserveError> {
    let (mut node, _, _) = dump(nl, None)?;
    observe_host(nl, &mut node, sysctls)?;
    Ok(node)
}

/// The host's main-table routes by identity.
pub type HostRoutes = BTreeMap<HostRouteId, HostRoute>;

/// Dumps links, addresses, routes and rules: everything of [`ObservedNode`] but what
/// [`observe_host`] reads. The host's routes also come by identity, for a cache to update.
///
/// `plan`: the tables a plan has routes, VRFs or rules in ([`crate::plan::DesiredNode::tables`]);
/// the IPv4 routes are then read from those and the others [`ipv4_tables_to_read`] adds,
/// which it returns, a dump of each table on two sockets at once ([`dump_ipv4_tables`]).
/// `None`: of every table, in one dump (and `None` is returned).
///
/// The IPv4 routes, most of a large node's, are dumped while a thread at the lowest
/// priority dumps the addresses, the IPv6 routes and the rules on a socket of its own, and
/// runs when a thread of the IPv4 dumps waits: at 5,000 x 50 an agent restart's read went
/// from 1.35-1.45 s to 1.07-1.26 s in the 6.12 test VM when it came (a 6.12 kernel fills
/// dumps at once; 6.1 takes the RTNL lock for each datagram of any).
#[allow(clippy::type_complexity)]
pub fn dump(
    nl: &mut Nl,
    plan: Option<&BTreeSet<u32>>,
) -> Result<(ObservedNode, HostRoutes, Option<BTreeSet<u32>>), ObserveError> {
    let links = dump_links(nl)?;
    let names: BTreeMap<u32, String> = links.iter().map(|(n, l)| (l.index, n.clone())).collect();
    let ipv4_tables = plan.map(|plan| ipv4_tables_to_read(plan, &links));
    // Opened here: a socket belongs to the namespace of the thread that opens it.
    let mut beside = Nl::open()?;
    let (v4, addrs, v6, rules) = std::thread::scope(|s| {
        let names = &names;
        let beside = s.spawn(move || {
            // Best effort: at the default priority the same dumps only take longer.
            let _ = crate::sys::priority::lowest_for_this_thread();
            let addrs = dump_addrs(&mut beside);
            let v6 = dump_routes(&mut beside, AddressFamily::Inet6, None, names);
            (addrs, v6, dump_rules(&mut beside))
        });
        let v4 = match &ipv4_tables {
            None => dump_routes(nl, AddressFamily::Inet, None, names),
            Some(tables) => dump_ipv4_tables(tables, names),
        }
        .map(|(runs, host)| (KernelRoutes::from_table_runs(runs), host));
        let (addrs, v6, rules) = beside
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (v4, addrs, v6, rules)
    });
    let (v4, mut host) = v4?;
    let addrs = addrs?;
    let (v6, host_v6) = v6?;
    host.extend(host_v6);
    let routes = v4.join(KernelRoutes::from_table_runs(v6));
    let rules = rules?;
    let host = HostRoutes::from_iter(host);
    let node = ObservedNode {
        links,
        addrs,
        routes,
        host_routes: host.values().cloned().collect(),
        rules,
        sysctls: BTreeMap::new(),
        tunsrc: None,
        nft: NftState::Absent,
        fou: None,
        tc: BTreeMap::new(),
    };
    Ok((node, host, ipv4_tables))
}

/// The IPv4 tables a dump for a plan with tables `plan` reads: of Lace's tables, the plan's,
/// every VRF's among `links` (a Network's VRF stays until its routes are deleted: the diff
/// deletes routes before links), and the main, probe and host-access tables. A Lace route
/// in any other table is one no rule or VRF looks up, and it is read once a plan or a VRF
/// names its table.
pub fn ipv4_tables_to_read(
    plan: &BTreeSet<u32>,
    links: &BTreeMap<String, ObservedLink>,
) -> BTreeSet<u32> {
    plan.iter()
        .copied()
        .chain(links.values().filter_map(|l| l.vrf_table))
        .chain([MAIN_TABLE, PROBE_TABLE, HOST_ACCESS_TABLE])
        .filter(|t| lace_table(*t))
        .collect()
}

/// Lace's IPv4 routes of `tables` as runs of one table each, and the host's main-table
/// routes: a dump of each table ([`Nl::open_strict`]), two at a time on two sockets, each
/// thread taking the next table left. A 6.12 kernel fills IPv4 route dumps without the RTNL
/// lock, so both CPUs of the test VM fill at once: the raw dumps of a 5,000 x 50 node's 51
/// tables took 0.46-0.59 s on two sockets against 0.70-1.07 s for one dump of every table.
#[allow(clippy::type_complexity)]
fn dump_ipv4_tables(
    tables: &BTreeSet<u32>,
    names: &BTreeMap<u32, String>,
) -> Result<(Vec<TableRun>, Vec<(HostRouteId, HostRoute)>), ObserveError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let tables: Vec<u32> = tables.iter().copied().collect();
    let next = AtomicUsize::new(0);
    let read = |mut nl: Nl| {
        let (mut lace, mut host) = (Vec::new(), Vec::new());
        while let Some(&table) = tables.get(next.fetch_add(1, Ordering::Relaxed)) {
            let (more_lace, more_host) =
                dump_routes(&mut nl, AddressFamily::Inet, Some(table), names)?;
            lace.extend(more_lace);
            host.extend(more_host);
        }
        Ok::<_, ObserveError>((lace, host))
    };
    // Opened here: a socket belongs to the namespace of the thread that opens it.
    let (first, second) = (Nl::open_strict()?, Nl::open_strict()?);
    std::thread::scope(|s| {
        let other = s.spawn(|| read(second));
        let mine = read(first);
        let other = other
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let ((mut lace, mut host), (more_lace, more_host)) = (mine?, other?);
        lace.extend(more_lace);
        host.extend(more_host);
        Ok((lace, host))
    })
}

/// Lace's routes of `family` (of table `table` alone, on a socket with strict checking:
/// none if the kernel has no such table) as runs of one table each, in the kernel's order
/// (each table in address order, the tables in the order of the kernel's hash of their
/// ids), and the host's main-table routes. `names` resolves link indices.
#[allow(clippy::type_complexity)]
fn dump_routes(
    nl: &mut Nl,
    family: AddressFamily,
    table: Option<u32>,
    names: &BTreeMap<u32, String>,
) -> Result<(Vec<TableRun>, Vec<(HostRouteId, HostRoute)>), ObserveError> {
    let mut req = RouteMessage::default();
    req.header.address_family = family;
    req.attributes.extend(table.map(RouteAttribute::Table));
    let req = RouteNetlinkMessage::GetRoute(req);
    let init = || RouteFold::new(names);
    // A table's dump is one of two read at once ([`dump_ipv4_tables`]): this thread reads it.
    let runs = match table {
        None => nl.dump_fold_split("routes", req, init, RouteFold::add),
        Some(_) => nl
            .dump_fold_here("routes", req, init, RouteFold::add)
            .map(|f| vec![f]),
    };
    let runs = match runs {
        // "ipv4: FIB table does not exist": none of its routes either.
        Err(NlError::Dump { source, .. })
            if table.is_some() && source.raw_os_error() == Some(libc::ENOENT) =>
        {
            Vec::new()
        }
        runs => runs?,
    };
    let (mut lace, mut host) = (Vec::new(), Vec::new());
    for RouteFold {
        lace: more_lace,
        host: more_host,
        ..
    } in runs
    {
        lace.extend(more_lace);
        host.extend(more_host);
    }
    Ok((lace, host))
}

/// Of the namespace's IPv4 routes that the general read ([`route::RouteFields::parse`] and
/// [`classify_route`]) takes for Lace's routes to remote blocks, how many there are, and how
/// many [`remote_block_route`](route::remote_block_route) reads in one pass, to the same
/// route. For tests (feature `testing`): the one-pass read follows the kernel's layout of
/// those routes, which only a real kernel shows.
#[cfg(feature = "testing")]
pub fn remote_block_routes_read(nl: &mut Nl) -> Result<(usize, usize), NlError> {
    use super::observed::KernelNexthop;
    use route::{remote_block_route, RouteFields};
    let names: BTreeMap<u32, LinkName> = dump_links(nl)?
        .into_iter()
        .map(|(name, l)| (l.index, name.as_str().into()))
        .collect();
    let mut req = RouteMessage::default();
    req.header.address_family = AddressFamily::Inet;
    let read = |(all, in_one_pass): &mut (usize, usize), kind, payload: &[u8]| {
        if kind != libc::RTM_NEWROUTE {
            return Ok(());
        }
        let general = RouteFields::parse(payload)
            .map(|f| classify_route(&f, &names))
            .map_err(|e| NlError::Decode(format!("a dumped route: {e}")))?;
        if let Route::Lace(key, nh @ KernelNexthop::Seg6Encap { .. }) = general {
            *all += 1;
            *in_one_pass += usize::from(remote_block_route(payload, &names) == Some((key, nh)));
        }
        Ok(())
    };
    nl.dump_fold(
        "routes",
        RouteNetlinkMessage::GetRoute(req),
        || (0, 0),
        read,
    )
}

/// What one thread of a route dump decoded: Lace's routes in runs of one table each, and the
/// host's main-table routes.
struct RouteFold {
    lace: Vec<TableRun>,
    host: Vec<(HostRouteId, HostRoute)>,
    /// The links' names by index, the fold's own: a count that two threads raised for every
    /// route would bounce between their CPUs.
    names: BTreeMap<u32, LinkName>,
}

impl RouteFold {
    fn new(names: &BTreeMap<u32, String>) -> Self {
        Self {
            lace: Vec::new(),
            host: Vec::new(),
            names: names.iter().map(|(i, n)| (*i, n.as_str().into())).collect(),
        }
    }

    /// Takes in one dumped message of type `kind` whose payload is `payload`.
    fn add(&mut self, kind: u16, payload: &[u8]) -> Result<(), NlError> {
        if kind != libc::RTM_NEWROUTE {
            return Ok(());
        }
        let route = route_from_bytes(payload, &self.names)
            .map_err(|e| NlError::Decode(format!("a dumped route: {e}")))?;
        match route {
            Route::Lace(key, nh) => push_to_runs(&mut self.lace, (key, nh)),
            Route::Host(id, h) => self.host.push((id, h)),
            Route::Foreign(_) | Route::Other => {}
        }
        Ok(())
    }
}

/// The rules of both families in Lace's band.
fn dump_rules(nl: &mut Nl) -> Result<Vec<ObservedRule>, NlError> {
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
    Ok(rules)
}

/// Reads what no rtnetlink notification Lace follows reports, each time: the sysctls
/// (`sysctls` are the keys), `ip sr tunsrc`, the nft table's tag, while a Lace tunnel device
/// exists the fou receive ports (the fou module is loaded then; a node that never had Lace's
/// tunnel need not load it), each a read whose cost does not grow with the plan; and the
/// pods' shaping ([`tc`]: one dump of the namespace's qdiscs, and the filters of the pod veths
/// that redirect to a shaper).
pub fn observe_host(
    nl: &mut Nl,
    node: &mut ObservedNode,
    sysctls: &BTreeSet<String>,
) -> Result<(), ObserveError> {
    observe_host_with(nl, node, read_host(sysctls)?)
}

/// What [`observe_host`] reads outside rtnetlink, so another thread can read it while the
/// kernel's routes are dumped.
#[derive(Debug)]
pub struct HostReads {
    sysctls: BTreeMap<String, Option<String>>,
    tunsrc: Option<Ipv6Addr>,
    nft: NftState,
}

/// The sysctls (`sysctls` are the keys), `ip sr tunsrc` and the nft table's tag.
pub fn read_host(sysctls: &BTreeSet<String>) -> Result<HostReads, ObserveError> {
    Ok(HostReads {
        sysctls: sysctls
            .iter()
            .map(|k| (k.clone(), host::read_sysctl(k)))
            .collect(),
        tunsrc: seg6::tunsrc_get().map_err(ObserveError::Tunsrc)?,
        nft: nft::observe().map_err(ObserveError::Nft)?,
    })
}

/// [`observe_host`] with what [`read_host`] read already.
pub fn observe_host_with(
    nl: &mut Nl,
    node: &mut ObservedNode,
    reads: HostReads,
) -> Result<(), ObserveError> {
    node.sysctls = reads.sysctls;
    node.tunsrc = reads.tunsrc;
    node.nft = reads.nft;
    let has_tunnel = node.tunnels().next().is_some();
    node.fou = match has_tunnel {
        true => Some(fou::list().map_err(ObserveError::Fou)?),
        false => None,
    };
    node.tc = tc(nl, &node.links, None).map_err(ObserveError::Tc)?;
    Ok(())
}

/// Lace's shaping on the pod veths (`lp-*`) and shapers (`ls-*`) among `links` (`only`: of
/// these names alone): root qdiscs with Lace's handle, `ingress` qdiscs, and Lace's filter on
/// each pod veth that has an `ingress` qdisc. Links holding none are left out.
pub fn tc(
    nl: &mut Nl,
    links: &BTreeMap<String, ObservedLink>,
    only: Option<&BTreeSet<String>>,
) -> Result<BTreeMap<String, LinkTc>, NlError> {
    let names: BTreeMap<u32, &String> = links
        .iter()
        .filter(|(n, _)| n.starts_with(POD_LINK_PREFIX) || n.starts_with(SHAPER_PREFIX))
        .filter(|(n, _)| only.is_none_or(|o| o.contains(*n)))
        .map(|(n, l)| (l.index, n))
        .collect();
    let mut out: BTreeMap<String, LinkTc> = BTreeMap::new();
    if names.is_empty() {
        return Ok(out);
    }
    let request = RouteNetlinkMessage::GetQueueDiscipline(Default::default());
    for m in nl.dump("qdiscs", request)? {
        let RouteNetlinkMessage::NewQueueDiscipline(q) = m else {
            continue;
        };
        let Some((index, qdisc)) = tc::classify_qdisc(&q) else {
            continue;
        };
        let Some(name) = names.get(&index) else {
            continue;
        };
        let seen = out.entry((*name).clone()).or_default();
        match qdisc {
            Qdisc::Root(root) => seen.root = Some(root),
            Qdisc::Ingress => seen.ingress = true,
        }
    }
    for (name, seen) in out.iter_mut().filter(|(_, t)| t.ingress) {
        let Some(link) = links.get(name) else {
            continue;
        };
        let request = RouteNetlinkMessage::GetTrafficFilter(tc::filters_of_ingress(link.index));
        let filters = match nl.dump("filters", request) {
            Ok(filters) => filters,
            // The veth, or its `ingress` qdisc, went since the qdiscs were read (the runtime
            // deleted the pod's namespace): none of Lace's filters is there.
            Err(NlError::Dump { source, .. })
                if matches!(
                    source.raw_os_error(),
                    Some(libc::ENODEV | libc::ENOENT | libc::EINVAL)
                ) =>
            {
                seen.ingress = false;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut found = filters.into_iter().filter_map(|m| match m {
            RouteNetlinkMessage::NewTrafficFilter(f) => tc::classify_filter(&f),
            _ => None,
        });
        seen.redirect = found.next().map(|first| match found.next() {
            None => first,
            Some(_) => Redirect::Other,
        });
    }
    Ok(out)
}

fn dump_links(nl: &mut Nl) -> Result<BTreeMap<String, ObservedLink>, NlError> {
    let mut request = LinkMessage::default();
    // Nothing Lace reads is in a link's counters, which the kernel sums over every CPU for
    // each link it dumps.
    request
        .attributes
        .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
    nl.dump_fold(
        "links",
        RouteNetlinkMessage::GetLink(request),
        BTreeMap::new,
        |links, kind, payload| {
            if kind == libc::RTM_NEWLINK {
                let link = link_message(payload)
                    .map_err(|e| NlError::Decode(format!("a dumped link: {e}")))?;
                links.extend(parse_link(&link));
            }
            Ok(())
        },
    )
}

/// The attributes of a link that [`parse_link`] reads (`IFLA_*`).
const IFLA_READ: [u16; 4] = [
    libc::IFLA_IFNAME,
    libc::IFLA_MTU,
    libc::IFLA_MASTER,
    libc::IFLA_LINKINFO,
];
/// The length of `struct ifinfomsg`, the header before a link's attributes.
const IFINFOMSG_LEN: usize = 16;

/// The link message (dumped or notified) whose payload (`struct ifinfomsg` and attributes) is
/// `payload`, with only the attributes [`parse_link`] reads: the others, most of a link's
/// kilobyte (each address family's configuration), are skipped unparsed. Parsing them took
/// two thirds of a dump of 82 links (13-20 ms against 5-6 ms for the kernel's part, in the
/// test VM).
pub fn link_message(payload: &[u8]) -> Result<LinkMessage, DecodeError> {
    let mut link = LinkMessage::default();
    link.header = LinkHeader::parse(payload)?;
    for a in RawAttrs::new(payload.get(IFINFOMSG_LEN..).unwrap_or_default()) {
        let a = a?;
        if IFLA_READ.contains(&a.kind) {
            let family = link.header.interface_family;
            link.attributes
                .push(LinkAttribute::parse_with_param(&a.nla(), family)?);
        }
    }
    Ok(link)
}

/// A link's name and what Lace reads of it.
pub fn parse_link(l: &LinkMessage) -> Option<(String, ObservedLink)> {
    let mut name = None;
    let mut master = None;
    let mut vrf_table = None;
    let mut sit = None;
    let mut dummy = false;
    let mut mtu = 0;
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::Controller(m) => master = Some(*m),
            LinkAttribute::Mtu(m) => mtu = *m,
            LinkAttribute::LinkInfo(infos) => {
                let is_sit = infos
                    .iter()
                    .any(|i| matches!(i, LinkInfo::Kind(InfoKind::SitTun)));
                dummy = infos
                    .iter()
                    .any(|i| matches!(i, LinkInfo::Kind(InfoKind::Dummy)));
                for i in infos {
                    match i {
                        LinkInfo::Data(InfoData::Vrf(v)) => {
                            for x in v {
                                if let InfoVrf::TableId(t) = x {
                                    vrf_table = Some(*t);
                                }
                            }
                        }
                        LinkInfo::Data(InfoData::IpTunnel(t)) if is_sit => {
                            sit = Some(parse_sit(t));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some((
        name?,
        ObservedLink {
            index: l.header.index,
            vrf_table,
            sit,
            dummy,
            master,
            up: l.header.flags.contains(LinkFlags::Up),
            mtu,
        },
    ))
}

/// A `sit` device's parameters from its link info (unset ones as the kernel's defaults).
fn parse_sit(infos: &[InfoIpTunnel]) -> SitLink {
    let v4 = |a: &IpAddr| match a {
        IpAddr::V4(v) if !v.is_unspecified() => Some(*v),
        _ => None,
    };
    let mut s = SitLink {
        local: None,
        remote: None,
        link: 0,
        ttl: 0,
        pmtudisc: false,
        encap_type: 0,
        encap_sport: 0,
        encap_dport: 0,
        encap_flags: 0,
    };
    for i in infos {
        match i {
            InfoIpTunnel::Local(a) => s.local = v4(a),
            InfoIpTunnel::Remote(a) => s.remote = v4(a),
            InfoIpTunnel::Link(l) => s.link = *l,
            InfoIpTunnel::Ttl(t) => s.ttl = *t,
            InfoIpTunnel::PMtuDisc(p) => s.pmtudisc = *p,
            InfoIpTunnel::EncapType(t) => s.encap_type = u16::from(*t),
            InfoIpTunnel::EncapSPort(p) => s.encap_sport = *p,
            InfoIpTunnel::EncapDPort(p) => s.encap_dport = *p,
            InfoIpTunnel::EncapFlags(f) => s.encap_flags = f.bits(),
            _ => {}
        }
    }
    s
}

/// `ip addr show`: the address messages of both families, IPv4 first.
pub fn dump_address_messages(nl: &mut Nl) -> Result<Vec<AddressMessage>, NlError> {
    let mut out = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = AddressMessage::default();
        req.header.family = family;
        for m in nl.dump("addresses", RouteNetlinkMessage::GetAddress(req))? {
            if let RouteNetlinkMessage::NewAddress(a) = m {
                out.push(a);
            }
        }
    }
    Ok(out)
}

fn dump_addrs(nl: &mut Nl) -> Result<Vec<(IpAddr, u32)>, NlError> {
    let mut out = Vec::new();
    for a in dump_address_messages(nl)?.iter().filter(|a| usable(a)) {
        for entry in addr_entries(a) {
            if !out.contains(&entry) {
                out.push(entry);
            }
        }
    }
    Ok(out)
}

/// Whether an address can be used (as a source, to find the uplink): not while IPv6
/// duplicate address detection runs or after it failed. The kernel notifies an address when
/// its detection completes, so a dump and the notifications agree on this.
pub fn usable(a: &AddressMessage) -> bool {
    let bad = AddressFlags::Tentative | AddressFlags::Dadfailed;
    let header = AddressHeaderFlags::Tentative | AddressHeaderFlags::Dadfailed;
    !a.header.flags.intersects(header)
        && !a
            .attributes
            .iter()
            .any(|x| matches!(x, AddressAttribute::Flags(f) if f.intersects(bad)))
}

/// The addresses of an address message, with the index of the link holding them.
pub fn addr_entries(a: &AddressMessage) -> impl Iterator<Item = (IpAddr, u32)> + '_ {
    a.attributes.iter().filter_map(|attr| match attr {
        // IFA_LOCAL is the local address on point-to-point links; IFA_ADDRESS otherwise.
        AddressAttribute::Local(ip) | AddressAttribute::Address(ip) => Some((*ip, a.header.index)),
        _ => None,
    })
}

/// A rule in Lace's band, recognized as one of the planner's kinds when it is exactly one.
pub fn classify_rule(r: RuleMessage) -> Option<ObservedRule> {
    let mut priority = 0;
    let mut l3mdev = false;
    let mut table = u32::from(r.header.table);
    let mut mark = None;
    let mut mask = None;
    let mut dst = None;
    let mut iif_lo = false;
    let mut other = false;
    for a in &r.attributes {
        match a {
            RuleAttribute::Destination(IpAddr::V6(a)) => dst = Some(*a),
            RuleAttribute::Priority(p) => priority = *p,
            RuleAttribute::L3MDev(on) => l3mdev = *on,
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::FwMark(m) => mark = Some(*m),
            RuleAttribute::FwMask(m) => mask = Some(*m),
            RuleAttribute::Iifname(n) if n == "lo" => iif_lo = true,
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
        // Multicast routing rules (the VRF driver adds l3mdev ones), notified on the same
        // groups as unicast rules: not dumped, not Lace's.
        _ => return None,
    };
    let plain = !other
        && r.header.action == RuleAction::ToTable
        && r.header.src_len == 0
        && r.header.tos == 0
        && r.header.flags.is_empty();
    // A destination length without an IPv6 address is no form of Lace's.
    let dst = match (dst, r.header.dst_len) {
        (None, 0) => Some(None),
        (Some(a), len) => Ipv6Net::new(a, len).ok().map(Some),
        (None, _) => None,
    };
    let plain = plain && dst.is_some();
    let dst = dst.flatten();
    let action = match (plain, l3mdev, mark, mask, dst, iif_lo) {
        (true, true, None, None, None, false) => Some(PlanRuleAction::L3mdev),
        (true, false, Some(mark), Some(mask), None, false) => {
            Some(PlanRuleAction::Fwmark { mark, mask, table })
        }
        (true, false, None, None, Some(dst), false) => {
            Some(PlanRuleAction::ToPrefix { dst, table })
        }
        (true, false, None, None, None, true) => Some(PlanRuleAction::FromHost { table }),
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

mod route;
#[cfg(test)]
mod tests;
