//! Binding resolution: which Network a pod or a Service belongs to.
//!
//! The highest `priority` wins; among equal priorities the policy whose name sorts first wins
//! (deterministic on every node and in the controller). No match means "not bound": a pod then
//! gets no address (the CNI fails ADD with a retryable error naming the pod).

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::api::{LabelSelector, ServiceRef};
use crate::state::{ClusterState, ObjectKey, Pod, Service};

/// The label every namespace implicitly carries, even if the object we were handed lacks it
/// (the API server sets it on write; older objects or YAML fixtures may not have it).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The outcome of a binding: the Network and the policy that decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding<'a> {
    /// Name of the Network bound to.
    pub network: &'a str,
    /// Name of the binding policy that won.
    pub policy: &'a str,
    /// Its priority.
    pub priority: i32,
}

/// The labels of namespace `name` including the implicit `kubernetes.io/metadata.name`.
/// A namespace missing from the state still has that one label.
pub fn namespace_labels<'a>(
    state: &'a ClusterState,
    name: &str,
) -> Cow<'a, BTreeMap<String, String>> {
    match state.namespaces.get(name) {
        Some(ns) if ns.labels.get(NAMESPACE_NAME_LABEL).map(String::as_str) == Some(name) => {
            Cow::Borrowed(&ns.labels)
        }
        other => {
            let mut labels = other.map(|ns| ns.labels.clone()).unwrap_or_default();
            labels.insert(NAMESPACE_NAME_LABEL.to_string(), name.to_string());
            Cow::Owned(labels)
        }
    }
}

/// The winning binding among `candidates`: highest priority, then lowest policy name.
fn winner<'a>(candidates: impl Iterator<Item = Binding<'a>>) -> Option<Binding<'a>> {
    candidates.min_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then_with(|| a.policy.cmp(b.policy))
    })
}

/// The Network pod `key` is bound to, or `None` (hostNetwork pods, or no policy matches).
///
/// Policies naming a Network that does not exist or is external are skipped: pods are never
/// placed on an external Network, and validation reports the dangling reference.
pub fn pod_network<'a>(state: &'a ClusterState, key: &ObjectKey, pod: &Pod) -> Option<Binding<'a>> {
    if pod.host_network {
        return None;
    }
    let ns_labels = namespace_labels(state, &key.namespace);
    winner(
        state
            .network_bindings
            .iter()
            .filter(|(_, policy)| {
                // Pods are never placed on a missing or external Network.
                state
                    .networks
                    .get(&policy.network)
                    .is_some_and(|net| !net.external)
                    && policy.namespace_selector.matches(&ns_labels)
                    && policy.pod_selector.matches(&pod.labels)
            })
            .map(|(name, policy)| Binding {
                network: &policy.network,
                policy: name,
                priority: policy.priority,
            }),
    )
}

/// The Network Service `key` is bound to, or `None`.
///
/// A policy listing `services` by name binds exactly those (its selectors are ignored);
/// otherwise its namespace and service selectors decide. Policies naming a missing Network
/// are skipped. External Networks are allowed (e.g. `default/kubernetes` on `internet`).
pub fn service_network<'a>(
    state: &'a ClusterState,
    key: &ObjectKey,
    svc: &Service,
) -> Option<Binding<'a>> {
    winner(
        state
            .service_bindings
            .iter()
            .filter(|(_, policy)| {
                state.networks.contains_key(&policy.network)
                    && selects_service(
                        state,
                        &policy.services,
                        &policy.namespace_selector,
                        &policy.service_selector,
                        key,
                        svc,
                    )
            })
            .map(|(name, policy)| Binding {
                network: &policy.network,
                policy: name,
                priority: policy.priority,
            }),
    )
}

/// Whether a Service policy selects Service `key`: a policy listing `services` by name
/// selects exactly those (its selectors are ignored), otherwise its namespace and service
/// selectors decide.
pub(crate) fn selects_service(
    state: &ClusterState,
    services: &[ServiceRef],
    namespace_selector: &LabelSelector,
    service_selector: &LabelSelector,
    key: &ObjectKey,
    svc: &Service,
) -> bool {
    if services.is_empty() {
        namespace_selector.matches(&namespace_labels(state, &key.namespace))
            && service_selector.matches(&svc.labels)
    } else {
        services
            .iter()
            .any(|r| r.namespace == key.namespace && r.name == key.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        LabelSelector, NetworkBindingPolicySpec, NetworkSpec, ServiceBindingPolicySpec, ServiceRef,
    };
    use crate::state::Namespace;

    fn sel(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn state() -> ClusterState {
        let mut s = ClusterState::default();
        for n in ["system", "default", "tenant"] {
            s.networks.insert(n.into(), NetworkSpec::default());
        }
        s.networks.insert(
            "internet".into(),
            NetworkSpec {
                external: true,
                host_access: false,
                ..Default::default()
            },
        );
        let bind = |net: &str, prio: i32, ns: LabelSelector, pod: LabelSelector| {
            NetworkBindingPolicySpec {
                network: net.into(),
                priority: prio,
                namespace_selector: ns,
                pod_selector: pod,
            }
        };
        s.network_bindings
            .insert("default".into(), bind("default", 0, sel(&[]), sel(&[])));
        s.network_bindings.insert(
            "system".into(),
            bind(
                "system",
                1000,
                sel(&[(NAMESPACE_NAME_LABEL, "kube-system")]),
                sel(&[]),
            ),
        );
        s.network_bindings.insert(
            "tenant-a".into(),
            bind("tenant", 500, sel(&[("team", "a")]), sel(&[])),
        );
        // Same priority as tenant-a: "tenant-a" < "tenant-b", so tenant-a wins ties.
        s.network_bindings.insert(
            "tenant-b".into(),
            bind("system", 500, sel(&[]), sel(&[("tier", "db")])),
        );
        // Policies pointing at an external or missing Network never bind pods.
        s.network_bindings.insert(
            "zz-ext".into(),
            bind("internet", 900, sel(&[]), sel(&[("ext", "1")])),
        );
        s.network_bindings.insert(
            "zz-missing".into(),
            bind("nope", 900, sel(&[]), sel(&[("ext", "1")])),
        );
        s.namespaces.insert(
            "team-a".into(),
            Namespace {
                labels: [("team".to_string(), "a".to_string())].into(),
            },
        );
        s
    }

    fn pod(labels: &[(&str, &str)], host_network: bool) -> Pod {
        Pod {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            host_network,
            ..Default::default()
        }
    }

    #[test]
    fn pod_binding_table() {
        let s = state();
        type Case<'a> = (&'a str, &'a str, Pod, Option<(&'a str, &'a str)>);
        let cases: Vec<Case> = vec![
            // kube-system has no Namespace object here: the implicit name label still matches.
            (
                "implicit namespace name label",
                "kube-system",
                pod(&[], false),
                Some(("system", "system")),
            ),
            (
                "catch-all default",
                "apps",
                pod(&[], false),
                Some(("default", "default")),
            ),
            (
                "namespace labels",
                "team-a",
                pod(&[], false),
                Some(("tenant", "tenant-a")),
            ),
            (
                "tie broken by policy name",
                "team-a",
                pod(&[("tier", "db")], false),
                Some(("tenant", "tenant-a")),
            ),
            (
                "pod labels",
                "apps",
                pod(&[("tier", "db")], false),
                Some(("system", "tenant-b")),
            ),
            (
                "external and missing Networks skipped",
                "apps",
                pod(&[("ext", "1")], false),
                Some(("default", "default")),
            ),
            ("hostNetwork ignored", "kube-system", pod(&[], true), None),
        ];
        for (name, ns, p, want) in cases {
            let got = pod_network(&s, &ObjectKey::new(ns, "p"), &p).map(|b| (b.network, b.policy));
            assert_eq!(got, want, "case {name}");
        }
    }

    #[test]
    fn no_policy_means_unbound() {
        let mut s = state();
        s.network_bindings.retain(|k, _| k == "system");
        assert_eq!(
            pod_network(&s, &ObjectKey::new("apps", "p"), &pod(&[], false)),
            None
        );
    }

    #[test]
    fn explicit_namespace_label_is_not_overridden() {
        let mut s = state();
        // A namespace that carries a wrong metadata.name label: the implicit one is authoritative.
        s.namespaces.insert(
            "kube-system".into(),
            Namespace {
                labels: [(NAMESPACE_NAME_LABEL.to_string(), "other".to_string())].into(),
            },
        );
        let got = pod_network(&s, &ObjectKey::new("kube-system", "p"), &pod(&[], false))
            .map(|b| b.network);
        assert_eq!(got, Some("system"));
    }

    #[test]
    fn service_binding_table() {
        let mut s = state();
        s.service_bindings.insert(
            "kubernetes".into(),
            ServiceBindingPolicySpec {
                network: "internet".into(),
                priority: 10,
                // The names list wins over selectors that would match nothing.
                service_selector: sel(&[("never", "matches")]),
                services: vec![ServiceRef {
                    namespace: "default".into(),
                    name: "kubernetes".into(),
                }],
                ..Default::default()
            },
        );
        s.service_bindings.insert(
            "all-default".into(),
            ServiceBindingPolicySpec {
                network: "default".into(),
                priority: 0,
                ..Default::default()
            },
        );
        s.service_bindings.insert(
            "a-same-prio".into(),
            ServiceBindingPolicySpec {
                network: "tenant".into(),
                priority: 0,
                namespace_selector: sel(&[("team", "a")]),
                ..Default::default()
            },
        );
        s.service_bindings.insert(
            "missing".into(),
            ServiceBindingPolicySpec {
                network: "nope".into(),
                priority: 999,
                ..Default::default()
            },
        );
        let svc = Service::default();
        let cases = [
            (
                "names list",
                ObjectKey::new("default", "kubernetes"),
                Some(("internet", "kubernetes")),
            ),
            (
                "selector catch-all",
                ObjectKey::new("default", "other"),
                Some(("default", "all-default")),
            ),
            (
                "tie by name",
                ObjectKey::new("team-a", "x"),
                Some(("tenant", "a-same-prio")),
            ),
        ];
        for (name, key, want) in cases {
            let got = service_network(&s, &key, &svc).map(|b| (b.network, b.policy));
            assert_eq!(got, want, "case {name}");
        }
    }
}
