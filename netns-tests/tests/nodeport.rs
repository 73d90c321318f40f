//! NodePort from outside the cluster against a real kernel: three node namespaces and a host
//! outside the cluster on one fabric (a bridge; IPv4 and IPv6), the nodes programmed by the
//! real planner and reconciler, and a kube-proxy stand-in on every node (its nft DNAT with the
//! masquerade mark 0x4000 and its masquerade, for the node ports below, as kube-proxy's
//! nftables mode writes them).
//!
//! The nodes reach each other over IPv6 (their IPv4 and IPv6 InternalIPs) or, in the second
//! test, over IPv4 only (SRv6 in fou); the host outside uses both families either way.
//!
//! Network `default` (dual-stack, does not reach itself) holds the one backend pod, `web` on
//! node 2. Service `test/web` (node port 30080, externalTrafficPolicy Cluster) and
//! `test/web-local` (30081, Local: node 2 only, no masquerade mark) are bound to `default` and
//! granted from the external `internet` Network; `test/admin` (30082, same backend) is bound
//! to `default` and granted to no one.
//!
//! Beside them, on one node of its own, a pod reaching itself through a Service's ClusterIP
//! (hairpin), with kube-proxy's DNAT and hairpin masquerade.
//!
//! hostPorts (the runtime's `portMappings`) on the same three nodes: the web pod maps ports of
//! node 2 to itself, reached from the host outside, from node 2 itself and from another pod
//! on node 2, in both families, and gone once the pod's hostPorts are.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use lace::api::{
    NetworkRoutingPolicySpec, NetworkSpec, NodeAllocationSpec, ServiceBindingPolicySpec,
    ServiceRef, ServiceRoutingPolicySpec, Underlay,
};
use lace::dataplane::{NetnsTarget, Reconciler};
use lace::plan::{plan, DesiredNode};
use lace::state::{
    ClusterState, Endpoints, Node, ObjectKey, Pod, PodAttachment, Service, ServicePort,
};
use lace_netns_tests::cluster::add_dual_stack_network;
use lace_netns_tests::echo::{self, PeerEcho};
use lace_netns_tests::nft::counted_drops;
use lace_netns_tests::pods::{add_pod_v6, attach_pod, POD_GATEWAY_V4};
use lace_netns_tests::{require_root_and_vrf, Netns, Topology};

const NODES: [u16; 3] = [1, 2, 3];
/// The backend pod (node 2, Network `default`) and its port.
const WEB_V4: Ipv4Addr = Ipv4Addr::new(10, 1, 2, 10);
const WEB_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 2, 0, 0, 0, 10);
const TARGET_PORT: u16 = 8080;
/// Node ports: web (Cluster), web-local (Local, node 2), admin (not granted).
const WEB: u16 = 30080;
const WEB_LOCAL: u16 = 30081;
const ADMIN: u16 = 30082;
/// The host outside the cluster, on the fabric.
const OUTSIDE_V4: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 100);
const OUTSIDE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 0x100);
/// How long a check that must fail waits; one that must pass waits [`PATIENT`].
const TIMEOUT: Duration = Duration::from_secs(3);
const PATIENT: Duration = Duration::from_secs(15);

fn label(i: u16) -> String {
    format!("node{i}")
}

fn node_v4(i: u16) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 0, i as u8)
}

fn node_v6(i: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, i)
}

/// Node `i`'s ingress address in `default`: the first address of its blocks.
fn ingress(i: u16, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(0xfd00, 1, 0, i, 0, 0, 0, 0))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 1, i as u8, 0))
    }
}

/// A Service bound to `default` (by its own ServiceBindingPolicy) with the one backend.
fn add_service(s: &mut ClusterState, name: &str, node_port: u16) {
    let key = ObjectKey::new("test", name);
    s.services.insert(
        key.clone(),
        Service {
            cluster_ips: vec![],
            ports: vec![ServicePort {
                protocol: "TCP".into(),
                port: 80,
                node_port: Some(node_port),
            }],
            ..Default::default()
        },
    );
    s.endpoints.insert(
        key,
        Endpoints {
            addresses: vec![IpAddr::V4(WEB_V4), IpAddr::V6(WEB_V6)],
            ports: vec![ServicePort {
                protocol: "TCP".into(),
                port: TARGET_PORT,
                node_port: None,
            }],
        },
    );
    s.service_bindings.insert(
        name.into(),
        ServiceBindingPolicySpec {
            network: "default".into(),
            services: vec![ServiceRef {
                namespace: "test".into(),
                name: name.into(),
            }],
            ..Default::default()
        },
    );
}

/// How the nodes reach each other (what their InternalIPs are): the fabric carries both
/// families either way, for the host outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Underpath {
    /// IPv4 and IPv6 InternalIPs: SRv6 natively over IPv6.
    Ipv6,
    /// IPv4 InternalIPs only: SRv6 in UDP over IPv4 (`lu-ipv4`), as the planner chooses without
    /// probes (the output path of the ingress device's routes over `lu-ipv4`).
    Fou,
}

impl Underpath {
    /// The pods' MTU on a 1500-byte fabric.
    fn pod_mtu(self) -> u32 {
        match self {
            Underpath::Ipv6 => 1436,
            Underpath::Fou => 1408,
        }
    }
}

/// The cluster; `granted`: the ServiceRoutingPolicy `internet -> default [web, web-local]`.
fn cluster(granted: bool, under: Underpath) -> ClusterState {
    let mut s = ClusterState::default();
    add_dual_stack_network(&mut s, "default", 1, 1);
    s.networks.insert(
        "internet".into(),
        NetworkSpec {
            subnets: vec![],
            external: true,
            host_access: false,
        },
    );
    for i in NODES {
        let ul = Underlay {
            ipv4: Some(node_v4(i)),
            ipv6: (under == Underpath::Ipv6).then(|| node_v6(i)),
        };
        s.nodes.insert(
            label(i),
            Node {
                labels: Default::default(),
                internal_ips: [IpAddr::V4(node_v4(i))]
                    .into_iter()
                    .chain(ul.ipv6.map(IpAddr::V6))
                    .collect(),
            },
        );
        s.node_allocations.insert(
            label(i),
            NodeAllocationSpec {
                // Index i + 1 holds block i: 10.1.<i>.0/24, fd00:1:0:<i>::/64.
                index: u32::from(i) + 1,
                locator: format!("2001:db8:100::{i}:0:0/96").parse().unwrap(),
                underlay: ul,
            },
        );
    }
    add_service(&mut s, "web", WEB);
    add_service(&mut s, "web-local", WEB_LOCAL);
    add_service(&mut s, "admin", ADMIN);
    if granted {
        s.service_routes.insert(
            "internet-to-web".into(),
            ServiceRoutingPolicySpec {
                from: "internet".into(),
                to: "default".into(),
                services: ["web", "web-local"]
                    .map(|n| ServiceRef {
                        namespace: "test".into(),
                        name: n.into(),
                    })
                    .to_vec(),
                ..Default::default()
            },
        );
    }
    s
}

fn attachments(i: u16) -> Vec<PodAttachment> {
    if i != 2 {
        return vec![];
    }
    vec![pod_attachment("web", WEB_V4, WEB_V6)]
}

/// Pod `test/<name>` of `default` with host interface `lp-<name>` and both addresses.
fn pod_attachment(name: &str, v4: Ipv4Addr, v6: Ipv6Addr) -> PodAttachment {
    PodAttachment {
        pod: ObjectKey::new("test", name),
        container_id: format!("c-{name}"),
        host_ifname: format!("lp-{name}"),
        network: "default".into(),
        ips: vec![IpNet::V4(Ipv4Net::from(v4)), IpNet::V6(Ipv6Net::from(v6))],
        host_ports: Vec::new(),
        bandwidth: None,
    }
}

fn plans(granted: bool, under: Underpath) -> Vec<DesiredNode> {
    let s = cluster(granted, under);
    NODES
        .iter()
        .map(|&i| plan(&label(i), &s, &attachments(i)).unwrap())
        .collect()
}

/// Applies `plans`; the number of writes.
fn apply(recs: &[Reconciler], plans: &[DesiredNode]) -> u64 {
    recs.iter()
        .zip(plans)
        .map(|(r, p)| {
            let rep = r
                .reconcile(p)
                .unwrap_or_else(|e| panic!("reconcile {}: {e}", p.node));
            assert!(rep.skipped.is_empty(), "{}: {:?}", p.node, rep.skipped);
            rep.writes
        })
        .sum()
}

/// kube-proxy's nftables mode, reduced to what these node ports need: DNAT of a local
/// address's node port to the backend (with the masquerade mark for Cluster), masquerade of
/// what carries the mark.
fn kube_proxy(i: u16) -> String {
    let mut dnat = String::new();
    let mut ports = vec![(WEB, true), (ADMIN, true)];
    if i == 2 {
        ports.push((WEB_LOCAL, false));
    }
    for (port, masq) in ports {
        let mark = if masq {
            "meta mark set mark | 0x4000 "
        } else {
            ""
        };
        dnat.push_str(&format!(
            "  fib daddr type local tcp dport {port} {mark}meta nfproto ipv4 dnat ip to {WEB_V4}:{TARGET_PORT}\n  fib daddr type local tcp dport {port} {mark}meta nfproto ipv6 dnat ip6 to [{WEB_V6}]:{TARGET_PORT}\n"
        ));
    }
    format!(
        "table inet kube-proxy {{\n chain nat-prerouting {{\n  type nat hook prerouting priority dstnat; policy accept;\n{dnat} }}\n chain nat-postrouting {{\n  type nat hook postrouting priority srcnat; policy accept;\n  meta mark & 0x4000 == 0x4000 meta mark set mark xor 0x4000 masquerade\n }}\n}}\n"
    )
}

struct World {
    topo: Topology,
}

impl World {
    fn ns(&self, l: &str) -> &Netns {
        self.topo.ns(l).unwrap()
    }

    fn node(&self, i: u16) -> &Netns {
        self.ns(&label(i))
    }

    fn build(under: Underpath) -> World {
        let mut topo = Topology::new();
        for l in ["fabric", "outside", "web"] {
            topo.add(l).unwrap();
        }
        for i in NODES {
            topo.add(&label(i)).unwrap();
        }
        let w = World { topo };
        let fabric = w.ns("fabric");
        fabric.ip("link add br0 type bridge").unwrap();
        fabric.ip("link set br0 up").unwrap();
        let hosts: Vec<(String, Ipv4Addr, Ipv6Addr)> = NODES
            .iter()
            .map(|&i| (label(i), node_v4(i), node_v6(i)))
            .chain([("outside".to_string(), OUTSIDE_V4, OUTSIDE_V6)])
            .collect();
        for (l, v4, v6) in &hosts {
            let port = format!("fab-{l}");
            w.topo.link((l, "eth0"), ("fabric", &port)).unwrap();
            fabric.ip(&format!("link set {port} master br0")).unwrap();
            let ns = w.ns(l);
            ns.ip(&format!("addr add {v4}/24 dev eth0")).unwrap();
            ns.ip(&format!("-6 addr add {v6}/64 dev eth0 nodad"))
                .unwrap();
        }
        for i in NODES {
            let n = w.node(i);
            // A default route as nodes have: what kube-proxy translates towards a pod that no
            // Lace route takes still goes through forward (and Lace's policy) that way.
            n.ip(&format!("route add default via {OUTSIDE_V4} dev eth0"))
                .unwrap();
            n.ip(&format!("-6 route add default via {OUTSIDE_V6} dev eth0"))
                .unwrap();
            n.exec_stdin("nft", &["-f", "-"], &kube_proxy(i)).unwrap();
        }
        let (node2, web) = (w.node(2), w.ns("web"));
        attach_pod(node2, "lp-web", web, WEB_V4).unwrap();
        add_pod_v6(node2, "lp-web", web, WEB_V6).unwrap();
        for (ns, dev) in [(node2, "lp-web"), (web, "eth0")] {
            ns.ip(&format!("link set {dev} mtu {}", under.pod_mtu()))
                .unwrap();
        }
        w
    }

    /// The packets Lace's `to_pods` chain on node `i` dropped (no policy allows them).
    fn to_pods_drops(&self, i: u16) -> u64 {
        counted_drops(self.node(i), "to_pods")
    }

    /// Node `i`'s Lace table and routes, for failure messages.
    fn diagnose(&self, i: u16) -> String {
        let n = self.node(i);
        let mut out = String::new();
        for args in [
            "route show table all",
            "-6 route show table all",
            "rule",
            "-d link",
        ] {
            out.push_str(&format!(
                "--- node{i}: ip {args}\n{}\n",
                n.ip(args).unwrap_or_else(|e| e.to_string())
            ));
        }
        let nft = n.exec("nft", &["list", "ruleset"]).unwrap_or_default();
        out.push_str(&format!("--- node{i}: nft list ruleset\n{nft}"));
        out
    }
}

/// Connects from the outside host to `to`:`port`; the address the backend saw.
fn connect(w: &World, to: IpAddr, port: u16, timeout: Duration) -> Result<IpAddr, String> {
    echo::ask(w.ns("outside"), (to, port).into(), timeout)
}

fn node_addr(i: u16, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(node_v6(i))
    } else {
        IpAddr::V4(node_v4(i))
    }
}

/// Every NodePort check of the grant in force (`granted`): what differs from the policy.
fn check(w: &World, granted: bool) -> Vec<String> {
    let mut wrong = Vec::new();
    for v6 in [false, true] {
        let outside = if v6 {
            IpAddr::V6(OUTSIDE_V6)
        } else {
            IpAddr::V4(OUTSIDE_V4)
        };
        // (ingress node, node port, whom the backend must see when allowed)
        let mut cases: Vec<(u16, u16, Option<IpAddr>)> = NODES
            .iter()
            .map(|&i| (i, WEB, granted.then(|| ingress(i, v6))))
            .collect();
        cases.push((2, WEB_LOCAL, granted.then_some(outside)));
        cases.push((1, ADMIN, None));
        for (i, port, want) in cases {
            let to = node_addr(i, v6);
            let wait = if want.is_some() { PATIENT } else { TIMEOUT };
            let before = w.to_pods_drops(i);
            let got = connect(w, to, port, wait);
            let what = format!("outside -> node{i} {to} port {port}");
            match (want, got) {
                (Some(want), Ok(seen)) if seen != want => {
                    wrong.push(format!("{what}: the backend saw {seen}, not {want}"))
                }
                (Some(_), Ok(_)) => {}
                (Some(_), Err(e)) => wrong.push(format!("{what}: allowed, but {e}")),
                (None, Ok(seen)) => wrong.push(format!(
                    "{what}: denied, but connected (the backend saw {seen})"
                )),
                (None, Err(_)) => {
                    if w.to_pods_drops(i) == before {
                        wrong.push(format!("{what}: denied, but node{i} counted no drop"));
                    }
                }
            }
        }
    }
    wrong
}

/// The grant in force `phases` one after the other, each applied (twice: the second writes
/// nothing) and checked with real traffic.
fn run(under: Underpath, phases: &[bool]) {
    require_root_and_vrf();
    let w = World::build(under);
    let recs: Vec<Reconciler> = NODES
        .iter()
        .map(|&i| Reconciler::new(NetnsTarget::Path(w.node(i).path())).unwrap())
        .collect();
    let _servers = [
        PeerEcho::start(
            w.ns("web"),
            (IpAddr::V4(WEB_V4), TARGET_PORT).into(),
            PATIENT,
        ),
        PeerEcho::start(
            w.ns("web"),
            (IpAddr::V6(WEB_V6), TARGET_PORT).into(),
            PATIENT,
        ),
    ];
    for &granted in phases {
        let p = plans(granted, under);
        assert!(apply(&recs, &p) > 0);
        assert_eq!(
            apply(&recs, &p),
            0,
            "applying the plan twice writes nothing"
        );
        for i in NODES {
            let dev = w.node(i).ip("link show li-default");
            assert_eq!(
                dev.is_ok(),
                granted,
                "node{i}: the ingress device exists exactly while the grant does"
            );
        }
        let wrong = check(&w, granted);
        assert!(
            wrong.is_empty(),
            "{under:?}, granted {granted}:\n{}\n{}\n{}",
            wrong.join("\n"),
            w.diagnose(1),
            w.diagnose(2)
        );
    }
}

/// Granted, the grant deleted, granted again.
#[test]
fn node_ports_from_outside_follow_the_grant_from_the_internet() {
    run(Underpath::Ipv6, &[true, false, true]);
}

/// The same between IPv4-only nodes (SRv6 in fou), granted and then not.
#[test]
fn node_ports_from_outside_between_ipv4_only_nodes() {
    run(Underpath::Fou, &[true, false]);
}

/// The ClusterIPs of the hairpin test's Service.
const CLUSTER_IP_V4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 80);
const CLUSTER_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x80);

/// kube-proxy's nftables mode for a Service whose one backend is the pod that connects to it:
/// DNAT of the ClusterIP, and masquerade of the hairpinned connection (its set
/// `hairpin-connections`, reduced to the one pod).
fn kube_proxy_hairpin() -> String {
    format!(
        "table inet kube-proxy {{
 chain nat-prerouting {{
  type nat hook prerouting priority dstnat; policy accept;
  ip daddr {CLUSTER_IP_V4} tcp dport 80 dnat ip to {WEB_V4}:{TARGET_PORT}
  ip6 daddr {CLUSTER_IP_V6} tcp dport 80 dnat ip6 to [{WEB_V6}]:{TARGET_PORT}
 }}
 chain nat-postrouting {{
  type nat hook postrouting priority srcnat; policy accept;
  ct status dnat ip saddr {WEB_V4} ip daddr {WEB_V4} masquerade
  ct status dnat ip6 saddr {WEB_V6} ip6 daddr {WEB_V6} masquerade
 }}
}}
"
    )
}

/// A pod reaches itself through a Service it backs (hairpin). kube-proxy masquerades such a
/// connection, and masquerading takes an address of the output device or its VRF: the host
/// side of a Lace pod's veth has no IPv4 address (the CNI answers for the gateway with a
/// static neighbour and proxy ARP), so the kernel drops the packet ("lp-… ate my IP
/// address", seen in the real cluster). Lace's source NAT to the node's ingress address in the
/// pod's block runs first: before the pod's IPs are in the state, IPv4 hairpin fails; after,
/// the pod sees the ingress address as its peer in both families.
#[test]
fn a_pod_reaches_itself_through_a_service() {
    require_root_and_vrf();
    let mut topo = Topology::new();
    for l in ["hp-node", "hp-pod"] {
        topo.add(l).unwrap();
    }
    let (node, pod) = (topo.ns("hp-node").unwrap(), topo.ns("hp-pod").unwrap());
    node.ip("link add eth0 type dummy").unwrap();
    node.ip(&format!("addr add {}/24 dev eth0", node_v4(2)))
        .unwrap();
    node.ip(&format!("-6 addr add {}/64 dev eth0 nodad", node_v6(2)))
        .unwrap();
    node.ip("link set eth0 up").unwrap();
    attach_pod(node, "lp-web", pod, WEB_V4).unwrap();
    add_pod_v6(node, "lp-web", pod, WEB_V6).unwrap();
    // As Lace's CNI wires a pod: no address on the host side, the gateway a static neighbour.
    node.ip(&format!("addr del {POD_GATEWAY_V4}/32 dev lp-web"))
        .unwrap();
    let mac = node
        .exec("cat", &["/sys/class/net/lp-web/address"])
        .unwrap();
    pod.ip(&format!(
        "neigh replace {POD_GATEWAY_V4} lladdr {} dev eth0 nud permanent",
        mac.trim()
    ))
    .unwrap();
    node.exec_stdin("nft", &["-f", "-"], &kube_proxy_hairpin())
        .unwrap();
    let _servers = [IpAddr::V4(WEB_V4), IpAddr::V6(WEB_V6)]
        .map(|a| PeerEcho::start(pod, (a, TARGET_PORT).into(), PATIENT));

    let mut s = ClusterState::default();
    add_dual_stack_network(&mut s, "default", 1, 1);
    s.network_routes.insert(
        "default-to-default".into(),
        NetworkRoutingPolicySpec {
            from: "default".into(),
            to: "default".into(),
        },
    );
    s.node_allocations.insert(
        label(2),
        NodeAllocationSpec {
            index: 3,
            locator: "2001:db8:100::2:0:0/96".parse().unwrap(),
            underlay: Underlay {
                ipv4: Some(node_v4(2)),
                ipv6: Some(node_v6(2)),
            },
        },
    );
    let rec = Reconciler::new(NetnsTarget::Path(node.path())).unwrap();
    let apply = |s: &ClusterState| {
        let p = plan(&label(2), s, &attachments(2)).unwrap();
        rec.reconcile(&p).unwrap();
        assert_eq!(rec.reconcile(&p).unwrap().writes, 0, "applied twice");
    };
    let ask = |ip: IpAddr, wait| echo::ask(pod, (ip, 80).into(), wait);

    apply(&s);
    let before = ask(IpAddr::V4(CLUSTER_IP_V4), TIMEOUT);
    assert!(
        before.is_err(),
        "without the pod's IPs in the state (no hairpin element) kube-proxy's masquerade finds no address; connected: {before:?}"
    );

    s.pods.insert(
        ObjectKey::new("test", "web"),
        Pod {
            node: label(2),
            ips: vec![IpAddr::V4(WEB_V4), IpAddr::V6(WEB_V6)],
            ..Default::default()
        },
    );
    apply(&s);
    for (cluster_ip, v6) in [
        (IpAddr::V4(CLUSTER_IP_V4), false),
        (IpAddr::V6(CLUSTER_IP_V6), true),
    ] {
        let seen = ask(cluster_ip, PATIENT);
        assert_eq!(
            seen,
            Ok(ingress(2, v6)),
            "the pod through {cluster_ip}:80 back to itself, seen from the ingress address of its block\n{}",
            node.exec("nft", &["list", "ruleset"]).unwrap_or_default()
        );
    }
}

/// hostPorts of the web pod on node 2: TCP 9080 on every address of the node, TCP 9443 on its
/// IPv4 address only (hostIP), UDP 9053 on every address.
const HP_ANY: u16 = 9080;
const HP_V4_ONLY: u16 = 9443;
const HP_UDP: u16 = 9053;
const UDP_TARGET: u16 = 8053;
/// Another pod of `default` on node 2.
const PEER_V4: Ipv4Addr = Ipv4Addr::new(10, 1, 2, 11);
const PEER_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 2, 0, 0, 0, 11);

/// Node 2's attachments: the web pod with `host_ports`, and the peer pod.
fn host_port_attachments(host_ports: Vec<lace::hostport::HostPort>) -> Vec<PodAttachment> {
    let mut atts = attachments(2);
    atts[0].host_ports = host_ports;
    atts.push(pod_attachment("peer", PEER_V4, PEER_V6));
    atts
}

/// Reached from outside the cluster (the client's own address seen), from node 2 itself
/// and from the peer pod (its Network reaches itself here), both families; only on node 2,
/// and the hostIP mapping on its address only. Then the pod's hostPorts are gone (its DEL):
/// nothing is reached, and the main table no longer routes the pod into the VRF. Each plan is
/// applied twice (the second writes nothing), and once more by a new reconciler, as after an
/// agent restart.
#[test]
fn host_ports_from_outside_from_the_node_and_from_pods() {
    use lace::hostport::{HostPort, Protocol};
    require_root_and_vrf();
    let mut w = World::build(Underpath::Ipv6);
    w.topo.add("peer").unwrap();
    let (node2, peer) = (w.node(2), w.ns("peer"));
    attach_pod(node2, "lp-peer", peer, PEER_V4).unwrap();
    add_pod_v6(node2, "lp-peer", peer, PEER_V6).unwrap();
    let web = w.ns("web");
    let _servers = [
        PeerEcho::start(web, (IpAddr::V4(WEB_V4), TARGET_PORT).into(), PATIENT),
        PeerEcho::start(web, (IpAddr::V6(WEB_V6), TARGET_PORT).into(), PATIENT),
    ];
    let _udp = echo::UdpEcho::start(web, (IpAddr::V4(WEB_V4), UDP_TARGET).into());
    let hp = |protocol, host_port, container_port, host_ip: Option<IpAddr>| HostPort {
        protocol,
        host_port,
        container_port,
        host_ip,
    };
    let mapped = vec![
        hp(Protocol::Tcp, HP_ANY, TARGET_PORT, None),
        hp(
            Protocol::Tcp,
            HP_V4_ONLY,
            TARGET_PORT,
            Some(node_addr(2, false)),
        ),
        hp(Protocol::Udp, HP_UDP, UDP_TARGET, None),
    ];
    let mut s = cluster(false, Underpath::Ipv6);
    s.network_routes.insert(
        "default-to-default".into(),
        NetworkRoutingPolicySpec {
            from: "default".into(),
            to: "default".into(),
        },
    );
    let plan_with = |host_ports: Vec<HostPort>| -> Vec<DesiredNode> {
        NODES
            .iter()
            .map(|&i| {
                let atts = if i == 2 {
                    host_port_attachments(host_ports.clone())
                } else {
                    vec![]
                };
                plan(&label(i), &s, &atts).unwrap()
            })
            .collect()
    };
    let recs: Vec<Reconciler> = NODES
        .iter()
        .map(|&i| Reconciler::new(NetnsTarget::Path(w.node(i).path())).unwrap())
        .collect();

    let p = plan_with(mapped);
    assert!(apply(&recs, &p) > 0);
    assert_eq!(
        apply(&recs, &p),
        0,
        "applying the plan twice writes nothing"
    );
    let restarted = Reconciler::new(NetnsTarget::Path(w.node(2).path())).unwrap();
    assert_eq!(
        restarted.reconcile(&p[1]).unwrap().writes,
        0,
        "a new reconciler (an agent restart) finds the hostPorts in place"
    );
    let nft = w
        .node(2)
        .exec("nft", &["list", "map", "inet", "lace", "hostports_any_v4"])
        .unwrap();
    assert!(
        nft.contains(&format!(
            "tcp . {HP_ANY} comment \"pod test/web\" : {WEB_V4} . {TARGET_PORT}"
        )),
        "the mapping, its comment naming the pod:\n{nft}"
    );

    let (outside, node2, peer) = (w.ns("outside"), w.node(2), w.ns("peer"));
    let mut wrong = Vec::new();
    let mut expect =
        |what: String, got: Result<IpAddr, String>, want: Option<IpAddr>| match (want, got) {
            (Some(want), Ok(seen)) if seen != want => {
                wrong.push(format!("{what}: the pod saw {seen}, not {want}"))
            }
            (Some(_), Ok(_)) | (None, Err(_)) => {}
            (Some(_), Err(e)) => wrong.push(format!("{what}: expected to connect, but {e}")),
            (None, Ok(seen)) => wrong.push(format!(
                "{what}: expected no connection, but the pod saw {seen}"
            )),
        };
    for v6 in [false, true] {
        let (me, peer_ip) = if v6 {
            (IpAddr::V6(OUTSIDE_V6), IpAddr::V6(PEER_V6))
        } else {
            (IpAddr::V4(OUTSIDE_V4), IpAddr::V4(PEER_V4))
        };
        let to = node_addr(2, v6);
        let ask = |ns: &Netns, port, ok: bool| {
            echo::ask(ns, (to, port).into(), if ok { PATIENT } else { TIMEOUT })
        };
        expect(
            format!("outside -> node2 {to}:{HP_ANY}"),
            ask(outside, HP_ANY, true),
            Some(me),
        );
        expect(
            format!("node2 -> itself {to}:{HP_ANY}"),
            ask(node2, HP_ANY, true),
            Some(to),
        );
        expect(
            format!("peer pod -> node2 {to}:{HP_ANY}"),
            ask(peer, HP_ANY, true),
            Some(peer_ip),
        );
        expect(
            format!(
                "outside -> node2 {to}:{HP_V4_ONLY} (hostIP {})",
                node_addr(2, false)
            ),
            ask(outside, HP_V4_ONLY, !v6),
            (!v6).then_some(me),
        );
        let other = node_addr(1, v6);
        expect(
            format!("outside -> node1 {other}:{HP_ANY} (the pod is on node 2)"),
            echo::ask(outside, (other, HP_ANY).into(), TIMEOUT),
            None,
        );
    }
    let to = node_addr(2, false);
    expect(
        format!("outside -> node2 {to}:{HP_UDP}/UDP"),
        echo::ask_udp(outside, (to, HP_UDP).into(), PATIENT),
        Some(IpAddr::V4(OUTSIDE_V4)),
    );
    assert!(
        wrong.is_empty(),
        "hostPorts mapped:\n{}\n{}",
        wrong.join("\n"),
        w.diagnose(2)
    );

    // The pod's hostPorts gone (its DEL, or a new sandbox without them).
    let p = plan_with(Vec::new());
    assert!(apply(&recs, &p) > 0);
    assert_eq!(
        apply(&recs, &p),
        0,
        "applying the plan twice writes nothing"
    );
    for v6 in [false, true] {
        let to = node_addr(2, v6);
        let got = echo::ask(w.ns("outside"), (to, HP_ANY).into(), TIMEOUT);
        assert!(
            got.is_err(),
            "outside -> node2 {to}:{HP_ANY} after the hostPorts went: connected ({got:?})"
        );
    }
    let routes = w.node(2).ip("route show table main").unwrap();
    assert!(
        !routes.contains(&WEB_V4.to_string()),
        "the main table still routes the pod:\n{routes}"
    );
}
