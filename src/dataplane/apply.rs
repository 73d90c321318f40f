//! Runs [`Op`]s phase by phase. The netlink operations of one phase go out as one batch
//! ([`Nl::batch`]); after a phase with a failure nothing more is applied.
//!
//! The pod-sized operations of CNI ADD ([`Batching::Pod`]) go out in fewer batches: the links
//! (VRF) first, then everything else in one batch, in phase order (the kernel handles the
//! messages of a batch in order): a few objects of one pod, on the ADD's latency, where
//! stopping between phases would save nothing (a failed ADD removes the pod's veth).

use std::collections::HashMap;
use std::fmt;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::RouteNetlinkMessage;

use super::nl::Nl;
use super::observed::ObservedNode;
use super::op::Op;
use super::{fou, host, msg, nft, observe, tc};

/// One operation that failed, with the object it concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpFailure {
    /// The operation (`ip`-like text naming the object).
    pub op: String,
    /// What the kernel or tool said.
    pub error: String,
}

impl fmt::Display for OpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.error)
    }
}

/// How operations are grouped into batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batching {
    /// One batch per phase, stopping after a phase with a failure.
    Phases,
    /// Links first, then one batch for the rest (see the module docs).
    Pod,
}

/// Applies `ops` (in diff order); returns the number of writes issued and the failures.
///
/// The operations are read where they are: a fresh node's first apply at 5,000 nodes x 50
/// Networks has 195,000 routes' (20 MB), and moving them into a list per phase, then into
/// the list of those sent, had taken 0.36-0.46 s of the test VM's apply before its first
/// route went out (fresh memory is faulted in page by page; one timed run: in the install
/// the kernel's own variation hid it).
pub fn apply(
    nl: &mut Nl,
    observed: &ObservedNode,
    ops: &[Op],
    batching: Batching,
) -> (u64, Vec<OpFailure>) {
    let mut index: HashMap<String, u32> = observed
        .links
        .iter()
        .map(|(n, l)| (n.clone(), l.index))
        .collect();
    let mut writes = 0u64;
    let mut failures = Vec::new();
    // Failures of a pod's shaping (Op::is_shaping), which no later phase depends on.
    let mut shaping_failures = 0usize;
    let mut links_changed = false;
    let mut rest = ops;
    while let Some(first) = rest.first() {
        let phase = first.phase();
        let together = |o: &Op| match batching {
            Batching::Phases => o.phase() == phase,
            Batching::Pod => o.phase() == phase || (phase >= 3 && o.phase() >= 3),
        };
        let (group, after) =
            rest.split_at(1 + rest[1..].iter().take_while(|o| together(o)).count());
        rest = after;
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
        // A `sit` device with `encap fou` needs the fou module's encapsulation registered.
        if group.iter().any(|o| matches!(o, Op::AddTunnel { .. })) {
            if let Err(e) = fou::load() {
                failures.push(OpFailure {
                    op: "loading the kernel's fou support (for the SRv6-over-IPv4 device)".into(),
                    error: e.to_string(),
                });
                break;
            }
        }
        // Netlink operations, whose messages the batch builds as it sends them.
        let mut sent: Vec<&Op> = Vec::new();
        for op in group {
            match op {
                Op::Sysctl { key, value } => {
                    writes += 1;
                    if let Err(e) = host::write_sysctl(key, value) {
                        failures.push(fail(op, e));
                    }
                }
                Op::Tunsrc(a) => {
                    writes += 1;
                    if let Err(e) = super::seg6::tunsrc_set(*a) {
                        failures.push(fail(op, e));
                    }
                }
                Op::NftSwap { script, .. } | Op::NftUpdate { script, .. } => {
                    writes += 1;
                    if let Err(e) = nft::apply(script) {
                        failures.push(fail(op, e));
                    }
                }
                Op::NftDelete => {
                    writes += 1;
                    if let Err(e) = nft::apply(&nft::delete_script()) {
                        failures.push(fail(op, e));
                    }
                }
                Op::AddFou { listener, replace } => {
                    writes += 1 + u64::from(*replace);
                    let done = match replace {
                        true => fou::del(listener.port, listener.family),
                        false => Ok(()),
                    }
                    .and_then(|()| fou::add(*listener));
                    if let Err(e) = done {
                        failures.push(fail(op, e));
                    }
                }
                Op::DelFou { listener } => {
                    writes += 1;
                    if let Err(e) = fou::del(listener.port, listener.family) {
                        failures.push(fail(op, e));
                    }
                }
                _ => sent.push(op),
            }
        }
        if !sent.is_empty() {
            let index = &index;
            match nl.batch_with(sent.iter().copied(), |op| message(op, index)) {
                Ok(answers) => {
                    for (op, answer) in sent.iter().zip(answers) {
                        // Every request the kernel answered was a write; one that could not
                        // be built was not sent.
                        writes += u64::from(answer.is_ok());
                        let failed = match answer {
                            Ok(Ok(())) => continue,
                            Ok(Err(errno)) if idempotent(op, errno) => continue,
                            Ok(Err(errno)) => fail(op, errno_text(errno)),
                            Err(e) => fail(op, e),
                        };
                        shaping_failures += usize::from(op.is_shaping());
                        failures.push(failed);
                    }
                }
                Err(e) => {
                    writes += sent.len() as u64;
                    failures.push(OpFailure {
                        op: format!("{} netlink request(s), first: {}", sent.len(), sent[0]),
                        error: e.to_string(),
                    })
                }
            }
        }
        // A phase that failed stops the later ones, which may build on it; a failed shaping
        // does not (a kernel without `ifb` or `tbf` must not cost the node its routes and
        // ruleset): it is reported and retried like any failure.
        if failures.len() > shaping_failures {
            break;
        }
    }
    (writes, failures)
}

fn fail(op: &Op, error: impl std::fmt::Display) -> OpFailure {
    OpFailure {
        op: op.to_string(),
        error: error.to_string(),
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
        Op::AddVrf { .. }
        | Op::AddDummy { .. }
        | Op::AddShaper { .. }
        | Op::AddRule(_)
        | Op::AddAddress { .. }
        | Op::AddIngressQdisc { .. } => errno == libc::EEXIST,
        // A root qdisc of another handle is EINVAL; a missing `ingress` qdisc ENOENT, and
        // EINVAL to a filter deletion; a missing filter ENOENT.
        Op::DelTbf { .. } | Op::DelIngressQdisc { .. } | Op::DelRedirect { .. } => {
            matches!(errno, libc::ENOENT | libc::EINVAL | libc::ENODEV)
        }
        // IPv4 answers a missing route with ESRCH, IPv6 with ENOENT; a deleted VRF takes its
        // device routes with it.
        Op::DelRoute { .. } | Op::DelRule(_) => errno == libc::ENOENT || errno == libc::ESRCH,
        Op::DelLink { .. } | Op::ReplaceLink { .. } => {
            errno == libc::ENODEV || errno == libc::ENOENT
        }
        Op::DelAddress { .. } => errno == libc::EADDRNOTAVAIL || errno == libc::ENODEV,
        _ => false,
    }
}

/// The netlink request (and its extra flags) for a netlink operation.
fn message(
    op: &Op,
    index: &HashMap<String, u32>,
) -> Result<(RouteNetlinkMessage, u16), msg::MsgError> {
    let lookup = |name: &str| index.get(name).copied();
    let idx = |name: &str| lookup(name).ok_or_else(|| msg::MsgError::NoLink(name.to_string()));
    Ok(match op {
        Op::AddVrf { name, table } => (
            RouteNetlinkMessage::NewLink(msg::vrf(name, *table)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::AddDummy { name } => (
            RouteNetlinkMessage::NewLink(msg::dummy(name)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::AddShaper { name } => (
            RouteNetlinkMessage::NewLink(msg::ifb(name)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::PutTbf { link, bucket } => (
            RouteNetlinkMessage::NewQueueDiscipline(tc::tbf(idx(link)?, bucket)),
            NLM_F_CREATE | NLM_F_REPLACE,
        ),
        Op::AddIngressQdisc { link } => (
            RouteNetlinkMessage::NewQueueDiscipline(tc::ingress(idx(link)?)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::DelRedirect { link } => (
            RouteNetlinkMessage::DelTrafficFilter(tc::del_redirect(idx(link)?)),
            0,
        ),
        Op::AddRedirect { link, shaper } => (
            RouteNetlinkMessage::NewTrafficFilter(tc::redirect(idx(link)?, idx(shaper)?)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::DelTbf { link } => (
            RouteNetlinkMessage::DelQueueDiscipline(tc::del_tbf(idx(link)?)),
            0,
        ),
        Op::DelIngressQdisc { link } => (
            RouteNetlinkMessage::DelQueueDiscipline(tc::ingress(idx(link)?)),
            0,
        ),
        Op::AddTunnel { name, sit, mtu } => (
            RouteNetlinkMessage::NewLink(msg::sit(name, sit, *mtu)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::LinkUp { name } | Op::TunnelUp { name } => {
            (RouteNetlinkMessage::SetLink(msg::link_up(name)), 0)
        }
        Op::SetMtu { name, mtu } => (RouteNetlinkMessage::SetLink(msg::set_mtu(name, *mtu)), 0),
        Op::SetMaster { link, master } => (
            RouteNetlinkMessage::SetLink(msg::enslave_up(idx(link)?, idx(master)?)),
            0,
        ),
        Op::AddAddress { link, addr } => (
            RouteNetlinkMessage::NewAddress(msg::address(idx(link)?, addr)),
            NLM_F_CREATE | NLM_F_EXCL,
        ),
        Op::DelAddress { link, addr } => (
            RouteNetlinkMessage::DelAddress(msg::address(idx(link)?, addr)),
            0,
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
            RouteNetlinkMessage::NewRoute(msg::route(key, Some(nh), &lookup)?),
            NLM_F_CREATE | NLM_F_REPLACE,
        ),
        Op::DelRoute { key, nh } => (RouteNetlinkMessage::DelRoute(msg::route_delete(key, nh)), 0),
        Op::Sysctl { .. }
        | Op::Tunsrc(_)
        | Op::NftSwap { .. }
        | Op::NftUpdate { .. }
        | Op::NftDelete
        | Op::AddFou { .. }
        | Op::DelFou { .. } => return Err(msg::MsgError::NotNetlink),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::underlay::{Ipv4Tunnel, FOU_PORT, IPV4_TUNNEL};
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};

    /// A failed shaping operation lets the later phases run (routes, rules, the ruleset); any
    /// other failure stops them. The pod veth's own link operations are not shaping: the
    /// pod's routes need them.
    #[test]
    fn only_a_pods_shaping_is_let_fail_without_stopping_later_phases() {
        let link = || "lp-0a2643f5dab".to_string();
        let shaper = || "ls-0a2643f5dab".to_string();
        let bucket = crate::bandwidth::Bucket {
            rate: 500_000,
            burst: 36_920,
            limit: 102_456,
        };
        let shaping = [
            Op::AddShaper { name: shaper() },
            Op::LinkUp { name: shaper() },
            Op::PutTbf {
                link: link(),
                bucket,
            },
            Op::AddIngressQdisc { link: link() },
            Op::DelRedirect { link: link() },
            Op::AddRedirect {
                link: link(),
                shaper: shaper(),
            },
            Op::DelTbf { link: shaper() },
            Op::DelIngressQdisc { link: link() },
            Op::DelLink { name: shaper() },
        ];
        for op in &shaping {
            assert!(op.is_shaping(), "{op}");
        }
        let other = [
            Op::LinkUp { name: link() },
            Op::DelLink { name: link() },
            Op::SetMaster {
                link: link(),
                master: "lv-default".into(),
            },
            Op::AddVrf {
                name: "lv-default".into(),
                table: 1000,
            },
            Op::NftDelete,
        ];
        for op in &other {
            assert!(!op.is_shaping(), "{op}");
        }
    }

    /// What the reconciler writes for the SRv6-over-IPv4 device reads back as what it planned
    /// (the netns tests check that the kernel's answer does too: re-applying writes nothing).
    #[test]
    fn the_tunnel_written_reads_back_as_planned() {
        let t = Ipv4Tunnel {
            local: "192.0.2.1".parse().unwrap(),
            address: None,
        };
        let sit = crate::dataplane::diff::tunnel::planned_sit(&t);
        let op = Op::AddTunnel {
            name: IPV4_TUNNEL.into(),
            sit,
            mtu: 1472,
        };
        let (RouteNetlinkMessage::NewLink(m), flags) = message(&op, &HashMap::new()).unwrap()
        else {
            panic!("not a NewLink");
        };
        assert_eq!(flags, NLM_F_CREATE | NLM_F_EXCL);
        // Through the bytes the kernel gets, and back.
        let mut msg = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::from(RouteNetlinkMessage::NewLink(m)),
        );
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        let back = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf).unwrap();
        let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) = back.payload else {
            panic!("not a NewLink");
        };
        let (name, link) = observe::parse_link(&m).unwrap();
        assert_eq!(name, IPV4_TUNNEL);
        assert_eq!(link.sit, Some(sit));
        assert_eq!(link.mtu, 1472);
        assert!(!link.up, "created down, brought up after the ruleset");
        assert_eq!(sit.encap_dport, FOU_PORT);
        assert_eq!(sit.local, Some(t.local));
        assert_eq!(op.to_string(), "link add lu-ipv4 mtu 1472 type sit remote any local 192.0.2.1 ttl 0 pmtudisc encap 1 encap-sport 0 encap-dport 6076");
    }
}
