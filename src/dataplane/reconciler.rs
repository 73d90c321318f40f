//! The [`Reconciler`]: one network namespace's worker thread, its rtnetlink sockets and its
//! memory, and the jobs it runs there: a reconcile (observe, [`diff`](super::diff::diff),
//! apply, settle the memory), a teardown, a pod's attach, and the CNI's kernel work. See the
//! module docs of `dataplane` for what it owns and in which order it changes it.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::apply::{self, OpFailure};
use super::diff::{self, DiffError, KnownRuleset};
use super::linklocal::{self, UnderlayQuery, UnderlayRound};
use super::netns::{self, NetnsError, NetnsTarget};
use super::observe::{self, ObserveError};
use super::observed::ObservedNode;
use super::op::Op;
use super::pod::{self, PodFailure, PodInterface, PodLinkState};
use super::watch::{self, Drift};
use super::{host, nl};
use crate::plan::shaping::shaper_name;
use crate::plan::{self, DesiredNode};

/// What a reconcile did.
#[derive(Clone, Debug, Default)]
pub struct ApplyReport {
    /// Operations the diff produced.
    pub ops: usize,
    /// Write requests issued to the kernel (netlink messages, sysctl writes, `nft -f` runs,
    /// tunsrc sets). Zero when the kernel already matched the plan.
    pub writes: u64,
    /// Pod routes left out because their device does not exist (yet, or any more).
    pub skipped: Vec<String>,
    /// The first [`SAMPLE_OPS`] operations, as text (for logs).
    pub sample: Vec<String>,
    /// Whether this reconcile read the kernel with full dumps (the first one, or after the
    /// notification stream could not be trusted) instead of its cached, notified state.
    pub full_dump: bool,
    /// Whether the apply wrote so many routes that it read them back with a dump instead of
    /// their notifications ([`watch::dump_after`]).
    pub dumped_after: bool,
    /// Where a reconcile's time went (left at zero by a pod's attach).
    pub phases: Phases,
}

/// Where a reconcile's time went, phase by phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Phases {
    /// Reading the kernel: the memory brought up to date by the notifications queued since the
    /// last reconcile, or full dumps; sysctls, `ip sr tunsrc`, the nft table.
    pub observe: Duration,
    /// The pure diff of the plan against what was observed.
    pub diff: Duration,
    /// The writes: netlink batches, `nft -f`, sysctls.
    pub apply: Duration,
    /// Taking in the writes' own notifications and checking the kernel for drift.
    pub settle: Duration,
}

impl fmt::Display for Phases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "observe {:.1} ms, diff {:.1} ms, apply {:.1} ms, settle {:.1} ms",
            ms(self.observe),
            ms(self.diff),
            ms(self.apply),
            ms(self.settle)
        )
    }
}

/// How many operations an [`ApplyReport`] names.
pub const SAMPLE_OPS: usize = 32;

impl ApplyReport {
    /// The report of a diff about to be applied (no writes yet).
    fn of(ops: &[Op], skipped: Vec<String>, full_dump: bool) -> Self {
        Self {
            ops: ops.len(),
            writes: 0,
            sample: ops.iter().take(SAMPLE_OPS).map(|o| o.to_string()).collect(),
            skipped,
            full_dump,
            dumped_after: false,
            phases: Phases::default(),
        }
    }
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("observing {target}: {source}")]
    Observe {
        target: String,
        #[source]
        source: ObserveError,
    },
    #[error("planning the changes for {target}: {source}")]
    Diff {
        target: String,
        #[source]
        source: DiffError,
    },
    #[error("applying to {target}: {} operation(s) failed (after {writes} writes); first: {}", failures.len(), failures.first().map(|f| f.to_string()).unwrap_or_default())]
    Apply {
        target: String,
        writes: u64,
        failures: Vec<OpFailure>,
    },
    #[error("in {target}: the kernel refused {} request(s); first: {}", failures.len(), failures.first().map(|f| f.to_string()).unwrap_or_default())]
    Refused {
        target: String,
        failures: Vec<OpFailure>,
    },
    #[error("netlink in {target}: {source}")]
    Netlink {
        target: String,
        #[source]
        source: nl::NlError,
    },
}

/// The dataplane's error for the pod side's failure `e` in namespace `target`.
fn pod_error(e: PodFailure, target: String) -> DataplaneError {
    match e {
        PodFailure::Netlink(source) => DataplaneError::Netlink { target, source },
        PodFailure::Refused(failures) => DataplaneError::Refused { target, failures },
    }
}

/// Tuning of a [`Reconciler`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcilerOptions {
    /// Receive buffer of the notification socket, in bytes: changes made between two drains
    /// beyond what it holds make the next reconcile dump everything again.
    pub notification_buffer: usize,
    /// Route writes from which an apply that writes more routes than the namespace holds
    /// reads them back with a dump instead of their notifications ([`watch::dump_after`]).
    pub bulk_routes: usize,
}

impl Default for ReconcilerOptions {
    fn default() -> Self {
        Self {
            notification_buffer: watch::NOTIFICATION_BUFFER,
            bulk_routes: watch::BULK_ROUTES,
        }
    }
}

/// Reconciles one network namespace, remembering what it observed between calls (kept
/// current by the kernel's notifications; see the module docs), and does the CNI's kernel
/// work: the pod end of a veth in the pod's namespace ([`Reconciler::create_pod_interface`]),
/// the pod's part of the plan on the node ([`Reconciler::attach`]).
pub struct Reconciler {
    worker: netns::Worker<watch::Session>,
    /// The nft ruleset last written or found; shared with the worker's jobs, which run one
    /// at a time.
    known_nft: Arc<Mutex<Option<KnownRuleset>>>,
    /// The namespace, kept open: pod veths are created with their host end in it.
    netns: Arc<File>,
    on_drift: watch::DriftSink,
}

impl fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler")
            .field("target", self.worker.target())
            .finish_non_exhaustive()
    }
}

impl Reconciler {
    /// Starts the namespace's worker thread and opens its rtnetlink socket.
    pub fn new(target: NetnsTarget) -> Result<Self, DataplaneError> {
        Self::with_options(target, ReconcilerOptions::default())
    }

    /// [`Reconciler::new`] with `options`.
    pub fn with_options(
        target: NetnsTarget,
        options: ReconcilerOptions,
    ) -> Result<Self, DataplaneError> {
        let netns = Arc::new(target.open()?);
        let on_drift = watch::DriftSink::default();
        Ok(Self {
            worker: netns::Worker::start(
                target,
                watch::open(
                    options.notification_buffer,
                    options.bulk_routes,
                    Arc::clone(&on_drift),
                ),
                watch::Session::idle,
                watch::IDLE_DRAIN,
            )?,
            known_nft: Arc::default(),
            netns,
            on_drift,
        })
    }

    fn target(&self) -> String {
        self.worker.target().to_string()
    }

    /// Calls `handler` (from the reconciler's thread; it must not block) whenever the kernel's
    /// notifications show something Lace applied changed without Lace: deleted, replaced,
    /// flushed with its link. Changes to foreign objects and Lace's own writes echoing back
    /// are not drift. Replaces any previous handler.
    pub fn on_drift(&self, handler: impl Fn(Drift) + Send + Sync + 'static) {
        *self.on_drift.lock().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(handler));
    }

    /// Reads what Lace owns (and what next hops resolve against) with full dumps, neither
    /// using nor changing the reconciler's memory. `sysctls` are the keys to read.
    pub fn observe(&self, sysctls: BTreeSet<String>) -> Result<ObservedNode, DataplaneError> {
        self.worker
            .run(move |s| observe::observe(&mut s.nl, &sysctls))?
            .map_err(|source| DataplaneError::Observe {
                target: self.target(),
                source,
            })
    }

    /// What the reconciler's memory holds now (links, addresses, routes, rules), brought up
    /// to date with the kernel's notifications, or dumped if there is none. Its IPv4 routes
    /// are those of the tables the memory's dump read: at least the VRFs' and Lace's own
    /// ([`observe::ipv4_tables_to_read`]), which is what a snapshot is read for (links,
    /// addresses, host routes, a pod's routes in its Network's table).
    pub fn snapshot(&self) -> Result<ObservedNode, DataplaneError> {
        let target = self.target();
        let any = BTreeSet::new();
        self.worker
            .run(move |s| s.with_observed(None, Some(&any), |_, observed, _| observed.clone()))?
            .map_err(|source| DataplaneError::Observe { target, source })
    }

    /// How the reconciler's memory differs from a full dump taken now, one line per
    /// difference (empty: none, or nothing remembered yet). Sysctls, tunsrc and the nft
    /// table are read afresh by every reconcile and not compared. For tests (feature
    /// `testing`): the agent trusts its memory.
    #[cfg(feature = "testing")]
    pub fn memory_drift(&self) -> Result<Vec<String>, DataplaneError> {
        let target = self.target();
        self.worker
            .run(move |s| {
                // The tables the memory's own dump read.
                let tables = s.cached_tables();
                let fresh = observe::dump(&mut s.nl, tables.as_ref()).map(|(node, ..)| node)?;
                Ok(s.cached()
                    .map(|c| memory_drift(c, &fresh))
                    .unwrap_or_default())
            })?
            .map_err(|source| DataplaneError::Observe { target, source })
    }

    /// Of the namespace's routes to remote blocks, how many there are and how many are read
    /// in one pass ([`observe::remote_block_routes_read`]). For tests (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn remote_block_routes_read(&self) -> Result<(usize, usize), DataplaneError> {
        let target = self.target();
        self.worker
            .run(move |s| observe::remote_block_routes_read(&mut s.nl))?
            .map_err(|e| DataplaneError::Observe {
                target,
                source: e.into(),
            })
    }

    /// Makes the namespace hold exactly `desired` (of what Lace owns).
    pub fn reconcile(&self, desired: &DesiredNode) -> Result<ApplyReport, DataplaneError> {
        let desired = desired.clone();
        Ok(self
            .reconcile_with(move || Some(desired), false)?
            .unwrap_or_default())
    }

    /// Plans with `plan`, on the reconciler's thread, and makes the namespace hold that plan;
    /// `Ok(None)` when `plan` gives none. Planning there orders the plan after every
    /// [`Reconciler::attach`] that came first, so a pod attached meanwhile is in it. `resync`
    /// reads the kernel with full dumps (of every table, not just those the plan and the
    /// node's VRFs name) instead of the remembered state.
    pub fn reconcile_with(
        &self,
        plan: impl FnOnce() -> Option<DesiredNode> + Send + 'static,
        resync: bool,
    ) -> Result<Option<ApplyReport>, DataplaneError> {
        let target = self.target();
        let known_nft = Arc::clone(&self.known_nft);
        self.worker.run(move |session| {
            let Some(desired) = plan() else {
                return Ok(None);
            };
            // A periodic resync reads every table: a Lace route in a table no plan or VRF
            // names (left there by hand) is found then.
            if resync {
                session.forget();
            }
            let tables = (!resync).then(|| desired.tables());
            converge(session, &known_nft, Some(desired), tables, target).map(Some)
        })?
    }

    /// Removes everything Lace owns (VRFs, routes, rules, the nft table). Sysctls and
    /// `ip sr tunsrc` stay, and so does the l3mdev rule, which every VRF on the host shares.
    pub fn teardown_all(&self) -> Result<ApplyReport, DataplaneError> {
        let target = self.target();
        let known_nft = Arc::clone(&self.known_nft);
        self.worker
            .run(move |session| converge(session, &known_nft, None, None, target))?
    }

    /// Gives the pods of `pods` (a plan whose `pod_routes` are just theirs) what the full
    /// plan holds for them on the node: [`diff::attach`], applied. CNI ADD calls it once the
    /// pod's veth exists; the reconcile that follows then writes nothing of it again.
    pub fn attach(&self, pods: DesiredNode) -> Result<ApplyReport, DataplaneError> {
        let target = self.target();
        self.worker.run(move |session| {
            let tables = pods.tables();
            let outcome = session
                .with_observed(None, Some(&tables), |nl, observed, full_dump| {
                    // The shaping of the pods' links, read for shaped pods only.
                    let links: BTreeSet<String> = pods
                        .shaping
                        .keys()
                        .flat_map(|veth| [veth.clone(), shaper_name(veth)])
                        .collect();
                    let tc = match links.is_empty() {
                        true => Default::default(),
                        false => observe::tc(nl, &observed.links, Some(&links)).map_err(|e| {
                            DataplaneError::Observe {
                                target: target.clone(),
                                source: ObserveError::Tc(e),
                            }
                        })?,
                    };
                    let d = diff::attach(&pods, observed, &tc).map_err(|source| {
                        DataplaneError::Diff {
                            target: target.clone(),
                            source,
                        }
                    })?;
                    let report = ApplyReport::of(&d.ops, d.skipped, full_dump);
                    let (writes, failures) =
                        apply::apply(nl, observed, &d.ops, apply::Batching::Pod);
                    Ok::<_, DataplaneError>((ApplyReport { writes, ..report }, failures))
                })
                .map_err(|source| DataplaneError::Observe {
                    target: target.clone(),
                    source,
                })?;
            let (report, failures) = outcome?;
            session.settle(Vec::new(), failures.is_empty(), None);
            if !failures.is_empty() {
                return Err(DataplaneError::Apply {
                    target,
                    writes: report.writes,
                    failures,
                });
            }
            session.attached(&pods);
            Ok(report)
        })?
    }

    /// Looks at the node's uplink and probes its on-link peers' link-local underlay addresses
    /// ([`linklocal`]): reads the remembered links, addresses and host routes, the uplink's
    /// `disable_ipv6`, and sends the probes from a thread of their own in the namespace (the
    /// worker keeps serving reconciles and ADDs meanwhile). Writes nothing.
    pub fn probe_underlay(&self, query: UnderlayQuery) -> Result<UnderlayRound, DataplaneError> {
        let Some(ipv4) = query.ipv4 else {
            return Ok(UnderlayRound::default());
        };
        let snapshot = self.snapshot()?;
        let Some((uplink, index, mtu, on_link)) = linklocal::on_link(&snapshot, ipv4, &query.peers)
        else {
            return Ok(UnderlayRound::default());
        };
        let own = plan::underlay::link_local_address(ipv4);
        let holds_address = snapshot.addrs.contains(&(IpAddr::V6(own), index));
        let peers = linklocal::peer_addresses(&query.peers, &on_link);
        let key = plan::disable_ipv6_key(&uplink);
        let (uplink_ipv6, answering) = netns::run_in(self.worker.target(), move |_| {
            let ipv6 = host::read_sysctl(&key).as_deref() == Some("0");
            let answering = if ipv6 && holds_address {
                linklocal::probe(own, index, &peers, linklocal::PROBE_TIMEOUT)
            } else {
                BTreeSet::new()
            };
            (ipv6, answering)
        })?;
        Ok(UnderlayRound {
            uplink: Some(uplink),
            uplink_mtu: Some(mtu),
            uplink_ipv6,
            holds_address,
            on_link,
            answering,
        })
    }

    /// `ip link del <name>` for each of `names` in the namespace; returns those that existed.
    pub fn delete_links(&self, names: Vec<String>) -> Result<Vec<String>, DataplaneError> {
        let target = self.target();
        self.worker.run(move |session| {
            let outcome = pod::delete_links(&mut session.nl, &names);
            session.settle(Vec::new(), true, None);
            outcome.map_err(|e| pod_error(e, target))
        })?
    }

    /// In the pod's namespace `pod_ns`: creates the veth pair, its host end straight into
    /// this namespace, and configures the pod end (`pod::create`); returns the pod end's
    /// MAC, or `None` if a link of either name exists already (nothing was created).
    pub fn create_pod_interface(
        &self,
        pod_ns: &Path,
        pod: &PodInterface,
    ) -> Result<Option<Vec<u8>>, DataplaneError> {
        let fd = self.netns.as_raw_fd();
        let target = NetnsTarget::Path(pod_ns.to_owned());
        netns::run_in(&target, |nl| pod::create(nl, pod, fd))?
            .map_err(|e| pod_error(e, target.to_string()))
    }

    /// `ip link del <name>` for each of `names` in the pod's namespace `pod_ns`; returns
    /// those that existed.
    pub fn delete_pod_links(
        &self,
        pod_ns: &Path,
        names: &[String],
    ) -> Result<Vec<String>, DataplaneError> {
        let target = NetnsTarget::Path(pod_ns.to_owned());
        netns::run_in(&target, |nl| pod::delete_links(nl, names))?
            .map_err(|e| pod_error(e, target.to_string()))
    }

    /// Brings `lo` up in the pod's namespace `pod_ns` and reads it (`pod::loopback_up`).
    pub fn loopback_up(&self, pod_ns: &Path) -> Result<PodLinkState, DataplaneError> {
        let target = NetnsTarget::Path(pod_ns.to_owned());
        netns::run_in(&target, pod::loopback_up)?.map_err(|e| pod_error(e, target.to_string()))
    }

    /// What CHECK reads of interface `ifname` in the pod's namespace `pod_ns` (`pod::inspect`).
    pub fn inspect_pod_link(
        &self,
        pod_ns: &Path,
        ifname: &str,
    ) -> Result<Option<PodLinkState>, DataplaneError> {
        let target = NetnsTarget::Path(pod_ns.to_owned());
        netns::run_in(&target, |nl| pod::inspect(nl, ifname))?.map_err(|source| {
            DataplaneError::Netlink {
                target: target.to_string(),
                source,
            }
        })
    }
}

/// One reconcile on the worker: observe (memory or dumps; of `tables`, `None`: every
/// table), diff against `desired` (`None`: tear down), apply, settle the memory.
fn converge(
    session: &mut watch::Session,
    known_nft: &Mutex<Option<KnownRuleset>>,
    desired: Option<DesiredNode>,
    tables: Option<BTreeSet<u32>>,
    target: String,
) -> Result<ApplyReport, DataplaneError> {
    let mut known = known_nft.lock().unwrap_or_else(PoisonError::into_inner);
    let keys: BTreeSet<String> = desired
        .as_ref()
        .map(|d| d.base.sysctls.keys().cloned().collect())
        .unwrap_or_default();
    let started = Instant::now();
    let bulk_routes = session.bulk_routes;
    // Rendered while the kernel is read (a restart's dumps wait on the kernel), not after.
    let rendering = desired.as_ref().map(|d| {
        let render = d.render_nft_later();
        std::thread::spawn(move || diff::nft::Rendered::of(render()))
    });
    let outcome = session
        .with_observed(
            Some(&keys),
            tables.as_ref(),
            move |nl, observed, full_dump| {
                let observe = started.elapsed();
                let rendered = rendering.map(|r| {
                    r.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                });
                let d = match (&desired, &rendered) {
                    (Some(desired), Some(nft)) => {
                        diff::diff_rendered(desired, nft, observed, known.as_ref())?
                    }
                    _ => diff::diff(desired.as_ref(), observed, known.as_ref())?,
                };
                let diffed = started.elapsed();
                let nft_tag = diff::nft::tag_after(&d.ops, &observed.nft);
                let report = ApplyReport::of(&d.ops, d.skipped, full_dump);
                let deleted: Vec<watch::Deleted> =
                    d.ops.iter().filter_map(watch::Deleted::by).collect();
                let dumped_after = watch::dump_after(&d.ops, observed, bulk_routes)
                    && nl.pause_route_notifications();
                let (writes, failures) =
                    apply::apply(nl, observed, &d.ops, apply::Batching::Phases);
                let phases = Phases {
                    observe,
                    diff: diffed - observe,
                    apply: started.elapsed() - diffed,
                    settle: Duration::ZERO,
                };
                // After a failure the table may or may not have changed: forget, and let the next
                // observation decide.
                *known = if failures.is_empty() {
                    let desired_nft = desired.as_ref().map(|d| d.nft());
                    KnownRuleset::after(known.take(), desired_nft, nft_tag)
                } else {
                    None
                };
                // What was applied: of pods, only those whose veth was there to be set up (an ADD
                // in flight sets up the others itself).
                let applied = desired.map(|d| watch::Applied::of(d, observed));
                let report = ApplyReport {
                    writes,
                    dumped_after,
                    phases,
                    ..report
                };
                Ok((report, deleted, failures, applied))
            },
        )
        .map_err(|source| DataplaneError::Observe {
            target: target.clone(),
            source,
        })?;
    let (mut report, deleted, failures, plan) = outcome.map_err(|source| DataplaneError::Diff {
        target: target.clone(),
        source,
    })?;
    let applied = failures.is_empty();
    let settling = Instant::now();
    session.settle(deleted, applied, applied.then_some(plan));
    report.phases.settle = settling.elapsed();
    if applied {
        Ok(report)
    } else {
        Err(DataplaneError::Apply {
            target,
            writes: report.writes,
            failures,
        })
    }
}

/// The differences between a remembered and a freshly dumped state (links, addresses,
/// routes, host routes, rules), as text.
#[cfg(feature = "testing")]
fn memory_drift(cached: &ObservedNode, fresh: &ObservedNode) -> Vec<String> {
    fn sorted<T: fmt::Debug>(items: impl Iterator<Item = T>) -> BTreeSet<String> {
        items.map(|i| format!("{i:?}")).collect()
    }
    let mut out = Vec::new();
    let mut compare = |what: &str, a: BTreeSet<String>, b: BTreeSet<String>| {
        for x in a.difference(&b) {
            out.push(format!("{what} remembered but not in the kernel: {x}"));
        }
        for x in b.difference(&a) {
            out.push(format!("{what} in the kernel but not remembered: {x}"));
        }
    };
    compare(
        "link",
        sorted(cached.links.iter()),
        sorted(fresh.links.iter()),
    );
    compare(
        "address",
        sorted(cached.addrs.iter()),
        sorted(fresh.addrs.iter()),
    );
    compare(
        "route",
        sorted(cached.routes.iter()),
        sorted(fresh.routes.iter()),
    );
    compare(
        "host route",
        sorted(cached.host_routes.iter()),
        sorted(fresh.host_routes.iter()),
    );
    compare(
        "rule",
        sorted(cached.rules.iter()),
        sorted(fresh.rules.iter()),
    );
    out
}
