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
mod tests {
    use super::*;
    use crate::api::{SelectorRequirement, ServiceRef};
    use crate::state::Node;

    fn subnet(cidr: &str, block_prefix: u8) -> Subnet {
        Subnet {
            cidr: cidr.parse().unwrap(),
            block_prefix,
        }
    }

    fn mk_network(subnets: &[(&str, u8)]) -> NetworkSpec {
        NetworkSpec {
            subnets: subnets.iter().map(|(c, b)| subnet(c, *b)).collect(),
            external: false,
        }
    }

    fn mk_binding(network: &str, priority: i32) -> NetworkBindingPolicySpec {
        NetworkBindingPolicySpec {
            network: network.into(),
            priority,
            ..Default::default()
        }
    }

    fn mk_route(from: &str, to: &str) -> NetworkRoutingPolicySpec {
        NetworkRoutingPolicySpec {
            from: from.into(),
            to: to.into(),
        }
    }

    fn req(op: SelectorOperator, values: &[&str]) -> SelectorRequirement {
        SelectorRequirement {
            key: "k".into(),
            operator: op,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    /// A small valid cluster the failing examples each break in one way.
    fn valid_state() -> ClusterState {
        let mut s = ClusterState::default();
        s.config.srv6_locator_prefix = Some("2001:db8:100::/48".parse().unwrap());
        s.networks.insert(
            "system".into(),
            mk_network(&[("10.244.0.0/18", 24), ("fd00:244::/56", 64)]),
        );
        s.networks
            .insert("default".into(), mk_network(&[("10.244.64.0/18", 24)]));
        s.networks.insert(
            "internet".into(),
            NetworkSpec {
                subnets: vec![],
                external: true,
            },
        );
        s.network_bindings
            .insert("system".into(), mk_binding("system", 1000));
        s.network_bindings
            .insert("default".into(), mk_binding("default", 0));
        s.service_bindings.insert(
            "kubernetes".into(),
            ServiceBindingPolicySpec {
                network: "internet".into(),
                services: vec![ServiceRef {
                    namespace: "default".into(),
                    name: "kubernetes".into(),
                }],
                ..Default::default()
            },
        );
        s.network_routes
            .insert("system-system".into(), mk_route("system", "system"));
        s.network_routes
            .insert("default-internet".into(), mk_route("default", "internet"));
        s.service_routes.insert(
            "system-kubernetes".into(),
            ServiceRoutingPolicySpec {
                from: "system".into(),
                to: "internet".into(),
                ..Default::default()
            },
        );
        for n in ["node-1", "node-2", "node-3"] {
            s.nodes.insert(n.into(), Node::default());
        }
        s
    }

    fn messages(state: &ClusterState) -> Vec<String> {
        match validate_cluster(state) {
            Ok(()) => vec![],
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn the_valid_examples_pass() {
        assert_eq!(messages(&valid_state()), Vec::<String>::new());
        // Boundaries that are still valid: priorities at both ends, a /31 block, /96 prefix
        // for 0 nodes, a block as large as the subnet, an IPv6-only Network.
        let mut s = valid_state();
        s.network_bindings
            .insert("low".into(), mk_binding("default", PRIORITY_MIN));
        s.network_bindings
            .insert("high".into(), mk_binding("default", PRIORITY_MAX));
        s.networks.insert(
            "tiny".into(),
            mk_network(&[("192.168.0.0/30", 31), ("fd01::/64", 64)]),
        );
        s.networks
            .insert("v6only".into(), mk_network(&[("fd02::/48", 127)]));
        assert_eq!(messages(&s), Vec::<String>::new());
        s.nodes.clear();
        s.config.srv6_locator_prefix = Some("fd00::/96".parse().unwrap());
        assert_eq!(messages(&s), Vec::<String>::new());
    }

    #[test]
    fn every_rule_has_a_failing_example_with_its_message() {
        type Breaker = fn(&mut ClusterState);
        let cases: Vec<(&str, Breaker, Vec<&str>)> = vec![
            (
                "host bits",
                |s| { s.networks.insert("n".into(), mk_network(&[("10.1.0.1/16", 24)])); },
                vec!["Network/n: spec.subnets[0].cidr: 10.1.0.1/16 has host bits set (did you mean 10.1.0.0/16?)"],
            ),
            (
                "two IPv4 subnets",
                |s| { s.networks.insert("n".into(), mk_network(&[("10.1.0.0/16", 24), ("10.2.0.0/16", 24)])); },
                vec!["Network/n: spec.subnets[1]: a second IPv4 subnet (10.2.0.0/16): a Network has at most one IPv4 and one IPv6 subnet"],
            ),
            (
                "two IPv6 subnets",
                |s| { s.networks.insert("n".into(), mk_network(&[("fd01::/48", 64), ("fd02::/48", 64)])); },
                vec!["Network/n: spec.subnets[1]: a second IPv6 subnet (fd02::/48): a Network has at most one IPv4 and one IPv6 subnet"],
            ),
            (
                "external with subnets",
                |s| { s.networks.insert("n".into(), NetworkSpec { subnets: vec![subnet("10.1.0.0/16", 24)], external: true }); },
                vec!["Network/n: spec.subnets: an external Network must not have subnets (it stands for everything outside the cluster)"],
            ),
            (
                "no subnets",
                |s| { s.networks.insert("n".into(), mk_network(&[])); },
                vec!["Network/n: spec.subnets: a Network needs an IPv4 and/or an IPv6 subnet (or external: true)"],
            ),
            (
                "block shorter than subnet",
                |s| { s.networks.insert("n".into(), mk_network(&[("10.1.0.0/16", 8)])); },
                vec!["Network/n: spec.subnets[0].blockPrefix: blockPrefix 8 is shorter than the prefix of subnet 10.1.0.0/16: a block must fit in the subnet"],
            ),
            (
                "block longer than /32",
                |s| { s.networks.insert("n".into(), mk_network(&[("10.1.0.0/16", 33)])); },
                vec!["Network/n: spec.subnets[0].blockPrefix: blockPrefix 33 is longer than /32, the longest IPv4 prefix"],
            ),
            (
                "block longer than /128",
                |s| { s.networks.insert("n".into(), mk_network(&[("fd01::/48", 129)])); },
                vec!["Network/n: spec.subnets[0].blockPrefix: blockPrefix 129 is longer than /128, the longest IPv6 prefix"],
            ),
            (
                "block without usable addresses",
                |s| { s.networks.insert("n".into(), mk_network(&[("10.1.0.0/16", 32), ("fd01::/48", 128)])); },
                vec![
                    "Network/n: spec.subnets[0].blockPrefix: blockPrefix 32 leaves no usable addresses: a block needs at least 2 addresses (/31 or shorter)",
                    "Network/n: spec.subnets[1].blockPrefix: blockPrefix 128 leaves no usable addresses: a block needs at least 2 addresses (/127 or shorter)",
                ],
            ),
            (
                "overlapping subnets, reported on the later Network",
                |s| {
                    s.networks.insert("a".into(), mk_network(&[("10.244.0.0/16", 24)]));
                    s.networks.insert("z".into(), mk_network(&[("fd00:244:0:80::/57", 64)]));
                },
                vec![
                    "Network/default: spec.subnets[0].cidr: 10.244.64.0/18 overlaps 10.244.0.0/16 of Network a",
                    "Network/system: spec.subnets[0].cidr: 10.244.0.0/18 overlaps 10.244.0.0/16 of Network a",
                    "Network/z: spec.subnets[0].cidr: fd00:244:0:80::/57 overlaps fd00:244::/56 of Network system",
                ],
            ),
            (
                "priority too high",
                |s| { s.network_bindings.insert("p".into(), mk_binding("default", 1001)); },
                vec!["NetworkBindingPolicy/p: spec.priority: priority 1001 is outside 0..=1000"],
            ),
            (
                "priority too low on a ServiceBindingPolicy",
                |s| { s.service_bindings.get_mut("kubernetes").unwrap().priority = -1; },
                vec!["ServiceBindingPolicy/kubernetes: spec.priority: priority -1 is outside 0..=1000"],
            ),
            (
                "binding to a missing Network",
                |s| { s.network_bindings.insert("p".into(), mk_binding("nope", 1)); },
                vec!["NetworkBindingPolicy/p: spec.network: Network \"nope\" does not exist"],
            ),
            (
                "service binding to a missing Network",
                |s| { s.service_bindings.get_mut("kubernetes").unwrap().network = "nope".into(); },
                vec!["ServiceBindingPolicy/kubernetes: spec.network: Network \"nope\" does not exist"],
            ),
            (
                "pods bound to an external Network",
                |s| { s.network_bindings.insert("p".into(), mk_binding("internet", 1)); },
                vec!["NetworkBindingPolicy/p: spec.network: pods cannot be bound to the external Network \"internet\" (only Services can)"],
            ),
            (
                "routing from and to missing Networks",
                |s| { s.network_routes.insert("r".into(), mk_route("a", "b")); },
                vec![
                    "NetworkRoutingPolicy/r: spec.from: Network \"a\" does not exist",
                    "NetworkRoutingPolicy/r: spec.to: Network \"b\" does not exist",
                ],
            ),
            (
                "service routing to a missing Network",
                |s| { s.service_routes.get_mut("system-kubernetes").unwrap().to = "gone".into(); },
                vec!["ServiceRoutingPolicy/system-kubernetes: spec.to: Network \"gone\" does not exist"],
            ),
            (
                "In without values, Exists with values",
                |s| {
                    let mut p = mk_binding("default", 1);
                    p.namespace_selector.match_expressions = vec![req(SelectorOperator::In, &[]), req(SelectorOperator::In, &["x"])];
                    p.pod_selector.match_expressions = vec![req(SelectorOperator::Exists, &["x"])];
                    s.network_bindings.insert("p".into(), p);
                },
                vec![
                    "NetworkBindingPolicy/p: spec.namespaceSelector.matchExpressions[0].values: operator In needs at least one value",
                    "NetworkBindingPolicy/p: spec.podSelector.matchExpressions[0].values: operator Exists must not have values",
                ],
            ),
            (
                "NotIn without values, DoesNotExist with values",
                |s| {
                    let r = s.service_routes.get_mut("system-kubernetes").unwrap();
                    r.namespace_selector.match_expressions = vec![req(SelectorOperator::DoesNotExist, &[]), req(SelectorOperator::DoesNotExist, &["v"])];
                    r.service_selector.match_expressions = vec![req(SelectorOperator::NotIn, &[])];
                    let b = s.service_bindings.get_mut("kubernetes").unwrap();
                    b.service_selector.match_expressions = vec![req(SelectorOperator::NotIn, &[])];
                },
                vec![
                    "ServiceBindingPolicy/kubernetes: spec.serviceSelector.matchExpressions[0].values: operator NotIn needs at least one value",
                    "ServiceRoutingPolicy/system-kubernetes: spec.namespaceSelector.matchExpressions[1].values: operator DoesNotExist must not have values",
                    "ServiceRoutingPolicy/system-kubernetes: spec.serviceSelector.matchExpressions[0].values: operator NotIn needs at least one value",
                ],
            ),
            (
                "locator prefix longer than /96",
                |s| { s.config.srv6_locator_prefix = Some("2001:db8::/112".parse().unwrap()); },
                vec!["config: srv6LocatorPrefix: srv6LocatorPrefix 2001:db8::/112 leaves 16 bits for the SID function and arguments, at least 32 are needed (use /96 or shorter)"],
            ),
            (
                "locator prefix with host bits",
                |s| { s.config.srv6_locator_prefix = Some("2001:db8::1/64".parse().unwrap()); },
                vec!["config: srv6LocatorPrefix: srv6LocatorPrefix 2001:db8::1/64 has host bits set (did you mean 2001:db8::/64?)"],
            ),
            (
                "locator prefix overlapping a Network",
                |s| { s.config.srv6_locator_prefix = Some("fd00:244::/64".parse().unwrap()); },
                vec!["config: srv6LocatorPrefix: srv6LocatorPrefix fd00:244::/64 overlaps subnet fd00:244::/56 of Network system"],
            ),
            (
                "too few node bits",
                |s| { s.config.srv6_locator_prefix = Some("2001:db8::/95".parse().unwrap()); },
                vec!["config: srv6LocatorPrefix: srv6LocatorPrefix 2001:db8::/95 has 1 node bits, room for 1 nodes, but the cluster has 3"],
            ),
        ];
        for (what, brk, want) in cases {
            let mut s = valid_state();
            brk(&mut s);
            assert_eq!(messages(&s), want, "case: {what}");
        }
    }

    #[test]
    fn a_prefix_exactly_full_of_nodes_is_valid() {
        let mut s = valid_state();
        // /94 leaves 2 node bits: indices 1..=3 for the 3 nodes.
        s.config.srv6_locator_prefix = Some("2001:db8::/94".parse().unwrap());
        assert_eq!(messages(&s), Vec::<String>::new());
        s.nodes.insert("node-4".into(), Node::default());
        assert_eq!(
            messages(&s),
            ["config: srv6LocatorPrefix: srv6LocatorPrefix 2001:db8::/94 has 2 node bits, room for 3 nodes, but the cluster has 4"]
        );
    }

    #[test]
    fn per_object_functions_agree_with_the_cluster_check() {
        let s = valid_state();
        let bad = mk_network(&[("10.1.0.1/16", 24)]);
        let errs = validate_network("n", &bad).unwrap_err();
        assert_eq!(errs[0].path, "Network/n: spec.subnets[0].cidr");
        assert!(
            validate_network_binding_policy("p", &mk_binding("internet", 5), &s.networks).is_err()
        );
        assert!(
            validate_network_binding_policy("p", &mk_binding("system", 5), &s.networks).is_ok()
        );
        assert!(
            validate_network_routing_policy("r", &mk_route("system", "x"), &s.networks).is_err()
        );
        let mut nets = s.networks.clone();
        nets.insert("new".into(), mk_network(&[("10.244.1.0/24", 26)]));
        assert_eq!(
            validate_networks_disjoint(&nets).unwrap_err()[0].to_string(),
            "Network/system: spec.subnets[0].cidr: 10.244.0.0/18 overlaps 10.244.1.0/24 of Network new"
        );
        assert!(validate_config(&s.config, 3, &s.networks).is_ok());
    }

    #[test]
    fn immutable_fields_cannot_change() {
        let old = mk_network(&[("10.1.0.0/16", 24)]);
        assert!(validate_network_update("n", &old, &old).is_ok());
        let new = mk_network(&[("10.2.0.0/16", 24)]);
        assert_eq!(
            validate_network_update("n", &old, &new)
                .unwrap_err()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["Network/n: spec.subnets: field is immutable"]
        );
        let ext = NetworkSpec {
            subnets: vec![],
            external: true,
        };
        assert_eq!(
            validate_network_update("n", &old, &ext)
                .unwrap_err()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "Network/n: spec.external: field is immutable",
                "Network/n: spec.subnets: field is immutable",
            ]
        );
        let f1 = NetworkAllocationSpec { function: 1 };
        let f2 = NetworkAllocationSpec { function: 2 };
        assert!(validate_network_allocation_update("n", &f1, &f1).is_ok());
        assert_eq!(
            validate_network_allocation_update("n", &f1, &f2).unwrap_err()[0].to_string(),
            "NetworkAllocation/n: spec.function: field is immutable"
        );
        let a = NodeAllocationSpec {
            index: 1,
            locator: "2001:db8:100::1:0:0/96".parse().unwrap(),
            underlay: crate::api::Underlay {
                ipv4: None,
                ipv6: Some("fd00:fab::1".parse().unwrap()),
            },
        };
        let mut moved_underlay = a.clone();
        moved_underlay.underlay.ipv6 = Some("fd00:fab::9".parse().unwrap());
        moved_underlay.underlay.ipv4 = Some("192.168.0.1".parse().unwrap());
        assert!(validate_node_allocation_update("node-1", &a, &moved_underlay).is_ok());
        let mut b = a.clone();
        b.index = 2;
        b.locator = "2001:db8:100::2:0:0/96".parse().unwrap();
        assert_eq!(
            validate_node_allocation_update("node-1", &a, &b)
                .unwrap_err()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "NodeAllocation/node-1: spec.index: field is immutable",
                "NodeAllocation/node-1: spec.locator: field is immutable",
            ]
        );
    }

    #[test]
    fn admit_leaves_out_only_the_bad_objects_and_says_why() {
        let mut s = ClusterState::default();
        // "aaa" sorts first but arrived last (no allocation): it is the one left out.
        s.networks
            .insert("system".into(), mk_network(&[("10.244.0.0/18", 24)]));
        s.networks
            .insert("aaa".into(), mk_network(&[("10.244.1.0/24", 26)]));
        s.network_allocations
            .insert("system".into(), NetworkAllocationSpec { function: 3 });
        // b overlaps c; neither allocated: the later name (c) goes. d overlaps only c, so it
        // stays (c is out, it pushes nothing out).
        s.networks
            .insert("b".into(), mk_network(&[("10.1.0.0/16", 24)]));
        s.networks.insert(
            "c".into(),
            mk_network(&[("10.1.0.0/17", 24), ("fd00:2::/48", 64)]),
        );
        s.networks
            .insert("d".into(), mk_network(&[("fd00:2::/56", 64)]));
        s.networks
            .insert("bad".into(), mk_network(&[("10.9.0.1/16", 24)]));
        s.network_bindings
            .insert("to-aaa".into(), mk_binding("aaa", 10));
        s.network_bindings
            .insert("to-system".into(), mk_binding("system", 10));
        s.network_bindings
            .insert("too-high".into(), mk_binding("system", 5000));
        s.network_routes.insert("b-b".into(), mk_route("b", "b"));
        s.network_routes.insert("b-c".into(), mk_route("b", "c"));
        let (admitted, rejected) = admit(s.clone());
        assert_eq!(
            admitted.networks.keys().collect::<Vec<_>>(),
            ["b", "d", "system"]
        );
        assert_eq!(
            admitted.network_bindings.keys().collect::<Vec<_>>(),
            ["to-system"]
        );
        assert_eq!(admitted.network_routes.keys().collect::<Vec<_>>(), ["b-b"]);
        let lines: Vec<String> = rejected
            .iter()
            .map(|r| format!("{} {}: {r}", r.kind, r.name))
            .collect();
        assert_eq!(
            lines,
            [
                "Network aaa: Network/aaa: spec.subnets[0].cidr: 10.244.1.0/24 overlaps 10.244.0.0/18 of Network system, which came first",
                "Network bad: Network/bad: spec.subnets[0].cidr: 10.9.0.1/16 has host bits set (did you mean 10.9.0.0/16?)",
                "Network c: Network/c: spec.subnets[0].cidr: 10.1.0.0/17 overlaps 10.1.0.0/16 of Network b, which came first",
                "NetworkBindingPolicy to-aaa: NetworkBindingPolicy/to-aaa: spec.network: Network \"aaa\" does not exist",
                "NetworkBindingPolicy too-high: NetworkBindingPolicy/too-high: spec.priority: priority 5000 is outside 0..=1000",
                "NetworkRoutingPolicy b-c: NetworkRoutingPolicy/b-c: spec.to: Network \"c\" does not exist",
            ]
        );
        // What remains is valid, and admitting it again changes nothing.
        assert_eq!(validate_cluster(&admitted), Ok(()));
        let (again, none) = admit(admitted.clone());
        assert_eq!((again, none), (admitted, vec![]));
    }
}
