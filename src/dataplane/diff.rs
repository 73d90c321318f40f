//! Desired vs observed → ordered operations. Pure: no kernel, deterministic, unit-tested.
//!
//! Symbolic next hops are resolved here against what was observed: `@uplink` is the link
//! holding the node's underlay IPv6 address, [`Nexthop::Host`] is what the host's main table
//! routes for the destination (longest prefix match over its unicast routes).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;

use super::{host, HostRoute, KernelNexthop, NftState, ObservedNode, ObservedRule};
use crate::plan::{DesiredNode, Nexthop, Rule, RuleAction, RouteKey, PROBE_TABLE};

/// Why no operations could be computed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    #[error("no link holds the node's underlay address {underlay}: cannot resolve @uplink")]
    NoUplink { underlay: Ipv6Addr },
    #[error("the host's main table has no route for {dst} (host routing of table {table})")]
    NoHostRoute { dst: IpNet, table: u32 },
    #[error("the nft ruleset cannot be tagged: {0}")]
    Nft(String),
}

/// One change to the kernel, naming its object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Delete a link that has a Lace name but is not the VRF planned (wrong kind or table),
    /// before it is re-created.
    ReplaceLink { name: String },
    AddVrf { name: String, table: u32 },
    LinkUp { name: String },
    /// Enslave a pod's host-side veth to its Network's VRF.
    SetMaster { link: String, master: String },
    Sysctl { key: String, value: String },
    Tunsrc(Ipv6Addr),
    /// Replace table `inet lace` in one transaction (`script` is the whole `nft -f` input).
    NftSwap { script: String, tag: String },
    AddRule(Rule),
    /// Add or replace (`NLM_F_CREATE | NLM_F_REPLACE`) a route.
    PutRoute { key: RouteKey, nh: KernelNexthop },
    DelRoute { key: RouteKey, nh: KernelNexthop },
    DelRule(Box<ObservedRule>),
    DelLink { name: String },
    NftDelete,
}

impl Op {
    /// The apply phase: operations run phase by phase, in this order.
    pub fn phase(&self) -> u8 {
        match self {
            Op::ReplaceLink { .. } => 0,
            Op::AddVrf { .. } => 1,
            Op::LinkUp { .. } => 2,
            Op::SetMaster { .. } => 3,
            Op::Sysctl { .. } => 4,
            Op::Tunsrc(_) => 5,
            Op::NftSwap { .. } => 6,
            Op::AddRule(_) => 7,
            Op::PutRoute { .. } => 8,
            Op::DelRoute { .. } => 9,
            Op::DelRule(_) => 10,
            Op::DelLink { .. } => 11,
            Op::NftDelete => 12,
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
            Op::LinkUp { name } => write!(f, "link set {name} up"),
            Op::SetMaster { link, master } => write!(f, "link set {link} master {master}"),
            Op::Sysctl { key, value } => write!(f, "sysctl {key}={value}"),
            Op::Tunsrc(a) => write!(f, "sr tunsrc set {a}"),
            Op::NftSwap { tag, .. } => write!(f, "nft replace table inet lace ({tag})"),
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
pub fn diff(desired: Option<&DesiredNode>, observed: &ObservedNode) -> Result<Diff, DiffError> {
    let mut out = Diff::default();
    let empty_vrfs = BTreeMap::new();
    let vrfs = desired.map(|d| &d.base.vrfs).unwrap_or(&empty_vrfs);
    let table_vrf: BTreeMap<u32, &str> = vrfs.iter().map(|(n, v)| (v.table, n.as_str())).collect();

    // --- Links: VRFs ------------------------------------------------------------------------
    let mut dels = Vec::new();
    for (name, vrf) in vrfs {
        match observed.links.get(name) {
            Some(l) if l.vrf_table == Some(vrf.table) => {
                if !l.up {
                    out.ops.push(Op::LinkUp { name: name.clone() });
                }
            }
            Some(_) => {
                out.ops.push(Op::ReplaceLink { name: name.clone() });
                out.ops.push(Op::AddVrf {
                    name: name.clone(),
                    table: vrf.table,
                });
            }
            None => out.ops.push(Op::AddVrf {
                name: name.clone(),
                table: vrf.table,
            }),
        }
    }
    for (name, _) in observed.vrfs() {
        if !vrfs.contains_key(name) {
            dels.push(Op::DelLink { name: name.clone() });
        }
    }

    let Some(d) = desired else {
        return Ok(teardown(out, observed, dels));
    };
    let base = &d.base;

    // --- Pod links: enslaved to the VRF of their Network's table ----------------------------
    let mut masters: BTreeMap<&str, &str> = BTreeMap::new();
    for (k, nh) in &d.pod_routes {
        if let (Nexthop::Dev(dev), Some(vrf)) = (nh, table_vrf.get(&k.table)) {
            if k.table != PROBE_TABLE && !vrfs.contains_key(dev) {
                masters.insert(dev, vrf);
            }
        }
    }
    for (link, vrf) in masters {
        let Some(l) = observed.links.get(link) else {
            continue; // reported below with its routes
        };
        let current = l.master.and_then(|m| observed.link_name(m));
        if current != Some(vrf) {
            out.ops.push(Op::SetMaster {
                link: link.to_string(),
                master: vrf.to_string(),
            });
        }
    }

    // --- Sysctls, tunsrc, nft ---------------------------------------------------------------
    for (key, value) in &base.sysctls {
        if observed.sysctls.get(key).and_then(|v| v.as_deref()) != Some(value.as_str()) {
            out.ops.push(Op::Sysctl {
                key: key.clone(),
                value: value.clone(),
            });
        }
    }
    if observed.tunsrc != Some(base.seg6_tunsrc) {
        out.ops.push(Op::Tunsrc(base.seg6_tunsrc));
    }
    let rendered = d.render_nft();
    let tag = host::nft_tag(&rendered);
    if observed.nft != (NftState::Present { tag: Some(tag.clone()) }) {
        let script = host::tagged_ruleset(&rendered, &tag).map_err(DiffError::Nft)?;
        out.ops.push(Op::NftSwap { script, tag });
    }

    // --- Rules ------------------------------------------------------------------------------
    let have: BTreeSet<Rule> = observed.rules.iter().filter_map(|r| r.rule).collect();
    for r in &base.rules {
        if !have.contains(r) {
            out.ops.push(Op::AddRule(*r));
        }
    }
    let mut rule_dels = Vec::new();
    for r in &observed.rules {
        if !r.rule.is_some_and(|x| base.rules.contains(&x)) {
            rule_dels.push(Op::DelRule(Box::new(r.clone())));
        }
    }

    // --- Routes -----------------------------------------------------------------------------
    let uplink = observed
        .addrs_v6
        .iter()
        .find(|(a, _)| *a == base.underlay)
        .and_then(|(_, i)| observed.link_name(*i))
        .ok_or(DiffError::NoUplink {
            underlay: base.underlay,
        })?;
    let mut route_dels = Vec::new();
    let mut wanted: BTreeSet<&RouteKey> = BTreeSet::new();
    for (key, nh) in d.routes() {
        let resolved = match nh {
            Nexthop::Dev(dev) => KernelNexthop::Dev(dev.clone()),
            Nexthop::Seg6Encap { segs } => KernelNexthop::Seg6Encap {
                segs: *segs,
                dev: uplink.to_string(),
            },
            Nexthop::Seg6LocalDt46 { vrf_table, vrf } => KernelNexthop::Seg6LocalDt46 {
                vrf_table: *vrf_table,
                dev: vrf.clone(),
            },
            Nexthop::Underlay { via } => KernelNexthop::Via {
                via: IpAddr::V6(*via),
                dev: uplink.to_string(),
            },
            Nexthop::Unreachable => KernelNexthop::Unreachable,
            Nexthop::Host => {
                let h = host_lookup(&observed.host_routes, &key.dst).ok_or(
                    DiffError::NoHostRoute {
                        dst: key.dst,
                        table: key.table,
                    },
                )?;
                let dev = h.dev.clone().unwrap_or_default();
                match h.gateway {
                    Some(via) => KernelNexthop::Via { via, dev },
                    None => KernelNexthop::Dev(dev),
                }
            }
        };
        if let KernelNexthop::Dev(dev) = &resolved {
            if !observed.links.contains_key(dev) && !vrfs.contains_key(dev) {
                out.skipped
                    .push(format!("route {} table {}: no link {dev}", key.dst, key.table));
                continue;
            }
        }
        wanted.insert(key);
        if observed.routes.get(key) != Some(&resolved) {
            out.ops.push(Op::PutRoute {
                key: *key,
                nh: resolved,
            });
        }
    }
    for (key, nh) in &observed.routes {
        if !wanted.contains(key) {
            route_dels.push(Op::DelRoute {
                key: *key,
                nh: nh.clone(),
            });
        }
    }

    out.ops.extend(route_dels);
    out.ops.extend(rule_dels);
    out.ops.extend(dels);
    debug_assert!(out.ops.windows(2).all(|w| w[0].phase() <= w[1].phase()));
    Ok(out)
}

/// Everything Lace owns goes, except the l3mdev rule (shared with every VRF on the host; the
/// kernel's VRF driver installs the same one).
fn teardown(mut out: Diff, observed: &ObservedNode, link_dels: Vec<Op>) -> Diff {
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
    out.ops.extend(link_dels);
    if observed.nft != NftState::Absent {
        out.ops.push(Op::NftDelete);
    }
    out
}
