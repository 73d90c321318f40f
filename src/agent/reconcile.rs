//! The seam to the dataplane reconciler: the agent plans, something else applies.
//!
//! The agent calls [`Dataplane::apply`] with the full [`DesiredNode`] after every change
//! (cluster state, pod attached or detached), from a blocking thread, never concurrently
//! with itself, and coalescing bursts (an ADD storm triggers a few reconciles, not one per
//! pod). The implementation is the rtnetlink/nft [`Reconciler`] of `crate::dataplane`.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Delay before retrying a failed apply.
const RETRY: Duration = Duration::from_secs(2);

use crate::dataplane::Reconciler;
use crate::plan::DesiredNode;

/// An error of the dataplane, reported in logs and metrics.
pub type DataplaneError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Makes the node's kernel match a plan.
pub trait Dataplane: Send + Sync + 'static {
    /// Observes, diffs and applies `plan`. Called again with the next plan after an error.
    fn apply(&self, plan: &DesiredNode) -> Result<(), DataplaneError>;
}

impl Dataplane for Reconciler {
    fn apply(&self, plan: &DesiredNode) -> Result<(), DataplaneError> {
        let report = self.reconcile(plan)?;
        if report.writes > 0 {
            tracing::info!(
                node = %plan.node,
                ops = report.ops,
                writes = report.writes,
                full_dump = report.full_dump,
                sample = ?report.sample,
                "dataplane: applied"
            );
        }
        for skipped in &report.skipped {
            tracing::debug!(node = %plan.node, "dataplane: skipped {skipped}");
        }
        Ok(())
    }
}

/// A dataplane that only logs what it would apply: the agent's unit tests, which have no
/// kernel to program.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct LogOnly;

#[cfg(test)]
impl Dataplane for LogOnly {
    fn apply(&self, plan: &DesiredNode) -> Result<(), DataplaneError> {
        tracing::debug!(
            node = %plan.node,
            vrfs = plan.base.vrfs.len(),
            pod_routes = plan.pod_routes.len(),
            "dataplane: no reconciler plugged in, plan not applied"
        );
        Ok(())
    }
}

/// The reconcile loop: waits for a trigger, plans, applies, records the outcome.
/// Public for the benchmark of the Kubernetes source (watch event to plan applied).
pub async fn run(agent: Arc<super::Agent>) {
    loop {
        agent.reconcile_wanted.notified().await;
        let plan = match agent.plan() {
            Ok(Some(plan)) => plan,
            Ok(None) => continue, // not ready: nothing to plan from yet
            Err(e) => {
                agent.metrics.reconcile_failed();
                tracing::error!(error = %e, "cannot plan this node");
                continue;
            }
        };
        let dataplane = Arc::clone(&agent.dataplane);
        let started = Instant::now();
        let outcome = tokio::task::spawn_blocking(move || dataplane.apply(&plan)).await;
        let elapsed = started.elapsed();
        match outcome {
            Ok(Ok(())) => {
                agent.metrics.reconciled(elapsed);
                agent.applied.send_modify(|n| *n += 1);
                tracing::debug!(ms = elapsed.as_millis() as u64, "reconciled");
            }
            Ok(Err(e)) => {
                agent.metrics.reconciled(elapsed);
                agent.metrics.reconcile_failed();
                tracing::error!(error = %e, "reconcile failed, retrying in {RETRY:?}");
                let agent = Arc::clone(&agent);
                tokio::spawn(async move {
                    tokio::time::sleep(RETRY).await;
                    agent.reconcile_wanted.notify_one();
                });
            }
            Err(e) => {
                agent.metrics.reconcile_failed();
                tracing::error!(error = %e, "reconcile panicked");
            }
        }
    }
}
