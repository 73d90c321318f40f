//! The planner: from [`ClusterState`] and this node's pod attachments, exactly what the node's
//! kernel must hold — VRFs, routes, rules, sysctls and the nftables ruleset.
//!
//! Pure and deterministic: the same input gives an identical [`DesiredNode`] (every collection
//! is sorted), which the reconciler diffs against what it observes and applies over netlink.
//!
//! `base` builds the pod-independent part ([`NodeBase`]), `ruleset` its nftables ruleset (whose
//! types and rendering are in [`nft`]), `netpol` the Kubernetes NetworkPolicy part of it.
//!
//! Ownership, so the reconciler touches only what Lace made:
//! - table ids [`VRF_TABLE_BASE`]`..=`[`HOST_ACCESS_TABLE`] (one VRF table per Network: base +
//!   the Network's SID function, so every node uses the same id for the same Network; then the
//!   kubelet-probe table and the table of host processes' routes to Networks with
//!   `hostAccess`, see [`host_access`]);
//! - rule priorities [`RULE_PRIORITY_PROBE`]`..=`[`RULE_PRIORITY_L3MDEV`];
//! - interface names starting with [`VRF_PREFIX`] (VRFs), [`POD_LINK_PREFIX`] (the host side of
//!   pod veths, which the CNI makes), [`INGRESS_PREFIX`] (a VRF's ingress
//!   device, see [`ingress`]), [`underlay::TUNNEL_PREFIX`] (the SRv6-over-IPv4 device) and
//!   [`shaping::SHAPER_PREFIX`] (a pod's egress shaper), and the fou listener on
//!   [`underlay::FOU_PORT`];
//! - on pod veths and shapers, the qdiscs and the filter of a pod's bandwidth ([`shaping`]);
//! - nftables table `inet lace` ([`nft::TABLE`]);
//! - routes in the main table are only SIDs, node locators, reply routes for pod blocks and
//!   the subnets of Networks that receive NodePort traffic from outside ([`ingress`]).
//!
//! Which underlay reaches each other node (IPv6, IPv6 link-local, or SRv6 over IPv4) is
//! decided per pair; see [`underlay`]. What the node found out about its links
//! ([`UnderlayFacts`]) is an input like the cluster state, so planning stays pure.
//!
//! Two next hops are symbolic because they name host configuration the cluster state does not
//! carry: [`Nexthop::Underlay`] / [`Nexthop::Seg6Encap`] over IPv6 leave through the *uplink*
//! (the link that holds this node's IPv6 underlay address) and [`Nexthop::Host`] copies what
//! the main table resolves for the destination (host routing). The reconciler resolves both
//! when applying, and sizes [`underlay::IPV4_TUNNEL`] after the link holding the node's IPv4
//! underlay address.
//!
//! For the incremental case, [`Planner`] keeps the pod-independent part (which is almost all
//! of it: remote blocks grow with nodes × Networks) behind an [`Arc`] and recomputes only the
//! routes of the local pods when attachments change. The routes to the blocks a Network
//! reaches are in that part for every Network ([`NodeBase::pod_reach`]); the plan takes those
//! of the Networks its attachments are in ([`DesiredNode::served_tables`]).

mod base;
mod host_access;
mod hostport;
pub mod ingress;
mod netpol;
pub mod nft;
mod routes;
pub use host_access::{HOST_ACCESS_TABLE, RULE_PRIORITY_HOST_ACCESS};
pub use routes::RouteTable;
mod ruleset;
pub mod shaping;
pub mod underlay;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::api::Underlay;
use crate::state::{ClusterState, ObjectKey, PodAttachment};
use underlay::{Ipv4Tunnel, PeerPath, UnderlayFacts, IPV4_TUNNEL};

/// First table id Lace owns. A Network's VRF table is `VRF_TABLE_BASE + function`, so ids
/// are equal on all nodes and readable (`1000042` is function 42). Far above the ids distros
/// and other CNIs use (main 254, local 255, default 253, small numbers for policy routing).
pub const VRF_TABLE_BASE: u32 = 1_000_000;
/// The kubelet-probe table (routes to every local pod). [`HOST_ACCESS_TABLE`] follows it.
pub const PROBE_TABLE: u32 = VRF_TABLE_BASE + 1 + u16::MAX as u32;
/// The kernel's main table.
pub const MAIN_TABLE: u32 = 254;
/// Priority of the fwmark rule that sends kubelet probes to [`PROBE_TABLE`]. Before the
/// l3mdev rule (1000) so a marked packet never enters a VRF lookup.
pub const RULE_PRIORITY_PROBE: u32 = 990;
/// Priority of the fwmark rule that sends replies to clients outside the cluster (NodePort
/// connections, marked [`INGRESS_MARK`] by the ruleset) to the main table: after the probe
/// rule, before the l3mdev rule, which would look their destination up in the pod's VRF.
pub const RULE_PRIORITY_INGRESS_REPLY: u32 = 995;
/// Priority of the rule that looks IPv6 destinations in the span of the cluster's locators up
/// in the main table ([`RuleAction::ToPrefix`]): after the fwmark rules, before the l3mdev rule.
/// It is what routes an encapsulated packet leaving a VRF: the kernel looks the outer
/// destination (a peer's SID) up with the VRF as the flow's device, and the main table holds
/// the route to each peer's locator once, instead of a copy in every VRF's table.
pub const RULE_PRIORITY_LOCATORS: u32 = 997;
/// Priority of the l3mdev rule: the same rule the kernel's VRF driver installs, declared here
/// so it is ensured (and not counted as foreign) by the reconciler.
pub const RULE_PRIORITY_L3MDEV: u32 = 1000;
/// The socket mark the kubelet's sockets get: bit 12.
///
/// Chosen to be clear of every bit that the components a Lace node may run alongside use:
/// kube-proxy (iptables and nftables modes) 0x4000 masquerade and 0x8000 drop; Calico's
/// default mark mask 0xffff0000; Cilium 0x0f00 and identities in the upper 16 bits (its layout
/// leaves 0xf000 to Kubernetes components, where kube-proxy takes only 0xc000); Weave 0x20000
/// and 0x40000; kube-router 0x10000 and up; Antrea bit 31 and 0xff; AWS VPC CNI 0x80; Istio
/// 0x40/0x100/0x200/0x210/0x220 and 0x539; Tailscale 0x10000–0x80000; wg-quick 0xca6c.
/// flannel sets none.
pub const PROBE_MARK: u32 = 0x1000;

/// The mask to match [`PROBE_MARK`] with (`fwmark 0x1000/0x1000`, `meta mark & 0x1000 ==
/// 0x1000`): only Lace's bit is looked at, so marks other components set in other bits neither
/// hide nor fake it.
pub const PROBE_MARK_MASK: u32 = 0x1000;
/// The mark Lace's ruleset sets, in prerouting, on replies to connections opened from outside
/// the cluster (kube-proxy's NodePort DNAT towards a pod); the rule at
/// [`RULE_PRIORITY_INGRESS_REPLY`] routes them in the main table: bit 11.
///
/// The low 16 bits are where the components a node may run beside Lace keep their marks (see
/// [`PROBE_MARK`]); Lace already holds 0x1000 and 0x2000, kube-proxy 0x4000 and 0x8000, which
/// fills the 0xf000 nibble. Of the rest, bit 11 is the one no component in that list sets on
/// its own: Istio's marks (0x539, 0x111, 0x220, 0x210, 0x200, 0x100, 0x40), Antrea's 0xff,
/// AWS VPC CNI's 0x80 stay below it; only Cilium's 0x0f00 "magic" nibble covers it, and Cilium
/// is a CNI that never runs beside another one's datapath on a node. The upper 16 bits are
/// Calico's, Cilium's identities, Weave's, kube-router's and Tailscale's. The mark is set only
/// on reply packets of such connections and read only by that rule.
pub const INGRESS_MARK: u32 = 0x800;
/// The mask to match [`INGRESS_MARK`] with: only Lace's bit.
pub const INGRESS_MARK_MASK: u32 = 0x800;
/// The masquerade mark kube-proxy (iptables and nftables modes, `--iptables-masquerade-bit`
/// 14, the default) sets on the connections it wants masqueraded, among them NodePort
/// connections of `externalTrafficPolicy: Cluster`. Lace source-NATs those that go to a pod to
/// its own address in the pod's Network ([`ingress::ingress_address`]) before kube-proxy's
/// masquerade would run.
pub const KUBE_PROXY_MASQUERADE_MARK: u32 = 0x4000;
/// Prefix of the dummy device Lace enslaves to the VRF of each Network that receives
/// NodePort traffic (`li-` + the VRF name after `lv-`): the device of the seg6 encap routes
/// towards remote backends of that traffic ([`Nexthop::Seg6EncapIngress`]).
pub const INGRESS_PREFIX: &str = "li-";
/// The pods' IPv6 default gateway (a permanent neighbour in every pod, pointing at the host
/// end of its veth), and the source of IPv6 kubelet probes.
///
/// IPv6 probes need a source the kernel accepts on a route out of a VRF slave: it checks that
/// a `src` belongs to the device's L3 domain, so no address of the host (outside every VRF)
/// qualifies, and the veth's own auto-generated link-local address is not known to the plan.
/// `fe80::1` on the host end of each pod veth (`ip addr add fe80::1/64 dev lp-x nodad`,
/// added by the reconciler, see [`Nexthop::DevSrc`]) is: the pod already sends everything to
/// it, so its replies come back on that veth without any neighbour discovery, and the host's
/// unbound kubelet socket accepts them through `net.ipv4.tcp_l3mdev_accept` (which governs
/// IPv6 too). The address is link-local, so it never leaves the veth, and pods cannot use it
/// to reach the host: the ruleset's `input` chain drops what they open towards it.
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// Prefix length of [`POD_GATEWAY_V6`] on a pod veth's host end (the link-local prefix).
pub const POD_GATEWAY_V6_PREFIX: u8 = 64;
/// Prefix of every VRF device Lace creates ("lace VRF").
pub const VRF_PREFIX: &str = "lv-";
/// Prefix of the host side of pod veths (the CNI names them `lp-<hash>`, "lace pod"). The
/// reconciler only enslaves such links to their Network's VRF; the ruleset lets a pod's packet
/// pass its first prerouting pass by this name (its policy runs on the VRF's pass).
pub const POD_LINK_PREFIX: &str = "lp-";
/// Longest Linux interface name (IFNAMSIZ - 1).
pub const IFNAME_MAX: usize = 15;

/// Why a plan could not be made. Each names the object at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("node {node:?} has no NodeAllocation yet (no locator, underlay address or blocks)")]
    NodeNotAllocated { node: String },
    #[error(
        "Network {network:?} has no NetworkAllocation yet (no SID function, so no VRF table id)"
    )]
    NetworkNotAllocated { network: String },
    #[error("Networks {first:?} and {second:?} both have SID function {function}: their SIDs and VRF tables would collide")]
    DuplicateFunction {
        first: String,
        second: String,
        function: u16,
    },
    #[error("VRF name {name:?} of Network {second:?} collides with the one of Network {first:?}")]
    VrfNameCollision {
        name: String,
        first: String,
        second: String,
    },
    #[error("pod {pod} (container {container_id:?}) is attached to Network {network:?}, which has no VRF on node {node:?} (missing, external or not allocated)")]
    UnknownAttachmentNetwork {
        pod: ObjectKey,
        container_id: String,
        network: String,
        node: String,
    },
    #[error(
        "pod {pod} has address {address}, outside node {node:?}'s blocks of Network {network:?}"
    )]
    AddressOutsideBlock {
        pod: ObjectKey,
        address: IpAddr,
        network: String,
        node: String,
    },
    #[error("address {address} is attached to both pod {first} and pod {second}")]
    DuplicateAddress {
        address: IpAddr,
        first: ObjectKey,
        second: ObjectKey,
    },
}

/// The VRF table id of a Network with SID function `function`.
pub fn vrf_table(function: u16) -> u32 {
    VRF_TABLE_BASE + u32::from(function)
}

/// The VRF device name of Network `network` (SID function `function`), at most 15 bytes.
///
/// Short names are kept whole (`lv-tenant-a`). Longer ones (or ones with characters an
/// interface name should not carry) become `lv-<first 7 chars>_<function as 4 hex digits>`.
/// Kubernetes names never contain `_`, so the two forms cannot collide, and the function is
/// unique per Network, so no two long forms collide either.
pub fn vrf_name(network: &str, function: u16) -> String {
    let plain = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let room = IFNAME_MAX - VRF_PREFIX.len();
    if !network.is_empty() && network.len() <= room && network.chars().all(plain) {
        return format!("{VRF_PREFIX}{network}");
    }
    let head: String = network
        .chars()
        .take(room - 5)
        .map(|c| if plain(c) { c } else { '-' })
        .collect();
    format!("{VRF_PREFIX}{head}_{function:04x}")
}

/// The sysctl that switches IPv6 off on device `dev`. Lace sets it to `0` on each of its own
/// devices that carries IPv6 (VRFs, [`underlay::IPV4_TUNNEL`], the veths of pods with an IPv6
/// address), before their addresses and routes: a host that disables IPv6 by default
/// (`net.ipv6.conf.default.disable_ipv6=1`) has every device created later inherit it.
pub fn disable_ipv6_key(dev: &str) -> String {
    format!("net.ipv6.conf.{dev}.disable_ipv6")
}

/// `net.ipv4.fib_sync_mem`: how many bytes of IPv4 FIB trie nodes freed while routes change
/// may wait for an RCU grace period before the writer blocks in `synchronize_rcu()` to let them
/// go. At the kernel's default (512 KiB) a node installing 290,000 routes waited for 267 grace
/// periods, a fifth of its first apply (the 6.1 test VM, `netns-tests/bench.sh --scale`); Lace
/// raises it to the kernel's maximum, [`FIB_SYNC_MEM_BYTES`]: the nodes are freed either way,
/// by RCU in the background. A floor, not a value: a larger one stays (the diff never lowers
/// it), and only the initial network namespace has it (the kernel registers it there alone), so
/// where the file is absent (a node in a namespace of its own) there is nothing to raise.
pub const FIB_SYNC_MEM: &str = "net.ipv4.fib_sync_mem";
/// The value Lace raises [`FIB_SYNC_MEM`] to: the largest the kernel accepts (64 MiB).
pub const FIB_SYNC_MEM_BYTES: u64 = 64 << 20;

/// Prefixes of the per-device sysctls, each followed by `<device>.<leaf>`.
const DEVICE_SYSCTL_PREFIXES: [&str; 4] = [
    "net.ipv4.conf.",
    "net.ipv6.conf.",
    "net.ipv4.neigh.",
    "net.ipv6.neigh.",
];

/// The per-device sysctl `key` split into its prefix (without the trailing dot), device and
/// leaf: `net.ipv4.conf.lv-a.b.rp_filter` is device `lv-a.b` (interface names may contain dots;
/// everything between the prefix and the last component is the name). `None` for other keys.
/// `all` and `default` come back as devices too.
pub fn split_device_sysctl(key: &str) -> Option<(&'static str, &str, &str)> {
    DEVICE_SYSCTL_PREFIXES.iter().find_map(|prefix| {
        let (dev, leaf) = key.strip_prefix(prefix)?.rsplit_once('.')?;
        Some((prefix.trim_end_matches('.'), dev, leaf))
    })
}

/// The device a per-device sysctl `key` names ([`split_device_sysctl`]).
pub fn sysctl_device(key: &str) -> Option<&str> {
    split_device_sysctl(key).map(|(_, dev, _)| dev)
}

fn host_net(addr: IpAddr) -> IpNet {
    match addr {
        IpAddr::V4(a) => IpNet::V4(Ipv4Net::from(a)),
        IpAddr::V6(a) => IpNet::V6(Ipv6Net::from(a)),
    }
}

/// One Network's VRF on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vrf {
    pub network: String,
    pub table: u32,
    pub function: u16,
    /// `locator::function` on this node, decapsulating into this VRF.
    pub sid: Ipv6Addr,
    /// The VRF's ingress device ([`INGRESS_PREFIX`]), while its Network receives NodePort
    /// traffic: a dummy enslaved to the VRF, up.
    pub ingress: Option<String>,
}

/// A route's identity in the kernel: table, destination and metric (Lace uses no TOS). Lace
/// plans one route per table and destination, with the metric [`RouteKey::new`] gives it;
/// what the kernel reports keeps the metric it has, so a route of Lace's at another metric
/// (written by an older Lace, or by hand) is another key, deleted as unplanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouteKey {
    pub table: u32,
    pub dst: IpNet,
    pub metric: u32,
}

/// By table, destination and metric; destinations in `IpNet`'s order (IPv4 before IPv6, then
/// address and prefix length), their addresses compared as integers. (Derived, the order
/// compares addresses byte by byte through calls that do not inline: sorting a node's 300,000
/// routes took half of its plan.)
impl Ord for RouteKey {
    #[inline]
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        let dst = |a: &IpNet, b: &IpNet| match (a, b) {
            (IpNet::V4(a), IpNet::V4(b)) => {
                (a.addr().to_bits(), a.prefix_len()).cmp(&(b.addr().to_bits(), b.prefix_len()))
            }
            (IpNet::V6(a), IpNet::V6(b)) => {
                (a.addr().to_bits(), a.prefix_len()).cmp(&(b.addr().to_bits(), b.prefix_len()))
            }
            (IpNet::V4(_), IpNet::V6(_)) => Ordering::Less,
            (IpNet::V6(_), IpNet::V4(_)) => Ordering::Greater,
        };
        (self.table.cmp(&other.table))
            .then_with(|| dst(&self.dst, &other.dst))
            .then_with(|| self.metric.cmp(&other.metric))
    }
}

impl PartialOrd for RouteKey {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Table ids from one on, up to another or to the last: what a walk of a plan's or the
/// kernel's routes covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tables {
    from: u32,
    /// The first table past the range; `None`: none.
    to: Option<u32>,
}

impl Tables {
    /// Every table.
    pub const ALL: Self = Self { from: 0, to: None };

    /// The tables before `table`.
    pub fn below(table: u32) -> Self {
        Self {
            from: 0,
            to: Some(table),
        }
    }

    /// `table` and the tables after it.
    pub fn from(table: u32) -> Self {
        Self {
            from: table,
            to: None,
        }
    }

    /// As bounds of table ids (start never past end).
    pub fn ids(self) -> (std::ops::Bound<u32>, std::ops::Bound<u32>) {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        (Included(self.from), self.to.map_or(Unbounded, Excluded))
    }

    /// As bounds of route keys: from the first key of the first table to the first key of the
    /// table past the range.
    pub fn keys(self) -> (std::ops::Bound<RouteKey>, std::ops::Bound<RouteKey>) {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        (
            Included(RouteKey::first_of(self.from)),
            self.to
                .map_or(Unbounded, |t| Excluded(RouteKey::first_of(t))),
        )
    }
}

impl RouteKey {
    /// The smallest key of table `table` (`0.0.0.0/0` at metric 0).
    pub fn first_of(table: u32) -> Self {
        Self {
            table,
            dst: IpNet::V4(Ipv4Net::default()),
            metric: 0,
        }
    }
}

/// The kernel's metric for an IPv6 route added without one (`IP6_RT_PRIO_USER`).
pub const IPV6_METRIC: u32 = 1024;

impl RouteKey {
    /// Lace's route to `dst` in `table`, at its metric: [`IPV6_METRIC`] for IPv6, 0 for IPv4 in
    /// the main table (where the host's own routes are) and, for IPv4 in Lace's other tables,
    /// 1 + 16 bits of a hash of table and destination. The kernel shares one `fib_info` among
    /// IPv4 routes alike in device, protocol, scope, source and metric, and finds it through a
    /// hash of those fields alone, not the encapsulation: every seg6 route through one uplink
    /// at one metric lands in one hash chain, and each insert compares with all earlier ones
    /// (measured: the first apply of 59,180 routes took 63 s in the test VM). Spread over
    /// 65,536 metrics, a chain holds a handful. Metrics order only routes to the same
    /// destination in one table, of which Lace plans one.
    pub fn new(table: u32, dst: IpNet) -> Self {
        let metric = match dst {
            IpNet::V6(_) => IPV6_METRIC,
            IpNet::V4(_) if table == MAIN_TABLE => 0,
            IpNet::V4(d) => {
                let bytes = table.to_be_bytes().into_iter().chain(d.addr().octets());
                let h = crate::hash::fnv1a64(bytes.chain([d.prefix_len()]));
                1 + (h & 0xFFFF) as u32
            }
        };
        Self { table, dst, metric }
    }

    /// ` metric <metric>` unless the metric is the family's default (0 for IPv4,
    /// [`IPV6_METRIC`] for IPv6), for what Lace prints of a route.
    pub fn metric_suffix(&self) -> String {
        let default = match self.dst {
            IpNet::V4(_) => 0,
            IpNet::V6(_) => IPV6_METRIC,
        };
        match self.metric == default {
            true => String::new(),
            false => format!(" metric {}", self.metric),
        }
    }
}

/// What a route does with matching packets.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Nexthop {
    /// `dev <name>`: a local pod's host-side veth, or another Network's VRF (leaked route).
    Dev(String),
    /// `dev <name> src <src>`: a kubelet-probe route to a local pod. A link-local `src`
    /// ([`POD_GATEWAY_V6`]) is an address of `dev` itself, which the reconciler adds
    /// (`/`[`POD_GATEWAY_V6_PREFIX`], `nodad`) before the route; any other `src` is an address
    /// the node holds already.
    DevSrc { dev: String, src: IpAddr },
    /// `encap seg6 mode encap segs <segs> dev <uplink | uplink4 | lu-ipv4>`: to a remote
    /// node's SID of the target Network, whose locator is reached over `underlay` (IPv6: the
    /// uplink; link-local: the link holding the IPv4 InternalIP; fou: [`IPV4_TUNNEL`]). The
    /// outer packet is routed again after encapsulation (in the main table, by the rule at
    /// [`RULE_PRIORITY_LOCATORS`]), so no gateway is needed here.
    Seg6Encap { segs: Ipv6Addr, underlay: Underpath },
    /// `encap seg6 mode encap segs <segs> dev <li-…>`: a remote backend of a Service granted
    /// from an external Network, in its Network's table, through the Network's ingress device
    /// ([`INGRESS_PREFIX`]). NodePort traffic reaches this route from the main table through
    /// the VRF device's transmit path (after its source NAT in postrouting), where a seg6
    /// encap route works only with a device enslaved to the VRF (checked on 6.1: with the
    /// uplink the lookup falls through to the main table, with the VRF itself the packet is
    /// received again and leaves without its source NAT). Pods' packets through the same
    /// route are encapsulated at route input, as through [`Nexthop::Seg6Encap`].
    Seg6EncapIngress { segs: Ipv6Addr, dev: String },
    /// `encap seg6local action End.DT46 vrftable <table> dev <vrf>`: a local SID.
    Seg6LocalDt46 { vrf_table: u32, vrf: String },
    /// `via <via> dev <uplink>`: a remote node's locator through its IPv6 underlay address.
    Underlay { via: Ipv6Addr },
    /// `via <fe80::…> dev <uplink4>`: a remote node's locator through its link-local underlay
    /// address on the link holding this node's IPv4 InternalIP (the shared L2 segment).
    LinkLocal { via: Ipv6Addr },
    /// `via ::<via> dev lu-ipv4`: a remote node's locator over IPv4, through Lace's
    /// SRv6-over-IPv4 device; the IPv4-compatible next hop names the outer IPv4 destination.
    Ipv4Tunnel { via: Ipv4Addr },
    /// Host routing: whatever the main table resolves for the destination (gateway, device).
    Host,
    /// `unreachable`: nothing leaks out of a VRF by accident.
    Unreachable,
}

impl fmt::Display for Nexthop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Nexthop::Dev(d) => write!(f, "dev {d}"),
            Nexthop::DevSrc { dev, src } => write!(f, "dev {dev} src {src}"),
            Nexthop::Seg6Encap {
                segs,
                underlay: Underpath::Ipv6,
            } => write!(f, "encap seg6 mode encap segs {segs} dev @uplink"),
            Nexthop::Seg6Encap {
                segs,
                underlay: Underpath::LinkLocal,
            } => write!(f, "encap seg6 mode encap segs {segs} dev @uplink4"),
            Nexthop::Seg6Encap {
                segs,
                underlay: Underpath::Fou,
            } => write!(f, "encap seg6 mode encap segs {segs} dev {IPV4_TUNNEL}"),
            Nexthop::Seg6EncapIngress { segs, dev } => {
                write!(f, "encap seg6 mode encap segs {segs} dev {dev}")
            }
            Nexthop::Seg6LocalDt46 { vrf_table, vrf } => {
                write!(
                    f,
                    "encap seg6local action End.DT46 vrftable {vrf_table} dev {vrf}"
                )
            }
            Nexthop::Underlay { via } => write!(f, "via {via} dev @uplink"),
            Nexthop::LinkLocal { via } => write!(f, "via {via} dev @uplink4"),
            Nexthop::Ipv4Tunnel { via } => write!(f, "via ::{via} dev {IPV4_TUNNEL}"),
            Nexthop::Host => write!(f, "via @host-route"),
            Nexthop::Unreachable => write!(f, "unreachable"),
        }
    }
}

/// An IP family (of a rule, of an underlay).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

/// Which underlay an encapsulated packet leaves through (see [`underlay`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Underpath {
    /// Natively over IPv6: the link holding the node's IPv6 InternalIP (`@uplink`).
    Ipv6,
    /// Natively over IPv6 with a link-local next hop: the link holding the node's IPv4
    /// InternalIP (`@uplink4`).
    LinkLocal,
    /// In UDP over IPv4: [`IPV4_TUNNEL`].
    Fou,
}

/// What a routing rule matches and where it looks up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RuleAction {
    /// `l3mdev`: look up the table of the flow's VRF.
    L3mdev,
    /// `fwmark <mark>/<mask> lookup <table>`.
    Fwmark { mark: u32, mask: u32, table: u32 },
    /// `to <dst> lookup <table>` (IPv6).
    ToPrefix { dst: Ipv6Net, table: u32 },
    /// `iif lo lookup <table>`: packets the node itself sends.
    FromHost { table: u32 },
}

/// A routing-policy rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    pub priority: u32,
    pub family: Family,
    pub action: RuleAction,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fam = match self.family {
            Family::V4 => "-4",
            Family::V6 => "-6",
        };
        match self.action {
            RuleAction::L3mdev => write!(f, "{fam} pref {} l3mdev", self.priority),
            RuleAction::Fwmark { mark, mask, table } => {
                write!(
                    f,
                    "{fam} pref {} fwmark {mark:#x}/{mask:#x} lookup {table}",
                    self.priority
                )
            }
            RuleAction::ToPrefix { dst, table } => {
                write!(f, "{fam} pref {} to {dst} lookup {table}", self.priority)
            }
            RuleAction::FromHost { table } => {
                write!(f, "{fam} pref {} iif lo lookup {table}", self.priority)
            }
        }
    }
}

/// A Network that pods on this node can be attached to.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PodNetwork {
    table: u32,
    vrf: String,
    blocks: Vec<IpNet>,
    /// `spec.hostAccess`: its pods' probe routes are copied into [`HOST_ACCESS_TABLE`].
    host_access: bool,
}

/// The pod-independent part of a node's plan (shared between incremental plans).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeBase {
    pub locator: Ipv6Net,
    /// This node's underlay addresses (its first InternalIP of each family).
    pub underlay: Underlay,
    /// `ip sr tunsrc set`: the outer source of encapsulated packets, which the other nodes'
    /// ingress guard accepts ([`underlay::tunnel_source`]).
    pub seg6_tunsrc: Ipv6Addr,
    /// How each other node (by name) is reached.
    pub peers: BTreeMap<String, PeerPath>,
    /// Lace's SRv6-over-IPv4 device and fou listener, when some peer is reached over IPv4.
    pub ipv4_tunnel: Option<Ipv4Tunnel>,
    /// This node's link-local underlay address ([`underlay::link_local_address`] of its IPv4
    /// InternalIP), held on `@uplink4` (`/64`, `nodad`) while some peer shares its L2 segment
    /// and the uplink has IPv6 on.
    pub link_local: Option<Ipv6Addr>,
    /// What the plan was made with about the uplink and the peers (the agent's probes).
    pub facts: UnderlayFacts,
    /// By device name.
    pub vrfs: BTreeMap<String, Vrf>,
    /// The routes installed whatever pods the node has.
    pub routes: RouteTable,
    /// Each VRF table's routes to the blocks its Network reaches (the other nodes' blocks,
    /// and this node's of the other Networks it reaches): installed while the Network has a
    /// pod on this node ([`DesiredNode::served_tables`]), since only its local pods' packets
    /// are looked up there for them. A node with pods in a few of many Networks holds a few
    /// Networks' worth of per-node routes.
    pub pod_reach: RouteTable,
    pub rules: BTreeSet<Rule>,
    /// Sysctl key (dotted) → value.
    pub sysctls: BTreeMap<String, String>,
    pub nft: nft::Ruleset,
    /// Source address of IPv4 kubelet probes (`src` of the IPv4 [`PROBE_TABLE`] routes): the
    /// node's IPv4 InternalIP. Without it the kernel picks 0.0.0.0 (verified in a VM): the pod
    /// veths carry no address and source selection stays inside their VRF. IPv6 routes use
    /// [`POD_GATEWAY_V6`] instead: the kernel rejects a `src` outside the device's VRF.
    pub probe_src_v4: Option<IpAddr>,
    pod_networks: BTreeMap<String, PodNetwork>,
}

impl NodeBase {
    /// The path each peer is expected to take, for sizing the pods' MTU: the one planned,
    /// except that a pair on fou whose peer shares this node's L2 segment and answered its
    /// probes before (fallen back for a moment) counts as link-local. Pods keep their MTU:
    /// TCP over fou is then kept to what fou carries by the MSS clamp
    /// ([`underlay::mss_clamp`]).
    pub fn expected_paths(&self) -> Vec<PeerPath> {
        self.peers
            .iter()
            .map(|(n, p)| match p {
                PeerPath::Ipv4(v4) if self.facts.link_local_expected(n) => {
                    PeerPath::LinkLocal(underlay::link_local_address(*v4))
                }
                p => *p,
            })
            .collect()
    }
}

/// Everything one node's kernel must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredNode {
    pub node: String,
    /// The pod-independent part.
    pub base: Arc<NodeBase>,
    /// Routes of local pods: `/32` `/128` in their Network's table and in [`PROBE_TABLE`],
    /// in [`HOST_ACCESS_TABLE`] for pods of Networks with `hostAccess`, and in the main table
    /// for pods with hostPorts.
    pub pod_routes: BTreeMap<RouteKey, Nexthop>,
    /// The VRF tables of the Networks with a pod on this node: the base's
    /// [`NodeBase::pod_reach`] routes of these tables are part of the plan.
    pub served_tables: BTreeSet<u32>,
    /// The base's ruleset with the local pods' hostPort elements, when there are any.
    pub host_port_nft: Option<Arc<nft::Ruleset>>,
    /// The local pods' bandwidth shaping, by host-side veth.
    pub shaping: BTreeMap<String, shaping::Shaping>,
}

impl DesiredNode {
    /// Every table the plan has a route, a VRF or a rule's lookup in, and the tables Lace
    /// always owns (main, [`PROBE_TABLE`], [`HOST_ACCESS_TABLE`]): the tables whose routes
    /// can carry the plan's traffic.
    pub fn tables(&self) -> BTreeSet<u32> {
        let rules = self.base.rules.iter().filter_map(|r| match r.action {
            RuleAction::L3mdev => None,
            RuleAction::Fwmark { table, .. }
            | RuleAction::ToPrefix { table, .. }
            | RuleAction::FromHost { table } => Some(table),
        });
        let served = self
            .base
            .pod_reach
            .tables()
            .filter(|t| self.served_tables.contains(t));
        [MAIN_TABLE, PROBE_TABLE, HOST_ACCESS_TABLE]
            .into_iter()
            .chain(self.base.routes.tables())
            .chain(served)
            .chain(self.pod_routes.keys().map(|k| k.table))
            .chain(self.base.vrfs.values().map(|v| v.table))
            .chain(rules)
            .collect()
    }

    /// The route for `key`, if planned.
    pub fn route(&self, key: &RouteKey) -> Option<&Nexthop> {
        self.pod_routes
            .get(key)
            .or_else(|| {
                self.served_tables
                    .contains(&key.table)
                    .then(|| self.base.pod_reach.get(key))
                    .flatten()
            })
            .or_else(|| self.base.routes.get(key))
    }

    /// All routes, sorted by (table, destination): the base's, its [`NodeBase::pod_reach`]
    /// routes of the served tables over them, the pods' routes over both (under one key there
    /// are none of the latter by construction: pod routes are host routes of local pods).
    pub fn routes(&self) -> impl Iterator<Item = (&RouteKey, &Nexthop)> {
        self.routes_of_tables(Tables::ALL)
    }

    /// [`DesiredNode::routes`] of the tables in `tables`.
    pub fn routes_of_tables(&self, tables: Tables) -> impl Iterator<Item = (&RouteKey, &Nexthop)> {
        self.route_runs_of_tables(tables).flat_map(|run| {
            let (routes, one) = match run {
                PlannedRun::Routes(routes) => (routes, None),
                PlannedRun::One(key, nh) => (&[][..], Some((key, nh))),
            };
            routes.iter().map(|(k, nh)| (k, nh)).chain(one)
        })
    }

    /// [`DesiredNode::routes_of_tables`] in runs: the longest runs of the base's routes and
    /// of its [`NodeBase::pod_reach`] routes (of the served tables, over the base's) that
    /// nothing else falls between, and the pods' routes (over both) one by one. Most of a
    /// large node's routes come in a few runs, for a diff to compare as lists.
    pub fn route_runs_of_tables(&self, tables: Tables) -> impl Iterator<Item = PlannedRun<'_>> {
        // By preference: a later list's route replaces an earlier's under one key.
        let mut lists: Vec<&[(RouteKey, Nexthop)]> =
            std::iter::once(self.base.routes.slice_of_tables(tables))
                .chain(
                    self.base
                        .pod_reach
                        .slices_in_tables(&self.served_tables, tables),
                )
                .collect();
        let mut pods = self.pod_routes.range(tables.keys()).peekable();
        std::iter::from_fn(move || {
            // The smallest key, the last list's of equal ones.
            let first = lists
                .iter()
                .enumerate()
                .filter_map(|(i, l)| Some((l.first()?.0, i)))
                .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            let pod = pods.peek().map(|&(k, _)| *k);
            let key = match (first, pod) {
                (Some((key, _)), Some(pod)) => key.min(pod),
                (Some((key, _)), None) => key,
                (None, Some(pod)) => pod,
                (None, None) => return None,
            };
            let from = first.filter(|_| pod != Some(key)).map(|(_, i)| i);
            // The replaced routes under that key go.
            for (i, l) in lists.iter_mut().enumerate() {
                if Some(i) != from && l.first().is_some_and(|(k, _)| *k == key) {
                    *l = &l[1..];
                }
            }
            let Some(from) = from else {
                let (key, nh) = pods.next()?;
                return Some(PlannedRun::One(key, nh));
            };
            // Up to the next key of another list or a pod.
            let until = lists
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != from)
                .filter_map(|(_, l)| Some(l.first()?.0))
                .chain(pod)
                .min();
            let list = &mut lists[from];
            let len = until.map_or(list.len(), |u| list.partition_point(|(k, _)| *k < u));
            let (run, rest) = list.split_at(len);
            *list = rest;
            Some(PlannedRun::Routes(run))
        })
    }

    /// The nftables ruleset: the base's, with the local pods' hostPorts.
    pub fn nft(&self) -> &nft::Ruleset {
        self.host_port_nft.as_deref().unwrap_or(&self.base.nft)
    }

    /// The nftables ruleset as `nft -f` text.
    pub fn render_nft(&self) -> String {
        self.nft().render()
    }

    /// [`DesiredNode::render_nft`] to run elsewhere (another thread): holds the ruleset, not
    /// the plan.
    pub fn render_nft_later(&self) -> impl FnOnce() -> String + Send + 'static {
        let base = Arc::clone(&self.base);
        let host_ports = self.host_port_nft.clone();
        move || host_ports.as_deref().unwrap_or(&base.nft).render()
    }

    /// A human-readable rendering of everything but the nft ruleset, in `ip`-like syntax
    /// (shaping in `tc`'s).
    pub fn render(&self) -> String {
        let b = &self.base;
        let mut out = String::new();
        let _ = writeln!(out, "# Lace plan for node {}", self.node);
        let mut underlay = String::new();
        if let Some(v4) = b.underlay.ipv4 {
            let _ = write!(underlay, " ipv4 {v4}");
        }
        if let Some(v6) = b.underlay.ipv6 {
            let _ = write!(underlay, " ipv6 {v6}");
        }
        let _ = writeln!(
            out,
            "locator {}  underlay{underlay}  seg6 tunsrc {}",
            b.locator, b.seg6_tunsrc
        );
        let _ = writeln!(out, "\n## underlay");
        for (peer, path) in &b.peers {
            let _ = match path {
                PeerPath::Ipv6(via) => writeln!(out, "peer {peer} ipv6 via {via}"),
                PeerPath::LinkLocal(via) => {
                    writeln!(out, "peer {peer} link-local via {via} dev @uplink4")
                }
                PeerPath::Ipv4(via) if b.facts.uplink_ipv6 && b.facts.on_link.contains(peer) => {
                    writeln!(
                        out,
                        "peer {peer} fou via {via} (on this L2 segment; link-local once its {} answers)",
                        underlay::link_local_address(*via)
                    )
                }
                PeerPath::Ipv4(via) => writeln!(out, "peer {peer} fou via {via}"),
                PeerPath::NoCommonFamily => {
                    writeln!(out, "peer {peer} unreachable: no common address family")
                }
            };
        }
        if let Some(a) = b.link_local {
            let _ = writeln!(
                out,
                "addr {a}/{} dev @uplink4 nodad",
                underlay::LINK_LOCAL_PREFIX
            );
        }
        if let Some(t) = &b.ipv4_tunnel {
            let _ = writeln!(
                out,
                "link {IPV4_TUNNEL} type sit remote any local {} ttl inherit pmtudisc encap fou \
                 encap-sport auto encap-dport {} mtu @uplink4-{}",
                t.local,
                underlay::FOU_PORT,
                underlay::IPV4_FOU_OVERHEAD
            );
            if let Some(a) = t.address {
                let _ = writeln!(out, "addr {a}/128 dev {IPV4_TUNNEL} nodad");
            }
            let _ = writeln!(
                out,
                "fou port {} ipproto {}",
                underlay::FOU_PORT,
                underlay::FOU_IPPROTO
            );
        }
        let _ = writeln!(out, "\n## sysctls");
        for (k, v) in &b.sysctls {
            let _ = writeln!(out, "{k} = {v}");
        }
        let _ = writeln!(out, "\n## vrfs");
        for (name, v) in &b.vrfs {
            // Why a VRF's table may hold no routes to other nodes' blocks.
            let pods = if self.served_tables.contains(&v.table) {
                "pods here"
            } else {
                "no pods here (no routes to blocks)"
            };
            let _ = writeln!(
                out,
                "{name:<15} network {:<12} table {}  sid {}  {pods}",
                v.network, v.table, v.sid
            );
            if let Some(dev) = &v.ingress {
                let _ = writeln!(out, "link {dev} type dummy master {name} up");
            }
        }
        let _ = writeln!(out, "\n## rules");
        for r in &b.rules {
            let _ = writeln!(out, "{r}");
        }
        let table_names: HashMap<u32, &str> =
            b.vrfs.iter().map(|(n, v)| (v.table, n.as_str())).collect();
        let mut current = None;
        for (k, nh) in self.routes() {
            if current != Some(k.table) {
                current = Some(k.table);
                let label = match k.table {
                    MAIN_TABLE => "main".to_string(),
                    PROBE_TABLE => "kubelet probes".to_string(),
                    HOST_ACCESS_TABLE => "host processes, Networks with hostAccess".to_string(),
                    t => format!("vrf {}", table_names.get(&t).copied().unwrap_or("?")),
                };
                let _ = writeln!(out, "\n## table {} ({label})", k.table);
            }
            let dst = if k.dst.prefix_len() == 0 {
                "default".to_string()
            } else {
                k.dst.to_string()
            };
            let fam = if matches!(k.dst, IpNet::V6(_)) {
                "-6 "
            } else {
                ""
            };
            let _ = writeln!(out, "{fam}{dst} {nh}{}", k.metric_suffix());
        }
        shaping::render(&self.shaping, &mut out);
        out
    }
}

/// Planned routes of [`DesiredNode::route_runs_of_tables`]: a run of the base's routes or of
/// its [`NodeBase::pod_reach`] routes, or a pod's route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlannedRun<'a> {
    Routes(&'a [(RouteKey, Nexthop)]),
    One(&'a RouteKey, &'a Nexthop),
}

/// Plans node `node`: the pure entry point. See [`Planner`] for the incremental form. Nothing
/// is known about the node's links ([`UnderlayFacts::default`]): see [`plan_with`].
pub fn plan(
    node: &str,
    state: &ClusterState,
    local: &[PodAttachment],
) -> Result<DesiredNode, PlanError> {
    Planner::new(node, state)?.plan(local)
}

/// [`plan`] with what the node found out about its uplink and peers (`facts`).
pub fn plan_with(
    node: &str,
    state: &ClusterState,
    facts: &UnderlayFacts,
    local: &[PodAttachment],
) -> Result<DesiredNode, PlanError> {
    Planner::with_facts(node, state, facts)?.plan(local)
}

/// Caches the pod-independent part of a node's plan. Rebuild it with [`Planner::new`] when the
/// cluster state changes; call [`Planner::plan`] when only the local attachments changed.
#[derive(Clone, Debug)]
pub struct Planner {
    node: String,
    base: Arc<NodeBase>,
}

impl Planner {
    /// Computes the pod-independent part of node `node`'s plan, knowing nothing of its links.
    pub fn new(node: &str, state: &ClusterState) -> Result<Self, PlanError> {
        Self::with_facts(node, state, &UnderlayFacts::default())
    }

    /// Computes the pod-independent part of node `node`'s plan with `facts` about its uplink
    /// and peers.
    pub fn with_facts(
        node: &str,
        state: &ClusterState,
        facts: &UnderlayFacts,
    ) -> Result<Self, PlanError> {
        Ok(Self {
            node: node.to_string(),
            base: Arc::new(base::build_base(node, state, facts)?),
        })
    }

    /// The cached pod-independent part.
    pub fn base(&self) -> &Arc<NodeBase> {
        &self.base
    }

    /// The full plan for these local attachments (cost: the attachments only).
    pub fn plan(&self, local: &[PodAttachment]) -> Result<DesiredNode, PlanError> {
        let mut pod_routes = BTreeMap::new();
        let mut served_tables = BTreeSet::new();
        let mut host_ports = hostport::Mapped::default();
        let mut owners: HashMap<IpAddr, &ObjectKey> = HashMap::new();
        for att in local {
            let Some(pn) = self.base.pod_networks.get(&att.network) else {
                return Err(PlanError::UnknownAttachmentNetwork {
                    pod: att.pod.clone(),
                    container_id: att.container_id.clone(),
                    network: att.network.clone(),
                    node: self.node.clone(),
                });
            };
            served_tables.insert(pn.table);
            for ip in &att.ips {
                let address = ip.addr();
                if !pn.blocks.iter().any(|b| b.contains(&address)) {
                    return Err(PlanError::AddressOutsideBlock {
                        pod: att.pod.clone(),
                        address,
                        network: att.network.clone(),
                        node: self.node.clone(),
                    });
                }
                if let Some(first) = owners.insert(address, &att.pod) {
                    return Err(PlanError::DuplicateAddress {
                        address,
                        first: first.clone(),
                        second: att.pod.clone(),
                    });
                }
                pod_routes.insert(
                    RouteKey::new(pn.table, host_net(address)),
                    Nexthop::Dev(att.host_ifname.clone()),
                );
                let src = if address.is_ipv6() {
                    Some(IpAddr::V6(POD_GATEWAY_V6))
                } else {
                    self.base.probe_src_v4
                };
                let probe = match src {
                    Some(src) => Nexthop::DevSrc {
                        dev: att.host_ifname.clone(),
                        src,
                    },
                    None => Nexthop::Dev(att.host_ifname.clone()),
                };
                if pn.host_access {
                    pod_routes.insert(
                        RouteKey::new(HOST_ACCESS_TABLE, host_net(address)),
                        probe.clone(),
                    );
                }
                pod_routes.insert(RouteKey::new(PROBE_TABLE, host_net(address)), probe);
            }
            host_ports.add(att, &pn.vrf);
        }
        let host_port_nft = host_ports.ruleset(&self.base.nft).map(Arc::new);
        pod_routes.append(&mut host_ports.routes);
        Ok(DesiredNode {
            node: self.node.clone(),
            base: Arc::clone(&self.base),
            pod_routes,
            served_tables,
            host_port_nft,
            shaping: shaping::plan(local),
        })
    }
}

/// One internal Network as the planner sees it.
struct NetInfo<'a> {
    name: &'a str,
    vrf: String,
    table: u32,
    function: u16,
    has_v4: bool,
    has_v6: bool,
    subnets: Vec<IpNet>,
    /// The Network's subnets with their block sizes: each node's blocks derive from them.
    spec_subnets: &'a [crate::api::Subnet],
}

/// The internal Networks by name.
type Networks<'a> = BTreeMap<&'a str, NetInfo<'a>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vrf_names() {
        let cases = [
            ("system", 1, "lv-system"),
            ("tenant-a", 7, "lv-tenant-a"),
            ("twelve-chars", 3, "lv-twelve-chars"),
            ("thirteen-char", 0x2a, "lv-thirtee_002a"),
            ("a-very-long-network-name", 0xbeef, "lv-a-very-_beef"),
            ("Upper", 5, "lv--pper_0005"),
        ];
        for (net, f, want) in cases {
            let got = vrf_name(net, f);
            assert_eq!(got, want, "Network {net:?}");
            assert!(got.len() <= IFNAME_MAX, "{got:?} too long");
        }
    }

    #[test]
    fn long_names_sharing_a_prefix_stay_unique() {
        let a = vrf_name("customer-tenant-1", 1);
        let b = vrf_name("customer-tenant-2", 2);
        assert_ne!(a, b);
    }

    #[test]
    fn table_ids_stay_in_the_owned_range() {
        assert_eq!(vrf_table(0), VRF_TABLE_BASE);
        assert!(vrf_table(u16::MAX) < PROBE_TABLE);
        assert_eq!(HOST_ACCESS_TABLE, PROBE_TABLE + 1);
        const { assert!(VRF_TABLE_BASE > MAIN_TABLE) };
    }
}
