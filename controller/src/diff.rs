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
            notes.push(note(
                Kind::Node,
                name,
                true,
                "Reallocated",
                "Allocate",
                format!(
                    "index {} -> {}, SRv6 locator {} -> {}: the recorded ones are not valid for the locator prefix (out of range, or also held by another node)",
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
