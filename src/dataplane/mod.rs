//! The dataplane reconciler: observe what Lace owns in a network namespace, [`diff`] it
//! against the planner's [`DesiredNode`], apply the difference — and tear it down.
//!
//! The seam is **state → plan → diff → apply**. [`diff::diff`] is pure (no kernel, unit-tested);
//! [`Reconciler`] is the only code that talks to the kernel: one rtnetlink socket per network
//! namespace, on a dedicated thread that entered it ([`netns`]), plus the `nft` binary (one
//! atomic transaction per change), `/proc/sys` and generic netlink for `ip sr tunsrc`.
//!
//! ## Ownership
//! Lace reads as its own, and only ever changes or deletes:
//! - routes with protocol [`ROUTE_PROTOCOL`] in Lace's tables
//!   ([`plan::VRF_TABLE_BASE`]`..=`[`plan::PROBE_TABLE`]) or in the main table (SIDs, locators,
//!   reply routes), deleted with the protocol set so the kernel never matches a foreign route;
//! - FIB rules with a priority in [`plan::RULE_PRIORITY_PROBE`]`..=`[`plan::RULE_PRIORITY_L3MDEV`];
//! - links named [`plan::VRF_PREFIX`]`*` (VRFs). Pod veths (created by the CNI) are only
//!   enslaved to their VRF and given the link-local source of their IPv6 probe route
//!   ([`plan::POD_GATEWAY_V6`]), never created or deleted here;
//! - the sysctls the plan lists (set, never reverted: their previous values are unknown);
//! - the nftables table `inet lace`;
//! - `ip sr tunsrc` (one value per namespace).
//!
//! Everything else is never touched; it is read only to resolve next hops (link names, the
//! uplink holding the underlay address, what the main table routes for [`Nexthop::Host`]).
//!
//! ## Order and failure
//! [`diff::diff`] orders operations so nothing opens or black-holes mid-change: VRFs and pod
//! enslavement, then the pod veths' link-local probe source (enslaving drops it), the nft
//! table (swapped atomically, always before routes that would open a
//! path; its `ct` expressions load conntrack, whose sysctl comes next), sysctls, `ip sr
//! tunsrc`, rules, routes added or replaced, and only then the deletions (routes, rules,
//! VRFs). When a Network is removed, its VRF's routes go after the new ruleset no longer
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
//! ## Observing the nft table
//! The table's comment carries a digest of the ruleset text Lace wrote (`lace-plan <fnv64>`);
//! the table is swapped when the digest differs from the plan's, or the table is missing or
//! has no such comment. It is read with one nfnetlink request, so it costs the same for any
//! table size. A hand
//! edit inside `inet lace` that keeps the comment is not noticed until the plan changes.
//!
//! ## Threads and sockets
//! Each [`Reconciler`] owns one worker thread that entered the namespace with `setns` and one
//! blocking rtnetlink socket on it ([`nl`]). There is no async runtime on that thread: batching
//! (many requests per `send`, ACKs read back per chunk) needs control of the socket that
//! `rtnetlink`'s connection task does not give, and nothing else runs there. The message
//! types are `netlink-packet-route` 0.34's, through `rtnetlink`'s re-exports.
//!
//! [`DesiredNode`]: crate::plan::DesiredNode
//! [`Nexthop::Host`]: crate::plan::Nexthop::Host

mod apply;
pub mod diff;
mod host;
pub mod netns;
pub mod nl;
mod observe;
mod rawnl;
mod seg6;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;

use crate::plan::{self, DesiredNode, RouteKey};

pub use diff::{diff, Diff, DiffError, Op};
pub use netns::{NetnsError, NetnsTarget};
pub use observe::ObserveError;

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
    /// Index of the link's master (VRF), if enslaved.
    pub master: Option<u32>,
    pub up: bool,
}

/// A FIB rule in Lace's priority band.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedRule {
    /// The rule in the planner's terms, when it is one Lace writes.
    pub rule: Option<plan::Rule>,
    /// The kernel's message, to delete it exactly.
    pub raw: rtnetlink::packet_route::rule::RuleMessage,
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
    /// Present, with the plan tag Lace wrote into its comment (None: no or a foreign comment).
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
}

/// How many operations an [`ApplyReport`] names.
pub const SAMPLE_OPS: usize = 32;

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
}

/// Reconciles one network namespace. Holds no memory of earlier plans: every call observes.
#[derive(Debug)]
pub struct Reconciler {
    worker: netns::Worker,
}

impl Reconciler {
    /// Starts the namespace's worker thread and opens its rtnetlink socket.
    pub fn new(target: NetnsTarget) -> Result<Self, DataplaneError> {
        Ok(Self {
            worker: netns::Worker::start(target)?,
        })
    }

    fn target(&self) -> String {
        self.worker.target().to_string()
    }

    /// Reads what Lace owns (and what next hops resolve against). `sysctls` are the keys to
    /// read.
    pub fn observe(&self, sysctls: BTreeSet<String>) -> Result<ObservedNode, DataplaneError> {
        self.worker
            .run(move |nl| observe::observe(nl, &sysctls))?
            .map_err(|source| DataplaneError::Observe {
                target: self.target(),
                source,
            })
    }

    /// Makes the namespace hold exactly `desired` (of what Lace owns).
    pub fn reconcile(&self, desired: &DesiredNode) -> Result<ApplyReport, DataplaneError> {
        self.converge(Some(desired.clone()))
    }

    /// Removes everything Lace owns (VRFs, routes, rules, the nft table). Sysctls and
    /// `ip sr tunsrc` stay, and so does the l3mdev rule, which every VRF on the host shares.
    pub fn teardown_all(&self) -> Result<ApplyReport, DataplaneError> {
        self.converge(None)
    }

    fn converge(&self, desired: Option<DesiredNode>) -> Result<ApplyReport, DataplaneError> {
        let target = self.target();
        let keys: BTreeSet<String> = desired
            .as_ref()
            .map(|d| d.base.sysctls.keys().cloned().collect())
            .unwrap_or_default();
        let result = self.worker.run(move |nl| {
            let observed =
                observe::observe(nl, &keys).map_err(|source| DataplaneError::Observe {
                    target: target.clone(),
                    source,
                })?;
            let d =
                diff::diff(desired.as_ref(), &observed).map_err(|source| DataplaneError::Diff {
                    target: target.clone(),
                    source,
                })?;
            let ops = d.ops.len();
            let sample = d
                .ops
                .iter()
                .take(SAMPLE_OPS)
                .map(|o| o.to_string())
                .collect();
            let (writes, failures) = apply::apply(nl, &observed, d.ops);
            if failures.is_empty() {
                Ok(ApplyReport {
                    ops,
                    writes,
                    skipped: d.skipped,
                    sample,
                })
            } else {
                Err(DataplaneError::Apply {
                    target,
                    writes,
                    failures,
                })
            }
        })?;
        result
    }
}
