//! Desired vs observed → ordered operations. Pure: no kernel, deterministic, unit-tested.
//!
//! Symbolic next hops are resolved here against what was observed: `@uplink` is the link
//! holding the node's underlay IPv6 address, [`Nexthop::Host`] is what the host's main table
//! routes for the destination (longest prefix match over its unicast routes), and the MTU of
//! the SRv6-over-IPv4 device is that of the link holding the node's underlay IPv4 address minus
//! what the outer IPv4 and UDP headers take. The uplinks are resolved here, before the parts
//! below are asked for their operations, so none of them needs [`DiffError`] (the nft part
//! fails only with its own [`UntaggableRuleset`]).
//!
//! Its parts, pure too: the VRFs' ingress devices (`ingress`), the SRv6-over-IPv4 device
//! (`tunnel`), the nft table (`nft`: which transaction, if any, makes it hold the plan) and
//! the pods' bandwidth (`shaping`).

mod ingress;
pub(super) mod nft;
mod shaping;
pub(super) mod tunnel;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};

use ipnet::{IpNet, Ipv6Net};

pub use nft::{KnownRuleset, UntaggableRuleset};

use super::observed::{
    FouListener, HostRoute, KernelNexthop, KernelRoutesIter, LinkName, LinkTc, NftState,
    ObservedLink, ObservedNode,
};
use super::op::Op;
use crate::plan::underlay::{
    is_link_local_underlay, FOU_IPPROTO, FOU_PORT, IPV4_TUNNEL, LINK_LOCAL_PREFIX,
};
use crate::plan::{
    disable_ipv6_key, sysctl_device, DesiredNode, Nexthop, NodeBase, PlannedRun, RouteKey, Rule,
    RuleAction, Tables, Underpath, Vrf, FIB_SYNC_MEM, POD_GATEWAY_V6_PREFIX, PROBE_TABLE,
};

/// Why no operations could be computed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    #[error("no link holds the node's underlay address {underlay} (its InternalIP in the NodeAllocation): cannot resolve the uplink{}", no_uplink_hint(.underlay))]
    NoUplink { underlay: IpAddr },
    #[error("the nft ruleset cannot be tagged: {0}")]
    Nft(#[from] UntaggableRuleset),
}

/// What to check when no link holds an IPv6 underlay address: disabling IPv6 on a link takes
/// its IPv6 addresses with it.
fn no_uplink_hint(underlay: &IpAddr) -> &'static str {
    match underlay {
        IpAddr::V6(_) => "; if IPv6 is disabled on the link that should hold it (net.ipv6.conf.<link>.disable_ipv6=1), so is the address: enable IPv6 there, or give the Node only its IPv4 InternalIP (kubelet --node-ip) so that its peers reach it over IPv4",
        IpAddr::V4(_) => "",
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
    let rendered = desired.map(|d| nft::Rendered::of(d.render_nft()));
    diff_in(desired, observed, known_nft, Scope::All(rendered.as_ref()))
}

/// [`diff`] of a plan whose nft ruleset was rendered already: `rendered_nft` is `desired`'s
/// [`DesiredNode::render_nft`] (a reconcile renders it while it observes the kernel).
pub fn diff_rendered(
    desired: &DesiredNode,
    rendered_nft: &nft::Rendered,
    observed: &ObservedNode,
    known_nft: Option<&KnownRuleset>,
) -> Result<Diff, DiffError> {
    diff_in(
        Some(desired),
        observed,
        known_nft,
        Scope::All(Some(rendered_nft)),
    )
}

/// The operations a reconcile would issue for what rtnetlink notifies (links, addresses,
/// rules, routes), leaving out the nft table, sysctls, `ip sr tunsrc` and the pods' qdiscs
/// and filters, whose observation the notifications do not change: empty while the kernel holds what Lace last applied of
/// `desired`, whatever else changed. This is how the reconciler tells drift (something of
/// Lace's changed without Lace) from its own writes echoing back and from changes to foreign
/// objects.
pub fn drift(desired: &DesiredNode, observed: &ObservedNode) -> Result<Vec<Op>, DiffError> {
    Ok(diff_in(Some(desired), observed, None, Scope::Notified)?.ops)
}

/// The operations that give the pods of `pods` (a plan whose `pod_routes` and `shaping` are
/// theirs, e.g. [`crate::plan::Planner::plan`] of one attachment) what the full plan holds
/// for them: their Networks' VRFs (created if missing), their host veths enslaved and up
/// (with their proxy ARP sysctls), the link-local sources of their IPv6 probe routes, their
/// shaping (`tc`: what was read of their links' qdiscs and filters), their routes, and their
/// Networks' routes for local pods ([`crate::plan::NodeBase::pod_reach`]).
/// Nothing else and no deletions: CNI ADD applies this, so the reconcile that follows finds
/// the pod already as planned and writes nothing for it.
pub fn attach(
    pods: &DesiredNode,
    observed: &ObservedNode,
    tc: &BTreeMap<String, LinkTc>,
) -> Result<Diff, DiffError> {
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
    shaping::ops(&pods.shaping, observed, tc, false, &mut out.ops);
    let uplink = uplink(&pods.base, observed);
    let devs = OutDevs::new(&pods.base, observed);
    // A Network's first pod here brings its table's routes to the blocks it reaches, through
    // links a reconcile made (the SRv6-over-IPv4 device, the other VRFs): before there is
    // one, they are left to it. Every ADD of such a Network walks them (thousands at scale):
    // one merge walk beside the kernel's, as the diff's, the encap routes compared unbuilt.
    let reach = || {
        pods.base
            .pod_reach
            .in_tables(&pods.served_tables, Tables::ALL)
    };
    let mut have = (reach().next())
        .map(|(first, _)| observed.routes.range_from(first))
        .into_iter()
        .flatten()
        .peekable();
    let unchanged_via = encap_dev(uplink, &fresh);
    for (key, nh) in reach() {
        while have.next_if(|(k, _)| *k < key).is_some() {}
        let current = have.next_if(|(k, _)| *k == key).map(|(_, old)| old);
        if unchanged_encap(nh, current, unchanged_via) {
            continue;
        }
        let Ok(Some(resolved)) = resolve(key, nh, &pods.base, &vrfs, observed, &devs, &mut out)
        else {
            continue; // the reconcile says why
        };
        let ready = resolved
            .dev()
            .is_none_or(|d| observed.links.contains_key(d));
        if ready && current != Some(&resolved) {
            out.ops.push(Op::PutRoute {
                key: *key,
                nh: resolved,
            });
        }
    }
    for (key, nh) in &pods.pod_routes {
        if let Some(resolved) = resolve(key, nh, &pods.base, &vrfs, observed, &devs, &mut out)? {
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
enum Scope<'a> {
    /// Everything, with the plan's nft ruleset rendered (`None`: no plan).
    All(Option<&'a nft::Rendered>),
    /// What rtnetlink notifications show: see [`drift`].
    Notified,
}

fn diff_in(
    desired: Option<&DesiredNode>,
    observed: &ObservedNode,
    known_nft: Option<&KnownRuleset>,
    scope: Scope<'_>,
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
    ingress::ops(vrfs, observed, &mut fresh, &mut out.ops);

    // --- Links: the SRv6-over-IPv4 device and its fou port ----------------------------------
    let tunnel = desired.and_then(|d| d.base.ipv4_tunnel.as_ref());
    if let Some(t) = tunnel {
        let underlay = IpAddr::V4(t.local);
        let (_, uplink) = observed
            .link_holding(underlay)
            .ok_or(DiffError::NoUplink { underlay })?;
        if tunnel::ops(t, uplink, observed, &mut out.ops) {
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
        shaping::ops(&BTreeMap::new(), observed, &observed.tc, true, &mut out.ops);
        teardown(&mut out, observed);
        out.ops.sort_by_key(Op::phase);
        return Ok(out);
    };
    let base = &d.base;
    pod_link_ops(
        d,
        vrfs,
        observed,
        matches!(scope, Scope::All(_)),
        &mut out.ops,
    );
    link_local_ops(base, observed, &mut out.ops)?;
    let mut shaping = Vec::new();
    shaping::ops(&d.shaping, observed, &observed.tc, true, &mut shaping);
    if scope == Scope::Notified {
        // Qdiscs and filters are read by each reconcile, never notified; the shapers are
        // links.
        shaping.retain(|o| {
            matches!(
                o,
                Op::AddShaper { .. } | Op::LinkUp { .. } | Op::DelLink { .. }
            )
        });
    }
    out.ops.extend(shaping);

    // --- nft, sysctls, tunsrc: read afresh by every reconcile, never notified -------------
    // A plan's diff of everything comes with its ruleset rendered (`diff`, `diff_rendered`).
    if let Scope::All(Some(rendered)) = scope {
        out.ops
            .extend(nft::op(d.nft(), rendered, &observed.nft, known_nft)?);
        for (key, value) in &base.sysctls {
            let of_fresh = sysctl_device(key).is_some_and(|l| fresh.contains(l));
            let have = observed.sysctls.get(key).and_then(|v| v.as_deref());
            if of_fresh || !sysctl_holds(key, value, have) {
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
    let routes = RouteWalk::new(base, vrfs, observed, &fresh);
    let Diff {
        ops: mut route_ops,
        skipped,
    } = routes.ops_of_all(d, PARALLEL_WALK)?;
    // The routes' operations (a fresh node's 195,000 at 5,000 x 50, 20 MB) stay where the
    // walk put them and the others join them: only routes are in their phases, so the sort
    // below gives the same order as the other way round.
    route_ops.append(&mut out.ops);
    out.ops = route_ops;
    out.skipped.extend(skipped);
    if scope == Scope::Notified {
        // The fou ports are read by each reconcile, never notified.
        out.ops
            .retain(|o| !matches!(o, Op::AddFou { .. } | Op::DelFou { .. }));
    }
    // Stable: within a phase, the order above.
    out.ops.sort_by_key(Op::phase);
    Ok(out)
}

/// Kernel routes from which a diff walks its tables in two halves on two threads.
const PARALLEL_WALK: usize = 50_000;

/// What the route part of a diff resolves planned routes against.
struct RouteWalk<'a> {
    base: &'a NodeBase,
    vrfs: &'a BTreeMap<String, Vrf>,
    observed: &'a ObservedNode,
    devs: OutDevs,
    /// Links the diff creates or re-creates: routes through them are written again.
    fresh: &'a BTreeSet<&'a str>,
    /// See [`encap_dev`].
    encap_dev: Option<&'a str>,
}

impl<'a> RouteWalk<'a> {
    fn new(
        base: &'a NodeBase,
        vrfs: &'a BTreeMap<String, Vrf>,
        observed: &'a ObservedNode,
        fresh: &'a BTreeSet<&'a str>,
    ) -> Self {
        let uplink = uplink(base, observed);
        Self {
            base,
            vrfs,
            observed,
            devs: OutDevs::new(base, observed),
            fresh,
            encap_dev: encap_dev(uplink, fresh),
        }
    }

    /// The route operations for every table; from `parallel_from` kernel routes on, in two
    /// halves at once (the kernel's routes are read by then; what an agent restart waits on
    /// after that is mostly this walk).
    fn ops_of_all(&self, d: &DesiredNode, parallel_from: usize) -> Result<Diff, DiffError> {
        let Some(middle) = self.observed.routes.middle_table() else {
            return self.ops(d, Tables::ALL);
        };
        if self.observed.routes.len() < parallel_from {
            return self.ops(d, Tables::ALL);
        }
        let (first, second) = std::thread::scope(|s| {
            let second = s.spawn(|| self.ops(d, Tables::from(middle)));
            let first = self.ops(d, Tables::below(middle));
            let second = second
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (first, second)
        });
        let (mut first, second) = (first?, second?);
        first.ops.extend(second.ops);
        first.skipped.extend(second.skipped);
        Ok(first)
    }

    /// The route operations for the tables in `tables`: both sides are sorted by key, so one
    /// merge walk, no set of the wanted keys and no lookups (at 300,000 routes those were
    /// most of an unchanged re-apply's diff). The plan's runs of routes are compared with the
    /// kernel's lists as lists first: most routes of a large node are unchanged remote block
    /// routes, and comparing them so took the walk of an unchanged node at 5,000 nodes x 50
    /// Networks from 4.2 to 2.8 ms (natively, one thread; route by route through merged
    /// iterators before).
    fn ops(&self, d: &DesiredNode, tables: Tables) -> Result<Diff, DiffError> {
        let mut out = Diff::default();
        let mut have = self.observed.routes.of_tables(tables);
        let same =
            |nh: &Nexthop, old: &KernelNexthop| unchanged_encap(nh, Some(old), self.encap_dev);
        for run in d.route_runs_of_tables(tables) {
            match run {
                PlannedRun::Routes(mut routes) => loop {
                    routes = &routes[have.skip_same(routes, same)..];
                    let Some(((key, nh), rest)) = routes.split_first() else {
                        break;
                    };
                    self.route_ops(key, nh, &mut have, &mut out)?;
                    routes = rest;
                },
                PlannedRun::One(key, nh) => self.route_ops(key, nh, &mut have, &mut out)?,
            }
        }
        for (key, old) in have {
            out.ops.push(Op::DelRoute {
                key: *key,
                nh: old.clone(),
            });
        }
        Ok(out)
    }

    /// The operations for planned route `key` via `nh`: those for the kernel's routes before
    /// it in `have` (deleted), then for it.
    fn route_ops(
        &self,
        key: &RouteKey,
        nh: &Nexthop,
        have: &mut KernelRoutesIter<'_>,
        out: &mut Diff,
    ) -> Result<(), DiffError> {
        let del = |key: &RouteKey, nh: &KernelNexthop| Op::DelRoute {
            key: *key,
            nh: nh.clone(),
        };
        let current = loop {
            let Some((k, old)) = have.peek() else {
                break None;
            };
            match k.cmp(key) {
                Ordering::Less => out.ops.push(del(k, old)),
                Ordering::Equal => {
                    have.next();
                    break Some(old);
                }
                Ordering::Greater => break None,
            }
            have.next();
        };
        if unchanged_encap(nh, current, self.encap_dev) {
            return Ok(());
        }
        let resolved = resolve(
            key,
            nh,
            self.base,
            self.vrfs,
            self.observed,
            &self.devs,
            out,
        )?;
        let Some(resolved) = resolved else {
            // Not installable now: whatever the kernel holds under that key goes.
            if let Some(old) = current {
                out.ops.push(del(key, old));
            }
            return Ok(());
        };
        let via_fresh = resolved.dev().is_some_and(|d| self.fresh.contains(d));
        if via_fresh || current != Some(&resolved) {
            out.ops.push(Op::PutRoute {
                key: *key,
                nh: resolved,
            });
        }
        Ok(())
    }
}

/// Whether sysctl `key`, read as `have` (`None`: absent or unreadable), already holds the
/// planned `want`. [`FIB_SYNC_MEM`] is a floor that only the initial network namespace has:
/// absent is nothing to raise, and a larger value stays.
fn sysctl_holds(key: &str, want: &str, have: Option<&str>) -> bool {
    if key != FIB_SYNC_MEM {
        return have == Some(want);
    }
    let Some(have) = have else {
        return true;
    };
    let number = |v: &str| v.trim().parse::<u64>().ok();
    matches!((number(have), number(want)), (Some(have), Some(want)) if have >= want)
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
    observed.link_holding(IpAddr::V6(u)).map(|(name, _)| name)
}

/// The device through which the kernel's remote block routes over the IPv6 underlay stand
/// unchanged: the uplink, unless the diff creates or re-creates it (`fresh`).
fn encap_dev<'a>(uplink: Option<&'a str>, fresh: &BTreeSet<&str>) -> Option<&'a str> {
    uplink.filter(|u| !fresh.contains(u))
}

/// Whether the kernel holds remote block route `nh` over the IPv6 underlay as [`resolve`]
/// would write it, through `encap_dev` (see [`encap_dev`]): most of a node's routes,
/// recognised without building their kernel form (which allocates the uplink's name).
fn unchanged_encap(nh: &Nexthop, current: Option<&KernelNexthop>, encap_dev: Option<&str>) -> bool {
    match (nh, current) {
        (
            Nexthop::Seg6Encap {
                segs,
                underlay: Underpath::Ipv6,
            },
            Some(KernelNexthop::Seg6Encap { segs: have, dev }),
        ) => have == segs && encap_dev == Some(&**dev),
        _ => false,
    }
}

/// The names of the devices that routes to other nodes go out of, made once per diff: most
/// of a large node's routes name one of them, and a name made per route was an allocation
/// per route (195,000 in a fresh node's first diff at 5,000 nodes x 50 Networks).
struct OutDevs {
    /// `@uplink`, if a link holds the node's IPv6 underlay address.
    uplink: Option<LinkName>,
    /// `@uplink4`, if a link holds its IPv4 InternalIP.
    uplink4: Option<LinkName>,
    /// The SRv6-over-IPv4 device.
    tunnel: LinkName,
}

impl OutDevs {
    fn new(base: &NodeBase, observed: &ObservedNode) -> Self {
        Self {
            uplink: uplink(base, observed).map(LinkName::from),
            uplink4: uplink4(base, observed).ok().map(|(name, _)| name.into()),
            tunnel: IPV4_TUNNEL.into(),
        }
    }
}

/// The kernel form of planned route `key` via `nh`, resolved against what was observed, or
/// `None` (and a line in `out.skipped`) when it cannot be installed now.
fn resolve(
    key: &RouteKey,
    nh: &Nexthop,
    base: &NodeBase,
    vrfs: &BTreeMap<String, Vrf>,
    observed: &ObservedNode,
    devs: &OutDevs,
    out: &mut Diff,
) -> Result<Option<KernelNexthop>, DiffError> {
    let uplink = || {
        devs.uplink.clone().ok_or(DiffError::NoUplink {
            underlay: IpAddr::V6(base.underlay.ipv6.unwrap_or(Ipv6Addr::UNSPECIFIED)),
        })
    };
    let uplink4 = || match &devs.uplink4 {
        Some(name) => Ok(name.clone()),
        None => uplink4(base, observed).map(|(name, _)| name.into()),
    };
    let resolved = match nh {
        Nexthop::Dev(dev) => KernelNexthop::Dev(dev.as_str().into()),
        // The kernel refuses a source the node does not hold (e.g. a Node object whose
        // InternalIP is not configured here): the route then goes without one. A
        // link-local source is added to the link (see `pod_link_ops`).
        Nexthop::DevSrc { dev, src }
            if link_local(src).is_some() || observed.addrs.iter().any(|(a, _)| a == src) =>
        {
            KernelNexthop::DevSrc {
                dev: dev.as_str().into(),
                src: *src,
            }
        }
        Nexthop::DevSrc { dev, .. } => KernelNexthop::Dev(dev.as_str().into()),
        Nexthop::Seg6Encap { segs, underlay } => KernelNexthop::Seg6Encap {
            segs: *segs,
            dev: match underlay {
                Underpath::Ipv6 => uplink()?,
                Underpath::LinkLocal => uplink4()?,
                Underpath::Fou => devs.tunnel.clone(),
            },
        },
        Nexthop::Seg6EncapIngress { segs, dev } => KernelNexthop::Seg6Encap {
            segs: *segs,
            dev: dev.as_str().into(),
        },
        Nexthop::Seg6LocalDt46 { vrf_table, vrf } => KernelNexthop::Seg6LocalDt46 {
            vrf_table: *vrf_table,
            dev: vrf.as_str().into(),
        },
        Nexthop::Underlay { via } => KernelNexthop::Via {
            via: IpAddr::V6(*via),
            dev: uplink()?,
        },
        Nexthop::LinkLocal { via } => KernelNexthop::Via {
            via: IpAddr::V6(*via),
            dev: uplink4()?,
        },
        Nexthop::Ipv4Tunnel { via } => KernelNexthop::Via {
            via: IpAddr::V6(via.to_ipv6_compatible()),
            dev: devs.tunnel.clone(),
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
            let dev = h.dev.as_deref().unwrap_or_default().into();
            match h.gateway {
                Some(via) => KernelNexthop::Via { via, dev },
                None => KernelNexthop::Dev(dev),
            }
        }
    };
    if let KernelNexthop::Dev(dev) | KernelNexthop::DevSrc { dev, .. } = &resolved {
        if !observed.links.contains_key(&**dev) && !vrfs.contains_key(&**dev) {
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
) -> Result<(&'a str, &'a ObservedLink), DiffError> {
    let v4 = IpAddr::V4(
        base.underlay
            .ipv4
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
    );
    observed
        .link_holding(v4)
        .ok_or(DiffError::NoUplink { underlay: v4 })
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
mod tests;
