//! [`ClusterIndex`]: the cluster state built incrementally from objects, one `apply` or
//! `delete` at a time. Both state sources feed one: the YAML directory (standalone mode, every
//! object once) and the Kubernetes watches (objects as they change, deletes, relists).
//!
//! The index holds exactly one [`ClusterState`], kept current by every call, so handing it to
//! the planner costs one clone and no rebuild. The only derived data are the Services'
//! endpoints, merged over their EndpointSlices: the index keeps each slice and re-merges only
//! the Service a changed slice belongs to.
//!
//! The result depends only on the set of objects last applied and not deleted, never on the
//! order they arrived in (a property test drives the watch side in every order against the
//! directory loader).

use std::collections::{BTreeMap, BTreeSet};

use crate::objects::{Kind, Object};
use crate::state::{ClusterConfig, ClusterState, Endpoints, ObjectKey};

/// The cluster state as a set of objects. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct ClusterIndex {
    state: ClusterState,
    /// Per Service, its EndpointSlices' endpoints by slice name.
    slices: BTreeMap<ObjectKey, BTreeMap<String, Endpoints>>,
    /// The Service each EndpointSlice belongs to (a delete names only the slice).
    slice_service: BTreeMap<ObjectKey, ObjectKey>,
}

/// Inserts or replaces `value` at `key`; whether anything changed.
fn put<K: Ord, V: PartialEq>(map: &mut BTreeMap<K, V>, key: K, value: V) -> bool {
    match map.get(&key) {
        Some(old) if *old == value => false,
        _ => {
            map.insert(key, value);
            true
        }
    }
}

impl ClusterIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The state as of the last call.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// The state, consuming the index.
    pub fn into_state(self) -> ClusterState {
        self.state
    }

    /// Adds `object` or replaces the object of the same kind and key. Returns whether the
    /// state changed (an unchanged re-delivery, as after a watch relist, changes nothing).
    pub fn apply(&mut self, object: Object) -> bool {
        let s = &mut self.state;
        match object {
            Object::Network(n, spec) => put(&mut s.networks, n, spec),
            Object::NetworkBindingPolicy(n, spec) => put(&mut s.network_bindings, n, spec),
            Object::ServiceBindingPolicy(n, spec) => put(&mut s.service_bindings, n, spec),
            Object::NetworkRoutingPolicy(n, spec) => put(&mut s.network_routes, n, spec),
            Object::ServiceRoutingPolicy(n, spec) => put(&mut s.service_routes, n, spec),
            Object::NetworkAllocation(n, spec) => put(&mut s.network_allocations, n, spec),
            Object::NodeAllocation(n, spec) => put(&mut s.node_allocations, n, spec),
            Object::Namespace(n, ns) => put(&mut s.namespaces, n, ns),
            Object::Node(n, node) => put(&mut s.nodes, n, node),
            Object::Pod(k, pod) => put(&mut s.pods, k, pod),
            Object::Service(k, svc) => put(&mut s.services, k, svc),
            Object::NetworkPolicy(k, np) => put(&mut s.network_policies, k, np),
            Object::EndpointSlice {
                slice,
                service,
                endpoints,
            } => {
                let mut changed = BTreeSet::new();
                if let Some(old) = self.slice_service.insert(slice.clone(), service.clone()) {
                    if old != service {
                        self.remove_slice(&old, &slice.name);
                        changed.insert(old);
                    }
                }
                let slices = self.slices.entry(service.clone()).or_default();
                if put(slices, slice.name, endpoints) {
                    changed.insert(service);
                }
                self.merge(changed)
            }
            Object::Config(config) => {
                let changed = s.config != config;
                s.config = config;
                changed
            }
        }
    }

    /// Removes the object of `kind` with `key` (cluster-scoped kinds: empty namespace).
    /// Returns whether the state changed (deleting what is not there changes nothing).
    pub fn delete(&mut self, kind: Kind, key: &ObjectKey) -> bool {
        let s = &mut self.state;
        let name = &key.name;
        match kind {
            Kind::Network => s.networks.remove(name).is_some(),
            Kind::NetworkBindingPolicy => s.network_bindings.remove(name).is_some(),
            Kind::ServiceBindingPolicy => s.service_bindings.remove(name).is_some(),
            Kind::NetworkRoutingPolicy => s.network_routes.remove(name).is_some(),
            Kind::ServiceRoutingPolicy => s.service_routes.remove(name).is_some(),
            Kind::NetworkAllocation => s.network_allocations.remove(name).is_some(),
            Kind::NodeAllocation => s.node_allocations.remove(name).is_some(),
            Kind::Namespace => s.namespaces.remove(name).is_some(),
            Kind::Node => s.nodes.remove(name).is_some(),
            Kind::Pod => s.pods.remove(key).is_some(),
            Kind::Service => s.services.remove(key).is_some(),
            Kind::NetworkPolicy => s.network_policies.remove(key).is_some(),
            Kind::EndpointSlice => match self.slice_service.remove(key) {
                Some(service) => {
                    self.remove_slice(&service, name);
                    self.merge([service].into())
                }
                None => false,
            },
            Kind::ConfigMap => {
                let changed = s.config != ClusterConfig::default();
                s.config = ClusterConfig::default();
                changed
            }
        }
    }

    /// The keys of every object of `kind` the index holds, sorted (a relist deletes the ones
    /// it did not see again).
    pub fn keys(&self, kind: Kind) -> Vec<ObjectKey> {
        fn names<V>(m: &BTreeMap<String, V>) -> Vec<ObjectKey> {
            m.keys().map(|n| ObjectKey::new("", n.clone())).collect()
        }
        let s = &self.state;
        match kind {
            Kind::Network => names(&s.networks),
            Kind::NetworkBindingPolicy => names(&s.network_bindings),
            Kind::ServiceBindingPolicy => names(&s.service_bindings),
            Kind::NetworkRoutingPolicy => names(&s.network_routes),
            Kind::ServiceRoutingPolicy => names(&s.service_routes),
            Kind::NetworkAllocation => names(&s.network_allocations),
            Kind::NodeAllocation => names(&s.node_allocations),
            Kind::Namespace => names(&s.namespaces),
            Kind::Node => names(&s.nodes),
            Kind::Pod => s.pods.keys().cloned().collect(),
            Kind::Service => s.services.keys().cloned().collect(),
            Kind::NetworkPolicy => s.network_policies.keys().cloned().collect(),
            Kind::EndpointSlice => self.slice_service.keys().cloned().collect(),
            Kind::ConfigMap => {
                if s.config == ClusterConfig::default() {
                    Vec::new()
                } else {
                    vec![Object::Config(s.config.clone()).key()]
                }
            }
        }
    }

    fn remove_slice(&mut self, service: &ObjectKey, slice: &str) {
        if let Some(slices) = self.slices.get_mut(service) {
            slices.remove(slice);
            if slices.is_empty() {
                self.slices.remove(service);
            }
        }
    }

    /// Re-merges the endpoints of `services` from their slices; whether any changed.
    fn merge(&mut self, services: BTreeSet<ObjectKey>) -> bool {
        let mut changed = false;
        for service in services {
            let merged = self.slices.get(&service).map(|slices| {
                let mut e = Endpoints::default();
                for s in slices.values() {
                    e.addresses.extend_from_slice(&s.addresses);
                    e.ports.extend_from_slice(&s.ports);
                }
                e.addresses.sort();
                e.addresses.dedup();
                e.ports.sort();
                e.ports.dedup();
                e
            });
            changed |= match merged {
                Some(e) => put(&mut self.state.endpoints, service, e),
                None => self.state.endpoints.remove(&service).is_some(),
            };
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ServicePort;

    fn slice(name: &str, service: &str, addrs: &[&str]) -> Object {
        Object::EndpointSlice {
            slice: ObjectKey::new("ns", name),
            service: ObjectKey::new("ns", service),
            endpoints: Endpoints {
                addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
                ports: vec![ServicePort {
                    protocol: "TCP".into(),
                    port: 80,
                    node_port: None,
                }],
            },
        }
    }

    fn addresses(ix: &ClusterIndex, service: &str) -> Vec<String> {
        ix.state()
            .endpoints
            .get(&ObjectKey::new("ns", service))
            .map(|e| e.addresses.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    #[test]
    fn slices_merge_per_service_and_follow_updates_moves_and_deletes() {
        let mut ix = ClusterIndex::new();
        assert!(ix.apply(slice("s-1", "s", &["10.0.0.2", "10.0.0.1"])));
        assert!(ix.apply(slice("s-2", "s", &["10.0.0.1", "10.0.0.3"])));
        assert_eq!(addresses(&ix, "s"), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert_eq!(
            ix.state().endpoints[&ObjectKey::new("ns", "s")].ports.len(),
            1
        );
        assert!(
            !ix.apply(slice("s-2", "s", &["10.0.0.1", "10.0.0.3"])),
            "unchanged"
        );
        // A slice relabelled to another Service moves with its addresses.
        assert!(ix.apply(slice("s-2", "t", &["10.0.0.3"])));
        assert_eq!(addresses(&ix, "s"), ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(addresses(&ix, "t"), ["10.0.0.3"]);
        assert!(ix.delete(Kind::EndpointSlice, &ObjectKey::new("ns", "s-1")));
        assert!(!ix
            .state()
            .endpoints
            .contains_key(&ObjectKey::new("ns", "s")));
        assert!(!ix.delete(Kind::EndpointSlice, &ObjectKey::new("ns", "s-1")));
        assert_eq!(ix.keys(Kind::EndpointSlice), [ObjectKey::new("ns", "s-2")]);
    }

    #[test]
    fn apply_and_delete_report_changes() {
        let mut ix = ClusterIndex::new();
        let ns = |l: &str| {
            Object::Namespace(
                "a".into(),
                crate::state::Namespace {
                    labels: [("l".to_string(), l.to_string())].into(),
                },
            )
        };
        assert!(ix.apply(ns("1")));
        assert!(!ix.apply(ns("1")));
        assert!(ix.apply(ns("2")));
        assert_eq!(ix.keys(Kind::Namespace), [ObjectKey::new("", "a")]);
        assert!(ix.delete(Kind::Namespace, &ObjectKey::new("", "a")));
        assert!(!ix.delete(Kind::Namespace, &ObjectKey::new("", "a")));
        assert_eq!(ix.state(), &ClusterState::default());
        let config = ClusterConfig {
            srv6_locator_prefix: Some("2001:db8::/48".parse().unwrap()),
        };
        assert!(ix.apply(Object::Config(config)));
        assert_eq!(ix.keys(Kind::ConfigMap).len(), 1);
        assert!(ix.delete(
            Kind::ConfigMap,
            &ObjectKey::new("kube-system", "lace-config")
        ));
        assert!(ix.keys(Kind::ConfigMap).is_empty());
    }
}
