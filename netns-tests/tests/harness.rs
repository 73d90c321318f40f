//! Tests of the netns harness itself against the real kernel: namespaces appear and disappear,
//! commands run inside them, errors say what failed, veth links carry traffic, threads can
//! enter a namespace.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::{TcpListener, TcpStream};
use std::path::Path;

use lace_netns_tests::{require_root_and_vrf, veth, Netns, NetnsError, Topology, NS_PREFIX};

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
    // lo is up and only lo exists.
    let links = a.ip("-o link show").unwrap();
    assert_eq!(links.lines().count(), 1, "{links}");
    assert!(links.contains("lo:") && links.contains("UP"), "{links}");
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
