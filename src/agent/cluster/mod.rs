//! In-cluster mode's state source: the Kubernetes API ([`KubeSource`]).
//!
//! **Connecting** (`connect`): the API server at `LACE_APISERVER_ADDRESS` (the chart bakes
//! the default/kubernetes EndpointSlice's address into it, so it works before any Service
//! routing exists), else the in-cluster `KUBERNETES_SERVICE_HOST`/`PORT`; the pod's
//! service-account token and CA. The first request (a list of the own Node) is retried with
//! backoff until it succeeds; until then the agent is not ready and says why (address, what
//! to check) in its log, on `/healthz` and in CNI STATUS.
//!
//! **Watches** (`watch`), cheap by selector, slim types, lists from the watch cache:
//! the own Node (`metadata.name`), every Pod (a NetworkPolicy's peers live on every node:
//! their labels and addresses fill its sets), every NodeAllocation, NetworkAllocation,
//! Network and policy, NetworkPolicies, Namespaces, Services and EndpointSlices (those
//! labelled with their Service: ServiceRoutingPolicy backends).
//!
//! **Feeding** (`feed`): the watches' changes go into one [`crate::index::ClusterIndex`],
//! the only copy of the objects. The agent gets no state (stays not ready) until every watch
//! has delivered its first list; after that the state is handed to
//! [`Agent::set_state`] after changes settle ([`Timings::debounce`], at most
//! [`Timings::debounce_max`] into a burst), and again every [`Timings::resync`] (re-plan and
//! re-apply from the cache, repairing drift; not a relist).
//!
//! **API server away**: the state stays as it was, so the node keeps forwarding and CNI
//! ADD/DEL keep working from it; the watches retry with jittered backoff and resume from
//! their last resource versions (a relist only after 410 Gone); one log line when the API
//! server is lost and one when it answers again, `lace_apiserver_up` in between.
//!
//! **Unknown pods**: a CNI ADD for a pod the cache does not hold yet fetches it (the kubelet
//! created it before the runtime called the plugin; the watch may lag).
//!
//! **Node readiness** (`node_status`): after the first successful apply, the Node's
//! `NetworkUnavailable` condition is set to `False` (`LaceIsUp`).

mod address;
mod connect;
mod feed;
mod metrics;
mod node_status;
mod watch;

#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use kube::Client;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use address::{parse_address, AddressError};
pub use connect::{ApiServer, ConnectError, SERVICE_ACCOUNT_DIR};

use self::feed::Feeder;
use self::metrics::SourceMetrics;
use self::watch::{Backoff, Change, Lenient, OwnNode};
use super::source::{PodLookupError, StateSource, StateUnavailable};
use super::Agent;
use crate::k8s::Slim;
use crate::objects::{Body, BodyVisitor, Kind, NodeBody, Object, PodBody, SERVICE_NAME_LABEL};
use crate::state::{ObjectKey, Pod};

/// Every kind the agent watches. The ConfigMap of standalone mode is not among them: its
/// setting (the locator prefix) is the controller's.
pub const WATCHED: [Kind; 13] = [
    Kind::Network,
    Kind::NetworkBindingPolicy,
    Kind::ServiceBindingPolicy,
    Kind::NetworkRoutingPolicy,
    Kind::ServiceRoutingPolicy,
    Kind::NetworkAllocation,
    Kind::NodeAllocation,
    Kind::Namespace,
    Kind::Node,
    Kind::Pod,
    Kind::Service,
    Kind::EndpointSlice,
    Kind::NetworkPolicy,
];

/// Changes in flight between the watches and the feeder (a bound: a slow planner slows
/// the watches rather than growing memory).
const CHANNEL: usize = 1024;

/// The source's timings (tests shorten them).
#[derive(Clone, Debug)]
pub struct Timings {
    /// Quiet time after a change before the state is handed to the planner.
    pub debounce: Duration,
    /// Longest a change waits while changes keep coming.
    pub debounce_max: Duration,
    /// How often the state is handed over again without a change.
    pub resync: Duration,
    /// First retry delay of a failed request (doubling, jittered).
    pub backoff_min: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// How long a CNI ADD waits for a pod fetched from the API server (below the plugin's
    /// timeout, so the runtime sees Lace's error).
    pub pod_lookup: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            debounce: Duration::from_millis(100),
            debounce_max: Duration::from_secs(1),
            resync: Duration::from_secs(300),
            backoff_min: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            pod_lookup: Duration::from_secs(5),
        }
    }
}

/// Why the Kubernetes API gives the agent no state now.
#[derive(Debug, thiserror::Error)]
pub enum KubeUnavailable {
    /// The API server cannot even be tried (its address, the credentials).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The first request failed: what it means and what to check (`connect::explain`).
    #[error("{0}")]
    FirstRequest(String),
    /// Connected; not every watch has listed yet.
    #[error("waiting for the initial lists from the Kubernetes API at {apiserver}")]
    Listing { apiserver: String },
    /// A watch failed before every watch had listed (`pending`: the resources not listed).
    #[error("{why} (still waiting for the initial lists of {})", .pending.join(", "))]
    ListFailed { why: String, pending: Vec<String> },
}

/// The cluster state from the Kubernetes API. See the module docs.
pub struct KubeSource {
    node: String,
    api: ApiServer,
    timings: Timings,
    /// Set once the API server answered.
    client: OnceLock<Client>,
    metrics: SourceMetrics,
}

/// The `resource.group` of a kind, as RBAC and kubectl name it (`pods`, `networks.lace.io`).
fn resource(kind: Kind) -> String {
    match kind.group() {
        "" => kind.plural().to_string(),
        group => format!("{}.{group}", kind.plural()),
    }
}

/// The own Node (only it: Cilium's agent does the same), listed from the watch cache.
fn own_node_list(node: &str) -> ListParams {
    ListParams::default()
        .fields(&format!("metadata.name={node}"))
        .match_any()
}

/// What a watch of `kind` on `node` selects.
fn watch_config(kind: Kind, node: &str) -> watcher::Config {
    let config = watcher::Config::default().any_semantic();
    match kind {
        Kind::Node => config.fields(&format!("metadata.name={node}")),
        Kind::EndpointSlice => config.labels(SERVICE_NAME_LABEL),
        _ => config,
    }
}

/// Spawns the watch of a kind with its lenient body.
struct SpawnWatch<'a> {
    tasks: &'a mut JoinSet<()>,
    client: Client,
    config: watcher::Config,
    tx: mpsc::Sender<Change>,
    backoff: Backoff,
}

impl BodyVisitor for SpawnWatch<'_> {
    type Output = ();
    fn visit<B: Body>(self) {
        self.tasks.spawn(watch::run::<Lenient<B>>(
            self.client,
            self.config,
            self.tx,
            self.backoff,
            |_| {},
        ));
    }
}

impl KubeSource {
    pub fn new(node: String, api: ApiServer) -> Self {
        Self {
            node,
            api,
            timings: Timings::default(),
            client: OnceLock::new(),
            metrics: SourceMetrics::default(),
        }
    }

    /// The same source with other timings.
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(self.timings.backoff_min, self.timings.backoff_max)
    }

    /// Lists the own Node: the first request, and the reachability probe while the API
    /// server is away. Whether the Node exists.
    async fn probe(&self, client: &Client) -> Result<bool, kube::Error> {
        let nodes: Api<Slim<Lenient<NodeBody>>> = Api::all_with(client.clone(), &());
        Ok(!nodes
            .list(&own_node_list(&self.node))
            .await?
            .items
            .is_empty())
    }

    /// Retries until the API server answers; the agent says why it is not ready meanwhile.
    async fn connect(&self, agent: &Agent) -> Client {
        let mut backoff = self.backoff();
        let mut in_cluster_name = false;
        let mut last = String::new();
        loop {
            let attempt = match self.api.client(in_cluster_name) {
                Ok(client) => match self.probe(&client).await {
                    Ok(found) => {
                        tracing::info!(apiserver = %self.api.describe(), node = %self.node, "connected to the Kubernetes API");
                        if !found {
                            tracing::warn!(node = %self.node, "the API server has no Node of this name (yet): check --node-name (NODE_NAME, the pod's spec.nodeName)");
                        }
                        return client;
                    }
                    Err(e)
                        if !in_cluster_name
                            && self.api.may_verify_in_cluster_name()
                            && connect::is_name_mismatch(&e) =>
                    {
                        tracing::info!(apiserver = %self.api.describe(), "the API server's certificate does not name its address; verifying it as {}", connect::IN_CLUSTER_NAME);
                        in_cluster_name = true;
                        continue;
                    }
                    Err(e) => KubeUnavailable::FirstRequest(connect::explain(
                        &e,
                        &format!("list {}", resource(Kind::Node)),
                        &self.api,
                    )),
                },
                Err(e) => e.into(),
            };
            let delay = backoff.next_delay();
            tracing::warn!(error = %attempt, retry_in = ?delay, "cannot use the Kubernetes API; the node is not ready until it can, retrying");
            let text = attempt.to_string();
            if text != last {
                agent.set_state(Err(StateUnavailable::new(attempt)));
                last = text;
            }
            self.metrics.set_up(false);
            tokio::time::sleep(delay).await;
        }
    }

    async fn feed(self: Arc<Self>, agent: Arc<Agent>) {
        let client = self.connect(&agent).await;
        self.metrics.set_up(true);
        // Only this task sets it, once.
        let _ = self.client.set(client.clone());
        agent.set_state(Err(StateUnavailable::new(KubeUnavailable::Listing {
            apiserver: self.api.describe().to_string(),
        })));

        let (tx, mut rx) = mpsc::channel(CHANNEL);
        let (node_tx, node_rx) = tokio::sync::watch::channel(None);
        // Dropped with this future: the lifecycle's abort stops every watch.
        let mut tasks = JoinSet::new();
        for kind in WATCHED {
            let config = watch_config(kind, &self.node);
            if kind == Kind::Node {
                let node_tx = node_tx.clone();
                tasks.spawn(watch::run::<OwnNode>(
                    client.clone(),
                    config,
                    tx.clone(),
                    self.backoff(),
                    move |n: &Slim<OwnNode>| {
                        node_tx.send_replace(Some(n.body.network_unavailable.clone()));
                    },
                ));
            } else {
                kind.visit(SpawnWatch {
                    tasks: &mut tasks,
                    client: client.clone(),
                    config,
                    tx: tx.clone(),
                    backoff: self.backoff(),
                });
            }
        }
        tasks.spawn(node_status::keep_network_available(
            client.clone(),
            self.api.clone(),
            self.node.clone(),
            agent.applied(),
            node_rx,
            self.backoff(),
        ));

        let mut feeder = Feeder::new(&WATCHED);
        let mut loop_state = Loop {
            handed_over: false,
            api_up: true,
            probing: false,
            not_ready: String::new(),
        };
        // (first, last) change not handed over yet.
        let mut pending: Option<(Instant, Instant)> = None;
        let t = self.timings.clone();
        let mut resync = tokio::time::interval_at(Instant::now() + t.resync, t.resync);
        loop {
            let due = pending.map(|(first, last)| (last + t.debounce).min(first + t.debounce_max));
            let far = Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                change = rx.recv() => {
                    let Some(change) = change else { return };
                    match change {
                        Change::Failed { kind, error, retry_in } => {
                            self.failed(&agent, &feeder, &mut loop_state, &client, &tx, kind, &error, retry_in);
                        }
                        Change::Reachable => {
                            loop_state.probing = false;
                            self.reachable(&mut loop_state);
                        }
                        change => {
                            self.reachable(&mut loop_state);
                            self.count(&change);
                            if feeder.apply(change) {
                                let now = Instant::now();
                                pending = Some((pending.map_or(now, |(first, _)| first), now));
                            }
                            self.metrics.set_undecodable(&feeder.undecodable());
                            if !loop_state.handed_over && feeder.synced() {
                                tracing::info!(apiserver = %self.api.describe(), "every watch has listed; the cluster state is loaded");
                                self.hand_over(&agent, &feeder);
                                loop_state.handed_over = true;
                                pending = None;
                            }
                        }
                    }
                }
                _ = tokio::time::sleep_until(due.unwrap_or(far)), if due.is_some() && loop_state.handed_over => {
                    self.hand_over(&agent, &feeder);
                    pending = None;
                }
                _ = resync.tick() => {
                    if loop_state.handed_over {
                        self.hand_over(&agent, &feeder);
                        pending = None;
                    }
                }
            }
        }
    }

    fn hand_over(&self, agent: &Agent, feeder: &Feeder) {
        self.metrics.state_update();
        agent.set_state(Ok(feeder.state().clone()));
    }

    fn count(&self, change: &Change) {
        match change {
            Change::Apply { kind, .. } => self.metrics.event(*kind, "applied"),
            Change::Delete { kind, .. } => self.metrics.event(*kind, "deleted"),
            Change::ListStarted(kind) => self.metrics.event(*kind, "relisted"),
            Change::ListDone(kind) => self.metrics.synced(*kind),
            Change::Failed { .. } | Change::Reachable => {}
        }
    }

    /// A request succeeded: the API server is back if it was away.
    fn reachable(&self, s: &mut Loop) {
        if !s.api_up {
            s.api_up = true;
            self.metrics.set_up(true);
            tracing::info!(apiserver = %self.api.describe(), "the Kubernetes API answers again; watches resume from their last resource versions");
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn failed(
        &self,
        agent: &Agent,
        feeder: &Feeder,
        s: &mut Loop,
        client: &Client,
        tx: &mpsc::Sender<Change>,
        kind: Kind,
        error: &watcher::Error,
        retry_in: Duration,
    ) {
        let name = resource(kind);
        let (why, transport) = match error {
            watcher::Error::WatchError(status) if status.code == 410 => {
                tracing::info!(kind = %kind, "watch of {name} expired (410 Gone): relisting");
                return;
            }
            watcher::Error::InitialListFailed(e) => (
                connect::explain(e, &format!("list {name}"), &self.api),
                !matches!(e, kube::Error::Api(_)),
            ),
            watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => (
                connect::explain(e, &format!("watch {name}"), &self.api),
                !matches!(e, kube::Error::Api(_)),
            ),
            watcher::Error::WatchError(status) => (
                format!(
                    "watch {name}: the API server at {} sent an error: {} {}: {}",
                    self.api.describe(),
                    status.code,
                    status.reason,
                    status.message
                ),
                false,
            ),
            watcher::Error::NoResourceVersion => (
                format!(
                    "watch {name}: the API server sent an object without metadata.resourceVersion"
                ),
                false,
            ),
        };
        self.metrics.error(kind);
        if !s.handed_over {
            let reason = KubeUnavailable::ListFailed {
                why: why.clone(),
                pending: feeder.unsynced().into_iter().map(resource).collect(),
            };
            let text = reason.to_string();
            if text != s.not_ready {
                agent.set_state(Err(StateUnavailable::new(reason)));
                s.not_ready = text;
            }
        }
        if transport {
            if s.api_up {
                s.api_up = false;
                self.metrics.set_up(false);
                tracing::warn!(error = %why, "lost the Kubernetes API; the node keeps forwarding and serving CNI from the last known state; retrying");
            } else {
                tracing::debug!(kind = %kind, error = %why, retry_in = ?retry_in, "watch still failing");
            }
            if !s.probing {
                s.probing = true;
                self.spawn_probe(client.clone(), tx.clone());
            }
        } else {
            tracing::warn!(kind = %kind, error = %why, retry_in = ?retry_in, "watch failed; retrying");
        }
    }

    /// Probes the API server with backoff until it answers, then reports it reachable (an
    /// idle cluster sends no watch event that would tell).
    fn spawn_probe(&self, client: Client, tx: mpsc::Sender<Change>) {
        let node = self.node.clone();
        let mut backoff = self.backoff();
        tokio::spawn(async move {
            let nodes: Api<Slim<Lenient<NodeBody>>> = Api::all_with(client, &());
            loop {
                tokio::time::sleep(backoff.next_delay()).await;
                if tx.is_closed() {
                    return;
                }
                if nodes.list(&own_node_list(&node)).await.is_ok() {
                    let _ = tx.send(Change::Reachable).await;
                    return;
                }
            }
        });
    }
}

impl std::fmt::Debug for KubeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSource")
            .field("node", &self.node)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

/// The feed loop's flags.
#[derive(Debug)]
struct Loop {
    /// The agent has a state from this source.
    handed_over: bool,
    api_up: bool,
    /// A reachability probe is running.
    probing: bool,
    /// The last not-ready reason given to the agent.
    not_ready: String,
}

impl StateSource for KubeSource {
    fn describe(&self) -> String {
        format!("the Kubernetes API at {}", self.api.describe())
    }

    fn run(self: Arc<Self>, agent: Arc<Agent>) -> BoxFuture<'static, ()> {
        self.feed(agent).boxed()
    }

    fn unknown_pod<'a>(
        &'a self,
        pod: &'a ObjectKey,
    ) -> BoxFuture<'a, Result<Option<Pod>, PodLookupError>> {
        async move {
            let error = |reason: String| PodLookupError {
                pod: pod.clone(),
                reason,
            };
            let Some(client) = self.client.get().cloned() else {
                return Err(error(format!(
                    "not connected to the Kubernetes API at {} yet",
                    self.api.describe()
                )));
            };
            let pods: Api<Slim<Lenient<PodBody>>> =
                Api::namespaced_with(client, &pod.namespace, &());
            let fetched = tokio::time::timeout(self.timings.pod_lookup, pods.get_opt(&pod.name))
                .await
                .map_err(|_| {
                    error(format!(
                        "the Kubernetes API at {} did not answer within {:?}",
                        self.api.describe(),
                        self.timings.pod_lookup
                    ))
                })
                .and_then(|r| {
                    r.map_err(|e| error(connect::explain(&e, &format!("get pod {pod}"), &self.api)))
                });
            let fetched = match fetched {
                Ok(f) => f,
                Err(e) => {
                    self.metrics.pod_lookup("error");
                    return Err(e);
                }
            };
            let Some(slim) = fetched else {
                self.metrics.pod_lookup("missing");
                return Ok(None);
            };
            self.metrics.pod_lookup("found");
            match slim.into_object() {
                Ok(Some(Object::Pod(_, p))) => Ok(Some(p)),
                Ok(_) => Ok(None),
                Err(e) => Err(error(format!("the API server's pod is unusable: {e}"))),
            }
        }
        .boxed()
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }
}
