//! The pod's end of an attachment, inside the pod's network namespace: what CNI ADD creates
//! there, what DEL removes and what CHECK reads. Each runs on a thread that entered the pod's
//! namespace for the one request ([`super::netns::run_in`]), with a blocking rtnetlink socket
//! of its own and the messages of [`super::msg`]: the same stack as the reconciler's, with one
//! batch for all of the pod side's configuration.
//!
//! The host end of the pair lands in the node's namespace at creation; everything done to it
//! there (VRF, routes) is the reconciler's ([`super::Reconciler::attach`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::route::RouteMessage;
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::apply::OpFailure;
use super::host;
use super::msg;
use super::nl::{Nl, NlError};
use super::observe::{classify_route, dump_address_messages, Route};
use super::observed::{KernelNexthop, LinkName};
use crate::plan::{disable_ipv6_key, RouteKey, MAIN_TABLE};

/// The pods' IPv4 default gateway: link-local, never in a block, the same in every pod.
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pods' IPv6 default gateway (also the source of IPv6 kubelet probes, which the
/// reconciler puts on the host end of the veth).
pub const GATEWAY_V6: Ipv6Addr = crate::plan::POD_GATEWAY_V6;

/// The gateway of a pod address's family.
pub fn gateway(of: IpAddr) -> IpAddr {
    match of {
        IpAddr::V4(_) => IpAddr::V4(GATEWAY_V4),
        IpAddr::V6(_) => IpAddr::V6(GATEWAY_V6),
    }
}

/// The pod's interface as ADD creates it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInterface {
    /// Its name in the pod (`CNI_IFNAME`).
    pub ifname: String,
    /// The name of the pair's other end, created in the node's namespace (`lp-…`).
    pub host_ifname: String,
    /// Of both ends.
    pub mtu: u32,
    /// Of the host end, chosen by the caller, so the pod's gateway neighbour entries can be
    /// written without asking the node's namespace.
    pub host_mac: [u8; 6],
    /// The pod's addresses (`/32`, `/128`).
    pub ips: Vec<IpNet>,
}

/// What CHECK reads of a link: whether it is up, its MTU, addresses, and the routes through
/// it in the main table (destination, gateway).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodLinkState {
    pub up: bool,
    pub mtu: Option<u32>,
    pub addresses: Vec<IpNet>,
    pub routes: Vec<(IpNet, Option<IpAddr>)>,
}

fn failure(op: String, errno: i32) -> OpFailure {
    OpFailure {
        op,
        error: format!(
            "{} (errno {errno})",
            std::io::Error::from_raw_os_error(errno)
        ),
    }
}

/// Why the pod side could not be made: a netlink failure, or the kernel refusing some of the
/// requests (each named).
#[derive(Debug)]
pub enum PodFailure {
    Netlink(NlError),
    Refused(Vec<OpFailure>),
}

impl From<NlError> for PodFailure {
    fn from(e: NlError) -> Self {
        Self::Netlink(e)
    }
}

/// The pod's routes: `169.254.1.1/32 dev <if> scope link` and `default via 169.254.1.1 dev
/// <if>` for IPv4, `default via fe80::1 dev <if>` for IPv6, in the main table.
pub fn routes(ifname: &str, ips: &[IpNet]) -> Vec<(RouteKey, KernelNexthop)> {
    let main = |dst: IpNet| RouteKey::new(MAIN_TABLE, dst);
    let mut out = Vec::new();
    if ips.iter().any(|ip| ip.addr().is_ipv4()) {
        out.push((
            main(IpNet::from(IpAddr::V4(GATEWAY_V4))),
            KernelNexthop::Dev(ifname.into()),
        ));
        out.push((
            main(IpNet::V4(Default::default())),
            KernelNexthop::Via {
                via: IpAddr::V4(GATEWAY_V4),
                dev: ifname.into(),
            },
        ));
    }
    if ips.iter().any(|ip| ip.addr().is_ipv6()) {
        out.push((
            main(IpNet::V6(Default::default())),
            KernelNexthop::Via {
                via: IpAddr::V6(GATEWAY_V6),
                dev: ifname.into(),
            },
        ));
    }
    out
}

/// The sysctls the pod's side needs before its addresses, by key: when the pod gets an IPv6
/// address, IPv6 enabled on its interface and on its loopback. A pod namespace whose `default`
/// disables IPv6 (a host with `net.core.devconf_inherit_init_net=1` and IPv6 disabled, or a
/// runtime that sets it) gives the new interface `disable_ipv6=1`, and the kernel then refuses
/// the pod's IPv6 address and its route via `fe80::1`. The reference CNI plugins enable the
/// same two (`ipam.ConfigureIface`). Each is written only where it differs, and the host end of
/// the veth is the node's business ([`super::diff::pod_link_sysctls`]).
pub fn sysctls(pod: &PodInterface) -> Vec<(String, &'static str)> {
    if !pod.ips.iter().any(|ip| ip.addr().is_ipv6()) {
        return Vec::new();
    }
    let mut devices = vec!["lo", pod.ifname.as_str()];
    devices.dedup();
    devices
        .into_iter()
        .map(|dev| (disable_ipv6_key(dev), "0"))
        .collect()
}

/// Writes `sysctls` (on the calling thread, so in its network namespace) where the value
/// read differs; one failure per sysctl that could not be written. A sysctl that does not
/// exist is left alone (a kernel without IPv6 has no `net.ipv6`: the address itself fails then,
/// naming the address).
fn write_sysctls(sysctls: &[(String, &'static str)]) -> Vec<OpFailure> {
    let mut failures = Vec::new();
    for (key, value) in sysctls {
        match host::read_sysctl(key) {
            Some(v) if v != *value => {
                if let Err(e) = host::write_sysctl(key, value) {
                    failures.push(OpFailure {
                        op: format!("sysctl {key}={value} (in the pod's namespace: the pod gets IPv6, which the namespace disables on new devices)"),
                        error: e.to_string(),
                    });
                }
            }
            _ => {}
        }
    }
    failures
}

/// Creates the pair (its host end straight into the namespace of `node_ns`, an open
/// namespace file descriptor) and configures the pod end; returns the pod end's MAC, or
/// `None` if a link of either name exists already (nothing was created).
///
/// `ip link add <ifname> mtu <mtu> type veth peer name <host> mtu <mtu> address <host_mac>
/// netns <node>`, the pod side's [`sysctls`], then in one batch: `ip addr add <ip> dev
/// <ifname>` (IPv6 `nodad`), `ip
/// link set <ifname> up`, `ip neigh replace 169.254.1.1 lladdr <host_mac> dev <ifname> nud
/// permanent` (and `fe80::1`) and the [`routes`]. The gateways' neighbour entries are
/// permanent so the pod never depends on the host end answering ARP/NDP for an address that
/// is not routable in the VRF (a VRF table may end in `unreachable default`).
pub fn create(
    nl: &mut Nl,
    pod: &PodInterface,
    node_ns: std::os::fd::RawFd,
) -> Result<Option<Vec<u8>>, PodFailure> {
    let create = msg::veth(
        &pod.ifname,
        &pod.host_ifname,
        pod.mtu,
        pod.host_mac,
        node_ns,
    );
    let ack = nl.batch(vec![(
        RouteNetlinkMessage::NewLink(create),
        NLM_F_CREATE | NLM_F_EXCL,
    )])?;
    match ack.first() {
        Some(Err(errno)) if *errno == libc::EEXIST => return Ok(None),
        Some(Err(errno)) => {
            return Err(PodFailure::Refused(vec![failure(
                format!(
                    "link add {} mtu {} type veth peer name {} (into the node's namespace)",
                    pod.ifname, pod.mtu, pod.host_ifname
                ),
                *errno,
            )]))
        }
        _ => {}
    }
    let link = match nl.get(
        "the pod's new interface",
        RouteNetlinkMessage::GetLink(msg::link_by_name(&pod.ifname)),
    )? {
        Some(RouteNetlinkMessage::NewLink(l)) => l,
        _ => {
            return Err(PodFailure::Refused(vec![OpFailure {
                op: format!("link show {}", pod.ifname),
                error: "created, but the kernel does not know it".into(),
            }]))
        }
    };
    let index = link.header.index;
    let failures = write_sysctls(&sysctls(pod));
    if !failures.is_empty() {
        return Err(PodFailure::Refused(failures));
    }
    let mut requests: Vec<(RouteNetlinkMessage, u16, String)> = Vec::new();
    for ip in &pod.ips {
        requests.push((
            RouteNetlinkMessage::NewAddress(msg::address(index, ip)),
            NLM_F_CREATE | NLM_F_EXCL,
            format!("addr add {ip} dev {}", pod.ifname),
        ));
    }
    let mut up = msg::link_by_index(index);
    up.header.flags = LinkFlags::Up;
    up.header.change_mask = LinkFlags::Up;
    requests.push((
        RouteNetlinkMessage::SetLink(up),
        0,
        format!("link set {} up", pod.ifname),
    ));
    let mut gateways: Vec<IpAddr> = pod.ips.iter().map(|ip| gateway(ip.addr())).collect();
    gateways.dedup();
    for gw in gateways {
        requests.push((
            RouteNetlinkMessage::NewNeighbour(msg::permanent_neighbour(index, gw, &pod.host_mac)),
            NLM_F_CREATE | NLM_F_REPLACE,
            format!("neigh replace {gw} dev {} nud permanent", pod.ifname),
        ));
    }
    let idx = |name: &str| (name == pod.ifname).then_some(index);
    for (key, nh) in routes(&pod.ifname, &pod.ips) {
        let m = msg::route(&key, Some(&nh), &idx).map_err(|error| {
            PodFailure::Refused(vec![OpFailure {
                op: format!("route replace {} {nh}", key.dst),
                error: error.to_string(),
            }])
        })?;
        requests.push((
            RouteNetlinkMessage::NewRoute(m),
            NLM_F_CREATE | NLM_F_REPLACE,
            format!("route replace {} {nh}", key.dst),
        ));
    }
    let (messages, names): (Vec<_>, Vec<_>) = requests
        .into_iter()
        .map(|(m, flags, name)| ((m, flags), name))
        .unzip();
    let acks = nl.batch(messages)?;
    let failures: Vec<OpFailure> = names
        .into_iter()
        .zip(acks)
        .filter_map(|(name, ack)| match ack {
            // A retried ADD may find the address on a link it recreated: as wanted.
            Err(errno) if errno != libc::EEXIST || !name.starts_with("addr") => {
                Some(failure(name, errno))
            }
            _ => None,
        })
        .collect();
    if !failures.is_empty() {
        return Err(PodFailure::Refused(failures));
    }
    Ok(Some(mac_of(&link).to_vec()))
}

fn mac_of(link: &LinkMessage) -> &[u8] {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(m) => Some(m.as_slice()),
            _ => None,
        })
        .unwrap_or_default()
}

/// `ip link del <name>` for each of `names`; returns those that existed. Deleting one end of
/// a veth deletes the other.
pub fn delete_links(nl: &mut Nl, names: &[String]) -> Result<Vec<String>, PodFailure> {
    let acks = nl.batch(
        names
            .iter()
            .map(|n| (RouteNetlinkMessage::DelLink(msg::link_by_name(n)), 0))
            .collect(),
    )?;
    let mut deleted = Vec::new();
    let mut failures = Vec::new();
    for (name, ack) in names.iter().zip(acks) {
        match ack {
            Ok(()) => deleted.push(name.clone()),
            // Gone already (its peer went first, or never made).
            Err(errno) if errno == libc::ENODEV => {}
            Err(errno) => failures.push(failure(format!("link del {name}"), errno)),
        }
    }
    if failures.is_empty() {
        Ok(deleted)
    } else {
        Err(PodFailure::Refused(failures))
    }
}

/// The `loopback` plugin's ADD in a pod's namespace: `ip link set lo up` (the kernel then
/// gives it 127.0.0.1/8, and ::1/128 where IPv6 is on), then what [`inspect`] reads of it.
pub fn loopback_up(nl: &mut Nl) -> Result<PodLinkState, PodFailure> {
    let acks = nl.batch(vec![(RouteNetlinkMessage::SetLink(msg::link_up("lo")), 0)])?;
    if let Some(Err(errno)) = acks.first() {
        return Err(PodFailure::Refused(vec![failure(
            "link set lo up".to_owned(),
            *errno,
        )]));
    }
    inspect(nl, "lo")?.ok_or_else(|| {
        PodFailure::Refused(vec![OpFailure {
            op: "link show lo".to_owned(),
            error: "set up, but the kernel does not know it".into(),
        }])
    })
}

/// `ip addr show dev <ifname>` and `ip route show dev <ifname>` (main table), or `None` if
/// there is no such link.
pub fn inspect(nl: &mut Nl, ifname: &str) -> Result<Option<PodLinkState>, NlError> {
    let Some(RouteNetlinkMessage::NewLink(link)) = nl.get(
        "the pod's interface",
        RouteNetlinkMessage::GetLink(msg::link_by_name(ifname)),
    )?
    else {
        return Ok(None);
    };
    let index = link.header.index;
    let mut state = PodLinkState {
        up: link.header.flags.contains(LinkFlags::Up),
        mtu: link.attributes.iter().find_map(|a| match a {
            LinkAttribute::Mtu(m) => Some(*m),
            _ => None,
        }),
        ..Default::default()
    };
    for a in dump_address_messages(nl)?
        .iter()
        .filter(|a| a.header.index == index)
    {
        for attr in &a.attributes {
            if let AddressAttribute::Address(ip) = attr {
                if let Ok(net) = IpNet::new(*ip, a.header.prefix_len) {
                    state.addresses.push(net);
                }
            }
        }
    }
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        let names = [(index, LinkName::from(ifname))].into_iter().collect();
        for m in nl.dump("routes", RouteNetlinkMessage::GetRoute(req))? {
            let RouteNetlinkMessage::NewRoute(r) = m else {
                continue;
            };
            if let Some((dst, via)) = main_route_via(r, index, &names) {
                state.routes.push((dst, via));
            }
        }
    }
    Ok(Some(state))
}

/// A main-table route through link `index`: its destination and gateway.
fn main_route_via(
    r: RouteMessage,
    index: u32,
    names: &std::collections::BTreeMap<u32, LinkName>,
) -> Option<(IpNet, Option<IpAddr>)> {
    let through = r
        .attributes
        .iter()
        .any(|a| matches!(a, netlink_packet_route::route::RouteAttribute::Oif(i) if *i == index));
    if !through {
        return None;
    }
    match classify_route(&r.into(), names) {
        Route::Lace(key, nh) if key.table == MAIN_TABLE => Some((
            key.dst,
            match nh {
                KernelNexthop::Via { via, .. } => Some(via),
                _ => None,
            },
        )),
        Route::Host(_, h) => Some((h.dst, h.gateway)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ips: &[&str]) -> PodInterface {
        PodInterface {
            ifname: "eth0".into(),
            host_ifname: "lp-0123456789a".into(),
            mtu: 1408,
            host_mac: [2, 0, 0, 0, 0, 1],
            ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn only_a_pod_with_ipv6_gets_ipv6_enabled_on_its_interface_and_loopback() {
        assert_eq!(sysctls(&pod(&["10.244.0.10/32"])), vec![]);
        let want = vec![
            ("net.ipv6.conf.lo.disable_ipv6".to_string(), "0"),
            ("net.ipv6.conf.eth0.disable_ipv6".to_string(), "0"),
        ];
        assert_eq!(sysctls(&pod(&["10.244.0.10/32", "fd00:244::a/128"])), want);
        assert_eq!(sysctls(&pod(&["fd00:244::a/128"])), want);
        // Never the host end: that one is the node's (the diff's).
        assert!(sysctls(&pod(&["fd00:244::a/128"]))
            .iter()
            .all(|(k, _)| !k.contains("lp-")));
    }
}
