//! Runs [`Op`]s phase by phase. The netlink operations of one phase go out as one batch
//! ([`Nl::batch`]); after a phase with a failure nothing more is applied.
//!
//! The pod-sized operations of CNI ADD ([`Batching::Pod`]) go out in fewer batches: the links
//! (VRF) first, then everything else in one batch, in phase order (the kernel handles the
//! messages of a batch in order): a few objects of one pod, on the ADD's latency, where
//! stopping between phases would save nothing (a failed ADD removes the pod's veth).

use std::collections::HashMap;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::RouteNetlinkMessage;

use super::diff::Op;
use super::nl::Nl;
use super::{host, msg, nft, observe, ObservedNode, OpFailure};

/// How operations are grouped into batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batching {
    /// One batch per phase, stopping after a phase with a failure.
    Phases,
    /// Links first, then one batch for the rest (see the module docs).
    Pod,
}

/// Applies `ops` (in diff order); returns the number of writes issued and the failures.
pub fn apply(
    nl: &mut Nl,
    observed: &ObservedNode,
    ops: Vec<Op>,
    batching: Batching,
) -> (u64, Vec<OpFailure>) {
    let mut index: HashMap<String, u32> = observed
        .links
        .iter()
        .map(|(n, l)| (n.clone(), l.index))
        .collect();
    let mut writes = 0u64;
    let mut failures = Vec::new();
    let mut links_changed = false;
    let mut ops = ops.into_iter().peekable();
    while let Some(first) = ops.next() {
        let phase = first.phase();
        let mut group = vec![first];
        let together = |o: &Op| match batching {
            Batching::Phases => o.phase() == phase,
            Batching::Pod => o.phase() == phase || (phase >= 3 && o.phase() >= 3),
        };
        while let Some(op) = ops.next_if(together) {
            group.push(op);
        }
        // Link indices of VRFs created in an earlier phase.
        if links_changed && phase >= 3 {
            links_changed = false;
            match observe::link_indices(nl) {
                Ok(i) => index = i,
                Err(e) => {
                    failures.push(OpFailure {
                        op: "reading link indices after creating VRFs".into(),
                        error: e.to_string(),
                    });
                    break;
                }
            }
        }
        links_changed |= phase <= 2;
        let mut requests = Vec::new();
        let mut sent: Vec<Op> = Vec::new();
        for op in group {
            match op {
                Op::Sysctl { ref key, ref value } => {
                    writes += 1;
                    if let Err(e) = host::write_sysctl(key, value) {
                        failures.push(fail(&op, e));
                    }
                }
                Op::Tunsrc(a) => {
                    writes += 1;
                    if let Err(e) = super::seg6::tunsrc_set(a) {
                        failures.push(fail(&op, e));
                    }
                }
                Op::NftSwap { ref script, .. } | Op::NftElements { ref script, .. } => {
                    writes += 1;
                    if let Err(e) = nft::apply(script) {
                        failures.push(fail(&op, e));
                    }
                }
                Op::NftDelete => {
                    writes += 1;
                    if let Err(e) = nft::apply(&nft::delete_script()) {
                        failures.push(fail(&op, e));
                    }
                }
                _ => match message(&op, &index) {
                    Ok(m) => {
                        requests.push(m);
                        sent.push(op);
                    }
                    Err(e) => failures.push(fail(&op, e)),
                },
            }
        }
        if !requests.is_empty() {
            writes += requests.len() as u64;
            match nl.batch(requests) {
                Ok(acks) => {
                    for (op, ack) in sent.iter().zip(acks) {
                        if let Err(errno) = ack {
                            if !idempotent(op, errno) {
                                failures.push(fail(op, errno_text(errno)));
                            }
                        }
                    }
                }
                Err(e) => failures.push(OpFailure {
                    op: format!("{} netlink request(s), first: {}", sent.len(), sent[0]),
                    error: e.to_string(),
                }),
            }
        }
        if !failures.is_empty() {
            break;
        }
    }
    (writes, failures)
}

fn fail(op: &Op, error: impl Into<String>) -> OpFailure {
    OpFailure {
        op: op.to_string(),
        error: error.into(),
    }
}

fn errno_text(errno: i32) -> String {
    format!(
        "{} (errno {errno})",
        std::io::Error::from_raw_os_error(errno)
    )
}

/// The errors that mean "already as wanted": creating what exists, deleting what is gone.
fn idempotent(op: &Op, errno: i32) -> bool {
    match op {
        Op::AddVrf { .. } | Op::AddRule(_) | Op::AddAddress { .. } => errno == libc::EEXIST,
        // IPv4 answers a missing route with ESRCH, IPv6 with ENOENT; a deleted VRF takes its
        // device routes with it.
        Op::DelRoute { .. } | Op::DelRule(_) => errno == libc::ENOENT || errno == libc::ESRCH,
        Op::DelLink { .. } | Op::ReplaceLink { .. } => {
            errno == libc::ENODEV || errno == libc::ENOENT
        }
        _ => false,
    }
}

/// The netlink request (and its extra flags) for a netlink operation.
fn message(op: &Op, index: &HashMap<String, u32>) -> Result<(RouteNetlinkMessage, u16), String> {
    let idx = |name: &str| {
        index
            .get(name)
            .copied()
            .ok_or_else(|| format!("no link named {name}"))
    };
    Ok(match op {
        Op::AddVrf { name, table } => (
            RouteNetlinkMessage::NewLink(msg::vrf(name, *table)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::LinkUp { name } => (RouteNetlinkMessage::SetLink(msg::link_up(name)), 0),
        Op::SetMaster { link, master } => (
            RouteNetlinkMessage::SetLink(msg::enslave_up(idx(link)?, idx(master)?)),
            0,
        ),
        Op::AddAddress { link, addr } => (
            RouteNetlinkMessage::NewAddress(msg::address(idx(link)?, addr)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::ReplaceLink { name } | Op::DelLink { name } => {
            (RouteNetlinkMessage::DelLink(msg::link_by_name(name)), 0)
        }
        Op::AddRule(r) => (
            RouteNetlinkMessage::NewRule(msg::rule(r)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::DelRule(r) => (RouteNetlinkMessage::DelRule(r.raw.clone()), 0),
        Op::PutRoute { key, nh } => (
            RouteNetlinkMessage::NewRoute(msg::route(key, Some(nh), &idx)?),
            NLM_F_CREATE | NLM_F_REPLACE,
        ),
        Op::DelRoute { key, nh } => (RouteNetlinkMessage::DelRoute(msg::route_delete(key, nh)), 0),
        Op::Sysctl { .. }
        | Op::Tunsrc(_)
        | Op::NftSwap { .. }
        | Op::NftElements { .. }
        | Op::NftDelete => return Err("not a netlink operation".into()),
    })
}
