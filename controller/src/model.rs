//! What the controller has observed of the cluster, without Kubernetes types.
//!
//! The objects it watches go into the shared [`ClusterIndex`] through the one object → state
//! conversion ([`lace::objects::Body::into_object`]), as the agent's and the YAML loader's do.
//! Beside that the controller keeps, per object, what only it needs: the identity its owner
//! references and preconditions name, the status conditions it last wrote (to write nothing
//! when nothing changed), and, for an object whose body cannot be read, why not.

use std::collections::{BTreeMap, BTreeSet};

use lace::api::Condition;
use lace::index::ClusterIndex;
use lace::objects::{Kind, Object};
use lace::state::{ClusterState, ObjectKey};

/// The kinds the controller watches: Nodes, the Lace kinds it reads and the two it writes.
pub const WATCHED: [Kind; 8] = [
    Kind::Node,
    Kind::Network,
    Kind::NetworkBindingPolicy,
    Kind::ServiceBindingPolicy,
    Kind::NetworkRoutingPolicy,
    Kind::ServiceRoutingPolicy,
    Kind::NetworkAllocation,
    Kind::NodeAllocation,
];

/// The policy kinds (each has a `Ready` condition in its status).
pub const POLICIES: [Kind; 4] = [
    Kind::NetworkBindingPolicy,
    Kind::ServiceBindingPolicy,
    Kind::NetworkRoutingPolicy,
    Kind::ServiceRoutingPolicy,
];

/// What the controller keeps of one object besides its body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub uid: String,
    /// Sent as the precondition of an update, so a write never clobbers a change the watch
    /// has not delivered yet.
    pub resource_version: String,
    /// `metadata.generation`: the spec version a status condition was computed from.
    pub generation: Option<i64>,
    /// Of an internal object: the uid of the Node or Network its owner reference names.
    pub owner_uid: Option<String>,
    /// A Network's or policy's `status.conditions`; of a Node, only the controller's own
    /// condition ([`crate::desired::NODE_ALLOCATED`]).
    pub conditions: Vec<Condition>,
    /// The body could not be read (the object is then not in the index), with the field.
    pub unreadable: Option<String>,
}

impl Observed {
    /// Equal apart from the resource version (which changes with every write, also with
    /// writes that change nothing the controller reads, like a Node's heartbeat).
    fn same_as(&self, other: &Observed) -> bool {
        Observed {
            resource_version: String::new(),
            ..self.clone()
        } == Observed {
            resource_version: String::new(),
            ..other.clone()
        }
    }
}

/// One object as a watch (or a write's response) delivered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub kind: Kind,
    pub name: String,
    pub observed: Observed,
    /// `None` exactly when `observed.unreadable` says why.
    pub object: Option<Object>,
}

/// Every watched object. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Model {
    index: ClusterIndex,
    objects: BTreeMap<Kind, BTreeMap<String, Observed>>,
}

impl Model {
    pub fn new() -> Self {
        Self::default()
    }

    /// The cluster state of every readable object.
    pub fn state(&self) -> &ClusterState {
        self.index.state()
    }

    /// What is observed of `kind`/`name`.
    pub fn get(&self, kind: Kind, name: &str) -> Option<&Observed> {
        self.objects.get(&kind)?.get(name)
    }

    /// Every object of `kind`, readable or not, by name.
    pub fn iter(&self, kind: Kind) -> impl Iterator<Item = (&String, &Observed)> {
        self.objects.get(&kind).into_iter().flatten()
    }

    /// Records `seen`. Returns whether anything the controller decides on changed (a new
    /// resource version alone does not count).
    pub fn apply(&mut self, seen: Seen) -> bool {
        let key = ObjectKey::new("", seen.name.clone());
        let body_changed = match seen.object {
            Some(object) => self.index.apply(object),
            None => self.index.delete(seen.kind, &key),
        };
        let objects = self.objects.entry(seen.kind).or_default();
        let meta_changed = objects
            .get(&seen.name)
            .is_none_or(|old| !old.same_as(&seen.observed));
        objects.insert(seen.name, seen.observed);
        body_changed || meta_changed
    }

    /// Forgets `kind`/`name`; whether it was there.
    pub fn delete(&mut self, kind: Kind, name: &str) -> bool {
        self.index.delete(kind, &ObjectKey::new("", name));
        self.objects
            .get_mut(&kind)
            .and_then(|m| m.remove(name))
            .is_some()
    }

    /// Replaces every object of `kind` with `listed` (a watch's complete relist); objects not
    /// listed again are gone. Returns whether anything changed.
    pub fn relist(&mut self, kind: Kind, listed: Vec<Seen>) -> bool {
        let names: BTreeSet<String> = listed.iter().map(|s| s.name.clone()).collect();
        let gone: Vec<String> = self
            .iter(kind)
            .map(|(n, _)| n.clone())
            .filter(|n| !names.contains(n))
            .collect();
        let mut changed = false;
        for name in gone {
            changed |= self.delete(kind, &name);
        }
        for seen in listed {
            changed |= self.apply(seen);
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lace::state::Node;

    fn node(name: &str, rv: &str, ip: &str) -> Seen {
        Seen {
            kind: Kind::Node,
            name: name.into(),
            observed: Observed {
                uid: format!("uid-{name}"),
                resource_version: rv.into(),
                ..Observed::default()
            },
            object: Some(Object::Node(
                name.into(),
                Node {
                    labels: BTreeMap::new(),
                    internal_ips: vec![ip.parse().unwrap()],
                },
            )),
        }
    }

    #[test]
    fn only_changes_the_controller_decides_on_count() {
        let mut m = Model::new();
        assert!(m.apply(node("n1", "1", "192.168.0.1")));
        assert!(!m.apply(node("n1", "2", "192.168.0.1")), "a heartbeat");
        assert_eq!(m.get(Kind::Node, "n1").unwrap().resource_version, "2");
        assert!(m.apply(node("n1", "3", "192.168.0.9")), "a new address");
        // Unreadable: out of the state, kept with the reason.
        let mut bad = node("n1", "4", "192.168.0.9");
        bad.object = None;
        bad.observed.unreadable = Some("status.addresses[0].address: invalid".into());
        assert!(m.apply(bad));
        assert!(m.state().nodes.is_empty());
        assert_eq!(m.iter(Kind::Node).count(), 1);
        // A relist without n1 but with n2.
        assert!(m.relist(Kind::Node, vec![node("n2", "5", "192.168.0.2")]));
        let names: Vec<&String> = m.iter(Kind::Node).map(|(n, _)| n).collect();
        assert_eq!(names, ["n2"]);
        assert_eq!(m.state().nodes.keys().collect::<Vec<_>>(), ["n2"]);
        assert!(!m.relist(Kind::Node, vec![node("n2", "6", "192.168.0.2")]));
        assert!(m.delete(Kind::Node, "n2") && !m.delete(Kind::Node, "n2"));
    }
}
