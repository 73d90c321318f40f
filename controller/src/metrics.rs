//! The controller's Prometheus metrics and probes, served by [`lace::telemetry`]:
//!
//! - `lace_controller_writes_total{verb,resource,result}`: API writes by outcome (`ok`,
//!   `conflict`, `not_found`, `forbidden`, `invalid`, `error`);
//! - `lace_controller_events_total{event_type,result}`: Kubernetes Events published;
//! - `lace_controller_watch_events_total{kind}`, `lace_controller_watch_errors_total{kind}`;
//! - `lace_controller_passes_total{result}` (`ok`, `nothing` when nothing had to be written,
//!   `retry`) and `lace_controller_pass_duration_seconds`;
//! - `lace_controller_nodes{state}` (`allocated`, `unallocated`),
//!   `lace_controller_networks{state}` (`ready`, `not_ready`),
//!   `lace_controller_policies_not_ready`, `lace_controller_node_locators_free`;
//! - `lace_controller_caches_synced`: 1 once every watch has listed.
//!
//! `/readyz` answers 200 once the caches are synced and a pass has completed, `/healthz`
//! while the controller runs.

use std::sync::Mutex;

use lace::objects::Kind;
use lace::telemetry::{Probes, LATENCY_BUCKETS};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::desired::Summary;
use crate::error::FatalError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    verb: &'static str,
    resource: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event_type: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

/// Where the controller is, for `/readyz` and for tests waiting on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every watch has listed once.
    pub synced: bool,
    /// Watch events (not list items) applied to the model.
    pub watch_events: u64,
    /// Passes finished (with or without writes, successful or not).
    pub passes: u64,
    /// A pass completed without error at least once.
    pub reconciled: bool,
    /// Changes are waiting for a pass (or a failed pass for its retry).
    pub pending: bool,
    /// Why the last pass failed, while it is being retried.
    pub last_error: Option<String>,
}

/// Why the controller is not healthy (stopped) or not ready: the probes' 503 body.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// It stopped on an error it cannot work around.
    #[error(transparent)]
    Stopped(FatalError),
    #[error("the watches have not listed every kind yet")]
    Unsynced,
    #[error("the first pass has not completed")]
    NoPass,
    /// The first pass failed with this error and is being retried.
    #[error("the first pass has not completed: {0}")]
    PassFailing(String),
}

/// The controller's metrics and progress. Cheap to update from any task.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    writes: Family<WriteLabels, Counter>,
    events: Family<EventLabels, Counter>,
    watch_events: Family<KindLabels, Counter>,
    watch_errors: Family<KindLabels, Counter>,
    passes: Family<ResultLabels, Counter>,
    pass_latency: Histogram,
    nodes: Family<StateLabels, Gauge>,
    networks: Family<StateLabels, Gauge>,
    policies_not_ready: Gauge,
    locators_free: Gauge,
    synced: Gauge,
    progress: tokio::sync::watch::Sender<Progress>,
    stopped: Mutex<Option<FatalError>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Self {
            registry: Registry::default(),
            writes: Family::default(),
            events: Family::default(),
            watch_events: Family::default(),
            watch_errors: Family::default(),
            passes: Family::default(),
            pass_latency: Histogram::new(LATENCY_BUCKETS),
            nodes: Family::default(),
            networks: Family::default(),
            policies_not_ready: Gauge::default(),
            locators_free: Gauge::default(),
            synced: Gauge::default(),
            progress: tokio::sync::watch::Sender::new(Progress::default()),
            stopped: Mutex::new(None),
        };
        let mut r = Registry::default();
        r.register(
            "lace_controller_writes",
            "API writes by verb, resource and result.",
            m.writes.clone(),
        );
        r.register(
            "lace_controller_events",
            "Kubernetes Events published.",
            m.events.clone(),
        );
        r.register(
            "lace_controller_watch_events",
            "Watch events received by kind.",
            m.watch_events.clone(),
        );
        r.register(
            "lace_controller_watch_errors",
            "Watch errors by kind (retried with backoff).",
            m.watch_errors.clone(),
        );
        r.register(
            "lace_controller_passes",
            "Reconcile passes by result.",
            m.passes.clone(),
        );
        r.register(
            "lace_controller_pass_duration_seconds",
            "Time of a reconcile pass, writes included.",
            m.pass_latency.clone(),
        );
        r.register(
            "lace_controller_nodes",
            "Nodes by allocation state.",
            m.nodes.clone(),
        );
        r.register(
            "lace_controller_networks",
            "Networks by readiness.",
            m.networks.clone(),
        );
        r.register(
            "lace_controller_policies_not_ready",
            "Policies whose Ready condition is not True.",
            m.policies_not_ready.clone(),
        );
        r.register(
            "lace_controller_node_locators_free",
            "Node locators of the prefix no node holds.",
            m.locators_free.clone(),
        );
        r.register(
            "lace_controller_caches_synced",
            "1 once every watch has listed.",
            m.synced.clone(),
        );
        Self { registry: r, ..m }
    }
}

fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    pub(crate) fn write(
        &self,
        verb: &'static str,
        kind: Kind,
        sub: Option<&str>,
        result: &'static str,
    ) {
        let resource = match sub {
            Some(s) => format!("{}/{s}", kind.plural()),
            None => kind.plural().to_string(),
        };
        self.writes
            .get_or_create(&WriteLabels {
                verb,
                resource,
                result,
            })
            .inc();
    }

    pub(crate) fn event(&self, warning: bool, result: &'static str) {
        let event_type = if warning { "Warning" } else { "Normal" };
        self.events
            .get_or_create(&EventLabels { event_type, result })
            .inc();
    }

    pub(crate) fn watch_event(&self, kind: Kind) {
        self.watch_events
            .get_or_create(&KindLabels { kind: kind.name() })
            .inc();
    }

    pub(crate) fn watch_error(&self, kind: Kind) {
        self.watch_errors
            .get_or_create(&KindLabels { kind: kind.name() })
            .inc();
    }

    pub(crate) fn pass(&self, result: &'static str, seconds: f64) {
        self.passes.get_or_create(&ResultLabels { result }).inc();
        self.pass_latency.observe(seconds);
    }

    pub(crate) fn summary(&self, s: &Summary) {
        let set = |f: &Family<StateLabels, Gauge>, state, v| {
            f.get_or_create(&StateLabels { state }).set(gauge(v));
        };
        set(&self.nodes, "allocated", s.nodes_allocated);
        set(&self.nodes, "unallocated", s.nodes_unallocated);
        set(&self.networks, "ready", s.networks_ready);
        set(&self.networks, "not_ready", s.networks_not_ready);
        self.policies_not_ready.set(gauge(s.policies_not_ready));
        self.locators_free.set(gauge(s.locators_free));
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut Progress)) {
        self.progress.send_modify(|p| {
            f(p);
            self.synced.set(i64::from(p.synced));
        });
    }

    pub(crate) fn stop(&self, why: FatalError) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    /// The progress now and as it changes.
    pub fn progress(&self) -> tokio::sync::watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// The metrics as `/metrics` serves them.
    pub fn encode(&self) -> String {
        lace::telemetry::encode(&self.registry)
    }
}

impl Probes for Metrics {
    type NotReady = NotReady;

    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn healthz(&self) -> Result<(), NotReady> {
        match &*self.stopped.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(why) => Err(NotReady::Stopped(why.clone())),
            None => Ok(()),
        }
    }

    fn readyz(&self) -> Result<(), NotReady> {
        self.healthz()?;
        let p = self.progress.borrow();
        if !p.synced {
            return Err(NotReady::Unsynced);
        }
        if !p.reconciled {
            return Err(match &p.last_error {
                Some(e) => NotReady::PassFailing(e.clone()),
                None => NotReady::NoPass,
            });
        }
        Ok(())
    }
}
