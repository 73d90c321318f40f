//! A route message read in Lace's terms ([`Route`]): Lace's routes by key and next hop, the
//! host's main-table routes, and the rest. The bytes of the route Lace writes most, one to a
//! remote block ([`remote_block_route`]), are read in one straight pass; any other route's
//! fields are taken from its attributes ([`RouteFields`]) and sorted by [`classify_route`].

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netlink_packet_core::{DecodeError, ParseableParametrized, NLA_TYPE_MASK};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteLwEnCapType, RouteLwTunnelEncap,
    RouteMessage, RouteProtocol, RouteSeg6IpTunnel, RouteSeg6LocalTunnel, RouteType,
    Seg6LocalAction, Seg6Mode,
};
use netlink_packet_route::AddressFamily;

use crate::dataplane::nl::RawAttrs;
use crate::dataplane::observed::{HostRoute, KernelNexthop, LinkName, ROUTE_PROTOCOL};
use crate::plan::{RouteKey, HOST_ACCESS_TABLE, MAIN_TABLE, VRF_TABLE_BASE};

/// Whether table id `table` is one Lace owns routes in.
pub fn lace_table(table: u32) -> bool {
    table == MAIN_TABLE || (VRF_TABLE_BASE..=HOST_ACCESS_TABLE).contains(&table)
}

/// A dumped or notified route message whose payload (`struct rtmsg` and attributes) is
/// `payload`, sorted as [`classify_route`] sorts it. `names` resolves link indices.
pub fn route_from_bytes(
    payload: &[u8],
    names: &BTreeMap<u32, LinkName>,
) -> Result<Route, DecodeError> {
    if let Some((key, nh)) = remote_block_route(payload, names) {
        return Ok(Route::Lace(key, nh));
    }
    Ok(classify_route(&RouteFields::parse(payload)?, names))
}

/// Lace's route to a remote block (an IPv4 destination, a metric, `encap seg6 mode encap
/// segs SID dev UPLINK` in one of Lace's tables) read from `payload` when its bytes are laid
/// out as the kernel dumps and notifies that route (`fib_dump_info`): a plain header, then
/// `RTA_TABLE`, `RTA_DST`, `RTA_PRIORITY`, `RTA_OIF`, `RTA_ENCAP` (the one-segment form
/// [`seg6_encap_segment`] reads) and `RTA_ENCAP_TYPE`, each of its exact length, nothing
/// else, and an output link `names` holds. `None` for anything else, which
/// [`RouteFields::parse`] reads and [`classify_route`] sorts into the same route where this
/// reads one. At 5,000 x 50 these are 190,000 of a node's routes, whose decoding was most
/// of a fresh reconciler's CPU in the test VM: the general read takes about 770 instructions
/// a route (callgrind), this one about 300.
pub fn remote_block_route(
    payload: &[u8],
    names: &BTreeMap<u32, LinkName>,
) -> Option<(RouteKey, KernelNexthop)> {
    let (header, mut attrs) = payload.split_first_chunk::<RTMSG_LEN>()?;
    let [family, dst_len, src_len, tos, _, protocol, scope, kind, flags @ ..] = *header;
    let plain = family == libc::AF_INET as u8
        && dst_len <= 32
        && src_len == 0
        && tos == 0
        && protocol == ROUTE_PROTOCOL
        && scope == libc::RT_SCOPE_UNIVERSE
        && kind == libc::RTN_UNICAST
        && flags == [0; 4];
    if !plain {
        return None;
    }
    let table = u32::from_ne_bytes(take_attr(&mut attrs, libc::RTA_TABLE)?);
    // The kernel leaves a default route's destination out.
    let dst: [u8; 4] = match dst_len {
        0 => [0; 4],
        _ => take_attr(&mut attrs, libc::RTA_DST)?,
    };
    let metric = u32::from_ne_bytes(take_attr(&mut attrs, libc::RTA_PRIORITY)?);
    let oif = u32::from_ne_bytes(take_attr(&mut attrs, libc::RTA_OIF)?);
    let encap: [u8; SEG6_ONE_SEGMENT_LEN] = take_attr(&mut attrs, RTA_ENCAP)?;
    let encap_type = u16::from_ne_bytes(take_attr(&mut attrs, RTA_ENCAP_TYPE)?);
    if !attrs.is_empty() || encap_type != LWTUNNEL_ENCAP_SEG6 || !lace_table(table) {
        return None;
    }
    let segs = seg6_encap_segment(&encap)?;
    let dev = names.get(&oif)?.clone();
    let dst = IpNet::V4(Ipv4Net::new(Ipv4Addr::from(dst), dst_len).ok()?);
    Some((
        RouteKey { table, dst, metric },
        KernelNexthop::Seg6Encap { segs, dev },
    ))
}

/// `RTA_ENCAP`'s value for a one-segment `encap seg6 mode encap`: its `SEG6_IPTUNNEL_SRH`
/// attribute's header, `int mode`, `struct ipv6_sr_hdr` (8 bytes) and the segment.
const SEG6_ONE_SEGMENT_LEN: usize = 4 + 4 + 8 + 16;
/// `RTA_ENCAP_TYPE` of seg6 (`enum lwtunnel_encap_types`).
const LWTUNNEL_ENCAP_SEG6: u16 = 5;

/// The value of the attribute at the front of `attrs` if it is of type `kind` and its value
/// is exactly `N` bytes, taking it and its padding off `attrs` (the last attribute's padding
/// may be cut off with the message).
fn take_attr<const N: usize>(attrs: &mut &[u8], kind: u16) -> Option<[u8; N]> {
    let ([l0, l1, t0, t1], rest) = attrs.split_first_chunk::<4>()?;
    let len = usize::from(u16::from_ne_bytes([*l0, *l1]));
    if len != 4 + N || u16::from_ne_bytes([*t0, *t1]) & NLA_TYPE_MASK != kind {
        return None;
    }
    let (value, rest) = rest.split_first_chunk::<N>()?;
    *attrs = rest.get(N.next_multiple_of(4) - N..).unwrap_or_default();
    Some(*value)
}

fn addr_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// What a route is to Lace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// One of Lace's (its protocol, in one of its tables).
    Lace(RouteKey, KernelNexthop),
    /// A unicast route of the host's main table, with what tells it from other routes to the
    /// same destination (TOS, priority).
    Host(HostRouteId, HostRoute),
    /// Another protocol's route in one of Lace's tables (not a main-table unicast route).
    Foreign(RouteKey),
    /// Anything else.
    Other,
}

/// What identifies a main-table route: destination, TOS, priority (what `NLM_F_REPLACE`
/// matches on) and the output link (IPv6 holds one route per link for the same prefix, e.g.
/// `fe80::/64`).
pub type HostRouteId = (IpNet, u8, u32, Option<u32>);

/// The fields of a route message that Lace reads. [`RouteFields::parse`] takes them from the
/// message's bytes: the header and the seven attributes below, read from their bytes when
/// they have the kernel's lengths, as is the one-segment seg6 encapsulation Lace writes
/// ([`seg6_encap_segment`]), otherwise parsed by netlink-packet-route; the others (cache info,
/// metrics, preference) skipped unparsed, and no list of them built, which a whole
/// [`RouteMessage`]'s parse does for every route (at 300,000 routes that list was most of a
/// dump's decoding). A decoded message converts too.
#[derive(Debug)]
pub struct RouteFields {
    header: RouteHeader,
    table: u32,
    dst: Option<IpAddr>,
    gateway: Option<IpAddr>,
    oif: Option<u32>,
    encap_type: RouteLwEnCapType,
    encap: Option<Vec<RouteLwTunnelEncap>>,
    /// The segment of a one-segment `encap seg6 mode encap`, read from its bytes (see
    /// [`seg6_encap_segment`]); `encap` stays `None` then.
    seg6_encap: Option<Ipv6Addr>,
    src: Option<IpAddr>,
    priority: u32,
}

/// The attributes [`RouteFields::parse`] reads (`RTA_*`; the encapsulation's own after its type).
const RTA_READ: [u16; 7] = [
    libc::RTA_TABLE,
    libc::RTA_DST,
    libc::RTA_GATEWAY,
    libc::RTA_OIF,
    libc::RTA_PREFSRC,
    libc::RTA_PRIORITY,
    RTA_ENCAP_TYPE,
];
const RTA_ENCAP_TYPE: u16 = 21;
const RTA_ENCAP: u16 = 22;
/// The length of `struct rtmsg`, the header before a route's attributes.
const RTMSG_LEN: usize = 12;

impl RouteFields {
    fn new(header: RouteHeader) -> Self {
        Self {
            table: u32::from(header.table),
            header,
            dst: None,
            gateway: None,
            oif: None,
            encap_type: RouteLwEnCapType::None,
            encap: None,
            seg6_encap: None,
            src: None,
            priority: 0,
        }
    }

    /// The fields of the route message whose payload (`struct rtmsg` and attributes) is
    /// `payload`.
    pub fn parse(payload: &[u8]) -> Result<Self, DecodeError> {
        let mut fields = Self::new(RouteHeader::parse(payload)?);
        let param = |f: &Self| (f.header.address_family, f.header.kind, f.encap_type);
        let mut encap = None;
        for a in RawAttrs::new(payload.get(RTMSG_LEN..).unwrap_or_default()) {
            let a = a?;
            match a.kind {
                // Its parse needs the encapsulation's type, which may come after it.
                RTA_ENCAP => encap = Some(a),
                // Read from the bytes, or else parsed by the library.
                kind if RTA_READ.contains(&kind) && !fields.read(kind, a.value) => {
                    fields.set(RouteAttribute::parse_with_param(&a.nla(), param(&fields))?)
                }
                _ => {}
            }
        }
        if let Some(a) = encap {
            fields.seg6_encap = match fields.encap_type {
                RouteLwEnCapType::Seg6 => seg6_encap_segment(a.value),
                _ => None,
            };
            if fields.seg6_encap.is_none() {
                fields.set(RouteAttribute::parse_with_param(&a.nla(), param(&fields))?);
            }
        }
        Ok(fields)
    }

    /// Reads attribute `kind` of [`RTA_READ`] from its `value` when it has the length the kernel
    /// sends (a `u32`, a `u16`, an address of the route's family) and returns whether it did;
    /// anything else goes to netlink-packet-route's parse, which decodes or rejects it. At
    /// 300,000 routes a dump built and dropped two million `RouteAttribute`s for these.
    fn read(&mut self, kind: u16, value: &[u8]) -> bool {
        let number = || <[u8; 4]>::try_from(value).ok().map(u32::from_ne_bytes);
        let addr = || match self.header.address_family {
            AddressFamily::Inet => <[u8; 4]>::try_from(value).ok().map(IpAddr::from),
            AddressFamily::Inet6 => <[u8; 16]>::try_from(value).ok().map(IpAddr::from),
            _ => None,
        };
        match kind {
            libc::RTA_TABLE => number().map(|t| self.table = t),
            libc::RTA_OIF => number().map(|i| self.oif = Some(i)),
            libc::RTA_PRIORITY => number().map(|p| self.priority = p),
            libc::RTA_DST => addr().map(|a| self.dst = Some(a)),
            libc::RTA_GATEWAY => addr().map(|a| self.gateway = Some(a)),
            libc::RTA_PREFSRC => addr().map(|a| self.src = Some(a)),
            RTA_ENCAP_TYPE => <[u8; 2]>::try_from(value)
                .ok()
                .map(|t| self.encap_type = RouteLwEnCapType::from(u16::from_ne_bytes(t))),
            _ => None,
        }
        .is_some()
    }

    fn set(&mut self, a: RouteAttribute) {
        match a {
            RouteAttribute::Table(t) => self.table = t,
            RouteAttribute::Destination(d) => self.dst = addr_of(&d),
            RouteAttribute::Gateway(g) => self.gateway = addr_of(&g),
            RouteAttribute::Oif(i) => self.oif = Some(i),
            RouteAttribute::EncapType(t) => self.encap_type = t,
            RouteAttribute::Encap(e) => self.encap = Some(e),
            RouteAttribute::PrefSource(p) => self.src = addr_of(&p),
            RouteAttribute::Priority(p) => self.priority = p,
            _ => {}
        }
    }
}

impl From<RouteMessage> for RouteFields {
    fn from(r: RouteMessage) -> Self {
        let mut fields = Self::new(r.header);
        for a in r.attributes {
            fields.set(a);
        }
        fields
    }
}

/// The segment of `RTA_ENCAP`'s value `encap` when it is exactly what Lace writes for a remote
/// block: one `SEG6_IPTUNNEL_SRH` attribute holding mode encap and a routing header with one
/// segment, no flags and no TLV. Anything else is `None`, left to netlink-packet-route's parse
/// (whose reading [`parse_encap`] accepts the same forms only).
///
/// Read from the bytes because that parse allocates three times per route (the attribute
/// list, the segment list twice), most of a fresh dump's decoding of 290,000 such routes.
fn seg6_encap_segment(encap: &[u8]) -> Option<Ipv6Addr> {
    const SEG6_IPTUNNEL_SRH: u16 = 1;
    const SEG6_IPTUN_MODE_ENCAP: u32 = 1;
    // `int mode`, then `struct ipv6_sr_hdr` (8 bytes) and its one segment.
    const LEN: usize = 4 + 8 + 16;
    // hdrlen counts 8-byte units after the first 8: one segment is 2.
    const ONE_SEGMENT_HDRLEN: u8 = 2;
    let mut attrs = RawAttrs::new(encap);
    let srh = attrs.next()?.ok()?;
    if attrs.next().is_some() || srh.kind != SEG6_IPTUNNEL_SRH {
        return None;
    }
    let v: &[u8; LEN] = srh.value.try_into().ok()?;
    let [m0, m1, m2, m3, _nexthdr, hdrlen, _type, _segments_left, first_segment, flags, _, _, segment @ ..] =
        *v;
    (u32::from_ne_bytes([m0, m1, m2, m3]) == SEG6_IPTUN_MODE_ENCAP
        && hdrlen == ONE_SEGMENT_HDRLEN
        && first_segment == 0
        && flags == 0)
        .then(|| Ipv6Addr::from(segment))
}

/// Sorts a dumped or notified route into Lace's routes, the host's main-table routes, or
/// neither. `names` resolves link indices.
pub fn classify_route(r: &RouteFields, names: &BTreeMap<u32, LinkName>) -> Route {
    // A cached clone (a PMTU exception, a redirect) is not a FIB entry: dumps leave them out.
    if r.header.flags.contains(RouteFlags::Cloned) {
        return Route::Other;
    }
    let RouteFields {
        table,
        dst,
        gateway,
        oif,
        ref encap,
        seg6_encap,
        src,
        priority,
        ..
    } = *r;
    let encap = encap.as_deref();
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
    let Some(dst) = dst else {
        return Route::Other;
    };
    let dev = oif.and_then(|i| names.get(&i).cloned());
    if r.header.protocol != RouteProtocol::Other(ROUTE_PROTOCOL) {
        if table == MAIN_TABLE && r.header.kind == RouteType::Unicast {
            return Route::Host(
                (dst, r.header.tos, priority, oif),
                HostRoute {
                    dst,
                    gateway,
                    dev: dev.map(|d| d.to_string()),
                },
            );
        }
        if lace_table(table) {
            return Route::Foreign(RouteKey {
                table,
                dst,
                metric: priority,
            });
        }
        return Route::Other;
    }
    if !lace_table(table) {
        return Route::Other;
    }
    let nh = match (r.header.kind, seg6_encap, encap, gateway, dev) {
        (RouteType::Unreachable, ..) => KernelNexthop::Unreachable,
        (RouteType::Unicast, Some(segs), None, None, Some(dev)) => {
            KernelNexthop::Seg6Encap { segs, dev }
        }
        (RouteType::Unicast, None, Some(e), None, Some(dev)) => parse_encap(e, dev),
        (RouteType::Unicast, None, None, Some(via), Some(dev)) => KernelNexthop::Via { via, dev },
        (RouteType::Unicast, None, None, None, Some(dev)) => match src {
            Some(src) => KernelNexthop::DevSrc { dev, src },
            None => KernelNexthop::Dev(dev),
        },
        (kind, s, e, g, d) => KernelNexthop::Unknown(format!(
            "type {kind:?} encap {:?} gateway {g:?} dev {d:?}",
            s.map(|segs| format!("seg6 mode encap segs {segs}"))
                .or_else(|| e.map(|e| format!("{e:?}")))
        )),
    };
    let metric = priority;
    Route::Lace(RouteKey { table, dst, metric }, nh)
}

fn parse_encap(e: &[RouteLwTunnelEncap], dev: LinkName) -> KernelNexthop {
    let mut segs = None;
    let mut action = None;
    let mut vrf_table = None;
    for x in e {
        match x {
            // What `seg6_encap_segment` reads from the bytes, and nothing else.
            RouteLwTunnelEncap::Seg6(RouteSeg6IpTunnel::Seg6(h))
                if h.segments.len() == 1 && h.mode == Seg6Mode::Encap && h.hmac.is_none() =>
            {
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

#[cfg(test)]
mod tests;
