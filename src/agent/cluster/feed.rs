//! The feeder's bookkeeping: the watches' [`Change`]s applied to the one
//! [`ClusterIndex`], relists reconciled against it, objects that cannot be used left out.
//!
//! A (re)list is applied as it streams in (objects are only added or updated meanwhile), and
//! when it is done every object of the kind that it did not deliver again is deleted: what
//! was deleted while the watch was away (410 Gone) disappears then, and only then.

use std::collections::{BTreeMap, BTreeSet};

use super::watch::Change;
use crate::index::ClusterIndex;
use crate::objects::{Kind, ObjectError};
use crate::state::{ClusterState, ObjectKey};

/// See the module docs.
#[derive(Debug)]
pub(super) struct Feeder {
    index: ClusterIndex,
    watched: Vec<Kind>,
    /// Per kind being (re)listed, the keys the list delivered so far.
    listing: BTreeMap<Kind, BTreeSet<ObjectKey>>,
    /// Kinds whose first list is complete.
    synced: BTreeSet<Kind>,
    /// Objects left out, with why.
    undecodable: BTreeMap<(Kind, ObjectKey), ObjectError>,
}

/// `name` for cluster-scoped objects, `namespace/name` otherwise.
pub(super) fn key_name(key: &ObjectKey) -> String {
    if key.namespace.is_empty() {
        key.name.clone()
    } else {
        key.to_string()
    }
}

impl Feeder {
    pub fn new(watched: &[Kind]) -> Self {
        Self {
            index: ClusterIndex::new(),
            watched: watched.to_vec(),
            listing: BTreeMap::new(),
            synced: BTreeSet::new(),
            undecodable: BTreeMap::new(),
        }
    }

    pub fn state(&self) -> &ClusterState {
        self.index.state()
    }

    /// Whether every watched kind has been listed once (before that the state is partial).
    pub fn synced(&self) -> bool {
        self.watched.iter().all(|k| self.synced.contains(k))
    }

    /// The kinds not listed yet.
    pub fn unsynced(&self) -> Vec<Kind> {
        self.watched
            .iter()
            .copied()
            .filter(|k| !self.synced.contains(k))
            .collect()
    }

    /// How many objects of each kind are left out because they do not decode.
    pub fn undecodable(&self) -> BTreeMap<Kind, usize> {
        let mut out = BTreeMap::new();
        for (kind, _) in self.undecodable.keys() {
            *out.entry(*kind).or_default() += 1;
        }
        out
    }

    /// Applies one change; whether the state changed. Logs each object newly left out.
    pub fn apply(&mut self, change: Change) -> bool {
        match change {
            Change::Apply {
                kind,
                key,
                object,
                listing,
            } => {
                if listing {
                    if let Some(seen) = self.listing.get_mut(&kind) {
                        seen.insert(key.clone());
                    }
                }
                match object {
                    Ok(Some(object)) => {
                        self.undecodable.remove(&(kind, key));
                        self.index.apply(object)
                    }
                    // Lace ignores it (an EndpointSlice of no Service): as if it were gone.
                    Ok(None) => {
                        self.undecodable.remove(&(kind, key.clone()));
                        self.index.delete(kind, &key)
                    }
                    Err(reason) => {
                        let entry = (kind, key.clone());
                        if self.undecodable.get(&entry) != Some(&reason) {
                            tracing::error!(
                                kind = %kind,
                                object = %key_name(&key),
                                reason = %reason,
                                "object from the API server left out of the cluster state; everything else keeps working"
                            );
                            self.undecodable.insert(entry, reason);
                        }
                        self.index.delete(kind, &key)
                    }
                }
            }
            Change::Delete { kind, key } => {
                self.undecodable.remove(&(kind, key.clone()));
                self.index.delete(kind, &key)
            }
            Change::ListStarted(kind) => {
                self.listing.insert(kind, BTreeSet::new());
                false
            }
            Change::ListDone(kind) => {
                let seen = self.listing.remove(&kind).unwrap_or_default();
                let mut changed = false;
                for key in self.index.keys(kind) {
                    if !seen.contains(&key) {
                        changed |= self.index.delete(kind, &key);
                    }
                }
                self.undecodable
                    .retain(|(k, key), _| *k != kind || seen.contains(key));
                self.synced.insert(kind);
                changed
            }
            Change::Failed { .. } | Change::Reachable => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Object;
    use crate::state::Namespace;

    fn ns(name: &str, label: &str) -> Change {
        Change::Apply {
            kind: Kind::Namespace,
            key: ObjectKey::new("", name),
            object: Ok(Some(Object::Namespace(
                name.into(),
                Namespace {
                    labels: [("l".to_string(), label.to_string())].into(),
                },
            ))),
            listing: false,
        }
    }

    fn listed(change: Change) -> Change {
        match change {
            Change::Apply {
                kind, key, object, ..
            } => Change::Apply {
                kind,
                key,
                object,
                listing: true,
            },
            other => other,
        }
    }

    fn names(f: &Feeder) -> Vec<&str> {
        f.state().namespaces.keys().map(String::as_str).collect()
    }

    #[test]
    fn a_relist_deletes_what_it_did_not_deliver_again_only_when_done() {
        let mut f = Feeder::new(&[Kind::Namespace]);
        assert!(!f.synced());
        assert!(!f.apply(Change::ListStarted(Kind::Namespace)));
        assert!(f.apply(listed(ns("a", "1"))));
        assert!(f.apply(listed(ns("b", "1"))));
        assert!(!f.apply(Change::ListDone(Kind::Namespace)));
        assert!(f.synced());
        assert_eq!(names(&f), ["a", "b"]);
        // 410 Gone: the relist delivers a (changed) and c; b was deleted meanwhile.
        f.apply(Change::ListStarted(Kind::Namespace));
        assert!(f.apply(listed(ns("a", "2"))));
        assert!(f.apply(listed(ns("c", "1"))));
        assert_eq!(names(&f), ["a", "b", "c"], "nothing vanishes mid-list");
        assert!(f.apply(Change::ListDone(Kind::Namespace)));
        assert_eq!(names(&f), ["a", "c"]);
        assert_eq!(f.state().namespaces["a"].labels["l"], "2");
        // An unchanged relist changes nothing.
        f.apply(Change::ListStarted(Kind::Namespace));
        assert!(!f.apply(listed(ns("a", "2"))));
        assert!(!f.apply(listed(ns("c", "1"))));
        assert!(!f.apply(Change::ListDone(Kind::Namespace)));
    }

    #[test]
    fn an_object_that_cannot_be_used_is_left_out_until_it_can() {
        let mut f = Feeder::new(&[Kind::Namespace]);
        f.apply(ns("a", "1"));
        let bad = |reason: &str| Change::Apply {
            kind: Kind::Namespace,
            key: ObjectKey::new("", "a"),
            object: Err(ObjectError::Shape(reason.to_string())),
            listing: false,
        };
        // Its previous version goes too: the state never holds an object's stale version.
        assert!(f.apply(bad("unexpected shape")));
        assert!(names(&f).is_empty());
        assert_eq!(f.undecodable(), [(Kind::Namespace, 1)].into());
        assert!(!f.apply(bad("unexpected shape")));
        assert!(f.apply(ns("a", "2")));
        assert!(f.undecodable().is_empty());
        f.apply(bad("x"));
        // A relist that no longer delivers it forgets it.
        f.apply(Change::ListStarted(Kind::Namespace));
        f.apply(Change::ListDone(Kind::Namespace));
        assert!(f.undecodable().is_empty());
        // Ignored objects count as absent.
        f.apply(ns("b", "1"));
        assert!(f.apply(Change::Apply {
            kind: Kind::Namespace,
            key: ObjectKey::new("", "b"),
            object: Ok(None),
            listing: false,
        }));
        assert!(names(&f).is_empty());
    }
}
