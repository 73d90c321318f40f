//! The reconciler's memory of the kernel: what the last full dump showed, kept current by
//! rtnetlink's change notifications instead of re-dumping on every reconcile.
//!
//! A [`Session`] (one per namespace, on its worker thread) subscribes to the notifications of
//! links, addresses, routes and rules *before* it dumps, so no change falls between the dump
//! and the stream; notifications about changes the dump already shows replay to the same
//! state, in order. It takes in what was queued before each reconcile
//! ([`Session::with_observed`]), after the apply ([`Session::settle`]: the writes' own
//! notifications, which the request socket drains between batch chunks so a large apply
//! cannot overrun it), and while idle ([`Session::idle`]). Everything the cache knows comes
//! from the kernel's own messages, so what it holds for a route Lace wrote is what the kernel
//! made of it (flags, metrics), exactly as a dump would show it. The cache is thrown away and
//! the kernel dumped again whenever the stream cannot be trusted to be complete: the
//! notification socket overran (`ENOBUFS`), a message did not decode or was not one the
//! groups carry, a link was renamed (routes name their devices) or re-appeared under another
//! index, an apply failed, or nothing was cached yet.
//!
//! ## What the kernel changes without telling
//! IPv4 flushes routes silently: those through a link that goes down or away, all of a
//! link's routes when its last IPv4 address goes, and routes whose preferred source address
//! goes (IPv6 instead drops the source from them, silently too). The cache follows the first
//! two exactly as the kernel does (the routes are gone, in both families: IPv6 reports the
//! same deletions). For the third, which routes the kernel touches depends on tables and
//! devices, so the routes using the address as source are marked [`KernelNexthop::Unknown`]:
//! the next reconcile rewrites them if planned (replace) or deletes them (a missing route
//! is the idempotent case), whatever the kernel did. IPv6 addresses are notified when
//! duplicate address detection completes, so neither the dump nor the cache counts an
//! address still under detection (`observe::usable`).
//!
//! A delete of something the cache held but the kernel did not (no notification follows)
//! is settled from the operation itself: after a successful apply, what was deleted is gone.
//!
//! ## Limits
//! Routes are keyed like the dump's ([`RouteKey`]: table and destination), so two kernel
//! routes of Lace's protocol to the same destination in one table (a hand-added copy with
//! another metric) are one entry; the host's main-table routes are keyed by destination,
//! TOS, priority and link, so `ip route append` copies through one link are one entry too.
//! A delete Lace issued that found nothing, racing with someone adding that very route, is
//! forgotten after the addition's notification: that route is then left alone until the
//! next full dump.
//!
//! [`RouteKey`]: crate::plan::RouteKey

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REPLACE};
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::RouteNetlinkMessage;

use super::nl::{Nl, NlError};
use super::observe::{self, addr_entries, classify_route, classify_rule, parse_link, HostRoutes};
use super::{KernelNexthop, ObserveError, ObservedNode, Op};
use crate::plan::{DesiredNode, RouteKey};

/// Receive buffer of the notification socket by default: room for some ten thousand
/// notifications between two drains.
pub const NOTIFICATION_BUFFER: usize = 8 << 20;

/// How long the worker waits for a job before draining notifications anyway, so a busy host
/// does not overrun the socket between two reconciles.
pub const IDLE_DRAIN: Duration = Duration::from_secs(1);

/// One namespace's rtnetlink connection and what the reconciler knows of the namespace.
pub struct Session {
    pub nl: Nl,
    cache: Option<Cache>,
    rx_buf: usize,
    applied: Applied,
    /// Notifications were taken in (or the kernel dumped) by a job that does not diff the
    /// whole plan (an attach, a snapshot, a DEL): the next idle checks for drift.
    unchecked: bool,
    on_drift: DriftSink,
}

/// What Lace last applied: the last plan reconciled, and the pods attached since (of pods,
/// only those whose host veth exists). Notifications that make the kernel differ from it
/// are drift; changes to anything else, and Lace's own writes echoing back, are not.
#[derive(Debug, Default)]
pub struct Applied(Option<DesiredNode>);

impl Applied {
    /// What a reconcile of `plan` against `observed` applies: the plan, but of its pods only
    /// those whose host veth is in `observed` (the others are left to their ADD).
    pub fn of(mut plan: DesiredNode, observed: &ObservedNode) -> DesiredNode {
        plan.pod_routes
            .retain(|_, nh| nexthop_link(nh).is_none_or(|dev| observed.links.contains_key(dev)));
        plan
    }

    /// After a reconcile: `plan` (`None` after a teardown; see [`Applied::of`]) is what Lace
    /// applied.
    pub fn reconciled(&mut self, plan: Option<DesiredNode>) {
        self.0 = plan;
    }

    /// After an attach: the pods of `pods` are part of what Lace applied (their veths exist).
    pub fn attached(&mut self, pods: &DesiredNode) {
        if let Some(plan) = &mut self.0 {
            plan.pod_routes
                .extend(pods.pod_routes.iter().map(|(k, nh)| (*k, nh.clone())));
        }
    }

    /// Whether anything was applied (before the first reconcile, nothing can drift).
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    /// Pods whose host veth is gone (deleted by CNI DEL) are no longer part of what Lace
    /// applied: if a link of that name comes back (a retried ADD), it is the ADD's to set up.
    fn prune(&mut self, node: &ObservedNode) {
        if let Some(plan) = &mut self.0 {
            plan.pod_routes
                .retain(|_, nh| nexthop_link(nh).is_none_or(|dev| node.links.contains_key(dev)));
        }
    }

    /// How `node` (the kernel as notified) differs from what Lace applied, if it does.
    pub fn drift(&mut self, node: &ObservedNode) -> Option<Drift> {
        self.prune(node);
        match super::diff::drift(self.0.as_ref()?, node) {
            Ok(ops) => ops.first().map(|first| Drift {
                ops: ops.len(),
                summary: first.to_string(),
            }),
            Err(e) => Some(Drift {
                ops: 0,
                summary: e.to_string(),
            }),
        }
    }
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

/// Something Lace owns changed without Lace (seen in the kernel's notifications): what a
/// reconcile would do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// How many operations a reconcile would issue; 0 when the notifications themselves
    /// could not be followed (then nothing is known, and the reconcile dumps).
    pub ops: usize,
    /// The first of those operations, or why the notifications could not be followed.
    pub summary: String,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.ops == 0 {
            write!(f, "{}", self.summary)
        } else {
            write!(
                f,
                "{} operation(s) would restore it, first: {}",
                self.ops, self.summary
            )
        }
    }
}

/// Called (on the namespace's worker thread) with each drift found; must not block.
pub type DriftHandler = Box<dyn Fn(Drift) + Send + Sync>;

/// Where drift goes: set once the agent listens ([`super::Reconciler::on_drift`]).
pub type DriftSink = std::sync::Arc<std::sync::Mutex<Option<DriftHandler>>>;

/// Something a successful apply deleted (or found already gone).
#[derive(Debug)]
pub enum Deleted {
    Route(crate::plan::RouteKey),
    Rule(Box<netlink_packet_route::rule::RuleMessage>),
    Link(String),
}

impl Deleted {
    /// What `op` deletes for good (a link deleted to be re-created is not).
    pub fn by(op: &Op) -> Option<Self> {
        match op {
            Op::DelRoute { key, .. } => Some(Self::Route(*key)),
            Op::DelRule(r) => Some(Self::Rule(Box::new(r.raw.clone()))),
            Op::DelLink { name } => Some(Self::Link(name.clone())),
            _ => None,
        }
    }
}

impl Session {
    /// A session over `nl`; the notification socket gets `rx_buf` bytes of receive buffer,
    /// drift is reported to `on_drift`.
    pub fn new(nl: Nl, rx_buf: usize, on_drift: DriftSink) -> Self {
        Self {
            nl,
            cache: None,
            rx_buf,
            applied: Applied::default(),
            unchecked: false,
            on_drift,
        }
    }

    /// Drops the cached state: the next observation dumps (a periodic resync).
    pub fn forget(&mut self) {
        self.cache = None;
    }

    /// Runs `f` with the request socket and the namespace as it is now: the cache brought up
    /// to date with what the kernel notified, or a full dump when there is no trustworthy
    /// cache (`f`'s third argument is `true` then). Sysctls (`sysctls` are the keys),
    /// `ip sr tunsrc` and the nft table are read each time, unless `sysctls` is `None` (a
    /// job that needs only what rtnetlink shows).
    pub fn with_observed<R>(
        &mut self,
        sysctls: Option<&BTreeSet<String>>,
        f: impl FnOnce(&mut Nl, &ObservedNode, bool) -> R,
    ) -> Result<R, ObserveError> {
        self.nl.subscribe(self.rx_buf)?;
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
        // A reconcile diffs everything it observes; any other job leaves that to idle.
        self.unchecked = sysctls.is_none() && (self.unchecked || stale.is_some());
        let cache = match (stale, self.cache.take()) {
            (None, Some(cache)) => self.cache.insert(cache),
            (why, had) => {
                match (why, had) {
                    (Some(why), Some(_)) => tracing::warn!(
                        reason = %why,
                        "dataplane: the kernel's notifications cannot be trusted; re-reading it with full dumps"
                    ),
                    _ => tracing::debug!("dataplane: reading the kernel with full dumps"),
                }
                if let Some(n) = self.nl.notifications() {
                    n.discard();
                }
                let (node, host) = observe::dump(&mut self.nl)?;
                self.cache.insert(Cache::new(node, host))
            }
        };
        if let Some(sysctls) = sysctls {
            observe::observe_host(&mut cache.node, sysctls)?;
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
        let Some(cache) = &mut self.cache else { return };
        let mut notified = false;
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
                    self.check_drift();
                }
            }
            None => self.unchecked |= notified,
        }
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
            None => self.check_drift(),
            Some(why) => {
                tracing::warn!(reason = %why, "dataplane: the kernel's notifications cannot be trusted; the next reconcile dumps");
                self.cache = None;
                if self.applied.is_some() {
                    self.report(Drift {
                        ops: 0,
                        summary: format!("the kernel's notifications could not be followed: {why}"),
                    });
                }
            }
        }
    }

    /// The cached state, if any (without sysctls, tunsrc or nft read again).
    pub fn cached(&self) -> Option<&ObservedNode> {
        self.cache.as_ref().map(|c| &c.node)
    }

    /// Reports drift if the cached kernel state differs from what Lace applied.
    fn check_drift(&mut self) {
        self.unchecked = false;
        let Some(cache) = &self.cache else { return };
        let Some(drift) = self.applied.drift(&cache.node) else {
            return;
        };
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

/// The link a planned next hop names, if any.
fn nexthop_link(nh: &crate::plan::Nexthop) -> Option<&str> {
    match nh {
        crate::plan::Nexthop::Dev(d) | crate::plan::Nexthop::DevSrc { dev: d, .. } => Some(d),
        _ => None,
    }
}

/// Opens a session's socket, for [`super::netns::Worker::start`].
pub fn open(
    rx_buf: usize,
    on_drift: DriftSink,
) -> impl FnOnce() -> Result<Session, NlError> + Send + 'static {
    move || Ok(Session::new(Nl::open()?, rx_buf, on_drift))
}

/// The cache proper: an [`ObservedNode`] and what updating it needs.
#[derive(Debug)]
struct Cache {
    node: ObservedNode,
    /// Link index → name: notifications name devices by index.
    names: BTreeMap<u32, String>,
    /// The host's main-table routes by identity; `node.host_routes` lists them.
    host: HostRoutes,
    /// Not handed out yet since the dump that filled it.
    fresh: bool,
}

impl Cache {
    fn new(node: ObservedNode, host: HostRoutes) -> Self {
        let names = node
            .links
            .iter()
            .map(|(n, l)| (l.index, n.clone()))
            .collect();
        Self {
            node,
            names,
            host,
            fresh: true,
        }
    }

    /// Applies notifications in order; an error says why the stream cannot be followed.
    fn apply_stream<E: std::fmt::Display>(
        &mut self,
        mut messages: impl Iterator<Item = Result<NetlinkMessage<RouteNetlinkMessage>, E>>,
    ) -> Result<(), String> {
        let mut host_changed = false;
        let result =
            messages.try_for_each(|m| self.apply(m.map_err(|e| e.to_string())?, &mut host_changed));
        if host_changed {
            self.node.host_routes = self.host.values().cloned().collect();
        }
        result
    }

    fn apply(
        &mut self,
        msg: NetlinkMessage<RouteNetlinkMessage>,
        host_changed: &mut bool,
    ) -> Result<(), String> {
        let kind = msg.header.message_type;
        let replace = msg.header.flags & NLM_F_REPLACE != 0;
        let NetlinkPayload::InnerMessage(m) = msg.payload else {
            return Err(format!("unexpected netlink message of type {kind}"));
        };
        match m {
            RouteNetlinkMessage::NewLink(l) => return self.new_link(&l, host_changed),
            RouteNetlinkMessage::DelLink(l) => self.del_link(l.header.index, host_changed),
            RouteNetlinkMessage::NewAddress(a) => {
                let usable = observe::usable(&a);
                for entry in addr_entries(&a) {
                    if !usable {
                        // Detection restarted (or failed): not an address to use now.
                        self.node.addrs.retain(|e| *e != entry);
                    } else if !self.node.addrs.contains(&entry) {
                        self.node.addrs.push(entry);
                    }
                }
            }
            RouteNetlinkMessage::DelAddress(a) => {
                for (ip, index) in addr_entries(&a).collect::<Vec<_>>() {
                    self.del_addr(ip, index, host_changed);
                }
            }
            RouteNetlinkMessage::NewRoute(r) => match classify_route(&r, &self.names) {
                observe::Route::Lace(key, nh) => {
                    self.node.routes.insert(key, nh);
                }
                observe::Route::Host(id, h) => {
                    if replace {
                        // Replaced whatever it was, through any link, Lace's route too.
                        let (dst, tos, priority, _) = id;
                        self.host
                            .retain(|&(d, t, p, _), _| (d, t, p) != (dst, tos, priority));
                        self.node.routes.remove(&RouteKey {
                            table: crate::plan::MAIN_TABLE,
                            dst,
                        });
                    }
                    self.host.insert(id, h);
                    *host_changed = true;
                }
                // Another tool replaced what sat at that key, perhaps Lace's route (the kernel
                // notifies only the new one). Forgotten: a planned route is written again.
                observe::Route::Foreign(key) if replace => {
                    self.node.routes.remove(&key);
                }
                observe::Route::Foreign(_) | observe::Route::Other => {}
            },
            RouteNetlinkMessage::DelRoute(r) => match classify_route(&r, &self.names) {
                observe::Route::Lace(key, _) => {
                    self.node.routes.remove(&key);
                }
                observe::Route::Host(id, _) => {
                    *host_changed |= self.host.remove(&id).is_some();
                }
                observe::Route::Foreign(_) | observe::Route::Other => {}
            },
            RouteNetlinkMessage::NewRule(r) => {
                if let Some(rule) = classify_rule(r) {
                    if !self.node.rules.iter().any(|x| x.raw == rule.raw) {
                        self.node.rules.push(rule);
                    }
                }
            }
            RouteNetlinkMessage::DelRule(r) => {
                if let Some(rule) = classify_rule(r) {
                    self.node.rules.retain(|x| x.raw != rule.raw);
                }
            }
            _ => return Err(format!("unexpected notification of type {kind}")),
        }
        Ok(())
    }

    fn new_link(&mut self, l: &LinkMessage, host_changed: &mut bool) -> Result<(), String> {
        let Some((name, link)) = parse_link(l) else {
            return Err(format!("link {} notified without a name", l.header.index));
        };
        if let Some(old) = self.names.get(&link.index) {
            if *old != name {
                return Err(format!("link {old} was renamed {name}"));
            }
        }
        let was_up = match self.node.links.get(&name) {
            Some(old) if old.index != link.index => {
                return Err(format!(
                    "link {name} has index {} but was {} with no deletion notified",
                    link.index, old.index
                ))
            }
            Some(old) => old.up,
            None => false,
        };
        let down = was_up && !link.up;
        self.names.insert(link.index, name.clone());
        self.node.links.insert(name.clone(), link);
        if down {
            self.drop_routes_via(&name, false, host_changed);
        }
        Ok(())
    }

    fn del_link(&mut self, index: u32, host_changed: &mut bool) {
        let Some(name) = self.names.remove(&index) else {
            return;
        };
        self.node.links.remove(&name);
        self.node.addrs.retain(|(_, i)| *i != index);
        self.drop_routes_via(&name, false, host_changed);
    }

    fn del_addr(&mut self, ip: IpAddr, index: u32, host_changed: &mut bool) {
        self.node.addrs.retain(|e| *e != (ip, index));
        if ip.is_ipv4()
            && !self
                .node
                .addrs
                .iter()
                .any(|(a, i)| *i == index && a.is_ipv4())
        {
            if let Some(name) = self.names.get(&index).cloned() {
                self.drop_routes_via(&name, true, host_changed);
            }
        }
        // IPv6 drops the source from the routes through the address's own link only; IPv4
        // from routes in tables that depend on the link's VRF: taken as all of them.
        let dev = self.names.get(&index).cloned();
        for nh in self.node.routes.values_mut() {
            let hit = match nh {
                KernelNexthop::DevSrc { src, dev: via } if *src == ip => {
                    ip.is_ipv4() || dev.as_deref() == Some(via.as_str())
                }
                _ => false,
            };
            if hit {
                *nh = KernelNexthop::Unknown(format!("{nh}, whose source address went away"));
            }
        }
    }

    /// What the kernel does to the routes through link `dev` when it goes down or away (or,
    /// `v4_only`, loses its last IPv4 address): deletes them.
    fn drop_routes_via(&mut self, dev: &str, v4_only: bool, host_changed: &mut bool) {
        let hit = |dst: &ipnet::IpNet, via: Option<&str>| {
            via == Some(dev) && (!v4_only || matches!(dst, ipnet::IpNet::V4(_)))
        };
        self.node
            .routes
            .retain(|k, nh| !hit(&k.dst, nexthop_dev(nh)));
        let before = self.host.len();
        self.host.retain(|_, h| !hit(&h.dst, h.dev.as_deref()));
        *host_changed |= self.host.len() != before;
    }

    fn forget(&mut self, d: Deleted) {
        match d {
            Deleted::Route(key) => {
                self.node.routes.remove(&key);
            }
            Deleted::Rule(raw) => self.node.rules.retain(|r| r.raw != *raw),
            Deleted::Link(name) => {
                if let Some(l) = self.node.links.get(&name) {
                    let index = l.index;
                    let mut host_changed = false;
                    self.del_link(index, &mut host_changed);
                    if host_changed {
                        self.node.host_routes = self.host.values().cloned().collect();
                    }
                }
            }
        }
    }
}

/// The link a next hop goes out of, if it names one.
fn nexthop_dev(nh: &KernelNexthop) -> Option<&str> {
    match nh {
        KernelNexthop::Dev(dev)
        | KernelNexthop::DevSrc { dev, .. }
        | KernelNexthop::Via { dev, .. }
        | KernelNexthop::Seg6Encap { dev, .. }
        | KernelNexthop::Seg6LocalDt46 { dev, .. } => Some(dev),
        KernelNexthop::Unreachable | KernelNexthop::Unknown(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use ipnet::IpNet;
    use netlink_packet_core::{DoneMessage, NetlinkHeader};
    use netlink_packet_route::address::{AddressAttribute, AddressMessage};
    use netlink_packet_route::link::{
        InfoData, InfoVrf, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
    };
    use netlink_packet_route::neighbour::NeighbourMessage;
    use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
    use netlink_packet_route::rule::{RuleAttribute, RuleMessage};
    use netlink_packet_route::AddressFamily;

    use super::*;
    use crate::dataplane::{HostRoute, NftState};
    use crate::plan::{RouteKey, MAIN_TABLE};

    const VRF_TABLE: u32 = 1_000_001;
    /// Links of the test node: (name, index, VRF table).
    const LINKS: [(&str, u32, Option<u32>); 4] = [
        ("lo", 1, None),
        ("eth0", 2, None),
        ("lp-a", 4, None),
        ("lv-a", 10, Some(VRF_TABLE)),
    ];

    impl Cache {
        fn apply_all(
            &mut self,
            messages: Vec<NetlinkMessage<RouteNetlinkMessage>>,
        ) -> Result<(), String> {
            self.apply_stream(messages.into_iter().map(Ok::<_, String>))
        }
    }

    fn msg(m: RouteNetlinkMessage) -> NetlinkMessage<RouteNetlinkMessage> {
        let mut n = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(m));
        n.finalize();
        n
    }

    fn link_msg(name: &str, index: u32, up: bool) -> LinkMessage {
        let mut l = LinkMessage::default();
        l.header.index = index;
        if up {
            l.header.flags = LinkFlags::Up;
        }
        l.attributes.push(LinkAttribute::IfName(name.into()));
        if let Some((_, _, Some(t))) = LINKS.iter().find(|(n, ..)| *n == name) {
            l.attributes
                .push(LinkAttribute::LinkInfo(vec![LinkInfo::Data(
                    InfoData::Vrf(vec![InfoVrf::TableId(*t)]),
                )]));
        }
        l
    }

    fn addr_msg(ip: IpAddr, index: u32) -> AddressMessage {
        let mut a = AddressMessage::default();
        a.header.index = index;
        a.header.family = match ip {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        a.attributes.push(AddressAttribute::Address(ip));
        a
    }

    fn index_of(name: &str) -> Option<u32> {
        LINKS.iter().find(|(n, ..)| *n == name).map(|(_, i, _)| *i)
    }

    /// A route as Lace writes it (what the kernel notifies has the same meaning).
    fn lace_route(key: RouteKey, nh: &KernelNexthop) -> RouteMessage {
        crate::dataplane::msg::route(&key, Some(nh), &index_of).unwrap()
    }

    /// `default via <gw> dev eth0 metric <metric>` in the main table, not Lace's.
    fn host_route(gw: [u8; 4], metric: u32) -> RouteMessage {
        let mut r = RouteMessage::default();
        r.header.address_family = AddressFamily::Inet;
        r.header.table = 254;
        r.header.kind = netlink_packet_route::route::RouteType::Unicast;
        r.attributes.push(RouteAttribute::Table(MAIN_TABLE));
        r.attributes
            .push(RouteAttribute::Gateway(RouteAddress::from(IpAddr::from(
                gw,
            ))));
        r.attributes.push(RouteAttribute::Oif(2));
        r.attributes.push(RouteAttribute::Priority(metric));
        r
    }

    fn key(table: u32, dst: &str) -> RouteKey {
        RouteKey {
            table,
            dst: dst.parse::<IpNet>().unwrap(),
        }
    }

    fn v4(s: &str) -> IpAddr {
        IpAddr::V4(s.parse::<Ipv4Addr>().unwrap())
    }

    /// The routes of the test node: one through each link, and one through none.
    fn routes() -> Vec<(RouteKey, KernelNexthop)> {
        vec![
            (
                key(VRF_TABLE, "10.1.1.10/32"),
                KernelNexthop::Dev("lp-a".into()),
            ),
            (
                key(VRF_TABLE, "10.1.2.0/24"),
                KernelNexthop::Seg6Encap {
                    segs: "2001:db8:100::2:1:0".parse().unwrap(),
                    dev: "eth0".into(),
                },
            ),
            (
                key(MAIN_TABLE, "2001:db8:100::1:1:0/128"),
                KernelNexthop::Seg6LocalDt46 {
                    vrf_table: VRF_TABLE,
                    dev: "lv-a".into(),
                },
            ),
            (
                key(MAIN_TABLE, "2001:db8:ff::/64"),
                KernelNexthop::Via {
                    via: "2001:db8:ff::9".parse().unwrap(),
                    dev: "eth0".into(),
                },
            ),
            (
                key(crate::plan::PROBE_TABLE, "10.1.1.10/32"),
                KernelNexthop::DevSrc {
                    dev: "lp-a".into(),
                    src: v4("192.0.2.1"),
                },
            ),
            (key(VRF_TABLE, "0.0.0.0/0"), KernelNexthop::Unreachable),
        ]
    }

    /// The test node as a dump would find it, built by replaying notifications into an
    /// empty cache.
    fn node() -> Cache {
        let mut c = Cache::new(
            ObservedNode {
                links: BTreeMap::new(),
                addrs: vec![],
                routes: BTreeMap::new(),
                host_routes: vec![],
                rules: vec![],
                sysctls: BTreeMap::new(),
                tunsrc: None,
                nft: NftState::Absent,
                fou: None,
            },
            HostRoutes::new(),
        );
        let mut m: Vec<_> = LINKS
            .iter()
            .map(|(n, i, _)| msg(RouteNetlinkMessage::NewLink(link_msg(n, *i, true))))
            .collect();
        for (ip, i) in [
            (v4("10.9.0.1"), 2),
            ("2001:db8:ff::1".parse().unwrap(), 2),
            (v4("192.0.2.1"), 1),
        ] {
            m.push(msg(RouteNetlinkMessage::NewAddress(addr_msg(ip, i))));
        }
        for (k, nh) in routes() {
            m.push(msg(RouteNetlinkMessage::NewRoute(lace_route(k, &nh))));
        }
        m.push(msg(RouteNetlinkMessage::NewRoute(host_route(
            [10, 9, 0, 254],
            0,
        ))));
        c.apply_all(m).unwrap();
        c
    }

    fn has(c: &Cache, k: &str) -> bool {
        c.node.routes.keys().any(|x| x.dst.to_string() == k)
    }

    #[test]
    fn replayed_notifications_build_what_lace_wrote() {
        let c = node();
        assert_eq!(
            c.node.routes,
            routes().into_iter().collect::<BTreeMap<_, _>>(),
            "every route Lace writes reads back as the same next hop"
        );
        assert_eq!(c.node.links["lv-a"].vrf_table, Some(VRF_TABLE));
        assert_eq!(c.node.link_name(4), Some("lp-a"));
        assert_eq!(
            c.node.host_routes,
            vec![HostRoute {
                dst: "0.0.0.0/0".parse().unwrap(),
                gateway: Some(v4("10.9.0.254")),
                dev: Some("eth0".into())
            }]
        );
    }

    #[test]
    fn changes_apply_in_order() {
        let mut c = node();
        let k = key(VRF_TABLE, "10.7.0.0/16");
        let a = KernelNexthop::Dev("lp-a".into());
        let b = KernelNexthop::Dev("eth0".into());
        let new = |nh| msg(RouteNetlinkMessage::NewRoute(lace_route(k, nh)));
        let del = |nh| msg(RouteNetlinkMessage::DelRoute(lace_route(k, nh)));
        c.apply_all(vec![new(&a), del(&a)]).unwrap();
        assert!(!c.node.routes.contains_key(&k), "added then deleted");
        c.apply_all(vec![del(&a), new(&a), new(&b)]).unwrap();
        assert_eq!(c.node.routes[&k], b, "the later replace wins");
    }

    #[test]
    fn a_deleted_link_takes_its_routes_and_addresses_and_nothing_else() {
        let mut c = node();
        c.apply_all(vec![msg(RouteNetlinkMessage::DelLink(link_msg(
            "lp-a", 4, false,
        )))])
        .unwrap();
        assert!(!c.node.links.contains_key("lp-a"));
        assert!(
            !has(&c, "10.1.1.10/32"),
            "both routes through lp-a are gone"
        );
        assert_eq!(c.node.routes.len(), routes().len() - 2);
        // The VRF goes too: its seg6local route, not the VRF table's routes via other links.
        c.apply_all(vec![msg(RouteNetlinkMessage::DelLink(link_msg(
            "lv-a", 10, true,
        )))])
        .unwrap();
        assert!(!has(&c, "2001:db8:100::1:1:0/128"));
        assert!(has(&c, "10.1.2.0/24") && has(&c, "0.0.0.0/0"));
        c.apply_all(vec![msg(RouteNetlinkMessage::DelLink(link_msg(
            "eth0", 2, true,
        )))])
        .unwrap();
        assert!(
            !c.node.addrs.iter().any(|(_, i)| *i == 2),
            "eth0's addresses went with it"
        );
        assert!(
            c.node.host_routes.is_empty(),
            "the host's default via eth0 too"
        );
        assert_eq!(
            c.node.routes.keys().collect::<Vec<_>>(),
            vec![&key(VRF_TABLE, "0.0.0.0/0")],
            "only the unreachable route is through no link"
        );
    }

    #[test]
    fn a_link_going_down_takes_its_routes_and_coming_up_brings_none_back() {
        let mut c = node();
        let down = msg(RouteNetlinkMessage::NewLink(link_msg("eth0", 2, false)));
        let up = msg(RouteNetlinkMessage::NewLink(link_msg("eth0", 2, true)));
        c.apply_all(vec![down, up]).unwrap();
        assert!(c.node.links["eth0"].up);
        assert!(!has(&c, "10.1.2.0/24") && !has(&c, "2001:db8:ff::/64"));
        assert!(c.node.host_routes.is_empty());
        assert!(has(&c, "10.1.1.10/32"), "lp-a's routes stay");
        // A link notified again while up (e.g. a new master) keeps its routes.
        let mut c = node();
        c.apply_all(vec![msg(RouteNetlinkMessage::NewLink(link_msg(
            "lp-a", 4, true,
        )))])
        .unwrap();
        assert_eq!(c.node.routes.len(), routes().len());
    }

    #[test]
    fn the_last_ipv4_address_of_a_link_takes_its_ipv4_routes() {
        let mut c = node();
        let add = msg(RouteNetlinkMessage::NewAddress(addr_msg(v4("10.9.0.2"), 2)));
        let del = |ip| msg(RouteNetlinkMessage::DelAddress(addr_msg(v4(ip), 2)));
        c.apply_all(vec![add, del("10.9.0.1")]).unwrap();
        assert_eq!(
            c.node.routes.len(),
            routes().len(),
            "eth0 still has 10.9.0.2"
        );
        c.apply_all(vec![del("10.9.0.2")]).unwrap();
        assert!(!has(&c, "10.1.2.0/24"), "IPv4 via eth0 gone");
        assert!(c.node.host_routes.is_empty());
        assert!(has(&c, "2001:db8:ff::/64"), "IPv6 via eth0 stays");
    }

    #[test]
    fn a_source_address_going_away_marks_its_routes_for_rewriting() {
        let mut c = node();
        c.apply_all(vec![msg(RouteNetlinkMessage::DelAddress(addr_msg(
            v4("192.0.2.1"),
            1,
        )))])
        .unwrap();
        let k = key(crate::plan::PROBE_TABLE, "10.1.1.10/32");
        assert!(
            matches!(&c.node.routes[&k], KernelNexthop::Unknown(s) if s.contains("192.0.2.1")),
            "{:?}",
            c.node.routes[&k]
        );
        assert_eq!(
            c.node
                .routes
                .values()
                .filter(|nh| matches!(nh, KernelNexthop::Unknown(_)))
                .count(),
            1
        );
    }

    #[test]
    fn host_routes_are_replaced_by_identity() {
        let mut c = node();
        let gw = |n: &Cache| {
            let mut g: Vec<_> = n.node.host_routes.iter().map(|h| h.gateway).collect();
            g.sort();
            g
        };
        c.apply_all(vec![
            msg(RouteNetlinkMessage::NewRoute(host_route(
                [10, 9, 0, 253],
                0,
            ))),
            msg(RouteNetlinkMessage::NewRoute(host_route(
                [10, 9, 0, 252],
                100,
            ))),
        ])
        .unwrap();
        assert_eq!(
            gw(&c),
            [Some(v4("10.9.0.252")), Some(v4("10.9.0.253"))],
            "the first replaced, the second added"
        );
        c.apply_all(vec![msg(RouteNetlinkMessage::DelRoute(host_route(
            [10, 9, 0, 253],
            0,
        )))])
        .unwrap();
        assert_eq!(gw(&c), [Some(v4("10.9.0.252"))]);
    }

    #[test]
    fn one_prefix_through_several_links_is_several_host_routes_until_replaced() {
        let mut c = node();
        let via = |oif: u32| {
            let mut r = host_route([10, 9, 0, 254], 0);
            r.attributes
                .retain(|a| !matches!(a, RouteAttribute::Oif(_)));
            r.attributes.push(RouteAttribute::Oif(oif));
            r
        };
        let devs = |c: &Cache| {
            let mut d: Vec<_> = c.node.host_routes.iter().map(|h| h.dev.clone()).collect();
            d.sort();
            d
        };
        c.apply_all(vec![msg(RouteNetlinkMessage::NewRoute(via(4)))])
            .unwrap();
        assert_eq!(devs(&c), [Some("eth0".into()), Some("lp-a".into())]);
        c.apply_all(vec![msg(RouteNetlinkMessage::DelRoute(via(4)))])
            .unwrap();
        assert_eq!(
            devs(&c),
            [Some("eth0".to_string())],
            "the other link's stays"
        );
        let mut replace = msg(RouteNetlinkMessage::NewRoute(via(4)));
        replace.header.flags |= NLM_F_REPLACE;
        c.apply_all(vec![replace]).unwrap();
        assert_eq!(
            devs(&c),
            [Some("lp-a".to_string())],
            "replaced, whatever its link"
        );
    }

    #[test]
    fn addresses_under_duplicate_detection_are_not_usable_yet() {
        use netlink_packet_route::address::AddressFlags;
        let mut c = node();
        let ip: IpAddr = "2001:db8:ff::5".parse().unwrap();
        let mut tentative = addr_msg(ip, 2);
        tentative
            .attributes
            .push(AddressAttribute::Flags(AddressFlags::Tentative));
        c.apply_all(vec![msg(RouteNetlinkMessage::NewAddress(
            tentative.clone(),
        ))])
        .unwrap();
        assert!(!c.node.addrs.contains(&(ip, 2)));
        c.apply_all(vec![msg(RouteNetlinkMessage::NewAddress(addr_msg(ip, 2)))])
            .unwrap();
        assert!(c.node.addrs.contains(&(ip, 2)), "detection completed");
        c.apply_all(vec![msg(RouteNetlinkMessage::NewAddress(tentative))])
            .unwrap();
        assert!(!c.node.addrs.contains(&(ip, 2)), "detection restarted");
    }

    #[test]
    fn rules_follow_and_multicast_rules_are_not_lace_s() {
        let mut c = node();
        let rule = |family| {
            let mut r = RuleMessage::default();
            r.header.family = family;
            r.attributes.push(RuleAttribute::Priority(1000));
            r.attributes.push(RuleAttribute::L3MDev(true));
            r
        };
        c.apply_all(vec![
            msg(RouteNetlinkMessage::NewRule(rule(AddressFamily::Inet))),
            msg(RouteNetlinkMessage::NewRule(rule(AddressFamily::Other(
                128,
            )))),
            msg(RouteNetlinkMessage::NewRule(rule(AddressFamily::Inet))),
        ])
        .unwrap();
        assert_eq!(c.node.rules.len(), 1, "{:?}", c.node.rules);
        c.apply_all(vec![msg(RouteNetlinkMessage::DelRule(rule(
            AddressFamily::Inet,
        )))])
        .unwrap();
        assert!(c.node.rules.is_empty());
    }

    #[test]
    fn renames_and_unexpected_messages_make_the_stream_untrusted() {
        let mut c = node();
        let err = c
            .apply_all(vec![msg(RouteNetlinkMessage::NewLink(link_msg(
                "lp-b", 4, true,
            )))])
            .unwrap_err();
        assert!(err.contains("lp-a was renamed lp-b"), "{err}");
        let err = c
            .apply_all(vec![msg(RouteNetlinkMessage::NewLink(link_msg(
                "lp-a", 5, true,
            )))])
            .unwrap_err();
        assert!(err.contains("lp-a has index 5"), "{err}");
        let err = c
            .apply_all(vec![msg(RouteNetlinkMessage::NewNeighbour(
                NeighbourMessage::default(),
            ))])
            .unwrap_err();
        assert!(err.contains("unexpected notification"), "{err}");
        let mut done = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::<RouteNetlinkMessage>::Done(DoneMessage::default()),
        );
        done.finalize();
        assert!(c.apply_all(vec![done]).is_err());
    }

    #[test]
    fn forgetting_what_an_apply_deleted() {
        let mut c = node();
        let k = key(VRF_TABLE, "10.1.2.0/24");
        c.forget(Deleted::Route(k));
        assert!(!c.node.routes.contains_key(&k));
        c.forget(Deleted::Link("lv-a".into()));
        assert!(!c.node.links.contains_key("lv-a"));
        assert!(!has(&c, "2001:db8:100::1:1:0/128"));
        assert!(c.node.link_name(10).is_none());
    }

    // --- Drift: what a notification means for what Lace applied ---------------------------

    mod drift {
        use super::*;
        use crate::dataplane::diff::diff;
        use crate::dataplane::diff::tests::{bare_host, desired, model};
        use crate::dataplane::ObservedNode;
        use netlink_packet_route::route::{RouteProtocol, RouteType};

        /// A link message as the kernel notifies `name` of `o`.
        fn link_of(o: &ObservedNode, name: &str) -> LinkMessage {
            let l = &o.links[name];
            let mut m = LinkMessage::default();
            m.header.index = l.index;
            if l.up {
                m.header.flags = LinkFlags::Up;
            }
            m.attributes.push(LinkAttribute::IfName(name.into()));
            m.attributes.push(LinkAttribute::Mtu(l.mtu));
            if let Some(master) = l.master {
                m.attributes.push(LinkAttribute::Controller(master));
            }
            if let Some(t) = l.vrf_table {
                m.attributes
                    .push(LinkAttribute::LinkInfo(vec![LinkInfo::Data(
                        InfoData::Vrf(vec![InfoVrf::TableId(t)]),
                    )]));
            }
            m
        }

        fn index_in(o: &ObservedNode) -> impl Fn(&str) -> Option<u32> + '_ {
            |name| o.links.get(name).map(|l| l.index)
        }

        /// `ip route add <dst> dev <dev> table <table>`: a foreign route (`proto boot`).
        fn foreign_route(o: &ObservedNode, table: u32, dst: &str, dev: &str) -> RouteMessage {
            let key = RouteKey {
                table,
                dst: dst.parse().unwrap(),
            };
            let mut r = crate::dataplane::msg::route(
                &key,
                Some(&KernelNexthop::Dev(dev.into())),
                &index_in(o),
            )
            .unwrap();
            r.header.protocol = RouteProtocol::Boot;
            r
        }

        fn replacing(
            mut m: NetlinkMessage<RouteNetlinkMessage>,
        ) -> NetlinkMessage<RouteNetlinkMessage> {
            m.header.flags |= NLM_F_REPLACE;
            m
        }

        /// Everything the kernel would notify to describe `o`, as Lace's writes produce it.
        fn notified(o: &ObservedNode) -> Vec<NetlinkMessage<RouteNetlinkMessage>> {
            let mut out: Vec<_> = o
                .links
                .keys()
                .map(|n| msg(RouteNetlinkMessage::NewLink(link_of(o, n))))
                .collect();
            for (ip, i) in &o.addrs {
                out.push(msg(RouteNetlinkMessage::NewAddress(addr_msg(*ip, *i))));
            }
            for h in &o.host_routes {
                let mut r = RouteMessage::default();
                r.header.address_family = match h.dst {
                    IpNet::V4(_) => AddressFamily::Inet,
                    IpNet::V6(_) => AddressFamily::Inet6,
                };
                r.header.destination_prefix_length = h.dst.prefix_len();
                r.header.table = 254;
                r.header.kind = RouteType::Unicast;
                r.header.protocol = RouteProtocol::Boot;
                r.attributes.push(RouteAttribute::Table(MAIN_TABLE));
                if h.dst.prefix_len() > 0 {
                    r.attributes
                        .push(RouteAttribute::Destination(RouteAddress::from(
                            h.dst.addr(),
                        )));
                }
                if let Some(gw) = h.gateway {
                    r.attributes
                        .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
                }
                if let Some(dev) = &h.dev {
                    r.attributes.push(RouteAttribute::Oif(o.links[dev].index));
                }
                out.push(msg(RouteNetlinkMessage::NewRoute(r)));
            }
            for (key, nh) in &o.routes {
                let r = crate::dataplane::msg::route(key, Some(nh), &index_in(o)).unwrap();
                out.push(msg(RouteNetlinkMessage::NewRoute(r)));
            }
            for rule in o.rules.iter().filter_map(|r| r.rule) {
                out.push(msg(RouteNetlinkMessage::NewRule(
                    crate::dataplane::msg::rule(&rule),
                )));
            }
            out
        }

        /// A node to which Lace applied `desired(true)`, as its memory holds it (built from
        /// notifications), and what Lace applied.
        fn applied() -> (Cache, Applied, ObservedNode) {
            let d = desired(true);
            let mut o = bare_host();
            let ops = diff(Some(&d), &o, None).unwrap().ops;
            model(&mut o, &ops);
            let mut c = Cache::new(
                ObservedNode {
                    links: BTreeMap::new(),
                    addrs: vec![],
                    routes: BTreeMap::new(),
                    host_routes: vec![],
                    rules: vec![],
                    sysctls: o.sysctls.clone(),
                    tunsrc: o.tunsrc,
                    fou: o.fou.clone(),
                    nft: o.nft.clone(),
                },
                HostRoutes::new(),
            );
            c.apply_all(notified(&o)).unwrap();
            assert_eq!(c.node.routes, o.routes, "the memory holds what was applied");
            assert_eq!(c.node.links, o.links);
            let mut a = Applied::default();
            a.reconciled(Some(Applied::of(d, &o)));
            assert_eq!(a.drift(&c.node), None, "nothing changed yet");
            (c, a, o)
        }

        fn after(
            c: &mut Cache,
            a: &mut Applied,
            m: Vec<NetlinkMessage<RouteNetlinkMessage>>,
        ) -> Option<Drift> {
            c.apply_all(m).unwrap();
            a.drift(&c.node)
        }

        #[test]
        fn lace_s_own_writes_echoing_back_are_not_drift() {
            let (mut c, mut a, o) = applied();
            // Every write of the apply, notified (again, late), some as replaces.
            let echoes: Vec<_> = notified(&o).into_iter().map(replacing).collect();
            assert_eq!(after(&mut c, &mut a, notified(&o)), None);
            assert_eq!(after(&mut c, &mut a, echoes), None);
        }

        #[test]
        fn changes_to_foreign_objects_are_not_drift() {
            let (mut c, mut a, o) = applied();
            let table = 1_000_001;
            let mut down = link_of(&o, "keep0");
            down.header.flags = LinkFlags::empty();
            let mut foreign_rule = RuleMessage::default();
            foreign_rule.header.family = AddressFamily::Inet;
            foreign_rule.attributes.push(RuleAttribute::Priority(500));
            let changes = vec![
                // A foreign route in Lace's VRF table and in the main table, added and gone.
                msg(RouteNetlinkMessage::NewRoute(foreign_route(
                    &o,
                    table,
                    "192.0.2.0/24",
                    "keep0",
                ))),
                msg(RouteNetlinkMessage::NewRoute(foreign_route(
                    &o,
                    MAIN_TABLE,
                    "203.0.113.0/24",
                    "keep0",
                ))),
                msg(RouteNetlinkMessage::DelRoute(foreign_route(
                    &o,
                    table,
                    "192.0.2.0/24",
                    "keep0",
                ))),
                // A rule outside Lace's band, a foreign link going down, an address on it.
                msg(RouteNetlinkMessage::NewRule(foreign_rule.clone())),
                msg(RouteNetlinkMessage::DelRule(foreign_rule)),
                msg(RouteNetlinkMessage::NewLink(down)),
                msg(RouteNetlinkMessage::NewAddress(addr_msg(
                    "198.18.0.1".parse().unwrap(),
                    o.links["keep0"].index,
                ))),
            ];
            assert_eq!(after(&mut c, &mut a, changes), None);
        }

        #[test]
        fn lace_s_objects_changed_by_someone_else_are_drift() {
            let (_, _, o) = applied();
            let (key, nh) = o
                .routes
                .iter()
                .find(|(_, nh)| matches!(nh, KernelNexthop::Seg6Encap { .. }))
                .map(|(k, nh)| (*k, nh.clone()))
                .unwrap();
            let lace = |nh: &KernelNexthop| {
                crate::dataplane::msg::route(&key, Some(nh), &index_in(&o)).unwrap()
            };
            let mut replaced_by_foreign = lace(&nh);
            replaced_by_foreign.header.protocol = RouteProtocol::Static;
            let rule = o.rules[0].rule.unwrap();
            let mut pod_down = link_of(&o, "lp-pa");
            pod_down.header.flags = LinkFlags::empty();
            let cases: Vec<(&str, Vec<NetlinkMessage<RouteNetlinkMessage>>, &str)> = vec![
                (
                    "a route deleted",
                    vec![msg(RouteNetlinkMessage::DelRoute(lace(&nh)))],
                    "route replace",
                ),
                (
                    "a route rewritten",
                    vec![replacing(msg(RouteNetlinkMessage::NewRoute(lace(
                        &KernelNexthop::Dev("keep0".into()),
                    ))))],
                    "route replace",
                ),
                (
                    "a route replaced by another protocol's",
                    vec![replacing(msg(RouteNetlinkMessage::NewRoute(
                        replaced_by_foreign,
                    )))],
                    "route replace",
                ),
                (
                    "a rule deleted",
                    vec![msg(RouteNetlinkMessage::DelRule(
                        crate::dataplane::msg::rule(&rule),
                    ))],
                    "rule add",
                ),
                (
                    "the VRF deleted",
                    vec![msg(RouteNetlinkMessage::DelLink(link_of(&o, "lv-a")))],
                    "link add lv-a",
                ),
                (
                    "a pod veth down (its routes flushed)",
                    vec![msg(RouteNetlinkMessage::NewLink(pod_down))],
                    "link set lp-pa up",
                ),
            ];
            for (what, changes, op) in cases {
                let (mut c, mut a, _) = applied();
                let drift = after(&mut c, &mut a, changes);
                assert!(
                    drift
                        .as_ref()
                        .is_some_and(|d| d.ops > 0 && d.summary.contains(op)),
                    "{what}: {drift:?}"
                );
            }
        }

        #[test]
        fn a_pod_veth_that_appears_after_the_reconcile_looked_is_left_to_its_add() {
            let d = desired(true);
            let mut o = bare_host();
            // The reconcile looked while pod b's ADD had its address but no veth yet.
            o.links.remove("lp-pb");
            let ops = diff(Some(&d), &o, None).unwrap().ops;
            model(&mut o, &ops);
            let mut a = Applied::default();
            a.reconciled(Some(Applied::of(d.clone(), &o)));
            // Then the veth appears (the ADD's pod side), not set up yet.
            o.links
                .insert("lp-pb".into(), crate::dataplane::diff::tests::link(5));
            assert_eq!(a.drift(&o), None, "the ADD's own work in progress");
            // The ADD's attach: now it is part of what Lace applied.
            let mut pods = d.clone();
            pods.pod_routes
                .retain(|_, nh| matches!(nh, crate::plan::Nexthop::Dev(x) | crate::plan::Nexthop::DevSrc { dev: x, .. } if x == "lp-pb"));
            let ops = crate::dataplane::diff::attach(&pods, &o).unwrap().ops;
            model(&mut o, &ops);
            a.attached(&pods);
            assert_eq!(a.drift(&o), None);
            o.routes.retain(|k, _| k.table != d.base.vrfs["lv-b"].table);
            assert!(a.drift(&o).is_some(), "pod b's routes deleted by hand");
        }

        #[test]
        fn a_deleted_pod_is_not_drift_and_its_retried_add_is_the_add_s() {
            let (mut c, mut a, o) = applied();
            let del = msg(RouteNetlinkMessage::DelLink(link_of(&o, "lp-pb")));
            assert_eq!(after(&mut c, &mut a, vec![del]), None, "CNI DEL");
            // A retried ADD of the same container: the veth is back, not set up yet.
            let mut back = link_of(&o, "lp-pb");
            back.attributes
                .retain(|x| !matches!(x, LinkAttribute::Controller(_)));
            back.header.flags = LinkFlags::empty();
            assert_eq!(
                after(
                    &mut c,
                    &mut a,
                    vec![msg(RouteNetlinkMessage::NewLink(back))]
                ),
                None
            );
        }

        #[test]
        fn notifications_that_cannot_be_followed_make_drift_without_operations() {
            let (mut c, mut a, o) = applied();
            let mut renamed = link_of(&o, "lp-pa");
            renamed
                .attributes
                .retain(|x| !matches!(x, LinkAttribute::IfName(_)));
            renamed
                .attributes
                .push(LinkAttribute::IfName("lp-zz".into()));
            assert!(c
                .apply_all(vec![msg(RouteNetlinkMessage::NewLink(renamed))])
                .is_err());
            // The session drops the memory and reports; an error of the plan itself is drift
            // too (a reconcile reports it properly).
            let mut no_uplink = c.node.clone();
            no_uplink.addrs.clear();
            let d = a.drift(&no_uplink).unwrap();
            assert_eq!(d.ops, 0);
            assert!(d.summary.contains("underlay"), "{d:?}");
        }
    }
}
