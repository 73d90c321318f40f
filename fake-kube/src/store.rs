//! The objects, their resource versions and the history watches resume from.
//!
//! Like etcd behind the API server, one counter versions every write; the history keeps every
//! change since the last compaction, so a watch from a version replays what came after it
//! and a watch from before the compaction gets 410 Gone. A write that changes nothing but
//! what the server stamps is not a write (no new version, no event), as on a real server.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::resource::Resource;
use crate::select::Filter;

/// An object's namespace (empty for cluster-scoped objects) and name.
pub(crate) type Key = (String, String);

/// The key of `object`; `None` without a `metadata.name`.
pub(crate) fn key_of(object: &Value) -> Option<Key> {
    let meta = &object["metadata"];
    Some((
        meta["namespace"].as_str().unwrap_or_default().to_string(),
        meta["name"].as_str()?.to_string(),
    ))
}

/// A client of the fake, for counting the watch events it was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientId(pub(crate) u64);

#[derive(Debug)]
struct Change {
    rv: u64,
    resource: Resource,
    event: &'static str,
    object: Value,
}

#[derive(Debug)]
struct Watch {
    resource: Resource,
    filter: Filter,
    client: ClientId,
    tx: UnboundedSender<Bytes>,
}

/// One line of a watch stream.
fn event_line(event: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": event, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// A `Status` object, as error responses and `ERROR` watch events carry.
pub(crate) fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

fn gone() -> Bytes {
    event_line("ERROR", &status(410, "Expired", "too old resource version"))
}

#[derive(Debug, Default)]
pub(crate) struct Store {
    rv: u64,
    uids: u64,
    objects: BTreeMap<Resource, BTreeMap<Key, Value>>,
    history: Vec<Change>,
    /// Watches from before this version get 410 Gone.
    oldest: u64,
    watches: Vec<Watch>,
    /// Watch events sent into each client's watches.
    sent: BTreeMap<ClientId, u64>,
}

impl Store {
    /// The current resource version (what a list answers with).
    pub fn version(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, resource: &Resource, key: &Key) -> Option<&Value> {
        self.objects.get(resource)?.get(key)
    }

    pub fn list(&self, resource: &Resource, filter: &Filter) -> Vec<Value> {
        self.objects
            .get(resource)
            .into_iter()
            .flat_map(BTreeMap::values)
            .filter(|o| filter.matches(o))
            .cloned()
            .collect()
    }

    /// Stores `object` (it has a `metadata.name`), keeping the uid and creation time of the
    /// object it replaces, giving new objects a uid and counting `generation` up when `spec`
    /// changes; with `announce`, the change goes into the history and the open watches.
    /// Returns the stored object and whether it is new.
    pub fn write(
        &mut self,
        resource: &Resource,
        mut object: Value,
        announce: bool,
    ) -> (Value, bool) {
        let key = key_of(&object).expect("a stored object has a name");
        let old = self.get(resource, &key).cloned();
        let generation = match &old {
            None => 1,
            Some(o) => {
                let spec_changed = o.get("spec") != object.get("spec");
                o["metadata"]["generation"].as_i64().unwrap_or(1) + i64::from(spec_changed)
            }
        };
        if let Some(o) = &old {
            // What the server owns stays; with the old version, an unchanged object compares
            // equal to the stored one.
            for field in ["uid", "creationTimestamp", "resourceVersion"] {
                if let Some(v) = o["metadata"].get(field) {
                    object["metadata"][field] = v.clone();
                }
            }
        }
        object["metadata"]["generation"] = generation.into();
        if old.as_ref() == Some(&object) {
            return (object, false);
        }
        if object["metadata"]["uid"].is_null() {
            self.uids += 1;
            object["metadata"]["uid"] = format!("uid-{}", self.uids).into();
        }
        self.rv += 1;
        object["metadata"]["resourceVersion"] = self.rv.to_string().into();
        let event = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.objects
            .entry(resource.clone())
            .or_default()
            .insert(key, object.clone());
        if announce {
            self.announce(resource, event, &object);
        }
        (object, old.is_none())
    }

    /// Deletes an object; the object as it was.
    pub fn delete(&mut self, resource: &Resource, key: &Key) -> Option<Value> {
        let mut object = self.objects.get_mut(resource)?.remove(key)?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = self.rv.to_string().into();
        self.announce(resource, "DELETED", &object);
        Some(object)
    }

    fn announce(&mut self, resource: &Resource, event: &'static str, object: &Value) {
        let line = event_line(event, object);
        let sent = &mut self.sent;
        self.watches.retain(|w| {
            if w.resource != *resource || !w.filter.matches(object) {
                return true;
            }
            let open = w.tx.send(line.clone()).is_ok();
            if open {
                *sent.entry(w.client).or_default() += 1;
            }
            open
        });
        self.history.push(Change {
            rv: self.rv,
            resource: resource.clone(),
            event,
            object: object.clone(),
        });
    }

    /// A watch of `resource` from version `from` (0: the whole history): the changes after
    /// it, then every new one; a single 410 Gone when the history no longer reaches back.
    pub fn watch(
        &mut self,
        resource: &Resource,
        filter: Filter,
        from: u64,
        client: ClientId,
    ) -> UnboundedReceiver<Bytes> {
        let (tx, rx) = unbounded_channel();
        if from != 0 && from < self.oldest {
            // The sender goes with this scope: the stream ends after the error.
            let _ = tx.send(gone());
            return rx;
        }
        let mut replayed = 0;
        for c in &self.history {
            if c.rv > from && c.resource == *resource && filter.matches(&c.object) {
                let _ = tx.send(event_line(c.event, &c.object));
                replayed += 1;
            }
        }
        *self.sent.entry(client).or_default() += replayed;
        self.watches.push(Watch {
            resource: resource.clone(),
            filter,
            client,
            tx,
        });
        rx
    }

    /// Forgets the history: watches from any version before the current one get 410.
    pub fn compact(&mut self) {
        self.oldest = self.rv;
        self.history.clear();
    }

    /// Ends every open watch.
    pub fn end_watches(&mut self) {
        self.watches.clear();
    }

    /// Sends an `ERROR` event carrying `status` into every open watch; `end` closes them
    /// after it.
    pub fn watch_error(&mut self, status: &Value, end: bool) {
        let line = event_line("ERROR", status);
        self.watches.retain(|w| w.tx.send(line.clone()).is_ok());
        if end {
            self.watches.clear();
        }
    }

    pub fn open_watches(&mut self) -> usize {
        self.watches.retain(|w| !w.tx.is_closed());
        self.watches.len()
    }

    pub fn sent(&self, client: ClientId) -> u64 {
        self.sent.get(&client).copied().unwrap_or(0)
    }
}
