//! Smoke test of the netns test bed (not of Lace code): two nodes with one VRF each, joined by
//! an IPv6-only fabric, carry pod traffic over SRv6 (seg6 encap + seg6local End.DT46 into the
//! VRF) in both directions, for ping and TCP, and the decap routes' own counters prove the
//! SRv6 path was the one used.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use std::fmt::Display;

use lace_netns_tests::bed::{Side, TwoNodeBed};
use lace_netns_tests::require_root_and_vrf;

const TCP_PORT: u16 = 7000;
const TIMEOUT: Duration = Duration::from_secs(15);

/// Unwraps with the error's readable message (which names the failing command).
fn must<T>(result: Result<T, impl Display>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Opens a TCP connection from `from`'s pod to a listener in `to`'s pod, sends a line, reads
/// the reply line; checks the server saw the client pod's own address (no NAT on the path).
fn tcp_exchange(bed: &TwoNodeBed, from: Side, to: Side) {
    let server_addr: SocketAddr = format!("{}:{TCP_PORT}", to.pod_v4()).parse().unwrap();
    let listener = must(bed.pod(to), "pod")
        .enter(|| TcpListener::bind(server_addr))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("bind {server_addr} in {to:?}'s pod: {e}"));

    std::thread::scope(|s| {
        let server = s.spawn(move || {
            let (conn, peer) = listener.accept().expect("accept");
            conn.set_read_timeout(Some(TIMEOUT)).unwrap();
            let mut line = String::new();
            BufReader::new(&conn)
                .read_line(&mut line)
                .expect("server read");
            (&conn)
                .write_all(format!("echo {}", line).as_bytes())
                .expect("server write");
            (peer, line)
        });

        let mut client = must(bed.pod(from), "pod")
            .enter(|| TcpStream::connect_timeout(&server_addr, TIMEOUT))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("TCP {from:?} -> {to:?} ({server_addr}): {e}"));
        client.set_read_timeout(Some(TIMEOUT)).unwrap();
        let msg = format!("hello from pod {from:?}\n");
        client.write_all(msg.as_bytes()).expect("client write");
        let mut reply = String::new();
        BufReader::new(&client)
            .read_line(&mut reply)
            .expect("client read");
        assert_eq!(reply, format!("echo {msg}"), "TCP reply {from:?} -> {to:?}");

        let (peer, got) = server.join().expect("server thread");
        assert_eq!(got, msg);
        assert_eq!(
            peer.ip().to_string(),
            from.pod_v4(),
            "server in {to:?}'s pod must see the client pod's address"
        );
    });
}

#[test]
fn smoke_srv6_vrf_bed_carries_ping_and_tcp_both_ways() {
    require_root_and_vrf();
    let bed = must(TwoNodeBed::build(), "building the bed");

    // Without the SRv6 routes the pods cannot reach each other: the traffic below can only
    // take the SRv6 path.
    assert!(
        bed.ping(Side::A, Side::B, false, 1).is_err(),
        "pods must not reach each other before the SRv6 routes exist"
    );
    assert_eq!(bed.decap_packets(Side::B).ok(), None, "no SID route yet");

    must(bed.install_srv6(), "installing the SRv6 routes");
    for (from, to) in [(Side::A, Side::B), (Side::B, Side::A)] {
        let v4 = must(bed.ping(from, to, false, 2), "ping");
        assert!(v4.contains("2 received"), "ping {from:?} -> {to:?}: {v4}");
        let v6 = must(bed.ping(from, to, true, 2), "ping -6");
        assert!(
            v6.contains("2 received"),
            "ping -6 {from:?} -> {to:?}: {v6}"
        );
        tcp_exchange(&bed, from, to);
    }

    // Each direction: 4 echo requests (or replies) + at least 3 TCP segments each way were
    // decapsulated by the End.DT46 route of the receiving node, and crossed the fabric with a
    // segment routing header.
    for side in [Side::A, Side::B] {
        let decap = must(bed.decap_packets(side), "seg6local counter");
        let fabric = must(bed.fabric_srv6_packets_to(side), "fabric counter");
        assert!(
            decap >= 11,
            "End.DT46 on node {side:?} decapsulated {decap} packets"
        );
        assert!(
            fabric >= decap,
            "fabric saw {fabric} SRv6 packets to {side:?}, decap {decap}"
        );
    }
}
