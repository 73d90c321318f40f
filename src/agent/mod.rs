//! The node agent: serves the CNI plugin over a unix socket, owns pod IPAM, keeps the node's
//! plan up to date and hands it to the dataplane reconciler.
//!
//! One lifecycle ([`lifecycle::run`]) whatever feeds the cluster state: a [`StateSource`]
//! (the manifest directory of standalone mode, [`standalone::DirectorySource`], or the
//! Kubernetes watches) calls [`Agent::set_state`], which admits the state
//! ([`crate::validate::admit`]: invalid Lace objects are left out and logged, the rest
//! keeps working) and builds the node's planner.
//!
//! Start-up order (each step needs the previous one):
//! 1. open the IPAM store (`--state-dir`, exclusive lock);
//! 2. start the state source (the node is not ready until it delivers a state in which this
//!    node is allocated);
//! 3. verify IPAM against the kernel: release records whose host veth is gone, delete
//!    `lp-*` veths nobody owns ([`cni::verify_against_kernel`]);
//! 4. replay the DELs the plugin queued while the agent was away;
//! 5. bind the socket and serve; once the node is ready (state loaded, this node allocated),
//!    install the plugin binary and write the conflist, so the node only turns Ready when
//!    pods can really get networks;
//! 6. reconcile through [`Dataplane`] on every change, on drift and periodically
//!    ([`reconcile`]).
//!
//! Decisions, in one place:
//! - **Pod addressing**: one `/32` and one `/128` per pod (one per block of its Network on
//!   this node), default routes via the link-local gateways `169.254.1.1` (with a `/32`
//!   `scope link` route) and `fe80::1`, both pinned as permanent neighbour entries to the host
//!   end's MAC, and proxy ARP on the host end. Which addresses are never handed out: see
//!   [`ipam`].
//! - **MTU**: pod MTU = the smallest of what the underlay paths this node uses leave
//!   ([`crate::plan::underlay::pod_mtu`]): over IPv6, the MTU of the link holding the node's
//!   IPv6 underlay address minus [`SRV6_OVERHEAD`] (64 bytes: outer IPv6 40 + SRH 8 + one
//!   16-byte segment); over IPv4, the MTU of the link holding its IPv4 underlay address minus
//!   those 64 and [`crate::plan::underlay::IPV4_FOU_OVERHEAD`] (28: outer IPv4 20 + UDP 8).
//!   1500 is assumed for a link that cannot be found. Set at CNI ADD: pods keep theirs.
//! - **One kernel stack**: every kernel read and write goes through the [`Dataplane`]: the
//!   reconcile, and ADD's work for its pod (the veth pair and the pod end in the pod's
//!   namespace, then [`Dataplane::attach`]: the pod's part of the plan on the node, the
//!   Network's VRF if it is missing, enslavement, routes with Lace's protocol). ADD writes
//!   each of the pod's kernel objects once; the reconcile it triggers finds them as planned.
//!   Plans are made on the dataplane's thread, after every write that came before, so they
//!   include every pod ADD set up.
//! - **Unknown pods**: a pod an ADD names that the state lacks is asked of the source
//!   ([`StateSource::unknown_pod`]).
//! - **Conflist on shutdown**: kept (see [`install`]).

pub mod cluster;
pub mod cni;
pub mod install;
pub mod ipam;
pub mod lifecycle;
pub mod metrics;
pub mod paths;
#[cfg(any(test, feature = "testing"))]
mod plan_sink;
pub mod reconcile;
pub mod server;
pub mod source;
pub mod standalone;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

use crate::plan::underlay::UnderlayFacts;
use crate::plan::{underlay, DesiredNode, PlanError, Planner};
use crate::state::ClusterState;
use crate::wire::{LogLevel, PluginSettings, DEFAULT_TIMEOUT_SECONDS};

pub use lifecycle::NotReady;
#[cfg(any(test, feature = "testing"))]
pub use plan_sink::PlanSink;
pub use reconcile::{Dataplane, DataplaneError};
pub use source::{StateSource, StateUnavailable};

pub use underlay::{DEFAULT_UNDERLAY_MTU, SRV6_OVERHEAD};
/// Directory (under the state dir) where the plugin queues DELs while the agent is away.
pub const DEL_QUEUE_SUBDIR: &str = "cni-del-queue";

/// Everything `lace-agent run` is configured with.
#[derive(Clone, Debug)]
pub struct Config {
    /// This node's name.
    pub node: String,
    /// `--state-dir`: IPAM store and the plugin's DEL queue.
    pub state_dir: PathBuf,
    /// `--socket`: where the CNI server listens.
    pub socket: PathBuf,
    /// `--netns`: the namespace programmed as "the node" (tests); `None` = the agent's own.
    pub netns: Option<PathBuf>,
    /// `--cni-bin-dir`.
    pub cni_bin_dir: PathBuf,
    /// `--cni-conf-dir`.
    pub cni_conf_dir: PathBuf,
    /// `--cni-conf-name`.
    pub cni_conf_name: String,
    /// `--cni-bin-source`: the plugin binary to install.
    pub cni_bin_source: PathBuf,
    /// `--metrics-addr`.
    pub metrics_addr: SocketAddr,
    /// `--kubelet-cgroup-path`: attach the kubelet probe program there, if set.
    pub kubelet_cgroup: Option<PathBuf>,
    /// `--release-pinned-maps`.
    pub release_pinned: bool,
    /// `--resync-interval`: how often the dataplane is reconciled with full dumps.
    pub resync_interval: std::time::Duration,
}

impl Config {
    /// What the conflist tells the plugin.
    pub fn plugin_settings(&self) -> PluginSettings {
        PluginSettings {
            agent_socket: self.socket.clone(),
            del_queue_dir: self.state_dir.join(DEL_QUEUE_SUBDIR),
            timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
            log_file: None,
            log_level: LogLevel::default(),
        }
    }
}

/// Why the agent could not start, stopped, or cannot plan this node.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Ipam(#[from] ipam::IpamError),
    #[error(transparent)]
    Plan(Box<PlanError>),
    #[error(transparent)]
    Server(#[from] server::ServerError),
    #[error("cannot listen for metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("DEL queue: {0}")]
    DelQueue(#[from] crate::wire::del_queue::DelQueueError),
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("verifying IPAM against the kernel: {0}")]
    Verify(#[source] cni::KernelError),
}

/// The cluster state the agent serves from, with this node's planner.
#[derive(Debug)]
pub struct Loaded {
    pub state: Arc<ClusterState>,
    pub planner: Planner,
}

/// The running agent, shared by the CNI server, the reconcile loop and the watcher.
pub struct Agent {
    pub(crate) node: String,
    pub(crate) ipam: ipam::IpamStore,
    pub(crate) metrics: metrics::Metrics,
    pub(crate) dataplane: Arc<dyn Dataplane>,
    pub(crate) source: Arc<dyn StateSource>,
    pub(crate) reconcile_wanted: Notify,
    /// How many dataplane applies have succeeded (the Kubernetes source marks the Node's
    /// network available after the first).
    pub(crate) applied: tokio::sync::watch::Sender<u64>,
    /// The state, or why there is none usable.
    cluster: RwLock<Result<Arc<Loaded>, NotReady>>,
    /// Bumped by every [`Agent::set_state`].
    generation: AtomicU64,
    /// The objects the last admission left out, with why (logged when the set changes).
    rejected: std::sync::Mutex<Vec<String>>,
    /// The pods' MTU [`Agent::refresh_underlay_mtu`] last logged; 0 until first read.
    pod_mtu: AtomicU32,
    /// The MTUs of the links holding the node's IPv4 and IPv6 underlay addresses, as last
    /// read; 0: unknown.
    link_mtus: [AtomicU32; 2],
    /// What the probes found about the uplink and the peers ([`paths`]), planned with.
    facts: std::sync::Mutex<UnderlayFacts>,
    /// Wakes the probe loop (a new state: new peers to probe).
    pub(crate) underlay_wanted: Notify,
    /// Starts a probe round at once (drift: the uplink may have lost IPv6 and its addresses).
    pub(crate) underlay_look_now: Notify,
    /// Whether the probe loop has looked at the uplink once: until then, a node with peers a
    /// link-local path could serve is not ready (its pods would get the MTU of fou).
    underlay_probed: AtomicBool,
    serving: AtomicBool,
    /// Attachments whose interfaces are being created or deleted right now: GC leaves them
    /// alone, and each triggers a reconcile when done.
    in_flight: std::sync::Mutex<std::collections::HashSet<ipam::AttachmentKey>>,
    /// CNI connections accepted and not answered yet.
    pub(crate) open_connections: std::sync::atomic::AtomicUsize,
}

/// Marks an attachment in flight until dropped, then triggers a reconcile.
pub(crate) struct InFlight<'a> {
    agent: &'a Agent,
    key: ipam::AttachmentKey,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.agent
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
        self.agent.reconcile_wanted.notify_one();
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// An agent for `node` programming the kernel through `dataplane`, fed by `source`; not
    /// ready until [`Agent::set_state`].
    pub fn new(
        node: String,
        ipam: ipam::IpamStore,
        dataplane: Arc<dyn Dataplane>,
        source: Arc<dyn StateSource>,
    ) -> Self {
        Self {
            node,
            ipam,
            metrics: metrics::Metrics::with_source(&*source),
            dataplane,
            source,
            reconcile_wanted: Notify::new(),
            applied: tokio::sync::watch::Sender::new(0),
            cluster: RwLock::new(Err(NotReady::NotLoaded)),
            generation: AtomicU64::new(0),
            rejected: Default::default(),
            pod_mtu: AtomicU32::new(0),
            link_mtus: [AtomicU32::new(0), AtomicU32::new(0)],
            facts: Default::default(),
            underlay_wanted: Notify::new(),
            underlay_look_now: Notify::new(),
            underlay_probed: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            in_flight: Default::default(),
            open_connections: Default::default(),
        }
    }

    /// The attachments in flight right now.
    pub(crate) fn in_flight_keys(&self) -> std::collections::HashSet<ipam::AttachmentKey> {
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Marks `key` in flight while the returned guard lives (its interfaces are changing).
    pub(crate) fn in_flight(&self, key: &ipam::AttachmentKey) -> InFlight<'_> {
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone());
        InFlight {
            agent: self,
            key: key.clone(),
        }
    }

    /// Installs a new cluster state (or the reason there is none) and triggers a reconcile.
    /// The state is admitted first: Lace objects that fail validation are left out (each
    /// logged once, when the set of rejected objects changes, and counted in
    /// `lace_rejected_objects`), so one bad object never takes the node down. A state whose
    /// plan fails for this node (e.g. no allocation yet) makes the agent not ready, with the
    /// planner's message as the reason.
    pub fn set_state(&self, state: Result<ClusterState, StateUnavailable>) {
        let state = state.map(|state| self.admit(state));
        // Held until the planner is installed: facts changing meanwhile wait, then re-plan
        // this state (set_underlay_facts), so neither install undoes the other's.
        let facts = self.facts();
        let loaded = state.map_err(NotReady::Source).and_then(|state| {
            match Planner::with_facts(&self.node, &state, &facts) {
                Ok(planner) => Ok(Arc::new(Loaded {
                    state: Arc::new(state),
                    planner,
                })),
                Err(e @ PlanError::NodeNotAllocated { .. }) => {
                    Err(NotReady::Unallocated(Box::new(e)))
                }
                Err(e) => Err(NotReady::Plan(Box::new(e))),
            }
        });
        if let Err(why) = &loaded {
            tracing::warn!(node = %self.node, reason = %why, "not ready");
        }
        self.install(loaded);
        drop(facts);
        self.underlay_wanted.notify_one();
    }

    /// Installs a planner (or why there is none), reporting the pairs whose path changed,
    /// and triggers a reconcile.
    fn install(&self, loaded: Result<Arc<Loaded>, NotReady>) {
        let mut cluster = self.cluster.write().unwrap_or_else(|e| e.into_inner());
        if let Ok(new) = &loaded {
            let before = cluster.as_ref().ok().map(|l| &l.planner.base().peers);
            paths::report(self, before, &new.planner.base().peers);
        }
        *cluster = loaded;
        drop(cluster);
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.reconcile_wanted.notify_one();
    }

    /// What the probes found last ([`paths`]).
    pub fn facts(&self) -> std::sync::MutexGuard<'_, UnderlayFacts> {
        self.facts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Plans with new facts about the uplink and the peers, if they changed.
    pub fn set_underlay_facts(&self, facts: UnderlayFacts) {
        // Held until the planner is installed (see set_state).
        let mut current = self.facts();
        if *current == facts {
            return;
        }
        *current = facts;
        let Ok(loaded) = self.loaded() else {
            return;
        };
        match Planner::with_facts(&self.node, &loaded.state, &current) {
            Ok(planner) => self.install(Ok(Arc::new(Loaded {
                state: Arc::clone(&loaded.state),
                planner,
            }))),
            Err(e) => tracing::error!(error = %e, "cannot plan with the new underlay facts"),
        }
    }

    /// [`crate::validate::admit`], logging what it left out when that changes.
    fn admit(&self, state: ClusterState) -> ClusterState {
        let (state, rejected) = crate::validate::admit(state);
        let now: Vec<String> = rejected
            .iter()
            .map(|r| format!("{}/{}: {r}", r.kind, r.name))
            .collect();
        let mut last = self.rejected.lock().unwrap_or_else(|e| e.into_inner());
        if *last != now {
            for (r, line) in rejected.iter().zip(&now) {
                if !last.contains(line) {
                    tracing::error!(kind = r.kind, name = %r.name, reason = %r, "invalid object left out of the cluster state; everything else keeps working");
                }
            }
            self.metrics.set_rejected(&rejected);
            *last = now;
        }
        state
    }

    /// Follows how many dataplane applies have succeeded.
    pub fn applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// How many states [`Agent::set_state`] has installed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current state, or why the agent is not ready.
    pub fn loaded(&self) -> Result<Arc<Loaded>, NotReady> {
        self.cluster
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `None` when ADD can be served, else why not.
    pub fn not_ready_reason(&self) -> Option<NotReady> {
        if !self.serving.load(Ordering::Acquire) {
            return Some(NotReady::NotServing);
        }
        let loaded = match self.loaded() {
            Ok(l) => l,
            Err(e) => return Some(e),
        };
        let probed = self.underlay_probed.load(Ordering::Acquire);
        if !probed && !paths::query(&self.node, &loaded.state).peers.is_empty() {
            return Some(NotReady::UnderlayUnknown);
        }
        None
    }

    /// The probe loop looked at the uplink (and its facts are installed).
    pub(crate) fn underlay_looked(&self) {
        self.underlay_probed.store(true, Ordering::Release);
    }

    /// Whether ADD can be served.
    pub fn is_ready(&self) -> bool {
        self.not_ready_reason().is_none()
    }

    pub(crate) fn set_serving(&self) {
        self.serving.store(true, Ordering::Release);
    }

    /// The pods' MTU: from the paths the current plan expects to each other node and the
    /// underlay links' MTUs as last read ([`underlay::pod_mtu`]; an unknown link counts as
    /// 1500). Computed when asked, so an ADD right after the plan changed already fits it.
    pub fn pod_mtu(&self) -> u32 {
        let [v4, v6] = self
            .link_mtus
            .each_ref()
            .map(|m| Some(m.load(Ordering::Relaxed)).filter(|&m| m != 0));
        match self.loaded() {
            Ok(l) => {
                let b = l.planner.base();
                underlay::pod_mtu(&b.underlay, b.expected_paths().iter(), v4, v6)
            }
            Err(_) => DEFAULT_UNDERLAY_MTU - SRV6_OVERHEAD,
        }
    }

    /// Re-reads the MTUs of the links holding the node's underlay addresses (its
    /// NodeAllocation's) and sets the pods' MTU from the paths the plan uses to the other
    /// nodes ([`underlay::pod_mtu`]).
    pub async fn refresh_underlay_mtu(&self) {
        let Ok(loaded) = self.loaded() else {
            return;
        };
        let base = Arc::clone(loaded.planner.base());
        let addrs = [
            base.underlay.ipv4.map(IpAddr::V4),
            base.underlay.ipv6.map(IpAddr::V6),
        ];
        let dataplane = Arc::clone(&self.dataplane);
        let found = tokio::task::spawn_blocking(move || {
            let node = dataplane.snapshot()?;
            Ok::<_, DataplaneError>(addrs.map(|ip| -> Option<u32> {
                let (_, index) = node.addrs.iter().find(|(a, _)| Some(*a) == ip)?;
                Some(node.links.values().find(|l| l.index == *index)?.mtu)
            }))
        })
        .await;
        let [mtu_v4, mtu_v6] = match found {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the underlay MTU");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the underlay MTU lookup failed");
                return;
            }
        };
        for (ip, mtu) in addrs.iter().zip([mtu_v4, mtu_v6]) {
            if let (Some(ip), None) = (ip, mtu) {
                tracing::warn!(
                    node = %self.node,
                    underlay = %ip,
                    "no link holds this underlay address; assuming MTU {DEFAULT_UNDERLAY_MTU}"
                );
            }
        }
        for (slot, mtu) in self.link_mtus.iter().zip([mtu_v4, mtu_v6]) {
            slot.store(mtu.unwrap_or(0), Ordering::Relaxed);
        }
        let pod = underlay::pod_mtu(&base.underlay, base.expected_paths().iter(), mtu_v4, mtu_v6);
        let before = self.pod_mtu.swap(pod, Ordering::Relaxed);
        tracing::info!(?mtu_v4, ?mtu_v6, pod_mtu = pod, "underlay MTU");
        if before != 0 && pod < before {
            tracing::warn!(
                before,
                now = pod,
                "the pod MTU shrank (a path with more overhead is in use): pods started before \
                 keep {before} and lose larger packets on that path until they are restarted"
            );
        }
    }

    /// The node's full plan for the current state and attachments; `None` if not ready.
    pub fn plan(&self) -> Result<Option<DesiredNode>, AgentError> {
        let Ok(loaded) = self.loaded() else {
            return Ok(None);
        };
        let attachments = self.ipam.pod_attachments()?;
        loaded
            .planner
            .plan(&attachments)
            .map(Some)
            .map_err(|e| AgentError::Plan(Box::new(e)))
    }
}

/// Runs the agent, fed by `source`, until SIGINT/SIGTERM (see [`lifecycle::run`]).
pub fn run(
    config: Config,
    source: Arc<dyn StateSource>,
    dataplane: Arc<dyn Dataplane>,
) -> Result<(), AgentError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
    rt.block_on(lifecycle::run(config, source, dataplane))
}
