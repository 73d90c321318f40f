//! The primitives both the node's base routes ([`super::base`]) and its NodePort ingress
//! routes ([`super::ingress`]) are built with: a collection of routes in which the kind with
//! the highest precedence wins each key, and the route to a peer's locator along its path.

use ipnet::IpNet;

use super::underlay::PeerPath;
use super::{Nexthop, RouteKey, Underpath};

/// Routes collected with a precedence; the highest precedence wins per key.
#[derive(Default)]
pub(super) struct RouteBuilder {
    routes: Vec<(RouteKey, u8, Nexthop)>,
}

/// Precedence of route kinds when two want the same key.
pub(super) const PREC_FALLBACK: u8 = 0; // unreachable default / unreachable cluster subnets
pub(super) const PREC_EGRESS: u8 = 1; // default via host
pub(super) const PREC_REACH: u8 = 2; // blocks, leaks, underlay, SIDs, backends
pub(super) const PREC_INGRESS: u8 = 3; // remote NodePort backends through the ingress device

impl RouteBuilder {
    pub(super) fn add(&mut self, table: u32, dst: IpNet, prec: u8, nh: Nexthop) {
        self.routes.push((RouteKey::new(table, dst), prec, nh));
    }

    pub(super) fn finish(mut self) -> RouteTable {
        // Sort by key, then precedence descending, and keep the first of each key.
        self.routes
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        self.routes.dedup_by(|later, first| later.0 == first.0);
        // Collected in place (the element shrinks, the buffer is reused), then trimmed.
        let mut sorted: Vec<(RouteKey, Nexthop)> =
            self.routes.into_iter().map(|(k, _, nh)| (k, nh)).collect();
        sorted.shrink_to_fit();
        RouteTable(sorted)
    }
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
