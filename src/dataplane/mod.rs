//! The dataplane reconciler: observe what Lace owns in a network namespace, [`diff`](mod@diff) it
//! against the planner's [`DesiredNode`], apply the difference — and tear it down.
//!
//! The seam is **state → plan → diff → apply**. [`diff::diff`] is pure (no kernel, unit-tested);
//! [`Reconciler`] is the only code that talks to the kernel: one rtnetlink socket per network
//! namespace, on a dedicated thread that entered it ([`netns`]), plus the `nft` binary (one
//! atomic transaction per change), `/proc/sys` and generic netlink for `ip sr tunsrc`.
//!
//! ## The CNI's kernel work
//! CNI ADD, DEL, CHECK and GC use the same stack (messages of `msg`, the blocking socket of
//! [`nl`]) and the same notion of what Lace owns. In the pod's namespace a thread made for the
//! request creates the veth pair (its host end straight into the node's namespace) and
//! configures the pod end in one batch ([`Reconciler::create_pod_interface`]). On the node,
//! [`Reconciler::attach`] applies the pod's part of the plan ([`diff::attach`]: the Network's
//! VRF if missing, the veth enslaved and up, its link-local probe source, its routes, with
//! Lace's protocol) as a job of the namespace's worker, so it is ordered with the reconciles
//! and updates the same memory: the reconcile that follows finds the pod as planned and
//! writes nothing for it. [`Reconciler::reconcile_with`] plans on the worker too, so a plan
//! never predates an attach that ran before it. DEL deletes the veth through the worker.
//!
//! ## Drift
//! The memory also says when something Lace applied changed without Lace: whenever
//! notifications arrive between jobs, or during an apply, the reconciler diffs what it last
//! applied against the memory ([`diff::drift`]: links, addresses, rules, routes). Its own
//! writes echoing back leave nothing to do, changes to foreign objects neither; anything else
//! (a route or rule deleted, a VRF deleted, an address or a link's routes flushed, a route
//! replaced by another tool) is reported to [`Reconciler::on_drift`], as is a gap in the
//! notifications. The agent schedules the repair (see `agent::reconcile`).
//!
//! ## Memory
//! The reconciler keeps what it observed between calls: the first reconcile dumps links,
//! addresses, routes and rules, and from then on a second rtnetlink socket subscribed to
//! their change notifications keeps that state current (the writes' own notifications
//! included), so an unchanged plan is re-applied without reading the kernel's routes again.
//! Whenever the notification stream cannot be trusted (overrun, an undecodable or unexpected
//! message, a failed apply) the next reconcile dumps again; see [`watch`] for what the
//! kernel changes without notifying and how the cache follows. Sysctls, `ip sr tunsrc` and
//! the nft table's tag are read on every reconcile (each a constant-cost read); the nft
//! ruleset last written is remembered too (see below).
//!
//! ## Ownership
//! Lace reads as its own, and only ever changes or deletes:
//! - routes with protocol [`ROUTE_PROTOCOL`] in Lace's tables
//!   ([`plan::VRF_TABLE_BASE`]`..=`[`plan::PROBE_TABLE`]) or in the main table (SIDs, locators,
//!   reply routes), deleted with the protocol set so the kernel never matches a foreign route;
//! - FIB rules with a priority in [`plan::RULE_PRIORITY_PROBE`]`..=`[`plan::RULE_PRIORITY_L3MDEV`];
//! - links named [`plan::VRF_PREFIX`]`*` (VRFs), [`plan::INGRESS_PREFIX`]`*` (a VRF's ingress
//!   device: a dummy enslaved to it, see [`plan::ingress`]) and [`underlay::TUNNEL_PREFIX`]`*`
//!   (the SRv6-over-IPv4 device [`underlay::IPV4_TUNNEL`], with its address and sysctl). Pod veths
//!   ([`POD_LINK_PREFIX`]`*`, created and deleted by the CNI) are enslaved to their VRF,
//!   brought up, given the link-local source of their IPv6 probe route
//!   ([`plan::POD_GATEWAY_V6`]) and, when enslaved, their proxy ARP sysctls and (pods with
//!   IPv6) IPv6 enabled ([`diff::pod_link_sysctls`]). Every one of these devices that carries
//!   IPv6 gets `net.ipv6.conf.<dev>.disable_ipv6=0` ([`plan::disable_ipv6_key`]) before its
//!   addresses and routes, so a host whose `default` disables IPv6 works too; the pod's end of
//!   a veth gets it (and the pod's `lo`) in the pod's namespace when the pod has IPv6
//!   (`pod::sysctls`). No other device's is ever written;
//! - the fou receive port [`underlay::FOU_PORT`] (IPv4), looked at only while a Lace tunnel
//!   device exists (it is added after the device and deleted before it);
//! - the sysctls the plan lists (set, never reverted: their previous values are unknown);
//! - the nftables table `inet lace`;
//! - `ip sr tunsrc` (one value per namespace).
//!
//! Everything else is never touched; it is read only to resolve next hops (link names, the
//! uplink holding the underlay address, what the main table routes for [`Nexthop::Host`]).
//!
//! ## Order and failure
//! [`diff::diff`] orders operations so nothing opens or black-holes mid-change: VRFs and the
//! SRv6-over-IPv4 device (created down), pod enslavement, the nft table (changed in one
//! transaction, always before routes that would open a path; its `ct` expressions load
//! conntrack, whose sysctl comes next), sysctls, addresses (the pod veths' link-local probe
//! source, which enslaving drops; the tunnel source, once the device's IPv6 is enabled), `ip sr
//! tunsrc`, the fou port and the device brought up (only now that the ruleset guarding it is
//! in), rules, routes added or replaced, and only then the deletions (routes, rules, the fou
//! port, links). A link the diff creates or re-creates gets its routes and sysctls written
//! again, whatever the old one showed. When a Network is removed, its VRF's routes go after the new ruleset no longer
//! names the VRF: a pod still attached to it would briefly be unpoliced, but its Network has
//! no routes left to other Networks' pods a moment later (pods of a removed Network are
//! expected to be gone already). Apply runs the phases in that order; the netlink
//! operations of one phase go to the kernel in batches, and after a phase with a failure the
//! reconciler stops and reports every failed object. "The previous state stays in force"
//! means: a failure never happens after a deletion of the same apply (deletions are last), so
//! every route that carried traffic before still does; a failed phase may leave some of its
//! *new* routes installed (each route is independent), which the next reconcile completes or
//! removes. The nft table is all-or-nothing (one `nft -f` transaction).
//!
//! ## Observing and writing the nft table
//! The element of set `plan` in table `inet lace` carries a tag of the ruleset Lace wrote
//! (`lace-plan <fnv64>`, a digest of its text), written in the same transaction as the
//! ruleset and read back with one nfnetlink request, so observing costs the same for any
//! table size. The [`Reconciler`] remembers the ruleset it last wrote or found with the
//! plan's tag. When the kernel's tag is that ruleset's and the plan differs from it only in
//! set and map elements, one `nft -f` transaction deletes and adds just those elements and
//! the tag; otherwise (a restarted reconciler, a table missing, untagged or tagged with
//! something else, a chain or set declaration changed) one transaction replaces the whole
//! table. Either way there is no moment without the old or the new ruleset. A hand edit
//! inside `inet lace` that keeps the tag is not noticed until the plan changes, and then
//! survives an element update (it is replaced with the next full replace).
//!
//! ## Threads and sockets
//! Each [`Reconciler`] owns one worker thread that entered the namespace with `setns`, one
//! blocking rtnetlink socket on it ([`nl`]) and the notification socket, which the thread
//! also drains while idle (every [`watch::IDLE_DRAIN`] without a job, which is also how soon
//! drift is seen). There is no async runtime on that thread: batching (many requests per
//! `send`, ACKs read back per chunk) needs control of the socket, and nothing else runs
//! there. A CNI request's work in a pod's namespace gets a thread and socket of its own for
//! the request. The message types are `netlink-packet-route` 0.34's, the socket
//! `netlink-sys`'s: one netlink stack, no async rtnetlink.
//!
//! [`DesiredNode`]: crate::plan::DesiredNode
//! [`Nexthop::Host`]: crate::plan::Nexthop::Host
//! [`underlay::TUNNEL_PREFIX`]: crate::plan::underlay::TUNNEL_PREFIX
//! [`underlay::IPV4_TUNNEL`]: crate::plan::underlay::IPV4_TUNNEL
//! [`underlay::FOU_PORT`]: crate::plan::underlay::FOU_PORT

mod apply;
pub mod diff;
mod fou;
pub(crate) mod host;
mod ingress;
pub mod linklocal;
mod msg;
pub mod netns;
mod nft;
pub mod nl;
mod observe;
mod pod;
mod rawnl;
mod seg6;
mod tunnel;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use ipnet::IpNet;

use crate::plan::{self, DesiredNode, RouteKey};

pub use diff::{diff, Diff, DiffError, Op};
pub use fou::FouListener;
pub use linklocal::{UnderlayQuery, UnderlayRound};
pub use netns::{NetnsError, NetnsTarget};
pub use nft::KnownRuleset;
pub use observe::ObserveError;
pub use pod::{gateway, PodInterface, PodLinkState, GATEWAY_V4, GATEWAY_V6};
pub use watch::Drift;

/// Lace's rtnetlink route protocol id (`proto 76`, ASCII `L`). Not in iproute2's `rt_protos`
/// (which lists 0-4, 8-18, 42, 99, 186-192) nor used by the common CNIs (Calico uses 80).
pub const ROUTE_PROTOCOL: u8 = 0x4c;

/// Prefix of the host side of pod veths (the CNI names them `lp-<hash>`). The reconciler only
/// enslaves such links to their Network's VRF.
pub const POD_LINK_PREFIX: &str = "lp-";

/// A route's next hop as the kernel holds it: symbolic next hops resolved, devices by name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KernelNexthop {
    /// `dev <dev>`.
    Dev(String),
    /// `dev <dev> src <src>`: the source the host uses towards the destination (probe routes).
    DevSrc { dev: String, src: IpAddr },
    /// `via <via> dev <dev>`.
    Via { via: IpAddr, dev: String },
    /// `encap seg6 mode encap segs <segs> dev <dev>`.
    Seg6Encap { segs: Ipv6Addr, dev: String },
    /// `encap seg6local action End.DT46 vrftable <vrf_table> dev <dev>`.
    Seg6LocalDt46 { vrf_table: u32, dev: String },
    /// `unreachable`.
    Unreachable,
    /// A route of Lace's in a form Lace never writes (someone edited it): replaced or deleted.
    Unknown(String),
}

impl KernelNexthop {
    /// The device the route names, if any.
    pub fn dev(&self) -> Option<&str> {
        match self {
            Self::Dev(dev)
            | Self::DevSrc { dev, .. }
            | Self::Via { dev, .. }
            | Self::Seg6Encap { dev, .. }
            | Self::Seg6LocalDt46 { dev, .. } => Some(dev),
            Self::Unreachable | Self::Unknown(_) => None,
        }
    }
}

impl fmt::Display for KernelNexthop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dev(d) => write!(f, "dev {d}"),
            Self::DevSrc { dev, src } => write!(f, "dev {dev} src {src}"),
            Self::Via { via, dev } => write!(f, "via {via} dev {dev}"),
            Self::Seg6Encap { segs, dev } => {
                write!(f, "encap seg6 mode encap segs {segs} dev {dev}")
            }
            Self::Seg6LocalDt46 { vrf_table, dev } => write!(
                f,
                "encap seg6local action End.DT46 vrftable {vrf_table} dev {dev}"
            ),
            Self::Unreachable => write!(f, "unreachable"),
            Self::Unknown(s) => write!(f, "unknown ({s})"),
        }
    }
}

/// A link as observed (any link: names resolve next hops; only `lv-*` ones are Lace's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedLink {
    pub index: u32,
    /// The VRF table, if the link is a VRF.
    pub vrf_table: Option<u32>,
    /// The tunnel's parameters, if the link is a `sit` device.
    pub sit: Option<SitLink>,
    /// Whether the link is a `dummy` device.
    pub dummy: bool,
    /// Index of the link's master (VRF), if enslaved.
    pub master: Option<u32>,
    pub up: bool,
    pub mtu: u32,
}

/// What Lace sets of a `sit` device (`ip -d link show`), as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SitLink {
    /// `local` (`None`: any).
    pub local: Option<Ipv4Addr>,
    /// `remote` (`None`: any).
    pub remote: Option<Ipv4Addr>,
    /// `dev`: the index of the link the tunnel is bound to (0: none).
    pub link: u32,
    /// `ttl` (0: inherit).
    pub ttl: u8,
    pub pmtudisc: bool,
    /// `encap` type (`TUNNEL_ENCAP_*`: 0 none, 1 fou, 2 gue).
    pub encap_type: u16,
    /// `encap-sport` (0: auto) and `encap-dport`.
    pub encap_sport: u16,
    pub encap_dport: u16,
    /// `encap-csum` and friends (`TUNNEL_ENCAP_FLAG_*`).
    pub encap_flags: u16,
}

/// A FIB rule in Lace's priority band.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedRule {
    /// The rule in the planner's terms, when it is one Lace writes.
    pub rule: Option<plan::Rule>,
    /// The kernel's message, to delete it exactly.
    pub raw: netlink_packet_route::rule::RuleMessage,
}

/// A host (non-Lace) unicast route of the main table, to resolve [`plan::Nexthop::Host`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoute {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub dev: Option<String>,
}

/// What the nft table `inet lace` looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NftState {
    Absent,
    /// Present, with the plan tag Lace wrote into its set `plan` (None: no such set, or not
    /// exactly one element with a plan tag as its comment).
    Present {
        tag: Option<String>,
    },
}

/// Everything the reconciler observed in one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedNode {
    /// All links by name.
    pub links: BTreeMap<String, ObservedLink>,
    /// Local addresses (both families) and the index of the link holding each.
    pub addrs: Vec<(IpAddr, u32)>,
    /// Lace's routes.
    pub routes: BTreeMap<RouteKey, KernelNexthop>,
    /// The host's own unicast routes of the main table.
    pub host_routes: Vec<HostRoute>,
    /// Rules in Lace's priority band.
    pub rules: Vec<ObservedRule>,
    /// The sysctls asked for: key → current value (None: no such sysctl yet).
    pub sysctls: BTreeMap<String, Option<String>>,
    pub tunsrc: Option<Ipv6Addr>,
    pub nft: NftState,
    /// The fou receive ports, read only while a Lace tunnel device exists (`None`: not read).
    pub fou: Option<Vec<FouListener>>,
}

impl ObservedNode {
    /// The name of the link with index `index`.
    pub fn link_name(&self, index: u32) -> Option<&str> {
        self.links
            .iter()
            .find(|(_, l)| l.index == index)
            .map(|(n, _)| n.as_str())
    }

    /// Lace's VRF links (`lv-*`).
    pub fn vrfs(&self) -> impl Iterator<Item = (&String, &ObservedLink)> {
        self.links
            .iter()
            .filter(|(n, _)| n.starts_with(plan::VRF_PREFIX))
    }

    /// Lace's VRF ingress devices (`li-*`).
    pub fn ingress_links(&self) -> impl Iterator<Item = (&String, &ObservedLink)> {
        self.links
            .iter()
            .filter(|(n, _)| n.starts_with(plan::INGRESS_PREFIX))
    }

    /// Lace's underlay tunnel links (`lu-*`).
    pub fn tunnels(&self) -> impl Iterator<Item = (&String, &ObservedLink)> {
        self.links
            .iter()
            .filter(|(n, _)| n.starts_with(plan::underlay::TUNNEL_PREFIX))
    }
}

/// One operation that failed, with the object it concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpFailure {
    /// The operation (`ip`-like text naming the object).
    pub op: String,
    /// What the kernel or tool said.
    pub error: String,
}

impl fmt::Display for OpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.error)
    }
}

/// What a reconcile did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
}

/// How many operations an [`ApplyReport`] names.
pub const SAMPLE_OPS: usize = 32;

impl ApplyReport {
    /// The report of a diff about to be applied (no writes yet).
    fn of(ops: &[diff::Op], skipped: Vec<String>, full_dump: bool) -> Self {
        Self {
            ops: ops.len(),
            writes: 0,
            sample: ops.iter().take(SAMPLE_OPS).map(|o| o.to_string()).collect(),
            skipped,
            full_dump,
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
        source: observe::ObserveError,
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

/// Tuning of a [`Reconciler`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcilerOptions {
    /// Receive buffer of the notification socket, in bytes: changes made between two drains
    /// beyond what it holds make the next reconcile dump everything again.
    pub notification_buffer: usize,
}

impl Default for ReconcilerOptions {
    fn default() -> Self {
        Self {
            notification_buffer: watch::NOTIFICATION_BUFFER,
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
    known_nft: Arc<Mutex<Option<nft::KnownRuleset>>>,
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
                watch::open(options.notification_buffer, Arc::clone(&on_drift)),
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
    /// to date with the kernel's notifications, or dumped if there is none.
    pub fn snapshot(&self) -> Result<ObservedNode, DataplaneError> {
        let target = self.target();
        self.worker
            .run(|s| s.with_observed(None, |_, observed, _| observed.clone()))?
            .map_err(|source| DataplaneError::Observe { target, source })
    }

    /// How the reconciler's memory differs from a full dump taken now, one line per
    /// difference (empty: none, or nothing remembered yet). Sysctls, tunsrc and the nft
    /// table are read afresh by every reconcile and not compared.
    pub fn memory_drift(&self) -> Result<Vec<String>, DataplaneError> {
        let target = self.target();
        self.worker
            .run(move |s| {
                let fresh = observe::dump(&mut s.nl).map(|(node, _)| node)?;
                Ok(s.cached()
                    .map(|c| memory_drift(c, &fresh))
                    .unwrap_or_default())
            })?
            .map_err(|source| DataplaneError::Observe { target, source })
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
    /// reads the kernel with full dumps instead of the remembered state.
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
            if resync {
                session.forget();
            }
            converge(session, &known_nft, Some(desired), target).map(Some)
        })?
    }

    /// Removes everything Lace owns (VRFs, routes, rules, the nft table). Sysctls and
    /// `ip sr tunsrc` stay, and so does the l3mdev rule, which every VRF on the host shares.
    pub fn teardown_all(&self) -> Result<ApplyReport, DataplaneError> {
        let target = self.target();
        let known_nft = Arc::clone(&self.known_nft);
        self.worker
            .run(move |session| converge(session, &known_nft, None, target))?
    }

    /// Gives the pods of `pods` (a plan whose `pod_routes` are just theirs) what the full
    /// plan holds for them on the node: [`diff::attach`], applied. CNI ADD calls it once the
    /// pod's veth exists; the reconcile that follows then writes nothing of it again.
    pub fn attach(&self, pods: DesiredNode) -> Result<ApplyReport, DataplaneError> {
        let target = self.target();
        self.worker.run(move |session| {
            let outcome = session
                .with_observed(None, |nl, observed, full_dump| {
                    let d = diff::attach(&pods, observed)?;
                    let report = ApplyReport::of(&d.ops, d.skipped, full_dump);
                    let (writes, failures) =
                        apply::apply(nl, observed, d.ops, apply::Batching::Pod);
                    Ok((ApplyReport { writes, ..report }, failures))
                })
                .map_err(|source| DataplaneError::Observe {
                    target: target.clone(),
                    source,
                })?;
            let (report, failures) = outcome.map_err(|source| DataplaneError::Diff {
                target: target.clone(),
                source,
            })?;
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
            outcome.map_err(|e| e.into_error(target))
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
            .map_err(|e| e.into_error(target.to_string()))
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
            .map_err(|e| e.into_error(target.to_string()))
    }

    /// Brings `lo` up in the pod's namespace `pod_ns` and reads it (`pod::loopback_up`).
    pub fn loopback_up(&self, pod_ns: &Path) -> Result<PodLinkState, DataplaneError> {
        let target = NetnsTarget::Path(pod_ns.to_owned());
        netns::run_in(&target, pod::loopback_up)?.map_err(|e| e.into_error(target.to_string()))
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

/// One reconcile on the worker: observe (memory or dumps), diff against `desired` (`None`:
/// tear down), apply, settle the memory.
fn converge(
    session: &mut watch::Session,
    known_nft: &Mutex<Option<nft::KnownRuleset>>,
    desired: Option<DesiredNode>,
    target: String,
) -> Result<ApplyReport, DataplaneError> {
    let mut known = known_nft.lock().unwrap_or_else(PoisonError::into_inner);
    let keys: BTreeSet<String> = desired
        .as_ref()
        .map(|d| d.base.sysctls.keys().cloned().collect())
        .unwrap_or_default();
    let outcome = session
        .with_observed(Some(&keys), move |nl, observed, full_dump| {
            let d = diff::diff(desired.as_ref(), observed, known.as_ref())?;
            let nft_tag = nft::tag_after(&d.ops, &observed.nft);
            let report = ApplyReport::of(&d.ops, d.skipped, full_dump);
            let deleted: Vec<watch::Deleted> =
                d.ops.iter().filter_map(watch::Deleted::by).collect();
            let (writes, failures) = apply::apply(nl, observed, d.ops, apply::Batching::Phases);
            // After a failure the table may or may not have changed: forget, and let the next
            // observation decide.
            *known = if failures.is_empty() {
                let desired_nft = desired.as_ref().map(|d| &d.base.nft);
                nft::KnownRuleset::after(known.take(), desired_nft, nft_tag)
            } else {
                None
            };
            // What was applied: of pods, only those whose veth was there to be set up (an ADD
            // in flight sets up the others itself).
            let applied = desired.map(|d| watch::Applied::of(d, observed));
            Ok((ApplyReport { writes, ..report }, deleted, failures, applied))
        })
        .map_err(|source| DataplaneError::Observe {
            target: target.clone(),
            source,
        })?;
    let (report, deleted, failures, plan) = outcome.map_err(|source| DataplaneError::Diff {
        target: target.clone(),
        source,
    })?;
    let applied = failures.is_empty();
    session.settle(deleted, applied, applied.then_some(plan));
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
