//! The cache of a [`Session`](super::Session): the [`ObservedNode`] of the last full dump,
//! with the kernel's notifications replayed into it in order, as the kernel itself changes
//! its state, and what an apply deleted taken out.
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
//! Routes are keyed like the dump's ([`RouteKey`]: table, destination and metric, not TOS),
//! so two kernel routes of Lace's protocol differing only in TOS (a hand-added copy) are one
//! entry; the host's main-table routes are keyed by destination, TOS, priority and link, so
//! `ip route append` copies through one link are one entry too.
//! A delete Lace issued that found nothing, racing with someone adding that very route, is
//! forgotten after the addition's notification: that route is then left alone until the
//! next full dump.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

#[cfg(test)]
use netlink_packet_core::NetlinkMessage;
use netlink_packet_core::{NetlinkBuffer, NetlinkPayload, NLM_F_REPLACE};
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::RouteNetlinkMessage;

use crate::dataplane::nl::{decode_message, NlError};
use crate::dataplane::observe::{
    self, addr_entries, classify_rule, lace_table, parse_link, route_from_bytes, HostRoutes,
};
use crate::dataplane::observed::{KernelNexthop, LinkName, ObservedNode};
use crate::dataplane::op::Op;
use crate::plan::RouteKey;

/// Something a successful apply deleted (or found already gone).
#[derive(Debug)]
pub enum Deleted {
    Route(RouteKey),
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

/// The cache proper: an [`ObservedNode`] and what updating it needs.
#[derive(Debug)]
pub(super) struct Cache {
    pub(super) node: ObservedNode,
    /// Link index → name: notifications name devices by index.
    names: BTreeMap<u32, LinkName>,
    /// The host's main-table routes by identity; `node.host_routes` lists them.
    host: HostRoutes,
    /// Not handed out yet since the dump that filled it.
    pub(super) fresh: bool,
    /// The IPv4 tables the dump read (`None`: every table; see [`super::observe::dump`]).
    pub(super) ipv4_tables: Option<BTreeSet<u32>>,
}

impl Cache {
    /// A cache of what a dump read: `ipv4_tables` are the IPv4 tables it read, `None` for
    /// every table.
    pub(super) fn new(
        node: ObservedNode,
        host: HostRoutes,
        ipv4_tables: Option<BTreeSet<u32>>,
    ) -> Self {
        let names = node
            .links
            .iter()
            .map(|(n, l)| (l.index, LinkName::from(n.as_str())))
            .collect();
        Self {
            node,
            names,
            host,
            fresh: true,
            ipv4_tables,
        }
    }

    /// Whether the dump read every IPv4 table of `tables` (`None`: every table there is).
    pub(super) fn covers(&self, tables: Option<&BTreeSet<u32>>) -> bool {
        match (&self.ipv4_tables, tables) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(read), Some(tables)) => {
                tables.iter().all(|t| read.contains(t) || !lace_table(*t))
            }
        }
    }

    /// Applies notifications in order; an error says why the stream cannot be followed.
    pub(super) fn apply_stream<'a>(
        &mut self,
        mut messages: impl Iterator<Item = Result<NetlinkBuffer<&'a [u8]>, NlError>>,
    ) -> Result<(), String> {
        let mut host_changed = false;
        let result =
            messages.try_for_each(|m| self.apply(m.map_err(|e| e.to_string())?, &mut host_changed));
        if host_changed {
            self.node.host_routes = self.host.values().cloned().collect();
        }
        result
    }

    /// [`Cache::apply_stream`] of decoded messages, laid end to end as the kernel sends them.
    #[cfg(test)]
    pub(super) fn apply_all(
        &mut self,
        messages: Vec<NetlinkMessage<RouteNetlinkMessage>>,
    ) -> Result<(), String> {
        let bytes = crate::dataplane::fixtures::datagram(&messages);
        self.apply_stream(crate::dataplane::nl::RawMessages::new(&bytes))
    }

    fn apply(&mut self, raw: NetlinkBuffer<&[u8]>, host_changed: &mut bool) -> Result<(), String> {
        let kind = raw.message_type();
        let replace = raw.flags() & NLM_F_REPLACE != 0;
        if kind == libc::RTM_NEWROUTE || kind == libc::RTM_DELROUTE {
            // Read from the bytes like a dump's: a first apply's settle takes one per route.
            let route = route_from_bytes(raw.payload(), &self.names)
                .map_err(|e| format!("a notified route: {e}"))?;
            match kind == libc::RTM_NEWROUTE {
                true => self.new_route(route, replace, host_changed),
                false => self.del_route(route, host_changed),
            }
            return Ok(());
        }
        if kind == libc::RTM_NEWLINK {
            // Like a dump's: only what Lace reads of a link is decoded.
            let l = observe::link_message(raw.payload())
                .map_err(|e| format!("a notified link: {e}"))?;
            return self.new_link(&l, host_changed);
        }
        let msg = decode_message(raw).map_err(|e| e.to_string())?;
        let NetlinkPayload::InnerMessage(m) = msg.payload else {
            return Err(format!("unexpected netlink message of type {kind}"));
        };
        match m {
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

    fn new_route(&mut self, route: observe::Route, replace: bool, host_changed: &mut bool) {
        match route {
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
                        metric: priority,
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
        }
    }

    fn del_route(&mut self, route: observe::Route, host_changed: &mut bool) {
        match route {
            observe::Route::Lace(key, _) => {
                self.node.routes.remove(&key);
            }
            observe::Route::Host(id, _) => {
                *host_changed |= self.host.remove(&id).is_some();
            }
            observe::Route::Foreign(_) | observe::Route::Other => {}
        }
    }

    fn new_link(&mut self, l: &LinkMessage, host_changed: &mut bool) -> Result<(), String> {
        let Some((name, link)) = parse_link(l) else {
            return Err(format!("link {} notified without a name", l.header.index));
        };
        if let Some(old) = self.names.get(&link.index) {
            if **old != *name {
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
        self.names.insert(link.index, name.as_str().into());
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
        self.node.links.remove(&*name);
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
                    ip.is_ipv4() || dev.as_deref() == Some(&**via)
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
        self.node.routes.retain(|k, nh| !hit(&k.dst, nh.dev()));
        let before = self.host.len();
        self.host.retain(|_, h| !hit(&h.dst, h.dev.as_deref()));
        *host_changed |= self.host.len() != before;
    }

    pub(super) fn forget(&mut self, d: Deleted) {
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

#[cfg(test)]
mod tests;
