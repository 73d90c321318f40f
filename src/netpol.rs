//! NetworkPolicy semantics over the cluster state, as upstream defines them: which pods a
//! policy selects, which pods and addresses its peers are, and what its ports mean on a given
//! destination pod. The planner ([`crate::plan`]) turns this into nftables sets; `lace-agent
//! policy` prints it.
//!
//! - A pod selected by a policy with `Ingress` (`Egress`) isolation is isolated in that
//!   direction and accepts only what some such policy selecting it allows (the union).
//! - Only pods of the policy's namespace are selected; host-network pods never are (their
//!   addresses are the node's), nor are they ever peers.
//! - A peer's `namespaceSelector` matches Namespaces by label (the state holds every
//!   Namespace with its `kubernetes.io/metadata.name` label); without one, the peer is in the
//!   policy's own namespace.
//! - A named port means the port of that name and protocol on the destination pod; a pod
//!   without one is not reached through it.

mod explain;

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

pub use explain::explain_pod;

use crate::state::{
    ClusterState, NetworkPolicy, ObjectKey, Pod, PolicyPeer, PolicyPort, PolicyRule, PortRef,
};

/// The direction a rule or an isolation applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    /// Both, in a fixed order.
    pub const BOTH: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    /// Whether `policy` isolates its pods in this direction.
    pub fn isolates(self, policy: &NetworkPolicy) -> bool {
        match self {
            Direction::Ingress => policy.ingress_isolation,
            Direction::Egress => policy.egress_isolation,
        }
    }

    /// The rules of `policy` in this direction; none unless it isolates in it (upstream
    /// ignores the rules of a direction missing from `policyTypes`).
    pub fn rules(self, policy: &NetworkPolicy) -> &[PolicyRule] {
        match self {
            _ if !self.isolates(policy) => &[],
            Direction::Ingress => &policy.ingress,
            Direction::Egress => &policy.egress,
        }
    }

    /// `spec.ingress` / `spec.egress`.
    pub fn field(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// Whether a pod can be selected by a policy or be a peer at all: it has addresses, and they
/// are its own (not the node's).
pub fn policy_pod(pod: &Pod) -> bool {
    !pod.host_network && !pod.ips.is_empty()
}

/// Whether policy `key` selects pod `pod_key`.
pub fn selects(key: &ObjectKey, policy: &NetworkPolicy, pod_key: &ObjectKey, pod: &Pod) -> bool {
    policy_pod(pod)
        && pod_key.namespace == key.namespace
        && policy.pod_selector.matches(&pod.labels)
}

/// The pods policy `key` selects.
pub fn selected_pods<'a>(
    state: &'a ClusterState,
    key: &'a ObjectKey,
    policy: &'a NetworkPolicy,
) -> impl Iterator<Item = (&'a ObjectKey, &'a Pod)> + 'a {
    state
        .pods
        .iter()
        .filter(move |(k, p)| selects(key, policy, k, p))
}

/// The pods a `Pods` peer of a policy in namespace `namespace` matches (none for an
/// `IpBlock` peer).
pub fn peer_pods<'a>(
    state: &'a ClusterState,
    namespace: &'a str,
    peer: &'a PolicyPeer,
) -> impl Iterator<Item = (&'a ObjectKey, &'a Pod)> + 'a {
    let selectors = match peer {
        PolicyPeer::Pods {
            namespace_selector,
            pod_selector,
        } => Some((namespace_selector.as_ref(), pod_selector.as_ref())),
        PolicyPeer::IpBlock { .. } => None,
    };
    state.pods.iter().filter(move |(k, p)| {
        let Some((ns_sel, pod_sel)) = selectors else {
            return false;
        };
        let in_namespace = match ns_sel {
            None => k.namespace == namespace,
            Some(sel) => state
                .namespaces
                .get(&k.namespace)
                .is_some_and(|ns| sel.matches(&ns.labels)),
        };
        policy_pod(p) && in_namespace && pod_sel.is_none_or(|s| s.matches(&p.labels))
    })
}

/// The prefixes of an ipBlock: `cidr` without its `except` prefixes, as the fewest CIDRs
/// (each except carved out by splitting the prefixes around it in halves).
pub fn ip_block_prefixes(cidr: IpNet, except: &[IpNet]) -> Vec<IpNet> {
    let mut out = vec![cidr];
    for x in except {
        out = out
            .into_iter()
            .flat_map(|p| carve(p, *x))
            .collect::<Vec<_>>();
    }
    out.sort();
    out
}

/// `p` without `x`: `p` itself when they are disjoint, nothing when `x` covers it, else the
/// halves of `p` each carved again.
fn carve(p: IpNet, x: IpNet) -> Vec<IpNet> {
    if x.contains(&p) {
        Vec::new()
    } else if !p.contains(&x) {
        vec![p]
    } else {
        // x is strictly inside p, so p is not a host prefix and has two halves.
        p.subnets(p.prefix_len() + 1)
            .into_iter()
            .flatten()
            .flat_map(|half| carve(half, x))
            .collect()
    }
}

/// `prefixes` without those inside another one: what an nftables interval set holds (it
/// refuses overlapping elements). Two prefixes either nest or are disjoint, so this leaves
/// them disjoint. Each survivor keeps the reasons of those it swallowed.
pub fn disjoint<R: Ord + Clone>(prefixes: BTreeMap<IpNet, R>) -> BTreeMap<IpNet, R> {
    let all: Vec<IpNet> = prefixes.keys().copied().collect();
    prefixes
        .into_iter()
        .filter(|(p, _)| !all.iter().any(|o| o != p && o.contains(p)))
        .collect()
}

/// A port range of one protocol: `lo..=hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortRange<'a> {
    pub protocol: &'a str,
    pub lo: u16,
    pub hi: u16,
}

/// The numeric ports of a rule (a port without `port` is every port of its protocol), with
/// overlapping ranges of a protocol merged: nftables' concatenated interval sets may refuse
/// overlapping elements.
pub fn numeric_ports(ports: &[PolicyPort]) -> Vec<PortRange<'_>> {
    let mut ranges: Vec<PortRange<'_>> = ports
        .iter()
        .filter_map(|p| {
            let (lo, hi) = match &p.port {
                None => (0, u16::MAX),
                Some(PortRef::Number(n)) => (*n, p.end_port.unwrap_or(*n).max(*n)),
                Some(PortRef::Name(_)) => return None,
            };
            Some(PortRange {
                protocol: &p.protocol,
                lo,
                hi,
            })
        })
        .collect();
    ranges.sort();
    let mut merged: Vec<PortRange<'_>> = Vec::new();
    for r in ranges {
        match merged.last_mut() {
            Some(m) if m.protocol == r.protocol && r.lo <= m.hi => m.hi = m.hi.max(r.hi),
            _ => merged.push(r),
        }
    }
    merged
}

/// The named ports of a rule: (protocol, name).
pub fn named_ports(ports: &[PolicyPort]) -> Vec<(&str, &str)> {
    let mut named: Vec<(&str, &str)> = ports
        .iter()
        .filter_map(|p| match &p.port {
            Some(PortRef::Name(n)) => Some((p.protocol.as_str(), n.as_str())),
            _ => None,
        })
        .collect();
    named.sort();
    named.dedup();
    named
}

/// What named port `name` of `protocol` is on `pod`, if it has one.
pub fn resolve_named(pod: &Pod, protocol: &str, name: &str) -> Option<u16> {
    pod.ports
        .iter()
        .find(|p| p.name == name && p.protocol == protocol)
        .map(|p| p.port)
}

/// An address as a host prefix.
pub fn host_prefix(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn ip_blocks_carve_their_excepts_out() {
        assert_eq!(
            ip_block_prefixes("10.0.0.0/8".parse().unwrap(), &nets(&["10.0.0.0/9"])),
            nets(&["10.128.0.0/9"])
        );
        assert_eq!(
            ip_block_prefixes(
                "10.0.0.0/22".parse().unwrap(),
                &nets(&["10.0.1.0/24", "10.0.3.128/25"])
            ),
            nets(&["10.0.0.0/24", "10.0.2.0/24", "10.0.3.0/25"])
        );
        assert_eq!(
            ip_block_prefixes("fd00::/64".parse().unwrap(), &nets(&["fd00::/66"])),
            nets(&["fd00::4000:0:0:0/66", "fd00::8000:0:0:0/65"])
        );
    }

    #[test]
    fn nested_prefixes_collapse_into_the_outer_one() {
        let m: BTreeMap<IpNet, &str> = [
            ("10.0.0.0/8".parse().unwrap(), "a"),
            ("10.1.2.3/32".parse().unwrap(), "b"),
            ("11.0.0.1/32".parse().unwrap(), "c"),
        ]
        .into();
        assert_eq!(
            disjoint(m)
                .keys()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["10.0.0.0/8", "11.0.0.1/32"]
        );
    }

    #[test]
    fn numeric_ports_merge_overlaps_per_protocol() {
        let p = |proto: &str, port: Option<u16>, end: Option<u16>| PolicyPort {
            protocol: proto.into(),
            port: port.map(PortRef::Number),
            end_port: end,
        };
        let ports = [
            p("TCP", Some(80), None),
            p("TCP", Some(79), Some(81)),
            p("TCP", Some(82), None),
            p("UDP", None, None),
            p("SCTP", Some(9000), Some(9100)),
        ];
        let got: Vec<(&str, u16, u16)> = numeric_ports(&ports)
            .into_iter()
            .map(|r| (r.protocol, r.lo, r.hi))
            .collect();
        assert_eq!(
            got,
            [
                ("SCTP", 9000, 9100),
                ("TCP", 79, 81),
                ("TCP", 82, 82),
                ("UDP", 0, 65535)
            ]
        );
    }
}
