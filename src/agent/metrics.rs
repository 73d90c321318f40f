//! The agent's Prometheus metrics, served with `/healthz` and `/readyz` by
//! [`crate::telemetry`] (default `127.0.0.1:9964`):
//!
//! - `lace_cni_requests_total{verb,result}`: CNI requests by verb and outcome (`ok`, or the
//!   CNI error code);
//! - `lace_cni_request_duration_seconds{verb}`: histogram of the agent-side handling time;
//! - `lace_cni_add_phase_seconds{phase}`: where a successful ADD's time goes: `ipam`
//!   (allocate and persist), `pod` (veth and pod-side configuration, in the pod's
//!   namespace), `host` (VRF, enslavement and host routes, in the node's namespace);
//! - `lace_reconciles_total`, `lace_reconcile_errors_total`,
//!   `lace_reconcile_duration_seconds` (histogram);
//! - `lace_dataplane_drift_total`: times the kernel's notifications showed something Lace
//!   applied changed without Lace (each schedules a repair);
//! - `lace_dataplane_drift_throttled_total`: drift repairs delayed by the rate limit
//!   (something keeps undoing Lace's objects);
//! - `lace_dataplane_resyncs_total`: periodic full resyncs;
//! - `lace_rejected_objects{kind}`: Lace objects left out of the state because they are
//!   invalid (the log names each);
//! - `lace_addresses_in_use{network}`: pod addresses held on this node;
//! - `lace_ready`: 1 when ADD can be served;
//! - `lace_underlay_peers{path}`: the other nodes by the underlay this node reaches them over
//!   (`ipv6`, `link-local`, `fou`, `unreachable`); which peer takes which: the log line each
//!   change makes, and `lace-agent plan --probe` on the node;
//! - `lace_underlay_path_changes_total{from,to}`: pairs that changed path (a new node or one
//!   that left counts from or to `none`).
//!
//! `/healthz` and `/readyz` answer 200 when the agent is ready, 503 with the reason otherwise.

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::telemetry::{Probes, LATENCY_BUCKETS};
use crate::validate::Rejected;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: &'static str,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabels {
    verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathChangeLabels {
    from: &'static str,
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NetworkLabels {
    network: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The agent's metrics. Cheap to update from any task.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_latency: HistogramFamily<VerbLabels>,
    add_phases: HistogramFamily<PhaseLabels>,
    reconciles: Counter,
    reconcile_errors: Counter,
    reconcile_latency: Histogram,
    drift: Counter,
    drift_throttled: Counter,
    resyncs: Counter,
    rejected: Family<KindLabels, Gauge>,
    in_use: Family<NetworkLabels, Gauge>,
    ready: Gauge,
    underlay_peers: Family<PathLabels, Gauge>,
    path_changes: Family<PathChangeLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Self {
            registry: Registry::default(),
            requests: Family::default(),
            request_latency: Family::new_with_constructor(latency),
            add_phases: Family::new_with_constructor(latency),
            reconciles: Counter::default(),
            reconcile_errors: Counter::default(),
            reconcile_latency: latency(),
            drift: Counter::default(),
            drift_throttled: Counter::default(),
            resyncs: Counter::default(),
            rejected: Family::default(),
            in_use: Family::default(),
            ready: Gauge::default(),
            underlay_peers: Family::default(),
            path_changes: Family::default(),
        };
        let mut r = Registry::default();
        r.register(
            "lace_cni_requests",
            "CNI requests handled by the agent.",
            m.requests.clone(),
        );
        r.register(
            "lace_cni_request_duration_seconds",
            "Agent-side CNI handling time.",
            m.request_latency.clone(),
        );
        r.register(
            "lace_cni_add_phase_seconds",
            "Time of each phase of successful ADDs.",
            m.add_phases.clone(),
        );
        r.register(
            "lace_reconciles",
            "Dataplane applies.",
            m.reconciles.clone(),
        );
        r.register(
            "lace_reconcile_errors",
            "Failed plans or applies.",
            m.reconcile_errors.clone(),
        );
        r.register(
            "lace_reconcile_duration_seconds",
            "Dataplane apply time.",
            m.reconcile_latency.clone(),
        );
        r.register(
            "lace_dataplane_drift",
            "Changes to what Lace applied made without Lace, seen in kernel notifications.",
            m.drift.clone(),
        );
        r.register(
            "lace_dataplane_drift_throttled",
            "Drift repairs delayed by the rate limit.",
            m.drift_throttled.clone(),
        );
        r.register(
            "lace_dataplane_resyncs",
            "Periodic full resyncs of the dataplane.",
            m.resyncs.clone(),
        );
        r.register(
            "lace_rejected_objects",
            "Lace objects left out of the cluster state because they are invalid.",
            m.rejected.clone(),
        );
        r.register(
            "lace_addresses_in_use",
            "Pod addresses held on this node.",
            m.in_use.clone(),
        );
        r.register(
            "lace_ready",
            "1 when the agent can serve CNI ADD.",
            m.ready.clone(),
        );
        r.register(
            "lace_underlay_peers",
            "Other nodes by the underlay path this node reaches them over.",
            m.underlay_peers.clone(),
        );
        r.register(
            "lace_underlay_path_changes",
            "Pairs of nodes that changed underlay path, from and to.",
            m.path_changes.clone(),
        );
        Self { registry: r, ..m }
    }
}

impl Metrics {
    /// The agent's metrics plus those of its state source.
    pub fn with_source(source: &dyn super::StateSource) -> Self {
        let mut m = Self::default();
        source.register_metrics(&mut m.registry);
        m
    }

    /// Records one CNI request: `result` is `ok` or the CNI error code.
    pub fn cni_request(&self, verb: &'static str, result: String, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels { verb, result })
            .inc();
        self.request_latency
            .get_or_create(&VerbLabels { verb })
            .observe(took.as_secs_f64());
    }

    /// Records how long one phase of a successful ADD took (`ipam`, `pod`, `host`).
    pub fn add_phase(&self, phase: &'static str, took: Duration) {
        self.add_phases
            .get_or_create(&PhaseLabels { phase })
            .observe(took.as_secs_f64());
    }

    /// Records one completed dataplane apply.
    pub fn reconciled(&self, took: Duration) {
        self.reconciles.inc();
        self.reconcile_latency.observe(took.as_secs_f64());
    }

    /// Records one failed plan or apply.
    pub fn reconcile_failed(&self) {
        self.reconcile_errors.inc();
    }

    /// Records one drift report of the dataplane.
    pub fn dataplane_drift(&self) {
        self.drift.inc();
    }

    /// Records one drift repair delayed by the rate limit.
    pub fn dataplane_drift_throttled(&self) {
        self.drift_throttled.inc();
    }

    /// Records one periodic full resync.
    pub fn dataplane_resync(&self) {
        self.resyncs.inc();
    }

    /// Sets `lace_underlay_peers` to the counts per path.
    pub fn set_underlay_peers(&self, counts: &BTreeMap<&'static str, usize>) {
        for path in ["ipv6", "link-local", "fou", "unreachable"] {
            self.underlay_peers
                .get_or_create(&PathLabels { path })
                .set(i64::try_from(counts.get(path).copied().unwrap_or(0)).unwrap_or(i64::MAX));
        }
    }

    /// Records one pair changing path.
    pub fn underlay_path_changed(&self, from: &'static str, to: &'static str) {
        self.path_changes
            .get_or_create(&PathChangeLabels { from, to })
            .inc();
    }

    /// Sets the rejected-object gauges to what the last admission left out.
    pub fn set_rejected(&self, rejected: &[Rejected]) {
        self.rejected.clear();
        for r in rejected {
            self.rejected
                .get_or_create(&KindLabels { kind: r.kind })
                .inc();
        }
    }

    /// Sets the scrape-time gauges.
    fn set_gauges(&self, in_use: &BTreeMap<String, usize>, ready: bool) {
        self.in_use.clear();
        for (network, n) in in_use {
            self.in_use
                .get_or_create(&NetworkLabels {
                    network: network.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.ready.set(i64::from(ready));
    }
}

impl Probes for super::Agent {
    type NotReady = super::NotReady;

    fn registry(&self) -> &Registry {
        &self.metrics.registry
    }

    fn healthz(&self) -> Result<(), super::NotReady> {
        self.not_ready_reason().map_or(Ok(()), Err)
    }

    fn readyz(&self) -> Result<(), super::NotReady> {
        self.healthz()
    }

    fn refresh(&self) {
        self.metrics
            .set_gauges(&self.ipam.in_use().unwrap_or_default(), self.is_ready());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_counts_and_buckets() {
        let m = Metrics::default();
        m.cni_request("ADD", "ok".into(), Duration::from_micros(700));
        m.cni_request("ADD", "ok".into(), Duration::from_millis(30));
        m.cni_request("ADD", "11".into(), Duration::from_secs(10));
        m.add_phase("ipam", Duration::from_millis(3));
        m.reconciled(Duration::from_millis(2));
        m.reconcile_failed();
        m.dataplane_drift();
        m.dataplane_drift();
        m.dataplane_drift_throttled();
        m.set_gauges(&BTreeMap::from([("default".to_owned(), 3)]), true);
        m.set_rejected(&[Rejected {
            kind: "Network",
            name: "bad".into(),
            errors: vec![],
        }]);
        let text = crate::telemetry::encode(&m.registry);
        let has = |line: &str| assert!(text.contains(&format!("{line}\n")), "{line}\n{text}");
        has("lace_cni_requests_total{verb=\"ADD\",result=\"ok\"} 2");
        has("lace_cni_requests_total{verb=\"ADD\",result=\"11\"} 1");
        // Cumulative: 1 at <=1ms, 2 at <=50ms, 2 at <=5s (10 s is above every bound), 3 total.
        has("lace_cni_request_duration_seconds_bucket{le=\"0.001\",verb=\"ADD\"} 1");
        has("lace_cni_request_duration_seconds_bucket{le=\"0.05\",verb=\"ADD\"} 2");
        has("lace_cni_request_duration_seconds_bucket{le=\"5.0\",verb=\"ADD\"} 2");
        has("lace_cni_request_duration_seconds_bucket{le=\"+Inf\",verb=\"ADD\"} 3");
        has("lace_cni_request_duration_seconds_count{verb=\"ADD\"} 3");
        has("lace_cni_add_phase_seconds_bucket{le=\"0.0025\",phase=\"ipam\"} 0");
        has("lace_cni_add_phase_seconds_bucket{le=\"0.005\",phase=\"ipam\"} 1");
        has("lace_cni_add_phase_seconds_sum{phase=\"ipam\"} 0.003");
        has("lace_reconciles_total 1");
        has("lace_reconcile_errors_total 1");
        has("lace_reconcile_duration_seconds_count 1");
        has("lace_dataplane_drift_total 2");
        has("lace_dataplane_drift_throttled_total 1");
        has("lace_dataplane_resyncs_total 0");
        has("lace_rejected_objects{kind=\"Network\"} 1");
        has("lace_addresses_in_use{network=\"default\"} 3");
        has("lace_ready 1");
        // Every sample line is `name{labels} value` or `name value` with a numeric value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
        // Gauges follow the latest values, not the sum of all.
        m.set_gauges(&BTreeMap::new(), false);
        m.set_rejected(&[]);
        let text = crate::telemetry::encode(&m.registry);
        assert!(text.contains("lace_ready 0\n"));
        assert!(!text.contains("lace_addresses_in_use{"));
        assert!(!text.contains("lace_rejected_objects{"));
    }
}
