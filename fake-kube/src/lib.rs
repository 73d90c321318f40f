//! A fake Kubernetes API server for Lace's tests and benchmarks (no API server can be
//! installed on the machines they run on), the fast way to test Kubernetes logic; the real
//! cluster tier proves the same against the real thing. It knows no Lace types: objects
//! are JSON, resources are named by API group and plural.
//!
//! It keeps objects per resource with resource versions and uids, and serves what a kube
//! client sends: lists and watches (namespace, field and label selectors; a watch from a
//! version replays what came after it, 410 Gone once compacted away), gets, creates, merge,
//! strategic merge, JSON and server-side apply patches of objects and of their `status`,
//! and deletes with preconditions, under `/api/v1` and `/apis/GROUP/VERSION`, namespaced
//! or cluster-scoped. Every request is recorded ([`Recorded`]) with its RBAC verb,
//! group and resource, for the tests and the checks that the charts' ClusterRoles grant
//! exactly what the code uses.
//!
//! The test side scripts it: objects come and go ([`FakeApi::put`], [`FakeApi::remove`]),
//! chosen requests fail ([`Fault`]), the whole server refuses or answers one status
//! ([`Mode`]), a resource is not installed ([`FakeApi::set_missing`]), watches end or get
//! an error event, the history is compacted.
//!
//! In process, it is a tower service a kube `Client` is built on ([`FakeApi::service`]);
//! over TCP, plain or TLS with a test CA ([`pki::Pki`]), it serves the real binaries and
//! benchmarks that keep it in another process ([`FakeApi::serve`], [`FakeApi::serve_tls`]).

mod body;
mod fault;
mod patch;
pub mod pki;
mod record;
mod resource;
mod select;
mod serve;
mod store;
mod tcp;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

pub use body::FakeBody;
pub use fault::{Fault, Mode};
pub use record::Recorded;
pub use resource::{plural, Resource};
pub use serve::FakeService;
pub use store::ClientId;
pub use tcp::Served;

use store::{key_of, Key, Store};

/// See the crate docs. Cheap to clone: the clones share one server.
#[derive(Clone, Debug, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    store: Store,
    requests: Vec<Recorded>,
    /// How far [`FakeApi::take_writes`] has returned `requests`.
    taken: usize,
    faults: Vec<Fault>,
    mode: Mode,
    /// Resources that are not installed (a CRD missing): 404.
    missing: BTreeSet<Resource>,
    clients: u64,
    /// Each field manager's last applied configuration of an object (and whether it was to
    /// its `status`), what server-side apply removes fields by.
    applied: BTreeMap<(Resource, Key, String, bool), Value>,
}

/// The resource of an object with `apiVersion` and `kind`.
fn resource_of(object: &Value) -> Option<Resource> {
    Some(Resource::of(
        object["apiVersion"].as_str()?,
        object["kind"].as_str()?,
    ))
}

fn key(namespace: &str, name: &str) -> Key {
    (namespace.to_string(), name.to_string())
}

impl State {
    /// Stores `object` as another client's write; the object as stored.
    fn put(&mut self, object: Value, announce: bool) -> Value {
        let resource = resource_of(&object).expect("an object to put has apiVersion and kind");
        assert!(
            key_of(&object).is_some(),
            "an object to put has metadata.name"
        );
        self.store.write(&resource, object, announce).0
    }

    fn delete(&mut self, resource: &Resource, key: &Key) -> Option<Value> {
        self.applied
            .retain(|(r, k, _, _), _| !(r == resource && k == key));
        self.store.delete(resource, key)
    }
}

impl FakeApi {
    pub fn new() -> FakeApi {
        FakeApi::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock has failed already; the state is
        // still what it was.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new client of the fake: the service a kube `Client` is built on.
    pub fn service(&self) -> FakeService {
        let id = {
            let mut s = self.lock();
            s.clients += 1;
            ClientId(s.clients)
        };
        FakeService::new(self.clone(), id)
    }

    /// Creates or replaces `object` (with `apiVersion`, `kind`, `metadata.name`, and
    /// `metadata.namespace` for a namespaced kind) as another client would (a user, the
    /// kubelet), and tells the watches; the object as stored. Panics without those fields
    /// (a mistake in the test).
    pub fn put(&self, object: Value) -> Value {
        self.lock().put(object, true)
    }

    /// Creates or replaces `object` without telling the watches (a watch that lags behind).
    pub fn put_quietly(&self, object: Value) -> Value {
        self.lock().put(object, false)
    }

    /// Deletes an object (`namespace` empty for a cluster-scoped one) as another client
    /// would (the garbage collector, a user); the object as it was.
    pub fn remove(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        self.lock()
            .delete(&Resource::of(api_version, kind), &key(namespace, name))
    }

    /// The stored object (`namespace` empty for a cluster-scoped one).
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        self.lock()
            .store
            .get(&Resource::of(api_version, kind), &key(namespace, name))
            .cloned()
    }

    /// Every stored object of a kind (in `namespace`, or in all), by namespace and name.
    pub fn list(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        let filter = select::Filter::new(namespace.map(str::to_string), &BTreeMap::new());
        self.lock()
            .store
            .list(&Resource::of(api_version, kind), &filter)
    }

    pub fn set_mode(&self, mode: Mode) {
        let mut s = self.lock();
        s.mode = mode;
        if mode != Mode::Up {
            s.store.end_watches();
        }
    }

    /// Makes a kind's resource 404 (its CRD is not installed) or exist again.
    pub fn set_missing(&self, api_version: &str, kind: &str, missing: bool) {
        let resource = Resource::of(api_version, kind);
        let mut s = self.lock();
        if missing {
            s.missing.insert(resource);
        } else {
            s.missing.remove(&resource);
        }
    }

    /// Adds a fault; the first that matches a request answers it.
    pub fn fault(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    /// Ends every open watch (an API server restart; clients resume from their versions).
    pub fn end_watches(&self) {
        self.lock().store.end_watches();
    }

    /// Forgets the history: resuming a watch from any version before the current one gets
    /// 410 Gone.
    pub fn compact(&self) {
        self.lock().store.compact();
    }

    /// Sends an `ERROR` event with `code` into every open watch (410 ends them, as the API
    /// server does).
    pub fn watch_error(&self, code: u16) {
        let (reason, message) = match code {
            410 => ("Expired", "too old resource version"),
            _ => (fault::reason(code), "injected"),
        };
        self.lock()
            .store
            .watch_error(&store::status(code, reason, message), code == 410);
    }

    /// How many watches are open.
    pub fn open_watches(&self) -> usize {
        self.lock().store.open_watches()
    }

    /// Watch events sent into the watches of client `id` so far.
    pub fn sent(&self, id: ClientId) -> u64 {
        self.lock().store.sent(id)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// Adds a request to the record (one another fake recorded, to merge records).
    pub fn record(&self, request: Recorded) {
        self.lock().requests.push(request);
    }

    /// The writes (requests other than GET) since the last call.
    pub fn take_writes(&self) -> Vec<Recorded> {
        let mut s = self.lock();
        let start = s.taken;
        s.taken = s.requests.len();
        s.requests[start..]
            .iter()
            .filter(|r| r.is_write())
            .cloned()
            .collect()
    }

    /// How many requests so far were `rbac` (`list pods`, see [`Recorded::rbac`]).
    pub fn count(&self, rbac: &str) -> usize {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.rbac() == rbac)
            .count()
    }

    /// How many requests so far had an RBAC form starting with `prefix` (`watch `).
    pub fn count_prefix(&self, prefix: &str) -> usize {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.rbac().starts_with(prefix))
            .count()
    }
}
