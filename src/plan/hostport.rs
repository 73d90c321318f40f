//! hostPorts (the runtime's `portMappings`): a local pod's port exposed on the node's
//! addresses, for clients outside the cluster, the node itself and, as their Networks allow,
//! pods.
//!
//! 1. **DNAT.** `hostports` (nat prerouting, before kube-proxy's DNAT) and `hostports_local`
//!    (nat output: connections the node opens) translate `<address>:<hostPort>` to
//!    `<pod>:<containerPort>` through maps: `hostports_any_v4`/`_v6` (protocol . port) for
//!    mappings on every address of the node (its InternalIPs, set `node_ips_v4`/`_v6`, and
//!    whatever else `fib daddr type local` finds), `hostports_v4`/`_v6`
//!    (address . protocol . port) for those with a `hostIP`.
//! 2. **Routing.** The main table routes each such pod's address into its Network's VRF
//!    (`dev lv-…`), as it routes the subnets of NodePort backends
//!    ([`super::ingress`]); replies to clients outside the cluster come back through the main
//!    table ([`super::ingress::mark_replies`]).
//! 3. **Policy.** A translated connection from a source that is no pod, to a mapped pod and
//!    container port, is accepted in `to_pods` (forwarded into the VRF) and `from_host` (the
//!    node's own, and the VRF's transmit path) by set `hostport_pods_v4`/`_v6` (protocol . host
//!    port . pod): the pod asked to be exposed on its node, whatever its Network. A pod's
//!    connection to a hostPort is translated too, and then meets the routing policies as a
//!    connection to the pod's address does: a hostPort opens no way between Networks.
//!
//! The elements come from the local attachments (the agent's records), so they are planned by
//! [`super::Planner::plan`], not with the pod-independent base; the base declares the sets and
//! maps empty and holds the rules.

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::nft::{Chain, Hook, Ruleset, Set};
use super::{host_net, Nexthop, RouteKey, MAIN_TABLE};
use crate::state::{ClusterState, PodAttachment};

const FAMILIES: [(&str, &str, &str); 2] = [("ip", "v4", "ipv4_addr"), ("ip6", "v6", "ipv6_addr")];

/// The sets and maps: per family the maps by hostIP and on every address and the mapped
/// pods, declared empty, and node `node`'s InternalIPs.
pub(super) fn sets(node: &str, state: &ClusterState) -> Vec<Set> {
    let mut out = Vec::new();
    for (_, v, addr) in FAMILIES {
        let mut internal = Set::new(
            &format!("node_ips_{v}"),
            addr,
            false,
            "this node's InternalIPs: hostPorts on every address, for pods",
        );
        for ip in state
            .nodes
            .get(node)
            .into_iter()
            .flat_map(|n| &n.internal_ips)
            .filter(|ip| ip.is_ipv6() == (v == "v6"))
        {
            internal.add(ip.to_string(), None, &format!("node {node}"));
        }
        out.push(internal);
        out.push(Set::new_map(
            &format!("hostports_{v}"),
            &format!("{addr} . inet_proto . inet_service"),
            &format!("{addr} . inet_service"),
            false,
            "hostPorts on one address of the node (hostIP): address . protocol . port : pod . container port",
        ));
        out.push(Set::new_map(
            &format!("hostports_any_{v}"),
            "inet_proto . inet_service",
            &format!("{addr} . inet_service"),
            false,
            "hostPorts on every address of the node: protocol . port : pod . container port",
        ));
        out.push(Set::new(
            &format!("hostport_pods_{v}"),
            &format!("inet_proto . inet_service . {addr}"),
            false,
            "hostPorts: protocol . host port . pod (connections from outside the cluster accepted)",
        ));
    }
    out
}

/// `hostports` (prerouting) and `hostports_local` (output): the DNAT. Before kube-proxy's
/// (`dstnat`, -100), so a hostPort in the NodePort range is the pod's. nft knows the name
/// `dstnat` in prerouting only: output's priority is the number.
pub(super) fn chains() -> [Chain; 2] {
    let chain = |name: &str, hook: &'static str, priority: &'static str, comment: &str| {
        let mut c = Chain {
            name: name.into(),
            hook: Some(Hook {
                kind: "nat",
                hook,
                priority,
            }),
            comment: comment.into(),
            rules: Vec::new(),
        };
        for (ip, v, _) in FAMILIES {
            c.rule(
                format!("dnat {ip} addr . port to {ip} daddr . meta l4proto . th dport map @hostports_{v}"),
                "hostPorts on one address of the node (hostIP)",
            );
        }
        // A pod's packet comes from a VRF slave, and newer kernels (Debian's 6.12) look its
        // `fib daddr type` up in the VRF, where no address of the node is local: the node's
        // InternalIPs, the addresses pods know the node by (`status.hostIP`), are matched by
        // set.
        for (ip, v, _) in FAMILIES {
            c.rule(
                format!("{ip} daddr @node_ips_{v} dnat {ip} addr . port to meta l4proto . th dport map @hostports_any_{v}"),
                "hostPorts on every address of the node: its InternalIPs",
            );
        }
        for (ip, v, _) in FAMILIES {
            let nfproto = if v == "v4" { "ipv4" } else { "ipv6" };
            c.rule(
                format!("fib daddr type local meta nfproto {nfproto} dnat {ip} addr . port to meta l4proto . th dport map @hostports_any_{v}"),
                "hostPorts on every address of the node",
            );
        }
        c
    };
    [
        chain(
            "hostports",
            "prerouting",
            "dstnat - 10",
            "hostPorts: connections to the node's addresses from outside and from pods",
        ),
        chain(
            "hostports_local",
            "output",
            "-110",
            "hostPorts: connections the node opens to its own addresses",
        ),
    ]
}

/// The accept rule of translated connections to hostPorts from sources that are no pods, for
/// `to_pods` and `from_host` (see the module docs). `meta l4proto` gives nft the protocol
/// context `ct original proto-dst` needs in a concatenation, as in
/// [`super::ingress::accept_nodeports`].
pub(super) fn accept(chain: &mut Chain) {
    for (ip, v, _) in FAMILIES {
        chain.rule(
            format!("ct status dnat meta l4proto {{ tcp, udp, sctp }} {ip} saddr != @cluster_{v} ct protocol . ct original proto-dst . {ip} daddr @hostport_pods_{v} accept"),
            "hostPorts: connections from outside the cluster and from the node",
        );
    }
}

/// What the local attachments' hostPorts add to the plan: the elements of the base's sets
/// and maps, and a main-table route into the VRF for each mapped pod address.
#[derive(Debug, Default)]
pub(super) struct Mapped {
    /// (set or map name, key, value) with the pod as reason.
    elements: Vec<(String, String, Option<String>, String)>,
    pub routes: BTreeMap<RouteKey, Nexthop>,
}

impl Mapped {
    /// Adds the hostPorts of `att`, whose Network's VRF is `vrf`. A key another attachment
    /// mapped first stays that one's (the agent refuses conflicting hostPorts at ADD).
    pub(super) fn add(&mut self, att: &PodAttachment, vrf: &str) {
        let reason = format!("pod {}/{}", att.pod.namespace, att.pod.name);
        for ip in att.ips.iter().map(IpNet::addr) {
            let mut mapped = false;
            for hp in att.host_ports.iter().filter(|hp| hp.applies_to(ip)) {
                let v = if ip.is_ipv6() { "v6" } else { "v4" };
                let (proto, port) = (hp.protocol.as_str(), hp.host_port);
                let (map, key) = match hp.host_ip {
                    Some(h) => (format!("hostports_{v}"), format!("{h} . {proto} . {port}")),
                    None => (format!("hostports_any_{v}"), format!("{proto} . {port}")),
                };
                if self
                    .elements
                    .iter()
                    .any(|(m, k, _, _)| *m == map && *k == key)
                {
                    continue;
                }
                let value = format!("{ip} . {}", hp.container_port);
                self.elements.push((map, key, Some(value), reason.clone()));
                self.elements.push((
                    format!("hostport_pods_{v}"),
                    format!("{proto} . {port} . {ip}"),
                    None,
                    reason.clone(),
                ));
                mapped = true;
            }
            if mapped {
                self.routes.insert(
                    RouteKey::new(MAIN_TABLE, host_net(ip)),
                    Nexthop::Dev(vrf.to_string()),
                );
            }
        }
    }

    /// `base` with the elements added, or `None` when there are none.
    pub(super) fn ruleset(&self, base: &Ruleset) -> Option<Ruleset> {
        if self.elements.is_empty() {
            return None;
        }
        let mut out = base.clone();
        for (name, key, value, reason) in &self.elements {
            if let Some(set) = out.sets.iter_mut().find(|s| s.name == *name) {
                set.add(key.clone(), value.as_deref(), reason);
            }
        }
        Some(out)
    }
}
