//! The primitives both the node's base routes ([`super::base`]) and its NodePort ingress
//! routes ([`super::ingress`]) are built with: a collection of routes in which the kind with
//! the highest precedence wins each key, and the route to a peer's locator along its path.

use std::collections::BTreeMap;

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
        self.routes.push((RouteKey { table, dst }, prec, nh));
    }

    pub(super) fn finish(mut self) -> BTreeMap<RouteKey, Nexthop> {
        // Sort by key, then precedence descending, and keep the first of each key.
        self.routes
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        self.routes.dedup_by(|later, first| later.0 == first.0);
        self.routes.into_iter().map(|(k, _, nh)| (k, nh)).collect()
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
