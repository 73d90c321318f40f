//! Tests of the traffic-control messages: what Lace writes reads back, through the bytes the
//! kernel gets, as Lace's (the netns tests check the kernel's own answers).

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;

use netlink_packet_core::{NlaBuffer, NlasIterator};

use super::*;

/// `m` through its bytes and back, as a dump would hand it over.
fn round_trip(m: TcMessage) -> TcMessage {
    let mut msg = NetlinkMessage::new(
        NetlinkHeader::default(),
        NetlinkPayload::from(RouteNetlinkMessage::NewQueueDiscipline(m)),
    );
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    let back = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf).unwrap();
    let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewQueueDiscipline(m)) = back.payload
    else {
        panic!("not a qdisc");
    };
    m
}

fn bucket(rate: u64) -> Bucket {
    Bucket {
        rate,
        burst: 9230,
        limit: 40480,
    }
}

#[test]
fn a_tbf_reads_back_with_its_rate_and_queue() {
    for rate in [1_250_000, u64::from(u32::MAX) + 1, 125_000_000_000_000] {
        let m = round_trip(tbf(7, &bucket(rate)));
        assert_eq!(m.header.parent, TcHandle::ROOT);
        assert_eq!(
            classify_qdisc(&m),
            Some((
                7,
                Qdisc::Root(RootQdisc::Tbf(ObservedTbf {
                    rate,
                    limit: 40480,
                    buffer_ticks: 0,
                }))
            )),
            "{rate}"
        );
    }
    // The bucket travels in bytes; the parameters are the kernel's 36-byte struct.
    let options = options(&round_trip(tbf(7, &bucket(1_250_000)))).unwrap();
    let attrs: Vec<(u16, Vec<u8>)> = NlasIterator::new(options.as_slice())
        .map(|n| {
            let n: NlaBuffer<&[u8]> = n.unwrap();
            (n.kind(), n.value().to_vec())
        })
        .collect();
    assert_eq!(attrs.len(), 2, "no rate above 4 GB/s: no TCA_TBF_RATE64");
    assert_eq!(attrs[0].1.len(), TBF_QOPT_LEN);
    assert_eq!(attrs[1], (TCA_TBF_BURST, 9230u32.to_ne_bytes().to_vec()));
}

#[test]
fn another_root_of_lace_s_handle_is_other_and_foreign_qdiscs_are_not_lace_s() {
    // A peak rate, which Lace never writes.
    let mut m = tbf(3, &bucket(1_250_000));
    let Some(TcAttribute::Options(o)) = m.attributes.get_mut(1) else {
        panic!("no options");
    };
    let mut parms = vec![0; TBF_QOPT_LEN];
    parms[1] = LINKLAYER_ETHERNET;
    parms[20..24].copy_from_slice(&1000u32.to_ne_bytes());
    o[0] = TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, parms));
    assert_eq!(
        classify_qdisc(&round_trip(m)),
        Some((3, Qdisc::Root(RootQdisc::Other("tbf".into()))))
    );
    let mut htb = message(3, TcHandle::ROOT, lace_handle());
    htb.attributes.push(TcAttribute::Kind("htb".into()));
    assert_eq!(
        classify_qdisc(&htb),
        Some((3, Qdisc::Root(RootQdisc::Other("htb".into()))))
    );
    // Another handle, or not at the root: not Lace's.
    let mut foreign = tbf(3, &bucket(1_250_000));
    foreign.header.handle = TcHandle { major: 1, minor: 0 };
    assert_eq!(classify_qdisc(&foreign), None);
    assert_eq!(
        classify_qdisc(&round_trip(ingress(3))),
        Some((3, Qdisc::Ingress))
    );
}

#[test]
fn the_redirect_reads_back_as_its_target_and_anything_else_of_its_priority_as_other() {
    let m = round_trip(redirect(4, 9));
    assert_eq!(m.header.info >> 16, u32::from(FILTER_PRIORITY));
    assert_eq!(classify_filter(&m), Some(Redirect::To(9)));
    // Deleting names the priority and protocol alone.
    let del = del_redirect(4);
    assert_eq!((del.header.info, del.attributes.len()), (m.header.info, 0));
    // The u32 hash table the kernel lists beside the filter: nothing.
    let mut table = message(4, ingress_handle(), TcHandle::UNSPEC);
    table.header.info = filter_info();
    table.attributes.push(TcAttribute::Kind(U32.into()));
    assert_eq!(classify_filter(&table), None);
    // A filter of another priority: not Lace's.
    let mut other = redirect(4, 9);
    other.header.info = (49152 << 16) | u32::from(ETH_P_ALL.to_be());
    assert_eq!(classify_filter(&other), None);
    // Of Lace's priority but matching something: Other.
    let mut narrow = redirect(4, 9);
    if let Some(TcAttribute::Options(o)) = narrow.attributes.get_mut(1) {
        if let Some(TcOption::U32(TcFilterU32Option::Selector(s))) = o.get_mut(0) {
            s.keys[0].mask = 0xffff_ffff;
        }
    }
    assert_eq!(classify_filter(&round_trip(narrow)), Some(Redirect::Other));
}
