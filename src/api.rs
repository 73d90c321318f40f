//! The Lace API (group `lace.io`, version `v1alpha1`, all cluster-scoped).
//!
//! The spec types are plain serde structs so the pure core (validation, allocation, planner,
//! the YAML loader) builds without kube. With the `kube` feature the same structs also derive
//! `CustomResource` + `JsonSchema`, so the CRDs are generated from this one source of truth.

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// API group of every Lace kind.
pub const GROUP: &str = "lace.io";
/// API version of every Lace kind.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` string of every Lace kind.
pub const API_VERSION: &str = "lace.io/v1alpha1";

/// Lowest binding-policy priority (the catch-all `default` Network binds at this priority).
pub const PRIORITY_MIN: i32 = 0;
/// Highest binding-policy priority (the `system` Network binds at this priority).
pub const PRIORITY_MAX: i32 = 1000;

/// One CIDR of a Network and the size of the block each node gets from it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Subnet {
    /// The Network's address range, e.g. `10.244.0.0/16` or `fd00:10:244::/56`.
    #[cfg_attr(feature = "kube", schemars(with = "String"))]
    #[serde(deserialize_with = "deserialize_cidr")]
    pub cidr: IpNet,
    /// Prefix length of the per-node block carved from `cidr`, e.g. 24 (IPv4) or 64 (IPv6).
    pub block_prefix: u8,
}

/// A subnet's `cidr` that [`parse_cidr`] rejects. The message starts with the field's name:
/// not every reader of it shows serde's error path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cidr {cidr:?} is not a CIDR: {why}")]
pub struct InvalidCidr {
    pub cidr: String,
    /// What is wrong with it, and what to write instead.
    pub why: &'static str,
}

/// Parses a subnet's CIDR as strictly as the Kubernetes CEL library the admission policy uses
/// (Go's `netip.ParsePrefix`): no IPv4 octets or prefix lengths with leading zeros, no IPv6
/// zones, no IPv4-mapped IPv6 addresses.
pub fn parse_cidr(text: &str) -> Result<IpNet, InvalidCidr> {
    let bad = |why| InvalidCidr {
        cidr: text.to_string(),
        why,
    };
    let (addr, bits) = text
        .rsplit_once('/')
        .ok_or_else(|| bad("no prefix length (like 10.244.0.0/16)"))?;
    let addr: std::net::IpAddr = addr.parse().map_err(|_| {
        bad("not an IPv4 or IPv6 address (no leading zeros in IPv4 octets, no zones)")
    })?;
    if let std::net::IpAddr::V6(v6) = addr {
        if v6.to_ipv4_mapped().is_some() {
            return Err(bad("an IPv4-mapped IPv6 address; write the IPv4 subnet"));
        }
    }
    let bits = match bits.parse::<u8>() {
        Ok(b) if bits == b.to_string() => b,
        _ => {
            return Err(bad(
                "the prefix length is not a number without leading zeros",
            ))
        }
    };
    IpNet::new(addr, bits).map_err(|_| bad("the prefix length is too long for the address"))
}

fn deserialize_cidr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<IpNet, D::Error> {
    parse_cidr(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

/// An isolated L3 domain. On each node it is one VRF.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(kube::CustomResource, schemars::JsonSchema))]
#[cfg_attr(
    feature = "kube",
    kube(
        group = "lace.io",
        version = "v1alpha1",
        kind = "Network",
        status = "NetworkStatus",
        shortname = "lnet",
        printcolumn = r#"{"name":"External","type":"boolean","jsonPath":".spec.external"}"#,
        printcolumn = r#"{"name":"Subnets","type":"string","jsonPath":".spec.subnets[*].cidr"}"#,
        printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    /// At most one IPv4 and one IPv6 subnet. Empty for an external Network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<Subnet>,
    /// An external Network stands for everything outside the cluster (e.g. `internet`).
    /// Pods are never bound to it; Services may be, and traffic to it uses host routing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub external: bool,
    /// The nodes' own processes (hostNetwork pods, node daemons) may open connections to this
    /// Network's pods on every node, as the Kubernetes network model assumes. Off by default:
    /// a Network is then closed to the host except for the kubelet's probes of local pods.
    /// NetworkPolicy still applies to connections from other nodes (by their InternalIPs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_access: bool,
}

/// A Kubernetes-style condition (`metav1.Condition`), kept kube-free.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// One CamelCase word for machines (`Allocated`, `Invalid`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// What a person needs to know, naming the fix for a failure.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The `metadata.generation` of the spec this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Status of a Network, written by the controller.
///
/// Conditions only: per-node counts (blocks or addresses in use) would change with every node
/// that joins, and every agent watches Networks, so each join would cost one event per
/// Network on every node. How many nodes a Network can serve is in the condition messages.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    /// `Ready` (the Network has its SID function; or why not: `Invalid`,
    /// `SidFunctionsExhausted`) and `BlocksExhausted` (some nodes hold no block of it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Status shared by the policy kinds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// `Ready`, or why not (`Invalid`, with the validator's message naming the field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The operator of a label selector requirement, as in Kubernetes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// A Kubernetes label selector. The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// Binds pods to one Network. The highest priority wins; ties break by policy name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(kube::CustomResource, schemars::JsonSchema))]
#[cfg_attr(
    feature = "kube",
    kube(
        group = "lace.io",
        version = "v1alpha1",
        kind = "NetworkBindingPolicy",
        status = "PolicyStatus",
        shortname = "lnbp",
        printcolumn = r#"{"name":"Network","type":"string","jsonPath":".spec.network"}"#,
        printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkBindingPolicySpec {
    /// The Network matching pods are bound to.
    pub network: String,
    /// `PRIORITY_MIN..=PRIORITY_MAX`; higher wins.
    #[serde(default)]
    pub priority: i32,
    /// Namespaces whose pods this policy considers; empty matches all.
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    /// Pods (within those namespaces) this policy binds; empty matches all.
    #[serde(default)]
    pub pod_selector: LabelSelector,
}

/// A Service named by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
}

/// Binds Services to one Network. Binding alone grants no reachability.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(kube::CustomResource, schemars::JsonSchema))]
#[cfg_attr(
    feature = "kube",
    kube(
        group = "lace.io",
        version = "v1alpha1",
        kind = "ServiceBindingPolicy",
        status = "PolicyStatus",
        shortname = "lsbp",
        printcolumn = r#"{"name":"Network","type":"string","jsonPath":".spec.network"}"#,
        printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBindingPolicySpec {
    pub network: String,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    #[serde(default)]
    pub service_selector: LabelSelector,
    /// Services named explicitly; when non-empty the selectors are ignored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceRef>,
}

/// Lets pods of Network `from` open connections to pods (or, for an external Network, to
/// destinations) of Network `to`. `from == to` is what makes a Network reach itself. Replies
/// flow back; the reverse direction needs its own policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(kube::CustomResource, schemars::JsonSchema))]
#[cfg_attr(
    feature = "kube",
    kube(
        group = "lace.io",
        version = "v1alpha1",
        kind = "NetworkRoutingPolicy",
        status = "PolicyStatus",
        shortname = "lnrp",
        printcolumn = r#"{"name":"From","type":"string","jsonPath":".spec.from"}"#,
        printcolumn = r#"{"name":"To","type":"string","jsonPath":".spec.to"}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRoutingPolicySpec {
    pub from: String,
    pub to: String,
}

/// Lets pods of Network `from` reach the Services bound to Network `to` that the selectors
/// (or `services`) pick, and through them their backends wherever they live. The keys shared
/// with [`NetworkRoutingPolicySpec`] are the same, so one chart entry can render to both.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(kube::CustomResource, schemars::JsonSchema))]
#[cfg_attr(
    feature = "kube",
    kube(
        group = "lace.io",
        version = "v1alpha1",
        kind = "ServiceRoutingPolicy",
        status = "PolicyStatus",
        shortname = "lsrp",
        printcolumn = r#"{"name":"From","type":"string","jsonPath":".spec.from"}"#,
        printcolumn = r#"{"name":"To","type":"string","jsonPath":".spec.to"}"#,
        printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRoutingPolicySpec {
    pub from: String,
    pub to: String,
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    #[serde(default)]
    pub service_selector: LabelSelector,
    /// Services named explicitly; when non-empty the selectors are ignored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceRef>,
}

/// Internal, derived by the controller per Network: its SID function, which is also what the
/// VRF table id on every node is derived from. Owned by the Network.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(kube::CustomResource, schemars::JsonSchema))]
#[cfg_attr(
    feature = "kube",
    kube(
        group = "lace.io",
        version = "v1alpha1",
        kind = "NetworkAllocation",
        shortname = "lnetalloc",
        printcolumn = r#"{"name":"Function","type":"integer","jsonPath":".spec.function"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkAllocationSpec {
    /// The SID function (16 bits) of this Network on every node's locator.
    pub function: u16,
}

/// Internal, derived by the controller per Node: its index, locator and underlay addresses.
/// Owned by the Node.
///
/// The node's address blocks are not listed: node `index` holds block `index - 1` of every
/// subnet of every Network ([`crate::alloc::node_blocks`]). So a new Network costs one
/// NetworkAllocation and no NodeAllocation write, a new node one NodeAllocation, and every
/// object stays a few hundred bytes however many nodes and Networks the cluster has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(kube::CustomResource, schemars::JsonSchema))]
#[cfg_attr(
    feature = "kube",
    kube(
        group = "lace.io",
        version = "v1alpha1",
        kind = "NodeAllocation",
        shortname = "lnodealloc",
        printcolumn = r#"{"name":"Index","type":"integer","jsonPath":".spec.index"}"#,
        printcolumn = r#"{"name":"Locator","type":"string","jsonPath":".spec.locator"}"#,
        printcolumn = r#"{"name":"IPv4","type":"string","jsonPath":".spec.underlay.ipv4"}"#,
        printcolumn = r#"{"name":"IPv6","type":"string","jsonPath":".spec.underlay.ipv6"}"#
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeAllocationSpec {
    /// Stable index of the node within the locator prefix (from 1); also the number of its
    /// address blocks (block `index - 1` of each subnet).
    pub index: u32,
    /// The node's SRv6 locator, carved from `srv6LocatorPrefix`.
    #[cfg_attr(feature = "kube", schemars(with = "String"))]
    pub locator: ipnet::Ipv6Net,
    /// Where the other nodes reach this node: its InternalIPs.
    pub underlay: Underlay,
}

/// A node's underlay addresses: its first InternalIP of each family. At least one is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
pub struct Underlay {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<std::net::Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<std::net::Ipv6Addr>,
}
