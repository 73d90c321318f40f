//! The Kubernetes objects Lace reads, as kube-free values: one conversion from an object to
//! what [`crate::state::ClusterState`] holds, shared by both state sources.
//!
//! A source (the YAML directory of standalone mode, or the Kubernetes watches) parses an
//! object's `metadata` into a [`Meta`] and the rest into the kind's *body* type below, which
//! holds only the fields Lace reads (unknown fields are ignored, missing optional ones
//! default), and calls [`Body::into_object`]. The resulting [`Object`] goes into the
//! [`crate::index::ClusterIndex`], which builds the state incrementally.
//!
//! The bodies are also what the agent watches with (`crate::k8s::Slim`): slim types, as
//! Cilium's agent uses, so the caches hold a few fields per object instead of whole Pods.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::api::{
    self, NetworkAllocationSpec, NetworkBindingPolicySpec, NetworkRoutingPolicySpec, NetworkSpec,
    NodeAllocationSpec, ServiceBindingPolicySpec, ServiceRoutingPolicySpec,
};
use crate::state::{
    ClusterConfig, ContainerPort, Endpoints, Namespace, Node, ObjectKey, Pod, Service, ServicePort,
};

mod netpol;
pub use netpol::NetworkPolicyBody;

/// Namespace of the ConfigMap holding the cluster configuration (standalone mode).
pub const CONFIG_NAMESPACE: &str = "kube-system";
/// Name of the ConfigMap holding the cluster configuration (standalone mode).
pub const CONFIG_NAME: &str = "lace-config";
/// Label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label the API server puts on every Namespace; added here too so selectors behave the same
/// whichever source the Namespace came from.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Every kind Lace reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Network,
    NetworkBindingPolicy,
    ServiceBindingPolicy,
    NetworkRoutingPolicy,
    ServiceRoutingPolicy,
    NetworkAllocation,
    NodeAllocation,
    Namespace,
    Node,
    Pod,
    Service,
    EndpointSlice,
    /// `networking.k8s.io/v1`.
    NetworkPolicy,
    /// Only `kube-system/lace-config` (standalone mode's cluster configuration).
    ConfigMap,
}

impl Kind {
    /// Every kind, in a fixed order.
    pub const ALL: [Kind; 14] = [
        Kind::Network,
        Kind::NetworkBindingPolicy,
        Kind::ServiceBindingPolicy,
        Kind::NetworkRoutingPolicy,
        Kind::ServiceRoutingPolicy,
        Kind::NetworkAllocation,
        Kind::NodeAllocation,
        Kind::Namespace,
        Kind::Node,
        Kind::Pod,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::NetworkPolicy,
        Kind::ConfigMap,
    ];

    /// The kind of an object with this `apiVersion` and `kind`, if Lace reads it.
    pub fn of(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.api_version() == api_version && k.name() == kind)
    }

    /// The `kind` string.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Network => "Network",
            Kind::NetworkBindingPolicy => "NetworkBindingPolicy",
            Kind::ServiceBindingPolicy => "ServiceBindingPolicy",
            Kind::NetworkRoutingPolicy => "NetworkRoutingPolicy",
            Kind::ServiceRoutingPolicy => "ServiceRoutingPolicy",
            Kind::NetworkAllocation => "NetworkAllocation",
            Kind::NodeAllocation => "NodeAllocation",
            Kind::Namespace => "Namespace",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::ConfigMap => "ConfigMap",
        }
    }

    /// The `apiVersion` string.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Namespace | Kind::Node | Kind::Pod | Kind::Service | Kind::ConfigMap => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            _ => api::API_VERSION,
        }
    }

    /// The API group (empty for the core group).
    pub fn group(self) -> &'static str {
        self.api_version().rsplit_once('/').map_or("", |(g, _)| g)
    }

    /// The API version within the group.
    pub fn version(self) -> &'static str {
        self.api_version()
            .rsplit_once('/')
            .map_or(self.api_version(), |(_, v)| v)
    }

    /// The resource name in API paths (`networks`, `endpointslices`, ...).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Network => "networks",
            Kind::NetworkBindingPolicy => "networkbindingpolicies",
            Kind::ServiceBindingPolicy => "servicebindingpolicies",
            Kind::NetworkRoutingPolicy => "networkroutingpolicies",
            Kind::ServiceRoutingPolicy => "serviceroutingpolicies",
            Kind::NetworkAllocation => "networkallocations",
            Kind::NodeAllocation => "nodeallocations",
            Kind::Namespace => "namespaces",
            Kind::Node => "nodes",
            Kind::Pod => "pods",
            Kind::Service => "services",
            Kind::EndpointSlice => "endpointslices",
            Kind::NetworkPolicy => "networkpolicies",
            Kind::ConfigMap => "configmaps",
        }
    }

    /// Calls `visitor` with the body type of this kind: the one place that maps a kind to
    /// its type (the loader, the watches and the tests dispatch through it).
    pub fn visit<V: BodyVisitor>(self, visitor: V) -> V::Output {
        match self {
            Kind::Network => visitor.visit::<Lace<NetworkSpec>>(),
            Kind::NetworkBindingPolicy => visitor.visit::<Lace<NetworkBindingPolicySpec>>(),
            Kind::ServiceBindingPolicy => visitor.visit::<Lace<ServiceBindingPolicySpec>>(),
            Kind::NetworkRoutingPolicy => visitor.visit::<Lace<NetworkRoutingPolicySpec>>(),
            Kind::ServiceRoutingPolicy => visitor.visit::<Lace<ServiceRoutingPolicySpec>>(),
            Kind::NetworkAllocation => visitor.visit::<Lace<NetworkAllocationSpec>>(),
            Kind::NodeAllocation => visitor.visit::<Lace<NodeAllocationSpec>>(),
            Kind::Namespace => visitor.visit::<NamespaceBody>(),
            Kind::Node => visitor.visit::<NodeBody>(),
            Kind::Pod => visitor.visit::<PodBody>(),
            Kind::Service => visitor.visit::<ServiceBody>(),
            Kind::EndpointSlice => visitor.visit::<EndpointSliceBody>(),
            Kind::NetworkPolicy => visitor.visit::<NetworkPolicyBody>(),
            Kind::ConfigMap => visitor.visit::<ConfigMapBody>(),
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        matches!(
            self,
            Kind::Pod | Kind::Service | Kind::EndpointSlice | Kind::NetworkPolicy | Kind::ConfigMap
        )
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What Lace reads of an object's `metadata`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub name: String,
    /// Empty for cluster-scoped kinds.
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
}

impl Meta {
    /// The object's key: `namespace/name` (namespace empty for cluster-scoped kinds).
    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(self.namespace.clone(), self.name.clone())
    }
}

/// One object as the cluster state holds it. Cluster-scoped objects are keyed by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Object {
    Network(String, NetworkSpec),
    NetworkBindingPolicy(String, NetworkBindingPolicySpec),
    ServiceBindingPolicy(String, ServiceBindingPolicySpec),
    NetworkRoutingPolicy(String, NetworkRoutingPolicySpec),
    ServiceRoutingPolicy(String, ServiceRoutingPolicySpec),
    NetworkAllocation(String, NetworkAllocationSpec),
    NodeAllocation(String, NodeAllocationSpec),
    Namespace(String, Namespace),
    Node(String, Node),
    Pod(ObjectKey, Pod),
    Service(ObjectKey, Service),
    /// One EndpointSlice's ready endpoints, for the Service its `kubernetes.io/service-name`
    /// label names (the index merges the slices of a Service).
    EndpointSlice {
        slice: ObjectKey,
        service: ObjectKey,
        endpoints: Endpoints,
    },
    NetworkPolicy(ObjectKey, crate::state::NetworkPolicy),
    /// The `kube-system/lace-config` ConfigMap.
    Config(ClusterConfig),
}

impl Object {
    /// The kind of this object.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Network(..) => Kind::Network,
            Object::NetworkBindingPolicy(..) => Kind::NetworkBindingPolicy,
            Object::ServiceBindingPolicy(..) => Kind::ServiceBindingPolicy,
            Object::NetworkRoutingPolicy(..) => Kind::NetworkRoutingPolicy,
            Object::ServiceRoutingPolicy(..) => Kind::ServiceRoutingPolicy,
            Object::NetworkAllocation(..) => Kind::NetworkAllocation,
            Object::NodeAllocation(..) => Kind::NodeAllocation,
            Object::Namespace(..) => Kind::Namespace,
            Object::Node(..) => Kind::Node,
            Object::Pod(..) => Kind::Pod,
            Object::Service(..) => Kind::Service,
            Object::EndpointSlice { .. } => Kind::EndpointSlice,
            Object::NetworkPolicy(..) => Kind::NetworkPolicy,
            Object::Config(_) => Kind::ConfigMap,
        }
    }

    /// The key of this object: what a delete of it names.
    pub fn key(&self) -> ObjectKey {
        let cluster = |name: &String| ObjectKey::new("", name.clone());
        match self {
            Object::Network(n, _)
            | Object::NetworkBindingPolicy(n, _)
            | Object::ServiceBindingPolicy(n, _)
            | Object::NetworkRoutingPolicy(n, _)
            | Object::ServiceRoutingPolicy(n, _)
            | Object::NetworkAllocation(n, _)
            | Object::NodeAllocation(n, _)
            | Object::Namespace(n, _)
            | Object::Node(n, _) => cluster(n),
            Object::Pod(k, _) | Object::Service(k, _) | Object::NetworkPolicy(k, _) => k.clone(),
            Object::EndpointSlice { slice, .. } => slice.clone(),
            Object::Config(_) => ObjectKey::new(CONFIG_NAMESPACE, CONFIG_NAME),
        }
    }
}

/// Why an object cannot be used: names the field that is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    #[error("{field}: invalid IP address {value:?}")]
    InvalidIp { field: String, value: String },
    #[error("spec.ports[{index}]: missing field `port`")]
    MissingPort { index: usize },
    #[error("{field}: invalid CIDR {value:?}")]
    InvalidCidr { field: String, value: String },
    #[error("{field}: {value} is not a port number (1-65535)")]
    InvalidPort { field: String, value: i64 },
    #[error("{field}: an ipBlock peer cannot also have a podSelector or namespaceSelector; split it into two peers")]
    PeerMixesIpBlock { field: String },
    #[error("data.srv6LocatorPrefix: invalid IPv6 prefix {value:?}")]
    InvalidLocatorPrefix { value: String },
    /// The object is not of its kind's shape: what the decoder said (a source that decodes
    /// each object on its own, so one of them cannot fail a whole list).
    #[error("unexpected shape: {0}")]
    Shape(String),
}

/// Something done with the body type of a [`Kind`] ([`Kind::visit`]).
pub trait BodyVisitor {
    type Output;
    fn visit<B: Body>(self) -> Self::Output;
}

/// The part of an object after `metadata`, as Lace reads it, for one kind.
pub trait Body: DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The kind this body is of.
    const KIND: Kind;
    /// Converts an object with metadata `meta`; `Ok(None)` for an object Lace ignores (a
    /// ConfigMap other than Lace's, an EndpointSlice of no Service). The error says which
    /// field is wrong (`spec.clusterIPs: invalid IP address "…"`).
    fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError>;
}

/// A Lace object: only its spec matters (status is the controller's output).
#[derive(Clone, Debug, Deserialize)]
pub struct Lace<S> {
    pub spec: S,
}

macro_rules! lace_body {
    ($spec:ty, $kind:ident) => {
        impl Body for Lace<$spec> {
            const KIND: Kind = Kind::$kind;
            fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError> {
                Ok(Some(Object::$kind(meta.name, self.spec)))
            }
        }
    };
}
lace_body!(NetworkSpec, Network);
lace_body!(NetworkBindingPolicySpec, NetworkBindingPolicy);
lace_body!(ServiceBindingPolicySpec, ServiceBindingPolicy);
lace_body!(NetworkRoutingPolicySpec, NetworkRoutingPolicy);
lace_body!(ServiceRoutingPolicySpec, ServiceRoutingPolicy);
lace_body!(NetworkAllocationSpec, NetworkAllocation);
lace_body!(NodeAllocationSpec, NodeAllocation);

/// A core Namespace: nothing but its metadata.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NamespaceBody {}

impl Body for NamespaceBody {
    const KIND: Kind = Kind::Namespace;
    fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError> {
        let mut labels = meta.labels;
        labels
            .entry(NAMESPACE_NAME_LABEL.to_string())
            .or_insert_with(|| meta.name.clone());
        Ok(Some(Object::Namespace(meta.name, Namespace { labels })))
    }
}

/// A core Pod: where it runs, its addresses, whether it is on the host network.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodBody {
    #[serde(default)]
    pub spec: PodSpec,
    #[serde(default)]
    pub status: PodStatus,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub node_name: String,
    #[serde(default)]
    pub host_network: bool,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub containers: Vec<ContainerBody>,
}

/// A container: only its ports (what a NetworkPolicy's named port resolves to).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ContainerBody {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub ports: Vec<ContainerPortBody>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPortBody {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "tcp")]
    pub protocol: String,
    pub container_port: u16,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodStatus {
    #[serde(default, rename = "podIP")]
    pub pod_ip: Option<String>,
    #[serde(default, rename = "podIPs")]
    pub pod_ips: Vec<PodIp>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct PodIp {
    pub ip: String,
}

impl Body for PodBody {
    const KIND: Kind = Kind::Pod;
    fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError> {
        let (field, ips): (_, Vec<String>) = if self.status.pod_ips.is_empty() {
            ("status.podIP", self.status.pod_ip.into_iter().collect())
        } else {
            let ips = self.status.pod_ips.into_iter().map(|p| p.ip).collect();
            ("status.podIPs", ips)
        };
        let ips = parse_ips(field, &ips)?;
        // Only named ports: a NetworkPolicy names them; a number needs no lookup. Sorted, so
        // the pod compares equal however its containers list them.
        let mut ports: Vec<ContainerPort> = self
            .spec
            .containers
            .into_iter()
            .flat_map(|c| c.ports)
            .filter_map(|p| {
                Some(ContainerPort {
                    name: p.name.filter(|n| !n.is_empty())?,
                    protocol: p.protocol,
                    port: p.container_port,
                })
            })
            .collect();
        ports.sort();
        ports.dedup();
        let pod = Pod {
            labels: meta.labels.clone(),
            node: self.spec.node_name,
            ips,
            host_network: self.spec.host_network,
            ports,
        };
        Ok(Some(Object::Pod(meta.key(), pod)))
    }
}

/// A core Service: its cluster IPs and ports.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ServiceBody {
    #[serde(default)]
    pub spec: ServiceSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ServiceSpec {
    /// `None` for headless Services, so strings, not addresses.
    #[serde(default, rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    #[serde(default, rename = "clusterIPs")]
    pub cluster_ips: Vec<String>,
    #[serde(default)]
    pub ports: Vec<PortBody>,
}

/// A port of a Service or an EndpointSlice.
#[derive(Clone, Debug, Deserialize)]
pub struct PortBody {
    #[serde(default = "tcp")]
    pub protocol: String,
    /// Optional in EndpointSlices ("all ports"); required in Services.
    #[serde(default)]
    pub port: Option<u16>,
    /// Services of type NodePort and LoadBalancer only.
    #[serde(default, rename = "nodePort")]
    pub node_port: Option<u16>,
}

fn tcp() -> String {
    "TCP".to_string()
}

/// A list Kubernetes may send as `null` (Go's nil slice in a field without `omitempty`).
fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

impl Body for ServiceBody {
    const KIND: Kind = Kind::Service;
    fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError> {
        let spec = self.spec;
        let (field, ips): (_, Vec<String>) = if spec.cluster_ips.is_empty() {
            ("spec.clusterIP", spec.cluster_ip.into_iter().collect())
        } else {
            ("spec.clusterIPs", spec.cluster_ips)
        };
        let ips: Vec<String> = ips
            .into_iter()
            .filter(|ip| !ip.is_empty() && ip != "None")
            .collect();
        let cluster_ips = parse_ips(field, &ips)?;
        let ports = spec
            .ports
            .into_iter()
            .enumerate()
            .map(|(i, p)| match p.port {
                Some(port) => Ok(ServicePort {
                    protocol: p.protocol,
                    port,
                    node_port: p.node_port,
                }),
                None => Err(ObjectError::MissingPort { index: i }),
            })
            .collect::<Result<_, _>>()?;
        let service = Service {
            labels: meta.labels.clone(),
            cluster_ips,
            ports,
        };
        Ok(Some(Object::Service(meta.key(), service)))
    }
}

/// A `discovery.k8s.io/v1` EndpointSlice.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSliceBody {
    #[serde(default)]
    pub address_type: String,
    /// The API server sends `null` for a slice without endpoints (a Go nil slice).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub endpoints: Vec<EndpointBody>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub ports: Vec<PortBody>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct EndpointBody {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub conditions: EndpointConditions,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct EndpointConditions {
    /// Unset means ready (as Kubernetes documents for consumers).
    #[serde(default)]
    pub ready: Option<bool>,
}

impl Body for EndpointSliceBody {
    const KIND: Kind = Kind::EndpointSlice;
    fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError> {
        let Some(service) = meta.labels.get(SERVICE_NAME_LABEL) else {
            return Ok(None);
        };
        let service = ObjectKey::new(meta.namespace.clone(), service.clone());
        let mut endpoints = Endpoints::default();
        // FQDN slices hold names, not addresses: nothing Lace can route.
        if self.address_type != "FQDN" {
            for (i, endpoint) in self.endpoints.iter().enumerate() {
                if endpoint.conditions.ready == Some(false) {
                    continue;
                }
                for (j, address) in endpoint.addresses.iter().enumerate() {
                    endpoints.addresses.push(parse_ip(
                        &format!("endpoints[{i}].addresses[{j}]"),
                        address,
                    )?);
                }
            }
            endpoints.ports = self
                .ports
                .into_iter()
                .filter_map(|p| {
                    Some(ServicePort {
                        protocol: p.protocol,
                        port: p.port?,
                        node_port: None,
                    })
                })
                .collect();
        }
        Ok(Some(Object::EndpointSlice {
            slice: meta.key(),
            service,
            endpoints,
        }))
    }
}

/// A core Node: its labels and InternalIPs.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeBody {
    #[serde(default)]
    pub status: NodeStatus,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeStatus {
    #[serde(default)]
    pub addresses: Vec<NodeAddress>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct NodeAddress {
    #[serde(rename = "type")]
    pub type_: String,
    pub address: String,
}

impl Body for NodeBody {
    const KIND: Kind = Kind::Node;
    fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError> {
        let internal_ips = self
            .status
            .addresses
            .iter()
            .enumerate()
            .filter(|(_, a)| a.type_ == "InternalIP")
            .map(|(i, a)| parse_ip(&format!("status.addresses[{i}].address"), &a.address))
            .collect::<Result<_, _>>()?;
        let node = Node {
            labels: meta.labels,
            internal_ips,
        };
        Ok(Some(Object::Node(meta.name, node)))
    }
}

/// A core ConfigMap; only `kube-system/lace-config` is read (key `srv6LocatorPrefix`).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ConfigMapBody {
    #[serde(default)]
    pub data: BTreeMap<String, String>,
}

impl Body for ConfigMapBody {
    const KIND: Kind = Kind::ConfigMap;
    fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError> {
        if !is_lace_config(&meta) {
            return Ok(None);
        }
        let prefix = self
            .data
            .get("srv6LocatorPrefix")
            .map(String::as_str)
            .unwrap_or_default();
        let srv6_locator_prefix = if prefix.is_empty() {
            None
        } else {
            Some(
                prefix
                    .parse()
                    .map_err(|_| ObjectError::InvalidLocatorPrefix {
                        value: prefix.to_string(),
                    })?,
            )
        };
        Ok(Some(Object::Config(ClusterConfig {
            srv6_locator_prefix,
        })))
    }
}

/// Whether `meta` names `kube-system/lace-config`, the only ConfigMap Lace reads.
pub fn is_lace_config(meta: &Meta) -> bool {
    (meta.namespace.as_str(), meta.name.as_str()) == (CONFIG_NAMESPACE, CONFIG_NAME)
}

fn parse_ip(field: &str, s: &str) -> Result<IpAddr, ObjectError> {
    s.parse().map_err(|_| ObjectError::InvalidIp {
        field: field.to_string(),
        value: s.to_string(),
    })
}

fn parse_ips(field: &str, list: &[String]) -> Result<Vec<IpAddr>, ObjectError> {
    list.iter().map(|s| parse_ip(field, s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(namespace: &str, name: &str, labels: &[(&str, &str)]) -> Meta {
        Meta {
            name: name.into(),
            namespace: namespace.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn body<B: Body>(json: serde_json::Value) -> B {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn kinds_round_trip_through_their_type_strings() {
        for k in Kind::ALL {
            assert_eq!(Kind::of(k.api_version(), k.name()), Some(k));
        }
        assert_eq!(Kind::of("lace.io/v2", "Network"), None);
        assert_eq!(Kind::of("apps/v1", "Deployment"), None);
        assert!(Kind::Pod.namespaced() && !Kind::Node.namespaced());
        assert_eq!(
            (Kind::EndpointSlice.group(), Kind::EndpointSlice.version()),
            ("discovery.k8s.io", "v1")
        );
        assert_eq!((Kind::Pod.group(), Kind::Pod.version()), ("", "v1"));
        assert_eq!(
            (Kind::Network.group(), Kind::Network.version()),
            ("lace.io", "v1alpha1")
        );
        struct KindOf;
        impl BodyVisitor for KindOf {
            type Output = Kind;
            fn visit<B: Body>(self) -> Kind {
                B::KIND
            }
        }
        for k in Kind::ALL {
            assert_eq!(k.visit(KindOf), k, "visit dispatches to {k}'s body");
        }
    }

    #[test]
    fn bodies_read_what_kubernetes_means() {
        let pod = body::<PodBody>(serde_json::json!({
            "spec": {"nodeName": "n1", "containers": [{"name": "x"}]},
            "status": {"podIP": "10.0.0.5", "phase": "Running"}
        }))
        .into_object(meta("ns", "p", &[("app", "x")]))
        .unwrap()
        .unwrap();
        let Object::Pod(key, pod) = pod else { panic!() };
        assert_eq!(key, ObjectKey::new("ns", "p"));
        assert_eq!((pod.node.as_str(), pod.ips.len()), ("n1", 1));
        // podIPs wins over podIP when both are there.
        let Some(Object::Pod(_, dual)) = body::<PodBody>(serde_json::json!({
            "status": {"podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}]}
        }))
        .into_object(meta("ns", "p", &[]))
        .unwrap() else {
            panic!()
        };
        assert_eq!(dual.ips.len(), 2);
        let err = body::<PodBody>(serde_json::json!({"status": {"podIPs": [{"ip": "x"}]}}))
            .into_object(meta("ns", "p", &[]))
            .unwrap_err();
        assert_eq!(err.to_string(), "status.podIPs: invalid IP address \"x\"");

        let ns = body::<NamespaceBody>(serde_json::json!({"spec": {"finalizers": ["kubernetes"]}}))
            .into_object(meta("", "team", &[]))
            .unwrap();
        assert_eq!(
            ns,
            Some(Object::Namespace(
                "team".into(),
                Namespace {
                    labels: [(NAMESPACE_NAME_LABEL.to_string(), "team".to_string())].into()
                }
            ))
        );
        let other_cm =
            body::<ConfigMapBody>(serde_json::json!({"data": {"srv6LocatorPrefix": "bad"}}))
                .into_object(meta("default", CONFIG_NAME, &[]))
                .unwrap();
        assert_eq!(other_cm, None, "only kube-system/lace-config is Lace's");
        let unowned = body::<EndpointSliceBody>(serde_json::json!({"addressType": "IPv4"}))
            .into_object(meta("ns", "s-1", &[]))
            .unwrap();
        assert_eq!(unowned, None, "a slice of no Service");
        // A Service without ready pods: the API server sends null lists, which mean empty.
        let empty = body::<EndpointSliceBody>(serde_json::json!({
            "addressType": "IPv4", "endpoints": null, "ports": null
        }))
        .into_object(meta("ns", "s-1", &[(SERVICE_NAME_LABEL, "web")]))
        .unwrap();
        let Some(Object::EndpointSlice { endpoints, .. }) = empty else {
            panic!("a slice with null lists decodes: {empty:?}")
        };
        assert!(endpoints.addresses.is_empty() && endpoints.ports.is_empty());
    }
}
