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
use super::{Nexthop, RouteKey, Tables, Underpath};

/// Routes collected with a precedence; the highest precedence wins per key.
#[derive(Default)]
pub(super) struct RouteBuilder {
    /// The routes installed always.
    always: Vec<Built>,
    /// The routes for local pods, in runs of one table each: a run is sorted when the next
    /// table's begins, so that a caller adding each table's routes at once, in table order,
    /// leaves them sorted without one large sort (at 5,000 nodes x 50 Networks, 190,000 routes
    /// whose sort was most of the plan).
    local_pods: Vec<Built>,
    /// Where the run being added begins.
    run: usize,
}

/// A route with its precedence.
type Built = (RouteKey, u8, Nexthop);

/// What [`RouteBuilder::finish`] yields.
pub(super) struct BuiltRoutes {
    /// The routes installed always. Under a key whose winner is a route for local pods, the
    /// best of the others, if any: what holds while the Network has no pod here.
    pub always: RouteTable,
    /// The routes for local pods that win their key.
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
        self.always.push((RouteKey::new(table, dst), prec, nh));
    }

    /// A route in VRF table `table` that only its Network's pods on this node use. Adding
    /// each table's routes together, in table order, saves the sort of them all.
    pub(super) fn add_for_local_pods(&mut self, table: u32, dst: IpNet, prec: u8, nh: Nexthop) {
        if self
            .local_pods
            .get(self.run)
            .is_some_and(|first| first.0.table != table)
        {
            self.end_run();
        }
        self.local_pods.push((RouteKey::new(table, dst), prec, nh));
    }

    /// Room for `n` more routes for local pods.
    pub(super) fn reserve_for_local_pods(&mut self, n: usize) {
        self.local_pods.reserve_exact(n);
    }

    fn end_run(&mut self) {
        self.local_pods[self.run..].sort_unstable_by(order);
        self.run = self.local_pods.len();
    }

    /// Per key: the best route installed always (the highest precedence, then the least next
    /// hop), and the best route for local pods if its precedence is higher still.
    pub(super) fn finish(mut self) -> BuiltRoutes {
        self.end_run();
        if !self.local_pods.is_sorted_by(|a, b| order(a, b).is_le()) {
            sort_on_two_threads(&mut self.local_pods); // tables added in several runs
        }
        sort_on_two_threads(&mut self.always);
        // The first of each key is its best.
        self.always.dedup_by(|later, first| later.0 == first.0);
        self.local_pods.dedup_by(|later, first| later.0 == first.0);
        let always = self.always;
        let mut a = 0;
        self.local_pods.retain(|(key, prec, _)| {
            while always.get(a).is_some_and(|r| r.0 < *key) {
                a += 1;
            }
            always.get(a).is_none_or(|r| r.0 != *key || r.1 < *prec)
        });
        // Collected in place (the element shrinks, the buffer is reused), so the routes are
        // never held twice.
        let drop_precedence = |routes: Vec<Built>| -> Vec<(RouteKey, Nexthop)> {
            routes.into_iter().map(|(k, _, nh)| (k, nh)).collect()
        };
        let mut local_pods = drop_precedence(self.local_pods);
        local_pods.shrink_to_fit();
        BuiltRoutes {
            always: RouteTable(drop_precedence(always)),
            local_pods: RouteTable(local_pods),
        }
    }
}

/// By key, then precedence descending, then next hop.
fn order(a: &Built, b: &Built) -> std::cmp::Ordering {
    (a.0.cmp(&b.0)).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2))
}

/// Below this many routes one thread sorts them all.
const PARALLEL_SORT: usize = 1 << 16;

/// Sorts `routes` by [`order`]. A large set is split by table first, in place, at a table
/// from a sample of them, and the two parts are sorted on two threads.
fn sort_on_two_threads(routes: &mut [Built]) {
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

    /// The routes of the tables in `tables`, sorted by key (found by binary search).
    pub fn of_tables(&self, tables: Tables) -> impl Iterator<Item = (&RouteKey, &Nexthop)> {
        self.slice_of_tables(tables).iter().map(|(k, nh)| (k, nh))
    }

    /// [`RouteTable::of_tables`] as the list it is.
    pub fn slice_of_tables(&self, tables: Tables) -> &[(RouteKey, Nexthop)] {
        let (start, end) = tables.ids();
        let at = |table: std::ops::Bound<u32>| match table {
            std::ops::Bound::Included(t) | std::ops::Bound::Excluded(t) => {
                self.0.partition_point(|(k, _)| k.table < t)
            }
            std::ops::Bound::Unbounded => self.0.len(),
        };
        &self.0[at(start)..at(end)]
    }

    /// The routes of the tables in `tables` that are in `range` too, sorted by key (each
    /// table's run is found by binary search, so the others cost nothing).
    pub fn in_tables<'a>(
        &'a self,
        tables: &'a BTreeSet<u32>,
        range: Tables,
    ) -> impl Iterator<Item = (&'a RouteKey, &'a Nexthop)> + 'a {
        self.slices_in_tables(tables, range)
            .flat_map(|routes| routes.iter().map(|(k, nh)| (k, nh)))
    }

    /// [`RouteTable::in_tables`] as one list per table.
    pub fn slices_in_tables<'a>(
        &'a self,
        tables: &'a BTreeSet<u32>,
        range: Tables,
    ) -> impl Iterator<Item = &'a [(RouteKey, Nexthop)]> + 'a {
        tables.range(range.ids()).map(move |&t| {
            let start = self.0.partition_point(|(k, _)| k.table < t);
            let end = start + self.0[start..].partition_point(|(k, _)| k.table == t);
            &self.0[start..end]
        })
    }

    /// The tables that hold routes, ascending (one binary search per table).
    pub fn tables(&self) -> impl Iterator<Item = u32> + '_ {
        let mut rest = &self.0[..];
        std::iter::from_fn(move || {
            let table = rest.first()?.0.table;
            rest = &rest[rest.partition_point(|(k, _)| k.table <= table)..];
            Some(table)
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
