//! The traffic-control requests of a pod's bandwidth ([`crate::plan::shaping`]), one builder
//! per kernel object like [`super::msg`]'s, and the reading of what the kernel reports of
//! them: a root `tbf` with Lace's handle, a veth's `ingress` qdisc and Lace's filter on it (a
//! `u32` matching everything, `mirred egress redirect` to the pod's shaper).
//!
//! `netlink-packet-route` 0.34 has no `tbf` type: its options are built and read here as the
//! kernel's `include/uapi/linux/pkt_sched.h` lays them out (`TCA_TBF_PARMS`, a `struct
//! tc_tbf_qopt`; the rate above 4 GB/s in `TCA_TBF_RATE64`; the bucket in bytes in
//! `TCA_TBF_BURST`, so no rate table is needed: the rate's link layer is Ethernet).

use netlink_packet_core::{DefaultNla, Nla};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionGeneric, TcActionMirrorOption, TcActionOption,
    TcActionType, TcAttribute, TcFilterU32Option, TcHandle, TcMessage, TcMirror,
    TcMirrorActionType, TcOption, TcU32Key, TcU32Selector, TcU32SelectorFlags,
};

use super::nl::RawAttrs;
use super::observed::{ObservedTbf, Redirect, RootQdisc};
use crate::bandwidth::Bucket;
use crate::plan::shaping::{FILTER_PRIORITY, QDISC_MAJOR};

const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
/// `struct tc_tbf_qopt`: two `struct tc_ratespec` (12 bytes each), `limit`, `buffer`, `mtu`.
const TBF_QOPT_LEN: usize = 36;
/// `TC_LINKLAYER_ETHERNET`: rates count bytes as they are (no ATM cells), no rate table.
const LINKLAYER_ETHERNET: u8 = 1;
/// `ETH_P_ALL`: a filter that sees every protocol.
const ETH_P_ALL: u16 = 0x0003;

const TBF: &str = "tbf";
const INGRESS: &str = "ingress";
const U32: &str = "u32";
const MIRRED: &str = "mirred";

/// Lace's root qdisc handle (`4c:`).
fn lace_handle() -> TcHandle {
    TcHandle {
        major: QDISC_MAJOR,
        minor: 0,
    }
}

/// The `ingress` qdisc's handle (`ffff:`), its filters' parent.
fn ingress_handle() -> TcHandle {
    TcHandle {
        major: u16::MAX,
        minor: 0,
    }
}

fn message(index: u32, parent: TcHandle, handle: TcHandle) -> TcMessage {
    // Interface indices are positive `int`s.
    let mut m = TcMessage::with_index(i32::try_from(index).unwrap_or(i32::MAX));
    m.header.parent = parent;
    m.header.handle = handle;
    m
}

/// A `struct tc_ratespec` of `rate` bytes per second (saturating: the rest goes in
/// `TCA_TBF_RATE64`), Ethernet link layer.
fn ratespec(rate: u64, out: &mut Vec<u8>) {
    out.push(0); // cell_log
    out.push(LINKLAYER_ETHERNET);
    out.extend_from_slice(&0u16.to_ne_bytes()); // overhead
    out.extend_from_slice(&0i16.to_ne_bytes()); // cell_align
    out.extend_from_slice(&0u16.to_ne_bytes()); // mpu
    out.extend_from_slice(&u32::try_from(rate).unwrap_or(u32::MAX).to_ne_bytes());
}

/// `tc qdisc replace dev <index> root handle 4c: tbf rate <rate> burst <burst> limit <limit>`
/// (send with `NLM_F_CREATE | NLM_F_REPLACE`): replaces whatever root qdisc is there.
pub fn tbf(index: u32, bucket: &Bucket) -> TcMessage {
    let mut parms = Vec::with_capacity(TBF_QOPT_LEN);
    ratespec(bucket.rate, &mut parms);
    parms.extend_from_slice(&[0; 12]); // no peak rate
    parms.extend_from_slice(&bucket.limit.to_ne_bytes());
    parms.extend_from_slice(&0u32.to_ne_bytes()); // buffer: from TCA_TBF_BURST
    parms.extend_from_slice(&0u32.to_ne_bytes()); // mtu: for the peak rate only
    let mut options = vec![TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, parms))];
    if bucket.rate > u64::from(u32::MAX) {
        options.push(TcOption::Other(DefaultNla::new(
            TCA_TBF_RATE64,
            bucket.rate.to_ne_bytes().to_vec(),
        )));
    }
    options.push(TcOption::Other(DefaultNla::new(
        TCA_TBF_BURST,
        bucket.burst.to_ne_bytes().to_vec(),
    )));
    let mut m = message(index, TcHandle::ROOT, lace_handle());
    m.attributes.push(TcAttribute::Kind(TBF.into()));
    m.attributes.push(TcAttribute::Options(options));
    m
}

/// `tc qdisc del dev <index> root handle 4c:`.
pub fn del_tbf(index: u32) -> TcMessage {
    message(index, TcHandle::ROOT, lace_handle())
}

/// `tc qdisc add dev <index> ingress` (send with `NLM_F_CREATE | NLM_F_EXCL`); deleting it
/// (the same message) deletes its filters.
pub fn ingress(index: u32) -> TcMessage {
    let mut m = message(index, TcHandle::INGRESS, ingress_handle());
    m.attributes.push(TcAttribute::Kind(INGRESS.into()));
    m
}

/// The filter's `tcm_info`: priority, and the protocol in network byte order.
fn filter_info() -> u32 {
    (u32::from(FILTER_PRIORITY) << 16) | u32::from(ETH_P_ALL.to_be())
}

/// `tc filter add dev <index> parent ffff: prio 76 protocol all u32 match u32 0 0 action
/// mirred egress redirect dev <to>` (send with `NLM_F_CREATE | NLM_F_EXCL`).
pub fn redirect(index: u32, to: u32) -> TcMessage {
    let mut selector = TcU32Selector::default();
    selector.flags = TcU32SelectorFlags::Terminal;
    selector.nkeys = 1;
    selector.keys = vec![TcU32Key::default()]; // mask 0, value 0 at offset 0: everything
    let mut generic = TcActionGeneric::default();
    generic.action = TcActionType::Stolen;
    let mut mirror = TcMirror::default();
    mirror.generic = generic;
    mirror.eaction = TcMirrorActionType::EgressRedir;
    mirror.ifindex = to;
    let mut action = TcAction::default();
    action.attributes = vec![
        TcActionAttribute::Kind(MIRRED.into()),
        TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(
            mirror,
        ))]),
    ];
    let mut m = del_redirect(index);
    m.attributes.push(TcAttribute::Kind(U32.into()));
    m.attributes.push(TcAttribute::Options(vec![
        TcOption::U32(TcFilterU32Option::Selector(selector)),
        TcOption::U32(TcFilterU32Option::Action(vec![action])),
    ]));
    m
}

/// `tc filter del dev <index> parent ffff: prio 76 protocol all`: Lace's filter, whatever its
/// handles.
pub fn del_redirect(index: u32) -> TcMessage {
    let mut m = message(index, ingress_handle(), TcHandle::UNSPEC);
    m.header.info = filter_info();
    m
}

/// `tc filter show dev <index> parent ffff:` (a dump request).
pub fn filters_of_ingress(index: u32) -> TcMessage {
    message(index, ingress_handle(), TcHandle::UNSPEC)
}

/// What a dumped qdisc is to Lace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Qdisc {
    /// The root qdisc with Lace's handle.
    Root(RootQdisc),
    /// An `ingress` qdisc.
    Ingress,
}

/// The link index of a dumped qdisc, and what it is to Lace (`None`: nothing of Lace's).
pub fn classify_qdisc(m: &TcMessage) -> Option<(u32, Qdisc)> {
    let index = u32::try_from(m.header.index).ok()?;
    let kind = m.attributes.iter().find_map(|a| match a {
        TcAttribute::Kind(k) => Some(k.as_str()),
        _ => None,
    })?;
    if m.header.parent == TcHandle::INGRESS && kind == INGRESS {
        return Some((index, Qdisc::Ingress));
    }
    if m.header.parent != TcHandle::ROOT || m.header.handle != lace_handle() {
        return None;
    }
    let root = match (kind, options(m).and_then(|o| read_tbf(&o))) {
        (TBF, Some(tbf)) => RootQdisc::Tbf(tbf),
        _ => RootQdisc::Other(kind.to_string()),
    };
    Some((index, Qdisc::Root(root)))
}

/// The bytes of an unparsed `TCA_OPTIONS` (the crate keeps the options of a kind it does not
/// know as one attribute holding them).
fn options(m: &TcMessage) -> Option<Vec<u8>> {
    m.attributes.iter().find_map(|a| match a {
        TcAttribute::Options(o) => match o.as_slice() {
            [TcOption::Other(nla)] => {
                let mut buf = vec![0; nla.value_len()];
                nla.emit_value(&mut buf);
                Some(buf)
            }
            _ => None,
        },
        _ => None,
    })
}

/// A `tbf`'s options as Lace writes them: Ethernet link layer, no overhead, no peak rate.
fn read_tbf(options: &[u8]) -> Option<ObservedTbf> {
    let mut parms = None;
    let mut rate64 = None;
    for a in RawAttrs::new(options) {
        let a = a.ok()?;
        match a.kind {
            TCA_TBF_PARMS => parms = a.value.get(..TBF_QOPT_LEN).map(<[u8]>::to_vec),
            TCA_TBF_RATE64 => rate64 = Some(u64::from_ne_bytes(a.value.try_into().ok()?)),
            _ => {}
        }
    }
    let p = parms?;
    let p = p.as_slice();
    let u32_at = |at: usize| {
        p.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
    };
    let plain_rate = p[1] == LINKLAYER_ETHERNET && p[2..8].iter().all(|b| *b == 0);
    let no_peak = p[12..24].iter().all(|b| *b == 0);
    if !plain_rate || !no_peak {
        return None;
    }
    Some(ObservedTbf {
        rate: rate64.unwrap_or(u64::from(u32_at(8)?)),
        limit: u32_at(24)?,
        buffer_ticks: u32_at(28)?,
    })
}

/// What a dumped filter of an `ingress` qdisc is to Lace: `None` when it is not of Lace's
/// priority or is the `u32` hash table the kernel lists next to the filter proper.
pub fn classify_filter(m: &TcMessage) -> Option<Redirect> {
    if m.header.info >> 16 != u32::from(FILTER_PRIORITY) {
        return None;
    }
    let mut kind = None;
    let mut selector = None;
    let mut to = None;
    for a in &m.attributes {
        match a {
            TcAttribute::Kind(k) => kind = Some(k.as_str()),
            TcAttribute::Options(options) => {
                for o in options {
                    match o {
                        TcOption::U32(TcFilterU32Option::Selector(s)) => selector = Some(s),
                        TcOption::U32(TcFilterU32Option::Action(actions)) => {
                            to = redirect_target(actions)
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let all = m.header.info & 0xffff == u32::from(ETH_P_ALL.to_be());
    if kind != Some(U32) || !all {
        return Some(Redirect::Other);
    }
    let Some(s) = selector else {
        // The hash table (`fh 800:`) carries no selector.
        return (to.is_some()).then_some(Redirect::Other);
    };
    let match_all = s.keys.len() == 1 && s.keys[0].mask == 0 && s.keys[0].val == 0;
    match (match_all, to) {
        (true, Some(index)) => Some(Redirect::To(index)),
        _ => Some(Redirect::Other),
    }
}

/// The device of a lone `mirred egress redirect`.
fn redirect_target(actions: &[TcAction]) -> Option<u32> {
    let [action] = actions else { return None };
    action.attributes.iter().find_map(|a| match a {
        TcActionAttribute::Options(o) => o.iter().find_map(|o| match o {
            TcActionOption::Mirror(TcActionMirrorOption::Parms(p))
                if p.eaction == TcMirrorActionType::EgressRedir =>
            {
                Some(p.ifindex)
            }
            _ => None,
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests;
