//! The planner: from [`ClusterState`] and this node's pod attachments, exactly what the node's
//! kernel must hold — VRFs, routes, rules, sysctls and the nftables ruleset.
//!
//! Pure and deterministic: the same input gives an identical [`DesiredNode`] (every collection
//! is sorted), which the reconciler diffs against what it observes and applies over netlink.
//!
//! Ownership, so the reconciler touches only what Lace made:
//! - table ids [`VRF_TABLE_BASE`]`..=`[`PROBE_TABLE`] (one VRF table per Network: base + the
//!   Network's SID function, so every node uses the same id for the same Network);
//! - rule priorities [`RULE_PRIORITY_PROBE`]`..=`[`RULE_PRIORITY_L3MDEV`];
//! - interface names starting with [`VRF_PREFIX`] (VRFs) and [`underlay::TUNNEL_PREFIX`] (the
//!   SRv6-over-IPv4 device), and the fou listener on [`underlay::FOU_PORT`];
//! - nftables table `inet lace` ([`nft::TABLE`]);
//! - routes in the main table are only SIDs, node locators and reply routes for pod blocks.
//!
//! Which underlay reaches each other node (IPv6, or SRv6 over IPv4) is decided per pair; see
//! [`underlay`].
//!
//! Two next hops are symbolic because they name host configuration the cluster state does not
//! carry: [`Nexthop::Underlay`] / [`Nexthop::Seg6Encap`] over IPv6 leave through the *uplink*
//! (the link that holds this node's IPv6 underlay address) and [`Nexthop::Host`] copies what
//! the main table resolves for the destination (host routing). The reconciler resolves both
//! when applying, and sizes [`underlay::IPV4_TUNNEL`] after the link holding the node's IPv4
//! underlay address.
//!
//! `tests/vm/datapath.sh` applies the node-1/node-2 golden plans to namespaces on a Debian
//! 6.1 kernel and checks real traffic: pairs, replies, leaks, egress masquerade, Service
//! grants through a kube-proxy stand-in, kubelet probes (IPv4 and IPv6), the SRv6 guard.
//!
//! For the incremental case, [`Planner`] keeps the pod-independent part (which is almost all
//! of it: remote blocks grow with nodes × Networks) behind an [`Arc`] and recomputes only the
//! routes of the local pods when attachments change.

pub mod nft;
pub mod underlay;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::alloc::node_blocks;
use crate::api::{NodeAllocationSpec, Underlay};
use crate::routing::{allowed_pairs, service_grants, BackendLocation};
use crate::sid::sid;
use crate::state::{ClusterState, ObjectKey, PodAttachment};
use underlay::{peer_path, tunnel_source, Ipv4Tunnel, PeerPath, IPV4_TUNNEL};

/// First table id Lace owns. A Network's VRF table is `VRF_TABLE_BASE + function`, so ids
/// are equal on all nodes and readable (`1000042` is function 42). Far above the ids distros
/// and other CNIs use (main 254, local 255, default 253, small numbers for policy routing).
pub const VRF_TABLE_BASE: u32 = 1_000_000;
/// The kubelet-probe table (routes to every local pod), the last id Lace owns.
pub const PROBE_TABLE: u32 = VRF_TABLE_BASE + 1 + u16::MAX as u32;
/// The kernel's main table.
pub const MAIN_TABLE: u32 = 254;
/// Priority of the fwmark rule that sends kubelet probes to [`PROBE_TABLE`]. Before the
/// l3mdev rule (1000) so a marked packet never enters a VRF lookup.
pub const RULE_PRIORITY_PROBE: u32 = 990;
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

fn host_net(addr: IpAddr) -> IpNet {
    match addr {
        IpAddr::V4(a) => IpNet::V4(Ipv4Net::from(a)),
        IpAddr::V6(a) => IpNet::V6(Ipv6Net::from(a)),
    }
}

fn default_net(v6: bool) -> IpNet {
    if v6 {
        IpNet::V6(Ipv6Net::default())
    } else {
        IpNet::V4(Ipv4Net::default())
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
}

/// A route's identity in the kernel (Lace uses one metric, no TOS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteKey {
    pub table: u32,
    pub dst: IpNet,
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
    /// `encap seg6 mode encap segs <segs> dev <uplink | lu-ipv4>`: to a remote node's SID of
    /// the target Network, whose locator is reached over the `underlay` family (IPv6: the
    /// uplink; IPv4: [`IPV4_TUNNEL`]). The outer packet is routed again after encapsulation (in
    /// the VRF's IPv6 table, hence the locator routes there), so no gateway is needed here.
    Seg6Encap { segs: Ipv6Addr, underlay: Family },
    /// `encap seg6local action End.DT46 vrftable <table> dev <vrf>`: a local SID.
    Seg6LocalDt46 { vrf_table: u32, vrf: String },
    /// `via <via> dev <uplink>`: a remote node's locator through its IPv6 underlay address.
    Underlay { via: Ipv6Addr },
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
                underlay: Family::V6,
            } => write!(f, "encap seg6 mode encap segs {segs} dev @uplink"),
            Nexthop::Seg6Encap {
                segs,
                underlay: Family::V4,
            } => write!(f, "encap seg6 mode encap segs {segs} dev {IPV4_TUNNEL}"),
            Nexthop::Seg6LocalDt46 { vrf_table, vrf } => {
                write!(
                    f,
                    "encap seg6local action End.DT46 vrftable {vrf_table} dev {vrf}"
                )
            }
            Nexthop::Underlay { via } => write!(f, "via {via} dev @uplink"),
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

/// What a routing rule matches and where it looks up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RuleAction {
    /// `l3mdev`: look up the table of the flow's VRF.
    L3mdev,
    /// `fwmark <mark>/<mask> lookup <table>`.
    Fwmark { mark: u32, mask: u32, table: u32 },
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
        }
    }
}

/// A Network that pods on this node can be attached to.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PodNetwork {
    table: u32,
    blocks: Vec<IpNet>,
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
    /// By device name.
    pub vrfs: BTreeMap<String, Vrf>,
    pub routes: BTreeMap<RouteKey, Nexthop>,
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

/// Everything one node's kernel must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredNode {
    pub node: String,
    /// The pod-independent part.
    pub base: Arc<NodeBase>,
    /// Routes of local pods: `/32` `/128` in their Network's table and in [`PROBE_TABLE`].
    pub pod_routes: BTreeMap<RouteKey, Nexthop>,
}

impl DesiredNode {
    /// The route for `key`, if planned.
    pub fn route(&self, key: &RouteKey) -> Option<&Nexthop> {
        self.pod_routes
            .get(key)
            .or_else(|| self.base.routes.get(key))
    }

    /// All routes, sorted by (table, destination). Pod routes win over base routes with the
    /// same key (there are none by construction: pod routes are host routes of local pods).
    pub fn routes(&self) -> impl Iterator<Item = (&RouteKey, &Nexthop)> {
        let mut a = self
            .base
            .routes
            .iter()
            .filter(|(k, _)| !self.pod_routes.contains_key(k))
            .peekable();
        let mut b = self.pod_routes.iter().peekable();
        std::iter::from_fn(move || match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.0 < y.0 => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => None,
        })
    }

    /// The nftables ruleset as `nft -f` text.
    pub fn render_nft(&self) -> String {
        self.base.nft.render()
    }

    /// A human-readable rendering of everything but the nft ruleset, in `ip`-like syntax.
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
                PeerPath::Ipv4(via) => writeln!(out, "peer {peer} ipv4 via {via}"),
                PeerPath::NoCommonFamily => {
                    writeln!(out, "peer {peer} unreachable: no common address family")
                }
            };
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
            let _ = writeln!(
                out,
                "{name:<15} network {:<12} table {}  sid {}",
                v.network, v.table, v.sid
            );
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
            let _ = writeln!(out, "{fam}{dst} {nh}");
        }
        out
    }
}

/// Plans node `node`: the pure entry point. See [`Planner`] for the incremental form.
pub fn plan(
    node: &str,
    state: &ClusterState,
    local: &[PodAttachment],
) -> Result<DesiredNode, PlanError> {
    Planner::new(node, state)?.plan(local)
}

/// Caches the pod-independent part of a node's plan. Rebuild it with [`Planner::new`] when the
/// cluster state changes; call [`Planner::plan`] when only the local attachments changed.
#[derive(Clone, Debug)]
pub struct Planner {
    node: String,
    base: Arc<NodeBase>,
}

impl Planner {
    /// Computes the pod-independent part of node `node`'s plan.
    pub fn new(node: &str, state: &ClusterState) -> Result<Self, PlanError> {
        Ok(Self {
            node: node.to_string(),
            base: Arc::new(build_base(node, state)?),
        })
    }

    /// The cached pod-independent part.
    pub fn base(&self) -> &Arc<NodeBase> {
        &self.base
    }

    /// The full plan for these local attachments (cost: the attachments only).
    pub fn plan(&self, local: &[PodAttachment]) -> Result<DesiredNode, PlanError> {
        let mut pod_routes = BTreeMap::new();
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
                    RouteKey {
                        table: pn.table,
                        dst: host_net(address),
                    },
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
                pod_routes.insert(
                    RouteKey {
                        table: PROBE_TABLE,
                        dst: host_net(address),
                    },
                    probe,
                );
            }
        }
        Ok(DesiredNode {
            node: self.node.clone(),
            base: Arc::clone(&self.base),
            pod_routes,
        })
    }
}

/// Routes collected with a precedence; the highest precedence wins per key.
struct RouteBuilder {
    routes: Vec<(RouteKey, u8, Nexthop)>,
}

/// Precedence of route kinds when two want the same key.
const PREC_FALLBACK: u8 = 0; // unreachable default / unreachable cluster subnets
const PREC_EGRESS: u8 = 1; // default via host
const PREC_REACH: u8 = 2; // blocks, leaks, underlay, SIDs, backends

impl RouteBuilder {
    fn add(&mut self, table: u32, dst: IpNet, prec: u8, nh: Nexthop) {
        self.routes.push((RouteKey { table, dst }, prec, nh));
    }

    fn finish(mut self) -> BTreeMap<RouteKey, Nexthop> {
        // Sort by key, then precedence descending, and keep the first of each key.
        self.routes
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        self.routes.dedup_by(|later, first| later.0 == first.0);
        self.routes.into_iter().map(|(k, _, nh)| (k, nh)).collect()
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

fn build_base(node: &str, state: &ClusterState) -> Result<NodeBase, PlanError> {
    let me: &NodeAllocationSpec =
        state
            .node_allocations
            .get(node)
            .ok_or_else(|| PlanError::NodeNotAllocated {
                node: node.to_string(),
            })?;
    // --- Underlay: per peer, the family both nodes have (IPv6 first) -----------------------
    let peers: BTreeMap<String, PeerPath> = state
        .node_allocations
        .iter()
        .filter(|(n, _)| n.as_str() != node)
        .map(|(n, a)| (n.clone(), peer_path(&me.underlay, &a.underlay)))
        .collect();
    let ipv4_tunnel = match me.underlay.ipv4 {
        Some(local) if peers.values().any(|p| matches!(p, PeerPath::Ipv4(_))) => Some(Ipv4Tunnel {
            local,
            address: me.underlay.ipv6.is_none().then(|| tunnel_source(me)),
        }),
        _ => None,
    };

    // --- VRFs -------------------------------------------------------------------------------
    let mut nets: BTreeMap<&str, NetInfo<'_>> = BTreeMap::new();
    let mut by_function: BTreeMap<u16, &str> = BTreeMap::new();
    let mut vrfs = BTreeMap::new();
    for (name, spec) in state.networks.iter().filter(|(_, n)| !n.external) {
        let function = state
            .network_allocations
            .get(name)
            .ok_or_else(|| PlanError::NetworkNotAllocated {
                network: name.clone(),
            })?
            .function;
        if let Some(first) = by_function.insert(function, name) {
            return Err(PlanError::DuplicateFunction {
                first: first.into(),
                second: name.clone(),
                function,
            });
        }
        let vrf = vrf_name(name, function);
        let table = vrf_table(function);
        if let Some(prev) = vrfs.insert(
            vrf.clone(),
            Vrf {
                network: name.clone(),
                table,
                function,
                sid: sid(me.locator, function),
            },
        ) {
            return Err(PlanError::VrfNameCollision {
                name: vrf,
                first: prev.network,
                second: name.clone(),
            });
        }
        let subnets: Vec<IpNet> = spec.subnets.iter().map(|s| s.cidr.trunc()).collect();
        nets.insert(
            name,
            NetInfo {
                name,
                vrf,
                table,
                function,
                has_v4: subnets.iter().any(|s| matches!(s, IpNet::V4(_))),
                has_v6: subnets.iter().any(|s| matches!(s, IpNet::V6(_))),
                subnets,
                spec_subnets: &spec.subnets,
            },
        );
    }
    let external: BTreeSet<&str> = state
        .networks
        .iter()
        .filter(|(_, n)| n.external)
        .map(|(k, _)| k.as_str())
        .collect();

    // --- Policy -----------------------------------------------------------------------------
    let pairs = allowed_pairs(state);
    let grants = service_grants(state);
    // reach[(src, dst)]: src's table routes all of dst's blocks. Both directions of an allowed
    // pair (replies), plus backend Network → client Network for Service grants (replies).
    let mut reach: BTreeSet<(&str, &str)> = BTreeSet::new();
    // Networks allowed to open connections to external destinations, with the policies.
    let mut egress: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (&(from, to), policies) in &pairs {
        match (
            nets.contains_key(from),
            nets.contains_key(to),
            external.contains(to),
        ) {
            (true, true, _) => {
                reach.insert((from, to));
                reach.insert((to, from));
            }
            (true, false, true) => egress
                .entry(from)
                .or_default()
                .extend(policies.iter().copied()),
            // From an external Network: inbound from outside is not a routing concept Lace
            // offers (validation reports it); nothing to install.
            _ => {}
        }
    }
    // Networks that need their local blocks routed from the main table (replies from hosts).
    let mut host_reply: BTreeSet<&str> = egress.keys().copied().collect();
    for g in &grants {
        if !nets.contains_key(g.from) {
            continue;
        }
        for b in &g.backends {
            match b.location {
                BackendLocation::Pod { network, .. }
                    if nets.contains_key(network) && network != g.from =>
                {
                    reach.insert((network, g.from));
                }
                BackendLocation::Outside => {
                    host_reply.insert(g.from);
                }
                _ => {}
            }
        }
    }

    let mut rb = RouteBuilder { routes: Vec::new() };

    // --- Fallbacks and egress ---------------------------------------------------------------
    for n in nets.values() {
        for v6 in [false, true] {
            let has = if v6 { n.has_v6 } else { n.has_v4 };
            if egress.contains_key(n.name) && has {
                rb.add(n.table, default_net(v6), PREC_EGRESS, Nexthop::Host);
                // Egress must not become a path into the other Networks via the main table.
                for other in nets.values() {
                    for s in &other.subnets {
                        rb.add(n.table, *s, PREC_FALLBACK, Nexthop::Unreachable);
                    }
                }
            } else {
                rb.add(
                    n.table,
                    default_net(v6),
                    PREC_FALLBACK,
                    Nexthop::Unreachable,
                );
            }
        }
    }
    for n in &host_reply {
        if let Some(info) = nets.get(n) {
            for b in node_blocks(me.index, info.spec_subnets) {
                rb.add(MAIN_TABLE, b, PREC_REACH, Nexthop::Dev(info.vrf.clone()));
            }
        }
    }

    // --- Local SIDs -------------------------------------------------------------------------
    for n in nets.values() {
        let s = Ipv6Net::from(sid(me.locator, n.function));
        rb.add(
            MAIN_TABLE,
            IpNet::V6(s),
            PREC_REACH,
            Nexthop::Seg6LocalDt46 {
                vrf_table: n.table,
                vrf: n.vrf.clone(),
            },
        );
    }

    // --- Blocks of reachable Networks, local (leaked) and remote (seg6) ---------------------
    let mut srcs_by_dst: HashMap<&str, Vec<&NetInfo<'_>>> = HashMap::new();
    for &(src, dst) in &reach {
        if let Some(info) = nets.get(src) {
            srcs_by_dst.entry(dst).or_default().push(info);
        }
    }
    // Deterministic order of the reachable destination Networks (the routes are sorted at
    // the end anyway; this keeps the work itself in a stable order).
    let mut dsts: Vec<(&NetInfo<'_>, &Vec<&NetInfo<'_>>)> = srcs_by_dst
        .iter()
        .filter_map(|(dst, srcs)| Some((nets.get(dst)?, srcs)))
        .collect();
    dsts.sort_by_key(|(d, _)| d.name);
    for (other, alloc) in &state.node_allocations {
        let to_locator = match peers.get(other) {
            None => None,
            Some(path) => match locator_route(path) {
                Some(r) => Some(r),
                None => continue, // no common family: unreachable, said in the plan
            },
        };
        if let Some((nh, _)) = &to_locator {
            rb.add(
                MAIN_TABLE,
                IpNet::V6(alloc.locator.trunc()),
                PREC_REACH,
                nh.clone(),
            );
        }
        for &(dst_info, srcs) in &dsts {
            let blocks = node_blocks(alloc.index, dst_info.spec_subnets);
            if blocks.is_empty() {
                continue;
            }
            for src in srcs {
                match &to_locator {
                    None => {
                        if src.name == dst_info.name {
                            continue; // local pods of the same Network: their own host routes
                        }
                        for b in &blocks {
                            rb.add(
                                src.table,
                                *b,
                                PREC_REACH,
                                Nexthop::Dev(dst_info.vrf.clone()),
                            );
                        }
                    }
                    Some((nh, underlay)) => {
                        let segs = sid(alloc.locator, dst_info.function);
                        for b in &blocks {
                            rb.add(
                                src.table,
                                *b,
                                PREC_REACH,
                                Nexthop::Seg6Encap {
                                    segs,
                                    underlay: *underlay,
                                },
                            );
                        }
                        // The outer lookup after encap happens in the VRF's own IPv6 table.
                        rb.add(
                            src.table,
                            IpNet::V6(alloc.locator.trunc()),
                            PREC_REACH,
                            nh.clone(),
                        );
                    }
                }
            }
        }
    }

    // --- Service grants: host routes to each backend ----------------------------------------
    for g in &grants {
        let Some(src) = nets.get(g.from) else {
            continue;
        };
        for b in &g.backends {
            let dst = host_net(b.address);
            match b.location {
                BackendLocation::Pod {
                    network,
                    node: bnode,
                    ..
                } => {
                    let Some(dst_info) = nets.get(network) else {
                        continue;
                    };
                    if bnode == node {
                        if network != g.from {
                            rb.add(
                                src.table,
                                dst,
                                PREC_REACH,
                                Nexthop::Dev(dst_info.vrf.clone()),
                            );
                        }
                    } else if let Some((alloc, (nh, underlay))) = state
                        .node_allocations
                        .get(bnode)
                        .and_then(|a| Some((a, locator_route(peers.get(bnode)?)?)))
                    {
                        let segs = sid(alloc.locator, dst_info.function);
                        rb.add(
                            src.table,
                            dst,
                            PREC_REACH,
                            Nexthop::Seg6Encap { segs, underlay },
                        );
                        rb.add(src.table, IpNet::V6(alloc.locator.trunc()), PREC_REACH, nh);
                    }
                }
                BackendLocation::Outside => rb.add(src.table, dst, PREC_REACH, Nexthop::Host),
                BackendLocation::Unallocated { .. } => {}
            }
        }
    }

    // --- Rules and sysctls ------------------------------------------------------------------
    let mut rules = BTreeSet::new();
    let mut sysctls = BTreeMap::new();
    for family in [Family::V4, Family::V6] {
        rules.insert(Rule {
            priority: RULE_PRIORITY_L3MDEV,
            family,
            action: RuleAction::L3mdev,
        });
        rules.insert(Rule {
            priority: RULE_PRIORITY_PROBE,
            family,
            action: RuleAction::Fwmark {
                mark: PROBE_MARK,
                mask: PROBE_MARK_MASK,
                table: PROBE_TABLE,
            },
        });
    }
    for (k, v) in [
        ("net.vrf.strict_mode", "1"),
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        // Decapsulated packets then traverse prerouting and conntrack on the receiving node,
        // so its forward policy sees connection state.
        ("net.netfilter.nf_hooks_lwtunnel", "1"),
        // Replies to the kubelet's (unbound) probe sockets arrive through a pod's VRF; without
        // these an established TCP/UDP socket outside the VRF does not match them. New
        // connections from pods to the host are still dropped by the ruleset (from_pods).
        ("net.ipv4.tcp_l3mdev_accept", "1"),
        ("net.ipv4.udp_l3mdev_accept", "1"),
    ] {
        sysctls.insert(k.to_string(), v.to_string());
    }
    for vrf in vrfs.keys() {
        // Decapsulated packets enter through the VRF device; the kernel uses max(all, dev).
        sysctls.insert(format!("net.ipv4.conf.{vrf}.rp_filter"), "0".to_string());
    }
    if ipv4_tunnel.is_some() {
        // The tunnel carries IPv6 even where the host disables it by default.
        sysctls.insert(
            format!("net.ipv6.conf.{IPV4_TUNNEL}.disable_ipv6"),
            "0".to_string(),
        );
    }

    let internal_ips: &[IpAddr] = state
        .nodes
        .get(node)
        .map(|n| n.internal_ips.as_slice())
        .unwrap_or_default();
    let ruleset = build_nft(node, state, me, &nets, &pairs, &egress, &grants);
    let pod_networks = nets
        .values()
        .map(|n| {
            let blocks = node_blocks(me.index, n.spec_subnets);
            (
                n.name.to_string(),
                PodNetwork {
                    table: n.table,
                    blocks,
                },
            )
        })
        .collect();
    Ok(NodeBase {
        locator: me.locator.trunc(),
        underlay: me.underlay,
        seg6_tunsrc: tunnel_source(me),
        peers,
        ipv4_tunnel,
        vrfs,
        routes: rb.finish(),
        rules,
        sysctls,
        nft: ruleset,
        probe_src_v4: internal_ips.iter().find(|ip| ip.is_ipv4()).copied(),
        pod_networks,
    })
}

/// The route to a peer's locator along `path` and the family it uses, `None` when the peer
/// cannot be reached.
fn locator_route(path: &PeerPath) -> Option<(Nexthop, Family)> {
    match *path {
        PeerPath::Ipv6(via) => Some((Nexthop::Underlay { via }, Family::V6)),
        PeerPath::Ipv4(via) => Some((Nexthop::Ipv4Tunnel { via }, Family::V4)),
        PeerPath::NoCommonFamily => None,
    }
}

/// Joins policy names into an element/rule comment.
fn by_policies(kind: &str, policies: &[&str]) -> String {
    format!("{kind} {}", policies.join(", "))
}

fn build_nft(
    node: &str,
    state: &ClusterState,
    me: &NodeAllocationSpec,
    nets: &BTreeMap<&str, NetInfo<'_>>,
    pairs: &BTreeMap<(&str, &str), Vec<&str>>,
    egress: &BTreeMap<&str, Vec<&str>>,
    grants: &[crate::routing::ServiceGrant<'_>],
) -> nft::Ruleset {
    use nft::{Chain, Hook, Set};

    let [underlays, underlays_v4] = underlay::node_sets(state);
    let mut sids = Set::new(
        "local_sids",
        "ipv6_addr",
        true,
        "this node's SRv6 locator (every local SID)",
    );
    sids.add(
        me.locator.trunc().to_string(),
        None,
        &format!("locator of node {node}"),
    );
    let mut vrfs = Set::new(
        "vrfs",
        "ifname",
        false,
        "Lace VRF devices: traffic from local pods enters through them",
    );
    let mut link_scope = Set::new(
        "link_scope_v6",
        "ipv6_addr",
        true,
        "IPv6 destinations a pod's packet never leaves its veth for",
    );
    link_scope.add("fe80::/10".into(), None, "link-local unicast");
    link_scope.add("ff00::/8".into(), None, "multicast");
    let mut cluster = [
        Set::new(
            "cluster_v4",
            "ipv4_addr",
            true,
            "subnets of all internal Networks",
        ),
        Set::new(
            "cluster_v6",
            "ipv6_addr",
            true,
            "subnets of all internal Networks",
        ),
    ];
    for n in nets.values() {
        vrfs.add(
            format!("\"{}\"", n.vrf),
            None,
            &format!("Network {}", n.name),
        );
        for s in &n.subnets {
            cluster[usize::from(matches!(s, IpNet::V6(_)))].add(
                s.to_string(),
                None,
                &format!("Network {}", n.name),
            );
        }
    }
    let mut pair_maps = [
        Set::new_vmap(
            "pairs_v4",
            "ipv4_addr . ipv4_addr",
            true,
            "NetworkRoutingPolicy: source subnet . destination subnet",
        ),
        Set::new_vmap(
            "pairs_v6",
            "ipv6_addr . ipv6_addr",
            true,
            "NetworkRoutingPolicy: source subnet . destination subnet",
        ),
    ];
    for (&(from, to), policies) in pairs {
        let (Some(f), Some(t)) = (nets.get(from), nets.get(to)) else {
            continue;
        };
        let reason = by_policies("NetworkRoutingPolicy", policies);
        for fs in &f.subnets {
            for ts in t
                .subnets
                .iter()
                .filter(|ts| matches!(ts, IpNet::V6(_)) == matches!(fs, IpNet::V6(_)))
            {
                pair_maps[usize::from(matches!(fs, IpNet::V6(_)))].add(
                    format!("{fs} . {ts}"),
                    Some("accept"),
                    &reason,
                );
            }
        }
    }
    let mut egress_sets = [
        Set::new(
            "egress_v4",
            "ipv4_addr",
            true,
            "NetworkRoutingPolicy to an external Network: source subnets",
        ),
        Set::new(
            "egress_v6",
            "ipv6_addr",
            true,
            "NetworkRoutingPolicy to an external Network: source subnets",
        ),
    ];
    for (from, policies) in egress {
        let Some(f) = nets.get(from) else { continue };
        let reason = by_policies("NetworkRoutingPolicy", policies);
        for s in &f.subnets {
            egress_sets[usize::from(matches!(s, IpNet::V6(_)))].add(s.to_string(), None, &reason);
        }
    }
    let mut svc_sets = [
        Set::new(
            "services_v4",
            "ipv4_addr . ipv4_addr",
            true,
            "ServiceRoutingPolicy: source subnet . Service address",
        ),
        Set::new(
            "services_v6",
            "ipv6_addr . ipv6_addr",
            true,
            "ServiceRoutingPolicy: source subnet . Service address",
        ),
    ];
    let mut svc_ext_sets = [
        Set::new(
            "services_external_v4",
            "ipv4_addr . ipv4_addr",
            true,
            "ServiceRoutingPolicy to external Services (masqueraded)",
        ),
        Set::new(
            "services_external_v6",
            "ipv6_addr . ipv6_addr",
            true,
            "ServiceRoutingPolicy to external Services (masqueraded)",
        ),
    ];
    let mut backend_sets = [
        Set::new(
            "backends_v4",
            "ipv4_addr . ipv4_addr . inet_proto . inet_service",
            true,
            "ServiceRoutingPolicy: source subnet . backend on this node . protocol . target port",
        ),
        Set::new(
            "backends_v6",
            "ipv6_addr . ipv6_addr . inet_proto . inet_service",
            true,
            "ServiceRoutingPolicy: source subnet . backend on this node . protocol . target port",
        ),
    ];
    for g in grants {
        let Some(f) = nets.get(g.from) else { continue };
        let reason = format!("ServiceRoutingPolicy {}: {}", g.policy, g.service);
        let ext = !nets.contains_key(g.to);
        for fs in &f.subnets {
            let fam6 = matches!(fs, IpNet::V6(_));
            let i = usize::from(fam6);
            for ip in g.spec.cluster_ips.iter().filter(|ip| ip.is_ipv6() == fam6) {
                svc_sets[i].add(format!("{fs} . {ip}"), None, &reason);
                if ext {
                    svc_ext_sets[i].add(format!("{fs} . {ip}"), None, &reason);
                }
            }
            for b in &g.backends {
                let BackendLocation::Pod { node: bnode, .. } = b.location else {
                    continue;
                };
                if bnode != node || b.address.is_ipv6() != fam6 {
                    continue;
                }
                for p in g.target_ports {
                    let proto = p.protocol.to_ascii_lowercase();
                    backend_sets[i].add(
                        format!("{fs} . {} . {proto} . {}", b.address, p.port),
                        None,
                        &reason,
                    );
                }
            }
        }
    }

    let mark = format!("meta mark & {PROBE_MARK_MASK:#010x} == {PROBE_MARK:#010x}");
    let mut prerouting = Chain {
        name: "prerouting".into(),
        hook: Some(Hook { kind: "filter", hook: "prerouting", priority: "dstnat + 10" }),
        comment: "after kube-proxy's DNAT; the sending node's policy lives here because seg6 encap happens at route input, before forward".into(),
        rules: Vec::new(),
    };
    underlay::guard(&mut prerouting);
    let [raw_prerouting, raw_output] = underlay::untracked();
    // The VRF driver runs a pod's neighbour discovery frames through prerouting a second time
    // with the VRF as input device, untracked (vrf_ip6_rcv): from_pods would drop the
    // advertisements answering the host, which then cannot resolve IPv6 pods (seen in a VM).
    // Link-local and multicast destinations are never forwarded; the input chain polices what
    // of them reaches the host.
    prerouting.rule(
        "iifname @vrfs ip6 daddr @link_scope_v6 accept",
        "link-local and multicast from pods: never forwarded, policed in input (pods_to_host)",
    );
    prerouting.rule(
        "iifname @vrfs jump from_pods",
        "connections opened by local pods",
    );

    let mut from_pods = Chain {
        name: "from_pods".into(),
        hook: None,
        comment: "new connections from local pods: only what a routing policy allows".into(),
        rules: Vec::new(),
    };
    let mut to_pods = Chain {
        name: "to_pods".into(),
        hook: None,
        comment: "forwarded traffic towards pods (decapsulated or leaked between VRFs)".into(),
        rules: Vec::new(),
    };
    for c in [&mut from_pods, &mut to_pods] {
        c.rule(
            "ct state established,related accept",
            "replies and related flows of allowed connections",
        );
        c.rule(
            "ip saddr . ip daddr vmap @pairs_v4",
            "NetworkRoutingPolicy pairs",
        );
        c.rule(
            "ip6 saddr . ip6 daddr vmap @pairs_v6",
            "NetworkRoutingPolicy pairs",
        );
        c.rule(
            "ct status dnat ip saddr . ct original ip daddr @services_v4 accept",
            "ServiceRoutingPolicy grants, by the Service address before DNAT",
        );
        c.rule(
            "ct status dnat ip6 saddr . ct original ip6 daddr @services_v6 accept",
            "ServiceRoutingPolicy grants, by the Service address before DNAT",
        );
    }
    for c in [&mut from_pods, &mut to_pods] {
        // In from_pods too: with nf_hooks_lwtunnel=1 a decapsulated packet may traverse
        // prerouting with its VRF as input device.
        // The protocol is `ct protocol`, not `meta l4proto`: in a concatenation looked up in
        // an interval set, nft (1.0.6) converts the host-endian one-byte `meta l4proto` with
        // a `byteorder` expression of size 2 and length 1, which kernels carrying
        // "netfilter: nft_byteorder: remove multi-register support" (Debian 6.12.115+) reject
        // with EOPNOTSUPP. `ct protocol` needs no conversion and is the packet's transport
        // protocol whenever the packet has a conntrack entry, as every new connection does; a
        // packet without one (invalid, untracked) cannot open a connection and meets the drop.
        c.rule(
            "ip saddr . ip daddr . ct protocol . th dport @backends_v4 accept",
            "ServiceRoutingPolicy grants: backends on this node (DNAT happened on the client's node)",
        );
        c.rule(
            "ip6 saddr . ip6 daddr . ct protocol . th dport @backends_v6 accept",
            "ServiceRoutingPolicy grants: backends on this node (DNAT happened on the client's node)",
        );
    }
    from_pods.rule(
        "ip saddr @egress_v4 ip daddr != @cluster_v4 accept",
        "NetworkRoutingPolicy to an external Network",
    );
    from_pods.rule(
        "ip6 saddr @egress_v6 ip6 daddr != @cluster_v6 accept",
        "NetworkRoutingPolicy to an external Network",
    );
    from_pods.rule(
        "counter drop",
        "no Lace routing policy allows this new connection",
    );
    to_pods.rule(
        "counter drop",
        "no Lace routing policy allows this new connection",
    );

    let mut forward = Chain {
        name: "forward".into(),
        hook: Some(Hook {
            kind: "filter",
            hook: "forward",
            priority: "filter",
        }),
        comment: "the receiving node's policy: decapsulated packets traverse forward".into(),
        rules: Vec::new(),
    };
    forward.rule("ip daddr @cluster_v4 jump to_pods", "towards pods");
    forward.rule("ip6 daddr @cluster_v6 jump to_pods", "towards pods");

    let mut output = Chain {
        name: "output".into(),
        hook: Some(Hook {
            kind: "filter",
            hook: "output",
            priority: "filter",
        }),
        comment: "host processes towards pods".into(),
        rules: Vec::new(),
    };
    // A pod source means a packet leaked between VRFs re-entering through the VRF device's
    // transmit path (which runs the output hook); it was policed in prerouting and forward.
    output.rule(
        "ip daddr @cluster_v4 ip saddr != @cluster_v4 jump from_host",
        "host processes towards pods",
    );
    output.rule(
        "ip6 daddr @cluster_v6 ip6 saddr != @cluster_v6 jump from_host",
        "host processes towards pods",
    );
    let mut from_host = Chain {
        name: "from_host".into(),
        hook: None,
        comment: "only the kubelet (probes) opens connections from the host to pods".into(),
        rules: Vec::new(),
    };
    from_host.rule(
        "ct state established,related accept",
        "replies of connections pods opened",
    );
    from_host.rule(
        format!("{mark} accept"),
        "kubelet probes: socket mark set by Lace's cgroup program",
    );
    from_host.rule(
        "counter drop",
        "host processes other than the kubelet do not open connections to pods",
    );

    let mut input = Chain {
        name: "input".into(),
        hook: Some(Hook {
            kind: "filter",
            hook: "input",
            priority: "filter",
        }),
        comment: "local pods towards the host's link-local and multicast addresses".into(),
        rules: Vec::new(),
    };
    // Other packets from pods to link-local or multicast addresses get no second prerouting
    // pass; they arrive here with the VRF as input device and reach even the host's unbound
    // sockets through the l3mdev_accept sysctls. Neighbour discovery keeps the veth as input
    // device, so it never comes here.
    input.rule(
        "iifname @vrfs ip6 daddr @link_scope_v6 jump pods_to_host",
        "pods towards the host over their veth",
    );
    let mut pods_to_host = Chain {
        name: "pods_to_host".into(),
        hook: None,
        comment: "pods do not open connections to the host; replies to the kubelet do come back"
            .into(),
        rules: Vec::new(),
    };
    pods_to_host.rule(
        "ct state established,related accept",
        "replies to IPv6 kubelet probes (sent from fe80::1)",
    );
    pods_to_host.rule(
        "counter drop",
        "pods reach no host service through their gateway fe80::1 or the veth's link-local address",
    );

    let mut postrouting = Chain {
        name: "postrouting".into(),
        hook: Some(Hook {
            kind: "nat",
            hook: "postrouting",
            priority: "srcnat + 10",
        }),
        comment: "masquerade traffic leaving to external Networks behind the node".into(),
        rules: Vec::new(),
    };
    postrouting.rule(
        "ip saddr @egress_v4 ip daddr != @cluster_v4 masquerade",
        "NetworkRoutingPolicy to an external Network",
    );
    postrouting.rule(
        "ip6 saddr @egress_v6 ip6 daddr != @cluster_v6 masquerade",
        "NetworkRoutingPolicy to an external Network",
    );
    postrouting.rule(
        "ct status dnat ip saddr . ct original ip daddr @services_external_v4 masquerade",
        "ServiceRoutingPolicy to a Service on an external Network uses host routing",
    );
    postrouting.rule(
        "ct status dnat ip6 saddr . ct original ip6 daddr @services_external_v6 masquerade",
        "ServiceRoutingPolicy to a Service on an external Network uses host routing",
    );

    let [c4, c6] = cluster;
    let [p4, p6] = pair_maps;
    let [e4, e6] = egress_sets;
    let [s4, s6] = svc_sets;
    let [x4, x6] = svc_ext_sets;
    let [b4, b6] = backend_sets;
    nft::Ruleset {
        sets: vec![
            underlays,
            underlays_v4,
            sids,
            vrfs,
            link_scope,
            c4,
            c6,
            p4,
            p6,
            e4,
            e6,
            s4,
            s6,
            x4,
            x6,
            b4,
            b6,
        ],
        // Jump targets first, so every chain a rule jumps to is already declared.
        chains: vec![
            from_pods,
            to_pods,
            from_host,
            pods_to_host,
            raw_prerouting,
            raw_output,
            prerouting,
            input,
            forward,
            output,
            postrouting,
        ],
    }
}

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
        const { assert!(VRF_TABLE_BASE > MAIN_TABLE) };
    }
}
