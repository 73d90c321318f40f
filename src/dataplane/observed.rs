//! What the reconciler knows of a namespace's kernel state, in its own terms: links,
//! addresses, Lace's routes and rules, the host's routes, the sysctls asked for, `ip sr
//! tunsrc`, the nft table's tag, the fou receive ports and the pods' shaping
//! ([`ObservedNode`]), and the marks by which Lace tells its own objects. Plain data: `observe`
//! and `watch` fill it from the kernel, the pure `diff` reads it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::plan;

mod routes;
pub use routes::{push_to_runs, Iter as KernelRoutesIter, KernelRoutes, TableRun};

/// Lace's rtnetlink route protocol id (`proto 76`, ASCII `L`). Not in iproute2's `rt_protos`
/// (which lists 0-4, 8-18, 42, 99, 186-192) nor used by the common CNIs (Calico uses 80).
pub const ROUTE_PROTOCOL: u8 = 0x4c;

/// A device's name in a [`KernelNexthop`]: shared, since a dump names the same few devices in
/// each of a large node's hundreds of thousands of routes.
pub type LinkName = std::sync::Arc<str>;

/// A route's next hop as the kernel holds it: symbolic next hops resolved, devices by name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KernelNexthop {
    /// `dev <dev>`.
    Dev(LinkName),
    /// `dev <dev> src <src>`: the source the host uses towards the destination (probe routes).
    DevSrc { dev: LinkName, src: IpAddr },
    /// `via <via> dev <dev>`.
    Via { via: IpAddr, dev: LinkName },
    /// `encap seg6 mode encap segs <segs> dev <dev>`.
    Seg6Encap { segs: Ipv6Addr, dev: LinkName },
    /// `encap seg6local action End.DT46 vrftable <vrf_table> dev <dev>`.
    Seg6LocalDt46 { vrf_table: u32, dev: LinkName },
    /// `unreachable`.
    Unreachable,
    /// A route of Lace's in a form Lace never writes (someone edited it): replaced or deleted.
    Unknown(String),
}

impl KernelNexthop {
    /// The device the route names, if any.
    pub fn dev(&self) -> Option<&str> {
        match self {
            Self::Dev(dev)
            | Self::DevSrc { dev, .. }
            | Self::Via { dev, .. }
            | Self::Seg6Encap { dev, .. }
            | Self::Seg6LocalDt46 { dev, .. } => Some(dev),
            Self::Unreachable | Self::Unknown(_) => None,
        }
    }
}

impl fmt::Display for KernelNexthop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dev(d) => write!(f, "dev {d}"),
            Self::DevSrc { dev, src } => write!(f, "dev {dev} src {src}"),
            Self::Via { via, dev } => write!(f, "via {via} dev {dev}"),
            Self::Seg6Encap { segs, dev } => {
                write!(f, "encap seg6 mode encap segs {segs} dev {dev}")
            }
            Self::Seg6LocalDt46 { vrf_table, dev } => write!(
                f,
                "encap seg6local action End.DT46 vrftable {vrf_table} dev {dev}"
            ),
            Self::Unreachable => write!(f, "unreachable"),
            Self::Unknown(s) => write!(f, "unknown ({s})"),
        }
    }
}

/// A link as observed (any link: names resolve next hops; only `lv-*` ones are Lace's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedLink {
    pub index: u32,
    /// The VRF table, if the link is a VRF.
    pub vrf_table: Option<u32>,
    /// The tunnel's parameters, if the link is a `sit` device.
    pub sit: Option<SitLink>,
    /// Whether the link is a `dummy` device.
    pub dummy: bool,
    /// Index of the link's master (VRF), if enslaved.
    pub master: Option<u32>,
    pub up: bool,
    pub mtu: u32,
}

/// What Lace sets of a `sit` device (`ip -d link show`), as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SitLink {
    /// `local` (`None`: any).
    pub local: Option<Ipv4Addr>,
    /// `remote` (`None`: any).
    pub remote: Option<Ipv4Addr>,
    /// `dev`: the index of the link the tunnel is bound to (0: none).
    pub link: u32,
    /// `ttl` (0: inherit).
    pub ttl: u8,
    pub pmtudisc: bool,
    /// `encap` type (`TUNNEL_ENCAP_*`: 0 none, 1 fou, 2 gue).
    pub encap_type: u16,
    /// `encap-sport` (0: auto) and `encap-dport`.
    pub encap_sport: u16,
    pub encap_dport: u16,
    /// `encap-csum` and friends (`TUNNEL_ENCAP_FLAG_*`).
    pub encap_flags: u16,
}

/// A FIB rule in Lace's priority band.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedRule {
    /// The rule in the planner's terms, when it is one Lace writes.
    pub rule: Option<plan::Rule>,
    /// The kernel's message, to delete it exactly.
    pub raw: netlink_packet_route::rule::RuleMessage,
}

/// A host (non-Lace) unicast route of the main table, to resolve [`plan::Nexthop::Host`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoute {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub dev: Option<String>,
}

/// What the nft table `inet lace` looks like.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NftState {
    #[default]
    Absent,
    /// Present, with the plan tag Lace wrote into its set `plan` (None: no such set, or not
    /// exactly one element with a plan tag as its comment).
    Present { tag: Option<String> },
}

/// A root `tbf` with Lace's handle, as the kernel reports it (`tc qdisc show`). The kernel
/// keeps the bucket as the time it takes to fill at the rate (`buffer`, in its 64 ns ticks),
/// not as bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObservedTbf {
    /// Bytes per second.
    pub rate: u64,
    /// The queue, in bytes.
    pub limit: u32,
    pub buffer_ticks: u32,
}

/// The root qdisc with Lace's handle on a pod veth or shaper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootQdisc {
    /// A `tbf` of the form Lace writes.
    Tbf(ObservedTbf),
    /// Anything else (another kind, a peak rate, a rate table): replaced or deleted.
    Other(String),
}

/// Lace's filter on a pod veth's `ingress` qdisc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redirect {
    /// Everything redirected to the link with this index, as Lace writes it.
    To(u32),
    /// Anything else of Lace's priority (several filters, another match or action).
    Other,
}

/// What a pod veth or shaper holds of Lace's shaping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkTc {
    pub root: Option<RootQdisc>,
    /// Whether it has an `ingress` qdisc (on pod veths only).
    pub ingress: bool,
    pub redirect: Option<Redirect>,
}

/// Everything the reconciler observed in one namespace (`Default`: a namespace holding
/// nothing, not even the nft table).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedNode {
    /// All links by name.
    pub links: BTreeMap<String, ObservedLink>,
    /// Local addresses (both families) and the index of the link holding each.
    pub addrs: Vec<(IpAddr, u32)>,
    /// Lace's routes.
    pub routes: KernelRoutes,
    /// The host's own unicast routes of the main table.
    pub host_routes: Vec<HostRoute>,
    /// Rules in Lace's priority band.
    pub rules: Vec<ObservedRule>,
    /// The sysctls asked for: key → current value (None: no such sysctl yet).
    pub sysctls: BTreeMap<String, Option<String>>,
    pub tunsrc: Option<Ipv6Addr>,
    pub nft: NftState,
    /// The fou receive ports, read only while a Lace tunnel device exists (`None`: not read).
    pub fou: Option<Vec<FouListener>>,
    /// Lace's shaping on the pod veths and shapers that hold any, by link name (read by
    /// each reconcile, never notified).
    pub tc: BTreeMap<String, LinkTc>,
}

impl ObservedNode {
    /// The name of the link with index `index`.
    pub fn link_name(&self, index: u32) -> Option<&str> {
        self.links
            .iter()
            .find(|(_, l)| l.index == index)
            .map(|(n, _)| n.as_str())
    }

    /// Lace's VRF links (`lv-*`).
    pub fn vrfs(&self) -> impl Iterator<Item = (&String, &ObservedLink)> {
        self.links
            .iter()
            .filter(|(n, _)| n.starts_with(plan::VRF_PREFIX))
    }

    /// Lace's VRF ingress devices (`li-*`).
    pub fn ingress_links(&self) -> impl Iterator<Item = (&String, &ObservedLink)> {
        self.links
            .iter()
            .filter(|(n, _)| n.starts_with(plan::INGRESS_PREFIX))
    }

    /// The link holding address `addr`, by name, with what was observed of it.
    pub fn link_holding(&self, addr: IpAddr) -> Option<(&str, &ObservedLink)> {
        let (_, index) = self.addrs.iter().find(|(a, _)| *a == addr)?;
        self.links
            .iter()
            .find(|(_, l)| l.index == *index)
            .map(|(n, l)| (n.as_str(), l))
    }

    /// Lace's shapers (`ls-*`).
    pub fn shapers(&self) -> impl Iterator<Item = (&String, &ObservedLink)> {
        self.links
            .iter()
            .filter(|(n, _)| n.starts_with(plan::shaping::SHAPER_PREFIX))
    }

    /// Lace's underlay tunnel links (`lu-*`).
    pub fn tunnels(&self) -> impl Iterator<Item = (&String, &ObservedLink)> {
        self.links
            .iter()
            .filter(|(n, _)| n.starts_with(plan::underlay::TUNNEL_PREFIX))
    }
}

/// The `family` of an IPv4 fou listener.
pub(super) const AF_INET: u8 = libc::AF_INET as u8;

/// One receive port, as `ip fou show` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FouListener {
    pub port: u16,
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// The protocol of direct fou (`None` for GUE).
    pub ipproto: Option<u8>,
}

impl FouListener {
    /// The listener Lace wants: IPv4, direct, carrying `ipproto`.
    pub fn direct_v4(port: u16, ipproto: u8) -> Self {
        Self {
            port,
            family: AF_INET,
            ipproto: Some(ipproto),
        }
    }
}
