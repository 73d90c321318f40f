//! [`Op`]: one change to the kernel, naming its object, as the diff computes it and apply
//! carries it out. Its [`Op::phase`] orders an apply (see the ordering in the module docs of
//! `dataplane`); its text (`ip`-like) names it in logs and errors.

use std::fmt;
use std::net::Ipv6Addr;

use ipnet::IpNet;

use super::observed::{FouListener, KernelNexthop, ObservedRule, SitLink};
use crate::bandwidth::Bucket;
use crate::plan::shaping::{FILTER_PRIORITY, QDISC_MAJOR, SHAPER_PREFIX};
use crate::plan::{RouteKey, Rule};

/// What an update of the table changes, for the apply report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Update {
    /// Elements deleted and added.
    pub deleted: usize,
    pub added: usize,
    /// Chains that come, go or have their rules written again.
    pub chains: Vec<String>,
    /// Sets and maps that come and go.
    pub sets_added: usize,
    pub sets_removed: usize,
}

impl fmt::Display for Update {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} element(s) deleted, {} added",
            self.deleted, self.added
        )?;
        if !self.chains.is_empty() {
            write!(f, ", chain(s) written: {}", self.chains.join(" "))?;
        }
        if self.sets_added + self.sets_removed > 0 {
            write!(
                f,
                ", {} set(s) added, {} removed",
                self.sets_added, self.sets_removed
            )?;
        }
        Ok(())
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
    /// `ip link add <name> type ifb` and up: a pod's shaper.
    AddShaper {
        name: String,
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
    /// route, on the pod's host-side veth (see [`Nexthop::DevSrc`](crate::plan::Nexthop::DevSrc)), the tunnel source on
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
    /// `tc qdisc replace dev <link> root handle 4c: tbf ...`: a pod's bucket on its veth
    /// (towards it) or its shaper (from it).
    PutTbf {
        link: String,
        bucket: Bucket,
    },
    /// `tc qdisc add dev <link> ingress`, on a pod veth, for the filter to its shaper.
    AddIngressQdisc {
        link: String,
    },
    /// `tc filter del dev <link> parent ffff: prio 76`: Lace's filter on a pod veth, not as
    /// planned, before it is added again.
    DelRedirect {
        link: String,
    },
    /// `tc filter add dev <link> parent ffff: prio 76 protocol all u32 match u32 0 0 action
    /// mirred egress redirect dev <shaper>`: everything the pod sends to its shaper.
    AddRedirect {
        link: String,
        shaper: String,
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
    /// Change table `inet lace` in place, in one transaction (`script`): delete and add
    /// elements, sets and chains, write the rules of the chains that change, and swap its tag
    /// (the table held a known ruleset with the same base chains).
    NftUpdate {
        script: String,
        tag: String,
        update: Update,
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
    /// `tc qdisc del dev <link> root handle 4c:`: a pod's bucket no longer planned.
    DelTbf {
        link: String,
    },
    /// `tc qdisc del dev <link> ingress`, with Lace's filter on it.
    DelIngressQdisc {
        link: String,
    },
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
    /// Whether this is part of a pod's bandwidth shaping: its shaper link (`ls-*`), a root
    /// `tbf`, the `ingress` qdisc or the redirect filter. No other operation depends on one,
    /// so a failed one does not stop the later phases of an apply.
    pub fn is_shaping(&self) -> bool {
        match self {
            Op::AddShaper { .. }
            | Op::PutTbf { .. }
            | Op::AddIngressQdisc { .. }
            | Op::DelRedirect { .. }
            | Op::AddRedirect { .. }
            | Op::DelTbf { .. }
            | Op::DelIngressQdisc { .. } => true,
            Op::LinkUp { name } | Op::DelLink { name } => name.starts_with(SHAPER_PREFIX),
            _ => false,
        }
    }

    /// The apply phase: operations run phase by phase, in this order.
    pub fn phase(&self) -> u8 {
        match self {
            Op::ReplaceLink { .. } => 0,
            Op::AddVrf { .. }
            | Op::AddDummy { .. }
            | Op::AddTunnel { .. }
            | Op::AddShaper { .. } => 1,
            Op::LinkUp { .. } | Op::SetMtu { .. } => 2,
            // A pod's shaping, once its shaper exists, before its routes carry traffic.
            Op::SetMaster { .. }
            | Op::PutTbf { .. }
            | Op::AddIngressQdisc { .. }
            | Op::DelRedirect { .. }
            | Op::AddRedirect { .. } => 3,
            // Before sysctls: the ruleset's `ct` expressions load conntrack, which registers
            // `net.netfilter.nf_hooks_lwtunnel`.
            Op::NftSwap { .. } | Op::NftUpdate { .. } => 4,
            Op::Sysctl { .. } => 5,
            // After enslaving: moving an up link into a VRF cycles it, which drops its
            // link-local addresses; after sysctls: the tunnel's IPv6 may have been disabled.
            Op::AddAddress { .. } => 6,
            // The tunnel starts decapsulating only once the ruleset guarding it is in.
            Op::Tunsrc(_) | Op::TunnelUp { .. } | Op::AddFou { .. } => 7,
            Op::AddRule(_) => 8,
            Op::PutRoute { .. } => 9,
            Op::DelRoute { .. } => 10,
            // After the routes through its link that may still use it; the filter to a
            // shaper goes before the shaper.
            Op::DelAddress { .. } | Op::DelTbf { .. } | Op::DelIngressQdisc { .. } => 11,
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
            Op::AddShaper { name } => write!(f, "link add {name} type ifb up"),
            Op::PutTbf { link, bucket } => write!(
                f,
                "tc qdisc replace dev {link} root handle {QDISC_MAJOR:x}: tbf {bucket}"
            ),
            Op::AddIngressQdisc { link } => write!(f, "tc qdisc add dev {link} ingress"),
            Op::DelRedirect { link } => write!(
                f,
                "tc filter del dev {link} parent ffff: prio {FILTER_PRIORITY} (to add it as planned)"
            ),
            Op::AddRedirect { link, shaper } => write!(
                f,
                "tc filter add dev {link} parent ffff: prio {FILTER_PRIORITY} protocol all u32 \
                 match u32 0 0 action mirred egress redirect dev {shaper}"
            ),
            Op::DelTbf { link } => {
                write!(f, "tc qdisc del dev {link} root handle {QDISC_MAJOR:x}:")
            }
            Op::DelIngressQdisc { link } => write!(f, "tc qdisc del dev {link} ingress"),
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
            Op::NftUpdate { tag, update, .. } => {
                write!(f, "nft update table inet lace: {update} ({tag})")
            }
            Op::AddRule(r) => write!(f, "rule add {r}"),
            Op::PutRoute { key, nh } => write!(
                f,
                "{}route replace {} table {}{} {nh}",
                fam(&key.dst),
                key.dst,
                key.table,
                key.metric_suffix()
            ),
            Op::DelRoute { key, nh } => write!(
                f,
                "{}route del {} table {}{} ({nh})",
                fam(&key.dst),
                key.dst,
                key.table,
                key.metric_suffix()
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
