//! Tests of the netns harness itself against the real kernel: namespaces appear and disappear,
//! commands run inside them, errors say what failed, veth links carry traffic, threads can
//! enter a namespace, the echo servers answer.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use lace_netns_tests::{echo, require_root_and_vrf, veth, Netns, NetnsError, Topology, NS_PREFIX};

#[test]
fn netns_is_created_unique_and_deleted_on_drop() {
    require_root_and_vrf();
    let a = Netns::new("harness").unwrap();
    let b = Netns::new("harness").unwrap();
    assert_ne!(a.name(), b.name());
    assert!(a.name().starts_with(NS_PREFIX), "{}", a.name());
    assert!(a.name().ends_with("-harness"), "{}", a.name());
    let path = a.path();
    assert!(path.exists(), "{path:?}");
    // lo is up and nothing else exists but the fallback devices (`sit0@NONE`, `ip6tnl0@NONE`,
    // ...) a loaded tunnel module puts in every new namespace: earlier tests in the same VM
    // may have loaded one.
    let links = a.ip("-o link show").unwrap();
    let own: Vec<&str> = links.lines().filter(|l| !l.contains("@NONE:")).collect();
    assert_eq!(own.len(), 1, "{links}");
    assert!(own[0].contains("lo:") && own[0].contains("UP"), "{links}");
    drop(a);
    assert!(
        !Path::new(&path).exists(),
        "{path:?} still exists after drop"
    );
}

#[test]
fn failing_commands_name_the_namespace_command_and_kernel_error() {
    require_root_and_vrf();
    let ns = Netns::new("errors").unwrap();
    let err = ns.ip("link set nosuchdev up").unwrap_err();
    assert!(matches!(err, NetnsError::Failed { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(ns.name()), "{text}");
    assert!(text.contains("link set nosuchdev up"), "{text}");
    assert!(text.contains("nosuchdev"), "{text}");
    assert!(Netns::new("Bad_Label").is_err());
}

#[test]
fn topology_links_namespaces_with_veth() {
    require_root_and_vrf();
    let mut topo = Topology::new();
    topo.add("left").unwrap();
    topo.add("right").unwrap();
    assert!(topo.add("left").is_err(), "a label can be added once");
    assert!(topo.ns("middle").is_err());
    topo.link(("left", "to-right"), ("right", "to-left"))
        .unwrap();
    let (left, right) = (topo.ns("left").unwrap(), topo.ns("right").unwrap());
    left.ip("addr add 192.0.2.1/24 dev to-right").unwrap();
    right.ip("addr add 192.0.2.2/24 dev to-left").unwrap();
    let out = left
        .exec("ping", &["-n", "-c", "1", "-W", "3", "192.0.2.2"])
        .unwrap();
    assert!(out.contains("1 received"), "{out}");
    // Interface names the kernel would reject are refused before running ip.
    let err = veth(left, "a-name-too-long-x", right, "ok").unwrap_err();
    assert!(matches!(err, NetnsError::InvalidIfName { .. }), "{err}");
}

#[test]
fn sysctl_changes_only_the_namespace() {
    require_root_and_vrf();
    let a = Netns::new("sysctl-a").unwrap();
    let b = Netns::new("sysctl-b").unwrap();
    let read = |ns: &Netns| ns.exec("cat", &["/proc/sys/net/ipv4/ip_forward"]).unwrap();
    a.sysctl("net.ipv4.ip_forward", "1").unwrap();
    b.sysctl("net.ipv4.ip_forward", "0").unwrap();
    assert_eq!(read(&a).trim(), "1");
    assert_eq!(read(&b).trim(), "0");
    let err = a.sysctl("net.ipv4.no_such_key", "1").unwrap_err();
    assert!(matches!(err, NetnsError::Sysctl { .. }), "{err}");
    assert!(err.to_string().contains("net.ipv4.no_such_key"), "{err}");
}

#[test]
fn enter_runs_code_inside_the_namespace() {
    require_root_and_vrf();
    let ns = Netns::new("enter").unwrap();
    ns.ip("addr add 198.51.100.7/32 dev lo").unwrap();
    // The address exists only inside the namespace: binding it works there...
    let listener = ns
        .enter(|| TcpListener::bind("198.51.100.7:0"))
        .unwrap()
        .unwrap();
    let addr = listener.local_addr().unwrap();
    // ... a socket made there can be driven from here ...
    let client = ns.enter(|| TcpStream::connect(addr)).unwrap().unwrap();
    let (_conn, peer) = listener.accept().unwrap();
    assert_eq!(peer, client.local_addr().unwrap());
    // ... and not outside it.
    assert!(TcpListener::bind("198.51.100.7:0").is_err());
}

#[test]
fn echo_servers_answer_with_the_peer_address_over_tcp_and_udp_in_both_families() {
    require_root_and_vrf();
    let (a, b) = (Netns::new("echo-a").unwrap(), Netns::new("echo-b").unwrap());
    veth(&a, "eth0", &b, "eth0").unwrap();
    a.ip("addr add 198.51.100.1/24 dev eth0").unwrap();
    b.ip("addr add 198.51.100.2/24 dev eth0").unwrap();
    a.ip("-6 addr add 2001:db8:e::1/64 dev eth0 nodad").unwrap();
    b.ip("-6 addr add 2001:db8:e::2/64 dev eth0 nodad").unwrap();
    let patience = Duration::from_secs(10);
    for (client, server) in [
        ("198.51.100.1", "198.51.100.2"),
        ("2001:db8:e::1", "2001:db8:e::2"),
    ] {
        let (client, server): (IpAddr, IpAddr) = (client.parse().unwrap(), server.parse().unwrap());
        let (tcp, udp) = (SocketAddr::new(server, 7), SocketAddr::new(server, 53));
        let _servers = (
            echo::PeerEcho::start(&b, tcp, patience),
            echo::UdpEcho::start(&b, udp),
        );
        assert_eq!(echo::ask(&a, tcp, patience), Ok(client), "TCP to {tcp}");
        assert_eq!(echo::ask_udp(&a, udp, patience), Ok(client), "UDP to {udp}");
        // No server there: the kernel's refusal (port unreachable) is an error, not an answer.
        let closed = SocketAddr::new(server, 54);
        let err = echo::ask_udp(&a, closed, patience).unwrap_err();
        assert!(
            err.contains("refused"),
            "UDP to {closed}: expected refused, saw {err}"
        );
    }
}
