//! The controller's loop: watch events into the [`Model`]; once every watch has listed, a
//! pass computes [`desired`] and [`diff`] and executes the writes, phase by phase. One pass at
//! a time, over a batch of events: a burst of 5,000 Node events is one pass, not 5,000.
//!
//! A failed pass (a conflict, an API error) is retried with exponential backoff; watch
//! events keep arriving meanwhile, so the retry plans from the newest state. A fatal error
//! (CRD missing, RBAC denied) ends the loop with that error. Shutdown (SIGTERM) lets the
//! pass in progress finish, so every write that was started is known to have landed or not.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use kube::Client;
use lace::objects::Kind;
use tokio::sync::mpsc;

use crate::config::Settings;
use crate::desired::desired;
use crate::diff::diff;
use crate::error::FatalError;
use crate::metrics::Metrics;
use crate::model::{Model, Seen, WATCHED};
use crate::watch::{self, Msg};
use crate::write::{Outcome, StepResult, WriteError, Writer};

/// The time now, as a condition's `lastTransitionTime` (whole seconds: Node conditions are
/// `metav1.Time`, which the API server truncates, and a stored value must equal the written
/// one or every pass would rewrite it).
fn now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// The loop's state.
struct Loop {
    settings: Settings,
    metrics: Arc<Metrics>,
    writer: Writer,
    model: Model,
    /// Relists in progress, per kind.
    lists: BTreeMap<Kind, Vec<Seen>>,
    synced: BTreeSet<Kind>,
    dirty: bool,
    retry_at: Option<tokio::time::Instant>,
    backoff: std::time::Duration,
}

impl Loop {
    fn handle(&mut self, msg: Msg) -> Result<(), FatalError> {
        match msg {
            Msg::Init(kind) => {
                self.lists.insert(kind, Vec::new());
            }
            Msg::InitApply(seen) => self.lists.entry(seen.kind).or_default().push(seen),
            Msg::InitDone(kind) => {
                let listed = self.lists.remove(&kind).unwrap_or_default();
                self.dirty |= self.model.relist(kind, listed);
                let first = self.synced.len() < WATCHED.len();
                self.synced.insert(kind);
                if first && self.synced.len() == WATCHED.len() {
                    let s = self.model.state();
                    tracing::info!(
                        nodes = self.model.iter(Kind::Node).count(),
                        networks = self.model.iter(Kind::Network).count(),
                        node_allocations = s.node_allocations.len(),
                        network_allocations = s.network_allocations.len(),
                        "caches synced; every existing allocation is taken as given"
                    );
                    // The first pass runs even over an empty cluster (readiness).
                    self.dirty = true;
                }
                let (synced, due) = (self.synced.len() == WATCHED.len(), self.due());
                self.metrics.update(|p| {
                    p.synced = synced;
                    p.pending = due;
                });
            }
            Msg::Apply(seen) => {
                self.metrics.watch_event(seen.kind);
                self.dirty |= self.model.apply(seen);
                self.count_watch_event();
            }
            Msg::Delete(kind, name) => {
                self.metrics.watch_event(kind);
                self.dirty |= self.model.delete(kind, &name);
                self.count_watch_event();
            }
            Msg::Fatal(e) => return Err(e),
        }
        Ok(())
    }

    /// Whether a pass is due: changes wait and every watch has listed.
    fn due(&self) -> bool {
        self.dirty && self.synced.len() == WATCHED.len()
    }

    /// Counts a watch event, and says in the same update whether a pass is now due (so
    /// whoever waits on the progress never sees the event taken in but not its effect).
    fn count_watch_event(&self) {
        let due = self.due();
        self.metrics.update(|p| {
            p.watch_events += 1;
            p.pending = due;
        });
    }

    /// One pass; `Err` only for a fatal error.
    async fn pass(&mut self) -> Result<(), FatalError> {
        let start = Instant::now();
        let desired = desired(&self.model, self.settings.prefix, &now());
        self.metrics.summary(&desired.summary);
        let changes = diff(&self.model, &desired);
        let total = changes.len();
        let mut failure: Option<WriteError> = None;
        let mut written = 0usize;
        for phase in changes.phases() {
            if phase.is_empty() {
                continue;
            }
            let model = &self.model;
            let writer = &self.writer;
            let results: Vec<StepResult> = futures::stream::iter(phase)
                .map(|step| writer.execute(step, model))
                .buffer_unordered(self.settings.concurrency.max(1))
                .collect()
                .await;
            for r in results {
                if let Some(fatal) = r.event_error {
                    return Err(fatal);
                }
                match r.write {
                    Ok(Outcome::Seen(seen)) => {
                        written += 1;
                        self.model.apply(*seen);
                    }
                    Ok(Outcome::Deleted(kind, name)) => {
                        written += 1;
                        self.model.delete(kind, &name);
                    }
                    Ok(Outcome::Nothing) => {}
                    Err(WriteError::Fatal(fatal)) => return Err(fatal),
                    Err(e) => {
                        tracing::warn!(error = %e, "write failed");
                        failure.get_or_insert(e);
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        match failure {
            None => {
                if total > 0 {
                    tracing::info!(writes = written, seconds, "reconciled");
                }
                self.metrics
                    .pass(if total == 0 { "nothing" } else { "ok" }, seconds);
                self.dirty = false;
                self.retry_at = None;
                self.backoff = self.settings.retry_min;
                self.metrics.update(|p| {
                    p.passes += 1;
                    p.reconciled = true;
                    p.pending = false;
                    p.last_error = None;
                });
            }
            Some(e) => {
                self.metrics.pass("retry", seconds);
                tracing::warn!(writes = written, of = total, retry_in = ?self.backoff, "pass incomplete; retrying");
                self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(self.settings.retry_max);
                let why = e.to_string();
                self.metrics.update(|p| {
                    p.passes += 1;
                    p.pending = true;
                    p.last_error = Some(why);
                });
            }
        }
        Ok(())
    }
}

/// Runs the controller until `shutdown` completes (`Ok`) or a fatal error (`Err`, naming the
/// fix). `metrics` is what `/metrics`, `/healthz` and `/readyz` serve.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), FatalError> {
    let (tx, mut rx) = mpsc::channel(4096);
    let watchers = watch::spawn(&client, &tx, &metrics);
    drop(tx);
    let mut l = Loop {
        backoff: settings.retry_min,
        settings,
        writer: Writer::new(client, metrics.clone()),
        metrics: metrics.clone(),
        model: Model::new(),
        lists: BTreeMap::new(),
        synced: BTreeSet::new(),
        dirty: false,
        retry_at: None,
    };
    let mut shutdown = std::pin::pin!(shutdown);
    let result = loop {
        let due = l.due();
        let wake = l.retry_at.unwrap_or_else(tokio::time::Instant::now);
        tokio::select! {
            () = &mut shutdown => {
                tracing::info!("shutting down");
                break Ok(());
            }
            msg = rx.recv() => {
                let Some(msg) = msg else { break Ok(()) };
                if let Err(e) = l.handle(msg) {
                    break Err(e);
                }
                // Take the whole batch that is already there before the next pass.
                let mut batch = 0;
                let mut fatal = None;
                while batch < 10_000 {
                    let Ok(msg) = rx.try_recv() else { break };
                    batch += 1;
                    if let Err(e) = l.handle(msg) {
                        fatal = Some(e);
                        break;
                    }
                }
                if let Some(e) = fatal {
                    break Err(e);
                }
            }
            () = tokio::time::sleep_until(wake), if due => {
                if let Err(e) = l.pass().await {
                    break Err(e);
                }
            }
        }
    };
    for w in watchers {
        w.abort();
    }
    if let Err(e) = &result {
        metrics.stop(e.clone());
    }
    result
}
