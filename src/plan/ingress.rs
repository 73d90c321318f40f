//! NodePort Services reached from outside the cluster, governed by ServiceRoutingPolicies
//! from an external Network (`from: internet, to: <the Service's Network>`).
//!
//! kube-proxy (iptables or nftables mode) translates `<node address>:<nodePort>` to a backend
//! pod in prerouting and, for `externalTrafficPolicy: Cluster`, sets its masquerade mark
//! ([`KUBE_PROXY_MASQUERADE_MARK`]). The packet arrived on the host's uplink, in the main
//! table (external Networks use the host's routing); from there Lace carries it:
//!
//! 1. **Routing on the ingress node.** The main table routes the subnets of every Network
//!    that holds backends of such Services into that Network's VRF (`dev lv-…`): the packet
//!    is forwarded into the VRF device, whose table holds the local pods (`/32`, `/128`) and a
//!    route to each remote backend, seg6-encapsulated towards the backend node's SID of the
//!    Network through the Network's ingress device ([`Nexthop::Seg6EncapIngress`]).
//! 2. **Policy on the ingress node.** In `forward` (and `output`, which the VRF's transmit
//!    path runs for the packet again), a new connection from outside the cluster that
//!    kube-proxy translated is accepted only when its original protocol and destination port
//!    are a node port of a granted Service and its new destination one of that Service's
//!    backends (set `nodeports_v4`/`_v6`); anything else from outside towards a pod meets the
//!    counted drop of `to_pods`.
//! 3. **Source NAT on the ingress node.** A connection kube-proxy marked for masquerade is
//!    source-NATed, in Lace's own nat chain before kube-proxy's masquerade (`ingress_snat`,
//!    priority `srcnat - 10`), to this node's ingress address in the backend's Network
//!    ([`ingress_address`]: the first address of the node's block, which the IPAM never hands
//!    out), so the backend's reply comes back to this node over SRv6: every node's VRF table
//!    routes each other node's ingress address of the Network to that node's SID, even when
//!    the Network does not reach itself. `externalTrafficPolicy: Local` (no mark, backends
//!    local) keeps the client's address.
//! 4. **Policy on the backend node.** The decapsulated packet from another node's ingress
//!    address (set `ingress_v4`/`_v6`) is accepted only towards a backend on this node of a
//!    Service granted from an external Network, on one of its target ports
//!    (`ingress_backends_v4`/`_v6`).
//! 5. **The reply on the ingress node.** Once conntrack has undone the source NAT, the reply's
//!    destination is the client outside, but it is in the VRF (from the pod's veth, or
//!    decapsulated into it): Lace's prerouting marks replies of translated connections opened
//!    from outside the cluster with [`INGRESS_MARK`], and the rule at
//!    [`RULE_PRIORITY_INGRESS_REPLY`] (before the l3mdev rule) routes them in the main table.
//!
//! The same chain source-NATs a pod's Service connection that kube-proxy sent back to the pod
//! itself (hairpin) to the ingress address of the pod's block ([`hairpin_maps`]).

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use super::nft::{Chain, Hook, Set};
use super::routes::{locator_route, RouteBuilder, PREC_INGRESS, PREC_REACH};
use super::underlay::PeerPath;
#[cfg(doc)]
use super::RULE_PRIORITY_INGRESS_REPLY;
use super::{
    host_net, NetInfo, Networks, Nexthop, INGRESS_MARK, INGRESS_PREFIX, KUBE_PROXY_MASQUERADE_MARK,
    MAIN_TABLE, VRF_PREFIX,
};
use crate::alloc::node_blocks;
use crate::api::NodeAllocationSpec;
use crate::routing::{BackendLocation, ServiceGrant};
use crate::sid::sid;
use crate::state::ClusterState;

/// The address a node source-NATs NodePort connections to in a Network: the first address of
/// its block, which the IPAM never hands out (IPv4 blocks shorter than /31, IPv6 blocks
/// shorter than /128). `None` for blocks whose every address may be a pod's.
pub fn ingress_address(block: IpNet) -> Option<IpAddr> {
    match block.trunc() {
        IpNet::V4(b) if b.prefix_len() < 31 => Some(IpAddr::V4(b.network())),
        IpNet::V6(b) if b.prefix_len() < 128 => Some(IpAddr::V6(b.network())),
        _ => None,
    }
}

/// The ingress device of VRF `vrf` (`lv-x` → `li-x`, as long as the VRF's name).
pub fn ingress_device(vrf: &str) -> String {
    format!(
        "{INGRESS_PREFIX}{}",
        vrf.strip_prefix(VRF_PREFIX).unwrap_or(vrf)
    )
}

/// What the grants from external Networks ask of the nodes.
pub(super) struct Ingress<'a, 'g> {
    /// The internal Networks holding backends of granted Services with node ports.
    pub networks: BTreeSet<&'a str>,
    /// The grants from an external Network to Services with node ports.
    grants: Vec<&'g ServiceGrant<'a>>,
}

impl<'a, 'g> Ingress<'a, 'g> {
    pub(super) fn new(
        state: &ClusterState,
        nets: &Networks<'_>,
        grants: &'g [ServiceGrant<'a>],
    ) -> Self {
        let grants: Vec<&ServiceGrant<'a>> = grants
            .iter()
            .filter(|g| {
                state.networks.get(g.from).is_some_and(|n| n.external)
                    && g.spec.ports.iter().any(|p| p.node_port.is_some())
            })
            .collect();
        let networks = grants
            .iter()
            .flat_map(|g| &g.backends)
            .filter_map(|b| match b.location {
                BackendLocation::Pod { network, .. } if nets.contains_key(network) => Some(network),
                _ => None,
            })
            .collect();
        Self { networks, grants }
    }

    /// The pod backends of the grants: (grant, address, Network, node).
    fn backends(
        &self,
    ) -> impl Iterator<Item = (&'g ServiceGrant<'a>, IpAddr, &'a str, &'a str)> + '_ {
        self.grants.iter().flat_map(|g| {
            g.backends.iter().filter_map(move |b| match b.location {
                BackendLocation::Pod { network, node, .. } => Some((*g, b.address, network, node)),
                _ => None,
            })
        })
    }
}

/// The ingress addresses of the node with allocation `alloc` in Network `info`.
fn addresses(alloc: &NodeAllocationSpec, info: &NetInfo<'_>) -> Vec<IpAddr> {
    node_blocks(alloc.index, info.spec_subnets)
        .into_iter()
        .filter_map(ingress_address)
        .collect()
}

/// The routes of node `node`: the Networks' subnets from the main table into their VRFs, the
/// other nodes' ingress addresses and the remote backends from the Networks' tables.
pub(super) fn routes(
    rb: &mut RouteBuilder,
    node: &str,
    state: &ClusterState,
    peers: &std::collections::BTreeMap<String, PeerPath>,
    nets: &Networks<'_>,
    ingress: &Ingress<'_, '_>,
) {
    for info in ingress.networks.iter().filter_map(|n| nets.get(n)) {
        for s in &info.subnets {
            rb.add(MAIN_TABLE, *s, PREC_REACH, Nexthop::Dev(info.vrf.clone()));
        }
        for (other, alloc) in state.node_allocations.iter().filter(|(n, _)| *n != node) {
            let Some((_, underlay)) = peers.get(other).and_then(locator_route) else {
                continue;
            };
            let segs = sid(alloc.locator, info.function);
            for a in addresses(alloc, info) {
                rb.add(
                    info.table,
                    host_net(a),
                    PREC_REACH,
                    Nexthop::Seg6Encap { segs, underlay },
                );
            }
        }
    }
    for (_, address, network, bnode) in ingress.backends() {
        let (Some(info), Some(alloc)) = (nets.get(network), state.node_allocations.get(bnode))
        else {
            continue;
        };
        if bnode == node {
            continue; // the pod's own host route
        }
        if peers.get(bnode).and_then(locator_route).is_none() {
            continue;
        }
        // Above a grant's route to the same backend from pods of the same Network: this one
        // works for both (pods' packets are encapsulated at route input either way).
        rb.add(
            info.table,
            host_net(address),
            PREC_INGRESS,
            Nexthop::Seg6EncapIngress {
                segs: sid(alloc.locator, info.function),
                dev: ingress_device(&info.vrf),
            },
        );
    }
}

/// The ruleset's sets for node `node` (allocation `me`), per family: the source NAT map, the
/// nodes' ingress addresses, the node ports and the backends on this node.
pub(super) fn sets(
    node: &str,
    state: &ClusterState,
    me: &NodeAllocationSpec,
    nets: &Networks<'_>,
    ingress: &Ingress<'_, '_>,
) -> [[Set; 2]; 4] {
    let family = |v6: bool| if v6 { "ipv6_addr" } else { "ipv4_addr" };
    let per_family = |f: &dyn Fn(bool) -> Set| [f(false), f(true)];
    let suffix = |v6: bool| if v6 { "v6" } else { "v4" };
    let mut snat = per_family(&|v6| {
        Set::new_map(
            &format!("ingress_snat_{}", suffix(v6)),
            family(v6),
            family(v6),
            true,
            "NodePort connections from outside, masqueraded by kube-proxy: backend subnet : this node's ingress address in that Network",
        )
    });
    let mut addrs = per_family(&|v6| {
        Set::new(
            &format!("ingress_{}", suffix(v6)),
            family(v6),
            false,
            "the nodes' ingress addresses (first address of their blocks): sources of NodePort connections from other nodes",
        )
    });
    let mut nodeports = per_family(&|v6| {
        Set::new(
            &format!("nodeports_{}", suffix(v6)),
            &format!("inet_proto . inet_service . {}", family(v6)),
            false,
            "ServiceRoutingPolicy from an external Network: protocol . node port . backend",
        )
    });
    let mut backends = per_family(&|v6| {
        Set::new(
            &format!("ingress_backends_{}", suffix(v6)),
            &format!("{} . inet_proto . inet_service", family(v6)),
            false,
            "ServiceRoutingPolicy from an external Network: backend on this node . protocol . target port",
        )
    });
    for info in ingress.networks.iter().filter_map(|n| nets.get(n)) {
        let reason = format!("Network {}", info.name);
        for a in addresses(me, info) {
            for s in info
                .subnets
                .iter()
                .filter(|s| s.addr().is_ipv6() == a.is_ipv6())
            {
                snat[usize::from(a.is_ipv6())].add(s.to_string(), Some(&a.to_string()), &reason);
            }
        }
        for (n, alloc) in &state.node_allocations {
            for a in addresses(alloc, info) {
                addrs[usize::from(a.is_ipv6())].add(
                    a.to_string(),
                    None,
                    &format!("node {n}, Network {}", info.name),
                );
            }
        }
    }
    for (g, address, _, bnode) in ingress.backends() {
        let i = usize::from(address.is_ipv6());
        let reason = format!("ServiceRoutingPolicy {}: {}", g.policy, g.service);
        for p in &g.spec.ports {
            if let Some(np) = p.node_port {
                let proto = p.protocol.to_ascii_lowercase();
                nodeports[i].add(format!("{proto} . {np} . {address}"), None, &reason);
            }
        }
        if bnode == node {
            for p in g.target_ports {
                let proto = p.protocol.to_ascii_lowercase();
                backends[i].add(format!("{address} . {proto} . {}", p.port), None, &reason);
            }
        }
    }
    [snat, addrs, nodeports, backends]
}

/// The hairpin maps, per family: for each pod on node `node` (allocation `me`), `pod . pod :`
/// this node's ingress address in the pod's block. A pod's connection to a Service it backs
/// comes back to itself; kube-proxy masquerades such a connection (the pod would drop a packet
/// from its own address), and masquerading picks an address of the output device or its VRF,
/// of which Lace's have none ("lp-… ate my IP address", the packet dropped). Lace's source NAT
/// to the ingress address, ahead of kube-proxy's masquerade, takes its place. A pod is here
/// once its `status.podIPs` are known; pods in blocks without an ingress address (IPv4 /31,
/// /32, IPv6 /128) are not.
pub(super) fn hairpin_maps(
    node: &str,
    state: &ClusterState,
    me: &NodeAllocationSpec,
    nets: &Networks<'_>,
) -> [Set; 2] {
    let map = |v: &str, family: &str| {
        Set::new_map(
            &format!("hairpin_{v}"),
            &format!("{family} . {family}"),
            family,
            false,
            "pods of this node reaching themselves through a Service: pod . pod : this node's ingress address in the pod's block",
        )
    };
    let mut maps = [map("v4", "ipv4_addr"), map("v6", "ipv6_addr")];
    let blocks: Vec<(IpNet, IpAddr)> = nets
        .values()
        .flat_map(|info| node_blocks(me.index, info.spec_subnets))
        .filter_map(|b| ingress_address(b).map(|a| (b, a)))
        .collect();
    for (key, pod) in state
        .pods
        .iter()
        .filter(|(_, p)| p.node == node && !p.host_network)
    {
        for ip in &pod.ips {
            if let Some((_, a)) = blocks.iter().find(|(b, _)| b.contains(ip)) {
                maps[usize::from(ip.is_ipv6())].add(
                    format!("{ip} . {ip}"),
                    Some(&a.to_string()),
                    &format!("pod {key}"),
                );
            }
        }
    }
    maps
}

/// `meta mark & MASK == MARK` text for nft.
fn mark_is(mark: u32) -> String {
    format!("meta mark & {mark:#010x} == {mark:#010x}")
}

/// Prerouting (`from_vrfs`): marks replies of connections opened from outside the cluster that kube-proxy
/// translated, as they come from a pod or decapsulated into a VRF, after conntrack undid the
/// source NAT, for the main table (see the module docs). One rule in `from_vrfs` picks the
/// replies of translated connections; the returned chain marks those of clients outside.
pub(super) fn mark_replies(from_vrfs: &mut Chain) -> Chain {
    from_vrfs.rule(
        format!("ct direction reply ct status dnat jump {NODEPORT_REPLIES}"),
        "replies of connections kube-proxy translated",
    );
    let mut replies = Chain {
        name: NODEPORT_REPLIES.into(),
        hook: None,
        comment: "replies of translated connections: those to clients outside the cluster leave by the main table".into(),
        rules: Vec::new(),
    };
    for (ip, v) in [("ip", "v4"), ("ip6", "v6")] {
        replies.rule(
            format!(
                "ct original {ip} saddr != @cluster_{v} meta mark set mark | {INGRESS_MARK:#010x}"
            ),
            "replies to clients outside the cluster (NodePort): routed in the main table",
        );
    }
    replies
}

/// The chain of [`mark_replies`].
const NODEPORT_REPLIES: &str = "nodeport_replies";

/// The accept rule of NodePort connections granted from an external Network, for `to_pods`
/// (forwarded into the VRF) and `from_host` (the VRF's transmit path runs `output`). The
/// `meta l4proto` match gives nft (1.0.6) the protocol context without which it cannot type
/// `ct original proto-dst` inside a concatenation ("variable sized data types").
pub(super) fn accept_nodeports(chain: &mut Chain) {
    for (ip, v) in [("ip", "v4"), ("ip6", "v6")] {
        chain.rule(
            format!("ct status dnat meta l4proto {{ tcp, udp, sctp }} {ip} saddr != @cluster_{v} ct protocol . ct original proto-dst . {ip} daddr @nodeports_{v} accept"),
            "ServiceRoutingPolicy from an external Network: NodePort connections from outside the cluster",
        );
    }
}

/// The accept rule of NodePort connections from other nodes' ingress addresses to backends on
/// this node, for `to_pods` and `from_pods` (a decapsulated packet may traverse prerouting
/// with its VRF as input device).
pub(super) fn accept_from_ingress(chain: &mut Chain) {
    for (ip, v) in [("ip", "v4"), ("ip6", "v6")] {
        chain.rule(
            format!("{ip} saddr @ingress_{v} {ip} daddr . ct protocol . th dport @ingress_backends_{v} accept"),
            "ServiceRoutingPolicy from an external Network: NodePort connections through other nodes, to backends on this node",
        );
    }
}

/// `ingress_snat`: the source NAT of NodePort connections kube-proxy marked for masquerade,
/// before kube-proxy's own masquerade (which would take an address of the pod's veth or none).
///
/// Forwarded into the VRF device, such a packet traverses postrouting twice: with the VRF as
/// output device, where (seen on 6.1) the nat chains are not evaluated, and again on the VRF's
/// transmit path with the device its table chose, the pod's veth or, for a remote backend,
/// the ingress device (seg6's output hook, `nf_hooks_lwtunnel`), where they are. So the rule
/// names no output device: what it takes is told by the connection (translated, from outside
/// the cluster, marked) and its destination (a pod of a Network in the map).
pub(super) fn snat_chain() -> Chain {
    let mut chain = Chain {
        name: "ingress_snat".into(),
        hook: Some(Hook {
            kind: "nat",
            hook: "postrouting",
            priority: "srcnat - 10",
        }),
        comment: "before kube-proxy's masquerade: NodePort connections from outside into a VRF, pods hairpinned to themselves".into(),
        rules: Vec::new(),
    };
    let masq = mark_is(KUBE_PROXY_MASQUERADE_MARK);
    for (ip, v) in [("ip", "v4"), ("ip6", "v6")] {
        chain.rule(
            format!("{ip} saddr != @cluster_{v} ct status dnat {masq} snat {ip} to {ip} daddr map @ingress_snat_{v}"),
            "kube-proxy's masquerade mark (externalTrafficPolicy Cluster): the backend's reply comes back to this node",
        );
        chain.rule(
            format!("ct status dnat snat {ip} to {ip} saddr . {ip} daddr map @hairpin_{v}"),
            "a pod hairpinned to itself through a Service: source NAT to this node's ingress address in its block",
        );
    }
    chain
}
