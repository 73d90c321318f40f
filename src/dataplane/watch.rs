//! The reconciler's memory of the kernel: what the last full dump showed, kept current by
//! rtnetlink's change notifications instead of re-dumping on every reconcile.
//!
//! A [`Session`] (one per namespace, on its worker thread) subscribes to the notifications of
//! links, addresses, routes and rules *before* it dumps, so no change falls between the dump
//! and the stream; notifications about changes the dump already shows replay to the same
//! state, in order. Each reconcile then takes what was queued since ([`Session::observed`]),
//! the writes' own notifications included, after the apply ([`Session::settle`]), and while
//! idle. The cache is thrown away and the kernel dumped again whenever the stream cannot be
//! trusted to be complete: the notification socket overran (`ENOBUFS`), a message did not
//! decode or was not one the groups carry, a link was renamed (routes name their devices),
//! an apply failed, or nothing was cached yet.
//!
//! ## What the kernel changes without telling
//! IPv4 flushes routes silently: those through a link that goes down or away, all of a
//! link's routes when its last IPv4 address goes, and routes whose preferred source address
//! goes (IPv6 instead drops the source from them, silently too). The cache follows the first
//! two exactly as the kernel does (the routes are gone, in both families: IPv6 reports the
//! same deletions). For the third, which routes the kernel touches depends on tables and
//! devices, so the routes using the address as source are marked [`KernelNexthop::Unknown`]:
//! the next reconcile rewrites them if planned (replace) or deletes them (a missing route
//! is the idempotent case), whatever the kernel did.
//!
//! A delete of something the cache held but the kernel did not (no notification follows)
//! is settled from the operation itself: after a successful apply, what was deleted is gone.
//!
//! ## Limits
//! Routes are keyed like the dump's ([`RouteKey`]: table and destination), so two kernel
//! routes of Lace's protocol to the same destination in one table (a hand-added copy with
//! another metric) are one entry; the host's main-table routes are keyed by destination,
//! TOS and priority, so `ip route append` copies are one entry too.
//!
//! [`RouteKey`]: crate::plan::RouteKey

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::link::LinkMessage;
use rtnetlink::packet_route::RouteNetlinkMessage;

use super::nl::{Nl, NlError};
use super::observe::{self, addr_entries, classify_route, classify_rule, parse_link, HostRoutes};
use super::{KernelNexthop, ObserveError, ObservedNode, Op};

/// Receive buffer of the notification socket by default: room for some ten thousand
/// notifications between two drains.
pub const NOTIFICATION_BUFFER: usize = 8 << 20;

/// How long the worker waits for a job before draining notifications anyway, so a busy host
/// does not overrun the socket between two reconciles.
pub const IDLE_DRAIN: Duration = Duration::from_secs(1);

/// One namespace's rtnetlink connection and what the reconciler knows of the namespace.
#[derive(Debug)]
pub struct Session {
    pub nl: Nl,
    cache: Option<Cache>,
    rx_buf: usize,
}

/// Something a successful apply deleted (or found already gone).
#[derive(Debug)]
pub enum Deleted {
    Route(crate::plan::RouteKey),
    Rule(Box<rtnetlink::packet_route::rule::RuleMessage>),
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
    /// A session over `nl`; the notification socket gets `rx_buf` bytes of receive buffer.
    pub fn new(nl: Nl, rx_buf: usize) -> Self {
        Self {
            nl,
            cache: None,
            rx_buf,
        }
    }

    /// Runs `f` with the request socket and the namespace as it is now: the cache brought up
    /// to date with what the kernel notified, or a full dump when there is no trustworthy
    /// cache (`f`'s third argument is `true` then). Sysctls (`sysctls` are the keys),
    /// `ip sr tunsrc` and the nft table are read each time.
    pub fn with_observed<R>(
        &mut self,
        sysctls: &BTreeSet<String>,
        f: impl FnOnce(&mut Nl, &ObservedNode, bool) -> R,
    ) -> Result<R, ObserveError> {
        self.nl.subscribe(self.rx_buf)?;
        let stale = match (&mut self.cache, self.nl.notifications()) {
            (Some(cache), Some(n)) => n.take().and_then(|m| cache.apply_all(m)).err(),
            _ => Some(String::new()),
        };
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
        let full = cache.fresh;
        cache.fresh = false;
        observe::observe_host(&mut cache.node, sysctls)?;
        Ok(f(&mut self.nl, &cache.node, full))
    }

    /// After an apply: takes in the notifications of what it wrote, then forgets what it
    /// `deleted` (gone now, notified or not). After a failed apply the cache is dropped:
    /// the next reconcile dumps.
    pub fn settle(&mut self, deleted: Vec<Deleted>, applied: bool) {
        let Some(cache) = &mut self.cache else { return };
        let why = if applied {
            match self.nl.notifications().map(|n| n.take()) {
                Some(Ok(m)) => cache.apply_all(m).err(),
                Some(Err(why)) => Some(why),
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
            }
        }
    }

    /// Between reconciles: takes in what the kernel notified, so its socket never overruns
    /// on a busy host; a gap drops the cache (the next reconcile dumps).
    pub fn idle(&mut self) {
        let Some(n) = self.nl.notifications() else {
            return;
        };
        let Some(cache) = &mut self.cache else {
            // Nothing to keep current: the next reconcile dumps anyway.
            n.discard();
            return;
        };
        if let Err(why) = n.take().and_then(|m| cache.apply_all(m)) {
            tracing::warn!(reason = %why, "dataplane: the kernel's notifications cannot be trusted; the next reconcile dumps");
            self.cache = None;
        }
    }

    /// The cached state, if any (without sysctls, tunsrc or nft read again).
    pub fn cached(&self) -> Option<&ObservedNode> {
        self.cache.as_ref().map(|c| &c.node)
    }
}

/// Opens a session's socket, for [`super::netns::Worker::start`].
pub fn open(rx_buf: usize) -> impl FnOnce() -> Result<Session, NlError> + Send + 'static {
    move || Ok(Session::new(Nl::open()?, rx_buf))
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
    fn apply_all(&mut self, messages: Vec<NetlinkMessage<RouteNetlinkMessage>>) -> Result<(), String> {
        let mut host_changed = false;
        let result = messages
            .into_iter()
            .try_for_each(|m| self.apply(m, &mut host_changed));
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
        let NetlinkPayload::InnerMessage(m) = msg.payload else {
            return Err(format!("unexpected netlink message of type {kind}"));
        };
        match m {
            RouteNetlinkMessage::NewLink(l) => return self.new_link(&l, host_changed),
            RouteNetlinkMessage::DelLink(l) => self.del_link(l.header.index, host_changed),
            RouteNetlinkMessage::NewAddress(a) => {
                for entry in addr_entries(&a) {
                    if !self.node.addrs.contains(&entry) {
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
                    self.host.insert(id, h);
                    *host_changed = true;
                }
                observe::Route::Other => {}
            },
            RouteNetlinkMessage::DelRoute(r) => match classify_route(&r, &self.names) {
                observe::Route::Lace(key, _) => {
                    self.node.routes.remove(&key);
                }
                observe::Route::Host(id, _) => {
                    *host_changed |= self.host.remove(&id).is_some();
                }
                observe::Route::Other => {}
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
        for nh in self.node.routes.values_mut() {
            if matches!(nh, KernelNexthop::DevSrc { src, .. } if *src == ip) {
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
        self.node.routes.retain(|k, nh| !hit(&k.dst, nexthop_dev(nh)));
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
