//! The reconciler's memory of the kernel: what the last full dump showed, kept current by
//! rtnetlink's change notifications instead of re-dumping on every reconcile.
//!
//! A [`Session`] (one per namespace, on its worker thread) subscribes to the notifications of
//! links, addresses, routes and rules *before* it dumps, so no change falls between the dump
//! and the stream; notifications about changes the dump already shows replay to the same
//! state, in order. It takes in what was queued before each reconcile
//! ([`Session::with_observed`]), after the apply ([`Session::settle`]: the writes' own
//! notifications, which the request socket drains between batch chunks so a large apply
//! cannot overrun it), and while idle ([`Session::idle`]). An apply that writes more routes
//! than the namespace holds (a node's first, [`dump_after`]) leaves the route groups instead,
//! and its settle joins them again and dumps. Everything the cache knows comes from the
//! kernel's own messages, so what it holds for a route Lace wrote is what the kernel made of
//! it (flags, metrics), exactly as a dump would show it. The cache is thrown away and
//! the kernel dumped again whenever the stream cannot be trusted to be complete: the
//! notification socket overran (`ENOBUFS`), a message did not decode or was not one the
//! groups carry, a link was renamed (routes name their devices) or re-appeared under another
//! index, an apply failed, or nothing was cached yet.
//!
//! The session holds the cache (`cache`: the observed node with the notifications replayed
//! into it; what the kernel changes without notifying, and how the cache follows, is
//! described there) and the drift bookkeeping (`drift`: what Lace last applied, and whether
//! the kernel still holds it).

mod cache;
mod drift;

use std::collections::BTreeSet;
use std::time::Duration;

pub use cache::Deleted;
pub use drift::{Applied, Drift, DriftHandler, DriftSink};

use super::nl::{Nl, NlError};
use super::observe::{self, ObserveError};
use super::observed::ObservedNode;
use super::op::Op;
use crate::plan::DesiredNode;
use cache::Cache;

/// Receive buffer of the notification socket by default: room for some ten thousand
/// notifications between two drains.
pub const NOTIFICATION_BUFFER: usize = 8 << 20;

/// How long the worker waits for a job before draining notifications anyway, so a busy host
/// does not overrun the socket between two reconciles.
pub const IDLE_DRAIN: Duration = Duration::from_secs(1);

/// Route writes from which an apply may read its routes back with a dump instead of its own
/// notifications ([`dump_after`]), by default.
pub const BULK_ROUTES: usize = 10_000;

/// Whether an apply of `ops` onto `observed` reads the routes back with a dump after it
/// instead of following its own route notifications: when it writes at least `bulk` routes,
/// and more than the namespace holds. Each written route's notification costs the kernel a
/// message to queue and the reconciler one to receive and decode, about twice what a dump
/// costs per route (measured on a first apply of 195,000 routes: 0.68 s receiving and
/// 0.41 s decoding, against 0.45-0.55 s for dumping them all), so a dump is the cheaper
/// read-back once the writes outnumber the routes there.
pub fn dump_after(ops: &[Op], observed: &ObservedNode, bulk: usize) -> bool {
    let writes = ops
        .iter()
        .filter(|o| matches!(o, Op::PutRoute { .. } | Op::DelRoute { .. }))
        .count();
    writes >= bulk && writes > observed.routes.len() + observed.host_routes.len()
}

/// One namespace's rtnetlink connection and what the reconciler knows of the namespace.
pub struct Session {
    pub nl: Nl,
    cache: Option<Cache>,
    rx_buf: usize,
    /// Route writes from which an apply dumps its routes instead ([`dump_after`]).
    pub bulk_routes: usize,
    applied: Applied,
    /// Notifications were taken in (or the kernel dumped) by a job that does not diff the
    /// whole plan (an attach, a snapshot, a DEL): the next idle checks for drift.
    unchecked: bool,
    on_drift: DriftSink,
    /// The tables of the last job's plan (`None`: every table), which a dump reads.
    tables: Option<BTreeSet<u32>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("nl", &self.nl)
            .field("cache", &self.cache)
            .field("applied", &self.applied.0.as_ref().map(|p| &p.node))
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session over `nl`; the notification socket gets `rx_buf` bytes of receive buffer,
    /// applies of `bulk_routes` routes or more may dump them ([`dump_after`]), drift is
    /// reported to `on_drift`.
    pub fn new(nl: Nl, rx_buf: usize, bulk_routes: usize, on_drift: DriftSink) -> Self {
        Self {
            nl,
            cache: None,
            rx_buf,
            bulk_routes,
            applied: Applied::default(),
            unchecked: false,
            on_drift,
            tables: None,
        }
    }

    /// Drops the cached state: the next observation dumps (a periodic resync).
    pub fn forget(&mut self) {
        self.cache = None;
    }

    /// Runs `f` with the request socket and the namespace as it is now: the cache brought up
    /// to date with what the kernel notified, or dumps when there is no trustworthy cache
    /// or its dump did not read every IPv4 table of `tables` (`f`'s third argument is `true`
    /// then). `tables`: the tables of the plan the job serves (see [`observe::dump`]);
    /// `None`: every table there is. Sysctls (`sysctls` are the keys), `ip sr tunsrc`, the
    /// nft table and the pods' qdiscs and filters are read each time, unless `sysctls` is
    /// `None` (a job that needs only what rtnetlink notifies).
    pub fn with_observed<R>(
        &mut self,
        sysctls: Option<&BTreeSet<String>>,
        tables: Option<&BTreeSet<u32>>,
        f: impl FnOnce(&mut Nl, &ObservedNode, bool) -> R,
    ) -> Result<R, ObserveError> {
        self.nl.subscribe(self.rx_buf)?;
        if self.cache.as_ref().is_some_and(|c| !c.covers(tables)) {
            tracing::debug!("dataplane: the plan has tables the last dump did not read");
            self.cache = None;
        }
        let stale = match (&mut self.cache, self.nl.notifications()) {
            (Some(cache), Some(n)) => match n.take() {
                Ok(t) => {
                    self.unchecked |= !t.is_empty();
                    cache.apply_stream(t.messages()).err()
                }
                Err(why) => Some(why.to_string()),
            },
            _ => Some(String::new()),
        };
        self.tables = tables.cloned();
        if sysctls.is_some() && stale.is_none() && self.unchecked {
            // What changed since the last look is drift even though this reconcile repairs
            // it: reported as idle would have, had it looked first, but marked as being
            // repaired so that no second repair is scheduled for it.
            self.check_drift(true);
        }
        // A reconcile diffs everything it observes; any other job leaves that to idle.
        self.unchecked = sysctls.is_none() && (self.unchecked || stale.is_some());
        let mut host = None;
        let cache = match (stale, self.cache.take()) {
            (None, Some(cache)) => self.cache.insert(cache),
            (why, had) => {
                match (why, had) {
                    (Some(why), Some(_)) => tracing::warn!(
                        reason = %why,
                        "dataplane: the kernel's notifications cannot be trusted; re-reading it with dumps"
                    ),
                    _ => tracing::debug!("dataplane: reading the kernel with dumps"),
                }
                // What rtnetlink does not hold is read meanwhile: the dumps wait on the kernel.
                let dumped = std::thread::scope(|s| {
                    let reading = sysctls.map(|keys| s.spawn(|| observe::read_host(keys)));
                    let dumped = self.dump();
                    host = reading.map(|r| {
                        r.join()
                            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                    });
                    dumped
                })?;
                self.cache.insert(dumped)
            }
        };
        match (sysctls, host) {
            (_, Some(host)) => observe::observe_host_with(&mut self.nl, &mut cache.node, host?)?,
            (Some(sysctls), None) => observe::observe_host(&mut self.nl, &mut cache.node, sysctls)?,
            (None, None) => {}
        }
        let full = std::mem::replace(&mut cache.fresh, false);
        Ok(f(&mut self.nl, &cache.node, full))
    }

    /// After an apply: takes in the notifications of what it wrote, then forgets what it
    /// `deleted` (gone now, notified or not). After a failed apply the cache is dropped:
    /// the next reconcile dumps. After a reconcile that applied `plan`, that is what Lace
    /// last applied (`Some(None)`: nothing, after a teardown); after an attach (`None`) the
    /// attached pods are added with [`Session::attached`].
    pub fn settle(
        &mut self,
        deleted: Vec<Deleted>,
        applied: bool,
        plan: Option<Option<DesiredNode>>,
    ) {
        let redumped = self.redump_if_paused(applied);
        let Some(cache) = &mut self.cache else { return };
        let mut notified = redumped;
        let why = if applied {
            match self.nl.notifications().map(|n| n.take()) {
                Some(Ok(t)) => {
                    notified = !t.is_empty();
                    cache.apply_stream(t.messages()).err()
                }
                Some(Err(why)) => Some(why.to_string()),
                None => Some("no notification socket".into()),
            }
        } else {
            Some("an apply failed".into())
        };
        match why {
            // A dump shows what was deleted as gone, and nothing else as gone.
            None if redumped => {}
            None => {
                for d in deleted {
                    cache.forget(d);
                }
            }
            Some(why) => {
                tracing::info!(reason = %why, "dataplane: dropping the cached kernel state; the next reconcile dumps");
                self.cache = None;
                return;
            }
        }
        match plan {
            Some(plan) => {
                self.applied.reconciled(plan);
                // What arrived while the apply ran includes its own echoes, which leave
                // nothing to do, and whatever changed meanwhile, which does.
                if notified {
                    self.check_drift(false);
                }
            }
            None => self.unchecked |= notified,
        }
    }

    /// After an apply that left the route groups ([`dump_after`]): joins them again and, if
    /// the apply succeeded, dumps the namespace into a new cache; returns whether it did.
    /// Otherwise (or if the dump fails) the cache is dropped and the next reconcile dumps.
    fn redump_if_paused(&mut self, applied: bool) -> bool {
        let Some(n) = self.nl.notifications() else {
            return false;
        };
        if !n.routes_paused() {
            return false;
        }
        self.cache = None;
        if !applied {
            n.discard(); // joins them again
            return false;
        }
        match self.dump() {
            Ok(mut cache) => {
                cache.fresh = false; // read by this reconcile, not the next
                self.cache = Some(cache);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "dataplane: dumping the routes after a bulk apply failed; the next reconcile dumps");
                false
            }
        }
    }

    /// A new cache from dumps (of the tables of the last job's plan). What was notified
    /// before is dropped (the dump shows it), and the route groups are joined again if a
    /// bulk apply left them, before the dump, so no change falls between the two.
    fn dump(&mut self) -> Result<Cache, ObserveError> {
        if let Some(n) = self.nl.notifications() {
            n.discard();
        }
        let (node, host, ipv4_tables) = observe::dump(&mut self.nl, self.tables.as_ref())?;
        Ok(Cache::new(node, host, ipv4_tables))
    }

    /// After an attach: the pods of `pods` are part of what Lace applied.
    pub fn attached(&mut self, pods: &DesiredNode) {
        self.applied.attached(pods);
    }

    /// Between reconciles: takes in what the kernel notified, so its socket never overruns
    /// on a busy host, and reports drift: the kernel no longer holding what Lace applied, or
    /// a gap in the notifications (the cache is dropped; the next reconcile dumps).
    pub fn idle(&mut self) {
        let Some(n) = self.nl.notifications() else {
            return;
        };
        let Some(cache) = &mut self.cache else {
            // Nothing to keep current: the next reconcile dumps anyway.
            n.discard();
            return;
        };
        let taken = n.take();
        let lost = match taken {
            Ok(t) if t.is_empty() && !self.unchecked => return,
            Ok(t) => cache.apply_stream(t.messages()).err(),
            Err(why) => Some(why.to_string()),
        };
        match lost {
            None => self.check_drift(false),
            Some(why) => {
                tracing::warn!(reason = %why, "dataplane: the kernel's notifications cannot be trusted; the next reconcile dumps");
                self.cache = None;
                if self.applied.is_some() {
                    self.report(Drift {
                        ops: 0,
                        summary: format!("the kernel's notifications could not be followed: {why}"),
                        repairing: false,
                    });
                }
            }
        }
    }

    /// The cached state, if any (without sysctls, tunsrc or nft read again).
    pub fn cached(&self) -> Option<&ObservedNode> {
        self.cache.as_ref().map(|c| &c.node)
    }

    /// The IPv4 tables the cache's dump read (`None`: every table, or no cache).
    pub fn cached_tables(&self) -> Option<BTreeSet<u32>> {
        self.cache.as_ref().and_then(|c| c.ipv4_tables.clone())
    }

    /// Reports drift if the cached kernel state differs from what Lace applied.
    fn check_drift(&mut self, repairing: bool) {
        self.unchecked = false;
        let Some(cache) = &self.cache else { return };
        let Some(mut drift) = self.applied.drift(&cache.node) else {
            return;
        };
        drift.repairing = repairing;
        tracing::debug!(%drift, "dataplane: drift");
        self.report(drift);
    }

    fn report(&self, drift: Drift) {
        let sink = self
            .on_drift
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(handler) = sink.as_ref() {
            handler(drift);
        }
    }
}

/// Opens a session's socket, for [`super::netns::Worker::start`].
pub fn open(
    rx_buf: usize,
    bulk_routes: usize,
    on_drift: DriftSink,
) -> impl FnOnce() -> Result<Session, NlError> + Send + 'static {
    move || Ok(Session::new(Nl::open()?, rx_buf, bulk_routes, on_drift))
}

#[cfg(test)]
mod tests;
