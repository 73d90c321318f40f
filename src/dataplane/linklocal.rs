//! What the link-local underlay needs to know about the node's links, read from the kernel:
//! which link holds the node's IPv4 InternalIP (its uplink), whether IPv6 is on there, which
//! peers are on-link from it, and which of those answer a probe to their link-local underlay
//! address (see [`crate::plan::underlay`]). Only reads and probes: nothing is written.
//!
//! **The probe** is one UDP datagram from the node's own link-local underlay address to the
//! peer's, to port [`FOU_PORT`] (no IPv6 socket listens there: Lace's fou port is IPv4), on
//! a connected socket. The peer's kernel answers with an ICMPv6 port unreachable, which the
//! socket reports as `ECONNREFUSED`: that proves, within one round trip, that the peer holds
//! its address with IPv6 on at its uplink, that neighbour discovery between the two works in
//! both directions, and that IPv6 from this node's address reaches it (the path SRv6 takes,
//! minus the SRH). It needs no raw socket (no `CAP_NET_RAW`) and no listener on the peer.
//! Silence means "not known to work": IPv6 off on either side, the address gone, a firewall
//! dropping IPv6 or ICMPv6 errors on the segment.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV6, UdpSocket};
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};

use super::observed::ObservedNode;
use crate::plan::underlay::{link_local_address, FOU_PORT};

/// What the agent asks about: the node's IPv4 InternalIP and its peers' (those without a
/// shared IPv6 InternalIP), by node name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnderlayQuery {
    pub ipv4: Option<Ipv4Addr>,
    pub peers: Vec<(String, Ipv4Addr)>,
}

/// One look at the node's uplink and its peers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnderlayRound {
    /// The link holding the node's IPv4 InternalIP, if any.
    pub uplink: Option<String>,
    /// Its MTU.
    pub uplink_mtu: Option<u32>,
    /// IPv6 is on there (`disable_ipv6` 0).
    pub uplink_ipv6: bool,
    /// The node holds its link-local underlay address there (so it could probe).
    pub holds_address: bool,
    /// The peers whose InternalIP is on-link from the uplink.
    pub on_link: BTreeSet<String>,
    /// The on-link peers that answered the probe.
    pub answering: BTreeSet<String>,
}

/// How long a probe waits for its answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
/// What a probe carries (the peer's kernel drops it with its port unreachable).
const PROBE_PAYLOAD: &[u8] = b"lace link-local underlay probe";

/// The uplink (name, index) and the peers on-link from it: the host's main table routes the
/// peer's IPv4 InternalIP through the uplink without a gateway (longest prefix match over its
/// unicast routes, as the kernel's lookup without policy rules). Pure.
pub fn on_link(
    observed: &ObservedNode,
    ipv4: Ipv4Addr,
    peers: &[(String, Ipv4Addr)],
) -> Option<(String, u32, u32, BTreeSet<String>)> {
    let (name, link) = observed.link_holding(IpAddr::V4(ipv4))?;
    let on_link = peers
        .iter()
        .filter(|(_, peer)| {
            let dst = IpNet::V4(Ipv4Net::from(*peer));
            observed
                .host_routes
                .iter()
                .filter(|r| r.dst.prefix_len() <= 32 && r.dst.contains(&dst.network()))
                .filter(|r| r.dev.is_some())
                .max_by_key(|r| r.dst.prefix_len())
                .is_some_and(|r| r.gateway.is_none() && r.dev.as_deref() == Some(name))
        })
        .map(|(n, _)| n.clone())
        .collect();
    Some((name.to_string(), link.index, link.mtu, on_link))
}

/// Probes each of `peers` (name, link-local underlay address) from `own` on the link with
/// index `ifindex`, all at once, waiting at most `timeout`; returns those that answered. Must
/// run in the node's network namespace.
pub fn probe(
    own: Ipv6Addr,
    ifindex: u32,
    peers: &[(String, Ipv6Addr)],
    timeout: Duration,
) -> BTreeSet<String> {
    let deadline = Instant::now() + timeout;
    let sockets: Vec<(&String, UdpSocket)> = peers
        .iter()
        .filter_map(|(name, addr)| {
            let s = UdpSocket::bind(SocketAddrV6::new(own, 0, 0, ifindex)).ok()?;
            s.connect(SocketAddrV6::new(*addr, FOU_PORT, 0, ifindex))
                .ok()?;
            s.send(PROBE_PAYLOAD).ok()?;
            Some((name, s))
        })
        .collect();
    let mut answered = BTreeSet::new();
    let mut buf = [0u8; 64];
    for (name, s) in sockets {
        let left = deadline.saturating_duration_since(Instant::now());
        if s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .is_err()
        {
            continue;
        }
        if let Err(e) = s.recv(&mut buf) {
            if e.kind() == ErrorKind::ConnectionRefused {
                answered.insert(name.clone());
            }
        }
    }
    answered
}

/// The peers' link-local underlay addresses, by name.
pub fn peer_addresses(
    peers: &[(String, Ipv4Addr)],
    which: &BTreeSet<String>,
) -> Vec<(String, Ipv6Addr)> {
    peers
        .iter()
        .filter(|(n, _)| which.contains(n))
        .map(|(n, a)| (n.clone(), link_local_address(*a)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::fixtures::{bare_host, link, UPLINK};
    use crate::dataplane::observed::HostRoute;

    fn host(routes: Vec<(&str, Option<&str>, &str)>) -> ObservedNode {
        let mut o = bare_host();
        o.addrs
            .push(("192.168.0.11".parse().unwrap(), o.links[UPLINK].index));
        o.links.insert("eth1".into(), link(77));
        o.host_routes = routes
            .into_iter()
            .map(|(dst, gw, dev)| HostRoute {
                dst: dst.parse().unwrap(),
                gateway: gw.map(|g| g.parse().unwrap()),
                dev: Some(dev.into()),
            })
            .collect();
        o
    }

    #[test]
    fn on_link_means_no_gateway_and_out_of_the_uplink() {
        let o = host(vec![
            ("192.168.0.0/24", None, UPLINK),
            ("0.0.0.0/0", Some("192.168.0.1"), UPLINK),
            ("10.9.0.0/16", Some("192.168.0.254"), UPLINK),
            ("172.16.0.0/24", None, "eth1"),
        ]);
        let peers = [
            ("same-l2".to_string(), "192.168.0.12".parse().unwrap()),
            ("routed".to_string(), "10.9.1.2".parse().unwrap()),
            ("default".to_string(), "203.0.113.9".parse().unwrap()),
            ("other-link".to_string(), "172.16.0.5".parse().unwrap()),
        ];
        let (name, _, mtu, on) = on_link(&o, "192.168.0.11".parse().unwrap(), &peers).unwrap();
        assert_eq!(name, UPLINK);
        assert_eq!(mtu, o.links[UPLINK].mtu);
        assert_eq!(on, ["same-l2".to_string()].into());
        // A host route through a gateway for that one peer: behind a router now.
        let mut o2 = o.clone();
        o2.host_routes.push(HostRoute {
            dst: "192.168.0.12/32".parse().unwrap(),
            gateway: Some("192.168.0.1".parse().unwrap()),
            dev: Some(UPLINK.into()),
        });
        let (_, _, _, on) = on_link(&o2, "192.168.0.11".parse().unwrap(), &peers).unwrap();
        assert!(on.is_empty(), "{on:?}");
        // No link holds the InternalIP: nothing to say.
        assert!(on_link(&o, "192.168.9.9".parse().unwrap(), &peers).is_none());
    }
}
