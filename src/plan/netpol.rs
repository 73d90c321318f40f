//! Kubernetes NetworkPolicy in table `inet lace`, inside what Lace's routing policies allow.
//!
//! Enforced where the pod lives: ingress on the node of the destination pod (in `to_pods`,
//! which `forward` runs for everything delivered to a local pod), egress on the node of the
//! source pod (in `from_pods`, which `prerouting` runs for everything local pods send, after
//! kube-proxy's DNAT, so a Service connection is judged by the backend it goes to). Both
//! chains accept replies of allowed connections first (`ct state established,related`). The
//! kubelet's probes come from the host (`output`, `from_host`) and never reach these chains.
//!
//! A new connection of a pod isolated in a direction (sets `np_isolated_{ingress,egress}_v4/6`)
//! jumps to `np_ingress` / `np_egress`: one rule per (policy rule, family, port kind); the
//! first that matches *returns* it to Lace's own rules (pairs, Service grants), which still
//! have to accept it; nothing matching drops it. So a connection passes only when both a
//! NetworkPolicy and a Lace routing policy allow it. Before them, a pod's connection to
//! itself (through a Service) returns too (`np_self_v4/6`): a pod cannot block access to
//! itself.
//!
//! The rules depend only on the policies' specs; everything that follows pods lives in sets,
//! so a pod that starts, stops or changes labels changes elements only:
//! - `np_<id>_pods_v4/6`: the local pods a policy selects;
//! - `np_<id>_<in|out><j>_peers_v4/6`: rule `j`'s peers, pod addresses and ipBlock prefixes
//!   (without the `except` ones), nested prefixes folded into the outer one;
//! - `np_<id>_<in|out><j>_ports`: its numeric ports, `protocol . port-range`;
//! - `np_<id>_<in|out><j>_named_v4/6`: its named ports resolved on each destination pod,
//!   `address . protocol . port` (ingress: the local selected pods; egress: the peer pods).
//!
//! `<id>` is 12 hex digits of the FNV-1a hash of `namespace/name`, so a policy keeps its set
//! names whatever other policies come and go; every set, element and rule names its policy
//! in its comment. Without any NetworkPolicy in the cluster the table has none of this.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::nft::{Chain, Set};
use crate::hash::fnv1a64;
use crate::netpol::{
    disjoint, host_prefix, ip_block_prefixes, named_ports, numeric_ports, peer_pods, policy_pod,
    resolve_named, selected_pods, Direction,
};
use crate::state::{ClusterState, ObjectKey, Pod, PolicyPeer, PolicyRule};

/// The address families, as set-name suffixes and nft payload prefixes.
const FAMILIES: [(&str, &str, &str); 2] = [("v4", "ip", "ipv4_addr"), ("v6", "ip6", "ipv6_addr")];

fn family(ip: &IpAddr) -> usize {
    usize::from(ip.is_ipv6())
}

fn net_family(net: &IpNet) -> usize {
    usize::from(matches!(net, IpNet::V6(_)))
}

/// The set of pods isolated in direction `d`, per family.
fn isolated_set(d: Direction, fam: usize) -> String {
    format!("np_isolated_{}_{}", d.field(), FAMILIES[fam].0)
}

/// The chain of direction `d`.
fn chain_name(d: Direction) -> String {
    format!("np_{}", d.field())
}

/// What NetworkPolicy adds to the ruleset: sets (declaration order) and its two chains.
pub(super) struct NetworkPolicies {
    pub sets: Vec<Set>,
    /// `np_ingress`, `np_egress`.
    pub chains: Vec<Chain>,
}

/// The set-name stem of each policy: `np_` and 12 hex digits of the hash of its key; a
/// (astronomically unlikely) collision takes the next free value, in key order.
fn policy_ids<'a>(
    keys: impl Iterator<Item = &'a ObjectKey>,
    hash: impl Fn(&ObjectKey) -> u64,
) -> BTreeMap<&'a ObjectKey, String> {
    let mut used = BTreeSet::new();
    keys.map(|k| {
        let mut h = hash(k) & 0xffff_ffff_ffff;
        while !used.insert(h) {
            h = (h + 1) & 0xffff_ffff_ffff;
        }
        (k, format!("np_{h:012x}"))
    })
    .collect()
}

/// The NetworkPolicy sets and chains of node `node`; `None` when the cluster has no
/// NetworkPolicy (the table then stays as it was before Lace knew of them).
pub(super) fn build(node: &str, state: &ClusterState) -> Option<NetworkPolicies> {
    if state.network_policies.is_empty() {
        return None;
    }
    let ids = policy_ids(state.network_policies.keys(), |k| {
        fnv1a64(k.to_string().into_bytes())
    });
    let mut isolated: BTreeMap<(Direction, usize), Set> = BTreeMap::new();
    for d in Direction::BOTH {
        for (fam, (_, _, ty)) in FAMILIES.into_iter().enumerate() {
            isolated.insert(
                (d, fam),
                Set::new(
                    &isolated_set(d, fam),
                    ty,
                    false,
                    &format!(
                        "NetworkPolicy: local pods isolated for {}, by the policies selecting them",
                        d.field()
                    ),
                ),
            );
        }
    }
    // Upstream: a pod cannot block access to itself. Its connections to itself leave it only
    // through a Service (DNAT back to its own address), and then meet both chains.
    let mut itself = FAMILIES.map(|(sfx, _, ty)| {
        Set::new(
            &format!("np_self_{sfx}"),
            &format!("{ty} . {ty}"),
            false,
            "NetworkPolicy: isolated local pods, each to itself (a pod cannot block access to itself)",
        )
    });
    let mut chains: BTreeMap<Direction, Chain> = Direction::BOTH
        .into_iter()
        .map(|d| {
            let mut chain = Chain {
                name: chain_name(d),
                hook: None,
                comment: format!(
                    "NetworkPolicy: new connections of local pods isolated for {}; an allowing rule returns to Lace's routing policies",
                    d.field()
                ),
                rules: Vec::new(),
            };
            for (sfx, ip, _) in FAMILIES {
                chain.rule(
                    format!("{ip} saddr . {ip} daddr @np_self_{sfx} return"),
                    "NetworkPolicy: a pod reaches itself (through a Service) whatever its policies",
                );
            }
            (d, chain)
        })
        .collect();
    let mut sets = Vec::new();
    for (key, policy) in &state.network_policies {
        let p = Policy {
            state,
            key,
            id: &ids[key],
            who: format!("NetworkPolicy {key}"),
        };
        let local: Vec<(&ObjectKey, &Pod)> = selected_pods(state, key, policy)
            .filter(|(_, pod)| pod.node == node)
            .collect();
        sets.extend(p.pods_sets(&local));
        for (_, pod) in &local {
            for ip in &pod.ips {
                for d in Direction::BOTH.into_iter().filter(|d| d.isolates(policy)) {
                    if let Some(s) = isolated.get_mut(&(d, family(ip))) {
                        s.add(ip.to_string(), None, &p.who);
                    }
                    itself[family(ip)].add(format!("{ip} . {ip}"), None, &p.who);
                }
            }
        }
        for d in Direction::BOTH {
            for (j, rule) in d.rules(policy).iter().enumerate() {
                if let Some(chain) = chains.get_mut(&d) {
                    sets.extend(p.rule(d, j, rule, &local, chain));
                }
            }
        }
    }
    let mut all: Vec<Set> = isolated.into_values().collect();
    all.extend(itself);
    all.extend(sets);
    let chains = chains
        .into_values()
        .map(|mut c| {
            c.rule(
                "counter drop",
                "NetworkPolicy: no policy selecting this pod allows the connection",
            );
            c
        })
        .collect();
    Some(NetworkPolicies { sets: all, chains })
}

/// One policy being planned.
struct Policy<'a> {
    state: &'a ClusterState,
    key: &'a ObjectKey,
    id: &'a str,
    /// `NetworkPolicy namespace/name`: the start of every comment.
    who: String,
}

impl Policy<'_> {
    /// `<id>_pods_v4/6`: the local pods it selects.
    fn pods_sets(&self, local: &[(&ObjectKey, &Pod)]) -> [Set; 2] {
        let mut sets = FAMILIES.map(|(sfx, _, ty)| {
            Set::new(
                &format!("{}_pods_{sfx}", self.id),
                ty,
                false,
                &format!("{}: the local pods it selects", self.who),
            )
        });
        for (k, pod) in local {
            for ip in &pod.ips {
                sets[family(ip)].add(ip.to_string(), None, &format!("{}: pod {k}", self.who));
            }
        }
        sets
    }

    /// The sets of rule `j` of direction `d`, and its rules appended to `chain`.
    fn rule(
        &self,
        d: Direction,
        j: usize,
        rule: &PolicyRule,
        local: &[(&ObjectKey, &Pod)],
        chain: &mut Chain,
    ) -> Vec<Set> {
        let tag = format!(
            "{}_{}{j}",
            self.id,
            match d {
                Direction::Ingress => "in",
                Direction::Egress => "out",
            }
        );
        let what = format!("{} {}[{j}]", self.who, d.field());
        let mut sets = Vec::new();
        let has_peers = !rule.peers.is_empty();
        if has_peers {
            sets.extend(self.peer_sets(&tag, rule));
        }
        let numeric = numeric_ports(&rule.ports);
        if !numeric.is_empty() {
            let mut ports = Set::new(
                &format!("{tag}_ports"),
                "inet_proto . inet_service",
                true,
                &format!("{what}: protocol . ports"),
            );
            for r in &numeric {
                let range = if r.lo == r.hi {
                    r.lo.to_string()
                } else {
                    format!("{}-{}", r.lo, r.hi)
                };
                ports.add(
                    format!("{} . {range}", r.protocol.to_ascii_lowercase()),
                    None,
                    &self.who,
                );
            }
            sets.push(ports);
        }
        let named = named_ports(&rule.ports);
        if !named.is_empty() {
            // Named ports resolve on the destination pod: the selected local pods for ingress,
            // the peer pods for egress (ipBlock peers have no port names).
            let targets: Vec<(&ObjectKey, &Pod)> = match d {
                Direction::Ingress => local.to_vec(),
                Direction::Egress if !has_peers => self
                    .state
                    .pods
                    .iter()
                    .filter(|(_, p)| policy_pod(p))
                    .collect(),
                Direction::Egress => {
                    let pods: BTreeMap<&ObjectKey, &Pod> = rule
                        .peers
                        .iter()
                        .flat_map(|peer| peer_pods(self.state, &self.key.namespace, peer))
                        .collect();
                    pods.into_iter().collect()
                }
            };
            sets.extend(self.named_sets(&tag, &what, &named, &targets));
        }
        for (sfx, ip, _) in FAMILIES {
            let (own, other) = match d {
                Direction::Ingress => ("daddr", "saddr"),
                Direction::Egress => ("saddr", "daddr"),
            };
            let own_match = format!("{ip} {own} @{}_pods_{sfx} ", self.id);
            let peer_match = if has_peers {
                format!("{ip} {other} @{tag}_peers_{sfx} ")
            } else {
                String::new()
            };
            if rule.ports.is_empty() {
                chain.rule(
                    format!("{own_match}{peer_match}return"),
                    format!("{what}: every port"),
                );
            }
            if !numeric.is_empty() {
                chain.rule(
                    format!("{own_match}{peer_match}ct protocol . th dport @{tag}_ports return"),
                    format!("{what}: numeric ports"),
                );
            }
            if !named.is_empty() {
                // The named set holds the destination pods already; for ingress they are
                // this policy's own pods, so only the peers remain to match.
                let lead = match d {
                    Direction::Ingress => peer_match.clone(),
                    Direction::Egress => own_match.clone(),
                };
                chain.rule(
                    format!("{lead}{ip} daddr . ct protocol . th dport @{tag}_named_{sfx} return"),
                    format!("{what}: named ports"),
                );
            }
        }
        sets
    }

    /// `<tag>_peers_v4/6`: the rule's peer pods and ipBlock prefixes.
    fn peer_sets(&self, tag: &str, rule: &PolicyRule) -> [Set; 2] {
        let mut prefixes: [BTreeMap<IpNet, String>; 2] = Default::default();
        for peer in &rule.peers {
            match peer {
                PolicyPeer::Pods { .. } => {
                    for (k, pod) in peer_pods(self.state, &self.key.namespace, peer) {
                        for ip in &pod.ips {
                            prefixes[family(ip)]
                                .entry(host_prefix(*ip))
                                .or_insert_with(|| format!("{}: pod {k}", self.who));
                        }
                    }
                }
                PolicyPeer::IpBlock { cidr, except } => {
                    for p in ip_block_prefixes(*cidr, except) {
                        prefixes[net_family(&p)]
                            .entry(p)
                            .or_insert_with(|| format!("{}: ipBlock {cidr}", self.who));
                    }
                }
            }
        }
        let [v4, v6] = prefixes;
        [(v4, FAMILIES[0]), (v6, FAMILIES[1])].map(|(m, (sfx, _, ty))| {
            let mut set = Set::new(
                &format!("{tag}_peers_{sfx}"),
                ty,
                true,
                &format!("{}: peers of one rule", self.who),
            );
            for (p, why) in disjoint(m) {
                let key = if p.prefix_len() == p.max_prefix_len() {
                    p.addr().to_string()
                } else {
                    p.to_string()
                };
                set.add(key, None, &why);
            }
            set
        })
    }

    /// `<tag>_named_v4/6`: destination address . protocol . port of each named port.
    fn named_sets(
        &self,
        tag: &str,
        what: &str,
        named: &[(&str, &str)],
        targets: &[(&ObjectKey, &Pod)],
    ) -> [Set; 2] {
        let mut sets = FAMILIES.map(|(sfx, _, ty)| {
            Set::new(
                &format!("{tag}_named_{sfx}"),
                &format!("{ty} . inet_proto . inet_service"),
                false,
                &format!("{what}: named ports on each destination pod"),
            )
        });
        for (k, pod) in targets {
            for (protocol, name) in named {
                let Some(port) = resolve_named(pod, protocol, name) else {
                    continue;
                };
                for ip in &pod.ips {
                    sets[family(ip)].add(
                        format!("{ip} . {} . {port}", protocol.to_ascii_lowercase()),
                        None,
                        &format!("{}: port {name} of pod {k}", self.who),
                    );
                }
            }
        }
        sets
    }
}

/// The rules sending new connections of isolated pods to the NetworkPolicy chain of `d`
/// (`from_pods`: egress, `to_pods`: ingress), for right after the rule accepting replies.
pub(super) fn isolation_jumps(d: Direction, chain: &mut Chain) {
    let (field, addr) = match d {
        Direction::Ingress => ("destination", "daddr"),
        Direction::Egress => ("source", "saddr"),
    };
    for (fam, (_, ip, _)) in FAMILIES.into_iter().enumerate() {
        chain.rule(
            format!(
                "{ip} {addr} @{} jump {}",
                isolated_set(d, fam),
                chain_name(d)
            ),
            format!(
                "NetworkPolicy: the {field} pod is isolated for {}",
                d.field()
            ),
        );
    }
}

#[cfg(test)]
mod tests;
