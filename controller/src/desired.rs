//! The pure core, part 1: from what is observed to what should be. No Kubernetes types, no
//! I/O: [`desired`] takes the [`Model`], the locator prefix and the time, and returns the
//! internal objects the cluster should hold and the status conditions every Network, policy
//! and troubled node should show. [`crate::diff`] turns that into writes.
//!
//! The allocation is the library's own ([`lace::alloc::allocate_partial`]) over the state
//! [`lace::validate::admit`] leaves, so for the same valid objects it equals what
//! `lace-agent allocate` records. Two rules make it safe to run against a live cluster:
//!
//! - Every allocation that exists is taken as given before anything new is handed out (the
//!   allocator's stability rule), so a restart or a relist never moves one.
//! - An object that exists but cannot be judged now keeps what it holds: a Network that is
//!   rejected or unreadable keeps its SID function, an unreadable Node keeps its index (the
//!   allocator sees a stand-in for it), a Node without an address keeps its allocation. Only
//!   a deleted object frees its values.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::Ipv6Net;
use lace::alloc::{self, AllocError};
use lace::api::{Condition, NetworkAllocationSpec, NetworkSpec, NodeAllocationSpec};
use lace::objects::Kind;
use lace::state::{ClusterConfig, ClusterState, Node};
use lace::validate;

use crate::model::{Model, POLICIES};

/// Condition type of Networks and policies: usable by agents (or why not).
pub const READY: &str = "Ready";
/// Condition type of Networks: some nodes hold no address block of it.
pub const BLOCKS_EXHAUSTED: &str = "BlocksExhausted";
/// Condition type the controller sets on a Node it cannot allocate (and to `True` once it
/// can again). Nodes it never failed to allocate do not get it: 5,000 healthy nodes cost no
/// Node writes.
pub const NODE_ALLOCATED: &str = "lace.io/Allocated";

/// An internal object and the uid of the Node or Network that owns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owned<S> {
    pub spec: S,
    pub owner_uid: String,
}

/// Counts for the metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub nodes_allocated: u64,
    pub nodes_unallocated: u64,
    pub networks_ready: u64,
    pub networks_not_ready: u64,
    pub policies_not_ready: u64,
    /// Node locators of the prefix not held by any node.
    pub locators_free: u64,
}

/// What the cluster should hold. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub network_allocations: BTreeMap<String, Owned<NetworkAllocationSpec>>,
    pub node_allocations: BTreeMap<String, Owned<NodeAllocationSpec>>,
    /// `status.conditions` of every Network.
    pub network_conditions: BTreeMap<String, Vec<Condition>>,
    /// `status.conditions` of every policy, by kind and name.
    pub policy_conditions: BTreeMap<(Kind, String), Vec<Condition>>,
    /// The [`NODE_ALLOCATED`] condition of the nodes that need one.
    pub node_conditions: BTreeMap<String, Condition>,
    /// Per node, the Networks that have no block for it (its index is beyond their subnets).
    pub nodes_without_blocks: BTreeMap<String, Vec<String>>,
    pub summary: Summary,
}

/// Why a Network is not Ready.
struct NotReady {
    reason: &'static str,
    message: String,
}

fn condition(type_: &str, ok: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: None,
        observed_generation: None,
    }
}

/// Stamps `conditions` with `generation`, and with the transition time: kept from `observed`
/// while a condition's status stays the same, `now` when it changes.
fn stamp(
    mut conditions: Vec<Condition>,
    observed: &[Condition],
    generation: Option<i64>,
    now: &str,
) -> Vec<Condition> {
    for c in &mut conditions {
        c.observed_generation = generation;
        c.last_transition_time = observed
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status)
            .and_then(|o| o.last_transition_time.clone())
            .or_else(|| Some(now.to_string()));
    }
    conditions
}

/// Networks whose subnets overlap the locator prefix: a SID would also be a pod address.
/// The rule and its message are the validator's ([`validate::validate_config`]).
fn overlapping_prefix(state: &ClusterState, prefix: Ipv6Net) -> BTreeMap<String, String> {
    let config = ClusterConfig {
        srv6_locator_prefix: Some(prefix),
    };
    state
        .networks
        .iter()
        .filter_map(|(name, spec)| {
            let one = BTreeMap::from([(name.clone(), spec.clone())]);
            let errors = validate::validate_config(&config, 0, &one).err()?;
            let why: Vec<String> = errors.iter().map(|e| e.message.clone()).collect();
            Some((
                name.clone(),
                format!(
                    "Network/{name}: spec.subnets: {} (controller.srv6LocatorPrefix): SIDs would also be pod addresses; use subnets outside it",
                    why.join("; ")
                ),
            ))
        })
        .collect()
}

/// The Networks a policy of `kind` refers to, with the field naming each.
fn network_refs(state: &ClusterState, kind: Kind, name: &str) -> Vec<(&'static str, String)> {
    match kind {
        Kind::NetworkBindingPolicy => state
            .network_bindings
            .get(name)
            .map(|p| vec![("spec.network", p.network.clone())]),
        Kind::ServiceBindingPolicy => state
            .service_bindings
            .get(name)
            .map(|p| vec![("spec.network", p.network.clone())]),
        Kind::NetworkRoutingPolicy => state
            .network_routes
            .get(name)
            .map(|p| vec![("spec.from", p.from.clone()), ("spec.to", p.to.clone())]),
        Kind::ServiceRoutingPolicy => state
            .service_routes
            .get(name)
            .map(|p| vec![("spec.from", p.from.clone()), ("spec.to", p.to.clone())]),
        _ => None,
    }
    .unwrap_or_default()
}

/// The node condition for an allocation failure, if the failure is a node's.
fn node_failure(error: &AllocError, kept: bool) -> Option<(String, &'static str, String)> {
    match error {
        AllocError::NoUnderlay { node } => {
            let mut message = error.to_string();
            if kept {
                message.push_str("; it keeps its allocation, with the last underlay recorded");
            }
            Some((node.clone(), "NoUnderlayAddress", message))
        }
        AllocError::LocatorsExhausted { node, .. } => Some((
            node.clone(),
            "LocatorsExhausted",
            format!(
                "{error}: delete the Nodes that are gone, or reinstall with a shorter controller.srv6LocatorPrefix (which moves every node's locator)"
            ),
        )),
        _ => None,
    }
}

/// What the cluster should hold for `model`, with locators carved from `prefix`, at time
/// `now` (RFC 3339, for condition transitions). See the module docs.
pub fn desired(model: &Model, prefix: Ipv6Net, now: &str) -> Desired {
    let observed_state = model.state();
    let mut state = observed_state.clone();
    state.config.srv6_locator_prefix = Some(prefix);

    // Which Networks are not usable, and why.
    let mut not_ready: BTreeMap<String, NotReady> = BTreeMap::new();
    for (name, message) in overlapping_prefix(&state, prefix) {
        state.networks.remove(&name);
        not_ready.insert(
            name,
            NotReady {
                reason: "Invalid",
                message,
            },
        );
    }
    let (mut input, rejected) = validate::admit(state);
    let mut policy_rejections = BTreeMap::new();
    for r in rejected {
        let Some(kind) = Kind::ALL.into_iter().find(|k| k.name() == r.kind) else {
            continue;
        };
        if kind == Kind::Network {
            not_ready.insert(
                r.name.clone(),
                NotReady {
                    reason: "Invalid",
                    message: r.to_string(),
                },
            );
        } else {
            policy_rejections.insert((kind, r.name.clone()), r.to_string());
        }
    }
    for (name, obs) in model.iter(Kind::Network) {
        if let Some(why) = &obs.unreadable {
            not_ready.insert(
                name.clone(),
                NotReady {
                    reason: "Invalid",
                    message: format!("Network/{name}: {why}"),
                },
            );
        }
    }
    let admitted: BTreeMap<String, NetworkSpec> = input.networks.clone();

    // Stand-ins, so what exists but cannot be judged keeps what it holds.
    for name in not_ready.keys() {
        if observed_state.network_allocations.contains_key(name) {
            input.networks.insert(
                name.clone(),
                NetworkSpec {
                    subnets: Vec::new(),
                    external: true,
                    host_access: false,
                },
            );
        }
    }
    for (name, obs) in model.iter(Kind::Node) {
        if obs.unreadable.is_none() {
            continue;
        }
        if let Some(held) = observed_state.node_allocations.get(name) {
            let u = held.underlay;
            let internal_ips = u
                .ipv4
                .map(IpAddr::V4)
                .into_iter()
                .chain(u.ipv6.map(IpAddr::V6))
                .collect();
            input.nodes.insert(
                name.clone(),
                Node {
                    labels: BTreeMap::new(),
                    internal_ips,
                },
            );
        }
    }

    let partial = alloc::allocate_partial(&input);
    let allocation = partial.allocation;
    let mut out = Desired::default();
    let owner = |kind: Kind, name: &str| model.get(kind, name).map(|o| o.uid.clone());
    for (name, spec) in allocation.network_allocations {
        if let Some(owner_uid) = owner(Kind::Network, &name) {
            out.network_allocations
                .insert(name, Owned { spec, owner_uid });
        }
    }
    for (name, spec) in allocation.node_allocations {
        if let Some(owner_uid) = owner(Kind::Node, &name) {
            out.node_allocations.insert(name, Owned { spec, owner_uid });
        }
    }

    // Failures, by Network and node.
    let mut node_failures: BTreeMap<String, (&'static str, String)> = BTreeMap::new();
    for error in &partial.failures {
        if let AllocError::FunctionsExhausted { network } = error {
            not_ready.insert(
                network.clone(),
                NotReady {
                    reason: "SidFunctionsExhausted",
                    message: format!("{error}: delete Networks that are no longer used"),
                },
            );
        }
        let kept = |node: &String| out.node_allocations.contains_key(node);
        if let Some((node, reason, message)) = node_failure(
            error,
            match error {
                AllocError::NoUnderlay { node } => kept(node),
                _ => false,
            },
        ) {
            node_failures.insert(node, (reason, message));
        }
    }
    for (name, obs) in model.iter(Kind::Node) {
        if let Some(why) = &obs.unreadable {
            node_failures.insert(name.clone(), ("InvalidNode", format!("Node/{name}: {why}")));
        }
    }

    // Networks: Ready, and BlocksExhausted for those with subnets.
    for (name, obs) in model.iter(Kind::Network) {
        let mut conditions = Vec::new();
        if let Some(nr) = not_ready.get(name) {
            conditions.push(condition(READY, false, nr.reason, nr.message.clone()));
            out.summary.networks_not_ready += 1;
        } else if let (Some(a), Some(spec)) =
            (out.network_allocations.get(name), admitted.get(name))
        {
            conditions.push(condition(
                READY,
                true,
                "Allocated",
                format!("SID function {}", a.spec.function),
            ));
            out.summary.networks_ready += 1;
            if !spec.external {
                let capacity = alloc::block_capacity(&spec.subnets);
                let beyond: Vec<&String> = out
                    .node_allocations
                    .iter()
                    .filter(|(_, a)| a.spec.index > capacity)
                    .map(|(n, _)| n)
                    .collect();
                for node in &beyond {
                    out.nodes_without_blocks
                        .entry((*node).clone())
                        .or_default()
                        .push(name.clone());
                }
                // No node count in the messages: the condition changes only when the
                // Network runs out, not with every node that joins.
                conditions.push(if beyond.is_empty() {
                    condition(
                        BLOCKS_EXHAUSTED,
                        false,
                        "BlocksAvailable",
                        format!("its subnets hold blocks for {capacity} nodes"),
                    )
                } else {
                    condition(
                        BLOCKS_EXHAUSTED,
                        true,
                        "BlocksExhausted",
                        format!(
                            "its subnets hold blocks for {capacity} nodes and the cluster has more: pods bound to this Network on the nodes beyond get no address (subnets cannot change: bind those pods to another Network)"
                        ),
                    )
                });
            }
        } else {
            // Not in the model's admitted set and no reason recorded cannot happen; say so
            // rather than claim Ready.
            conditions.push(condition(
                READY,
                false,
                "NotAllocated",
                "no SID function allocated yet".into(),
            ));
            out.summary.networks_not_ready += 1;
        }
        out.network_conditions.insert(
            name.clone(),
            stamp(conditions, &obs.conditions, obs.generation, now),
        );
    }

    // Policies: Ready, or why not (naming a referenced Network that is not Ready).
    for kind in POLICIES {
        for (name, obs) in model.iter(kind) {
            let c = if let Some(why) = &obs.unreadable {
                condition(READY, false, "Invalid", format!("{kind}/{name}: {why}"))
            } else if let Some(message) = policy_rejections.get(&(kind, name.clone())) {
                let unready: Vec<String> = network_refs(observed_state, kind, name)
                    .into_iter()
                    .filter(|(_, n)| {
                        model.get(Kind::Network, n).is_some() && !admitted.contains_key(n)
                    })
                    .map(|(field, n)| {
                        format!("{field}: Network {n:?} is not Ready (see its status)")
                    })
                    .collect();
                if unready.is_empty() {
                    condition(READY, false, "Invalid", message.clone())
                } else {
                    condition(
                        READY,
                        false,
                        "NetworkNotReady",
                        format!("{kind}/{name}: {}", unready.join("; ")),
                    )
                }
            } else {
                condition(READY, true, "Valid", String::new())
            };
            if c.status != "True" {
                out.summary.policies_not_ready += 1;
            }
            out.policy_conditions.insert(
                (kind, name.clone()),
                stamp(vec![c], &obs.conditions, obs.generation, now),
            );
        }
    }

    // Nodes: a condition for those that cannot be allocated, and for those that could not
    // be before.
    for (name, obs) in model.iter(Kind::Node) {
        let c = match (node_failures.get(name), out.node_allocations.get(name)) {
            (Some((reason, message)), _) => {
                condition(NODE_ALLOCATED, false, reason, message.clone())
            }
            (None, Some(a)) if obs.conditions.iter().any(|c| c.status != "True") => condition(
                NODE_ALLOCATED,
                true,
                "Allocated",
                format!("index {}, locator {}", a.spec.index, a.spec.locator),
            ),
            _ => continue,
        };
        let c = stamp(vec![c], &obs.conditions, None, now);
        out.node_conditions
            .insert(name.clone(), c.into_iter().next().unwrap_or_default());
    }

    let nodes = model.iter(Kind::Node).count() as u64;
    out.summary.nodes_allocated = out.node_allocations.len() as u64;
    out.summary.nodes_unallocated = nodes.saturating_sub(out.summary.nodes_allocated);
    out.summary.locators_free = lace::sid::max_node_index(prefix)
        .map(u64::from)
        .unwrap_or(0)
        .saturating_sub(out.summary.nodes_allocated);
    out
}
