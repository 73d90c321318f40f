//! The pods' bandwidth (see [`crate::plan::shaping`]): for each pod whose veth exists, its
//! bucket towards it as the veth's root `tbf`, and from it an up shaper (`ls-…`) with its
//! bucket, the veth's `ingress` qdisc and the filter redirecting to the shaper. What a
//! planned pod does not ask for, and everything of Lace's on pods not planned (their shapers
//! too), goes when `prune`.
//!
//! The kernel reports a `tbf`'s bucket as the time it takes to fill at its rate, in 64 ns
//! ticks, rounded down: a planned bucket is in place when that time is the bucket's at the
//! rate, give or take a tick and a thousandth (the kernel's rounding).

use std::collections::{BTreeMap, BTreeSet};

use crate::bandwidth::Bucket;
use crate::dataplane::observed::{LinkTc, ObservedNode, ObservedTbf, Redirect, RootQdisc};
use crate::dataplane::op::Op;
use crate::plan::shaping::{shaper_name, Shaping, SHAPER_PREFIX};

/// The kernel's tick (`PSCHED_SHIFT`): 64 ns.
const TICK_NS: u128 = 64;

/// Whether the kernel's `tbf` holds `planned`.
fn holds(observed: &ObservedTbf, planned: &Bucket) -> bool {
    if observed.rate != planned.rate || observed.limit != planned.limit || planned.rate == 0 {
        return false;
    }
    let want_ns = u128::from(planned.burst) * 1_000_000_000 / u128::from(planned.rate);
    let have_ns = u128::from(observed.buffer_ticks) * TICK_NS;
    want_ns.abs_diff(have_ns) <= TICK_NS + want_ns / 1000
}

/// `link`'s root as planned (`Some`) or without Lace's (`None`).
fn root_ops(link: &str, planned: Option<&Bucket>, seen: &LinkTc, prune: bool, ops: &mut Vec<Op>) {
    match (planned, &seen.root) {
        (Some(b), Some(RootQdisc::Tbf(t))) if holds(t, b) => {}
        (Some(b), _) => ops.push(Op::PutTbf {
            link: link.to_string(),
            bucket: *b,
        }),
        (None, Some(_)) if prune => ops.push(Op::DelTbf {
            link: link.to_string(),
        }),
        (None, _) => {}
    }
}

/// The operations that make the kernel hold `shaping` (the plan's, by pod veth) and, when
/// `prune`, nothing else of Lace's shaping. `tc` is what was read of the links' qdiscs and
/// filters. A shaper created here carries no routes or sysctls: nothing else needs to know.
pub(super) fn ops(
    shaping: &BTreeMap<String, Shaping>,
    observed: &ObservedNode,
    tc: &BTreeMap<String, LinkTc>,
    prune: bool,
    ops: &mut Vec<Op>,
) {
    let none = LinkTc::default();
    let seen = |link: &str| tc.get(link).unwrap_or(&none);
    let mut shapers = BTreeSet::new();
    for (veth, s) in shaping
        .iter()
        .filter(|(v, _)| observed.links.contains_key(*v))
    {
        let on_veth = seen(veth);
        root_ops(veth, s.ingress.as_ref(), on_veth, prune, ops);
        let Some(bucket) = &s.egress else {
            if on_veth.ingress && prune {
                ops.push(Op::DelIngressQdisc { link: veth.clone() });
            }
            continue;
        };
        let shaper = shaper_name(veth);
        let index = match observed.links.get(&shaper) {
            Some(l) => {
                if !l.up {
                    ops.push(Op::LinkUp {
                        name: shaper.clone(),
                    });
                }
                Some(l.index)
            }
            None => {
                ops.push(Op::AddShaper {
                    name: shaper.clone(),
                });
                None
            }
        };
        let on_shaper = if index.is_some() {
            seen(&shaper)
        } else {
            &none
        };
        root_ops(&shaper, Some(bucket), on_shaper, prune, ops);
        if !on_veth.ingress {
            ops.push(Op::AddIngressQdisc { link: veth.clone() });
        }
        match (on_veth.redirect, index) {
            (Some(Redirect::To(to)), Some(index)) if to == index => {}
            (redirect, _) => {
                if redirect.is_some() {
                    ops.push(Op::DelRedirect { link: veth.clone() });
                }
                ops.push(Op::AddRedirect {
                    link: veth.clone(),
                    shaper: shaper.clone(),
                });
            }
        }
        shapers.insert(shaper);
    }
    if !prune {
        return;
    }
    for (link, seen) in tc {
        if shaping.contains_key(link) || shapers.contains(link) {
            continue;
        }
        // A shaper's root goes with the shaper.
        if seen.root.is_some() && !link.starts_with(SHAPER_PREFIX) {
            ops.push(Op::DelTbf { link: link.clone() });
        }
        if seen.ingress {
            ops.push(Op::DelIngressQdisc { link: link.clone() });
        }
    }
    for (name, _) in observed.shapers() {
        if !shapers.contains(name) {
            ops.push(Op::DelLink { name: name.clone() });
        }
    }
}

#[cfg(test)]
mod tests;
