//! The primitives both the node's base routes ([`super::base`]) and its NodePort ingress
//! routes ([`super::ingress`]) are built with: a collection of routes in which the kind with
//! the highest precedence wins each key, and the route to a peer's locator along its path.
//!
//! A route is installed always, or only for local pods: a route in a Network's table that only
//! packets of that Network's pods on this node use (to the blocks the Network reaches), which
//! is installed while the Network has a pod here, as a BGP/MPLS VPN PE holds routes only for
//! the VRFs it has attachments for (RFC 4684): on a node with pods in a few of many Networks,
//! most of the per-node routes never reach its kernel.

use std::collections::BTreeSet;

use ipnet::IpNet;

use super::underlay::PeerPath;
use super::{Nexthop, RouteKey, Underpath};

/// Routes collected with a precedence; the highest precedence wins per key.
#[derive(Default)]
pub(super) struct RouteBuilder {
    routes: Vec<(RouteKey, u8, Reach, Nexthop)>,
}

/// When a route is installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Reach {
    Always,
    /// While its table's Network has a pod on this node.
    LocalPods,
}

/// What [`RouteBuilder::finish`] yields.
pub(super) struct BuiltRoutes {
    /// The routes installed always. Under a key whose winner is a [`Reach::LocalPods`] route,
    /// the best of the others, if any: what holds while the Network has no pod here.
    pub always: RouteTable,
    /// The winning [`Reach::LocalPods`] routes.
    pub local_pods: RouteTable,
}

/// Precedence of route kinds when two want the same key.
pub(super) const PREC_FALLBACK: u8 = 0; // unreachable default / unreachable cluster subnets
pub(super) const PREC_EGRESS: u8 = 1; // default via host
pub(super) const PREC_REACH: u8 = 2; // blocks, leaks, underlay, SIDs, backends
pub(super) const PREC_INGRESS: u8 = 3; // remote NodePort backends through the ingress device

impl RouteBuilder {
    /// A route installed always.
    pub(super) fn add(&mut self, table: u32, dst: IpNet, prec: u8, nh: Nexthop) {
        self.routes
            .push((RouteKey::new(table, dst), prec, Reach::Always, nh));
    }

    /// A route in VRF table `table` that only its Network's pods on this node use.
    pub(super) fn add_for_local_pods(&mut self, table: u32, dst: IpNet, prec: u8, nh: Nexthop) {
        self.routes
            .push((RouteKey::new(table, dst), prec, Reach::LocalPods, nh));
    }

    pub(super) fn finish(mut self) -> BuiltRoutes {
        // Sort by key, then precedence descending (always first among equals), and keep the
        // first of each key, plus the first always-installed one after a local-pods winner.
        sort_on_two_threads(&mut self.routes);
        let mut winner: Option<(RouteKey, Reach)> = None;
        self.routes.retain(|(k, _, reach, _)| {
            let keep = match winner {
                Some((w, r)) if w == *k => r == Reach::LocalPods && *reach == Reach::Always,
                _ => true,
            };
            if winner.is_none_or(|(w, _)| w != *k) {
                winner = Some((*k, *reach));
            } else if keep {
                winner = Some((*k, Reach::Always)); // one fallback per key
            }
            keep
        });
        // The always-installed routes are copied out (at scale they are the few: locators,
        // SIDs, defaults); the others are collected in place (the element shrinks, the buffer
        // is reused), so the routes are never held twice.
        let always: Vec<(RouteKey, Nexthop)> = self
            .routes
            .iter()
            .filter(|r| r.2 == Reach::Always)
            .map(|(k, _, _, nh)| (*k, nh.clone()))
            .collect();
        self.routes.retain(|r| r.2 == Reach::LocalPods);
        let mut local_pods: Vec<(RouteKey, Nexthop)> = self
            .routes
            .into_iter()
            .map(|(k, _, _, nh)| (k, nh))
            .collect();
        local_pods.shrink_to_fit();
        BuiltRoutes {
            always: RouteTable(always),
            local_pods: RouteTable(local_pods),
        }
    }
}

/// A builder's routes from [`RouteBuilder::finish`], sorted.
type Built = (RouteKey, u8, Reach, Nexthop);

/// Below this many routes one thread sorts them all.
const PARALLEL_SORT: usize = 1 << 16;

/// Sorts `routes` by key, precedence descending, reach and next hop. A large set is split by
/// table first, in place, at a table from a sample of them, and the two parts are sorted on
/// two threads: sorting a node's 300,000 routes was most of its plan.
fn sort_on_two_threads(routes: &mut [Built]) {
    fn order(a: &Built, b: &Built) -> std::cmp::Ordering {
        (a.0.cmp(&b.0))
            .then(b.1.cmp(&a.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    }
    if routes.len() < PARALLEL_SORT {
        return routes.sort_unstable_by(order);
    }
    let mut sample: Vec<u32> = routes
        .iter()
        .step_by(routes.len() / 1024)
        .map(|r| r.0.table)
        .collect();
    sample.sort_unstable();
    let pivot = sample[sample.len() / 2];
    // The tables below the pivot first, then the rest: two runs of whole tables.
    let mut below = 0;
    for i in 0..routes.len() {
        if routes[i].0.table < pivot {
            routes.swap(i, below);
            below += 1;
        }
    }
    let (low, high) = routes.split_at_mut(below);
    std::thread::scope(|s| {
        s.spawn(|| low.sort_unstable_by(order));
        high.sort_unstable_by(order);
    });
}

/// A node's routes, sorted by key, one per key. A sorted vector rather than a map: it is built
/// once per plan and then only looked up and walked, and a map built from the builder's vector
/// needed both at once, twice the routes' memory at the plan's peak (5,000 nodes x 50
/// Networks: 295,240 routes, ~21 MiB each way).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteTable(Vec<(RouteKey, Nexthop)>);

impl RouteTable {
    /// The route for `key`, if there is one.
    pub fn get(&self, key: &RouteKey) -> Option<&Nexthop> {
        self.0
            .binary_search_by(|(k, _)| k.cmp(key))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Every route, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&RouteKey, &Nexthop)> {
        self.0.iter().map(|(k, nh)| (k, nh))
    }

    /// The routes of the tables in `tables`, sorted by key (each table's run is found by
    /// binary search, so the others cost nothing).
    pub fn in_tables<'a>(
        &'a self,
        tables: &'a BTreeSet<u32>,
    ) -> impl Iterator<Item = (&'a RouteKey, &'a Nexthop)> + 'a {
        tables.iter().flat_map(move |&t| {
            let start = self.0.partition_point(|(k, _)| k.table < t);
            let end = start + self.0[start..].partition_point(|(k, _)| k.table == t);
            self.0[start..end].iter().map(|(k, nh)| (k, nh))
        })
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A later route for a key replaces an earlier one, as with a map's `insert`.
impl FromIterator<(RouteKey, Nexthop)> for RouteTable {
    fn from_iter<I: IntoIterator<Item = (RouteKey, Nexthop)>>(iter: I) -> Self {
        let mut routes: Vec<(RouteKey, Nexthop)> = iter.into_iter().collect();
        // Stable: equal keys stay in order, and the last of each run is kept.
        routes.sort_by_key(|a| a.0);
        routes.reverse();
        routes.dedup_by(|later, first| later.0 == first.0);
        routes.reverse();
        Self(routes)
    }
}

/// The route to a peer's locator along `path` and the family it uses, `None` when the peer
/// cannot be reached.
pub(super) fn locator_route(path: &PeerPath) -> Option<(Nexthop, Underpath)> {
    match *path {
        PeerPath::Ipv6(via) => Some((Nexthop::Underlay { via }, Underpath::Ipv6)),
        PeerPath::LinkLocal(via) => Some((Nexthop::LinkLocal { via }, Underpath::LinkLocal)),
        PeerPath::Ipv4(via) => Some((Nexthop::Ipv4Tunnel { via }, Underpath::Fou)),
        PeerPath::NoCommonFamily => None,
    }
}

#[cfg(test)]
mod tests;
