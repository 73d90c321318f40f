//! Networks with `hostAccess`: the nodes' own processes (hostNetwork pods, node daemons) open
//! connections to their pods on every node, as the Kubernetes network model assumes. Other
//! Networks stay closed to the host except for the kubelet's probes of local pods.
//!
//! 1. **Routing on the client's node.** Only packets the node itself sends take
//!    [`HOST_ACCESS_TABLE`]: the rule at [`RULE_PRIORITY_HOST_ACCESS`] matches `iif lo` (the
//!    kernel's input interface of locally generated packets), so forwarded and pods' packets
//!    never see it. The table holds the local pods of such Networks (the kubelet-probe routes'
//!    copies: `dev <veth> src <InternalIP | fe80::1>`) and every other node's blocks of them,
//!    seg6-encapsulated towards that node's SID of the Network, as the pods' own routes are.
//!    The connection's source is the node's address (its InternalIP on the uplink; `fe80::1`
//!    towards local IPv6 pods), never NATed.
//! 2. **Policy on the client's node.** `output` (`from_host`) accepts host processes towards
//!    pods of such Networks (set `host_access_v4`/`_v6`).
//! 3. **Policy on the pod's node.** A decapsulated connection from a node's InternalIP (set
//!    `nodes_v4`/`_v6`) to a pod of such a Network is accepted in `to_pods` (and `from_pods`,
//!    which a decapsulated packet may traverse), after the pod's NetworkPolicy chain: from
//!    other nodes, NetworkPolicy applies (an `ipBlock` can name the nodes). Connections from
//!    the pod's own node never pass `to_pods`, as upstream's NetworkPolicy allows them.
//! 4. **The reply.** The Network's VRF table routes every other node's InternalIPs to that
//!    node's SID of the Network; decapsulated there into the same VRF, the reply's destination
//!    is a local address, which the local table (rule 0, ahead of the l3mdev rule) delivers
//!    to the host's socket (`tcp_l3mdev_accept` / `udp_l3mdev_accept`). A local pod's reply
//!    takes the same local table. Pods still open nothing towards the nodes: `from_pods`
//!    drops a new connection to an address outside every Network it may reach.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::nft::{Chain, Set};
use super::routes::{locator_route, RouteBuilder, PREC_REACH};
use super::underlay::PeerPath;
use super::{host_net, Family, Networks, Nexthop, Rule, RuleAction};
use crate::alloc::node_blocks;
use crate::api::NodeAllocationSpec;
use crate::sid::sid;
use crate::state::ClusterState;

/// The table of routes host processes take to pods of Networks with `hostAccess`: local pods
/// and the other nodes' blocks. Right after [`super::PROBE_TABLE`], the last id Lace owns.
pub const HOST_ACCESS_TABLE: u32 = super::PROBE_TABLE + 1;
/// Priority of the rule `iif lo lookup` [`HOST_ACCESS_TABLE`]: after the fwmark rules (a
/// kubelet probe keeps its own table), before the l3mdev rule.
pub const RULE_PRIORITY_HOST_ACCESS: u32 = 996;

/// The Networks (internal, with a VRF) whose `spec.hostAccess` is set.
pub(super) fn networks<'a>(state: &ClusterState, nets: &Networks<'a>) -> BTreeSet<&'a str> {
    nets.keys()
        .copied()
        .filter(|n| state.networks.get(*n).is_some_and(|s| s.host_access))
        .collect()
}

/// The rule, per family, while some Network has `hostAccess`.
pub(super) fn rules(host_access: &BTreeSet<&str>) -> Vec<Rule> {
    if host_access.is_empty() {
        return Vec::new();
    }
    [Family::V4, Family::V6]
        .into_iter()
        .map(|family| Rule {
            priority: RULE_PRIORITY_HOST_ACCESS,
            family,
            action: RuleAction::FromHost {
                table: HOST_ACCESS_TABLE,
            },
        })
        .collect()
}

/// Node `node`'s routes for the Networks with `hostAccess`: the other nodes' blocks in
/// [`HOST_ACCESS_TABLE`], the other nodes' InternalIPs in each such Network's table (the
/// replies). The local pods' routes come with the pods ([`super::Planner::plan`]).
pub(super) fn routes(
    rb: &mut RouteBuilder,
    node: &str,
    state: &ClusterState,
    peers: &BTreeMap<String, PeerPath>,
    nets: &Networks<'_>,
    host_access: &BTreeSet<&str>,
) {
    for info in host_access.iter().filter_map(|n| nets.get(n)) {
        for (other, alloc) in state.node_allocations.iter().filter(|(n, _)| *n != node) {
            let Some((_, underlay)) = peers.get(other).and_then(locator_route) else {
                continue;
            };
            let segs = sid(alloc.locator, info.function);
            for b in node_blocks(alloc.index, info.spec_subnets) {
                rb.add(
                    HOST_ACCESS_TABLE,
                    b,
                    PREC_REACH,
                    Nexthop::Seg6Encap { segs, underlay },
                );
            }
            for ip in node_addresses(alloc) {
                rb.add(
                    info.table,
                    host_net(ip),
                    PREC_REACH,
                    Nexthop::Seg6Encap { segs, underlay },
                );
            }
        }
    }
}

/// A node's InternalIPs as its NodeAllocation records them (the first of each family): what
/// every agent knows of every node (an agent watches only its own Node object).
fn node_addresses(alloc: &NodeAllocationSpec) -> impl Iterator<Item = IpAddr> {
    let u = alloc.underlay;
    u.ipv4
        .map(IpAddr::V4)
        .into_iter()
        .chain(u.ipv6.map(IpAddr::V6))
}

/// The ruleset's sets, per family: the subnets of the Networks with `hostAccess`, and every
/// node's InternalIPs ([`node_addresses`]).
pub(super) fn sets(
    state: &ClusterState,
    nets: &Networks<'_>,
    host_access: &BTreeSet<&str>,
) -> [[Set; 2]; 2] {
    let set = |name: &str, v6: bool, interval: bool, comment: &str| {
        let v = if v6 { "v6" } else { "v4" };
        let family = if v6 { "ipv6_addr" } else { "ipv4_addr" };
        Set::new(&format!("{name}_{v}"), family, interval, comment)
    };
    let subnets_comment = "Networks with hostAccess: the nodes' processes reach their pods";
    let mut subnets = [
        set("host_access", false, true, subnets_comment),
        set("host_access", true, true, subnets_comment),
    ];
    let nodes_comment = "every node's InternalIPs: sources of host processes' connections to Networks with hostAccess";
    let mut nodes = [
        set("nodes", false, false, nodes_comment),
        set("nodes", true, false, nodes_comment),
    ];
    for info in host_access.iter().filter_map(|n| nets.get(n)) {
        for s in &info.subnets {
            subnets[usize::from(s.addr().is_ipv6())].add(
                s.to_string(),
                None,
                &format!("Network {}", info.name),
            );
        }
    }
    if !host_access.is_empty() {
        for (name, alloc) in &state.node_allocations {
            for ip in node_addresses(alloc) {
                nodes[usize::from(ip.is_ipv6())].add(ip.to_string(), None, &format!("node {name}"));
            }
        }
    }
    [subnets, nodes]
}

/// `from_host`: host processes towards pods of Networks with `hostAccess`.
pub(super) fn accept_from_host(from_host: &mut Chain) {
    for (ip, v) in [("ip", "v4"), ("ip6", "v6")] {
        from_host.rule(
            format!("{ip} daddr @host_access_{v} accept"),
            "Network with hostAccess: host processes open connections to its pods",
        );
    }
}

/// `to_pods` and `from_pods`: connections from other nodes' processes (by their InternalIPs)
/// to pods of Networks with `hostAccess`.
pub(super) fn accept_from_nodes(chain: &mut Chain) {
    for (ip, v) in [("ip", "v4"), ("ip6", "v6")] {
        chain.rule(
            format!("{ip} saddr @nodes_{v} {ip} daddr @host_access_{v} accept"),
            "Network with hostAccess: other nodes' processes open connections to its pods",
        );
    }
}
