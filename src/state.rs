//! `ClusterState`: everything the planner reads, without Kubernetes types.
//!
//! Built either from Kubernetes watches (agent in-cluster) or from a directory of YAML
//! manifests (standalone mode: the demo and the tests). Both paths produce this same type.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::api::{
    LabelSelector, NetworkAllocationSpec, NetworkBindingPolicySpec, NetworkRoutingPolicySpec,
    NetworkSpec, NodeAllocationSpec, ServiceBindingPolicySpec, ServiceRoutingPolicySpec, Underlay,
};
use crate::bandwidth::Bandwidth;
use crate::hostport::HostPort;

/// `namespace/name` of a namespaced object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A core Namespace: only its labels matter to Lace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    pub labels: BTreeMap<String, String>,
}

/// A core Pod as far as Lace cares.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    pub labels: BTreeMap<String, String>,
    /// `spec.nodeName`; empty while unscheduled.
    pub node: String,
    /// `status.podIPs`.
    pub ips: Vec<IpAddr>,
    /// hostNetwork pods are not Lace's.
    pub host_network: bool,
    /// The `ports` of its containers that have a name: what a NetworkPolicy's named port
    /// resolves to on this pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ContainerPort>,
}

/// A named container port (`spec.containers[*].ports[*]` with a `name`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContainerPort {
    pub name: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    pub port: u16,
}

/// A `networking.k8s.io/v1` NetworkPolicy, without Kubernetes types. `policyTypes` is
/// already defaulted as the API server does (always `Ingress`; `Egress` when there are
/// egress rules), so both state sources mean the same by an object without it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    /// The pods (in the policy's namespace) it applies to; empty selects all of them.
    pub pod_selector: LabelSelector,
    /// `Ingress` in `policyTypes`: the selected pods are isolated for ingress.
    pub ingress_isolation: bool,
    /// `Egress` in `policyTypes`: the selected pods are isolated for egress.
    pub egress_isolation: bool,
    /// `spec.ingress`: each rule allows its ports from its peers.
    pub ingress: Vec<PolicyRule>,
    /// `spec.egress`: each rule allows its ports to its peers.
    pub egress: Vec<PolicyRule>,
    /// `policyTypes` values other than `Ingress` and `Egress`, kept so the validator can
    /// name them (the policy is left out: its author meant something Lace cannot tell).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown_policy_types: Vec<String>,
}

/// One ingress (`from`) or egress (`to`) rule. Empty `peers` means every peer; empty `ports`
/// every port and protocol.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRule {
    pub peers: Vec<PolicyPeer>,
    pub ports: Vec<PolicyPort>,
}

/// A peer of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyPeer {
    /// Pods: `podSelector` alone (in the policy's namespace), `namespaceSelector` alone (all
    /// pods of those namespaces) or both (those pods of those namespaces). Neither is a peer
    /// without a selector, which the validator rejects.
    Pods {
        namespace_selector: Option<LabelSelector>,
        pod_selector: Option<LabelSelector>,
    },
    /// Addresses: `cidr` without the `except` prefixes.
    IpBlock {
        cidr: ipnet::IpNet,
        except: Vec<ipnet::IpNet>,
    },
}

/// A port of a rule: `port` absent means every port of `protocol`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyPort {
    /// `TCP` (the default), `UDP` or `SCTP` (the validator rejects others).
    pub protocol: String,
    pub port: Option<PortRef>,
    /// `endPort`: with a numeric `port`, the range `port..=end_port`.
    pub end_port: Option<u16>,
}

/// A port by number or by the name of a container port of the destination pod.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PortRef {
    Number(u16),
    Name(String),
}

/// A Service port (`protocol` is `TCP`, `UDP` or `SCTP`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServicePort {
    pub protocol: String,
    pub port: u16,
    /// `nodePort` of a NodePort or LoadBalancer Service's port (kube-proxy opens it on every
    /// node's addresses); `None` for other Services and for EndpointSlice ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<u16>,
}

/// A core Service as far as Lace cares.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub labels: BTreeMap<String, String>,
    /// `spec.clusterIPs` (empty for headless Services).
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
}

/// The ready endpoints of one Service, merged over its EndpointSlices.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoints {
    pub addresses: Vec<IpAddr>,
    /// Target ports by protocol, as the EndpointSlices list them.
    pub ports: Vec<ServicePort>,
}

/// A core Node as far as Lace cares.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub labels: BTreeMap<String, String>,
    /// `status.addresses` of type InternalIP.
    pub internal_ips: Vec<IpAddr>,
}

impl Node {
    /// The node's underlay addresses: its first usable InternalIP of each family (one other
    /// nodes can send to: not unspecified, loopback, multicast or link-local).
    pub fn underlay(&self) -> Underlay {
        let mut u = Underlay::default();
        let usable = |ip: &&IpAddr| match ip {
            IpAddr::V4(a) => {
                !(a.is_unspecified()
                    || a.is_loopback()
                    || a.is_multicast()
                    || a.is_link_local()
                    || a.is_broadcast())
            }
            IpAddr::V6(a) => {
                !(a.is_unspecified()
                    || a.is_loopback()
                    || a.is_multicast()
                    || a.is_unicast_link_local())
            }
        };
        for ip in self.internal_ips.iter().filter(usable) {
            match ip {
                IpAddr::V4(v4) => _ = u.ipv4.get_or_insert(*v4),
                IpAddr::V6(v6) => _ = u.ipv6.get_or_insert(*v6),
            }
        }
        u
    }
}

/// A pod interface on this node, as the agent's IPAM recorded it at CNI ADD.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodAttachment {
    pub pod: ObjectKey,
    pub container_id: String,
    /// Host side of the pod's veth (enslaved to the Network's VRF).
    pub host_ifname: String,
    pub network: String,
    pub ips: Vec<IpNet>,
    /// The pod's hostPorts, as the runtime passed them at ADD.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<HostPort>,
    /// What the pod's traffic is shaped to, as the runtime passed it at ADD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Bandwidth>,
}

/// Cluster-wide settings that are not objects (chart values, agent flags).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// `controller.srv6LocatorPrefix`.
    pub srv6_locator_prefix: Option<ipnet::Ipv6Net>,
}

/// Everything the planner reads. Keyed maps keep iteration (and so the plan) deterministic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    pub config: ClusterConfig,
    pub networks: BTreeMap<String, NetworkSpec>,
    pub network_bindings: BTreeMap<String, NetworkBindingPolicySpec>,
    pub service_bindings: BTreeMap<String, ServiceBindingPolicySpec>,
    pub network_routes: BTreeMap<String, NetworkRoutingPolicySpec>,
    pub service_routes: BTreeMap<String, ServiceRoutingPolicySpec>,
    pub network_allocations: BTreeMap<String, NetworkAllocationSpec>,
    pub node_allocations: BTreeMap<String, NodeAllocationSpec>,
    pub namespaces: BTreeMap<String, Namespace>,
    pub pods: BTreeMap<ObjectKey, Pod>,
    pub services: BTreeMap<ObjectKey, Service>,
    /// Per Service, merged from its EndpointSlices.
    pub endpoints: BTreeMap<ObjectKey, Endpoints>,
    pub nodes: BTreeMap<String, Node>,
    /// `networking.k8s.io/v1` NetworkPolicies, inside what the Lace policies allow.
    #[serde(default)]
    pub network_policies: BTreeMap<ObjectKey, NetworkPolicy>,
}
