//! Netlink inside a given network namespace: the node's (`--netns`, or the agent's own) and
//! each pod's.
//!
//! `setns(2)` changes the namespace of the calling *thread* only, so every piece of work runs
//! on a fresh OS thread that has entered the namespace, with its own current-thread tokio
//! runtime and its own rtnetlink socket (a netlink socket belongs to the namespace it was
//! opened in). The thread lives for one request: creating one costs well under a
//! millisecond, far less than the netlink round trips of an ADD. Sysctls under
//! `/proc/sys/net` are resolved against the opening thread's namespace, so they are written
//! from the same thread.
//!
//! Each operation's doc comment names its `ip` equivalent.

use std::fs::File;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::address::{AddressAttribute, AddressFlags};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVrf, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::NeighbourState;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope,
};
use netlink_packet_route::AddressFamily;
use nix::sched::CloneFlags;
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, LinkVrf, RouteMessageBuilder};

/// Protocol of the pod host routes the agent installs directly at ADD (`proto static`). The
/// reconciler must treat a route with the planned key and next hop as equal whatever its
/// protocol, or use the same one.
pub const POD_ROUTE_PROTOCOL: RouteProtocol = RouteProtocol::Static;
/// The pods' IPv4 default gateway: link-local, never in a block, the same in every pod.
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pods' IPv6 default gateway (also the source of IPv6 kubelet probes, which the
/// reconciler puts on the host end of the veth).
pub const GATEWAY_V6: Ipv6Addr = crate::plan::POD_GATEWAY_V6;

const ENODEV: i32 = 19;
const EEXIST: i32 = 17;
const ESRCH: i32 = 3;
const ENOENT: i32 = 2;

/// Why a netlink operation failed. Each names the interface, namespace or route.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot enter network namespace {path}: {errno}")]
    Enter {
        path: PathBuf,
        errno: nix::errno::Errno,
    },
    #[error("cannot start the netlink worker for {path}: {source}")]
    Worker {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the netlink worker for {0} stopped without an answer")]
    WorkerLost(PathBuf),
    #[error("{what}: {source}")]
    Netlink {
        what: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("sysctl {path}: {source}")]
    Sysctl {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("interface {0:?} does not exist")]
    NoSuchLink(String),
    #[error("VRF {name:?} uses table {found:?}, but its Network's table is {expected}")]
    WrongTable {
        name: String,
        found: Option<u32>,
        expected: u32,
    },
    #[error("interface {name:?} exists but is a {found}, expected a {expected}")]
    WrongKind {
        name: String,
        found: String,
        expected: &'static str,
    },
}

/// The errno of a netlink error, if the kernel sent one.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

fn nl(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetnsError {
    let what = what.into();
    move |source| NetnsError::Netlink { what, source }
}

/// A network namespace to work in, kept open so it stays the same namespace even if its path
/// is unmounted meanwhile.
#[derive(Clone, Debug)]
pub struct Netns {
    /// The namespace, for `IFLA_NET_NS_FD` (moving or creating links into it).
    file: Arc<File>,
    /// Whether workers must `setns` into it (not for the agent's own namespace).
    enter: bool,
    path: PathBuf,
}

impl Netns {
    /// The calling thread's namespace, captured now: call it from a thread that has not
    /// entered another namespace (the agent's main thread). Workers run in it without `setns`.
    pub fn current() -> Result<Self, NetnsError> {
        let path = PathBuf::from("/proc/thread-self/ns/net");
        let file = File::open(&path).map_err(|source| NetnsError::Open {
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            file: Arc::new(file),
            enter: false,
            path,
        })
    }

    /// The namespace at `path` (`/run/netns/x`, `/proc/<pid>/ns/net`).
    pub fn open(path: &Path) -> Result<Self, NetnsError> {
        let file = File::open(path).map_err(|source| NetnsError::Open {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            file: Arc::new(file),
            enter: true,
            path: path.to_owned(),
        })
    }

    /// Path the namespace was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` with a netlink handle inside this namespace, on a dedicated thread.
    pub async fn run<T, F, Fut>(&self, work: F) -> Result<T, NetnsError>
    where
        T: Send + 'static,
        F: FnOnce(Handle) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, NetnsError>>,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let file = self.enter.then(|| Arc::clone(&self.file));
        let path = self.path.clone();
        let thread_path = path.clone();
        std::thread::Builder::new()
            .name("lace-netns".into())
            .spawn(move || {
                let _ = tx.send(run_here(file.as_deref(), &thread_path, work));
            })
            .map_err(|source| NetnsError::Worker {
                path: path.clone(),
                source,
            })?;
        rx.await.map_err(|_| NetnsError::WorkerLost(path))?
    }
}

fn run_here<T, F, Fut>(file: Option<&File>, path: &Path, work: F) -> Result<T, NetnsError>
where
    F: FnOnce(Handle) -> Fut,
    Fut: Future<Output = Result<T, NetnsError>>,
{
    if let Some(f) = file {
        nix::sched::setns(f, CloneFlags::CLONE_NEWNET).map_err(|errno| NetnsError::Enter {
            path: path.to_owned(),
            errno,
        })?;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| NetnsError::Worker {
            path: path.to_owned(),
            source,
        })?;
    rt.block_on(async {
        let (conn, handle, _) =
            rtnetlink::new_connection().map_err(|source| NetnsError::Worker {
                path: path.to_owned(),
                source,
            })?;
        tokio::spawn(conn);
        work(handle).await
    })
}

/// `ip link show <name>`: the link, or `None` if there is none.
pub async fn link_by_name(h: &Handle, name: &str) -> Result<Option<LinkMessage>, NetnsError> {
    match h
        .link()
        .get()
        .match_name(name.to_owned())
        .execute()
        .try_next()
        .await
    {
        Ok(link) => Ok(link),
        Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
        Err(e) => Err(nl(format!("looking up interface {name:?}"))(e)),
    }
}

/// `ip link show`: the names of every link starting with `prefix`.
pub async fn links_with_prefix(h: &Handle, prefix: &str) -> Result<Vec<String>, NetnsError> {
    let mut out = Vec::new();
    let mut links = h.link().get().execute();
    while let Some(link) = links.try_next().await.map_err(nl("listing interfaces"))? {
        if let Some(name) = link_name(&link) {
            if name.starts_with(prefix) {
                out.push(name.to_owned());
            }
        }
    }
    Ok(out)
}

/// The link's name.
pub fn link_name(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.as_str()),
        _ => None,
    })
}

/// The link's hardware address.
pub fn link_mac(link: &LinkMessage) -> Option<&[u8]> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(m) => Some(m.as_slice()),
        _ => None,
    })
}

/// The link's MTU.
pub fn link_mtu(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Mtu(m) => Some(*m),
        _ => None,
    })
}

/// The index of the link's controller (`master`), e.g. its VRF.
pub fn link_controller(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Controller(c) => Some(*c),
        _ => None,
    })
}

fn link_kind(link: &LinkMessage) -> Option<&InfoKind> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
            LinkInfo::Kind(k) => Some(k),
            _ => None,
        }),
        _ => None,
    })
}

fn vrf_table_of(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
            LinkInfo::Data(InfoData::Vrf(v)) => v.iter().find_map(|x| match x {
                InfoVrf::TableId(t) => Some(*t),
                _ => None,
            }),
            _ => None,
        }),
        _ => None,
    })
}

/// Formats a MAC for CNI results (`aa:bb:cc:dd:ee:ff`).
pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `ip link del <name>`; `false` if there was no such link.
pub async fn delete_link(h: &Handle, name: &str) -> Result<bool, NetnsError> {
    let Some(link) = link_by_name(h, name).await? else {
        return Ok(false);
    };
    match h.link().del(link.header.index).execute().await {
        Ok(()) => Ok(true),
        // Deleted meanwhile (its peer went first, or its namespace died).
        Err(e) if errno(&e) == Some(ENODEV) => Ok(false),
        Err(e) => Err(nl(format!("deleting interface {name:?}"))(e)),
    }
}

/// `ip link add <name> mtu <mtu> type veth peer name <peer> mtu <mtu> address <peer_mac>
/// netns <peer_ns>`: one request creates the pair with the peer (the host side) already in
/// the node's namespace, so there is no separate move, and with a MAC chosen by the caller,
/// so the pod side can be pointed at it without asking the other namespace. `false` (nothing
/// created) if either name is taken in its namespace (EEXIST).
pub async fn create_veth(
    h: &Handle,
    name: &str,
    peer: &str,
    mtu: u32,
    peer_mac: [u8; 6],
    peer_ns: &Netns,
) -> Result<bool, NetnsError> {
    let peer_msg = LinkMessageBuilder::<LinkUnspec>::new()
        .name(peer.to_owned())
        .mtu(mtu)
        .address(peer_mac.to_vec())
        .setns_by_fd(peer_ns.file.as_raw_fd())
        .build();
    let msg = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
        .name(name.to_owned())
        .mtu(mtu)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
        .build();
    match h.link().add(msg).execute().await {
        Ok(()) => Ok(true),
        Err(e) if errno(&e) == Some(EEXIST) => Ok(false),
        Err(e) => Err(nl(format!(
            "creating veth {name:?} with peer {peer:?} in namespace {}",
            peer_ns.path().display()
        ))(e)),
    }
}

/// Inside the pod: `ip addr add <ip> dev <ifname>` (IPv6 `nodad`), `ip link set <ifname> up`,
/// `ip neigh replace 169.254.1.1 lladdr <host mac> dev <ifname> nud permanent` (and
/// `fe80::1`), `ip route add 169.254.1.1/32 dev <ifname> scope link`,
/// `ip route add default via 169.254.1.1 dev <ifname>` and
/// `ip -6 route add default via fe80::1 dev <ifname>`.
///
/// The gateway's neighbour entries are permanent so the pod never depends on the host end
/// answering ARP/NDP for an address that is not routable in the VRF (a VRF table may end in
/// `unreachable default`, which stops proxy ARP from answering).
pub async fn configure_pod_side(
    h: &Handle,
    ifname: &str,
    ips: &[IpNet],
    host_mac: &[u8],
) -> Result<LinkMessage, NetnsError> {
    let link = link_by_name(h, ifname)
        .await?
        .ok_or_else(|| NetnsError::NoSuchLink(ifname.to_owned()))?;
    let index = link.header.index;
    for ip in ips {
        let mut req = h.address().add(index, ip.addr(), ip.prefix_len());
        if ip.addr().is_ipv6() {
            req.message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        match req.execute().await {
            Ok(()) => {}
            Err(e) if errno(&e) == Some(EEXIST) => {}
            Err(e) => return Err(nl(format!("adding {ip} to {ifname:?}"))(e)),
        }
    }
    h.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(nl(format!("setting {ifname:?} up")))?;
    let has_v4 = ips.iter().any(|ip| ip.addr().is_ipv4());
    let has_v6 = ips.iter().any(|ip| ip.addr().is_ipv6());
    let mut gateways = Vec::new();
    if has_v4 {
        gateways.push(IpAddr::V4(GATEWAY_V4));
    }
    if has_v6 {
        gateways.push(IpAddr::V6(GATEWAY_V6));
    }
    for gw in &gateways {
        h.neighbours()
            .add(index, *gw)
            .link_layer_address(host_mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(nl(format!("adding neighbour {gw} on {ifname:?}")))?;
    }
    if has_v4 {
        let onlink = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(GATEWAY_V4, 32)
            .output_interface(index)
            .scope(RouteScope::Link)
            .build();
        let default = RouteMessageBuilder::<Ipv4Addr>::new()
            .gateway(GATEWAY_V4)
            .output_interface(index)
            .build();
        for route in [onlink, default] {
            h.route()
                .add(route)
                .replace()
                .execute()
                .await
                .map_err(nl(format!("adding the IPv4 gateway routes on {ifname:?}")))?;
        }
    }
    if has_v6 {
        let default = RouteMessageBuilder::<Ipv6Addr>::new()
            .gateway(GATEWAY_V6)
            .output_interface(index)
            .build();
        h.route()
            .add(default)
            .replace()
            .execute()
            .await
            .map_err(nl(format!("adding the IPv6 default route on {ifname:?}")))?;
    }
    Ok(link)
}

/// `ip link add <name> type vrf table <table>; ip link set <name> up` unless a VRF of that
/// name exists; returns its index. A concurrent creator winning the race is fine.
pub async fn ensure_vrf(h: &Handle, name: &str, table: u32) -> Result<u32, NetnsError> {
    if let Some(link) = link_by_name(h, name).await? {
        return vrf_index(&link, name, table);
    }
    match h
        .link()
        .add(LinkVrf::new(name, table).up().build())
        .execute()
        .await
    {
        Ok(()) => {}
        Err(e) if errno(&e) == Some(EEXIST) => {}
        Err(e) => return Err(nl(format!("creating VRF {name:?} (table {table})"))(e)),
    }
    let link = link_by_name(h, name)
        .await?
        .ok_or_else(|| NetnsError::NoSuchLink(name.to_owned()))?;
    vrf_index(&link, name, table)
}

/// The index of VRF `name`, which must use `table`.
fn vrf_index(link: &LinkMessage, name: &str, table: u32) -> Result<u32, NetnsError> {
    match link_kind(link) {
        Some(InfoKind::Vrf) => match vrf_table_of(link) {
            Some(t) if t == table => Ok(link.header.index),
            found => Err(NetnsError::WrongTable {
                name: name.to_owned(),
                found,
                expected: table,
            }),
        },
        other => Err(NetnsError::WrongKind {
            name: name.to_owned(),
            found: other.map_or_else(|| "link without kind".into(), |k| k.to_string()),
            expected: "vrf",
        }),
    }
}

/// On the node: `ip link set <host> master <vrf> up`, `sysctl
/// net.ipv4.conf.<host>.proxy_arp=1` and `net.ipv4.neigh.<host>.proxy_delay=0` (answers
/// ARP for addresses routed elsewhere, as the issue asks, even though the pod's gateway entry
/// is permanent), and `ip route replace <ip> dev <host> table <table> scope link proto static`
/// for each pod address.
pub async fn configure_host_side(
    h: &Handle,
    host: &str,
    vrf_index: u32,
    table: u32,
    ips: &[IpNet],
) -> Result<(), NetnsError> {
    let link = link_by_name(h, host)
        .await?
        .ok_or_else(|| NetnsError::NoSuchLink(host.to_owned()))?;
    let index = link.header.index;
    write_sysctl(&format!("net/ipv4/conf/{host}/proxy_arp"), "1")?;
    write_sysctl(&format!("net/ipv4/neigh/{host}/proxy_delay"), "0")?;
    h.link()
        .set(
            LinkUnspec::new_with_index(index)
                .controller(vrf_index)
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(nl(format!(
            "enslaving {host:?} to its VRF and setting it up"
        )))?;
    for ip in ips {
        h.route()
            .add(host_route(*ip, index, table))
            .replace()
            .execute()
            .await
            .map_err(nl(format!("adding route {ip} dev {host} table {table}")))?;
    }
    Ok(())
}

fn host_route(ip: IpNet, oif: u32, table: u32) -> RouteMessage {
    match ip.addr() {
        IpAddr::V4(a) => RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(a, 32)
            .output_interface(oif)
            .table_id(table)
            .scope(RouteScope::Link)
            .protocol(POD_ROUTE_PROTOCOL)
            .build(),
        IpAddr::V6(a) => RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(a, 128)
            .output_interface(oif)
            .table_id(table)
            .protocol(POD_ROUTE_PROTOCOL)
            .build(),
    }
}

/// `sysctl -w <key>=<value>` (key with `/` separators, under `/proc/sys` or where the chart
/// mounts the host's, see [`crate::dataplane::host::proc_sys`]) in the calling thread's
/// namespace.
fn write_sysctl(key: &str, value: &str) -> Result<(), NetnsError> {
    let path = crate::dataplane::host::proc_sys().join(key);
    std::fs::write(&path, value).map_err(|source| NetnsError::Sysctl { path, source })
}

/// What CHECK looks at on one side of the veth.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkState {
    pub index: u32,
    pub up: bool,
    pub mtu: Option<u32>,
    pub controller: Option<u32>,
    pub addresses: Vec<IpNet>,
    /// Destinations of routes through this link in `table` (main for the pod side).
    pub routes: Vec<(IpNet, Option<IpAddr>)>,
}

/// `ip addr show dev <name>` and `ip route show table <table> dev <name>`, or `None` if the
/// link does not exist.
pub async fn link_state(
    h: &Handle,
    name: &str,
    table: u32,
) -> Result<Option<LinkState>, NetnsError> {
    let Some(link) = link_by_name(h, name).await? else {
        return Ok(None);
    };
    let index = link.header.index;
    let mut state = LinkState {
        index,
        up: link.header.flags.contains(LinkFlags::Up),
        mtu: link_mtu(&link),
        controller: link_controller(&link),
        ..Default::default()
    };
    let mut addrs = h.address().get().set_link_index_filter(index).execute();
    while let Some(a) = addrs
        .try_next()
        .await
        .map_err(nl(format!("listing addresses of {name:?}")))?
    {
        let ip = a.attributes.iter().find_map(|x| match x {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        if let Some(ip) = ip {
            if let Ok(net) = IpNet::new(ip, a.header.prefix_len) {
                state.addresses.push(net);
            }
        }
    }
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut query = RouteMessage::default();
        query.header.address_family = family;
        let mut routes = h.route().get(query).execute();
        while let Some(r) = routes
            .try_next()
            .await
            .map_err(nl(format!("listing routes of {name:?}")))?
        {
            if route_table(&r) != table || route_oif(&r) != Some(index) {
                continue;
            }
            let dst = route_dst(&r);
            let gw = r.attributes.iter().find_map(|x| match x {
                RouteAttribute::Gateway(RouteAddress::Inet(a)) => Some(IpAddr::V4(*a)),
                RouteAttribute::Gateway(RouteAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
                _ => None,
            });
            if let Some(dst) = dst {
                state.routes.push((dst, gw));
            }
        }
    }
    Ok(Some(state))
}

fn route_table(r: &RouteMessage) -> u32 {
    r.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(r.header.table))
}

fn route_oif(r: &RouteMessage) -> Option<u32> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        _ => None,
    })
}

fn route_dst(r: &RouteMessage) -> Option<IpNet> {
    let len = r.header.destination_prefix_length;
    let addr = r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(a)) => Some(IpAddr::V4(*a)),
        RouteAttribute::Destination(RouteAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
        _ => None,
    });
    match (addr, r.header.address_family) {
        (Some(a), _) => IpNet::new(a, len).ok(),
        (None, AddressFamily::Inet) => IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0).ok(),
        (None, AddressFamily::Inet6) => IpNet::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0).ok(),
        _ => None,
    }
}

/// The VRF's table id (`ip -d link show <vrf>`), for CHECK.
pub async fn vrf_table(h: &Handle, index: u32) -> Result<Option<(String, u32)>, NetnsError> {
    match h.link().get().match_index(index).execute().try_next().await {
        Ok(Some(link)) => {
            Ok(vrf_table_of(&link).map(|t| (link_name(&link).unwrap_or_default().to_owned(), t)))
        }
        Ok(None) => Ok(None),
        Err(e) if matches!(errno(&e), Some(ENODEV) | Some(ESRCH) | Some(ENOENT)) => Ok(None),
        Err(e) => Err(nl(format!("looking up link {index}"))(e)),
    }
}

/// The MTU of the link that holds `addr` (`ip -o addr show to <addr>`), if any.
pub async fn mtu_of_address(h: &Handle, addr: IpAddr) -> Result<Option<u32>, NetnsError> {
    let mut addrs = h.address().get().execute();
    let mut index = None;
    while let Some(a) = addrs.try_next().await.map_err(nl("listing addresses"))? {
        let hit = a.attributes.iter().any(|x| match x {
            AddressAttribute::Address(ip) | AddressAttribute::Local(ip) => *ip == addr,
            _ => false,
        });
        if hit {
            index = Some(a.header.index);
        }
    }
    let Some(index) = index else {
        return Ok(None);
    };
    match h.link().get().match_index(index).execute().try_next().await {
        Ok(link) => Ok(link.as_ref().and_then(link_mtu)),
        Err(e) => Err(nl(format!("looking up link {index}"))(e)),
    }
}
