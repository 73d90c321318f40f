//! The diff of Lace's SRv6-over-IPv4 device ([`IPV4_TUNNEL`]): the `sit` device as planned,
//! sized after the link holding the node's IPv4 underlay address, its tunnel-source address
//! and the fou port beside it. Pure.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr};

use ipnet::{IpNet, Ipv6Net};

use crate::dataplane::observed::{FouListener, ObservedLink, ObservedNode, SitLink};
use crate::dataplane::op::Op;
use crate::plan::underlay::{Ipv4Tunnel, FOU_IPPROTO, FOU_PORT, IPV4_FOU_OVERHEAD, IPV4_TUNNEL};

/// `TUNNEL_ENCAP_FOU` of `<linux/if_tunnel.h>`.
const TUNNEL_ENCAP_FOU: u16 = 1;

/// The `sit` device that carries SRv6 over IPv4 as planned by `t`.
pub fn planned_sit(t: &Ipv4Tunnel) -> SitLink {
    SitLink {
        local: Some(t.local),
        remote: None,
        link: 0,
        ttl: 0,
        pmtudisc: true,
        encap_type: TUNNEL_ENCAP_FOU,
        encap_sport: 0,
        encap_dport: FOU_PORT,
        encap_flags: 0,
    }
}

/// The operations that make the SRv6-over-IPv4 device, its address and its fou port as
/// planned (any phase; the caller sorts), the device sized after `uplink` (the link holding
/// the tunnel's local address). Returns whether the device is (re-)created.
pub(super) fn ops(
    t: &Ipv4Tunnel,
    uplink: &ObservedLink,
    observed: &ObservedNode,
    ops: &mut Vec<Op>,
) -> bool {
    let mtu = uplink.mtu.saturating_sub(IPV4_FOU_OVERHEAD);
    let sit = planned_sit(t);
    let name = IPV4_TUNNEL.to_string();
    let have = observed.links.get(IPV4_TUNNEL);
    // The global addresses Lace gives it (the kernel adds `::<local>/96` itself).
    let held: BTreeSet<Ipv6Addr> = have
        .map(|l| {
            observed
                .addrs
                .iter()
                .filter_map(|(a, i)| match a {
                    IpAddr::V6(v6) if *i == l.index => Some(*v6),
                    _ => None,
                })
                .filter(|a| !a.is_unicast_link_local() && a.to_ipv4().is_none())
                .collect()
        })
        .unwrap_or_default();
    let created = match have {
        Some(l) if l.sit == Some(sit) && held == t.address.into_iter().collect() => {
            if l.mtu != mtu {
                ops.push(Op::SetMtu {
                    name: name.clone(),
                    mtu,
                });
            }
            if !l.up {
                ops.push(Op::TunnelUp { name: name.clone() });
            }
            false
        }
        other => {
            if other.is_some() {
                ops.push(Op::ReplaceLink { name: name.clone() });
            }
            ops.push(Op::AddTunnel {
                name: name.clone(),
                sit,
                mtu,
            });
            if let Some(a) = t.address {
                ops.push(Op::AddAddress {
                    link: name.clone(),
                    addr: IpNet::V6(Ipv6Net::from(a)),
                });
            }
            ops.push(Op::TunnelUp { name });
            true
        }
    };
    let ours = FouListener::direct_v4(FOU_PORT, FOU_IPPROTO);
    // Not read (no tunnel device yet): added; a listener that exists is fine.
    let listeners = observed.fou.as_deref().unwrap_or_default();
    if !listeners.contains(&ours) {
        ops.push(Op::AddFou {
            listener: ours,
            replace: listeners
                .iter()
                .any(|l| l.port == ours.port && l.family == ours.family),
        });
    }
    created
}
