//! The underlay: how this node's SRv6 packets reach each other node, decided per pair.
//!
//! - **IPv6** when both nodes have an IPv6 InternalIP: the outer IPv6 packet is routed natively
//!   towards the peer's IPv6 address (`<locator> via <peer IPv6> dev <uplink>`).
//! - **IPv4** otherwise, when both have an IPv4 InternalIP: the outer IPv6 packet (with its
//!   SRH) is carried in UDP over IPv4 between the two InternalIPs (foo-over-UDP, "fou", with
//!   IP protocol 41: the UDP payload is the IPv6 packet itself). One Lace-owned `sit` device
//!   per node, [`IPV4_TUNNEL`] (`remote any local <InternalIP> encap fou encap-dport`
//!   [`FOU_PORT`]), sends to every such peer: the route to a peer's locator names the peer's
//!   IPv4 address as an IPv4-compatible next hop (`via ::<peer IPv4> dev lu-ipv4`), from which
//!   the `sit` driver takes the outer destination. A fou listener on [`FOU_PORT`] hands what
//!   arrives to the same device.
//! - **IPv6 link-local** between two nodes without a shared IPv6 InternalIP whose IPv4
//!   InternalIPs are on one L2 segment (the peer's address is on-link from the link holding
//!   the node's own: no gateway on the route to it) and whose links have IPv6 on: the SRv6
//!   packet goes natively over IPv6 on that link, one encapsulation layer as on the IPv6 path
//!   (so GSO and GRO work), towards a link-local next hop (`<locator> via fe80::… dev
//!   <uplink>`). Preferred to fou, used only once known to work; see below.
//! - A pair with no common family cannot be reached; [`PeerPath::NoCommonFamily`] says so in
//!   the plan.
//!
//! ## The link-local next hop
//! Each node holds one more address on the link holding its IPv4 InternalIP (its *uplink*):
//! [`link_local_address`] of that InternalIP, `fe80::4c61:6365:<IPv4 as 32 bits>/64`
//! (`4c61:6365` is "Lace"), added `nodad`. A peer derives it from the InternalIP in the
//! NodeAllocation, so nothing needs publishing: it works the same in standalone mode and in a
//! cluster, whatever `addr_gen_mode` made the link's own link-local (EUI-64, stable-privacy,
//! none), with no RBAC and no controller involved, and an IPv4 InternalIP that changes moves
//! the next hop with it. Neighbour discovery then resolves it as for any next hop.
//!
//! Whether a pair may use it is a fact about the kernel and the link, not the cluster state:
//! the agent looks ([`UnderlayFacts`]: IPv6 on the uplink, which peers are on-link, which
//! answer a probe from this node's address to theirs) and plans with what it found, so
//! planning stays pure. A pair takes the link-local path only while the peer answers; it falls
//! back to fou when the probes stop being answered (IPv6 switched off on either uplink, the
//! peer's address gone, its agent stopped) or the peer is no longer on-link (moved behind a
//! router).
//!
//! Why fou and not plain 6in4 (`sit` without encapsulation, IP protocol 41): UDP crosses every
//! fabric Lace meets — one L2 segment, routed IPv4 networks, and cloud networks whose security
//! rules pass only TCP, UDP and ICMP between nodes, where protocol 41 is dropped — and its
//! source port (a hash of the inner flow, `encap-sport auto`) spreads flows over ECMP paths and
//! receive queues. It costs 8 bytes of MTU more than plain 6in4.
//!
//! The outer IPv6 source (`ip sr tunsrc`) is the node's IPv6 InternalIP when it has one, as
//! before; a node without one uses its locator's own address ([`tunnel_source`], the SID of
//! function 0, which no Network gets), held by [`IPV4_TUNNEL`]. Every peer derives either from
//! the node's NodeAllocation, so no node needs a global IPv6 address of its own.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::nft::{Chain, Hook, Set};
use crate::api::{NodeAllocationSpec, Underlay};
use crate::sid::sid;
use crate::state::ClusterState;

/// Prefix of the underlay devices Lace creates ("lace underlay"). VRF names start with
/// [`super::VRF_PREFIX`], so the two never collide.
pub const TUNNEL_PREFIX: &str = "lu-";
/// Lace's SRv6-over-IPv4 device (`type sit`, fou encapsulation).
pub const IPV4_TUNNEL: &str = "lu-ipv4";
/// UDP port of Lace's fou encapsulation, the same on every node (sent to and listened on).
/// No IANA port exists for IPv6 in UDP; this one is clear of the ports Kubernetes and the
/// common CNIs use (VXLAN 4789/8472, Geneve 6081, WireGuard 51820, BGP 179, NodePorts
/// 30000-32767, kubelet 10250, etcd 2379-2380, the API server 6443).
pub const FOU_PORT: u16 = 6076;
/// IP protocol of the fou payload: IPv6 (41).
pub const FOU_IPPROTO: u8 = 41;
/// Socket-mark bit set on SRv6-over-IPv4 packets that came from a node's InternalIP over the
/// link towards that node, before [`IPV4_TUNNEL`] decapsulates them (the mark survives the
/// decapsulation): only packets carrying it may enter through the tunnel. Chosen clear of every
/// bit the components a node may run alongside use (see [`super::PROBE_MARK`]) and of Lace's
/// probe bit; cleared again right after the check.
pub const UNDERLAY_MARK: u32 = 0x2000;

/// What SRv6 encapsulation adds to a pod's packet: the outer IPv6 header (40 bytes), the SRH
/// (8 bytes) and its one 16-byte segment, since Lace encapsulates with exactly one segment (the
/// remote node's SID of the target Network).
pub const SRV6_OVERHEAD: u32 = 40 + 8 + 16;
/// What carrying the SRv6 packet over IPv4 adds on top: the outer IPv4 header (20 bytes) and
/// the UDP header (8 bytes).
pub const IPV4_FOU_OVERHEAD: u32 = 20 + 8;
/// Underlay MTU assumed when no link holds the node's underlay address of a family.
pub const DEFAULT_UNDERLAY_MTU: u32 = 1500;

/// The interface identifier of Lace's link-local addresses: `4c61:6365` ("Lace") followed by
/// the node's IPv4 InternalIP.
pub const LINK_LOCAL_MARK: [u16; 2] = [0x4c61, 0x6365];
/// Prefix length of a node's link-local underlay address on its uplink (the link-local
/// prefix, as the kernel's own).
pub const LINK_LOCAL_PREFIX: u8 = 64;

/// The link-local underlay address of a node whose IPv4 InternalIP is `ipv4`:
/// `fe80::4c61:6365:<ipv4>`. Each node holds its own on its uplink; peers route to it.
pub fn link_local_address(ipv4: Ipv4Addr) -> Ipv6Addr {
    let [a, b, c, d] = ipv4.octets();
    Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        LINK_LOCAL_MARK[0],
        LINK_LOCAL_MARK[1],
        u16::from_be_bytes([a, b]),
        u16::from_be_bytes([c, d]),
    )
}

/// Whether `a` is a link-local underlay address of Lace's ([`link_local_address`] of some
/// IPv4 address): the addresses the reconciler owns on the host's links.
pub fn is_link_local_underlay(a: Ipv6Addr) -> bool {
    let s = a.segments();
    s[..4] == [0xfe80, 0, 0, 0] && s[4..6] == LINK_LOCAL_MARK
}

/// What the node found out about its uplink and its peers by looking at the kernel and
/// probing: the only input of the plan that does not come from the cluster state. The agent
/// gathers it (see `agent::underlay`); with the default (nothing known) every pair without
/// IPv6 InternalIPs takes fou.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnderlayFacts {
    /// IPv6 is on at the uplink (`net.ipv6.conf.<uplink>.disable_ipv6` is 0): the node may hold
    /// its link-local underlay address there.
    pub uplink_ipv6: bool,
    /// The peers (by node name) whose IPv4 InternalIP is on-link from the uplink: no gateway
    /// on the route to it.
    pub on_link: BTreeSet<String>,
    /// The peers whose link-local underlay address answers this node's probes (known to work).
    pub answering: BTreeSet<String>,
    /// The on-link peers that answered at least once since they are on-link: their pair is
    /// expected on the link-local path (sizes the pods' MTU) even while it is on fou.
    pub answered: BTreeSet<String>,
    /// The uplink's MTU, when known (sizes the TCP MSS clamp towards peers over fou, see
    /// [`mss_clamp`]).
    pub uplink_mtu: Option<u32>,
}

impl UnderlayFacts {
    /// Whether the pair with `peer` may take the link-local path now.
    pub fn link_local_works(&self, peer: &str) -> bool {
        self.uplink_ipv6 && self.on_link.contains(peer) && self.answering.contains(peer)
    }

    /// Whether the pair with `peer` is expected to take the link-local path: it shares the
    /// node's L2 segment, the node's uplink has IPv6, and the peer answers or answered before
    /// (a pair fallen back to fou for a moment).
    pub fn link_local_expected(&self, peer: &str) -> bool {
        self.uplink_ipv6
            && self.on_link.contains(peer)
            && (self.answering.contains(peer) || self.answered.contains(peer))
    }
}

/// How this node reaches one other node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PeerPath {
    /// Natively over IPv6, towards the peer's IPv6 InternalIP.
    Ipv6(Ipv6Addr),
    /// Natively over IPv6 on the shared L2 segment, towards the peer's link-local underlay
    /// address ([`link_local_address`] of its IPv4 InternalIP) on the uplink.
    LinkLocal(Ipv6Addr),
    /// Over IPv4 (fou) through [`IPV4_TUNNEL`], towards the peer's IPv4 InternalIP.
    Ipv4(Ipv4Addr),
    /// The two nodes share no address family: the peer's pods are unreachable from here.
    NoCommonFamily,
}

impl PeerPath {
    /// The path's name in logs, metrics and `lace-agent plan`: `ipv6`, `link-local`, `fou`,
    /// `unreachable`.
    pub fn kind(&self) -> &'static str {
        match self {
            PeerPath::Ipv6(_) => "ipv6",
            PeerPath::LinkLocal(_) => "link-local",
            PeerPath::Ipv4(_) => "fou",
            PeerPath::NoCommonFamily => "unreachable",
        }
    }
}

impl std::fmt::Display for PeerPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerPath::Ipv6(via) => write!(f, "ipv6 via {via}"),
            PeerPath::LinkLocal(via) => write!(f, "link-local via {via}"),
            PeerPath::Ipv4(via) => write!(f, "fou via {via}"),
            PeerPath::NoCommonFamily => write!(f, "unreachable: no common address family"),
        }
    }
}

/// The path between a node with underlay `me` and a peer with underlay `peer`: IPv6 when both
/// have an IPv6 address; else, when both have an IPv4 address, the link-local path if
/// `link_local` (the peer shares the L2 segment and answers, see
/// [`UnderlayFacts::link_local_works`]), fou otherwise.
pub fn peer_path(me: &Underlay, peer: &Underlay, link_local: bool) -> PeerPath {
    match (me.ipv6, peer.ipv6, me.ipv4, peer.ipv4) {
        (Some(_), Some(v6), _, _) => PeerPath::Ipv6(v6),
        (_, _, Some(_), Some(v4)) if link_local => PeerPath::LinkLocal(link_local_address(v4)),
        (_, _, Some(_), Some(v4)) => PeerPath::Ipv4(v4),
        _ => PeerPath::NoCommonFamily,
    }
}

/// The outer IPv6 source of the node's encapsulated packets (`ip sr tunsrc`): its IPv6
/// InternalIP, else its locator's own address (function 0 is never a Network's).
pub fn tunnel_source(alloc: &NodeAllocationSpec) -> Ipv6Addr {
    alloc
        .underlay
        .ipv6
        .unwrap_or_else(|| sid(alloc.locator.trunc(), 0))
}

/// Lace's SRv6-over-IPv4 device on this node: `ip link add lu-ipv4 type sit remote any local
/// <local> ttl inherit pmtudisc encap fou encap-sport auto encap-dport` [`FOU_PORT`], MTU the
/// uplink's minus [`IPV4_FOU_OVERHEAD`], `disable_ipv6 0`, and `ip fou add port`
/// [`FOU_PORT`] `ipproto 41` beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Tunnel {
    /// The node's IPv4 InternalIP: the outer source, and what peers send to.
    pub local: Ipv4Addr,
    /// An address the device holds (`/128`, `nodad`): the node's [`tunnel_source`] when the
    /// node has no IPv6 InternalIP, so that the source is an address of the node.
    pub address: Option<Ipv6Addr>,
}

/// The guard's two sets: `node_underlays`, the outer IPv6 sources of every node (its IPv6
/// InternalIP, and its [`tunnel_source`] when that is another address), and
/// `node_underlays_v4`, every node's IPv4 InternalIP.
pub fn node_sets(state: &ClusterState) -> [Set; 2] {
    let mut v6 = Set::new(
        "node_underlays",
        "ipv6_addr",
        false,
        "the outer IPv6 sources of the cluster's nodes: IPv6 InternalIPs, tunnel sources",
    );
    let mut v4 = Set::new(
        "node_underlays_v4",
        "ipv4_addr",
        false,
        "IPv4 InternalIPs of the cluster's nodes: the sources of SRv6 over IPv4",
    );
    for (n, a) in &state.node_allocations {
        if let Some(ip) = a.underlay.ipv6 {
            v6.add(ip.to_string(), None, &format!("node {n}"));
        }
        let src = tunnel_source(a);
        if a.underlay.ipv6 != Some(src) {
            v6.add(src.to_string(), None, &format!("tunnel source of node {n}"));
        }
        if let Some(ip) = a.underlay.ipv4 {
            v4.add(ip.to_string(), None, &format!("node {n}"));
        }
    }
    [v6, v4]
}

/// The TCP MSS clamp towards peers that share this node's L2 segment but are on fou for now
/// (their link-local path is pending at start-up, or stopped working): pods size their MTU
/// for the link-local path (uplink - [`SRV6_OVERHEAD`]) and keep it, so their TCP segments
/// would not fit fou (uplink - [`SRV6_OVERHEAD`] - [`IPV4_FOU_OVERHEAD`]); SRv6 encapsulates
/// at route input, so no ICMP "too big" ever reaches them. SYNs from pods towards `blocks` (the
/// pod blocks of those peers, with the peer's name) get their MSS lowered to what fou carries,
/// in `prerouting`, before the route encapsulates them. `None` when `blocks` is empty (no rule
/// at all then). Other protocols than TCP keep the pods' MTU; the pair leaves fou as soon as
/// the probes answer again.
pub fn mss_clamp(blocks: &[(ipnet::IpNet, &str)], uplink_mtu: Option<u32>) -> Option<MssClamp> {
    if blocks.is_empty() {
        return None;
    }
    let fou_mtu = uplink_mtu
        .unwrap_or(DEFAULT_UNDERLAY_MTU)
        .saturating_sub(SRV6_OVERHEAD + IPV4_FOU_OVERHEAD);
    let mut v4 = Set::new(
        "fou_clamp_v4",
        "ipv4_addr",
        true,
        "pod blocks of peers on this L2 segment reached over fou for now: TCP MSS clamped",
    );
    let mut v6 = Set::new(
        "fou_clamp_v6",
        "ipv6_addr",
        true,
        "pod blocks of peers on this L2 segment reached over fou for now: TCP MSS clamped",
    );
    for (b, peer) in blocks {
        let set = if b.addr().is_ipv4() { &mut v4 } else { &mut v6 };
        set.add(b.to_string(), None, &format!("node {peer}"));
    }
    let rule = |fam: &str, set: &str, mss: u32| {
        (
            format!("tcp flags & (syn | rst) == syn {fam} daddr @{set} tcp option maxseg size > {mss} tcp option maxseg size set {mss}"),
            format!("TCP from pods to peers on fou for now: MSS for the fou path's MTU ({fou_mtu})"),
        )
    };
    Some(MssClamp {
        sets: [v4, v6],
        rules: [
            rule("ip", "fou_clamp_v4", fou_mtu.saturating_sub(40)),
            rule("ip6", "fou_clamp_v6", fou_mtu.saturating_sub(60)),
        ],
    })
}

/// The sets and `prerouting` rules of the TCP MSS clamp ([`mss_clamp`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MssClamp {
    pub sets: [Set; 2],
    /// (statement, comment).
    pub rules: [(String, String); 2],
}

impl MssClamp {
    /// Adds the clamp to `ruleset`: its sets, and its rules in `from_vrfs` before the accept of
    /// established flows (a pod's SYN-ACK belongs to one) and the policy (which only accepts or
    /// drops).
    pub fn install(self, ruleset: &mut super::nft::Ruleset) {
        ruleset.sets.extend(self.sets);
        if let Some(pre) = ruleset.chains.iter_mut().find(|c| c.name == "from_vrfs") {
            let at = pre
                .rules
                .iter()
                .position(|r| r.statement == super::nft::ESTABLISHED)
                .unwrap_or(pre.rules.len());
            for (i, (statement, comment)) in self.rules.into_iter().enumerate() {
                pre.rules
                    .insert(at + i, super::nft::Rule { statement, comment });
            }
        }
    }
}

/// IPv6 in IPv4 (protocol 41), by number: nft resolves protocol names through
/// `/etc/protocols`, which the agent's image (and many minimal hosts) do not have.
const SIT_L4PROTO: &str = "meta l4proto 41";

/// The SRv6-over-IPv4 ingress guard, in the `prerouting` chain after the passes of pods'
/// packets, which never carry SRv6 over IPv4 (the IPv6 guard is [`untracked`]'s `sid_guard`).
/// Returns the chain that checks what the tunnel decapsulated, so other packets pay one
/// interface name comparison for it.
///
/// [`IPV4_TUNNEL`] (`remote any`) decapsulates whatever protocol 41 or fou UDP reaches the
/// node, so its outer IPv4 header is checked before, and the verdict carried across the
/// decapsulation in [`UNDERLAY_MARK`] (the outer header is gone when the inner packet comes
/// by). A node's address counts only on the link this node's routes lead to it (strict reverse
/// path), so a spoofed InternalIP from elsewhere gets no mark.
pub fn guard(prerouting: &mut Chain) -> Chain {
    let um = UNDERLAY_MARK;
    for (what, l4) in [
        ("6in4", SIT_L4PROTO.to_string()),
        ("fou", format!("udp dport {FOU_PORT}")),
    ] {
        prerouting.rule(
            format!(
                "{l4} ip saddr @node_underlays_v4 fib saddr . iif oif exists meta mark set meta mark | {um:#010x}"
            ),
            format!("SRv6 over IPv4 ({what}) from a node's InternalIP, over the link towards it: may enter {IPV4_TUNNEL}"),
        );
    }
    prerouting.rule(
        format!("iifname \"{IPV4_TUNNEL}\" goto {IPV4_TUNNEL_GUARD}"),
        format!("what {IPV4_TUNNEL} decapsulated"),
    );
    let mut tunnel = Chain {
        name: IPV4_TUNNEL_GUARD.into(),
        hook: None,
        comment: format!("SRv6 ingress guard over IPv4: {IPV4_TUNNEL} takes only what nodes sent from their InternalIPs"),
        rules: Vec::new(),
    };
    tunnel.rule(
        format!("meta mark & {um:#010x} != {um:#010x} counter drop"),
        format!("SRv6 ingress guard over IPv4: {IPV4_TUNNEL} takes only what nodes sent from their InternalIPs"),
    );
    tunnel.rule(
        format!("meta mark set meta mark & {:#010x}", !um),
        "the mark only carried the outer check across the decapsulation",
    );
    tunnel
}

/// The chain of [`guard`] that checks what [`IPV4_TUNNEL`] decapsulated.
const IPV4_TUNNEL_GUARD: &str = "ipv4_tunnel_guard";

/// Chains at the `raw` priority that keep conntrack off the outer headers of SRv6 between
/// nodes: the pod's packet inside is tracked on its own (the `sit` and `seg6local`
/// decapsulations reset the packet's conntrack state), so tracking the outer flows (one per
/// pair of nodes) only costs a lookup per packet. And the SRv6 ingress guard, `sid_guard`: on
/// any path, a SID takes only packets from a node's outer IPv6 source. It runs here, before
/// conntrack, so a rogue packet creates no conntrack entry, and each packet to a SID is
/// looked up once for both decisions.
pub fn untracked() -> [Chain; 3] {
    let raw = |hook: &'static str, priority: &'static str, comment: &str| Chain {
        name: format!("raw_{hook}"),
        hook: Some(Hook {
            kind: "filter",
            hook,
            priority,
        }),
        comment: comment.into(),
        rules: Vec::new(),
    };
    let mut pre = raw(
        "prerouting",
        "raw",
        "the SRv6 ingress guard, and no conntrack for the outer headers of SRv6 from nodes",
    );
    // Ahead of defragmentation (-400), which an untracked packet skips: the outer headers
    // leave whole (the encapsulation happens before fragmentation), and seg6's encapsulation
    // of a pod's packet comes by here once per packet (nf_hooks_lwtunnel).
    let mut out = raw(
        "output",
        "raw - 150",
        "no conntrack for the outer headers of SRv6 to nodes",
    );
    out.rule(
        "ip6 nexthdr 43 ip6 saddr @node_underlays notrack",
        "SRv6 from this node (its outer header: IPv6 with a routing header, from its tunnel source)",
    );
    pre.rule(
        "ip6 daddr @local_sids goto sid_guard",
        "SRv6 towards a local SID",
    );
    let mut sid_guard = Chain {
        name: "sid_guard".into(),
        hook: None,
        comment: "SRv6 ingress guard: a SID is a door into a VRF, only nodes may knock".into(),
        rules: Vec::new(),
    };
    sid_guard.rule(
        "ip6 saddr @node_underlays notrack accept",
        "SRv6 from a node to a local SID: its outer header untracked",
    );
    sid_guard.rule(
        "counter drop",
        "SRv6 ingress guard: a SID is a door into a VRF, only nodes may knock",
    );
    for (dir, chain) in [("saddr", &mut pre), ("daddr", &mut out)] {
        chain.rule(
            format!("udp dport {FOU_PORT} ip {dir} @node_underlays_v4 notrack"),
            "SRv6 over IPv4 (fou) between nodes",
        );
        chain.rule(
            format!("{SIT_L4PROTO} ip {dir} @node_underlays_v4 notrack"),
            "SRv6 over IPv4 (6in4) between nodes",
        );
    }
    [pre, out, sid_guard]
}

/// The pods' MTU on a node whose `peers` are reached as listed and whose own underlay is
/// `me`, given the MTUs of the links holding its IPv4 and IPv6 underlay addresses: the
/// smallest of what each path in use leaves (IPv6: the link's MTU minus [`SRV6_OVERHEAD`];
/// link-local: the IPv4 uplink's MTU minus [`SRV6_OVERHEAD`]; fou: minus [`SRV6_OVERHEAD`]
/// and [`IPV4_FOU_OVERHEAD`]). A node without peers counts the path it would use (IPv6 if it
/// has an IPv6 underlay). An unknown link MTU counts as [`DEFAULT_UNDERLAY_MTU`].
///
/// SRv6 encapsulation happens at route input, so a pod never learns a smaller path MTU from
/// the kernel: the MTU must fit the smallest path from the start.
pub fn pod_mtu<'a>(
    me: &Underlay,
    peers: impl IntoIterator<Item = &'a PeerPath>,
    mtu_v4: Option<u32>,
    mtu_v6: Option<u32>,
) -> u32 {
    let (mut v4, mut v6, mut ll) = (false, false, false);
    for p in peers {
        match p {
            PeerPath::Ipv6(_) => v6 = true,
            PeerPath::LinkLocal(_) => ll = true,
            PeerPath::Ipv4(_) => v4 = true,
            PeerPath::NoCommonFamily => {}
        }
    }
    if !v4 && !v6 && !ll {
        v6 = me.ipv6.is_some();
        v4 = !v6;
    }
    let over_v6 = mtu_v6
        .unwrap_or(DEFAULT_UNDERLAY_MTU)
        .saturating_sub(SRV6_OVERHEAD);
    let over_ll = mtu_v4
        .unwrap_or(DEFAULT_UNDERLAY_MTU)
        .saturating_sub(SRV6_OVERHEAD);
    let over_v4 = mtu_v4
        .unwrap_or(DEFAULT_UNDERLAY_MTU)
        .saturating_sub(SRV6_OVERHEAD + IPV4_FOU_OVERHEAD);
    [(v6, over_v6), (ll, over_ll), (v4, over_v4)]
        .into_iter()
        .filter(|(used, _)| *used)
        .map(|(_, mtu)| mtu)
        .min()
        .unwrap_or(over_v6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ul(v4: Option<&str>, v6: Option<&str>) -> Underlay {
        Underlay {
            ipv4: v4.map(|a| a.parse().unwrap()),
            ipv6: v6.map(|a| a.parse().unwrap()),
        }
    }

    #[test]
    fn the_pair_uses_ipv6_when_both_have_it_else_ipv4() {
        let dual = ul(Some("192.0.2.1"), Some("2001:db8::1"));
        let dual2 = ul(Some("192.0.2.2"), Some("2001:db8::2"));
        let v4 = ul(Some("192.0.2.3"), None);
        let v6 = ul(None, Some("2001:db8::4"));
        let cases = [
            (dual, dual2, PeerPath::Ipv6("2001:db8::2".parse().unwrap())),
            (dual, v4, PeerPath::Ipv4("192.0.2.3".parse().unwrap())),
            (v4, dual2, PeerPath::Ipv4("192.0.2.2".parse().unwrap())),
            (v6, dual2, PeerPath::Ipv6("2001:db8::2".parse().unwrap())),
            (v6, v4, PeerPath::NoCommonFamily),
            (v4, v6, PeerPath::NoCommonFamily),
        ];
        for (me, peer, want) in cases {
            assert_eq!(peer_path(&me, &peer, false), want, "{me:?} -> {peer:?}");
            // Symmetric in the family chosen.
            let back = peer_path(&peer, &me, false);
            assert_eq!(
                std::mem::discriminant(&back),
                std::mem::discriminant(&want),
                "{peer:?} -> {me:?}"
            );
        }
    }

    #[test]
    fn link_local_replaces_fou_only_where_it_works_and_never_ipv6() {
        let dual = ul(Some("192.0.2.1"), Some("2001:db8::1"));
        let dual2 = ul(Some("192.0.2.2"), Some("2001:db8::2"));
        let v4 = ul(Some("192.0.2.3"), None);
        let v6 = ul(None, Some("2001:db8::4"));
        let ll = |a: &str| PeerPath::LinkLocal(link_local_address(a.parse().unwrap()));
        assert_eq!(peer_path(&v4, &dual, true), ll("192.0.2.1"));
        assert_eq!(peer_path(&dual, &v4, true), ll("192.0.2.3"));
        // Global IPv6 between the two wins.
        assert_eq!(
            peer_path(&dual, &dual2, true),
            PeerPath::Ipv6("2001:db8::2".parse().unwrap())
        );
        // No IPv4 on one side: nothing to derive the next hop from.
        assert_eq!(peer_path(&v6, &v4, true), PeerPath::NoCommonFamily);
        assert_eq!(
            peer_path(&v4, &dual, false),
            PeerPath::Ipv4("192.0.2.1".parse().unwrap())
        );
    }

    #[test]
    fn the_link_local_address_carries_the_ipv4_internal_ip() {
        let a = link_local_address("192.168.0.12".parse().unwrap());
        assert_eq!(a, "fe80::4c61:6365:c0a8:c".parse::<Ipv6Addr>().unwrap());
        assert!(a.is_unicast_link_local());
        assert!(is_link_local_underlay(a));
        // The kernel's own (EUI-64, stable-privacy) are not Lace's.
        for other in [
            "fe80::1",
            "fe80::200:ff:fe00:1",
            "fe80::4c61:6366:c0a8:c",
            "fe81::4c61:6365:0:1",
        ] {
            assert!(!is_link_local_underlay(other.parse().unwrap()), "{other}");
        }
    }

    #[test]
    fn facts_need_ipv6_on_the_uplink_the_peer_on_link_and_answering() {
        let mut f = UnderlayFacts {
            uplink_ipv6: true,
            on_link: ["a".to_string(), "b".to_string()].into(),
            answering: ["a".to_string(), "c".to_string()].into(),
            answered: ["b".to_string()].into(),
            uplink_mtu: None,
        };
        assert!(f.link_local_works("a"));
        assert!(!f.link_local_works("b"), "on-link, not answering");
        assert!(f.link_local_expected("b"), "answered before");
        f.answered.clear();
        assert!(!f.link_local_expected("b"), "never answered: fou");
        assert!(f.link_local_expected("a"));
        assert!(!f.link_local_works("c"), "answering, but behind a router");
        f.uplink_ipv6 = false;
        assert!(!f.link_local_works("a"));
        assert!(!f.link_local_expected("a"));
    }

    #[test]
    fn the_tunnel_source_is_the_ipv6_internal_ip_else_the_locator_address() {
        let mut a = NodeAllocationSpec {
            index: 3,
            locator: "2001:db8:100::3:0:0/96".parse().unwrap(),
            underlay: ul(Some("192.0.2.3"), Some("2001:db8::3")),
        };
        assert_eq!(
            tunnel_source(&a),
            "2001:db8::3".parse::<Ipv6Addr>().unwrap()
        );
        a.underlay.ipv6 = None;
        let src = tunnel_source(&a);
        assert_eq!(src, "2001:db8:100::3:0:0".parse::<Ipv6Addr>().unwrap());
        // Inside the locator, and no Network's SID (functions start at 1).
        assert!(a.locator.contains(&src));
        for f in 1..=u16::MAX {
            assert_ne!(sid(a.locator, f), src);
        }
    }

    #[test]
    fn pod_mtu_fits_the_smallest_path_in_use() {
        let dual = ul(Some("192.0.2.1"), Some("2001:db8::1"));
        let p6 = PeerPath::Ipv6("2001:db8::2".parse().unwrap());
        let p4 = PeerPath::Ipv4("192.0.2.3".parse().unwrap());
        let none = PeerPath::NoCommonFamily;
        // 1500 - 64 over IPv6; 1500 - 64 - 28 over IPv4 (fou).
        assert_eq!(pod_mtu(&dual, &[p6], Some(1500), Some(1500)), 1436);
        assert_eq!(pod_mtu(&dual, &[p4], Some(1500), Some(1500)), 1408);
        assert_eq!(pod_mtu(&dual, &[p6, p4], Some(1500), Some(1500)), 1408);
        // Jumbo IPv4 uplink, 1500 IPv6 uplink: the IPv6 path is the smaller one.
        assert_eq!(pod_mtu(&dual, &[p6, p4], Some(9000), Some(1500)), 1436);
        assert_eq!(pod_mtu(&dual, &[p4], Some(9000), None), 9000 - 92);
        // No peers (yet): the path the node would use.
        assert_eq!(pod_mtu(&dual, &[], None, None), 1436);
        let v4 = ul(Some("192.0.2.1"), None);
        assert_eq!(pod_mtu(&v4, &[], Some(1450), None), 1450 - 92);
        assert_eq!(pod_mtu(&v4, &[none], None, None), 1408);
        // Link-local: the IPv4 uplink's MTU - 64, as over IPv6; fou beside it decides.
        let ll = PeerPath::LinkLocal(link_local_address("192.0.2.3".parse().unwrap()));
        assert_eq!(pod_mtu(&v4, &[ll], Some(1500), None), 1436);
        assert_eq!(pod_mtu(&v4, &[ll, p4], Some(1500), None), 1408);
        assert_eq!(pod_mtu(&v4, &[ll], Some(9000), None), 9000 - 64);
    }
}
