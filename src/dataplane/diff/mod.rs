//! Desired vs observed → ordered operations. Pure: no kernel, deterministic, unit-tested.
//!
//! Symbolic next hops are resolved here against what was observed: `@uplink` is the link
//! holding the node's underlay IPv6 address, [`Nexthop::Host`] is what the host's main table
//! routes for the destination (longest prefix match over its unicast routes), and the MTU of
//! the SRv6-over-IPv4 device is that of the link holding the node's underlay IPv4 address minus
//! what the outer IPv4 and UDP headers take.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use ipnet::{IpNet, Ipv6Net};

use super::nft::{self, KnownRuleset};
use super::tunnel::{self, link_holding};
use super::{FouListener, HostRoute, KernelNexthop, NftState, ObservedNode, ObservedRule, SitLink};
use crate::plan::underlay::{
    is_link_local_underlay, FOU_IPPROTO, FOU_PORT, IPV4_TUNNEL, LINK_LOCAL_PREFIX,
};
use crate::plan::{
    disable_ipv6_key, sysctl_device, DesiredNode, Nexthop, NodeBase, RouteKey, Rule, RuleAction,
    Underpath, Vrf, POD_GATEWAY_V6_PREFIX, PROBE_TABLE,
};

/// Why no operations could be computed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    #[error("no link holds the node's underlay address {underlay} (its InternalIP in the NodeAllocation): cannot resolve the uplink{}", no_uplink_hint(.underlay))]
    NoUplink { underlay: IpAddr },
    #[error("the nft ruleset cannot be tagged: {0}")]
    Nft(#[from] super::nft::UntaggableRuleset),
}

/// What to check when no link holds an IPv6 underlay address: disabling IPv6 on a link takes
/// its IPv6 addresses with it.
fn no_uplink_hint(underlay: &IpAddr) -> &'static str {
    match underlay {
        IpAddr::V6(_) => "; if IPv6 is disabled on the link that should hold it (net.ipv6.conf.<link>.disable_ipv6=1), so is the address: enable IPv6 there, or give the Node only its IPv4 InternalIP (kubelet --node-ip) so that its peers reach it over IPv4",
        IpAddr::V4(_) => "",
    }
}

/// One change to the kernel, naming its object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Delete a link that has a Lace name but is not the VRF planned (wrong kind or table),
    /// before it is re-created.
    ReplaceLink {
        name: String,
    },
    AddVrf {
        name: String,
        table: u32,
    },
    /// `ip link add <name> type dummy`: a VRF's ingress device, enslaved by [`Op::SetMaster`].
    AddDummy {
        name: String,
    },
    /// `ip link add <name> mtu <mtu> type sit ...` (the SRv6-over-IPv4 device), left down until
    /// [`Op::TunnelUp`], after the ruleset that guards it is in.
    AddTunnel {
        name: String,
        sit: SitLink,
        mtu: u32,
    },
    LinkUp {
        name: String,
    },
    SetMtu {
        name: String,
        mtu: u32,
    },
    /// Enslave a pod's host-side veth, or a VRF's ingress device, to the VRF and bring it up.
    SetMaster {
        link: String,
        master: String,
    },
    /// `ip addr add <addr> dev <link> nodad`: the link-local source of a pod's IPv6 probe
    /// route, on the pod's host-side veth (see [`Nexthop::DevSrc`]), the tunnel source on
    /// the SRv6-over-IPv4 device, or the node's link-local underlay address on its uplink.
    AddAddress {
        link: String,
        addr: IpNet,
    },
    /// `ip addr del <addr> dev <link>`: a link-local underlay address of Lace's no longer
    /// planned there (the only address Lace deletes from a link it keeps).
    DelAddress {
        link: String,
        addr: IpNet,
    },
    Sysctl {
        key: String,
        value: String,
    },
    Tunsrc(Ipv6Addr),
    /// `ip link set <name> up` for the SRv6-over-IPv4 device.
    TunnelUp {
        name: String,
    },
    /// `ip fou add port <port> ipproto <ipproto>`, deleting first what else listens on the
    /// port (`replace`).
    AddFou {
        listener: FouListener,
        replace: bool,
    },
    /// Replace table `inet lace` in one transaction (`script` is the whole `nft -f` input).
    NftSwap {
        script: String,
        tag: String,
    },
    /// Delete and add elements of table `inet lace`'s sets and maps, and swap its tag, in one
    /// transaction (`script`): the table held a known ruleset differing only in elements.
    NftElements {
        script: String,
        tag: String,
        deleted: usize,
        added: usize,
    },
    AddRule(Rule),
    /// Add or replace (`NLM_F_CREATE | NLM_F_REPLACE`) a route.
    PutRoute {
        key: RouteKey,
        nh: KernelNexthop,
    },
    DelRoute {
        key: RouteKey,
        nh: KernelNexthop,
    },
    DelRule(Box<ObservedRule>),
    /// `ip fou del port <port>`, before the tunnel device goes.
    DelFou {
        listener: FouListener,
    },
    DelLink {
        name: String,
    },
    NftDelete,
}

impl Op {
    /// The apply phase: operations run phase by phase, in this order.
    pub fn phase(&self) -> u8 {
        match self {
            Op::ReplaceLink { .. } => 0,
            Op::AddVrf { .. } | Op::AddDummy { .. } | Op::AddTunnel { .. } => 1,
            Op::LinkUp { .. } | Op::SetMtu { .. } => 2,
            Op::SetMaster { .. } => 3,
            // Before sysctls: the ruleset's `ct` expressions load conntrack, which registers
            // `net.netfilter.nf_hooks_lwtunnel`.
            // Before sysctls: the ruleset's `ct` expressions load conntrack, which registers
            // `net.netfilter.nf_hooks_lwtunnel`.
            Op::NftSwap { .. } | Op::NftElements { .. } => 4,
            Op::Sysctl { .. } => 5,
            // After enslaving: moving an up link into a VRF cycles it, which drops its
            // link-local addresses; after sysctls: the tunnel's IPv6 may have been disabled.
            Op::AddAddress { .. } => 6,
            // The tunnel starts decapsulating only once the ruleset guarding it is in.
            Op::Tunsrc(_) | Op::TunnelUp { .. } | Op::AddFou { .. } => 7,
            Op::AddRule(_) => 8,
            Op::PutRoute { .. } => 9,
            Op::DelRoute { .. } => 10,
            // After the routes through its link that may still use it.
            Op::DelAddress { .. } => 11,
            Op::DelRule(_) => 12,
            // The fou port goes before its device, so a port of Lace's without a Lace device
            // (which observation would not look for) never stays behind.
            Op::DelFou { .. } => 13,
            Op::DelLink { .. } => 14,
            Op::NftDelete => 15,
        }
    }
}

fn fam(dst: &IpNet) -> &'static str {
    if matches!(dst, IpNet::V6(_)) {
        "-6 "
    } else {
        ""
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::ReplaceLink { name } => write!(f, "link del {name} (to re-create it as planned)"),
            Op::AddVrf { name, table } => write!(f, "link add {name} type vrf table {table}"),
            Op::AddDummy { name } => write!(f, "link add {name} type dummy"),
            Op::AddTunnel { name, sit, mtu } => write!(
                f,
                "link add {name} mtu {mtu} type sit remote {} local {} ttl {} {}pmtudisc encap {} encap-sport {} encap-dport {}",
                sit.remote.map_or("any".to_string(), |a| a.to_string()),
                sit.local.map_or("any".to_string(), |a| a.to_string()),
                sit.ttl,
                if sit.pmtudisc { "" } else { "no" },
                sit.encap_type,
                sit.encap_sport,
                sit.encap_dport
            ),
            Op::LinkUp { name } | Op::TunnelUp { name } => write!(f, "link set {name} up"),
            Op::SetMtu { name, mtu } => write!(f, "link set {name} mtu {mtu}"),
            Op::SetMaster { link, master } => write!(f, "link set {link} master {master} up"),
            Op::AddAddress { link, addr } => write!(f, "addr add {addr} dev {link} nodad"),
            Op::DelAddress { link, addr } => write!(f, "addr del {addr} dev {link}"),
            Op::Sysctl { key, value } => write!(f, "sysctl {key}={value}"),
            Op::Tunsrc(a) => write!(f, "sr tunsrc set {a}"),
            Op::AddFou { listener, replace } => write!(
                f,
                "fou add port {} ipproto {}{}",
                listener.port,
                listener.ipproto.unwrap_or_default(),
                if *replace { " (replacing another listener)" } else { "" }
            ),
            Op::DelFou { listener } => write!(f, "fou del port {}", listener.port),
            Op::NftSwap { tag, .. } => write!(f, "nft replace table inet lace ({tag})"),
            Op::NftElements {
                tag,
                deleted,
                added,
                ..
            } => write!(
                f,
                "nft update table inet lace: {deleted} element(s) deleted, {added} added ({tag})"
            ),
            Op::AddRule(r) => write!(f, "rule add {r}"),
            Op::PutRoute { key, nh } => write!(
                f,
                "{}route replace {} table {} {nh}",
                fam(&key.dst),
                key.dst,
                key.table
            ),
            Op::DelRoute { key, nh } => write!(
                f,
                "{}route del {} table {} ({nh})",
                fam(&key.dst),
                key.dst,
                key.table
            ),
            Op::DelRule(r) => match &r.rule {
                Some(rule) => write!(f, "rule del {rule}"),
                None => write!(f, "rule del {:?}", r.raw),
            },
            Op::DelLink { name } => write!(f, "link del {name}"),
            Op::NftDelete => write!(f, "nft delete table inet lace"),
        }
    }
}

/// The operations, in apply order, and the pod routes left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diff {
    pub ops: Vec<Op>,
    /// Routes not installed because their device does not exist (a pod veth the CNI has not
    /// created yet or already deleted), as text.
    pub skipped: Vec<String>,
}

/// `a` if it is an IPv6 unicast link-local address (`fe80::/10`).
fn link_local(a: &IpAddr) -> Option<Ipv6Addr> {
    match a {
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some(*v6),
        _ => None,
    }
}

/// The main table's answer for `dst`: longest prefix among host routes containing it.
fn host_lookup<'a>(routes: &'a [HostRoute], dst: &IpNet) -> Option<&'a HostRoute> {
    routes
        .iter()
        .filter(|r| {
            r.dst.prefix_len() <= dst.prefix_len()
                && r.dst.contains(&dst.network())
                && r.dev.is_some()
        })
        .max_by_key(|r| r.dst.prefix_len())
}

/// Computes the operations that make `observed` hold `desired` (`None`: nothing of Lace's).
/// `known_nft` is the ruleset the caller knows the kernel's table to hold while the table
/// carries that ruleset's tag: with it, a plan that changes only set and map elements
/// deletes and adds just those instead of replacing the table.
pub fn diff(
    desired: Option<&DesiredNode>,
    observed: &ObservedNode,
    known_nft: Option<&KnownRuleset>,
) -> Result<Diff, DiffError> {
    diff_in(desired, observed, known_nft, Scope::All)
}

/// The operations a reconcile would issue for what rtnetlink notifies (links, addresses,
/// rules, routes), leaving out the nft table, sysctls and `ip sr tunsrc`, whose observation
/// the notifications do not change: empty while the kernel holds what Lace last applied of
/// `desired`, whatever else changed. This is how the reconciler tells drift (something of
/// Lace's changed without Lace) from its own writes echoing back and from changes to foreign
/// objects.
pub fn drift(desired: &DesiredNode, observed: &ObservedNode) -> Result<Vec<Op>, DiffError> {
    Ok(diff_in(Some(desired), observed, None, Scope::Notified)?.ops)
}

/// The operations that give the pods of `pods` (a plan whose `pod_routes` are theirs, e.g.
/// [`crate::plan::Planner::plan`] of one attachment) what the full plan holds for them: their
/// Networks' VRFs (created if missing), their host veths enslaved and up (with their proxy
/// ARP sysctls), the link-local sources of their IPv6 probe routes, and their routes. Nothing
/// else and no deletions: CNI ADD applies this, so the reconcile that follows finds the pod
/// already as planned and writes nothing for it.
pub fn attach(pods: &DesiredNode, observed: &ObservedNode) -> Result<Diff, DiffError> {
    let tables: BTreeSet<u32> = pods.pod_routes.keys().map(|k| k.table).collect();
    let vrfs: BTreeMap<String, Vrf> = pods
        .base
        .vrfs
        .iter()
        .filter(|(_, v)| tables.contains(&v.table))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    let mut out = Diff::default();
    let fresh = vrf_ops(&vrfs, observed, &mut out.ops);
    // A VRF made here gets its sysctls (IPv6 enabled on it) as a reconcile would give it.
    for (key, value) in &pods.base.sysctls {
        if sysctl_device(key).is_some_and(|l| fresh.contains(l)) {
            out.ops.push(Op::Sysctl {
                key: key.clone(),
                value: value.clone(),
            });
        }
    }
    pod_link_ops(pods, &vrfs, observed, true, &mut out.ops);
    let uplink = uplink(&pods.base, observed);
    for (key, nh) in &pods.pod_routes {
        if let Some(resolved) = resolve(key, nh, &pods.base, &vrfs, observed, uplink, &mut out)? {
            let via_fresh = resolved.dev().is_some_and(|d| fresh.contains(d));
            if via_fresh || observed.routes.get(key) != Some(&resolved) {
                out.ops.push(Op::PutRoute {
                    key: *key,
                    nh: resolved,
                });
            }
        }
    }
    out.ops.sort_by_key(Op::phase);
    Ok(out)
}

/// Which parts of the plan a diff covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    All,
    /// What rtnetlink notifications show: see [`drift`].
    Notified,
}

fn diff_in(
    desired: Option<&DesiredNode>,
    observed: &ObservedNode,
    known_nft: Option<&KnownRuleset>,
    scope: Scope,
) -> Result<Diff, DiffError> {
    let mut out = Diff::default();
    let empty_vrfs = BTreeMap::new();
    let vrfs = desired.map(|d| &d.base.vrfs).unwrap_or(&empty_vrfs);
    // Links this diff creates or re-creates: what the kernel showed of the old ones (their
    // routes, sysctls) says nothing about the new.
    let mut fresh = vrf_ops(vrfs, observed, &mut out.ops);
    for (name, _) in observed.vrfs() {
        if !vrfs.contains_key(name) {
            out.ops.push(Op::DelLink { name: name.clone() });
        }
    }
    super::ingress::ops(vrfs, observed, &mut fresh, &mut out.ops);

    // --- Links: the SRv6-over-IPv4 device and its fou port ----------------------------------
    let tunnel = desired.and_then(|d| d.base.ipv4_tunnel.as_ref());
    if let Some(t) = tunnel {
        if tunnel::ops(t, observed, &mut out.ops)? {
            fresh.insert(IPV4_TUNNEL);
        }
    }
    for (name, _) in observed.tunnels() {
        if tunnel.is_none() || name != IPV4_TUNNEL {
            out.ops.push(Op::DelLink { name: name.clone() });
        }
    }
    let ours = FouListener::direct_v4(FOU_PORT, FOU_IPPROTO);
    if tunnel.is_none() {
        for l in observed.fou.iter().flatten() {
            if l.port == ours.port && l.family == ours.family {
                out.ops.push(Op::DelFou { listener: *l });
            }
        }
    }

    let Some(d) = desired else {
        teardown(&mut out, observed);
        out.ops.sort_by_key(Op::phase);
        return Ok(out);
    };
    let base = &d.base;
    pod_link_ops(d, vrfs, observed, scope == Scope::All, &mut out.ops);
    link_local_ops(base, observed, &mut out.ops)?;

    // --- nft, sysctls, tunsrc: read afresh by every reconcile, never notified -------------
    if scope == Scope::All {
        out.ops.extend(nft::op(
            &base.nft,
            &d.render_nft(),
            &observed.nft,
            known_nft,
        )?);
        for (key, value) in &base.sysctls {
            let of_fresh = sysctl_device(key).is_some_and(|l| fresh.contains(l));
            if of_fresh
                || observed.sysctls.get(key).and_then(|v| v.as_deref()) != Some(value.as_str())
            {
                out.ops.push(Op::Sysctl {
                    key: key.clone(),
                    value: value.clone(),
                });
            }
        }
        if observed.tunsrc != Some(base.seg6_tunsrc) {
            out.ops.push(Op::Tunsrc(base.seg6_tunsrc));
        }
    }

    // --- Rules ------------------------------------------------------------------------------
    let have: BTreeSet<Rule> = observed.rules.iter().filter_map(|r| r.rule).collect();
    for r in &base.rules {
        if !have.contains(r) {
            out.ops.push(Op::AddRule(*r));
        }
    }
    for r in &observed.rules {
        if !r.rule.is_some_and(|x| base.rules.contains(&x)) {
            out.ops.push(Op::DelRule(Box::new(r.clone())));
        }
    }

    // --- Routes -----------------------------------------------------------------------------
    let uplink = uplink(base, observed);
    let mut wanted: BTreeSet<&RouteKey> = BTreeSet::new();
    for (key, nh) in d.routes() {
        let Some(resolved) = resolve(key, nh, base, vrfs, observed, uplink, &mut out)? else {
            continue;
        };
        wanted.insert(key);
        let via_fresh = resolved.dev().is_some_and(|d| fresh.contains(d));
        if via_fresh || observed.routes.get(key) != Some(&resolved) {
            out.ops.push(Op::PutRoute {
                key: *key,
                nh: resolved,
            });
        }
    }
    for (key, nh) in &observed.routes {
        if !wanted.contains(key) {
            out.ops.push(Op::DelRoute {
                key: *key,
                nh: nh.clone(),
            });
        }
    }
    if scope == Scope::Notified {
        // The fou ports are read by each reconcile, never notified.
        out.ops
            .retain(|o| !matches!(o, Op::AddFou { .. } | Op::DelFou { .. }));
    }
    // Stable: within a phase, the order above.
    out.ops.sort_by_key(Op::phase);
    Ok(out)
}

/// The planned VRFs: created if missing, re-created if a link of that name is something
/// else, brought up if down. Returns the names of those it creates.
fn vrf_ops<'a>(
    vrfs: &'a BTreeMap<String, Vrf>,
    observed: &ObservedNode,
    ops: &mut Vec<Op>,
) -> BTreeSet<&'a str> {
    let mut fresh = BTreeSet::new();
    for (name, vrf) in vrfs {
        match observed.links.get(name) {
            Some(l) if l.vrf_table == Some(vrf.table) => {
                if !l.up {
                    ops.push(Op::LinkUp { name: name.clone() });
                }
            }
            other => {
                if other.is_some() {
                    ops.push(Op::ReplaceLink { name: name.clone() });
                }
                fresh.insert(name.as_str());
                ops.push(Op::AddVrf {
                    name: name.clone(),
                    table: vrf.table,
                });
            }
        }
    }
    fresh
}

/// The sysctls of a pod's host veth, written whenever Lace enslaves it: proxy ARP answers
/// for addresses routed elsewhere, at once (the pod's gateway entries are permanent, so this
/// only serves a pod that resolves other addresses on its link); and, when the pod has an
/// IPv6 address (`ipv6`), IPv6 enabled on it (the veth inherits `disable_ipv6` from the node's
/// `default`, and the kernel refuses its link-local probe source and the pod's `/128` routes
/// while it is disabled).
pub fn pod_link_sysctls(link: &str, ipv6: bool) -> Vec<(String, &'static str)> {
    let mut out = vec![
        (format!("net.ipv4.conf.{link}.proxy_arp"), "1"),
        (format!("net.ipv4.neigh.{link}.proxy_delay"), "0"),
    ];
    if ipv6 {
        out.push((disable_ipv6_key(link), "0"));
    }
    out
}

/// The pods' host veths of plan `d`: enslaved to their Network's VRF (and up; with their
/// sysctls when `sysctls`), up if down, and given the link-local source of their IPv6 probe
/// routes (enslaving drops it). Links that do not exist are left to the routes, which report
/// them.
///
/// A pod veth's sysctls are not read back by reconciles (that would cost a read per pod on
/// every pass). Its `disable_ipv6` needs no reading: the kernel flushes every IPv6 address of
/// a link whose IPv6 is switched off and notifies it, so a missing link-local probe source is
/// what that drift looks like, and IPv6 is enabled again (when `sysctls`) right before the
/// address is put back.
fn pod_link_ops(
    d: &DesiredNode,
    vrfs: &BTreeMap<String, Vrf>,
    observed: &ObservedNode,
    sysctls: bool,
    ops: &mut Vec<Op>,
) {
    let table_vrf: BTreeMap<u32, &str> = vrfs.iter().map(|(n, v)| (v.table, n.as_str())).collect();
    let mut masters: BTreeMap<&str, &str> = BTreeMap::new();
    for (k, nh) in &d.pod_routes {
        if let (Nexthop::Dev(dev), Some(vrf)) = (nh, table_vrf.get(&k.table)) {
            if k.table != PROBE_TABLE && !vrfs.contains_key(dev) {
                masters.insert(dev, vrf);
            }
        }
    }
    // The pod veths that carry IPv6 (a pod's IPv6 address is routed through them).
    let ipv6_links: BTreeSet<&str> = d
        .pod_routes
        .iter()
        .filter_map(|(k, nh)| match nh {
            Nexthop::Dev(dev) | Nexthop::DevSrc { dev, .. } if k.dst.addr().is_ipv6() => {
                Some(dev.as_str())
            }
            _ => None,
        })
        .collect();
    // Links whose IPv6 this diff enables.
    let mut ipv6_enabled: BTreeSet<&str> = BTreeSet::new();
    let mut enslaved: BTreeSet<&str> = BTreeSet::new();
    for (link, vrf) in masters {
        let Some(l) = observed.links.get(link) else {
            continue;
        };
        let current = l.master.and_then(|m| observed.link_name(m));
        if current != Some(vrf) {
            enslaved.insert(link);
            ops.push(Op::SetMaster {
                link: link.to_string(),
                master: vrf.to_string(),
            });
            if sysctls {
                let ipv6 = ipv6_links.contains(link);
                if ipv6 {
                    ipv6_enabled.insert(link);
                }
                for (key, value) in pod_link_sysctls(link, ipv6) {
                    ops.push(Op::Sysctl {
                        key,
                        value: value.into(),
                    });
                }
            }
        } else if !l.up {
            ops.push(Op::LinkUp {
                name: link.to_string(),
            });
        }
    }
    let mut addressed: BTreeSet<(&str, Ipv6Addr)> = BTreeSet::new();
    for nh in d.pod_routes.values() {
        let Nexthop::DevSrc { dev, src } = nh else {
            continue;
        };
        let Some(l) = observed.links.get(dev) else {
            continue;
        };
        let Some(v6) = link_local(src) else { continue };
        if (!observed.addrs.contains(&(*src, l.index)) || enslaved.contains(dev.as_str()))
            && addressed.insert((dev, v6))
        {
            if sysctls && ipv6_enabled.insert(dev) {
                ops.push(Op::Sysctl {
                    key: disable_ipv6_key(dev),
                    value: "0".into(),
                });
            }
            ops.push(Op::AddAddress {
                link: dev.clone(),
                addr: IpNet::V6(Ipv6Net::new_assert(v6, POD_GATEWAY_V6_PREFIX)),
            });
        }
    }
}

/// The link holding the node's IPv6 underlay address (`@uplink`), needed only by routes over
/// IPv6.
fn uplink<'a>(base: &NodeBase, observed: &'a ObservedNode) -> Option<&'a str> {
    let u = base.underlay.ipv6?;
    link_holding(observed, IpAddr::V6(u)).map(|(name, _)| name)
}

/// The kernel form of planned route `key` via `nh`, resolved against what was observed, or
/// `None` (and a line in `out.skipped`) when it cannot be installed now.
fn resolve(
    key: &RouteKey,
    nh: &Nexthop,
    base: &NodeBase,
    vrfs: &BTreeMap<String, Vrf>,
    observed: &ObservedNode,
    uplink: Option<&str>,
    out: &mut Diff,
) -> Result<Option<KernelNexthop>, DiffError> {
    let uplink = || {
        uplink.map(str::to_string).ok_or(DiffError::NoUplink {
            underlay: IpAddr::V6(base.underlay.ipv6.unwrap_or(Ipv6Addr::UNSPECIFIED)),
        })
    };
    let resolved = match nh {
        Nexthop::Dev(dev) => KernelNexthop::Dev(dev.clone()),
        // The kernel refuses a source the node does not hold (e.g. a Node object whose
        // InternalIP is not configured here): the route then goes without one. A
        // link-local source is added to the link (see `pod_link_ops`).
        Nexthop::DevSrc { dev, src }
            if link_local(src).is_some() || observed.addrs.iter().any(|(a, _)| a == src) =>
        {
            KernelNexthop::DevSrc {
                dev: dev.clone(),
                src: *src,
            }
        }
        Nexthop::DevSrc { dev, .. } => KernelNexthop::Dev(dev.clone()),
        Nexthop::Seg6Encap { segs, underlay } => KernelNexthop::Seg6Encap {
            segs: *segs,
            dev: match underlay {
                Underpath::Ipv6 => uplink()?,
                Underpath::LinkLocal => uplink4(base, observed)?.0.to_string(),
                Underpath::Fou => IPV4_TUNNEL.to_string(),
            },
        },
        Nexthop::Seg6EncapIngress { segs, dev } => KernelNexthop::Seg6Encap {
            segs: *segs,
            dev: dev.clone(),
        },
        Nexthop::Seg6LocalDt46 { vrf_table, vrf } => KernelNexthop::Seg6LocalDt46 {
            vrf_table: *vrf_table,
            dev: vrf.clone(),
        },
        Nexthop::Underlay { via } => KernelNexthop::Via {
            via: IpAddr::V6(*via),
            dev: uplink()?,
        },
        Nexthop::LinkLocal { via } => KernelNexthop::Via {
            via: IpAddr::V6(*via),
            dev: uplink4(base, observed)?.0.to_string(),
        },
        Nexthop::Ipv4Tunnel { via } => KernelNexthop::Via {
            via: IpAddr::V6(via.to_ipv6_compatible()),
            dev: IPV4_TUNNEL.to_string(),
        },
        Nexthop::Unreachable => KernelNexthop::Unreachable,
        Nexthop::Host => {
            // A host without that route (e.g. no IPv6 default) gets everything else: the
            // route follows once the host has one (the next reconcile resolves it).
            let Some(h) = host_lookup(&observed.host_routes, &key.dst) else {
                out.skipped.push(format!(
                    "route {} table {}: the host's main table has no route for it",
                    key.dst, key.table
                ));
                return Ok(None);
            };
            let dev = h.dev.clone().unwrap_or_default();
            match h.gateway {
                Some(via) => KernelNexthop::Via { via, dev },
                None => KernelNexthop::Dev(dev),
            }
        }
    };
    if let KernelNexthop::Dev(dev) | KernelNexthop::DevSrc { dev, .. } = &resolved {
        if !observed.links.contains_key(dev) && !vrfs.contains_key(dev) {
            out.skipped.push(format!(
                "route {} table {}: no link {dev}",
                key.dst, key.table
            ));
            return Ok(None);
        }
    }
    Ok(Some(resolved))
}

/// The node's link-local underlay address on `@uplink4` when planned, and every other
/// link-local underlay address of Lace's on any link deleted (an old InternalIP, a link that
/// no longer holds the InternalIP, a plan without one).
fn link_local_ops(
    base: &NodeBase,
    observed: &ObservedNode,
    ops: &mut Vec<Op>,
) -> Result<(), DiffError> {
    let mut keep = None;
    if let Some(addr) = base.link_local {
        let (name, l) = uplink4(base, observed)?;
        keep = Some((IpAddr::V6(addr), l.index));
        if !observed.addrs.contains(&(IpAddr::V6(addr), l.index)) {
            ops.push(Op::AddAddress {
                link: name.to_string(),
                addr: IpNet::V6(Ipv6Net::new_assert(addr, LINK_LOCAL_PREFIX)),
            });
        }
    }
    del_link_local_ops(observed, keep, ops);
    Ok(())
}

/// Deletes Lace's link-local underlay addresses, but `keep`.
fn del_link_local_ops(observed: &ObservedNode, keep: Option<(IpAddr, u32)>, ops: &mut Vec<Op>) {
    for &(a, index) in &observed.addrs {
        let IpAddr::V6(v6) = a else { continue };
        if !is_link_local_underlay(v6) || keep == Some((a, index)) {
            continue;
        }
        if let Some(name) = observed.link_name(index) {
            ops.push(Op::DelAddress {
                link: name.to_string(),
                addr: IpNet::V6(Ipv6Net::new_assert(v6, LINK_LOCAL_PREFIX)),
            });
        }
    }
}

/// The link holding the node's IPv4 InternalIP (`@uplink4`), which the link-local path uses.
fn uplink4<'a>(
    base: &NodeBase,
    observed: &'a ObservedNode,
) -> Result<(&'a str, &'a super::ObservedLink), DiffError> {
    let v4 = IpAddr::V4(
        base.underlay
            .ipv4
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
    );
    link_holding(observed, v4).ok_or(DiffError::NoUplink { underlay: v4 })
}

/// Everything Lace owns goes, except the l3mdev rule (shared with every VRF on the host; the
/// kernel's VRF driver installs the same one).
fn teardown(out: &mut Diff, observed: &ObservedNode) {
    del_link_local_ops(observed, None, &mut out.ops);
    for (key, nh) in &observed.routes {
        out.ops.push(Op::DelRoute {
            key: *key,
            nh: nh.clone(),
        });
    }
    for r in &observed.rules {
        if !matches!(
            r.rule,
            Some(Rule {
                action: RuleAction::L3mdev,
                ..
            })
        ) {
            out.ops.push(Op::DelRule(Box::new(r.clone())));
        }
    }
    if observed.nft != NftState::Absent {
        out.ops.push(Op::NftDelete);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{
        NetworkAllocationSpec, NetworkRoutingPolicySpec, NetworkSpec, NodeAllocationSpec, Subnet,
    };
    use crate::dataplane::ObservedLink;
    use crate::plan::{plan, Family};
    use crate::state::{ClusterState, ObjectKey, PodAttachment};

    pub(crate) const UPLINK: &str = "eth0";
    pub(crate) const EGRESS: &str = "inet0";

    fn ul(i: u16) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, i)
    }

    /// Two nodes; `a` reaches itself and the external `internet`, `b` reaches nothing.
    pub(crate) fn state(with_b: bool) -> ClusterState {
        let mut s = ClusterState::default();
        let nets: &[(&str, u8, u16)] = if with_b {
            &[("a", 1, 1), ("b", 2, 2)]
        } else {
            &[("a", 1, 1)]
        };
        for &(name, o, f) in nets {
            s.networks.insert(
                name.into(),
                NetworkSpec {
                    subnets: vec![Subnet {
                        cidr: format!("10.{o}.0.0/16").parse().unwrap(),
                        block_prefix: 24,
                    }],
                    external: false,
                },
            );
            s.network_allocations
                .insert(name.into(), NetworkAllocationSpec { function: f });
        }
        s.networks.insert(
            "internet".into(),
            NetworkSpec {
                subnets: vec![],
                external: true,
            },
        );
        for (n, f, t) in [("a-a", "a", "a"), ("a-inet", "a", "internet")] {
            s.network_routes.insert(
                n.into(),
                NetworkRoutingPolicySpec {
                    from: f.into(),
                    to: t.into(),
                },
            );
        }
        for i in 1..=2u16 {
            s.node_allocations.insert(
                format!("n{i}"),
                NodeAllocationSpec {
                    // Index i + 1: block i of every subnet (10.<o>.<i>.0/24).
                    index: u32::from(i) + 1,
                    locator: format!("2001:db8:100::{i}:0:0/96").parse().unwrap(),
                    underlay: crate::api::Underlay {
                        ipv4: None,
                        ipv6: Some(ul(i)),
                    },
                },
            );
        }
        s
    }

    pub(crate) fn desired(with_b: bool) -> DesiredNode {
        let mut pods = vec![PodAttachment {
            pod: ObjectKey::new("ns", "pa"),
            container_id: "c1".into(),
            host_ifname: "lp-pa".into(),
            network: "a".into(),
            ips: vec!["10.1.1.10/32".parse().unwrap()],
        }];
        if with_b {
            pods.push(PodAttachment {
                pod: ObjectKey::new("ns", "pb"),
                container_id: "c2".into(),
                host_ifname: "lp-pb".into(),
                network: "b".into(),
                ips: vec!["10.2.1.10/32".parse().unwrap()],
            });
        }
        plan("n1", &state(with_b), &pods).unwrap()
    }

    pub(crate) fn link(index: u32) -> ObservedLink {
        ObservedLink {
            index,
            vrf_table: None,
            sit: None,
            dummy: false,
            master: None,
            up: true,
            mtu: 1500,
        }
    }

    /// A host with an uplink, an egress link with the default route, the pod veths, and a
    /// foreign link: nothing of Lace's.
    pub(crate) fn bare_host() -> ObservedNode {
        ObservedNode {
            links: [
                ("lo", 1),
                (UPLINK, 2),
                (EGRESS, 3),
                ("lp-pa", 4),
                ("lp-pb", 5),
                ("keep0", 6),
            ]
            .into_iter()
            .map(|(n, i)| (n.to_string(), link(i)))
            .collect(),
            addrs: vec![(IpAddr::V6(ul(1)), 2)],
            routes: BTreeMap::new(),
            host_routes: vec![
                HostRoute {
                    dst: "0.0.0.0/0".parse().unwrap(),
                    gateway: Some("198.51.100.2".parse().unwrap()),
                    dev: Some(EGRESS.into()),
                },
                HostRoute {
                    dst: "198.51.100.0/24".parse().unwrap(),
                    gateway: None,
                    dev: Some(EGRESS.into()),
                },
            ],
            rules: vec![],
            sysctls: BTreeMap::new(),
            tunsrc: None,
            nft: NftState::Absent,
            fou: None,
        }
    }

    /// A fake kernel: applies `ops` to `o` the way the reconciler's writes change what the
    /// next observation returns.
    pub(crate) fn model(o: &mut ObservedNode, ops: &[Op]) {
        for op in ops {
            match op {
                Op::ReplaceLink { name } | Op::DelLink { name } => {
                    if let Some(l) = o.links.remove(name) {
                        // Its addresses and the routes through it go with it.
                        o.addrs.retain(|(_, i)| *i != l.index);
                        o.routes.retain(|_, nh| nh.dev() != Some(name.as_str()));
                    }
                    // The fou ports are read only while a tunnel device exists.
                    if matches!(op, Op::DelLink { .. }) && o.tunnels().next().is_none() {
                        o.fou = None;
                    }
                }
                Op::AddVrf { name, table } => {
                    let index = 100 + o.links.len() as u32;
                    o.links.insert(
                        name.clone(),
                        ObservedLink {
                            vrf_table: Some(*table),
                            ..link(index)
                        },
                    );
                }
                Op::AddDummy { name } => {
                    let index = 100 + o.links.len() as u32;
                    o.links.insert(
                        name.clone(),
                        ObservedLink {
                            dummy: true,
                            up: false,
                            ..link(index)
                        },
                    );
                }
                Op::AddTunnel { name, sit, mtu } => {
                    let index = 100 + o.links.len() as u32;
                    o.links.insert(
                        name.clone(),
                        ObservedLink {
                            sit: Some(*sit),
                            up: false,
                            mtu: *mtu,
                            ..link(index)
                        },
                    );
                    // The kernel reads the fou ports once a tunnel exists.
                    o.fou.get_or_insert_with(Vec::new);
                }
                Op::LinkUp { name } | Op::TunnelUp { name } => {
                    o.links.get_mut(name).unwrap().up = true
                }
                Op::SetMtu { name, mtu } => o.links.get_mut(name).unwrap().mtu = *mtu,
                Op::AddFou { listener, .. } => {
                    let l = o.fou.get_or_insert_with(Vec::new);
                    l.retain(|x| x.port != listener.port);
                    l.push(*listener);
                }
                Op::DelFou { listener } => {
                    if let Some(l) = &mut o.fou {
                        l.retain(|x| x.port != listener.port);
                    }
                }
                Op::SetMaster { link, master } => {
                    let m = o.links[master].index;
                    let l = o.links.get_mut(link).unwrap();
                    l.master = Some(m);
                    // Enslaving an up link cycles it: its link-local addresses go.
                    let (index, up) = (l.index, l.up);
                    l.up = true;
                    o.addrs
                        .retain(|(a, i)| !(up && *i == index && link_local(a).is_some()));
                }
                Op::AddAddress { link, addr } => {
                    let index = o.links[link].index;
                    o.addrs.push((addr.addr(), index));
                }
                Op::DelAddress { link, addr } => {
                    let index = o.links[link].index;
                    o.addrs.retain(|e| *e != (addr.addr(), index));
                }
                Op::Sysctl { key, value } => {
                    o.sysctls.insert(key.clone(), Some(value.clone()));
                }
                Op::Tunsrc(a) => o.tunsrc = Some(*a),
                Op::NftSwap { tag, .. } | Op::NftElements { tag, .. } => {
                    o.nft = NftState::Present {
                        tag: Some(tag.clone()),
                    }
                }
                Op::AddRule(r) => o.rules.push(ObservedRule {
                    rule: Some(*r),
                    raw: Default::default(),
                }),
                Op::PutRoute { key, nh } => {
                    o.routes.insert(*key, nh.clone());
                }
                Op::DelRoute { key, .. } => {
                    o.routes.remove(key);
                }
                Op::DelRule(r) => o.rules.retain(|x| x != r.as_ref()),
                Op::NftDelete => o.nft = NftState::Absent,
            }
        }
    }

    /// The routes `ops` put, with their next hops.
    fn puts(ops: &[Op]) -> BTreeMap<RouteKey, KernelNexthop> {
        ops.iter()
            .filter_map(|o| match o {
                Op::PutRoute { key, nh } => Some((*key, nh.clone())),
                _ => None,
            })
            .collect()
    }

    fn first(ops: &[Op], f: impl Fn(&Op) -> bool) -> Option<usize> {
        ops.iter().position(f)
    }

    #[test]
    fn from_scratch_everything_is_added_in_a_safe_order() {
        let d = desired(true);
        let diff = diff(Some(&d), &bare_host(), None).unwrap();
        let ops = &diff.ops;
        assert!(diff.skipped.is_empty());
        assert!(ops.windows(2).all(|w| w[0].phase() <= w[1].phase()));
        let first_route = first(ops, |o| matches!(o, Op::PutRoute { .. })).unwrap();
        let last_vrf = ops
            .iter()
            .rposition(|o| matches!(o, Op::AddVrf { .. }))
            .unwrap();
        let nft = first(ops, |o| matches!(o, Op::NftSwap { .. })).unwrap();
        let strict = first(
            ops,
            |o| matches!(o, Op::Sysctl { key, .. } if key == "net.vrf.strict_mode"),
        )
        .unwrap();
        assert!(last_vrf < nft && nft < first_route && strict < first_route);
        assert!(!ops.iter().any(|o| matches!(
            o,
            Op::DelRoute { .. } | Op::DelRule(_) | Op::DelLink { .. } | Op::NftDelete
        )));
        // Every planned route, with symbolic next hops resolved.
        let puts = puts(ops);
        assert_eq!(puts.len(), d.routes().count());
        let egress = RouteKey {
            table: d.base.vrfs["lv-a"].table,
            dst: "0.0.0.0/0".parse().unwrap(),
        };
        assert_eq!(
            puts[&egress],
            KernelNexthop::Via {
                via: "198.51.100.2".parse().unwrap(),
                dev: EGRESS.into()
            },
            "Host next hop = the main table's default route"
        );
        for (k, nh) in &puts {
            match (d.route(k).unwrap(), nh) {
                (Nexthop::Seg6Encap { .. }, KernelNexthop::Seg6Encap { dev, .. })
                | (Nexthop::Underlay { .. }, KernelNexthop::Via { dev, .. }) => {
                    assert_eq!(dev, UPLINK, "{k:?}")
                }
                _ => {}
            }
        }
        assert!(ops.contains(&Op::SetMaster {
            link: "lp-pa".into(),
            master: "lv-a".into()
        }));
        assert!(ops.contains(&Op::Tunsrc(ul(1))));
    }

    #[test]
    fn applying_the_diff_converges_to_no_ops() {
        let d = desired(true);
        let mut o = bare_host();
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        model(&mut o, &ops);
        assert_eq!(diff(Some(&d), &o, None).unwrap(), Diff::default());
    }

    #[test]
    fn removing_a_network_deletes_its_state_last_and_nothing_foreign() {
        let mut o = bare_host();
        let ops = diff(Some(&desired(true)), &o, None).unwrap().ops;
        model(&mut o, &ops);
        let d = desired(false);
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        let table_b = 1_000_002;
        assert!(ops.contains(&Op::DelLink {
            name: "lv-b".into()
        }));
        let dels: Vec<&Op> = ops
            .iter()
            .filter(|o| matches!(o, Op::DelRoute { .. }))
            .collect();
        assert!(dels
            .iter()
            .any(|o| matches!(o, Op::DelRoute { key, .. } if key.table == table_b)));
        // Deletions come after every addition.
        let first_del = first(&ops, |o| {
            matches!(o, Op::DelRoute { .. } | Op::DelLink { .. })
        })
        .unwrap();
        assert!(ops[first_del..]
            .iter()
            .all(|o| matches!(o, Op::DelRoute { .. } | Op::DelRule(_) | Op::DelLink { .. })));
        model(&mut o, &ops);
        assert!(o.routes.keys().all(|k| k.table != table_b));
        assert!(o.links.contains_key("keep0") && o.links.contains_key("lp-pb"));
        assert_eq!(diff(Some(&d), &o, None).unwrap(), Diff::default());
    }

    #[test]
    fn a_table_known_to_hold_the_last_ruleset_gets_only_the_changed_elements() {
        let mut o = bare_host();
        let before = desired(true);
        let ops = diff(Some(&before), &o, None).unwrap().ops;
        let known = KnownRuleset::after(None, Some(&before.base.nft), nft::tag_after(&ops, &o.nft));
        model(&mut o, &ops);
        // Removing Network b changes elements only (its VRF, subnets), not the chains.
        let after = desired(false);
        let ops = diff(Some(&after), &o, known.as_ref()).unwrap().ops;
        let nft_ops: Vec<&Op> = ops
            .iter()
            .filter(|op| matches!(op, Op::NftSwap { .. } | Op::NftElements { .. }))
            .collect();
        assert!(
            matches!(nft_ops.as_slice(), [Op::NftElements { deleted, .. }] if *deleted > 0),
            "{nft_ops:#?}"
        );
        // Without that knowledge (a restarted reconciler) the table is replaced.
        let unknown = diff(Some(&after), &o, None).unwrap().ops;
        assert!(unknown.iter().any(|op| matches!(op, Op::NftSwap { .. })));
        model(&mut o, &ops);
        assert_eq!(diff(Some(&after), &o, None).unwrap(), Diff::default());
    }

    #[test]
    fn teardown_removes_all_of_lace_but_the_shared_l3mdev_rule() {
        let mut o = bare_host();
        let ops = diff(Some(&desired(true)), &o, None).unwrap().ops;
        model(&mut o, &ops);
        let ops = diff(None, &o, None).unwrap().ops;
        model(&mut o, &ops);
        assert!(o.routes.is_empty());
        assert!(o.vrfs().next().is_none());
        assert_eq!(o.nft, NftState::Absent);
        let left: Vec<Rule> = o.rules.iter().filter_map(|r| r.rule).collect();
        assert!(left.iter().all(|r| r.action == RuleAction::L3mdev));
        assert_eq!(left.len(), 2);
        for name in ["lo", UPLINK, EGRESS, "lp-pa", "keep0"] {
            assert!(o.links.contains_key(name), "{name}");
        }
        assert!(diff(None, &o, None).unwrap().ops.is_empty());
    }

    #[test]
    fn a_changed_route_is_replaced_and_a_stray_rule_in_the_band_deleted() {
        let d = desired(true);
        let mut o = bare_host();
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        model(&mut o, &ops);
        let (key, _) = d.routes().next().map(|(k, n)| (*k, n.clone())).unwrap();
        o.routes
            .insert(key, KernelNexthop::Unknown("edited by hand".into()));
        let stray = ObservedRule {
            rule: Some(Rule {
                priority: 995,
                family: Family::V4,
                action: RuleAction::Fwmark {
                    mark: 1,
                    mask: 1,
                    table: 7,
                },
            }),
            raw: Default::default(),
        };
        o.rules.push(stray.clone());
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        assert_eq!(ops.len(), 2, "{ops:#?}");
        assert!(matches!(&ops[0], Op::PutRoute { key: k, .. } if *k == key));
        assert_eq!(ops[1], Op::DelRule(Box::new(stray)));
    }

    #[test]
    fn no_uplink_is_an_error_missing_host_routes_and_pod_links_are_skipped() {
        let d = desired(true);
        let mut o = bare_host();
        o.addrs.clear();
        assert_eq!(
            diff(Some(&d), &o, None).unwrap_err(),
            DiffError::NoUplink {
                underlay: IpAddr::V6(ul(1))
            }
        );
        let mut o = bare_host();
        o.host_routes.clear();
        let without_host = diff(Some(&d), &o, None).unwrap();
        let host_keys: Vec<RouteKey> = d
            .routes()
            .filter(|(_, nh)| **nh == Nexthop::Host)
            .map(|(k, _)| *k)
            .collect();
        assert!(!host_keys.is_empty());
        assert_eq!(
            without_host.skipped.len(),
            host_keys.len(),
            "{:?}",
            without_host.skipped
        );
        assert!(!without_host
            .ops
            .iter()
            .any(|op| matches!(op, Op::PutRoute { key, .. } if host_keys.contains(key))));
        assert!(without_host
            .ops
            .iter()
            .any(|op| matches!(op, Op::PutRoute { .. })));
        let mut o = bare_host();
        o.links.remove("lp-pb");
        let diff = diff(Some(&d), &o, None).unwrap();
        assert_eq!(diff.skipped.len(), 2, "{:?}", diff.skipped); // VRF table + probe table
        assert!(!diff.ops.iter().any(|op| op.to_string().contains("lp-pb")));
    }

    #[test]
    fn ipv6_probe_routes_get_fe80_1_on_the_pod_veth_first() {
        let mut s = state(false);
        s.networks.get_mut("a").unwrap().subnets.push(Subnet {
            cidr: "fd00:1::/48".parse().unwrap(),
            block_prefix: 64,
        });
        // n1 (index 2) holds block 1 of it: fd00:1:0:1::/64.
        let pod = PodAttachment {
            pod: ObjectKey::new("ns", "pa"),
            container_id: "c1".into(),
            host_ifname: "lp-pa".into(),
            network: "a".into(),
            ips: vec![
                "10.1.1.10/32".parse().unwrap(),
                "fd00:1:0:1::10/128".parse().unwrap(),
            ],
        };
        let d = plan("n1", &s, &[pod]).unwrap();
        let probe6 = RouteKey {
            table: PROBE_TABLE,
            dst: "fd00:1:0:1::10/128".parse().unwrap(),
        };
        let gw = IpAddr::V6(crate::plan::POD_GATEWAY_V6);
        let add = Op::AddAddress {
            link: "lp-pa".into(),
            addr: "fe80::1/64".parse().unwrap(),
        };

        let mut o = bare_host();
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        let added = first(&ops, |op| *op == add).expect("no fe80::1 on lp-pa");
        let route = first(
            &ops,
            |op| matches!(op, Op::PutRoute { key, .. } if *key == probe6),
        )
        .expect("no IPv6 probe route");
        assert!(added < route, "{ops:#?}");
        assert_eq!(
            ops[route],
            Op::PutRoute {
                key: probe6,
                nh: KernelNexthop::DevSrc {
                    dev: "lp-pa".into(),
                    src: gw
                }
            }
        );
        assert_eq!(ops.iter().filter(|op| **op == add).count(), 1);
        // Only the pod veth of an IPv6 route gets it, not the IPv4-only one.
        assert!(!ops
            .iter()
            .any(|op| matches!(op, Op::AddAddress { link, .. } if link != "lp-pa")));

        model(&mut o, &ops);
        assert_eq!(
            diff(Some(&d), &o, None).unwrap().ops,
            vec![],
            "not idempotent"
        );

        // Moved out of its VRF (by hand): re-enslaving drops the address, so it is re-added
        // although it is observed now.
        o.links.get_mut("lp-pa").unwrap().master = None;
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        assert!(matches!(ops[0], Op::SetMaster { .. }), "{ops:#?}");
        assert!(ops[1..].contains(&add), "{ops:#?}");
        model(&mut o, &ops);
        assert_eq!(diff(Some(&d), &o, None).unwrap().ops, vec![]);

        // Deleted by hand: added again, the route stays as it is. IPv6 is switched on first
        // (a no-op unless that is why it went: see the tests of hosts that disable IPv6).
        o.addrs.retain(|(a, _)| *a != gw);
        assert_eq!(
            diff(Some(&d), &o, None).unwrap().ops,
            vec![
                Op::Sysctl {
                    key: disable_ipv6_key("lp-pa"),
                    value: "0".into()
                },
                add
            ]
        );
    }

    #[test]
    fn probe_routes_keep_their_source_only_where_the_node_holds_it() {
        let mut d = desired(false);
        let src: IpAddr = "192.0.2.1".parse().unwrap();
        let key = RouteKey {
            table: crate::plan::PROBE_TABLE,
            dst: "10.1.1.10/32".parse().unwrap(),
        };
        d.pod_routes.insert(
            key,
            Nexthop::DevSrc {
                dev: "lp-pa".into(),
                src,
            },
        );
        let put = |o: &ObservedNode| {
            diff(Some(&d), o, None)
                .unwrap()
                .ops
                .into_iter()
                .find_map(|op| match op {
                    Op::PutRoute { key: k, nh } if k == key => Some(nh),
                    _ => None,
                })
        };
        let mut o = bare_host();
        assert_eq!(put(&o), Some(KernelNexthop::Dev("lp-pa".into())));
        o.addrs.push((src, 2));
        assert_eq!(
            put(&o),
            Some(KernelNexthop::DevSrc {
                dev: "lp-pa".into(),
                src
            })
        );
    }

    /// The plan of just `pods` of `d` (what ADD attaches).
    fn just(d: &DesiredNode, dev: &str) -> DesiredNode {
        let mut p = d.clone();
        p.pod_routes.retain(
            |_, nh| matches!(nh, Nexthop::Dev(x) | Nexthop::DevSrc { dev: x, .. } if x == dev),
        );
        p
    }

    #[test]
    fn attach_writes_the_pod_s_part_of_the_plan_and_the_reconcile_nothing_more() {
        let d = desired(true);
        // The node as reconciled before pod b's ADD: everything but pod b; its veth exists.
        let mut before = d.clone();
        before.pod_routes = just(&d, "lp-pa").pod_routes;
        let mut o = bare_host();
        let ops = diff(Some(&before), &o, None).unwrap().ops;
        model(&mut o, &ops);
        assert!(o.links["lp-pb"].master.is_none());

        let pod = just(&d, "lp-pb");
        let ops = attach(&pod, &o).unwrap().ops;
        let b_table = d.base.vrfs["lv-b"].table;
        assert!(ops.windows(2).all(|w| w[0].phase() <= w[1].phase()));
        assert!(ops.contains(&Op::SetMaster {
            link: "lp-pb".into(),
            master: "lv-b".into()
        }));
        for (key, _) in pod_link_sysctls("lp-pb", false) {
            assert!(
                ops.iter()
                    .any(|op| matches!(op, Op::Sysctl { key: k, .. } if *k == key)),
                "{key}: {ops:#?}"
            );
        }
        let puts: BTreeSet<RouteKey> = ops
            .iter()
            .filter_map(|op| match op {
                Op::PutRoute { key, .. } => Some(*key),
                _ => None,
            })
            .collect();
        assert_eq!(puts, pod.pod_routes.keys().copied().collect());
        assert!(puts.iter().any(|k| k.table == b_table));
        assert!(puts.iter().any(|k| k.table == PROBE_TABLE));
        // Nothing but the pod's: no other routes, rules, nft, node sysctls, deletions.
        assert!(
            ops.iter().all(|op| match op {
                Op::SetMaster { .. } | Op::PutRoute { .. } => true,
                Op::Sysctl { key, .. } => key.contains("lp-pb"),
                _ => false,
            }),
            "{ops:#?}"
        );
        model(&mut o, &ops);
        assert_eq!(
            diff(Some(&d), &o, None).unwrap(),
            Diff::default(),
            "the reconcile after the ADD wrote something again"
        );
        assert_eq!(attach(&pod, &o).unwrap(), Diff::default(), "attach twice");
    }

    #[test]
    fn attach_creates_a_missing_vrf_and_a_reconcile_that_ran_first_leaves_it_nothing() {
        let d = desired(false);
        let pod = just(&d, "lp-pa");
        // A fresh node: the first pod's ADD comes before the first reconcile.
        let mut o = bare_host();
        let ops = attach(&pod, &o).unwrap().ops;
        assert_eq!(
            ops[0],
            Op::AddVrf {
                name: "lv-a".into(),
                table: d.base.vrfs["lv-a"].table
            }
        );
        model(&mut o, &ops);
        let rest = diff(Some(&d), &o, None).unwrap().ops;
        assert!(
            !rest.iter().any(|op| op.to_string().contains("lp-pa")),
            "{rest:#?}"
        );
        // The other way round: a reconcile found the veth first and set it up.
        let mut o = bare_host();
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        model(&mut o, &ops);
        assert_eq!(attach(&pod, &o).unwrap(), Diff::default());
    }

    #[test]
    fn a_pod_veth_down_or_out_of_its_vrf_is_put_back() {
        let d = desired(false);
        let mut o = bare_host();
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        model(&mut o, &ops);
        o.links.get_mut("lp-pa").unwrap().up = false;
        assert_eq!(
            diff(Some(&d), &o, None).unwrap().ops,
            vec![Op::LinkUp {
                name: "lp-pa".into()
            }]
        );
        o.links.get_mut("lp-pa").unwrap().master = None;
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        assert!(matches!(&ops[0], Op::SetMaster { link, .. } if link == "lp-pa"));
        assert!(!ops.iter().any(|op| matches!(op, Op::LinkUp { .. })));
    }

    #[test]
    fn drift_sees_only_what_notifications_change() {
        let d = desired(true);
        let mut o = bare_host();
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        model(&mut o, &ops);
        assert_eq!(drift(&d, &o).unwrap(), vec![]);
        // The nft table, sysctls and tunsrc are no notification's business.
        o.nft = NftState::Absent;
        o.sysctls.clear();
        o.tunsrc = None;
        assert_eq!(drift(&d, &o).unwrap(), vec![]);
        assert!(!diff(Some(&d), &o, None).unwrap().ops.is_empty());
        let (key, _) = d.routes().next().unwrap();
        o.routes.remove(key);
        assert!(matches!(
            drift(&d, &o).unwrap().as_slice(),
            [Op::PutRoute { key: k, .. }] if k == key
        ));
    }

    // --- The SRv6-over-IPv4 device ---------------------------------------------------------

    const V4_UPLINK: std::net::Ipv4Addr = std::net::Ipv4Addr::new(192, 0, 2, 1);

    /// `state(false)` with IPv4 InternalIPs `192.0.2.<i>`: n2 has no IPv6, n1 has it if `n1_v6`.
    fn state_v4(n1_v6: bool) -> ClusterState {
        let mut s = state(false);
        for (n, a) in s.node_allocations.iter_mut() {
            a.underlay.ipv4 = Some(std::net::Ipv4Addr::new(192, 0, 2, a.index as u8 - 1));
            if n == "n2" || !n1_v6 {
                a.underlay.ipv6 = None;
            }
        }
        s
    }

    fn desired_v4(s: &ClusterState) -> DesiredNode {
        let pod = PodAttachment {
            pod: ObjectKey::new("ns", "pa"),
            container_id: "c1".into(),
            host_ifname: "lp-pa".into(),
            network: "a".into(),
            ips: vec!["10.1.1.10/32".parse().unwrap()],
        };
        plan("n1", s, &[pod]).unwrap()
    }

    /// [`bare_host`] whose uplink also holds n1's IPv4 InternalIP (and IPv6 only if `v6`).
    fn host_v4(v6: bool) -> ObservedNode {
        let mut o = bare_host();
        if !v6 {
            o.addrs.clear();
        }
        o.addrs.push((IpAddr::V4(V4_UPLINK), 2));
        o
    }

    fn tunnel_of(d: &DesiredNode) -> crate::plan::underlay::Ipv4Tunnel {
        d.base.ipv4_tunnel.expect("a tunnel is planned")
    }

    #[test]
    fn an_ipv4_peer_gets_the_tunnel_up_only_after_its_guard_and_converges() {
        for n1_v6 in [true, false] {
            let d = desired_v4(&state_v4(n1_v6));
            let mut o = host_v4(n1_v6);
            let ops = diff(Some(&d), &o, None).unwrap().ops;
            let at = |f: &dyn Fn(&Op) -> bool| first(&ops, f).unwrap_or_else(|| panic!("{ops:#?}"));
            let add = at(&|o| matches!(o, Op::AddTunnel { .. }));
            assert_eq!(
                ops[add],
                Op::AddTunnel {
                    name: IPV4_TUNNEL.into(),
                    sit: tunnel::planned_sit(&tunnel_of(&d)),
                    mtu: 1500 - 28,
                }
            );
            let nft = at(&|o| matches!(o, Op::NftSwap { .. }));
            let up = at(&|o| matches!(o, Op::TunnelUp { .. }));
            let fou = at(&|o| matches!(o, Op::AddFou { replace: false, .. }));
            let route = at(&|o| matches!(o, Op::PutRoute { .. }));
            assert!(
                add < nft && nft < up && up < route && fou < route,
                "{ops:#?}"
            );
            // Over IPv4: the locator via the peer's IPv4-compatible address, encap on lu-ipv4.
            let puts = puts(&ops);
            let loc = RouteKey {
                table: crate::plan::MAIN_TABLE,
                dst: "2001:db8:100::2:0:0/96".parse().unwrap(),
            };
            assert_eq!(
                puts[&loc],
                KernelNexthop::Via {
                    via: "::192.0.2.2".parse().unwrap(),
                    dev: IPV4_TUNNEL.into()
                }
            );
            let block = RouteKey {
                table: d.base.vrfs["lv-a"].table,
                dst: "10.1.2.0/24".parse().unwrap(),
            };
            assert_eq!(
                puts[&block],
                KernelNexthop::Seg6Encap {
                    segs: "2001:db8:100::2:1:0".parse().unwrap(),
                    dev: IPV4_TUNNEL.into()
                }
            );
            // Without an IPv6 InternalIP, the locator's address is the source, and the device
            // holds it, once IPv6 is enabled on it.
            let src: Ipv6Addr = "2001:db8:100::1:0:0".parse().unwrap();
            if !n1_v6 {
                let sysctl = at(
                    &|o| matches!(o, Op::Sysctl { key, value } if key == "net.ipv6.conf.lu-ipv4.disable_ipv6" && value == "0"),
                );
                let addr = at(
                    &|o| matches!(o, Op::AddAddress { link, addr } if link == IPV4_TUNNEL && addr.addr() == IpAddr::V6(src)),
                );
                assert!(sysctl < addr && addr < up, "{ops:#?}");
                assert!(ops.contains(&Op::Tunsrc(src)));
            } else {
                assert!(!ops
                    .iter()
                    .any(|o| matches!(o, Op::AddAddress { link, .. } if link == IPV4_TUNNEL)));
                assert!(ops.contains(&Op::Tunsrc(ul(1))));
            }
            model(&mut o, &ops);
            assert_eq!(
                diff(Some(&d), &o, None).unwrap(),
                Diff::default(),
                "IPv6 {n1_v6}"
            );
        }
    }

    #[test]
    fn the_tunnel_follows_the_uplink_mtu_and_is_recreated_when_it_differs() {
        let s = state_v4(true);
        let d = desired_v4(&s);
        let mut o = host_v4(true);
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        model(&mut o, &ops);
        // A jumbo uplink: only the device's MTU follows.
        o.links.get_mut(UPLINK).unwrap().mtu = 9000;
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        assert_eq!(
            ops,
            vec![Op::SetMtu {
                name: IPV4_TUNNEL.into(),
                mtu: 9000 - 28
            }]
        );
        model(&mut o, &ops);
        // The InternalIP moves: a new device, and everything that went with the old one (the
        // routes through it, its sysctl) is written again although it looked right before.
        let mut moved = s.clone();
        let new_ip = std::net::Ipv4Addr::new(192, 0, 2, 9);
        moved.node_allocations.get_mut("n1").unwrap().underlay.ipv4 = Some(new_ip);
        o.addrs.push((IpAddr::V4(new_ip), 2));
        let d2 = desired_v4(&moved);
        let ops = diff(Some(&d2), &o, None).unwrap().ops;
        assert_eq!(
            ops[0],
            Op::ReplaceLink {
                name: IPV4_TUNNEL.into()
            }
        );
        assert!(matches!(&ops[1], Op::AddTunnel { sit, .. } if sit.local == Some(new_ip)));
        let via_tunnel = d2
            .routes()
            .filter(|(_, nh)| {
                matches!(
                    nh,
                    Nexthop::Ipv4Tunnel { .. }
                        | Nexthop::Seg6Encap {
                            underlay: crate::plan::Underpath::Fou,
                            ..
                        }
                )
            })
            .count();
        assert!(via_tunnel >= 3);
        assert_eq!(
            ops.iter()
                .filter(|o| matches!(o, Op::PutRoute { nh, .. } if nh.dev() == Some(IPV4_TUNNEL)))
                .count(),
            via_tunnel,
            "{ops:#?}"
        );
        assert!(ops
            .iter()
            .any(|o| matches!(o, Op::Sysctl { key, .. } if key.contains(IPV4_TUNNEL))));
        assert!(
            !ops.iter().any(|o| matches!(o, Op::AddFou { .. })),
            "the port stays"
        );
        model(&mut o, &ops);
        assert_eq!(diff(Some(&d2), &o, None).unwrap(), Diff::default());
        // An address nobody planned on the device (by hand, or an old locator's): re-created.
        let index = o.links[IPV4_TUNNEL].index;
        o.addrs.push(("2001:db8:dead::1".parse().unwrap(), index));
        let ops = diff(Some(&d2), &o, None).unwrap().ops;
        assert_eq!(
            ops[0],
            Op::ReplaceLink {
                name: IPV4_TUNNEL.into()
            }
        );
    }

    #[test]
    fn the_fou_port_goes_before_its_device_and_a_foreign_one_on_it_is_replaced() {
        let d = desired_v4(&state_v4(true));
        for without in [Some(desired(false)), None] {
            let mut o = host_v4(true);
            let ops = diff(Some(&d), &o, None).unwrap().ops;
            model(&mut o, &ops);
            assert!(o.fou.is_some() && o.links.contains_key(IPV4_TUNNEL));
            // No IPv4 peer any more (or no Lace at all).
            let ops = diff(without.as_ref(), &o, None).unwrap().ops;
            let del_fou = first(&ops, |o| matches!(o, Op::DelFou { .. })).expect("fou del");
            let del_link = first(&ops, |o| {
                *o == Op::DelLink {
                    name: IPV4_TUNNEL.into(),
                }
            })
            .expect("link del");
            assert!(del_fou < del_link, "{ops:#?}");
            model(&mut o, &ops);
            assert!(o.tunnels().next().is_none());
            assert_eq!(diff(without.as_ref(), &o, None).unwrap().ops, vec![]);
        }
        // Someone else listens on Lace's port (GUE): replaced. Other ports are not Lace's.
        let mut o = host_v4(true);
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        model(&mut o, &ops);
        let other = FouListener {
            port: 5555,
            family: libc::AF_INET as u8,
            ipproto: Some(4),
        };
        o.fou = Some(vec![
            other,
            FouListener {
                ipproto: None,
                ..FouListener::direct_v4(FOU_PORT, FOU_IPPROTO)
            },
        ]);
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        assert_eq!(
            ops,
            vec![Op::AddFou {
                listener: FouListener::direct_v4(FOU_PORT, FOU_IPPROTO),
                replace: true
            }]
        );
        model(&mut o, &ops);
        assert!(o.fou.as_ref().unwrap().contains(&other));
        let ops = diff(None, &o, None).unwrap().ops;
        assert!(!ops.contains(&Op::DelFou { listener: other }));
    }

    #[test]
    fn a_tunnel_without_a_link_holding_the_ipv4_internal_ip_is_an_error() {
        let d = desired_v4(&state_v4(true));
        assert_eq!(
            diff(Some(&d), &bare_host(), None).unwrap_err(),
            DiffError::NoUplink {
                underlay: IpAddr::V4(V4_UPLINK)
            }
        );
    }

    // --- Hosts that disable IPv6 by default ------------------------------------------------

    /// `state_v4(v6)` with Network `a` dual-stack (`fd00:1::/56`, blocks of /64).
    fn state_dual(n1_v6: bool) -> ClusterState {
        let mut s = state_v4(n1_v6);
        s.networks.get_mut("a").unwrap().subnets.push(Subnet {
            cidr: "fd00:1::/56".parse().unwrap(),
            block_prefix: 64,
        });
        s
    }

    /// n1's plan in `s`: pod `pa` dual-stack on `lp-pa`, pod `pb` IPv4 only on `lp-pb` (both
    /// in Network `a`).
    fn desired_dual(s: &ClusterState) -> DesiredNode {
        let pods = [
            PodAttachment {
                pod: ObjectKey::new("ns", "pa"),
                container_id: "c1".into(),
                host_ifname: "lp-pa".into(),
                network: "a".into(),
                ips: vec![
                    "10.1.1.10/32".parse().unwrap(),
                    "fd00:1:0:1::a/128".parse().unwrap(),
                ],
            },
            PodAttachment {
                pod: ObjectKey::new("ns", "pb"),
                container_id: "c2".into(),
                host_ifname: "lp-pb".into(),
                network: "a".into(),
                ips: vec!["10.1.1.11/32".parse().unwrap()],
            },
        ];
        plan("n1", s, &pods).unwrap()
    }

    fn lace_link(name: &str) -> bool {
        [
            crate::plan::VRF_PREFIX,
            crate::plan::INGRESS_PREFIX,
            crate::plan::underlay::TUNNEL_PREFIX,
            super::super::POD_LINK_PREFIX,
        ]
        .iter()
        .any(|p| name.starts_with(p))
    }

    /// Runs `ops` against a kernel whose `default` disables IPv6: links Lace creates, and the
    /// pod veths (created by the CNI), start with IPv6 off; the host's links have it as
    /// `host_v6` says. Panics where the kernel would refuse an IPv6 address or route on a link
    /// with IPv6 off, and where Lace switches IPv6 on for a link that is not its own.
    fn check_ipv6_order(o: &ObservedNode, ops: &[Op], host_v6: bool) {
        let mut on: BTreeMap<String, bool> = o
            .links
            .keys()
            .map(|n| (n.clone(), !lace_link(n) && host_v6))
            .collect();
        // A link that exists and already holds an IPv6 address has IPv6 on.
        for (n, l) in &o.links {
            if o.addrs.iter().any(|(a, i)| *i == l.index && a.is_ipv6()) {
                on.insert(n.clone(), true);
            }
        }
        for (i, op) in ops.iter().enumerate() {
            let need = |dev: &str| {
                assert!(
                    on.get(dev).copied().unwrap_or(false),
                    "op {i} ({op}) needs IPv6 on {dev}, which is off then:\n{ops:#?}"
                )
            };
            match op {
                Op::AddVrf { name, .. } | Op::AddTunnel { name, .. } => {
                    on.insert(name.clone(), false);
                }
                Op::Sysctl { key, value } if key.ends_with(".disable_ipv6") => {
                    let dev = sysctl_device(key).unwrap();
                    assert!(
                        lace_link(dev),
                        "IPv6 switched on a device that is not Lace's: {key}"
                    );
                    assert_eq!(value, "0");
                    on.insert(dev.to_string(), true);
                }
                Op::AddAddress { link, addr } if addr.addr().is_ipv6() => need(link),
                Op::PutRoute { key, nh } => {
                    if let (IpNet::V6(_), Some(dev)) = (key.dst, nh.dev()) {
                        need(dev)
                    }
                }
                _ => {}
            }
        }
    }

    /// What the kernel does when someone switches IPv6 off on `link`: its IPv6 addresses and
    /// the IPv6 routes through it go (notified); its sysctl reads 1 where it is read.
    fn switch_ipv6_off(o: &mut ObservedNode, link: &str) {
        let index = o.links[link].index;
        o.addrs.retain(|(a, i)| !(*i == index && a.is_ipv6()));
        o.routes
            .retain(|k, nh| !(k.dst.addr().is_ipv6() && nh.dev() == Some(link)));
        if let Some(v) = o.sysctls.get_mut(&disable_ipv6_key(link)) {
            *v = Some("1".into());
        }
    }

    #[test]
    fn every_device_of_lace_s_that_carries_ipv6_gets_it_before_its_addresses_and_routes() {
        // A node without IPv6 on its links at all (SRv6 over IPv4), and one whose uplink has
        // IPv6 (SRv6 over IPv6 and IPv4): only Lace's devices are switched on, each before use.
        for n1_v6 in [false, true] {
            let d = desired_dual(&state_dual(n1_v6));
            let mut o = host_v4(n1_v6);
            let ops = diff(Some(&d), &o, None).unwrap().ops;
            check_ipv6_order(&o, &ops, n1_v6);
            let enabled: BTreeSet<&str> = ops
                .iter()
                .filter_map(|op| match op {
                    Op::Sysctl { key, .. } if key.ends_with(".disable_ipv6") => sysctl_device(key),
                    _ => None,
                })
                .collect();
            // The VRF, the tunnel, the dual-stack pod's veth; not the IPv4-only pod's.
            assert_eq!(
                enabled,
                BTreeSet::from(["lv-a", IPV4_TUNNEL, "lp-pa"]),
                "{ops:#?}"
            );
            model(&mut o, &ops);
            assert_eq!(diff(Some(&d), &o, None).unwrap().ops, vec![]);
        }
    }

    #[test]
    fn attach_switches_ipv6_on_for_the_vrf_it_creates_and_the_pod_s_veth() {
        let s = state_dual(false);
        let d = desired_dual(&s);
        for pod in ["lp-pa", "lp-pb"] {
            let o = host_v4(false);
            let ops = attach(&just(&d, pod), &o).unwrap().ops;
            check_ipv6_order(&o, &ops, false);
            let vrf_on = Op::Sysctl {
                key: disable_ipv6_key("lv-a"),
                value: "0".into(),
            };
            assert!(ops.contains(&vrf_on), "{ops:#?}");
            let veth_on = ops.contains(&Op::Sysctl {
                key: disable_ipv6_key(pod),
                value: "0".into(),
            });
            assert_eq!(veth_on, pod == "lp-pa", "only the pod with IPv6: {ops:#?}");
        }
        // The VRF exists already: attach leaves its sysctls to the reconciles.
        let mut o = host_v4(false);
        let ops = diff(Some(&just(&d, "lp-pb")), &o, None).unwrap().ops;
        model(&mut o, &ops);
        let ops = attach(&just(&d, "lp-pa"), &o).unwrap().ops;
        assert!(
            !ops.iter()
                .any(|op| matches!(op, Op::Sysctl { key, .. } if key.contains("lv-a"))),
            "{ops:#?}"
        );
        check_ipv6_order(&o, &ops, false);
    }

    #[test]
    fn ipv6_switched_off_on_a_lace_device_is_seen_and_switched_on_again_first() {
        let d = desired_dual(&state_dual(false));
        for link in ["lv-a", IPV4_TUNNEL, "lp-pa"] {
            let mut o = host_v4(false);
            let ops = diff(Some(&d), &o, None).unwrap().ops;
            model(&mut o, &ops);
            switch_ipv6_off(&mut o, link);
            // What the kernel notifies (addresses, routes) shows it: the agent repairs at once.
            assert!(!drift(&d, &o).unwrap().is_empty(), "{link}: no drift seen");
            let ops = diff(Some(&d), &o, None).unwrap().ops;
            let on = first(&ops, |op| {
                *op == Op::Sysctl {
                    key: disable_ipv6_key(link),
                    value: "0".into(),
                }
            })
            .unwrap_or_else(|| panic!("{link}: IPv6 not switched on again: {ops:#?}"));
            // Everything IPv6 through the link comes after.
            for (i, op) in ops.iter().enumerate() {
                let through = match op {
                    Op::AddAddress { link: l, addr } => l == link && addr.addr().is_ipv6(),
                    Op::PutRoute { key, nh } => key.dst.addr().is_ipv6() && nh.dev() == Some(link),
                    _ => false,
                };
                assert!(
                    !through || i > on,
                    "{link}: {op} before IPv6 is on: {ops:#?}"
                );
            }
            model(&mut o, &ops);
            assert_eq!(diff(Some(&d), &o, None).unwrap().ops, vec![], "{link}");
        }
    }

    #[test]
    fn a_missing_ipv6_underlay_address_names_disable_ipv6() {
        let d = desired(false);
        let mut o = bare_host();
        o.addrs.clear();
        let e = diff(Some(&d), &o, None).unwrap_err().to_string();
        assert!(
            e.contains("disable_ipv6") && e.contains("IPv4 InternalIP"),
            "{e}"
        );
        let d = desired_v4(&state_v4(true));
        let e = diff(Some(&d), &bare_host(), None).unwrap_err().to_string();
        assert!(!e.contains("disable_ipv6"), "{e}");
    }
    // --- The link-local underlay --------------------------------------------------------------

    /// n1 (IPv4 only) with n2 on its L2 segment, answering when `works`.
    fn desired_ll(works: bool) -> DesiredNode {
        let s = state_v4(false);
        let facts = crate::plan::underlay::UnderlayFacts {
            uplink_ipv6: true,
            on_link: ["n2".to_string()].into(),
            answering: if works {
                ["n2".to_string()].into()
            } else {
                BTreeSet::new()
            },
            answered: ["n2".to_string()].into(),
            uplink_mtu: Some(1500),
        };
        crate::plan::Planner::with_facts("n1", &s, &facts)
            .unwrap()
            .plan(&[])
            .unwrap()
    }

    #[test]
    fn the_link_local_path_holds_the_address_on_the_ipv4_uplink_and_routes_via_the_peers() {
        use crate::plan::underlay::link_local_address;
        let d = desired_ll(true);
        let mut o = host_v4(false);
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        let own = link_local_address(V4_UPLINK);
        let peer = link_local_address(std::net::Ipv4Addr::new(192, 0, 2, 2));
        let add = first(&ops, |o: &Op| {
            matches!(o, Op::AddAddress { link, addr } if link == UPLINK && addr.addr() == IpAddr::V6(own) && addr.prefix_len() == 64)
        })
        .unwrap_or_else(|| panic!("{ops:#?}"));
        let route = first(&ops, |o: &Op| matches!(o, Op::PutRoute { .. })).unwrap();
        assert!(add < route, "{ops:#?}");
        // No fou device: every peer is on the link-local path.
        assert!(
            !ops.iter().any(|o| matches!(o, Op::AddTunnel { .. })),
            "{ops:#?}"
        );
        let put = puts(&ops);
        let loc = RouteKey {
            table: crate::plan::MAIN_TABLE,
            dst: "2001:db8:100::2:0:0/96".parse().unwrap(),
        };
        assert_eq!(
            put[&loc],
            KernelNexthop::Via {
                via: IpAddr::V6(peer),
                dev: UPLINK.into()
            }
        );
        for (k, nh) in &put {
            if let KernelNexthop::Seg6Encap { dev, .. } = nh {
                assert_eq!(dev, UPLINK, "{k:?}");
            }
        }
        // A second apply writes nothing.
        model(&mut o, &ops);
        assert_eq!(diff(Some(&d), &o, None).unwrap().ops, vec![]);
        // The address deleted by hand is drift, put back.
        o.addrs.retain(|(a, _)| *a != IpAddr::V6(own));
        assert!(matches!(
            drift(&d, &o).unwrap().as_slice(),
            [Op::AddAddress { .. }]
        ));
        let repair = drift(&d, &o).unwrap();
        model(&mut o, &repair);
        // Fallen back to fou: the routes move to lu-ipv4, the address stays (the peer's probes
        // need it to find the path working again).
        let fou = desired_ll(false);
        let ops = diff(Some(&fou), &o, None).unwrap().ops;
        assert!(
            !ops.iter().any(|o| matches!(o, Op::DelAddress { .. })),
            "{ops:#?}"
        );
        assert_eq!(
            puts(&ops)[&loc],
            KernelNexthop::Via {
                via: IpAddr::V6(std::net::Ipv4Addr::new(192, 0, 2, 2).to_ipv6_compatible()),
                dev: IPV4_TUNNEL.into()
            }
        );
        model(&mut o, &ops);
        // Without facts (no L2 neighbour): the address goes, after the routes.
        let none = desired_v4(&state_v4(false));
        let ops = diff(Some(&none), &o, None).unwrap().ops;
        assert!(ops.contains(&Op::DelAddress {
            link: UPLINK.into(),
            addr: IpNet::V6(Ipv6Net::new_assert(own, 64))
        }));
        model(&mut o, &ops);
        assert!(!o.addrs.contains(&(IpAddr::V6(own), o.links[UPLINK].index)));
        assert_eq!(diff(Some(&none), &o, None).unwrap().ops, vec![]);
    }

    #[test]
    fn stale_link_local_underlay_addresses_go_and_teardown_takes_them_and_never_the_kernels() {
        use crate::plan::underlay::link_local_address;
        let d = desired_ll(true);
        let mut o = host_v4(false);
        let index = o.links[UPLINK].index;
        // An old InternalIP's address, and the kernel's own link-local: only the first is Lace's.
        let old = link_local_address(std::net::Ipv4Addr::new(192, 0, 2, 99));
        let kernels: Ipv6Addr = "fe80::200:ff:fe00:1".parse().unwrap();
        o.addrs.push((IpAddr::V6(old), index));
        o.addrs.push((IpAddr::V6(kernels), index));
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        let dels: Vec<&Op> = ops
            .iter()
            .filter(|o| matches!(o, Op::DelAddress { .. }))
            .collect();
        assert_eq!(
            dels,
            [&Op::DelAddress {
                link: UPLINK.into(),
                addr: IpNet::V6(Ipv6Net::new_assert(old, 64))
            }]
        );
        model(&mut o, &ops);
        let ops = diff(None, &o, None).unwrap().ops;
        let dels: Vec<IpAddr> = ops
            .iter()
            .filter_map(|o| match o {
                Op::DelAddress { addr, .. } => Some(addr.addr()),
                _ => None,
            })
            .collect();
        assert_eq!(dels, [IpAddr::V6(link_local_address(V4_UPLINK))]);
        model(&mut o, &ops);
        assert!(o.addrs.contains(&(IpAddr::V6(kernels), index)));
    }

    #[test]
    fn the_link_local_path_without_a_link_holding_the_ipv4_internal_ip_names_it() {
        let d = desired_ll(true);
        let e = diff(Some(&d), &bare_host(), None).unwrap_err().to_string();
        assert!(e.contains("192.0.2.1"), "{e}");
    }
}
