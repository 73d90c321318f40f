//! The pure core, part 2: what must be written to get from what is observed to what should
//! be ([`crate::desired`]). Nothing that already holds is written again, so a restart over
//! an allocated cluster, or a watch relist, writes nothing.
//!
//! The writes come in three phases, executed in order (a failed phase stops the pass, and the
//! pass is retried): deletes of internal objects nothing owns any more (so a freed index is
//! gone from the cluster before another node's object takes it), then the internal objects,
//! then status conditions (which describe the objects of the phase before). Each write
//! carries the Kubernetes Events to publish once it succeeds.

use std::fmt;

use lace::api::{Condition, NetworkAllocationSpec, NodeAllocationSpec, Underlay};
use lace::objects::Kind;

use crate::desired::{Desired, Owned, BLOCKS_EXHAUSTED};
use crate::model::Model;

/// One write to the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Delete an internal object (precondition: its uid).
    Delete {
        kind: Kind,
        name: String,
        uid: String,
    },
    /// Server-side apply of a NetworkAllocation, owned by its Network.
    NetworkAllocation {
        name: String,
        alloc: Owned<NetworkAllocationSpec>,
        /// The version observed (precondition), `None` to create.
        resource_version: Option<String>,
    },
    /// Server-side apply of a NodeAllocation, owned by its Node.
    NodeAllocation {
        name: String,
        alloc: Owned<NodeAllocationSpec>,
        resource_version: Option<String>,
    },
    /// Server-side apply of a Network's or policy's `status.conditions`.
    Status {
        kind: Kind,
        name: String,
        conditions: Vec<Condition>,
    },
    /// Server-side apply of the controller's condition in a Node's status.
    NodeCondition { name: String, condition: Condition },
}

impl Write {
    /// The kind and name of the object written.
    pub fn target(&self) -> (Kind, &str) {
        match self {
            Write::Delete { kind, name, .. } | Write::Status { kind, name, .. } => (*kind, name),
            Write::NetworkAllocation { name, .. } => (Kind::NetworkAllocation, name),
            Write::NodeAllocation { name, .. } => (Kind::NodeAllocation, name),
            Write::NodeCondition { name, .. } => (Kind::Node, name),
        }
    }
}

impl fmt::Display for Write {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, name) = self.target();
        let what = match self {
            Write::Delete { .. } => "delete",
            Write::NetworkAllocation { .. } | Write::NodeAllocation { .. } => "apply",
            Write::Status { .. } | Write::NodeCondition { .. } => "apply the status of",
        };
        write!(f, "{what} {kind}/{name}")
    }
}

/// A Kubernetes Event about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The object the Event is about (`regarding`).
    pub kind: Kind,
    pub name: String,
    pub warning: bool,
    /// CamelCase, as the Event's reason.
    pub reason: String,
    /// What the controller did (the Event's action).
    pub action: &'static str,
    pub message: String,
}

/// A write and the Events to publish once it succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub write: Write,
    pub notes: Vec<Note>,
}

/// The writes of one pass, by phase. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub deletes: Vec<Step>,
    pub allocations: Vec<Step>,
    pub statuses: Vec<Step>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.deletes.len() + self.allocations.len() + self.statuses.len()
    }

    /// The phases in execution order.
    pub fn phases(self) -> [Vec<Step>; 3] {
        [self.deletes, self.allocations, self.statuses]
    }
}

fn note(
    kind: Kind,
    name: &str,
    warning: bool,
    reason: &str,
    action: &'static str,
    message: String,
) -> Note {
    Note {
        kind,
        name: name.to_string(),
        warning,
        reason: reason.to_string(),
        action,
        message,
    }
}

fn underlay_text(u: &Underlay) -> String {
    match (u.ipv4, u.ipv6) {
        (Some(a), Some(b)) => format!("{a} and {b}"),
        (Some(a), None) => a.to_string(),
        (None, Some(b)) => b.to_string(),
        (None, None) => "none".into(),
    }
}

fn node_allocation_notes(
    name: &str,
    old: Option<&NodeAllocationSpec>,
    new: &NodeAllocationSpec,
    without_blocks: Option<&Vec<String>>,
) -> Vec<Note> {
    let mut notes = Vec::new();
    let placed = match old {
        None => {
            notes.push(note(
                Kind::Node,
                name,
                false,
                "Allocated",
                "Allocate",
                format!(
                    "index {}, SRv6 locator {}, underlay {}",
                    new.index,
                    new.locator,
                    underlay_text(&new.underlay)
                ),
            ));
            true
        }
        Some(old) if (old.index, old.locator) != (new.index, new.locator) => {
            let why = if old.index == new.index {
                "srv6LocatorPrefix changed: every node's locator moves, and cross-node traffic recovers as the agents reprogram"
            } else {
                "the recorded index is not valid for srv6LocatorPrefix (out of range, or also held by another node)"
            };
            notes.push(note(
                Kind::Node,
                name,
                true,
                "Reallocated",
                "Allocate",
                format!(
                    "index {} -> {}, SRv6 locator {} -> {}: {why}",
                    old.index, new.index, old.locator, new.locator
                ),
            ));
            true
        }
        Some(old) => {
            if old.underlay != new.underlay {
                notes.push(note(
                    Kind::Node,
                    name,
                    false,
                    "UnderlayChanged",
                    "Allocate",
                    format!(
                        "underlay {} -> {}",
                        underlay_text(&old.underlay),
                        underlay_text(&new.underlay)
                    ),
                ));
            }
            false
        }
    };
    if let (true, Some(networks)) = (placed, without_blocks) {
        notes.push(note(
            Kind::Node,
            name,
            true,
            "NoAddressBlock",
            "Allocate",
            format!(
                "no address block of Network(s) {} for this node (index {}): their subnets hold fewer blocks; pods bound to them cannot start here",
                networks.join(", "),
                new.index
            ),
        ));
    }
    notes
}

/// Events for conditions that turned into a problem (a `Ready` that is not `True`, a
/// `BlocksExhausted` that is).
fn condition_notes(kind: Kind, name: &str, old: &[Condition], new: &[Condition]) -> Vec<Note> {
    new.iter()
        .filter(|c| {
            let problem = if c.type_ == BLOCKS_EXHAUSTED {
                c.status == "True"
            } else {
                c.status != "True"
            };
            let changed = !old
                .iter()
                .any(|o| o.type_ == c.type_ && o.status == c.status && o.reason == c.reason);
            problem && changed
        })
        .map(|c| note(kind, name, true, &c.reason, "Validate", c.message.clone()))
        .collect()
}

/// The writes that take the cluster from `model` to `desired`. See the module docs.
pub fn diff(model: &Model, desired: &Desired) -> Changes {
    let state = model.state();
    let mut changes = Changes::default();

    for kind in [Kind::NetworkAllocation, Kind::NodeAllocation] {
        for (name, obs) in model.iter(kind) {
            let wanted = match kind {
                Kind::NetworkAllocation => desired.network_allocations.contains_key(name),
                _ => desired.node_allocations.contains_key(name),
            };
            if !wanted {
                changes.deletes.push(Step {
                    write: Write::Delete {
                        kind,
                        name: name.clone(),
                        uid: obs.uid.clone(),
                    },
                    notes: Vec::new(),
                });
            }
        }
    }

    for (name, want) in &desired.network_allocations {
        let obs = model.get(Kind::NetworkAllocation, name);
        let old = state.network_allocations.get(name);
        if old == Some(&want.spec)
            && obs.and_then(|o| o.owner_uid.as_ref()) == Some(&want.owner_uid)
        {
            continue;
        }
        let notes = match old {
            None => vec![note(
                Kind::Network,
                name,
                false,
                "Allocated",
                "Allocate",
                format!("SID function {}", want.spec.function),
            )],
            Some(old) if old != &want.spec => vec![note(
                Kind::Network,
                name,
                true,
                "Reallocated",
                "Allocate",
                format!(
                    "SID function {} -> {}: the recorded one is not valid (0, or also held by another Network)",
                    old.function, want.spec.function
                ),
            )],
            Some(_) => Vec::new(),
        };
        changes.allocations.push(Step {
            write: Write::NetworkAllocation {
                name: name.clone(),
                alloc: want.clone(),
                resource_version: obs.map(|o| o.resource_version.clone()),
            },
            notes,
        });
    }
    for (name, want) in &desired.node_allocations {
        let obs = model.get(Kind::NodeAllocation, name);
        let old = state.node_allocations.get(name);
        if old == Some(&want.spec)
            && obs.and_then(|o| o.owner_uid.as_ref()) == Some(&want.owner_uid)
        {
            continue;
        }
        changes.allocations.push(Step {
            write: Write::NodeAllocation {
                name: name.clone(),
                alloc: want.clone(),
                resource_version: obs.map(|o| o.resource_version.clone()),
            },
            notes: node_allocation_notes(
                name,
                old,
                &want.spec,
                desired.nodes_without_blocks.get(name),
            ),
        });
    }

    let statuses = desired
        .network_conditions
        .iter()
        .map(|(name, c)| (Kind::Network, name, c))
        .chain(
            desired
                .policy_conditions
                .iter()
                .map(|((kind, name), c)| (*kind, name, c)),
        );
    for (kind, name, conditions) in statuses {
        let old = model
            .get(kind, name)
            .map(|o| o.conditions.as_slice())
            .unwrap_or_default();
        if old == conditions.as_slice() {
            continue;
        }
        changes.statuses.push(Step {
            write: Write::Status {
                kind,
                name: name.clone(),
                conditions: conditions.clone(),
            },
            notes: condition_notes(kind, name, old, conditions),
        });
    }
    for (name, condition) in &desired.node_conditions {
        let old = model
            .get(Kind::Node, name)
            .map(|o| o.conditions.as_slice())
            .unwrap_or_default();
        if old == std::slice::from_ref(condition) {
            continue;
        }
        changes.statuses.push(Step {
            write: Write::NodeCondition {
                name: name.clone(),
                condition: condition.clone(),
            },
            notes: condition_notes(Kind::Node, name, old, std::slice::from_ref(condition)),
        });
    }
    changes
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::IpAddr;

    use ipnet::Ipv6Net;
    use lace::api::{NetworkBindingPolicySpec, NetworkSpec, Subnet};
    use lace::objects::Object;
    use lace::state::Node;
    use proptest::prelude::*;

    use super::*;
    use crate::desired::{desired, NODE_ALLOCATED};
    use crate::model::{Observed, Seen};

    const NOW: &str = "2026-01-01T00:00:00Z";
    const LATER: &str = "2026-01-01T00:05:00Z";

    fn prefix() -> Ipv6Net {
        "2001:db8:100::/48".parse().unwrap()
    }

    fn observed(uid: &str) -> Observed {
        Observed {
            uid: uid.into(),
            resource_version: "1".into(),
            generation: Some(1),
            ..Observed::default()
        }
    }

    fn add_node(m: &mut Model, i: u32) {
        let name = format!("node-{i:04}");
        let [_, _, a, b] = i.to_be_bytes();
        let ips = vec![
            IpAddr::from([10, 0, a, b]),
            IpAddr::from([0xfd00, 0, 0, 0, 0, 0, u16::from(a), u16::from(b)]),
        ];
        m.apply(Seen {
            kind: Kind::Node,
            name: name.clone(),
            observed: observed(&format!("uid-{name}")),
            object: Some(Object::Node(
                name,
                Node {
                    labels: BTreeMap::new(),
                    internal_ips: ips,
                },
            )),
        });
    }

    fn net_spec(i: u8, block: u8) -> NetworkSpec {
        NetworkSpec {
            subnets: vec![Subnet {
                cidr: format!("10.{}.0.0/16", 100 + i).parse().unwrap(),
                block_prefix: block,
            }],
            external: false,
            host_access: false,
        }
    }

    fn add_network(m: &mut Model, name: &str, spec: NetworkSpec) {
        m.apply(Seen {
            kind: Kind::Network,
            name: name.into(),
            observed: observed(&format!("uid-{name}")),
            object: Some(Object::Network(name.into(), spec)),
        });
    }

    /// Applies `changes` to `model` as the API server would (one new version per write).
    fn land(m: &mut Model, changes: Changes) {
        for step in changes.phases().into_iter().flatten() {
            let (kind, name) = step.write.target();
            let (kind, name) = (kind, name.to_string());
            let mut obs = m
                .get(kind, &name)
                .cloned()
                .unwrap_or_else(|| observed(&format!("uid-{kind}-{name}")));
            obs.resource_version =
                format!("{}", obs.resource_version.parse::<u64>().unwrap_or(0) + 1);
            let object = match step.write {
                Write::Delete { kind, name, .. } => {
                    m.delete(kind, &name);
                    continue;
                }
                Write::NodeAllocation { alloc, .. } => {
                    obs.owner_uid = Some(alloc.owner_uid);
                    Object::NodeAllocation(name.clone(), alloc.spec)
                }
                Write::NetworkAllocation { alloc, .. } => {
                    obs.owner_uid = Some(alloc.owner_uid);
                    Object::NetworkAllocation(name.clone(), alloc.spec)
                }
                Write::Status { conditions, .. } => {
                    obs.conditions = conditions;
                    status_only(m, kind, name, obs);
                    continue;
                }
                Write::NodeCondition { condition, .. } => {
                    obs.conditions = vec![condition];
                    status_only(m, kind, name, obs);
                    continue;
                }
            };
            m.apply(Seen {
                kind,
                name,
                observed: obs,
                object: Some(object),
            });
        }
    }

    /// A status write: the body stays, the conditions are the new ones.
    fn status_only(m: &mut Model, kind: Kind, name: String, observed: Observed) {
        let object = object_of(m, kind, &name);
        m.apply(Seen {
            kind,
            name,
            observed,
            object,
        });
    }

    fn object_of(m: &Model, kind: Kind, name: &str) -> Option<Object> {
        let s = m.state();
        match kind {
            Kind::Network => s
                .networks
                .get(name)
                .map(|n| Object::Network(name.into(), n.clone())),
            Kind::Node => s
                .nodes
                .get(name)
                .map(|n| Object::Node(name.into(), n.clone())),
            Kind::NetworkBindingPolicy => s
                .network_bindings
                .get(name)
                .map(|p| Object::NetworkBindingPolicy(name.into(), p.clone())),
            _ => None,
        }
    }

    fn converge(m: &mut Model, now: &str) -> Changes {
        let changes = diff(m, &desired(m, prefix(), now));
        land(m, changes.clone());
        changes
    }

    fn count(changes: &Changes) -> (usize, usize, usize) {
        (
            changes.deletes.len(),
            changes.allocations.len(),
            changes.statuses.len(),
        )
    }

    #[test]
    fn the_allocation_is_the_standalone_allocators() {
        let mut m = Model::new();
        for i in 1..=5 {
            add_node(&mut m, i);
        }
        add_network(&mut m, "a", net_spec(1, 24));
        add_network(&mut m, "b", net_spec(2, 20));
        let d = desired(&m, prefix(), NOW);
        let mut state = m.state().clone();
        state.config.srv6_locator_prefix = Some(prefix());
        let standalone = lace::alloc::allocate(&state).unwrap();
        let specs = |d: &Desired| {
            (
                d.node_allocations
                    .iter()
                    .map(|(n, a)| (n.clone(), a.spec.clone()))
                    .collect::<BTreeMap<_, _>>(),
                d.network_allocations
                    .iter()
                    .map(|(n, a)| (n.clone(), a.spec.clone()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        assert_eq!(
            specs(&d),
            (standalone.node_allocations, standalone.network_allocations)
        );
        assert_eq!(d.node_allocations["node-0003"].owner_uid, "uid-node-0003");
    }

    #[test]
    fn once_landed_nothing_is_written_again_and_times_are_kept() {
        let mut m = Model::new();
        add_node(&mut m, 1);
        add_network(&mut m, "a", net_spec(1, 24));
        let first = converge(&mut m, NOW);
        assert_eq!(count(&first), (0, 2, 1));
        assert!(
            converge(&mut m, LATER).is_empty(),
            "a second pass writes nothing"
        );
        // A change of condition message only (here: a policy that starts to bind) keeps the
        // transition time of a condition whose status stays.
        m.apply(Seen {
            kind: Kind::NetworkBindingPolicy,
            name: "p".into(),
            observed: observed("uid-p"),
            object: Some(Object::NetworkBindingPolicy(
                "p".into(),
                NetworkBindingPolicySpec {
                    network: "gone".into(),
                    ..Default::default()
                },
            )),
        });
        let c = converge(&mut m, LATER);
        assert_eq!(count(&c), (0, 0, 1));
        let Write::Status { conditions, .. } = &c.statuses[0].write else {
            panic!()
        };
        assert_eq!(conditions[0].last_transition_time.as_deref(), Some(LATER));
        let a = &m.get(Kind::Network, "a").unwrap().conditions[0];
        assert_eq!(a.last_transition_time.as_deref(), Some(NOW), "untouched");
    }

    #[test]
    fn what_cannot_be_judged_keeps_what_it_holds() {
        let mut m = Model::new();
        add_node(&mut m, 1);
        add_node(&mut m, 2);
        add_network(&mut m, "a", net_spec(1, 24));
        add_network(&mut m, "b", net_spec(2, 24));
        converge(&mut m, NOW);
        let before = m.state().clone();
        // node-0001's body becomes unreadable, Network b's too: neither is deleted, their
        // values are not handed out.
        for (kind, name) in [(Kind::Node, "node-0001"), (Kind::Network, "b")] {
            let mut obs = m.get(kind, name).unwrap().clone();
            obs.unreadable = Some("status.addresses[0].address: invalid IP address \"x\"".into());
            m.apply(Seen {
                kind,
                name: name.into(),
                observed: obs,
                object: None,
            });
        }
        add_node(&mut m, 3);
        add_network(&mut m, "c", net_spec(3, 24));
        let c = converge(&mut m, NOW);
        assert!(c.deletes.is_empty(), "{c:#?}");
        let s = m.state();
        assert_eq!(
            s.node_allocations["node-0001"],
            before.node_allocations["node-0001"]
        );
        assert_eq!(s.network_allocations["b"], before.network_allocations["b"]);
        assert_eq!(s.node_allocations["node-0003"].index, 3);
        assert_eq!(s.network_allocations["c"].function, 3);
        let node_cond = &m.get(Kind::Node, "node-0001").unwrap().conditions;
        assert_eq!(
            (node_cond[0].type_.as_str(), node_cond[0].reason.as_str()),
            (NODE_ALLOCATED, "InvalidNode")
        );
        assert_eq!(
            m.get(Kind::Network, "b").unwrap().conditions[0].reason,
            "Invalid"
        );
        // Once deleted, they free their values.
        m.delete(Kind::Node, "node-0001");
        m.delete(Kind::Network, "b");
        let c = converge(&mut m, NOW);
        assert_eq!(count(&c).0, 2);
    }

    #[derive(Clone, Debug)]
    enum Add {
        Node(u32),
        Network(u8),
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Over any cluster: one pass converges (the next writes nothing), one more node is
        /// one write, one more Network one allocation and one status, unless a Network's
        /// blocks run out with that node.
        #[test]
        fn each_object_costs_o1_writes(
            nodes in proptest::collection::btree_set(1u32..400, 1..40),
            networks in proptest::collection::btree_set(0u8..20, 0..6),
            extra in prop_oneof![(400u32..500).prop_map(Add::Node), (20u8..30).prop_map(Add::Network)],
        ) {
            let mut m = Model::new();
            for &i in &nodes {
                add_node(&mut m, i);
            }
            for &i in &networks {
                // Small subnets for some: /16 in /21 blocks holds 32 nodes.
                add_network(&mut m, &format!("net-{i:02}"), net_spec(i, if i % 3 == 0 { 21 } else { 24 }));
            }
            converge(&mut m, NOW);
            prop_assert!(converge(&mut m, NOW).is_empty());
            let exhausted_before: Vec<bool> = m
                .iter(Kind::Network)
                .map(|(_, o)| o.conditions.iter().any(|c| c.type_ == "BlocksExhausted" && c.status == "True"))
                .collect();
            match extra {
                Add::Node(i) => {
                    add_node(&mut m, i);
                    let c = converge(&mut m, LATER);
                    let flipped = m
                        .iter(Kind::Network)
                        .map(|(_, o)| o.conditions.iter().any(|c| c.type_ == "BlocksExhausted" && c.status == "True"))
                        .zip(&exhausted_before)
                        .filter(|(now, before)| now != *before)
                        .count();
                    prop_assert_eq!(count(&c), (0, 1, flipped));
                }
                Add::Network(i) => {
                    add_network(&mut m, &format!("net-{i:02}"), net_spec(i, 24));
                    prop_assert_eq!(count(&converge(&mut m, LATER)), (0, 1, 1));
                }
            }
            prop_assert!(converge(&mut m, LATER).is_empty());
        }
    }
}
