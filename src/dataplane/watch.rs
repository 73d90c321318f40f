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

use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REPLACE};
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
            (Some(cache), Some(n)) => n
                .take()
                .and_then(|t| cache.apply_stream(t.messages()))
                .err(),
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
        observe::observe_host(&mut cache.node, sysctls)?;
        let full = std::mem::replace(&mut cache.fresh, false);
        Ok(f(&mut self.nl, &cache.node, full))
    }

    /// After an apply: takes in the notifications of what it wrote, then forgets what it
    /// `deleted` (gone now, notified or not). After a failed apply the cache is dropped:
    /// the next reconcile dumps.
    pub fn settle(&mut self, deleted: Vec<Deleted>, applied: bool) {
        let Some(cache) = &mut self.cache else { return };
        let why = if applied {
            match self.nl.notifications().map(|n| n.take()) {
                Some(Ok(t)) => cache.apply_stream(t.messages()).err(),
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
        if let Err(why) = n.take().and_then(|t| cache.apply_stream(t.messages())) {
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
                        // Replaced whatever it was, through any link.
                        let (dst, tos, priority, _) = id;
                        self.host
                            .retain(|&(d, t, p, _), _| (d, t, p) != (dst, tos, priority));
                    }
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
    use rtnetlink::packet_core::{DoneMessage, NetlinkHeader};
    use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
    use rtnetlink::packet_route::link::{
        InfoData, InfoVrf, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
    };
    use rtnetlink::packet_route::neighbour::NeighbourMessage;
    use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
    use rtnetlink::packet_route::rule::{RuleAttribute, RuleMessage};
    use rtnetlink::packet_route::AddressFamily;

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

    fn index_of(name: &str) -> Result<u32, String> {
        LINKS
            .iter()
            .find(|(n, ..)| *n == name)
            .map(|(_, i, _)| *i)
            .ok_or_else(|| format!("no link {name}"))
    }

    /// A route as Lace writes it (what the kernel notifies has the same meaning).
    fn lace_route(key: RouteKey, nh: &KernelNexthop) -> RouteMessage {
        crate::dataplane::apply::route_message(&key, Some(nh), &index_of).unwrap()
    }

    /// `default via <gw> dev eth0 metric <metric>` in the main table, not Lace's.
    fn host_route(gw: [u8; 4], metric: u32) -> RouteMessage {
        let mut r = RouteMessage::default();
        r.header.address_family = AddressFamily::Inet;
        r.header.table = 254;
        r.header.kind = rtnetlink::packet_route::route::RouteType::Unicast;
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
        use rtnetlink::packet_route::address::AddressFlags;
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
}
