//! The pod-independent part of a node's plan ([`NodeBase`]): the underlay towards each peer,
//! one VRF per internal Network, the routes the routing policies ask for, the rules and the
//! sysctls. The ruleset is built beside it, in `ruleset`.
//!
//! Routes are collected with a precedence per kind and the highest wins per key, so the parts
//! can be added in any order: a route that reaches something beats an unreachable fallback
//! for the same prefix.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::host_access;
use super::ingress::{self, ingress_device, Ingress};
use super::routes::{locator_route, RouteBuilder, PREC_EGRESS, PREC_FALLBACK, PREC_REACH};
use super::ruleset::{build_ruleset, Policies};
use super::underlay::{
    link_local_address, mss_clamp, peer_path, tunnel_source, Ipv4Tunnel, PeerPath, UnderlayFacts,
    IPV4_TUNNEL,
};
use super::{
    disable_ipv6_key, host_net, vrf_name, vrf_table, Family, NetInfo, Networks, Nexthop, NodeBase,
    PlanError, PodNetwork, Rule, RuleAction, Underpath, Vrf, FIB_SYNC_MEM, FIB_SYNC_MEM_BYTES,
    INGRESS_MARK, INGRESS_MARK_MASK, MAIN_TABLE, PROBE_MARK, PROBE_MARK_MASK, PROBE_TABLE,
    RULE_PRIORITY_INGRESS_REPLY, RULE_PRIORITY_L3MDEV, RULE_PRIORITY_LOCATORS, RULE_PRIORITY_PROBE,
};
use crate::alloc::node_blocks;
use crate::api::NodeAllocationSpec;
use crate::routing::{allowed_pairs, service_grants, BackendLocation, ServiceGrant};
use crate::sid::sid;
use crate::state::ClusterState;

fn default_net(v6: bool) -> IpNet {
    if v6 {
        IpNet::V6(Ipv6Net::default())
    } else {
        IpNet::V4(Ipv4Net::default())
    }
}

/// What the routing policies ask of this node's routes, by Network name.
struct Reach<'a> {
    /// (src, dst): src's table routes all of dst's blocks. Both directions of an allowed pair
    /// (replies), plus backend Network → client Network for Service grants (replies).
    pairs: BTreeSet<(&'a str, &'a str)>,
    /// Networks allowed to open connections to external destinations, with the policies.
    egress: BTreeMap<&'a str, Vec<&'a str>>,
    /// Networks that need their local blocks routed from the main table (replies from hosts).
    host_reply: BTreeSet<&'a str>,
}

/// The pod-independent part of node `node`'s plan.
pub(super) fn build_base(
    node: &str,
    state: &ClusterState,
    facts: &UnderlayFacts,
) -> Result<NodeBase, PlanError> {
    let me: &NodeAllocationSpec =
        state
            .node_allocations
            .get(node)
            .ok_or_else(|| PlanError::NodeNotAllocated {
                node: node.to_string(),
            })?;
    let (peers, ipv4_tunnel, link_local) = underlay_paths(node, state, me, facts);
    let (nets, mut vrfs) = networks(state, me)?;
    let pairs = allowed_pairs(state);
    let grants = service_grants(state);
    let reach = reach(state, &nets, &pairs, &grants);
    let ingress = Ingress::new(state, &nets, &grants);
    for n in ingress.networks.iter().filter_map(|n| nets.get(n)) {
        if let Some(v) = vrfs.get_mut(&n.vrf) {
            v.ingress = Some(ingress_device(&n.vrf));
        }
    }

    let mut rb = RouteBuilder::default();
    fallback_and_egress_routes(&mut rb, &nets, &reach.egress);
    host_reply_routes(&mut rb, me, &nets, &reach.host_reply);
    local_sid_routes(&mut rb, me, &nets);
    block_routes(&mut rb, state, &peers, &nets, &reach.pairs);
    backend_routes(&mut rb, node, state, &peers, &nets, &grants);
    ingress::routes(&mut rb, node, state, &peers, &nets, &ingress);
    let host_access = host_access::networks(state, &nets);
    host_access::routes(&mut rb, node, state, &peers, &nets, &host_access);

    let mut rules = rules(locator_span(
        state.node_allocations.values().map(|a| a.locator),
    ));
    rules.extend(host_access::rules(&host_access));
    let sysctls = sysctls(&vrfs, ipv4_tunnel.is_some());
    let internal_ips: &[IpAddr] = state
        .nodes
        .get(node)
        .map(|n| n.internal_ips.as_slice())
        .unwrap_or_default();
    let policies = Policies {
        pairs: &pairs,
        egress: &reach.egress,
        grants: &grants,
        ingress: &ingress,
        host_access: &host_access,
    };
    let mut ruleset = build_ruleset(node, state, me, &nets, &policies);
    if let Some(clamp) = mss_clamp(
        &fou_clamp_blocks(state, &peers, facts, &nets),
        facts.uplink_mtu,
    ) {
        clamp.install(&mut ruleset);
    }
    let pod_networks = nets
        .values()
        .map(|n| {
            let blocks = node_blocks(me.index, n.spec_subnets);
            (
                n.name.to_string(),
                PodNetwork {
                    table: n.table,
                    vrf: n.vrf.clone(),
                    blocks,
                    host_access: host_access.contains(n.name),
                },
            )
        })
        .collect();
    // Last: finished before the ruleset, the agent's resident size with the plan at 5,000 x 50
    // was 100 MiB instead of 83 (`--bench agent_watch`; where the allocator puts what follows).
    let routes = rb.finish();
    Ok(NodeBase {
        locator: me.locator.trunc(),
        underlay: me.underlay,
        seg6_tunsrc: tunnel_source(me),
        peers,
        ipv4_tunnel,
        link_local,
        facts: facts.clone(),
        vrfs,
        routes: routes.always,
        pod_reach: routes.local_pods,
        rules,
        sysctls,
        nft: ruleset,
        probe_src_v4: internal_ips.iter().find(|ip| ip.is_ipv4()).copied(),
        pod_networks,
    })
}

/// Per peer, the path (IPv6 first, then link-local where `facts` say it works, then fou),
/// Lace's SRv6-over-IPv4 device when some peer is reached over IPv4, and the node's
/// link-local underlay address when some peer shares its L2 segment (so that the peer's
/// probes find it before either uses the path).
fn underlay_paths(
    node: &str,
    state: &ClusterState,
    me: &NodeAllocationSpec,
    facts: &UnderlayFacts,
) -> (
    BTreeMap<String, PeerPath>,
    Option<Ipv4Tunnel>,
    Option<std::net::Ipv6Addr>,
) {
    let peers: BTreeMap<String, PeerPath> = state
        .node_allocations
        .iter()
        .filter(|(n, _)| n.as_str() != node)
        .map(|(n, a)| {
            let ll = facts.link_local_works(n);
            (n.clone(), peer_path(&me.underlay, &a.underlay, ll))
        })
        .collect();
    let link_local = me.underlay.ipv4.filter(|_| {
        facts.uplink_ipv6
            && peers.iter().any(|(n, p)| {
                matches!(p, PeerPath::LinkLocal(_))
                    || (matches!(p, PeerPath::Ipv4(_)) && facts.on_link.contains(n))
            })
    });
    let ipv4_tunnel = match me.underlay.ipv4 {
        Some(local) if peers.values().any(|p| matches!(p, PeerPath::Ipv4(_))) => Some(Ipv4Tunnel {
            local,
            address: me.underlay.ipv6.is_none().then(|| tunnel_source(me)),
        }),
        _ => None,
    };
    (peers, ipv4_tunnel, link_local.map(link_local_address))
}

/// The pod blocks (every internal Network's) of the peers that share this node's L2 segment but
/// are reached over fou: the TCP MSS clamp's targets ([`super::underlay::mss_clamp`]). On-link
/// counts whether or not the uplink has IPv6 now: pods made while it had keep their MTU.
fn fou_clamp_blocks<'a>(
    state: &'a ClusterState,
    peers: &'a BTreeMap<String, PeerPath>,
    facts: &UnderlayFacts,
    nets: &Networks<'_>,
) -> Vec<(IpNet, &'a str)> {
    let mut out = Vec::new();
    for (peer, path) in peers {
        if !matches!(path, PeerPath::Ipv4(_)) || !facts.on_link.contains(peer) {
            continue;
        }
        let Some(alloc) = state.node_allocations.get(peer) else {
            continue;
        };
        for n in nets.values() {
            for b in node_blocks(alloc.index, n.spec_subnets) {
                out.push((b, peer.as_str()));
            }
        }
    }
    out
}

/// The internal Networks by name and their VRFs by device name. Fails on a Network without
/// a SID function, and on two Networks sharing a function or a VRF name.
fn networks<'a>(
    state: &'a ClusterState,
    me: &NodeAllocationSpec,
) -> Result<(Networks<'a>, BTreeMap<String, Vrf>), PlanError> {
    let mut nets: Networks<'_> = BTreeMap::new();
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
                ingress: None,
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
    Ok((nets, vrfs))
}

/// What the allowed pairs and the Service grants ask the routes to reach.
fn reach<'a>(
    state: &'a ClusterState,
    nets: &Networks<'_>,
    pairs: &BTreeMap<(&'a str, &'a str), Vec<&'a str>>,
    grants: &[ServiceGrant<'a>],
) -> Reach<'a> {
    let external: BTreeSet<&str> = state
        .networks
        .iter()
        .filter(|(_, n)| n.external)
        .map(|(k, _)| k.as_str())
        .collect();
    let mut reach: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut egress: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (&(from, to), policies) in pairs {
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
    let mut host_reply: BTreeSet<&str> = egress.keys().copied().collect();
    for g in grants {
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
    Reach {
        pairs: reach,
        egress,
        host_reply,
    }
}

/// Each VRF's default: via the host for a Network with egress (which must not become a path
/// into the other Networks), unreachable otherwise.
fn fallback_and_egress_routes(
    rb: &mut RouteBuilder,
    nets: &Networks<'_>,
    egress: &BTreeMap<&str, Vec<&str>>,
) {
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
}

/// This node's blocks of the Networks hosts answer, from the main table into their VRF.
fn host_reply_routes(
    rb: &mut RouteBuilder,
    me: &NodeAllocationSpec,
    nets: &Networks<'_>,
    host_reply: &BTreeSet<&str>,
) {
    for n in host_reply {
        if let Some(info) = nets.get(n) {
            for b in node_blocks(me.index, info.spec_subnets) {
                rb.add(MAIN_TABLE, b, PREC_REACH, Nexthop::Dev(info.vrf.clone()));
            }
        }
    }
}

/// This node's SIDs, one per Network, decapsulating into its VRF.
fn local_sid_routes(rb: &mut RouteBuilder, me: &NodeAllocationSpec, nets: &Networks<'_>) {
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
}

/// The blocks of reachable Networks on every node: local ones leaked into the destination's
/// VRF, remote ones seg6-encapsulated towards the node's SID, plus the routes to the peers'
/// locators. The blocks are routes for local pods ([`RouteBuilder::add_for_local_pods`]):
/// only packets of the source Network's pods on this node are looked up in its table for
/// them (a packet decapsulated into a VRF is for a local pod, NodePort traffic and host
/// processes have routes of their own).
fn block_routes(
    rb: &mut RouteBuilder,
    state: &ClusterState,
    peers: &BTreeMap<String, PeerPath>,
    nets: &Networks<'_>,
    reach: &BTreeSet<(&str, &str)>,
) {
    // Each source Network's table with the Networks it reaches, in table order: the builder
    // then gets each table's routes in one run, and sorts only within it.
    let mut dsts_by_table: BTreeMap<u32, (&NetInfo<'_>, Vec<&NetInfo<'_>>)> = BTreeMap::new();
    for &(src, dst) in reach {
        if let (Some(src), Some(dst)) = (nets.get(src), nets.get(dst)) {
            dsts_by_table
                .entry(src.table)
                .or_insert_with(|| (src, Vec::new()))
                .1
                .push(dst);
        }
    }
    // The nodes by index, as their blocks lie in each subnet, each with its locator's route.
    let mut nodes: Vec<(&NodeAllocationSpec, Option<(Nexthop, Underpath)>)> =
        Vec::with_capacity(state.node_allocations.len());
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
        nodes.push((alloc, to_locator));
    }
    nodes.sort_by_key(|(alloc, _)| alloc.index);
    // At most a block per subnet per node: room for them at once rather than by doubling.
    rb.reserve_for_local_pods(
        dsts_by_table
            .values()
            .flat_map(|(_, dsts)| dsts)
            .map(|dst| dst.spec_subnets.len() * nodes.len())
            .sum(),
    );
    for (src, dsts) in dsts_by_table.values_mut() {
        // Networks with disjoint subnets then add their blocks in address order, already
        // sorted (the order only saves work; the builder sorts each table's run).
        dsts.sort_by(|a, b| a.subnets.cmp(&b.subnets).then(a.name.cmp(b.name)));
        for dst in dsts.iter() {
            for (alloc, to_locator) in &nodes {
                let nh = match to_locator {
                    // Local pods of the same Network: their own host routes.
                    None if src.name == dst.name => continue,
                    None => Nexthop::Dev(dst.vrf.clone()),
                    Some((_, underlay)) => Nexthop::Seg6Encap {
                        segs: sid(alloc.locator, dst.function),
                        underlay: *underlay,
                    },
                };
                for b in node_blocks(alloc.index, dst.spec_subnets) {
                    rb.add_for_local_pods(src.table, b, PREC_REACH, nh.clone());
                }
            }
        }
    }
}

/// Service grants: host routes to each backend, from the client Network's table.
fn backend_routes(
    rb: &mut RouteBuilder,
    node: &str,
    state: &ClusterState,
    peers: &BTreeMap<String, PeerPath>,
    nets: &Networks<'_>,
    grants: &[ServiceGrant<'_>],
) {
    for g in grants {
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
                    } else if let Some((alloc, (_, underlay))) = state
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
                    }
                }
                BackendLocation::Outside => rb.add(src.table, dst, PREC_REACH, Nexthop::Host),
                BackendLocation::Unallocated { .. } => {}
            }
        }
    }
}

/// The smallest prefix that holds every locator (the cluster's `srv6LocatorPrefix` or a part of
/// it), or none without locators.
fn locator_span(locators: impl IntoIterator<Item = Ipv6Net>) -> Option<Ipv6Net> {
    let mut locators = locators.into_iter().map(|l| l.trunc());
    let mut span = locators.next()?;
    for l in locators {
        while !span.contains(&l) {
            span = span.supernet()?;
        }
    }
    Some(span)
}

/// The l3mdev, kubelet-probe and NodePort reply rules, for both families, and the IPv6 rule
/// that routes the locators (`span`) in the main table.
///
/// The outer lookup of a packet encapsulated in a VRF (a pod's, towards a peer's SID) happens
/// with the VRF as its device, so without that rule the l3mdev rule would take it to the VRF's
/// table. The rule widens nothing a pod can reach: its own packets to a SID meet the ruleset's
/// policy (`from_pods`) in the VRF's prerouting pass before any route lookup, and at the SID
/// the ingress guard. (A rule matching the SRH by `ipproto` does not work: the kernel's flow
/// dissection for rules skips extension headers, and what it finds, IPv4 or IPv6 in IPv6, pods
/// can send too.)
fn rules(span: Option<Ipv6Net>) -> BTreeSet<Rule> {
    let mut rules = BTreeSet::new();
    if let Some(dst) = span {
        rules.insert(Rule {
            priority: RULE_PRIORITY_LOCATORS,
            family: Family::V6,
            action: RuleAction::ToPrefix {
                dst,
                table: MAIN_TABLE,
            },
        });
    }
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
        rules.insert(Rule {
            priority: RULE_PRIORITY_INGRESS_REPLY,
            family,
            action: RuleAction::Fwmark {
                mark: INGRESS_MARK,
                mask: INGRESS_MARK_MASK,
                table: MAIN_TABLE,
            },
        });
    }
    rules
}

/// The sysctls the datapath needs: node-wide ones, two per VRF and one for the IPv4 tunnel if
/// any. The per-device ones are written whenever the diff creates the device (before its
/// addresses and routes) and read back by every reconcile.
///
/// `disable_ipv6 0` on each device of Lace's that carries IPv6: a host that disables IPv6 by
/// default (`net.ipv6.conf.default.disable_ipv6=1`, common hardening on IPv4-only hosts) has
/// every device created later inherit it, and the kernel then refuses IPv6 addresses and routes
/// on it (a VRF's `End.DT46` SID, an IPv6 pod's `/128`). Only Lace's own devices are enabled;
/// the host's (`all`, `default`, its uplinks) are never touched. Pod veths get theirs from the
/// diff when they are enslaved (see `dataplane::diff::pod_link_sysctls`).
fn sysctls(vrfs: &BTreeMap<String, Vrf>, ipv4_tunnel: bool) -> BTreeMap<String, String> {
    let mut sysctls = BTreeMap::new();
    // `net.vrf.strict_mode` exists only once the vrf module is loaded, which creating the first
    // VRF does (the diff creates devices before it writes sysctls). A node without any Network
    // yet (the plugin chart installed before the networks chart) has no VRF, and writing it
    // there fails with ENOENT.
    if !vrfs.is_empty() {
        sysctls.insert("net.vrf.strict_mode".to_string(), "1".to_string());
    }
    for (k, v) in [
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
    sysctls.insert(FIB_SYNC_MEM.to_string(), FIB_SYNC_MEM_BYTES.to_string());
    for (name, vrf) in vrfs {
        // Decapsulated packets enter through the VRF device; the kernel uses max(all, dev).
        sysctls.insert(format!("net.ipv4.conf.{name}.rp_filter"), "0".to_string());
        // Its SIDs (`End.DT46 ... dev <vrf>`) and IPv6 routes through it need IPv6 on it.
        sysctls.insert(disable_ipv6_key(name), "0".to_string());
        if let Some(dev) = &vrf.ingress {
            // The IPv6 routes to remote NodePort backends go through it.
            sysctls.insert(disable_ipv6_key(dev), "0".to_string());
        }
    }
    if ipv4_tunnel {
        // The tunnel carries IPv6 even where the host disables it by default.
        sysctls.insert(disable_ipv6_key(IPV4_TUNNEL), "0".to_string());
    }
    sysctls
}
