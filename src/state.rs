//! `ClusterState`: everything the planner reads, without Kubernetes types.
//!
//! Built either from Kubernetes watches (agent in-cluster) or from a directory of YAML
//! manifests (standalone mode: the demo and the tests). Both paths produce this same type.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::api::{
    NetworkAllocationSpec, NetworkBindingPolicySpec, NetworkRoutingPolicySpec, NetworkSpec,
    NodeAllocationSpec, ServiceBindingPolicySpec, ServiceRoutingPolicySpec, Underlay,
};

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
}
