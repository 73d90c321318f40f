//! Where the agent's cluster state comes from. The lifecycle ([`super::run`]) is the same for
//! every source; a source only feeds [`super::Agent::set_state`] and answers for pods the
//! state does not hold yet:
//!
//! - [`super::standalone::DirectorySource`]: a directory of YAML manifests (the demo, the
//!   tests);
//! - [`super::cluster::KubeSource`]: the Kubernetes API (in-cluster mode).

use std::sync::Arc;

use futures::future::BoxFuture;
use prometheus_client::registry::Registry;

use super::Agent;
use crate::state::{ObjectKey, Pod};

/// Why a source could not answer for a pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("looking up pod {pod}: {reason}")]
pub struct PodLookupError {
    pub pod: ObjectKey,
    pub reason: String,
}

/// Why a source has no cluster state to give now, in the source's own terms (its typed
/// error): what it hands [`Agent::set_state`] instead of a state, and so the agent's not-ready
/// reason until the next one.
#[derive(Clone, Debug, thiserror::Error)]
#[error(transparent)]
pub struct StateUnavailable(Arc<dyn std::error::Error + Send + Sync>);

impl StateUnavailable {
    pub fn new(reason: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(reason))
    }
}

/// A source of cluster state. See the module docs.
pub trait StateSource: Send + Sync + 'static {
    /// What the source reads, for the start-up log line (`manifests /etc/lace`, `the
    /// Kubernetes API at https://…`).
    fn describe(&self) -> String;

    /// Feeds `agent` (with [`Agent::set_state`]) for as long as the future runs; the
    /// lifecycle drops it at shutdown.
    fn run(self: Arc<Self>, agent: Arc<Agent>) -> BoxFuture<'static, ()>;

    /// A pod a CNI ADD names that the state does not hold: the source's best knowledge of
    /// it, or `Ok(None)` when it does not exist. The kubelet creates the Pod object before
    /// the runtime runs the plugin, so in a cluster this is a watch that has not caught up.
    fn unknown_pod<'a>(
        &'a self,
        pod: &'a ObjectKey,
    ) -> BoxFuture<'a, Result<Option<Pod>, PodLookupError>>;

    /// Adds the source's own metrics to the agent's registry (served on `/metrics`).
    fn register_metrics(&self, _registry: &mut Registry) {}
}

/// A source that only answers for the pods it is given (unit tests of the agent).
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Known(pub std::collections::BTreeMap<ObjectKey, Pod>);

#[cfg(test)]
impl StateSource for Known {
    fn describe(&self) -> String {
        "fixed pods".into()
    }

    fn run(self: Arc<Self>, _agent: Arc<Agent>) -> BoxFuture<'static, ()> {
        Box::pin(futures::future::pending())
    }

    fn unknown_pod<'a>(
        &'a self,
        pod: &'a ObjectKey,
    ) -> BoxFuture<'a, Result<Option<Pod>, PodLookupError>> {
        Box::pin(futures::future::ready(Ok(self.0.get(pod).cloned())))
    }
}
