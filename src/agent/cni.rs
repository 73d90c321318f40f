//! The CNI verbs on the agent side: ADD, DEL, CHECK, STATUS, GC, and the `loopback`
//! plugin's ADD and CHECK (`lo` up in the sandbox; no cluster state needed).
//!
//! Error codes the agent answers (the plugin prints them unchanged):
//! - 3 (unknown container): CHECK of an attachment the agent has no record of;
//! - 4 (invalid environment): a request without the container id, ifname or netns the verb
//!   needs (the plugin validates these first, so only a foreign client sees it);
//! - 11 (try again later): ADD while the agent is not ready, the pod matches no
//!   NetworkBindingPolicy, or its Network has no block on this node yet — each is fixed by a
//!   state change, after which the runtime's retry succeeds;
//! - 50 (not available): STATUS while not ready;
//! - 100: CHECK found the pod's network different from what ADD made (the message says what);
//! - 101: a kernel operation failed (the message names interface, route or namespace);
//! - 102: IPAM failed (exhausted block, state file not writable).
//!
//! DEL never fails for missing things: unknown container, missing netns, half-created pod
//! all succeed after cleaning what exists.
//!
//! Every kernel read and write goes through the agent's [`Dataplane`]: ADD creates the veth
//! pair and configures the pod end in the pod's namespace, then has the dataplane apply the
//! pod's part of the plan on the node ([`Dataplane::attach`]); DEL, GC and the start-up check
//! delete veths through it; CHECK reads the pod end in its namespace and the host end from
//! the dataplane's memory of the node.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;

use super::ipam::{AttachmentKey, Claim, IpamError, Record};
use super::{Agent, Dataplane};
use crate::binding;
use crate::dataplane::{gateway, DataplaneError, PodInterface};
use crate::hash::fnv1a64;
use crate::plan::shaping::shaper_name;
use crate::plan::POD_LINK_PREFIX;
use crate::plan::{vrf_name, vrf_table, RouteKey};
use crate::state::{ObjectKey, Pod};
use crate::wire::{
    bandwidth, host_ports, CniError, CniResult, Command, ErrorCode, Interface, IpConfig, Request,
    Route,
};

/// CHECK found a difference.
pub const CHECK_FAILED: ErrorCode = ErrorCode(100);
/// A kernel operation failed.
pub const KERNEL: ErrorCode = ErrorCode(101);
/// IPAM failed.
pub const IPAM: ErrorCode = ErrorCode(102);

/// The loopback interface (the reference plugin ignores `CNI_IFNAME` for it, and so does Lace).
pub const LOOPBACK_IFNAME: &str = "lo";
/// The MAC the reference loopback plugin reports for `lo`.
pub const LOOPBACK_MAC: &str = "00:00:00:00:00:00";

/// Prefix of the host side of every pod veth ("lace pod").
pub const HOST_IFNAME_PREFIX: &str = POD_LINK_PREFIX;

/// The host-side veth name of attachment (`container_id`, `ifname`): `lp-` and 11 hex digits
/// (44 bits) of the 64-bit FNV-1a hash of `container_id`, a NUL and `ifname`. Deterministic,
/// so DEL finds it without a record; 14 bytes, within IFNAMSIZ. FNV-1a (`crate::hash`) because
/// std's hasher may change between Rust releases, and the name must not.
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    format!(
        "{HOST_IFNAME_PREFIX}{:011x}",
        attachment_hash(container_id, ifname) & ((1 << 44) - 1)
    )
}

/// The host-side veth's MAC: `02` (locally administered, unicast) and the top 40 bits of
/// the same hash. Chosen by the agent so the pod's gateway neighbour entries can be written
/// before the host side is looked at.
pub fn host_mac(container_id: &str, ifname: &str) -> [u8; 6] {
    let b = attachment_hash(container_id, ifname).to_be_bytes();
    [0x02, b[0], b[1], b[2], b[3], b[4]]
}

/// 64-bit FNV-1a of `container_id`, a NUL and `ifname`.
fn attachment_hash(container_id: &str, ifname: &str) -> u64 {
    fnv1a64(
        container_id
            .bytes()
            .chain(std::iter::once(0))
            .chain(ifname.bytes()),
    )
}

/// A dataplane call that failed, or the IPAM records the kernel was checked against: what a
/// CNI request fails with code 101 ([`KERNEL`]) for, and what stops the start-up check.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error("kernel task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Ipam(#[from] IpamError),
}

fn kernel(e: impl std::fmt::Display) -> CniError {
    CniError::new(KERNEL, e.to_string())
}

fn ipam(e: IpamError) -> CniError {
    CniError::new(IPAM, e.to_string())
}

fn missing(what: &str, verb: Command) -> CniError {
    CniError::new(
        ErrorCode::INVALID_ENVIRONMENT,
        format!("{verb} request without {what}"),
    )
}

fn key_of(req: &Request) -> Result<AttachmentKey, CniError> {
    Ok(AttachmentKey {
        container_id: req
            .container_id
            .clone()
            .ok_or_else(|| missing("CNI_CONTAINERID", req.command))?,
        ifname: req
            .ifname
            .clone()
            .ok_or_else(|| missing("CNI_IFNAME", req.command))?,
    })
}

/// Formats a MAC for CNI results (`aa:bb:cc:dd:ee:ff`).
fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs a dataplane call off the async workers (it waits for netlink round trips).
async fn dataplane_call<T: Send + 'static>(
    agent: &Agent,
    f: impl FnOnce(&dyn Dataplane) -> Result<T, DataplaneError> + Send + 'static,
) -> Result<T, KernelError> {
    let dataplane = Arc::clone(&agent.dataplane);
    Ok(tokio::task::spawn_blocking(move || f(dataplane.as_ref())).await??)
}

/// [`dataplane_call`] for a CNI request: a failure answers code 101.
async fn kernel_op<T: Send + 'static>(
    agent: &Agent,
    f: impl FnOnce(&dyn Dataplane) -> Result<T, DataplaneError> + Send + 'static,
) -> Result<T, CniError> {
    dataplane_call(agent, f).await.map_err(kernel)
}

/// Runs a blocking IPAM operation off the async workers (it fsyncs).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, IpamError> + Send + 'static,
) -> Result<T, CniError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CniError::new(IPAM, format!("IPAM task failed: {e}")))?
        .map_err(ipam)
}

/// Dispatches one request.
pub async fn handle(agent: &Arc<Agent>, req: Request) -> Result<Option<CniResult>, CniError> {
    match req.command {
        Command::Add => add(agent, &req).await.map(Some),
        Command::Del => del(agent, &req).await.map(|()| None),
        Command::Check => check(agent, &req).await.map(|()| None),
        Command::Status => match agent.not_ready_reason() {
            None => Ok(None),
            Some(why) => Err(CniError::new(
                ErrorCode::NOT_AVAILABLE,
                format!("lace agent on node {:?} is not ready: {why}", agent.node),
            )),
        },
        Command::Gc => gc(agent, &req).await.map(|()| None),
        Command::LoopbackAdd => loopback_add(agent, &req).await.map(Some),
        Command::LoopbackCheck => loopback_check(agent, &req).await.map(|()| None),
    }
}

/// The `loopback` plugin's ADD: `lo` up in the sandbox, and the result the reference plugin
/// gives: interface `lo` (MAC all zeros, the sandbox) with the first IPv4 and the first IPv6
/// address `lo` holds (127.0.0.1/8, and ::1/128 where IPv6 is on in the namespace). Needs no
/// cluster state, so it is served before the agent is ready. Like the reference plugin it
/// refuses a `lo` holding an address outside the loopback ranges.
async fn loopback_add(agent: &Arc<Agent>, req: &Request) -> Result<CniResult, CniError> {
    let netns = req
        .netns
        .clone()
        .ok_or_else(|| missing("CNI_NETNS", req.command))?;
    let ns = netns.clone();
    let lo = kernel_op(agent, move |dp| dp.loopback_up(&ns)).await?;
    if let Some(odd) = lo.addresses.iter().find(|a| !a.addr().is_loopback()) {
        return Err(kernel(format!(
            "loopback interface lo in {} has the non-loopback address {odd}; remove it \
             (`ip -n <sandbox> addr del {odd} dev lo`) or the runtime cannot set up loopback",
            netns.display()
        )));
    }
    let first = |v4: bool| lo.addresses.iter().find(|a| a.addr().is_ipv4() == v4);
    let ips = [first(true), first(false)]
        .into_iter()
        .flatten()
        .map(|address| IpConfig {
            address: *address,
            gateway: None,
            interface: Some(0),
        })
        .collect();
    tracing::debug!(netns = %netns.display(), addresses = ?lo.addresses, "loopback ADD");
    Ok(CniResult {
        cni_version: None,
        interfaces: vec![Interface {
            name: LOOPBACK_IFNAME.to_owned(),
            mac: Some(LOOPBACK_MAC.to_owned()),
            sandbox: Some(netns.display().to_string()),
            ..Default::default()
        }],
        ips,
        routes: Vec::new(),
        dns: Default::default(),
    })
}

/// The `loopback` plugin's CHECK: `lo` exists and is up in the sandbox.
async fn loopback_check(agent: &Arc<Agent>, req: &Request) -> Result<(), CniError> {
    let netns = req
        .netns
        .clone()
        .ok_or_else(|| missing("CNI_NETNS", req.command))?;
    let ns = netns.clone();
    let lo = kernel_op(agent, move |dp| dp.inspect_pod_link(&ns, LOOPBACK_IFNAME)).await?;
    match lo {
        Some(lo) if lo.up => Ok(()),
        Some(_) => Err(CniError::new(
            CHECK_FAILED,
            format!("loopback interface lo is down in {}", netns.display()),
        )),
        None => Err(CniError::new(
            CHECK_FAILED,
            format!("there is no loopback interface lo in {}", netns.display()),
        )),
    }
}

/// Where a pod goes: its Network, that Network's VRF and table, and this node's blocks.
pub(crate) struct Placement {
    pub(crate) network: String,
    vrf: String,
    table: u32,
    blocks: Vec<IpNet>,
}

pub(crate) async fn place(agent: &Agent, pod_key: &ObjectKey) -> Result<Placement, CniError> {
    let loaded = agent.loaded().map_err(|why| {
        CniError::new(
            ErrorCode::TRY_AGAIN_LATER,
            format!("lace agent on node {:?} is not ready: {why}", agent.node),
        )
    })?;
    let state = &loaded.state;
    // A pod the state does not hold yet is asked of the source (in a cluster, the watch may
    // not have delivered the pod the kubelet just created).
    let fetched: Pod;
    let pod = match state.pods.get(pod_key) {
        Some(pod) => pod,
        None => {
            fetched = agent
                .source
                .unknown_pod(pod_key)
                .await
                .map_err(|e| CniError::new(ErrorCode::TRY_AGAIN_LATER, e.to_string()))?
                .ok_or_else(|| {
                    CniError::new(
                        ErrorCode::TRY_AGAIN_LATER,
                        format!("pod {pod_key} does not exist (yet) in the cluster"),
                    )
                })?;
            &fetched
        }
    };
    let binding = binding::pod_network(state, pod_key, pod).ok_or_else(|| {
        CniError::new(
            ErrorCode::TRY_AGAIN_LATER,
            format!("pod {pod_key} matches no NetworkBindingPolicy, so it has no Network"),
        )
    })?;
    let network = binding.network.to_owned();
    let not_here = |what: &str| {
        CniError::new(
            ErrorCode::TRY_AGAIN_LATER,
            format!(
                "pod {pod_key} is bound to Network {network:?} (policy {:?}), which {what} on node {:?}",
                binding.policy, agent.node
            ),
        )
    };
    let index = state
        .node_allocations
        .get(&agent.node)
        .ok_or_else(|| not_here("has no address block yet (the node has no NodeAllocation)"))?
        .index;
    let subnets = state
        .networks
        .get(&network)
        .map(|n| n.subnets.as_slice())
        .unwrap_or_default();
    let blocks = crate::alloc::node_blocks(index, subnets);
    if blocks.is_empty() {
        return Err(not_here(&format!(
            "has no address block (its subnets hold blocks for {} nodes; this node's index is {index})",
            crate::alloc::block_capacity(subnets)
        )));
    }
    let function = state
        .network_allocations
        .get(&network)
        .ok_or_else(|| not_here("has no NetworkAllocation (SID function) yet"))?
        .function;
    Ok(Placement {
        vrf: vrf_name(&network, function),
        table: vrf_table(function),
        network,
        blocks,
    })
}

async fn add(agent: &Arc<Agent>, req: &Request) -> Result<CniResult, CniError> {
    let key = key_of(req)?;
    let netns_path = req
        .netns
        .clone()
        .ok_or_else(|| missing("CNI_NETNS", req.command))?;
    let (Some(ns), Some(name)) = (&req.pod_namespace, &req.pod_name) else {
        return Err(missing("K8S_POD_NAMESPACE and K8S_POD_NAME", req.command));
    };
    let pod = ObjectKey::new(ns.clone(), name.clone());
    let host_ports = host_ports(&req.config)
        .map_err(|e| CniError::new(ErrorCode::INVALID_NETCONF, e.to_string()))?;
    let bandwidth = bandwidth(&req.config)
        .map_err(|e| CniError::new(ErrorCode::INVALID_NETCONF, e.to_string()))?;
    let placement = place(agent, &pod).await?;
    let host = host_ifname(&key.container_id, &key.ifname);
    // Before allocating: a runtime's namespace that is not there fails the ADD at once.
    std::fs::File::open(&netns_path).map_err(|e| {
        kernel(format!(
            "cannot open network namespace {}: {e}",
            netns_path.display()
        ))
    })?;
    let _in_flight = agent.in_flight(&key);

    let started = Instant::now();
    let record = {
        let agent = Arc::clone(agent);
        let (key, pod, network, blocks, host, netns_path) = (
            key.clone(),
            pod.clone(),
            placement.network.clone(),
            placement.blocks.clone(),
            host.clone(),
            netns_path.clone(),
        );
        blocking(move || {
            agent.ipam.allocate(
                &key,
                Claim {
                    pod: &pod,
                    network: &network,
                    blocks: &blocks,
                    host_ifname: &host,
                    netns: Some(netns_path),
                    host_ports,
                    bandwidth,
                },
            )
        })
        .await?
    };
    let ipam_took = started.elapsed();

    match plumb(agent, &key, &host, &netns_path, &record).await {
        Ok(Plumbed {
            host_mac,
            pod_mac,
            pod_took,
            host_took,
        }) => {
            agent.metrics.add_phase("ipam", ipam_took);
            agent.metrics.add_phase("pod", pod_took);
            agent.metrics.add_phase("host", host_took);
            tracing::info!(
                pod = %pod, container = %key.container_id, ifname = %key.ifname, host = %host,
                network = %placement.network, vrf = %placement.vrf, table = placement.table,
                ips = ?record.ips, host_ports = ?record.host_ports, bandwidth = ?record.bandwidth,
                "ADD"
            );
            Ok(result(
                &key.ifname,
                &host,
                &host_mac,
                &pod_mac,
                agent.pod_mtu(),
                &netns_path,
                &record.ips,
            ))
        }
        Err(e) => {
            // Leave nothing behind: the runtime will retry ADD (or DEL) from scratch.
            remove_interfaces(agent, &host, &key.ifname, Some(&netns_path)).await;
            let agent2 = Arc::clone(agent);
            let k = key.clone();
            if let Err(re) = blocking(move || agent2.ipam.release(&k)).await {
                tracing::error!(error = %re.msg, "releasing after a failed ADD");
            }
            Err(e)
        }
    }
}

/// What [`plumb`] made: the MACs of the host and pod sides, and how long the pod-side and
/// host-side phases took.
struct Plumbed {
    host_mac: String,
    pod_mac: String,
    pod_took: Duration,
    host_took: Duration,
}

/// Creates and configures the veth pair, then gives the pod its part of the plan on the node.
async fn plumb(
    agent: &Arc<Agent>,
    key: &AttachmentKey,
    host: &str,
    pod_ns: &Path,
    record: &Record,
) -> Result<Plumbed, CniError> {
    let started = Instant::now();
    let pod = PodInterface {
        ifname: key.ifname.clone(),
        host_ifname: host.to_owned(),
        mtu: agent.pod_mtu(),
        host_mac: host_mac(&key.container_id, &key.ifname),
        ips: record.ips.clone(),
    };
    // The common case creates the pair straight away. A retried ADD finds the previous
    // attempt's interfaces (the create fails with EEXIST): only then are they looked for
    // and removed in both namespaces, and the pair created again.
    let pod_mac = match create_pod_interface(agent, pod_ns, &pod).await? {
        Some(mac) => mac,
        None => {
            remove_interfaces(agent, host, &key.ifname, Some(pod_ns)).await;
            create_pod_interface(agent, pod_ns, &pod)
                .await?
                .ok_or_else(|| {
                    kernel(format!(
                        "cannot create veth {:?} (host side {host:?}): a link of either name \
                         is still there after removing the previous attempt's",
                        key.ifname
                    ))
                })?
        }
    };
    let pod_took = started.elapsed();

    // On the node, exactly what the plan holds for this pod (the Network's VRF if it is
    // missing, enslavement, the routes), planned as the reconcile plans it: the reconcile
    // this ADD triggers then finds it all in place.
    let started = Instant::now();
    let loaded = agent.loaded().map_err(|why| {
        CniError::new(
            ErrorCode::TRY_AGAIN_LATER,
            format!("lace agent on node {:?} is not ready: {why}", agent.node),
        )
    })?;
    let pods = loaded
        .planner
        .plan(&[record.to_pod_attachment(key)])
        .map_err(kernel)?;
    kernel_op(agent, move |dp| dp.attach(pods)).await?;
    Ok(Plumbed {
        host_mac: format_mac(&pod.host_mac),
        pod_mac: format_mac(&pod_mac),
        pod_took,
        host_took: started.elapsed(),
    })
}

/// In the pod's namespace: creates the pair (host side straight into the node's namespace)
/// and configures the pod side; returns the pod side's MAC, or `None` if a link of either
/// name exists already (nothing was created).
async fn create_pod_interface(
    agent: &Agent,
    pod_ns: &Path,
    pod: &PodInterface,
) -> Result<Option<Vec<u8>>, CniError> {
    let (pod_ns, pod) = (pod_ns.to_owned(), pod.clone());
    kernel_op(agent, move |dp| dp.create_pod_interface(&pod_ns, &pod)).await
}

fn result(
    ifname: &str,
    host: &str,
    host_mac: &str,
    pod_mac: &str,
    mtu: u32,
    netns_path: &Path,
    ips: &[IpNet],
) -> CniResult {
    let gateway = |ip: &IpNet| gateway(ip.addr());
    CniResult {
        cni_version: None,
        interfaces: vec![
            Interface {
                name: host.to_owned(),
                mac: Some(host_mac.to_owned()),
                mtu: Some(mtu),
                ..Default::default()
            },
            Interface {
                name: ifname.to_owned(),
                mac: Some(pod_mac.to_owned()),
                mtu: Some(mtu),
                sandbox: Some(netns_path.display().to_string()),
                ..Default::default()
            },
        ],
        ips: ips
            .iter()
            .map(|ip| IpConfig {
                address: *ip,
                gateway: Some(gateway(ip)),
                interface: Some(1),
            })
            .collect(),
        routes: ips
            .iter()
            .map(|ip| Route {
                dst: default_route(ip.addr()),
                gw: Some(gateway(ip)),
                mtu: None,
                advmss: None,
                priority: None,
                table: None,
                scope: None,
            })
            .collect(),
        dns: Default::default(),
    }
}

fn default_route(of: IpAddr) -> IpNet {
    match of {
        IpAddr::V4(_) => IpNet::V4(Default::default()),
        IpAddr::V6(_) => IpNet::V6(Default::default()),
    }
}

/// Deletes the host veth in the node namespace, with the pod's shaper if it has one (its
/// qdiscs go with the links); deleting one end of a veth deletes its peer, so that also
/// removes the pod side. Only if there was no host veth, and the pod namespace is known, are
/// both names deleted there (a pair left there by a crashed ADD). Logs, never fails: the
/// start-up check, GC and the reconcile catch what is left.
async fn remove_interfaces(agent: &Agent, host: &str, ifname: &str, pod_ns: Option<&Path>) {
    let h = vec![host.to_owned(), shaper_name(host)];
    match kernel_op(agent, move |dp| dp.delete_links(h)).await {
        Ok(deleted) if deleted.iter().any(|d| d == host) => return,
        Ok(_) => {}
        Err(e) => tracing::warn!(host, error = %e.msg, "deleting host veth"),
    }
    if let Some(ns) = pod_ns {
        let (ns, names) = (ns.to_owned(), vec![host.to_owned(), ifname.to_owned()]);
        if let Err(e) = kernel_op(agent, move |dp| dp.delete_pod_links(&ns, &names)).await {
            tracing::warn!(ifname, error = %e.msg, "deleting pod interface");
        }
    }
}

/// `path` if it still exists (DEL after the pod died).
fn existing_ns(path: Option<&PathBuf>) -> Option<&Path> {
    path.map(PathBuf::as_path).filter(|p| p.exists())
}

/// DEL of one attachment: interfaces first, then the addresses (so an address is never
/// handed out again while an old veth still routes it).
async fn del_attachment(agent: &Arc<Agent>, key: &AttachmentKey, netns: Option<&PathBuf>) {
    let host = host_ifname(&key.container_id, &key.ifname);
    let record = agent.ipam.get(key).ok().flatten();
    let pod_ns = existing_ns(netns.or(record.as_ref().and_then(|r| r.netns.as_ref())));
    remove_interfaces(agent, &host, &key.ifname, pod_ns).await;
}

async fn del(agent: &Arc<Agent>, req: &Request) -> Result<(), CniError> {
    let key = key_of(req)?;
    let _in_flight = agent.in_flight(&key);
    del_attachment(agent, &key, req.netns.as_ref()).await;
    let agent2 = Arc::clone(agent);
    let k = key.clone();
    let released = blocking(move || agent2.ipam.release(&k)).await?;
    if let Some(rec) = released {
        tracing::info!(pod = %rec.pod, container = %key.container_id, ifname = %key.ifname, ips = ?rec.ips, "DEL");
    } else {
        tracing::debug!(container = %key.container_id, ifname = %key.ifname, "DEL of an unknown attachment");
    }
    Ok(())
}

async fn check(agent: &Arc<Agent>, req: &Request) -> Result<(), CniError> {
    let key = key_of(req)?;
    let netns_path = req
        .netns
        .clone()
        .ok_or_else(|| missing("CNI_NETNS", req.command))?;
    let rec = agent.ipam.get(&key).map_err(ipam)?.ok_or_else(|| {
        CniError::new(
            ErrorCode::UNKNOWN_CONTAINER,
            format!("CHECK: no attachment {key} on node {:?}", agent.node),
        )
    })?;
    let fail = |what: String| CniError::new(CHECK_FAILED, format!("CHECK {key}: {what}"));
    if let Some(prev) = &req.prev_result {
        let prev_ips: BTreeSet<IpNet> = prev.ips.iter().map(|c| c.address).collect();
        let ips: BTreeSet<IpNet> = rec.ips.iter().copied().collect();
        if prev_ips != ips {
            return Err(fail(format!(
                "prevResult has addresses {prev_ips:?}, the agent assigned {ips:?}"
            )));
        }
    }
    let placement = network_table(agent, &rec)?;
    // Pod side.
    let (ns, ifname) = (netns_path.clone(), key.ifname.clone());
    let pod_side = kernel_op(agent, move |dp| dp.inspect_pod_link(&ns, &ifname))
        .await?
        .ok_or_else(|| {
            fail(format!(
                "interface {:?} is missing in {}",
                key.ifname,
                netns_path.display()
            ))
        })?;
    if !pod_side.up {
        return Err(fail(format!("interface {:?} is down", key.ifname)));
    }
    for ip in &rec.ips {
        if !pod_side.addresses.contains(ip) {
            return Err(fail(format!(
                "interface {:?} lacks address {ip} (has {:?})",
                key.ifname, pod_side.addresses
            )));
        }
        let want = (default_route(ip.addr()), Some(gateway(ip.addr())));
        if !pod_side.routes.contains(&want) {
            return Err(fail(format!(
                "no default route via {} on {:?}",
                gateway(ip.addr()),
                key.ifname
            )));
        }
    }
    // Host side, as the dataplane knows the node.
    let node = kernel_op(agent, |dp| dp.snapshot()).await?;
    let Some(host) = node.links.get(&rec.host_ifname) else {
        return Err(fail(format!(
            "host interface {:?} is missing",
            rec.host_ifname
        )));
    };
    if !host.up {
        return Err(fail(format!(
            "host interface {:?} is down",
            rec.host_ifname
        )));
    }
    let master = host.master.and_then(|m| {
        let name = node.link_name(m)?;
        Some((name, node.links[name].vrf_table))
    });
    if master != Some((placement.0.as_str(), Some(placement.1))) {
        return Err(fail(format!(
            "host interface {:?} is not enslaved to VRF {:?} (table {}): controller is {master:?}",
            rec.host_ifname, placement.0, placement.1
        )));
    }
    for ip in &rec.ips {
        let key = RouteKey::new(placement.1, IpNet::from(ip.addr()));
        let through_host = node.routes.get(&key).is_some_and(
            |nh| matches!(nh, crate::dataplane::KernelNexthop::Dev(d) if **d == *rec.host_ifname),
        );
        if !through_host {
            return Err(fail(format!(
                "no route {ip} dev {} in table {}",
                rec.host_ifname, placement.1
            )));
        }
    }
    Ok(())
}

/// The VRF name and table of the record's Network in the current state.
fn network_table(agent: &Agent, rec: &Record) -> Result<(String, u32), CniError> {
    let loaded = agent
        .loaded()
        .map_err(|why| CniError::new(ErrorCode::TRY_AGAIN_LATER, format!("not ready: {why}")))?;
    let function = loaded
        .state
        .network_allocations
        .get(&rec.network)
        .ok_or_else(|| {
            CniError::new(
                CHECK_FAILED,
                format!(
                    "Network {:?} of pod {} no longer exists",
                    rec.network, rec.pod
                ),
            )
        })?
        .function;
    Ok((vrf_name(&rec.network, function), vrf_table(function)))
}

async fn gc(agent: &Arc<Agent>, req: &Request) -> Result<(), CniError> {
    let valid: BTreeSet<AttachmentKey> = req
        .valid_attachments
        .as_ref()
        .ok_or_else(|| missing("cni.dev/valid-attachments", req.command))?
        .iter()
        .map(|a| AttachmentKey {
            container_id: a.container_id.clone(),
            ifname: a.ifname.clone(),
        })
        .collect();
    // An ADD still in flight is not in the runtime's list yet; it is not garbage.
    let in_flight = agent.in_flight_keys();
    let agent2 = Arc::clone(agent);
    let released = blocking(move || {
        agent2
            .ipam
            .retain(|k, _| valid.contains(k) || in_flight.contains(k))
    })
    .await?;
    for (key, rec) in &released {
        let pod_ns = existing_ns(rec.netns.as_ref());
        remove_interfaces(agent, &rec.host_ifname, &key.ifname, pod_ns).await;
        tracing::info!(pod = %rec.pod, container = %key.container_id, ips = ?rec.ips, "GC released");
    }
    remove_unowned_veths(agent).await.map_err(kernel)?;
    if !released.is_empty() {
        agent.reconcile_wanted.notify_one();
    }
    Ok(())
}

/// The names of the node's `lp-*` links.
async fn pod_links(agent: &Agent) -> Result<BTreeSet<String>, KernelError> {
    let node = dataplane_call(agent, |dp| dp.snapshot()).await?;
    Ok(node
        .links
        .into_keys()
        .filter(|n| n.starts_with(HOST_IFNAME_PREFIX))
        .collect())
}

/// Deletes every `lp-*` link in the node namespace that no record owns; returns their names.
async fn remove_unowned_veths(agent: &Agent) -> Result<Vec<String>, KernelError> {
    let owned: BTreeSet<String> = agent
        .ipam
        .records()?
        .into_iter()
        .map(|(_, r)| r.host_ifname)
        .collect();
    let unowned: Vec<String> = pod_links(agent)
        .await?
        .into_iter()
        .filter(|n| !owned.contains(n))
        .collect();
    if unowned.is_empty() {
        return Ok(unowned);
    }
    dataplane_call(agent, move |dp| dp.delete_links(unowned)).await
}

/// Start-up check: releases records whose host veth is gone (a crash between allocation and
/// veth creation, a reboot) and deletes `lp-*` veths without a record.
pub async fn verify_against_kernel(agent: &Arc<Agent>) -> Result<(), KernelError> {
    let present = pod_links(agent).await?;
    let released = agent.ipam.retain(|_, r| present.contains(&r.host_ifname))?;
    for (key, rec) in &released {
        tracing::info!(pod = %rec.pod, container = %key.container_id, ips = ?rec.ips, "released: host veth is gone");
    }
    for name in remove_unowned_veths(agent).await? {
        tracing::info!(host = %name, "deleted a Lace veth without an IPAM record");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
