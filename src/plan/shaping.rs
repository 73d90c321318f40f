//! Bandwidth (the runtime's `bandwidth`): a local pod's traffic shaped by token bucket filters
//! (`tbf`) around its host-side veth, the topology of the reference `bandwidth` plugin:
//! - **towards the pod** (its ingress): the `tbf` is the veth's root qdisc, since what the
//!   node sends into the veth is what the pod receives;
//! - **from the pod** (its egress): the veth's `ingress` qdisc redirects everything the pod
//!   sends (a `u32` filter matching all, `mirred egress redirect`) to an IFB device whose root
//!   qdisc is the `tbf`; an IFB hands the packets back to the stack as if they had just
//!   arrived on the veth.
//!
//! What Lace owns here, so that observation finds its own and nothing else: IFB devices named
//! [`SHAPER_PREFIX`] and what follows the `-` of the pod's veth (`lp-0123456789a` shapes
//! through `ls-0123456789a`); on a pod veth or a shaper, the root qdisc with handle
//! [`QDISC_MAJOR`]`:`; on a pod veth, the `ingress` qdisc and its filter of priority
//! [`FILTER_PRIORITY`].
//!
//! The buckets come from the pod's record ([`Limit::bucket`]), so they are planned by
//! [`super::Planner::plan`] with the pod's routes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::IFNAME_MAX;
use crate::bandwidth::{Bandwidth, Bucket, Limit};
use crate::state::{ObjectKey, PodAttachment};

/// Prefix of the IFB devices that shape pods' egress.
pub const SHAPER_PREFIX: &str = "ls-";
/// The major number of the handle of Lace's root `tbf` qdiscs (`4c:`, 76 as Lace's route
/// protocol).
pub const QDISC_MAJOR: u16 = 0x4c;
/// The priority (`prio`, `pref`) of Lace's redirecting filter on a pod veth's ingress.
pub const FILTER_PRIORITY: u16 = 76;

/// The IFB device that shapes what the pod of veth `veth` sends.
pub fn shaper_name(veth: &str) -> String {
    let tail = veth.split_once('-').map_or(veth, |(_, tail)| tail);
    let mut name = format!("{SHAPER_PREFIX}{tail}");
    name.truncate(IFNAME_MAX);
    name
}

/// One pod's shaping, on its host-side veth.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shaping {
    pub pod: ObjectKey,
    /// What the pod asked for (for the plan's reader).
    pub asked: Bandwidth,
    /// Towards the pod: the veth's root `tbf`.
    pub ingress: Option<Bucket>,
    /// From the pod: the root `tbf` of its shaper ([`shaper_name`]).
    pub egress: Option<Bucket>,
}

/// The local attachments' shaping by host-side veth: those that asked for any.
pub(super) fn plan(local: &[PodAttachment]) -> BTreeMap<String, Shaping> {
    local
        .iter()
        .filter_map(|att| {
            let asked = att.bandwidth.and_then(Bandwidth::any)?;
            Some((
                att.host_ifname.clone(),
                Shaping {
                    pod: att.pod.clone(),
                    asked,
                    ingress: asked.ingress.map(Limit::bucket),
                    egress: asked.egress.map(Limit::bucket),
                },
            ))
        })
        .collect()
}

/// The plan's `## shaping` section: per pod what it asked for, then its qdiscs, shaper and
/// filter in `tc`'s and `ip`'s words.
pub(super) fn render(shaping: &BTreeMap<String, Shaping>, out: &mut String) {
    if shaping.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n## shaping");
    for (veth, s) in shaping {
        let asked = |l: Option<Limit>| l.map_or("unshaped".to_string(), |l| l.to_string());
        let _ = writeln!(
            out,
            "# pod {}/{}: to it {}, from it {}",
            s.pod.namespace,
            s.pod.name,
            asked(s.asked.ingress),
            asked(s.asked.egress)
        );
        let root = |dev: &str, b: &Bucket| {
            format!("qdisc replace dev {dev} root handle {QDISC_MAJOR:x}: tbf {b}")
        };
        if let Some(b) = &s.ingress {
            let _ = writeln!(out, "{}", root(veth, b));
        }
        if let Some(b) = &s.egress {
            let shaper = shaper_name(veth);
            let _ = writeln!(out, "link add {shaper} type ifb up");
            let _ = writeln!(out, "qdisc add dev {veth} ingress");
            let _ = writeln!(
                out,
                "filter add dev {veth} parent ffff: prio {FILTER_PRIORITY} protocol all u32 \
                 match u32 0 0 action mirred egress redirect dev {shaper}"
            );
            let _ = writeln!(out, "{}", root(&shaper, b));
        }
    }
}

#[cfg(test)]
mod tests;
