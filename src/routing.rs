//! Routing resolution: which Network may open connections to which, and which Services
//! (with their backends) each Network was granted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::alloc;
use crate::api::ServiceRoutingPolicySpec;
use crate::binding::{selects_service, service_network};
use crate::state::{ClusterState, Endpoints, ObjectKey, Service, ServicePort};

/// An ordered (source Network, destination Network) pair.
pub type NetworkPair<'a> = (&'a str, &'a str);

/// Every allowed (from → to) pair with the NetworkRoutingPolicies that allow it (sorted).
/// Policies naming a Network that does not exist are skipped (validation reports them).
pub fn allowed_pairs(state: &ClusterState) -> BTreeMap<NetworkPair<'_>, Vec<&str>> {
    let mut pairs: BTreeMap<NetworkPair<'_>, Vec<&str>> = BTreeMap::new();
    for (name, policy) in &state.network_routes {
        if state.networks.contains_key(&policy.from) && state.networks.contains_key(&policy.to) {
            pairs
                .entry((policy.from.as_str(), policy.to.as_str()))
                .or_default()
                .push(name.as_str());
        }
    }
    pairs
}

/// Where a backend address lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BackendLocation<'a> {
    /// In `node`'s block `block` of Network `network`.
    Pod {
        network: &'a str,
        node: &'a str,
        block: IpNet,
    },
    /// Inside a Network's subnet but in no allocated block (stale endpoint): not routable.
    Unallocated { network: &'a str },
    /// Outside every cluster Network (e.g. the API server's host address): host routing.
    Outside,
}

/// One backend of a granted Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Backend<'a> {
    pub address: IpAddr,
    pub location: BackendLocation<'a>,
}

/// Pods of Network `from` may reach `service` (bound to Network `to`) because of `policy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceGrant<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub policy: &'a str,
    pub service: &'a ObjectKey,
    pub spec: &'a Service,
    /// Target ports of the backends (from the EndpointSlices).
    pub target_ports: &'a [ServicePort],
    /// Sorted by address.
    pub backends: Vec<Backend<'a>>,
}

fn policy_selects(
    state: &ClusterState,
    policy: &ServiceRoutingPolicySpec,
    key: &ObjectKey,
    svc: &Service,
) -> bool {
    selects_service(
        state,
        &policy.services,
        &policy.namespace_selector,
        &policy.service_selector,
        key,
        svc,
    )
}

/// All (source Network → Service) grants, sorted by (from, service, policy). A grant needs the
/// Service to be bound (by a ServiceBindingPolicy) to the policy's `to` Network and selected by
/// the policy's names or selectors; backends come from `state.endpoints` and are located in
/// the per-node blocks of `state.node_allocations`.
pub fn service_grants(state: &ClusterState) -> Vec<ServiceGrant<'_>> {
    if state.service_routes.is_empty() {
        return Vec::new();
    }
    let bound: Vec<(&ObjectKey, &Service, &str)> = state
        .services
        .iter()
        .filter_map(|(k, s)| service_network(state, k, s).map(|b| (k, s, b.network)))
        .collect();
    let mut grants = Vec::new();
    let mut addresses = BTreeSet::new();
    for (pname, policy) in &state.service_routes {
        if !state.networks.contains_key(&policy.from) {
            continue;
        }
        for &(key, svc, net) in &bound {
            if net != policy.to || !policy_selects(state, policy, key, svc) {
                continue;
            }
            let eps: Option<&Endpoints> = state.endpoints.get(key);
            if let Some(eps) = eps {
                addresses.extend(eps.addresses.iter().copied());
            }
            grants.push(ServiceGrant {
                from: &policy.from,
                to: &policy.to,
                policy: pname,
                service: key,
                spec: svc,
                target_ports: eps.map(|e| e.ports.as_slice()).unwrap_or_default(),
                backends: eps
                    .map(|e| {
                        e.addresses
                            .iter()
                            .map(|a| Backend {
                                address: *a,
                                location: BackendLocation::Outside,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
    }
    let located = locate(state, &addresses);
    for g in &mut grants {
        for b in &mut g.backends {
            if let Some(loc) = located.get(&b.address) {
                b.location = *loc;
            }
        }
        g.backends.sort();
        g.backends.dedup();
    }
    grants.sort_by(|a, b| (a.from, a.service, a.policy).cmp(&(b.from, b.service, b.policy)));
    grants
}

/// Locates addresses in the Networks' per-node blocks (derived from the node indices, see
/// [`crate::alloc::node_blocks`]). The index → node map is built only when there is something
/// to locate: this runs on every plan of clusters with 5,000 nodes.
pub fn locate<'a>(
    state: &'a ClusterState,
    addresses: &BTreeSet<IpAddr>,
) -> BTreeMap<IpAddr, BackendLocation<'a>> {
    let mut out = BTreeMap::new();
    let mut by_index: Option<HashMap<u32, &'a str>> = None;
    for &addr in addresses {
        let hit = state
            .networks
            .iter()
            .filter(|(_, n)| !n.external)
            .find_map(|(name, n)| {
                n.subnets
                    .iter()
                    .find(|s| s.cidr.contains(&addr))
                    .map(|s| (name.as_str(), n, s))
            });
        let Some((network, spec, subnet)) = hit else {
            out.insert(addr, BackendLocation::Outside);
            continue;
        };
        let by_index = by_index.get_or_insert_with(|| {
            state
                .node_allocations
                .iter()
                .map(|(node, a)| (a.index, node.as_str()))
                .collect()
        });
        let located = alloc::block_owner(subnet, addr).and_then(|index| {
            let node = by_index.get(&index)?;
            // The node holds a block only if every subnet of the Network has one for it.
            let blocks = alloc::node_blocks(index, &spec.subnets);
            let block = blocks.into_iter().find(|b| b.contains(&addr))?;
            Some(BackendLocation::Pod {
                network,
                node,
                block,
            })
        });
        out.insert(
            addr,
            located.unwrap_or(BackendLocation::Unallocated { network }),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        LabelSelector, NetworkRoutingPolicySpec, NetworkSpec, NodeAllocationSpec,
        ServiceBindingPolicySpec, ServiceRef, Subnet,
    };

    fn net(cidr: &str, block: u8) -> NetworkSpec {
        NetworkSpec {
            subnets: vec![Subnet {
                cidr: cidr.parse().unwrap(),
                block_prefix: block,
            }],
            external: false,
            host_access: false,
        }
    }

    fn state() -> ClusterState {
        let mut s = ClusterState::default();
        s.networks.insert("a".into(), net("10.1.0.0/16", 24));
        s.networks.insert("b".into(), net("10.2.0.0/16", 24));
        s.networks.insert(
            "internet".into(),
            NetworkSpec {
                external: true,
                host_access: false,
                ..Default::default()
            },
        );
        for (name, from, to) in [
            ("a-b", "a", "b"),
            ("a-b-again", "a", "b"),
            ("b-b", "b", "b"),
            ("dangling", "a", "zz"),
        ] {
            s.network_routes.insert(
                name.into(),
                NetworkRoutingPolicySpec {
                    from: from.into(),
                    to: to.into(),
                },
            );
        }
        s.node_allocations.insert(
            "n1".into(),
            NodeAllocationSpec {
                // Index 2: block 1 of every subnet, 10.2.1.0/24 of `b`.
                index: 2,
                locator: "2001:db8:100::2:0:0/96".parse().unwrap(),
                underlay: crate::api::Underlay {
                    ipv4: None,
                    ipv6: Some("2001:db8::1".parse().unwrap()),
                },
            },
        );
        let svc = |labels: &[(&str, &str)]| Service {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cluster_ips: vec!["10.96.0.10".parse().unwrap()],
            ports: vec![ServicePort {
                protocol: "UDP".into(),
                port: 53,
                node_port: None,
            }],
        };
        s.services
            .insert(ObjectKey::new("kube-system", "dns"), svc(&[("app", "dns")]));
        s.services.insert(
            ObjectKey::new("kube-system", "other"),
            svc(&[("app", "other")]),
        );
        s.services
            .insert(ObjectKey::new("default", "kubernetes"), svc(&[]));
        s.endpoints.insert(
            ObjectKey::new("kube-system", "dns"),
            Endpoints {
                addresses: vec![
                    "10.2.1.7".parse().unwrap(),
                    "10.2.9.9".parse().unwrap(),
                    "192.0.2.1".parse().unwrap(),
                ],
                ports: vec![ServicePort {
                    protocol: "UDP".into(),
                    port: 5353,
                    node_port: None,
                }],
            },
        );
        s.service_bindings.insert(
            "kube-system".into(),
            ServiceBindingPolicySpec {
                network: "b".into(),
                ..Default::default()
            },
        );
        s.service_bindings.insert(
            "kubernetes".into(),
            ServiceBindingPolicySpec {
                network: "internet".into(),
                priority: 10,
                services: vec![ServiceRef {
                    namespace: "default".into(),
                    name: "kubernetes".into(),
                }],
                ..Default::default()
            },
        );
        s
    }

    #[test]
    fn pairs_merge_policies_and_skip_dangling() {
        let s = state();
        let pairs = allowed_pairs(&s);
        let want: BTreeMap<NetworkPair, Vec<&str>> = [
            (("a", "b"), vec!["a-b", "a-b-again"]),
            (("b", "b"), vec!["b-b"]),
        ]
        .into();
        assert_eq!(pairs, want);
    }

    #[test]
    fn grants_select_bound_services_and_locate_backends() {
        let mut s = state();
        s.service_routes.insert(
            "a-dns".into(),
            ServiceRoutingPolicySpec {
                from: "a".into(),
                to: "b".into(),
                service_selector: LabelSelector {
                    match_labels: [("app".to_string(), "dns".to_string())].into(),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        // Bound to `internet`, not `b`: a policy towards `b` never grants it.
        s.service_routes.insert(
            "a-k8s-wrong-to".into(),
            ServiceRoutingPolicySpec {
                from: "a".into(),
                to: "b".into(),
                services: vec![ServiceRef {
                    namespace: "default".into(),
                    name: "kubernetes".into(),
                }],
                ..Default::default()
            },
        );
        let grants = service_grants(&s);
        assert_eq!(grants.len(), 1, "{grants:#?}");
        let g = &grants[0];
        assert_eq!(
            (g.from, g.to, g.policy, g.service.to_string().as_str()),
            ("a", "b", "a-dns", "kube-system/dns")
        );
        assert_eq!(
            g.backends
                .iter()
                .map(|b| (b.address.to_string(), b.location))
                .collect::<Vec<_>>(),
            vec![
                (
                    "10.2.1.7".to_string(),
                    BackendLocation::Pod {
                        network: "b",
                        node: "n1",
                        block: "10.2.1.0/24".parse().unwrap()
                    }
                ),
                (
                    "10.2.9.9".to_string(),
                    BackendLocation::Unallocated { network: "b" }
                ),
                ("192.0.2.1".to_string(), BackendLocation::Outside),
            ]
        );
        assert_eq!(
            g.target_ports,
            &[ServicePort {
                protocol: "UDP".into(),
                port: 5353,
                node_port: None,
            }]
        );
    }

    #[test]
    fn names_list_grants_external_service() {
        let mut s = state();
        s.service_routes.insert(
            "a-k8s".into(),
            ServiceRoutingPolicySpec {
                from: "a".into(),
                to: "internet".into(),
                services: vec![ServiceRef {
                    namespace: "default".into(),
                    name: "kubernetes".into(),
                }],
                ..Default::default()
            },
        );
        let grants = service_grants(&s);
        assert_eq!(
            grants
                .iter()
                .map(|g| g.service.to_string())
                .collect::<Vec<_>>(),
            vec!["default/kubernetes"]
        );
        assert!(grants[0].backends.is_empty());
    }
}
