//! The dataplane reconciler: observe what Lace owns in a network namespace, [`diff`](mod@diff) it
//! against the planner's [`DesiredNode`], apply the difference — and tear it down.
//!
//! The seam is **state → plan → diff → apply**. [`diff::diff`] is pure (no kernel, unit-tested);
//! [`Reconciler`] is the only code that talks to the kernel: one rtnetlink socket per network
//! namespace, on a dedicated thread that entered it ([`netns`]), plus the `nft` binary (one
//! atomic transaction per change), `/proc/sys` and generic netlink for `ip sr tunsrc`.
//!
//! ## Modules
//! Their imports run one way, along the seam; none imports one that imports it back, and this
//! file only declares and re-exports them:
//! - plain data: `observed` (the kernel's state in Lace's terms: [`ObservedNode`]) and `op`
//!   ([`Op`]: one change);
//! - pure: [`diff`](mod@diff) reads the observed node and the plan and makes the operations,
//!   with its parts for the VRFs' ingress devices, the SRv6-over-IPv4 device and the nft
//!   table; [`watch`]'s drift bookkeeping asks it whether anything Lace applied changed;
//! - kernel: `observe` fills the observed node (rtnetlink dumps; `nft`, `fou` and `seg6` for
//!   the nft tag, the fou ports and `ip sr tunsrc`), [`watch`] keeps it current from the
//!   notifications, `apply` carries out the operations (messages from `msg`; `nft -f`; fou),
//!   `pod` is the CNI's work in a pod's namespace, [`netns`] and [`nl`] are the thread and
//!   the socket everything runs on, `tc` the messages of the pods' qdiscs and filters;
//! - `reconciler`: the [`Reconciler`], which strings them together (observe, diff, apply).
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
//! the nft table's tag are read on every reconcile (each a constant-cost read), and so are
//! the qdiscs and filters of pods' bandwidth (one dump of the namespace's qdiscs, and the
//! filters of each pod veth with an `ingress` qdisc: a cost that grows with the node's links);
//! the nft ruleset last written is remembered too (see below).
//!
//! ## Ownership
//! Lace reads as its own, and only ever changes or deletes:
//! - routes with protocol [`ROUTE_PROTOCOL`] in Lace's tables
//!   ([`plan::VRF_TABLE_BASE`]`..=`[`plan::HOST_ACCESS_TABLE`]) or in the main table (SIDs, locators,
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
//! - a pod's bandwidth ([`plan::shaping`]): links named [`plan::shaping::SHAPER_PREFIX`]`*`
//!   (IFB devices shaping what pods send) and, on pod veths and shapers, the root qdisc with
//!   handle `4c:`; on pod veths, the `ingress` qdisc and its filter of priority 76 (a veth's
//!   other qdiscs and filters are never touched);
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
//! [`plan::VRF_TABLE_BASE`]: crate::plan::VRF_TABLE_BASE
//! [`plan::HOST_ACCESS_TABLE`]: crate::plan::HOST_ACCESS_TABLE
//! [`plan::RULE_PRIORITY_PROBE`]: crate::plan::RULE_PRIORITY_PROBE
//! [`plan::RULE_PRIORITY_L3MDEV`]: crate::plan::RULE_PRIORITY_L3MDEV
//! [`plan::VRF_PREFIX`]: crate::plan::VRF_PREFIX
//! [`POD_LINK_PREFIX`]: crate::plan::POD_LINK_PREFIX
//! [`plan::INGRESS_PREFIX`]: crate::plan::INGRESS_PREFIX
//! [`plan::ingress`]: crate::plan::ingress
//! [`plan::shaping`]: crate::plan::shaping
//! [`plan::shaping::SHAPER_PREFIX`]: crate::plan::shaping::SHAPER_PREFIX
//! [`plan::POD_GATEWAY_V6`]: crate::plan::POD_GATEWAY_V6
//! [`plan::disable_ipv6_key`]: crate::plan::disable_ipv6_key
//! [`Nexthop::Host`]: crate::plan::Nexthop::Host
//! [`underlay::TUNNEL_PREFIX`]: crate::plan::underlay::TUNNEL_PREFIX
//! [`underlay::IPV4_TUNNEL`]: crate::plan::underlay::IPV4_TUNNEL
//! [`underlay::FOU_PORT`]: crate::plan::underlay::FOU_PORT

// Plain data and the pure diff: what the kernel holds, and what to change.
pub mod diff;
mod observed;
mod op;

// The kernel half: reading it, writing to it, and the threads and sockets that do.
mod apply;
mod fou;
pub(crate) mod host;
pub mod linklocal;
mod msg;
pub mod netns;
mod nft;
pub mod nl;
mod observe;
mod pod;
mod rawnl;
mod reconciler;
mod seg6;
mod tc;
pub mod watch;

#[cfg(test)]
mod fixtures;

pub use apply::OpFailure;
pub use diff::{diff, Diff, DiffError, KnownRuleset};
pub use linklocal::{UnderlayQuery, UnderlayRound};
pub use netns::{NetnsError, NetnsTarget};
pub use observe::ObserveError;
pub use observed::{
    FouListener, HostRoute, KernelNexthop, NftState, ObservedLink, ObservedNode, ObservedRule,
    SitLink, ROUTE_PROTOCOL,
};
pub use op::Op;
pub use pod::{gateway, PodInterface, PodLinkState, GATEWAY_V4, GATEWAY_V6};
pub use reconciler::{
    ApplyReport, DataplaneError, Phases, Reconciler, ReconcilerOptions, SAMPLE_OPS,
};
pub use watch::Drift;
