//! The seam to the dataplane, and the reconcile loop.
//!
//! The agent plans; the [`Dataplane`] (the rtnetlink/nft [`Reconciler`] of `crate::dataplane`)
//! does every kernel read and write of the node: the reconcile, and the CNI's work for one pod
//! (the pod end of its veth in the pod's namespace, its part of the plan on the node), so both
//! share one stack, one notion of what Lace owns and one memory of the kernel.
//!
//! ## When the node is reconciled
//! - **On a change**: cluster state, a pod attached or detached (`Agent::reconcile_wanted`).
//!   A burst of changes (an ADD storm) makes one reconcile, once [`DEBOUNCE`] passed without
//!   another or [`MAX_DELAY`] after the first: ADD and DEL do their pod's kernel work
//!   themselves, so this reconcile is the safety net that finds nothing to do, and it shares
//!   the dataplane's thread with their work.
//! - **On drift**: the dataplane reports that the kernel's notifications show something Lace
//!   applied changed without Lace (a route, rule or VRF deleted, an address or a link's
//!   routes flushed); foreign objects changing and Lace's own writes echoing back are not
//!   drift. The repair waits [`DEBOUNCE`] for the rest of a burst, then runs, as long as the
//!   [`DriftLimiter`] has a token: a tool that keeps undoing Lace's objects gets at most
//!   [`DRIFT_BURST`] quick repairs, then one per [`DRIFT_REFILL`]. Drift that a reconcile
//!   finds as it reads the kernel is repaired by that reconcile and schedules none. Drift is
//!   counted (`lace_dataplane_drift_total`, `lace_dataplane_drift_throttled_total`) and
//!   logged at most once per [`DRIFT_LOG_INTERVAL`].
//! - **Periodically** (`--resync-interval`), reading the kernel with full dumps: the backstop
//!   for what no rtnetlink notification reports (sysctls, the nft table, `ip sr tunsrc`) and
//!   for the memory itself.
//! - **After a failure**, `RETRY` later.
//!
//! The plan is made on the dataplane's thread, right before it is applied, so it includes
//! every pod whose ADD wrote to the kernel before (their writes run on that thread too).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub use crate::dataplane::DataplaneError;
use crate::dataplane::{
    ApplyReport, Drift, ObservedNode, PodInterface, PodLinkState, Reconciler, UnderlayQuery,
    UnderlayRound,
};
use crate::plan::DesiredNode;

/// Delay before retrying a failed apply, doubled after each failure in a row up to
/// [`RETRY_MAX`].
const RETRY: Duration = Duration::from_secs(2);
/// The longest wait between retries of an apply that keeps failing.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// How long to wait before the next reconcile after `failures` failed ones in a row: the
/// changes and drift that arrive meanwhile wait too (one reconcile covers them all), so a
/// failing apply runs at most once per this delay however busy the cluster is.
fn retry_delay(failures: u32) -> Duration {
    RETRY
        .saturating_mul(1u32 << failures.saturating_sub(1).min(8))
        .min(RETRY_MAX)
}
/// How long a reconcile waits for the rest of a burst of changes or drift.
pub const DEBOUNCE: Duration = Duration::from_millis(200);
/// The longest a change waits for its reconcile while changes keep coming.
pub const MAX_DELAY: Duration = Duration::from_secs(1);
/// Drift repairs that may run back to back.
pub const DRIFT_BURST: u32 = 5;
/// Once the burst is spent, one more drift repair per this long.
pub const DRIFT_REFILL: Duration = Duration::from_secs(10);
/// At most one drift message per this long (the rest are counted in it).
pub const DRIFT_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// Default of `--resync-interval`.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(60);

/// A plan to make on the dataplane's thread: `None` when there is nothing to apply (not
/// ready, or planning failed and was reported).
pub type Planning = Box<dyn FnOnce() -> Option<DesiredNode> + Send>;

/// The node's kernel: everything the agent reads or writes there goes through it.
pub trait Dataplane: Send + Sync + 'static {
    /// Plans with `plan` (on the dataplane's thread) and makes the kernel hold that plan;
    /// `Ok(None)` when `plan` gives none. `resync`: read the kernel with full dumps.
    fn reconcile(
        &self,
        plan: Planning,
        resync: bool,
    ) -> Result<Option<ApplyReport>, DataplaneError>;
    /// Calls `handler` (on the dataplane's thread; it must not block) with each drift.
    fn on_drift(&self, handler: Box<dyn Fn(Drift) + Send + Sync>);
    /// Creates a pod's veth pair in its namespace `pod_ns`, the host end in the node's, and
    /// configures the pod end; the pod end's MAC, or `None` if either name is taken.
    fn create_pod_interface(
        &self,
        pod_ns: &Path,
        pod: &PodInterface,
    ) -> Result<Option<Vec<u8>>, DataplaneError>;
    /// Gives the pods of `pods` (a plan of just them) their part of the plan on the node.
    fn attach(&self, pods: DesiredNode) -> Result<ApplyReport, DataplaneError>;
    /// Deletes links of the node by name; returns those that existed.
    fn delete_links(&self, names: Vec<String>) -> Result<Vec<String>, DataplaneError>;
    /// Deletes links in a pod's namespace by name; returns those that existed.
    fn delete_pod_links(
        &self,
        pod_ns: &Path,
        names: &[String],
    ) -> Result<Vec<String>, DataplaneError>;
    /// The `loopback` plugin's ADD: brings `lo` up in a pod's namespace and reads it.
    fn loopback_up(&self, pod_ns: &Path) -> Result<PodLinkState, DataplaneError>;
    /// What CHECK reads of a pod's interface, `None` if it does not exist.
    fn inspect_pod_link(
        &self,
        pod_ns: &Path,
        ifname: &str,
    ) -> Result<Option<PodLinkState>, DataplaneError>;
    /// The node's links, addresses, Lace's routes and rules, as the dataplane knows them now.
    fn snapshot(&self) -> Result<ObservedNode, DataplaneError>;
    /// Looks at the uplink and probes the peers of the link-local underlay (writes nothing).
    /// Without a kernel: nothing found, every such pair takes fou.
    fn probe_underlay(&self, _query: UnderlayQuery) -> Result<UnderlayRound, DataplaneError> {
        Ok(UnderlayRound::default())
    }
}

impl Dataplane for Reconciler {
    fn reconcile(
        &self,
        plan: Planning,
        resync: bool,
    ) -> Result<Option<ApplyReport>, DataplaneError> {
        self.reconcile_with(plan, resync)
    }

    fn on_drift(&self, handler: Box<dyn Fn(Drift) + Send + Sync>) {
        Reconciler::on_drift(self, handler);
    }

    fn create_pod_interface(
        &self,
        pod_ns: &Path,
        pod: &PodInterface,
    ) -> Result<Option<Vec<u8>>, DataplaneError> {
        Reconciler::create_pod_interface(self, pod_ns, pod)
    }

    fn attach(&self, pods: DesiredNode) -> Result<ApplyReport, DataplaneError> {
        Reconciler::attach(self, pods)
    }

    fn delete_links(&self, names: Vec<String>) -> Result<Vec<String>, DataplaneError> {
        Reconciler::delete_links(self, names)
    }

    fn delete_pod_links(
        &self,
        pod_ns: &Path,
        names: &[String],
    ) -> Result<Vec<String>, DataplaneError> {
        Reconciler::delete_pod_links(self, pod_ns, names)
    }

    fn loopback_up(&self, pod_ns: &Path) -> Result<PodLinkState, DataplaneError> {
        Reconciler::loopback_up(self, pod_ns)
    }

    fn inspect_pod_link(
        &self,
        pod_ns: &Path,
        ifname: &str,
    ) -> Result<Option<PodLinkState>, DataplaneError> {
        Reconciler::inspect_pod_link(self, pod_ns, ifname)
    }

    fn snapshot(&self) -> Result<ObservedNode, DataplaneError> {
        Reconciler::snapshot(self)
    }

    fn probe_underlay(&self, query: UnderlayQuery) -> Result<UnderlayRound, DataplaneError> {
        Reconciler::probe_underlay(self, query)
    }
}

/// The token bucket that spaces drift repairs: [`DRIFT_BURST`] tokens, one more per
/// [`DRIFT_REFILL`]; a repair takes one.
#[derive(Clone, Debug)]
pub struct DriftLimiter {
    tokens: u32,
    /// When the bucket was last refilled up to.
    refilled: Instant,
}

impl DriftLimiter {
    /// A full bucket at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            tokens: DRIFT_BURST,
            refilled: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        if self.tokens >= DRIFT_BURST {
            self.refilled = now;
            return;
        }
        let earned =
            now.saturating_duration_since(self.refilled).as_nanos() / DRIFT_REFILL.as_nanos();
        let earned = u32::try_from(earned).unwrap_or(u32::MAX);
        if earned > 0 {
            self.tokens = self.tokens.saturating_add(earned).min(DRIFT_BURST);
            self.refilled += DRIFT_REFILL * earned.min(DRIFT_BURST);
            if self.tokens == DRIFT_BURST {
                self.refilled = now;
            }
        }
    }

    /// When a repair of drift seen at `now` may run: `now` while tokens are left, else when
    /// the next one comes.
    pub fn next_slot(&mut self, now: Instant) -> Instant {
        self.refill(now);
        if self.tokens > 0 {
            now
        } else {
            self.refilled + DRIFT_REFILL
        }
    }

    /// A drift repair ran at `now` (takes a token if one is there).
    pub fn take(&mut self, now: Instant) {
        self.refill(now);
        self.tokens = self.tokens.saturating_sub(1);
    }
}

/// Drift messages: at most one about drift being repaired and one about repairs being
/// rate-limited per [`DRIFT_LOG_INTERVAL`], each counting what it did not log.
#[derive(Debug, Default)]
struct DriftLog {
    repairing: LogSlot,
    throttled: LogSlot,
}

#[derive(Debug, Default)]
struct LogSlot {
    last: Option<Instant>,
    unlogged: u64,
}

impl LogSlot {
    /// Whether to log now; if so, how many went unlogged since the last message.
    fn due(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < DRIFT_LOG_INTERVAL)
        {
            self.unlogged += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

impl DriftLog {
    fn report(&mut self, drift: &Drift, throttled: Option<Duration>, now: Instant) {
        match throttled {
            None => {
                if let Some(unlogged) = self.repairing.due(now) {
                    tracing::warn!(
                        %drift,
                        unlogged_since_last_message = unlogged,
                        "dataplane: something Lace owns changed without Lace; repairing"
                    );
                }
            }
            Some(wait) => {
                if let Some(unlogged) = self.throttled.due(now) {
                    tracing::warn!(
                        %drift,
                        unlogged_since_last_message = unlogged,
                        next_repair_in = ?wait,
                        "dataplane: something keeps changing what Lace owns; repairs are \
                         rate-limited (is another tool managing these routes, rules or links?)"
                    );
                }
            }
        }
    }
}

/// When drift gets repaired: the token bucket and the log it reports to.
#[derive(Debug)]
struct DriftRepairs {
    limiter: DriftLimiter,
    log: DriftLog,
}

impl DriftRepairs {
    fn new(now: Instant) -> Self {
        Self {
            limiter: DriftLimiter::new(now),
            log: DriftLog::default(),
        }
    }

    /// Logs drift seen at `now` and says when its repair may run; `None` when the reconcile
    /// that found it repairs it (a second one would only spend a token a later repair needs).
    fn seen(&mut self, drift: &Drift, now: Instant) -> Option<Instant> {
        if drift.repairing {
            self.log.report(drift, None, now);
            return None;
        }
        let slot = self.limiter.next_slot(now);
        self.log
            .report(drift, (slot > now).then(|| slot - now), now);
        Some(slot)
    }
}

/// Why a reconcile runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trigger {
    Change,
    Drift,
    Resync,
}

/// The reconcile loop: waits for a change, drift or the periodic resync, plans, applies,
/// records the outcome. `resync_every` is the period of full resyncs. Public for the
/// benchmark of the Kubernetes source (watch event to plan applied).
pub async fn run(agent: Arc<super::Agent>, resync_every: Duration) {
    let (drift_tx, mut drift_rx) = tokio::sync::mpsc::unbounded_channel::<Drift>();
    agent.dataplane.on_drift(Box::new(move |d| {
        let _ = drift_tx.send(d);
    }));
    let mut repairs = DriftRepairs::new(Instant::now());
    let mut repair_at: Option<Instant> = None;
    // When the changes seen so far are reconciled, and when the first of them came.
    let mut change: Option<(Instant, Instant)> = None;
    let mut resync_at = Instant::now() + resync_every;
    // After a failed apply: failures in a row, and no reconcile before `retry_at`.
    let mut failures = 0u32;
    let mut retry_at: Option<Instant> = None;
    loop {
        let trigger = tokio::select! {
            _ = agent.reconcile_wanted.notified() => {
                let now = Instant::now();
                let first = change.map_or(now, |(_, first)| first);
                let at = (now + DEBOUNCE).min(first + MAX_DELAY);
                change = Some((retry_at.map_or(at, |r| r.max(at)), first));
                continue;
            }
            _ = tokio::time::sleep_until(change.map_or_else(Instant::now, |(at, _)| at)), if change.is_some() => Trigger::Change,
            Some(drift) = drift_rx.recv() => {
                let now = Instant::now();
                agent.metrics.dataplane_drift();
                agent.underlay_look_now.notify_one();
                let Some(slot) = repairs.seen(&drift, now) else { continue };
                if slot > now {
                    agent.metrics.dataplane_drift_throttled();
                }
                let at = slot.max(now + DEBOUNCE);
                let at = retry_at.map_or(at, |r| r.max(at));
                repair_at = Some(repair_at.map_or(at, |r| r.min(at)));
                continue;
            }
            _ = tokio::time::sleep_until(repair_at.unwrap_or_else(Instant::now)), if repair_at.is_some() => Trigger::Drift,
            _ = tokio::time::sleep_until(resync_at) => Trigger::Resync,
        };
        let now = Instant::now();
        if trigger == Trigger::Drift {
            repairs.limiter.take(now);
        }
        // Whatever the trigger, this reconcile covers every change and drift seen so far.
        repair_at = None;
        change = None;
        if trigger == Trigger::Resync {
            resync_at = now + resync_every;
            agent.metrics.dataplane_resync();
        }
        if reconcile_once(&agent, trigger, failures).await {
            failures = 0;
            retry_at = None;
        } else {
            failures += 1;
            let at = Instant::now() + retry_delay(failures);
            retry_at = Some(at);
            change = Some((at, change.map_or(at, |(_, first)| first)));
        }
    }
}

/// One plan and apply; false when it failed (`failures`: how many failed before it in a row).
async fn reconcile_once(agent: &Arc<super::Agent>, trigger: Trigger, failures: u32) -> bool {
    let dataplane = Arc::clone(&agent.dataplane);
    let planner = Arc::clone(agent);
    let plan: Planning = Box::new(move || match planner.plan() {
        Ok(plan) => plan, // None: not ready, nothing to plan from yet
        Err(e) => {
            planner.metrics.reconcile_failed();
            tracing::error!(error = %e, "cannot plan this node");
            None
        }
    });
    let started = std::time::Instant::now();
    let resync = trigger == Trigger::Resync;
    let outcome = tokio::task::spawn_blocking(move || dataplane.reconcile(plan, resync)).await;
    let elapsed = started.elapsed();
    match outcome {
        Ok(Ok(None)) => true,
        Ok(Ok(Some(report))) => {
            agent.metrics.reconciled(elapsed);
            agent.applied.send_modify(|n| *n += 1);
            if report.writes > 0 {
                tracing::info!(
                    node = %agent.node,
                    ?trigger,
                    ops = report.ops,
                    writes = report.writes,
                    full_dump = report.full_dump,
                    phases = %report.phases,
                    sample = ?report.sample,
                    "dataplane: applied"
                );
            } else {
                tracing::debug!(?trigger, ms = elapsed.as_millis() as u64, "reconciled");
            }
            for skipped in &report.skipped {
                tracing::debug!(node = %agent.node, "dataplane: skipped {skipped}");
            }
            true
        }
        Ok(Err(e)) => {
            agent.metrics.reconciled(elapsed);
            agent.metrics.reconcile_failed();
            let retry_in = retry_delay(failures + 1);
            tracing::error!(error = %e, failures_in_a_row = failures + 1, "reconcile failed, retrying in {retry_in:?}");
            false
        }
        Err(e) => {
            agent.metrics.reconcile_failed();
            tracing::error!(error = %e, "reconcile panicked");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_applies_back_off_to_a_ceiling() {
        let delays: Vec<u64> = (1..=7).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(retry_delay(u32::MAX), RETRY_MAX);
    }

    #[test]
    fn a_burst_of_drift_is_repaired_at_once_then_one_per_refill() {
        let t0 = Instant::now();
        let mut l = DriftLimiter::new(t0);
        for i in 0..DRIFT_BURST {
            let now = t0 + Duration::from_millis(u64::from(i) * 100);
            assert_eq!(l.next_slot(now), now, "repair {i} of the burst waits");
            l.take(now);
        }
        let now = t0 + Duration::from_millis(500);
        let slot = l.next_slot(now);
        assert!(slot > now, "the burst is spent");
        assert!(slot <= now + DRIFT_REFILL, "{:?}", slot - now);
        // A tool flapping every 100 ms for a minute gets one repair per refill.
        let mut repairs = 0;
        let mut t = now;
        let end = now + Duration::from_secs(60);
        while t < end {
            if l.next_slot(t) <= t {
                l.take(t);
                repairs += 1;
            }
            t += Duration::from_millis(100);
        }
        let per_minute = (60 / DRIFT_REFILL.as_secs()) as u32;
        assert!(
            (per_minute - 1..=per_minute + 1).contains(&repairs),
            "{repairs} repairs in a minute of flapping"
        );
    }

    #[test]
    fn drift_a_reconcile_repairs_as_it_finds_it_schedules_no_repair_and_spends_no_token() {
        let t0 = Instant::now();
        let mut r = DriftRepairs::new(t0);
        let drift = |repairing| Drift {
            ops: 1,
            summary: "rule add -4 pref 1000 l3mdev".into(),
            repairing,
        };
        for i in 0..DRIFT_BURST * 2 {
            assert_eq!(
                r.seen(&drift(true), t0),
                None,
                "drift {i} got a repair of its own"
            );
        }
        for i in 0..DRIFT_BURST {
            assert_eq!(r.seen(&drift(false), t0), Some(t0), "repair {i} waits");
            r.limiter.take(t0);
        }
        assert!(r.seen(&drift(false), t0).is_some_and(|slot| slot > t0));
    }

    #[test]
    fn a_quiet_node_earns_its_burst_back() {
        let t0 = Instant::now();
        let mut l = DriftLimiter::new(t0);
        for _ in 0..DRIFT_BURST {
            l.take(t0);
        }
        assert!(l.next_slot(t0) > t0);
        let later = t0 + DRIFT_REFILL * (DRIFT_BURST + 3);
        for i in 0..DRIFT_BURST {
            assert_eq!(l.next_slot(later), later, "token {i} not earned back");
            l.take(later);
        }
        assert!(l.next_slot(later) > later, "earned more than the burst");
    }
}
