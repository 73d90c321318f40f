//! The Kubernetes source's metrics, registered in the agent's registry (`/metrics`):
//!
//! - `lace_apiserver_up`: 1 while the API server answers; 0 from a transport error (refused,
//!   reset, timed out) until a request succeeds again;
//! - `lace_watch_events_total{kind,event}`: `applied`, `deleted`, `relisted` (a list started:
//!   the first one, and one after every 410 Gone);
//! - `lace_watch_errors_total{kind}`: failed lists and watches (each is retried);
//! - `lace_watch_synced{kind}`: 1 once the kind's first list is complete;
//! - `lace_undecodable_objects{kind}`: objects left out because they do not decode (the log
//!   names each);
//! - `lace_state_updates_total`: states handed to the planner (debounced changes, resyncs);
//! - `lace_pod_lookups_total{result}`: CNI ADDs for pods the cache did not hold, fetched from
//!   the API server (`found`, `missing`, `error`).

use std::collections::BTreeMap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::objects::Kind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    kind: &'static str,
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// See the module docs. Clones share the values.
#[derive(Clone, Debug, Default)]
pub(super) struct SourceMetrics {
    up: Gauge,
    events: Family<EventLabels, Counter>,
    errors: Family<KindLabels, Counter>,
    synced: Family<KindLabels, Gauge>,
    undecodable: Family<KindLabels, Gauge>,
    state_updates: Counter,
    pod_lookups: Family<ResultLabels, Counter>,
}

impl SourceMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "lace_apiserver_up",
            "1 while the Kubernetes API server answers.",
            self.up.clone(),
        );
        r.register(
            "lace_watch_events",
            "Watch events by kind: applied, deleted, relisted.",
            self.events.clone(),
        );
        r.register(
            "lace_watch_errors",
            "Failed lists and watches by kind (retried).",
            self.errors.clone(),
        );
        r.register(
            "lace_watch_synced",
            "1 once the kind's first list is complete.",
            self.synced.clone(),
        );
        r.register(
            "lace_undecodable_objects",
            "Objects from the API server left out because they do not decode.",
            self.undecodable.clone(),
        );
        r.register(
            "lace_state_updates",
            "Cluster states handed to the planner.",
            self.state_updates.clone(),
        );
        r.register(
            "lace_pod_lookups",
            "Pods fetched from the API server for CNI ADD.",
            self.pod_lookups.clone(),
        );
    }

    pub fn set_up(&self, up: bool) {
        self.up.set(i64::from(up));
    }

    pub fn event(&self, kind: Kind, event: &'static str) {
        self.events
            .get_or_create(&EventLabels {
                kind: kind.name(),
                event,
            })
            .inc();
    }

    pub fn error(&self, kind: Kind) {
        self.errors
            .get_or_create(&KindLabels { kind: kind.name() })
            .inc();
    }

    pub fn synced(&self, kind: Kind) {
        self.synced
            .get_or_create(&KindLabels { kind: kind.name() })
            .set(1);
    }

    pub fn set_undecodable(&self, counts: &BTreeMap<Kind, usize>) {
        self.undecodable.clear();
        for (kind, n) in counts {
            self.undecodable
                .get_or_create(&KindLabels { kind: kind.name() })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    pub fn state_update(&self) {
        self.state_updates.inc();
    }

    pub fn pod_lookup(&self, result: &'static str) {
        self.pod_lookups
            .get_or_create(&ResultLabels { result })
            .inc();
    }
}
