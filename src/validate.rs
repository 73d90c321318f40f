//! Validation of the Lace API objects: the one source of truth for what is valid.
//!
//! The chart's ValidatingAdmissionPolicy mirrors these rules in CEL, so each rule is kept
//! simple: a check on one object, or on one object against the set of Networks. Every error
//! names the object and the field (`Network/system: spec.subnets[0].cidr`) and says what is
//! wrong.
//!
//! Per-object functions (`validate_network`, `validate_network_binding_policy`, ...) serve the
//! admission path; [`validate_cluster`] runs all of them (plus the cross-object rules) over a
//! whole [`ClusterState`] and returns every error, sorted.

use std::collections::BTreeMap;
use std::fmt;

use ipnet::IpNet;

use crate::api::{
    LabelSelector, NetworkAllocationSpec, NetworkBindingPolicySpec, NetworkRoutingPolicySpec,
    NetworkSpec, NodeAllocationSpec, SelectorOperator, ServiceBindingPolicySpec,
    ServiceRoutingPolicySpec, Subnet, PRIORITY_MAX, PRIORITY_MIN,
};
use crate::sid;

mod netpol;
use crate::state::{ClusterConfig, ClusterState};

/// One violated rule: where (`Kind/name: field.path`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ValidationError {
    /// Object and field, e.g. `Network/system: spec.subnets[0].cidr`.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

/// Path prefix of the cluster configuration (the chart value `controller.srv6LocatorPrefix`,
/// or the `lace-config` ConfigMap in standalone mode).
const CONFIG_PATH: &str = "config: srv6LocatorPrefix";

/// Collects errors for one object; the path prefix is `Kind/name`.
struct Errors<'a> {
    object: String,
    out: &'a mut Vec<ValidationError>,
}

impl<'a> Errors<'a> {
    fn new(kind: &str, name: &str, out: &'a mut Vec<ValidationError>) -> Self {
        Self {
            object: format!("{kind}/{name}"),
            out,
        }
    }

    fn push(&mut self, field: impl fmt::Display, message: impl Into<String>) {
        self.out.push(ValidationError {
            path: format!("{}: {field}", self.object),
            message: message.into(),
        });
    }
}

fn finish(mut errors: Vec<ValidationError>) -> Result<(), Vec<ValidationError>> {
    if errors.is_empty() {
        return Ok(());
    }
    errors.sort();
    errors.dedup();
    Err(errors)
}

/// Validates everything in `state`: each object on its own, references between objects,
/// overlaps between Networks and the locator prefix against the number of nodes.
pub fn validate_cluster(state: &ClusterState) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    for (name, spec) in &state.networks {
        check_network(name, spec, &mut out);
    }
    check_networks_disjoint(&state.networks, &mut out);
    for (name, spec) in &state.network_bindings {
        check_network_binding_policy(name, spec, &state.networks, &mut out);
    }
    for (name, spec) in &state.service_bindings {
        check_service_binding_policy(name, spec, &state.networks, &mut out);
    }
    for (name, spec) in &state.network_routes {
        check_network_routing_policy(name, spec, &state.networks, &mut out);
    }
    for (name, spec) in &state.service_routes {
        check_service_routing_policy(name, spec, &state.networks, &mut out);
    }
    for (key, spec) in &state.network_policies {
        netpol::check_network_policy(&key.to_string(), spec, &mut out);
    }
    check_config(&state.config, state.nodes.len(), &state.networks, &mut out);
    finish(out)
}

/// A Lace object [`admit`] left out, with every reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// `Network`, `NetworkBindingPolicy`, ...
    pub kind: &'static str,
    pub name: String,
    pub errors: Vec<ValidationError>,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errors: Vec<String> = self.errors.iter().map(ToString::to_string).collect();
        write!(f, "{}", errors.join("; "))
    }
}

/// `state` without the Lace objects that fail validation, so one bad object never takes the
/// rest down (the agent and the controller act on the rest and report the rejected).
///
/// - A Network with an invalid spec is left out. Of two Networks whose subnets overlap, the
///   one that came later is: Networks with a NetworkAllocation (already in use; by SID
///   function, the order they were allocated in) before those without one (by name). So a
///   new Network can never push out one that pods already use, and the result depends only on
///   the objects, not on the order they arrived in.
/// - A policy is checked against the admitted Networks: one naming a missing or left-out
///   Network, or with an invalid selector or priority, is left out.
/// - A NetworkPolicy the API server would have refused (it may come from a YAML file), or
///   with a `policyTypes` value Lace does not know, is left out as a whole, like Lace's own
///   kinds: its pods are then not isolated by it, which the log line and the metric say.
///
/// The cluster configuration (`srv6LocatorPrefix`) is not judged here: only the allocator
/// uses it, and [`validate_cluster`] reports it.
pub fn admit(mut state: ClusterState) -> (ClusterState, Vec<Rejected>) {
    let mut rejected = Vec::new();
    let mut reject = |kind: &'static str, name: &str, errors: Vec<ValidationError>| {
        rejected.push(Rejected {
            kind,
            name: name.to_string(),
            errors,
        });
    };
    // Networks: each on its own, then overlaps in admission order.
    let mut order: Vec<(&String, &NetworkSpec)> = state.networks.iter().collect();
    order.sort_by_key(|(name, _)| {
        let function = state.network_allocations.get(*name).map(|a| a.function);
        (function.is_none(), function, (*name).clone())
    });
    let mut admitted: Vec<(&str, IpNet)> = Vec::new();
    let mut left_out: Vec<String> = Vec::new();
    for (name, spec) in order {
        let mut errors = Vec::new();
        check_network(name, spec, &mut errors);
        if errors.is_empty() && !spec.external {
            for (i, subnet) in spec.subnets.iter().enumerate() {
                let cidr = subnet.cidr.trunc();
                if let Some((other, other_cidr)) = admitted
                    .iter()
                    .find(|(_, o)| o.contains(&cidr.network()) || cidr.contains(&o.network()))
                {
                    Errors::new("Network", name, &mut errors).push(
                        format_args!("spec.subnets[{i}].cidr"),
                        format!(
                            "{cidr} overlaps {other_cidr} of Network {other}, which came first"
                        ),
                    );
                }
            }
        }
        if errors.is_empty() {
            admitted.extend(spec.subnets.iter().map(|s| (name.as_str(), s.cidr.trunc())));
        } else {
            errors.sort();
            reject("Network", name, errors);
            left_out.push(name.clone());
        }
    }
    for name in &left_out {
        state.networks.remove(name);
    }
    // Policies against the admitted Networks.
    fn retain<S>(
        kind: &'static str,
        map: &mut BTreeMap<String, S>,
        check: impl Fn(&str, &S, &mut Vec<ValidationError>),
        reject: &mut impl FnMut(&'static str, &str, Vec<ValidationError>),
    ) {
        map.retain(|name, spec| {
            let mut errors = Vec::new();
            check(name, spec, &mut errors);
            errors.sort();
            let ok = errors.is_empty();
            if !ok {
                reject(kind, name, errors);
            }
            ok
        });
    }
    let networks = state.networks.clone();
    retain(
        "NetworkBindingPolicy",
        &mut state.network_bindings,
        |n, s, o| check_network_binding_policy(n, s, &networks, o),
        &mut reject,
    );
    retain(
        "ServiceBindingPolicy",
        &mut state.service_bindings,
        |n, s, o| check_service_binding_policy(n, s, &networks, o),
        &mut reject,
    );
    retain(
        "NetworkRoutingPolicy",
        &mut state.network_routes,
        |n, s, o| check_network_routing_policy(n, s, &networks, o),
        &mut reject,
    );
    retain(
        "ServiceRoutingPolicy",
        &mut state.service_routes,
        |n, s, o| check_service_routing_policy(n, s, &networks, o),
        &mut reject,
    );
    state.network_policies.retain(|key, spec| {
        let mut errors = Vec::new();
        netpol::check_network_policy(&key.to_string(), spec, &mut errors);
        errors.sort();
        let ok = errors.is_empty();
        if !ok {
            reject("NetworkPolicy", &key.to_string(), errors);
        }
        ok
    });
    (state, rejected)
}

/// Validates one Network on its own (subnets, block sizes, `external`).
pub fn validate_network(name: &str, spec: &NetworkSpec) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    check_network(name, spec, &mut out);
    finish(out)
}

/// Validates that no two non-external Networks have overlapping subnets. For admission of a
/// new Network, pass the existing Networks with the new one inserted.
pub fn validate_networks_disjoint(
    networks: &BTreeMap<String, NetworkSpec>,
) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    check_networks_disjoint(networks, &mut out);
    finish(out)
}

/// Validates a NetworkBindingPolicy against the existing Networks.
pub fn validate_network_binding_policy(
    name: &str,
    spec: &NetworkBindingPolicySpec,
    networks: &BTreeMap<String, NetworkSpec>,
) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    check_network_binding_policy(name, spec, networks, &mut out);
    finish(out)
}

/// Validates a ServiceBindingPolicy against the existing Networks.
pub fn validate_service_binding_policy(
    name: &str,
    spec: &ServiceBindingPolicySpec,
    networks: &BTreeMap<String, NetworkSpec>,
) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    check_service_binding_policy(name, spec, networks, &mut out);
    finish(out)
}

/// Validates a NetworkRoutingPolicy against the existing Networks.
pub fn validate_network_routing_policy(
    name: &str,
    spec: &NetworkRoutingPolicySpec,
    networks: &BTreeMap<String, NetworkSpec>,
) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    check_network_routing_policy(name, spec, networks, &mut out);
    finish(out)
}

/// Validates a ServiceRoutingPolicy against the existing Networks.
pub fn validate_service_routing_policy(
    name: &str,
    spec: &ServiceRoutingPolicySpec,
    networks: &BTreeMap<String, NetworkSpec>,
) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    check_service_routing_policy(name, spec, networks, &mut out);
    finish(out)
}

/// Validates the cluster configuration for a cluster of `node_count` nodes and these
/// `networks`: the locator prefix must leave 32 bits for SID function + argument, enough node
/// bits for every node, and must not overlap a Network's subnet (a SID would then also be a
/// pod address). Admission of a new Network should run this too.
pub fn validate_config(
    config: &ClusterConfig,
    node_count: usize,
    networks: &BTreeMap<String, NetworkSpec>,
) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    check_config(config, node_count, networks, &mut out);
    finish(out)
}

/// Validates an update of a Network: `subnets` and `external` are immutable (pods hold
/// addresses from the subnets, and nodes hold blocks of them).
pub fn validate_network_update(
    name: &str,
    old: &NetworkSpec,
    new: &NetworkSpec,
) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    let mut e = Errors::new("Network", name, &mut out);
    if old.subnets != new.subnets {
        e.push("spec.subnets", "field is immutable");
    }
    if old.external != new.external {
        e.push("spec.external", "field is immutable");
    }
    check_network(name, new, &mut out);
    finish(out)
}

/// Validates an update of a NetworkAllocation: the SID function is immutable (every node's
/// SIDs and VRF tables derive from it).
pub fn validate_network_allocation_update(
    name: &str,
    old: &NetworkAllocationSpec,
    new: &NetworkAllocationSpec,
) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    if old.function != new.function {
        Errors::new("NetworkAllocation", name, &mut out)
            .push("spec.function", "field is immutable");
    }
    finish(out)
}

/// Validates an update of a NodeAllocation: the index and the locator are immutable (other
/// nodes encapsulate towards the locator, and the node's blocks derive from the index).
/// The underlay may change.
pub fn validate_node_allocation_update(
    name: &str,
    old: &NodeAllocationSpec,
    new: &NodeAllocationSpec,
) -> Result<(), Vec<ValidationError>> {
    let mut out = Vec::new();
    let mut e = Errors::new("NodeAllocation", name, &mut out);
    if old.index != new.index {
        e.push("spec.index", "field is immutable");
    }
    if old.locator != new.locator {
        e.push("spec.locator", "field is immutable");
    }
    finish(out)
}

fn family(net: &IpNet) -> &'static str {
    match net {
        IpNet::V4(_) => "IPv4",
        IpNet::V6(_) => "IPv6",
    }
}

fn check_network(name: &str, spec: &NetworkSpec, out: &mut Vec<ValidationError>) {
    let mut e = Errors::new("Network", name, out);
    if spec.external && !spec.subnets.is_empty() {
        e.push(
            "spec.subnets",
            "an external Network must not have subnets (it stands for everything outside the cluster)",
        );
    }
    if spec.external && spec.host_access {
        e.push(
            "spec.hostAccess",
            "an external Network has no pods for the nodes to reach: remove hostAccess (or external)",
        );
    }
    if !spec.external && spec.subnets.is_empty() {
        e.push(
            "spec.subnets",
            "a Network needs an IPv4 and/or an IPv6 subnet (or external: true)",
        );
    }
    let mut seen_v4 = false;
    let mut seen_v6 = false;
    for (i, subnet) in spec.subnets.iter().enumerate() {
        let seen = match subnet.cidr {
            IpNet::V4(_) => &mut seen_v4,
            IpNet::V6(_) => &mut seen_v6,
        };
        if *seen {
            e.push(
                format_args!("spec.subnets[{i}]"),
                format!(
                    "a second {} subnet ({}): a Network has at most one IPv4 and one IPv6 subnet",
                    family(&subnet.cidr),
                    subnet.cidr
                ),
            );
        }
        *seen = true;
        check_subnet(i, subnet, &mut e);
    }
}

fn check_subnet(i: usize, subnet: &Subnet, e: &mut Errors<'_>) {
    let cidr = subnet.cidr;
    if cidr.trunc() != cidr {
        e.push(
            format_args!("spec.subnets[{i}].cidr"),
            format!("{cidr} has host bits set (did you mean {}?)", cidr.trunc()),
        );
    }
    let block = subnet.block_prefix;
    let max = cidr.max_prefix_len();
    let field = format!("spec.subnets[{i}].blockPrefix");
    if block < cidr.prefix_len() {
        e.push(
            field,
            format!("blockPrefix {block} is shorter than the prefix of subnet {cidr}: a block must fit in the subnet"),
        );
    } else if block > max {
        e.push(
            field,
            format!(
                "blockPrefix {block} is longer than /{max}, the longest {} prefix",
                family(&cidr)
            ),
        );
    } else if block == max {
        e.push(
            field,
            format!("blockPrefix {block} leaves no usable addresses: a block needs at least 2 addresses (/{} or shorter)", max - 1),
        );
    }
}

fn check_networks_disjoint(
    networks: &BTreeMap<String, NetworkSpec>,
    out: &mut Vec<ValidationError>,
) {
    // Flatten (network, subnet index, cidr) of non-external Networks, in name order; each
    // overlap is reported once, on the later Network by name.
    let subnets: Vec<(&str, usize, IpNet)> = networks
        .iter()
        .filter(|(_, spec)| !spec.external)
        .flat_map(|(name, spec)| {
            spec.subnets
                .iter()
                .enumerate()
                .map(move |(i, s)| (name.as_str(), i, s.cidr.trunc()))
        })
        .collect();
    for (later, &(name, i, cidr)) in subnets.iter().enumerate() {
        for &(other, _, other_cidr) in &subnets[..later] {
            let overlaps =
                other_cidr.contains(&cidr.network()) || cidr.contains(&other_cidr.network());
            if other != name && overlaps {
                Errors::new("Network", name, out).push(
                    format_args!("spec.subnets[{i}].cidr"),
                    format!("{cidr} overlaps {other_cidr} of Network {other}"),
                );
            }
        }
    }
}

fn check_priority(priority: i32, e: &mut Errors<'_>) {
    if !(PRIORITY_MIN..=PRIORITY_MAX).contains(&priority) {
        e.push(
            "spec.priority",
            format!("priority {priority} is outside {PRIORITY_MIN}..={PRIORITY_MAX}"),
        );
    }
}

fn check_network_ref(
    field: &str,
    network: &str,
    networks: &BTreeMap<String, NetworkSpec>,
    e: &mut Errors<'_>,
) -> Option<bool> {
    match networks.get(network) {
        Some(spec) => Some(spec.external),
        None => {
            e.push(field, format!("Network {network:?} does not exist"));
            None
        }
    }
}

fn check_selector(field: &str, selector: &LabelSelector, e: &mut Errors<'_>) {
    for (i, req) in selector.match_expressions.iter().enumerate() {
        let path = format!("{field}.matchExpressions[{i}].values");
        match req.operator {
            SelectorOperator::In | SelectorOperator::NotIn if req.values.is_empty() => {
                e.push(
                    path,
                    format!("operator {:?} needs at least one value", req.operator),
                );
            }
            SelectorOperator::Exists | SelectorOperator::DoesNotExist if !req.values.is_empty() => {
                e.push(
                    path,
                    format!("operator {:?} must not have values", req.operator),
                );
            }
            _ => {}
        }
    }
}

fn check_network_binding_policy(
    name: &str,
    spec: &NetworkBindingPolicySpec,
    networks: &BTreeMap<String, NetworkSpec>,
    out: &mut Vec<ValidationError>,
) {
    let mut e = Errors::new("NetworkBindingPolicy", name, out);
    if check_network_ref("spec.network", &spec.network, networks, &mut e) == Some(true) {
        e.push(
            "spec.network",
            format!(
                "pods cannot be bound to the external Network {:?} (only Services can)",
                spec.network
            ),
        );
    }
    check_priority(spec.priority, &mut e);
    check_selector("spec.namespaceSelector", &spec.namespace_selector, &mut e);
    check_selector("spec.podSelector", &spec.pod_selector, &mut e);
}

fn check_service_binding_policy(
    name: &str,
    spec: &ServiceBindingPolicySpec,
    networks: &BTreeMap<String, NetworkSpec>,
    out: &mut Vec<ValidationError>,
) {
    let mut e = Errors::new("ServiceBindingPolicy", name, out);
    check_network_ref("spec.network", &spec.network, networks, &mut e);
    check_priority(spec.priority, &mut e);
    check_selector("spec.namespaceSelector", &spec.namespace_selector, &mut e);
    check_selector("spec.serviceSelector", &spec.service_selector, &mut e);
}

fn check_network_routing_policy(
    name: &str,
    spec: &NetworkRoutingPolicySpec,
    networks: &BTreeMap<String, NetworkSpec>,
    out: &mut Vec<ValidationError>,
) {
    let mut e = Errors::new("NetworkRoutingPolicy", name, out);
    check_network_ref("spec.from", &spec.from, networks, &mut e);
    check_network_ref("spec.to", &spec.to, networks, &mut e);
}

fn check_service_routing_policy(
    name: &str,
    spec: &ServiceRoutingPolicySpec,
    networks: &BTreeMap<String, NetworkSpec>,
    out: &mut Vec<ValidationError>,
) {
    let mut e = Errors::new("ServiceRoutingPolicy", name, out);
    check_network_ref("spec.from", &spec.from, networks, &mut e);
    check_network_ref("spec.to", &spec.to, networks, &mut e);
    check_selector("spec.namespaceSelector", &spec.namespace_selector, &mut e);
    check_selector("spec.serviceSelector", &spec.service_selector, &mut e);
}

fn check_config(
    config: &ClusterConfig,
    node_count: usize,
    networks: &BTreeMap<String, NetworkSpec>,
    out: &mut Vec<ValidationError>,
) {
    let Some(prefix) = config.srv6_locator_prefix else {
        return;
    };
    let mut push = |message: String| {
        out.push(ValidationError {
            path: CONFIG_PATH.to_string(),
            message,
        });
    };
    match sid::max_node_index(prefix) {
        Err(err) => push(err.to_string()),
        Ok(max) if usize::try_from(max).is_ok_and(|max| max < node_count) => push(format!(
            "srv6LocatorPrefix {prefix} has {} node bits, room for {max} nodes, but the cluster has {node_count}",
            sid::LOCATOR_LEN - prefix.prefix_len()
        )),
        Ok(_) => {}
    }
    let prefix = IpNet::V6(prefix.trunc());
    for (name, spec) in networks.iter().filter(|(_, spec)| !spec.external) {
        for subnet in &spec.subnets {
            let cidr = subnet.cidr.trunc();
            if prefix.contains(&cidr.network()) || cidr.contains(&prefix.network()) {
                push(format!(
                    "srv6LocatorPrefix {prefix} overlaps subnet {cidr} of Network {name}"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests;
