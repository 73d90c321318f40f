//! Networks with `hostAccess` against a real kernel: two node namespaces linked by a veth pair
//! (IPv6 underlay, SRv6 between them; each node also holds an IPv4 InternalIP), programmed by
//! the real planner and reconciler, with three pods:
//!
//! ```text
//!  node1 (192.168.255.1, 2001:db8:ff::1): apps/server  10.1.1.10  fd00:1:0:1::10  Network open
//!  node2 (192.168.255.2, 2001:db8:ff::2): apps/remote  10.1.2.10  fd00:1:0:2::10  Network open
//!                                         apps/sealed  10.2.2.10  fd00:2:0:2::10  Network sealed
//! ```
//!
//! Network `open` reaches itself and gets `hostAccess` in the middle phases; `sealed` never has
//! it. The nodes' own namespaces are the hosts (with a default route out of their uplink, as
//! nodes have): their processes connect to the pods over TCP,
//! UDP and SCTP in both families. Phases, each applied twice (the second apply writes nothing):
//! without `hostAccess` the hosts reach no pod (the `from_host` drop counts them); with it both
//! hosts reach both pods of `open`, local and across the nodes, from their own addresses, and
//! still not `sealed`, while pods still open nothing to the hosts; with a deny-all ingress
//! NetworkPolicy on the server, the other node is refused (`np_ingress` counts it) and the
//! server's own node is not, as upstream NetworkPolicy has it; `hostAccess` removed again, its
//! rule and table go and the hosts are refused again.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Instant;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use lace::api::{LabelSelector, NetworkRoutingPolicySpec};
use lace::dataplane::{NetnsTarget, Reconciler};
use lace::plan::{plan, DesiredNode, HOST_ACCESS_TABLE};
use lace::state::{ClusterState, Namespace, NetworkPolicy, ObjectKey, Pod, PodAttachment};
use lace_netns_tests::cluster::{
    add_dual_stack_network, ipv4_cluster, two_nodes, underlay, underlay4, PodSeat,
};
use lace_netns_tests::pods::POD_GATEWAY_V6;
use lace_netns_tests::probe::{run_all, Attempt, Expect, Proto, Servers};
use lace_netns_tests::{require_root_and_vrf, Netns, Topology};

const NODES: [u16; 2] = [1, 2];
/// The port every pod serves on (TCP, UDP and SCTP) and the hosts listen on.
const PORT: u16 = 8080;

struct PodSpec {
    name: &'static str,
    network: &'static str,
    second: u8,
    node: u16,
}

const PODS: [PodSpec; 3] = [
    PodSpec {
        name: "server",
        network: "open",
        second: 1,
        node: 1,
    },
    PodSpec {
        name: "remote",
        network: "open",
        second: 1,
        node: 2,
    },
    PodSpec {
        name: "sealed",
        network: "sealed",
        second: 2,
        node: 2,
    },
];

fn pod(name: &str) -> &'static PodSpec {
    PODS.iter().find(|p| p.name == name).unwrap()
}

impl PodSpec {
    fn ip(&self, v6: bool) -> IpAddr {
        if v6 {
            Ipv6Addr::new(0xfd00, u16::from(self.second), 0, self.node, 0, 0, 0, 0x10).into()
        } else {
            Ipv4Addr::new(10, self.second, self.node as u8, 10).into()
        }
    }

    fn seat(&self) -> PodSeat {
        let (IpAddr::V4(v4), IpAddr::V6(v6)) = (self.ip(false), self.ip(true)) else {
            unreachable!()
        };
        PodSeat {
            label: self.name,
            node: self.node,
            v4,
            v6,
        }
    }
}

fn node_label(i: u16) -> String {
    format!("node{i}")
}

/// Node `i`'s InternalIP of a family (what its processes' connections come from).
fn node_ip(i: u16, v6: bool) -> IpAddr {
    if v6 {
        underlay(i).into()
    } else {
        underlay4(i).into()
    }
}

/// The cluster: `open` with `host_access`, `sealed` without, optionally a deny-all ingress
/// NetworkPolicy on the server.
fn cluster(host_access: bool, deny_server: bool) -> ClusterState {
    let mut s = ipv4_cluster("node", NODES.len() as u16, &[]);
    for i in NODES {
        // An IPv4 InternalIP too, which the controller records in the NodeAllocation.
        s.nodes
            .get_mut(&node_label(i))
            .unwrap()
            .internal_ips
            .insert(0, underlay4(i).into());
        s.node_allocations
            .get_mut(&node_label(i))
            .unwrap()
            .underlay
            .ipv4 = Some(underlay4(i));
    }
    add_dual_stack_network(&mut s, "open", 1, 1);
    add_dual_stack_network(&mut s, "sealed", 2, 2);
    s.networks.get_mut("open").unwrap().host_access = host_access;
    for n in ["open", "sealed"] {
        s.network_routes.insert(
            format!("{n}-self"),
            NetworkRoutingPolicySpec {
                from: n.into(),
                to: n.into(),
            },
        );
    }
    s.namespaces.insert("apps".into(), Namespace::default());
    for p in &PODS {
        s.pods.insert(
            ObjectKey::new("apps", p.name),
            Pod {
                labels: [("app".to_string(), p.name.to_string())].into(),
                node: node_label(p.node),
                ips: vec![p.ip(false), p.ip(true)],
                host_network: false,
                ports: Vec::new(),
            },
        );
    }
    if deny_server {
        s.network_policies.insert(
            ObjectKey::new("apps", "deny-server"),
            NetworkPolicy {
                pod_selector: LabelSelector {
                    match_labels: [("app".to_string(), "server".to_string())].into(),
                    ..Default::default()
                },
                ingress_isolation: true,
                ..Default::default()
            },
        );
    }
    s
}

fn plans(s: &ClusterState) -> Vec<DesiredNode> {
    NODES
        .iter()
        .map(|&i| {
            let local = PODS
                .iter()
                .filter(|p| p.node == i)
                .map(|p| PodAttachment {
                    pod: ObjectKey::new("apps", p.name),
                    container_id: format!("c-{}", p.name),
                    host_ifname: p.seat().host_if(),
                    network: p.network.into(),
                    ips: [false, true]
                        .map(|v6| match p.ip(v6) {
                            IpAddr::V4(a) => IpNet::V4(Ipv4Net::from(a)),
                            IpAddr::V6(a) => IpNet::V6(Ipv6Net::from(a)),
                        })
                        .into(),
                    host_ports: Vec::new(),
                    bandwidth: None,
                })
                .collect::<Vec<_>>();
            // As an agent sees the cluster: its own Node object only, the other nodes by
            // their NodeAllocations.
            let mut mine = s.clone();
            mine.nodes.retain(|n, _| *n == node_label(i));
            plan(&node_label(i), &mine, &local).unwrap()
        })
        .collect()
}

/// Where a probe starts: a node's own namespace (its host) or a pod.
#[derive(Clone, Copy, Debug)]
enum From {
    Host(u16),
    Pod(&'static str),
}

/// Where a probe goes: a pod, or a node's host listener on its InternalIP.
#[derive(Clone, Copy, Debug)]
enum To {
    Pod(&'static str),
    Host(u16),
}

/// What a probe must meet: allowed, or refused with the drop of (node, chain) counting it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Allowed,
    Refused(u16, &'static str),
}

#[derive(Clone, Copy, Debug)]
struct Probe {
    from: From,
    to: To,
    proto: Proto,
    want: Want,
}

impl Probe {
    fn target(&self, v6: bool) -> SocketAddr {
        let ip = match self.to {
            To::Pod(p) => pod(p).ip(v6),
            To::Host(i) => node_ip(i, v6),
        };
        SocketAddr::new(ip, PORT)
    }

    /// The sources the server may see for an allowed probe: a host's InternalIP of the family
    /// (`fe80::1`, the probe routes' source, towards a local IPv6 pod), a pod's own address.
    fn sources(&self, v6: bool) -> Vec<IpAddr> {
        match self.from {
            From::Pod(p) => vec![pod(p).ip(v6)],
            From::Host(i) => vec![node_ip(i, v6), IpAddr::V6(POD_GATEWAY_V6)],
        }
    }

    /// The probe in one family, for [`run_all`].
    fn attempt<'a>(&self, w: &'a World, v6: bool) -> Attempt<'a> {
        let from = match self.from {
            From::Host(i) => w.node(i),
            From::Pod(p) => w.ns(p),
        };
        let server = self.target(v6);
        Attempt {
            what: format!("{:?} -> {:?} {:?} {server}", self.from, self.to, self.proto),
            from,
            proto: self.proto,
            server,
            expect: match self.want {
                Want::Allowed => Expect::Answered(self.sources(v6)),
                Want::Refused(i, chain) => Expect::Refused {
                    node: w.node(i),
                    chain,
                    by: chain,
                },
            },
        }
    }
}

fn probe(from: From, to: To, proto: Proto, want: Want) -> Probe {
    Probe {
        from,
        to,
        proto,
        want,
    }
}

/// Every protocol of `from -> to`, all meeting `want`.
fn all_protocols(from: From, to: To, want: Want) -> Vec<Probe> {
    Proto::ALL.map(|p| probe(from, to, p, want)).into()
}

struct World {
    topo: Topology,
}

impl World {
    fn ns(&self, l: &str) -> &Netns {
        self.topo.ns(l).unwrap()
    }

    fn node(&self, i: u16) -> &Netns {
        self.ns(&node_label(i))
    }

    fn build() -> World {
        let w = World {
            topo: two_nodes(&PODS.map(|p| p.seat())).unwrap(),
        };
        for i in NODES {
            let n = w.node(i);
            n.ip(&format!("addr add {}/24 dev eth0", underlay4(i)))
                .unwrap();
            // A default route, as nodes have: what the host sends to a pod it may not reach
            // would leave through it, so only the ruleset's `from_host` stops it.
            n.ip("route add default dev eth0").unwrap();
            n.ip("-6 route add default dev eth0").unwrap();
        }
        w
    }

    /// Echo servers: every pod and every host on [`PORT`], TCP, UDP and SCTP, both families.
    fn servers(&self) -> Servers {
        let mut servers = Servers::default();
        for v6 in [false, true] {
            let pods = PODS.iter().map(|p| (self.ns(p.name), p.ip(v6)));
            let hosts = NODES.iter().map(|&i| (self.node(i), node_ip(i, v6)));
            for (ns, ip) in pods.chain(hosts) {
                for proto in Proto::ALL {
                    servers.start(ns, proto, SocketAddr::new(ip, PORT));
                }
            }
        }
        servers
    }

    fn diagnose(&self) -> String {
        NODES
            .iter()
            .map(|&i| {
                let n = self.node(i);
                let show = |p: &str, a: &[&str]| n.exec(p, a).unwrap_or_else(|e| e.to_string());
                format!(
                    "--- node{i}: ip rule\n{}--- ip -6 rule\n{}--- ip route show table {HOST_ACCESS_TABLE}\n{}--- nft list table inet lace\n{}",
                    show("ip", &["rule"]),
                    show("ip", &["-6", "rule"]),
                    show("ip", &["route", "show", "table", &HOST_ACCESS_TABLE.to_string()]),
                    show("nft", &["list", "table", "inet", "lace"]),
                )
            })
            .collect()
    }
}

/// Runs every probe in both families at once: what differs from what they must meet.
fn check(w: &World, probes: &[Probe]) -> Vec<String> {
    let attempts: Vec<Attempt> = probes
        .iter()
        .flat_map(|p| [false, true].map(|v6| p.attempt(w, v6)))
        .collect();
    run_all(&attempts)
}

use Proto::{Sctp, Tcp, Udp};
use Want::{Allowed, Refused};

fn closed_to_hosts() -> Vec<Probe> {
    [
        all_protocols(From::Host(1), To::Pod("server"), Refused(1, "from_host")),
        all_protocols(From::Host(1), To::Pod("remote"), Refused(1, "from_host")),
        vec![probe(
            From::Host(2),
            To::Pod("server"),
            Tcp,
            Refused(2, "from_host"),
        )],
    ]
    .concat()
}

#[test]
fn host_processes_reach_pods_of_networks_with_host_access_only() {
    require_root_and_vrf();
    let start = Instant::now();
    let w = World::build();
    let recs: Vec<Reconciler> = NODES
        .iter()
        .map(|&i| Reconciler::new(NetnsTarget::Path(w.node(i).path())).unwrap())
        .collect();
    let _servers = w.servers();
    eprintln!("world built in {:.1}s", start.elapsed().as_secs_f64());

    let open = [
        all_protocols(From::Host(1), To::Pod("server"), Allowed),
        all_protocols(From::Host(1), To::Pod("remote"), Allowed),
        all_protocols(From::Host(2), To::Pod("server"), Allowed),
        all_protocols(From::Host(2), To::Pod("remote"), Allowed),
        vec![
            probe(
                From::Host(1),
                To::Pod("sealed"),
                Tcp,
                Refused(1, "from_host"),
            ),
            probe(
                From::Host(2),
                To::Pod("sealed"),
                Udp,
                Refused(2, "from_host"),
            ),
            // Pods still open nothing towards the nodes, local or across.
            probe(
                From::Pod("server"),
                To::Host(2),
                Tcp,
                Refused(1, "from_pods"),
            ),
            probe(
                From::Pod("server"),
                To::Host(1),
                Tcp,
                Refused(1, "from_pods"),
            ),
            probe(
                From::Pod("remote"),
                To::Host(1),
                Udp,
                Refused(2, "from_pods"),
            ),
            // Pods of the Network still reach each other.
            probe(From::Pod("server"), To::Pod("remote"), Sctp, Allowed),
        ],
    ]
    .concat();
    let policed = vec![
        probe(
            From::Host(2),
            To::Pod("server"),
            Tcp,
            Refused(1, "np_ingress"),
        ),
        probe(
            From::Host(2),
            To::Pod("server"),
            Udp,
            Refused(1, "np_ingress"),
        ),
        // The pod's own node is always let in (upstream's NetworkPolicy rule).
        probe(From::Host(1), To::Pod("server"), Tcp, Allowed),
        probe(From::Host(1), To::Pod("remote"), Tcp, Allowed),
    ];
    let phases: [(&str, bool, bool, Vec<Probe>); 4] = [
        ("without hostAccess", false, false, closed_to_hosts()),
        ("hostAccess on Network open", true, false, open),
        (
            "hostAccess and a deny-all ingress NetworkPolicy on the server",
            true,
            true,
            policed,
        ),
        ("hostAccess removed again", false, false, closed_to_hosts()),
    ];
    for (name, host_access, deny, probes) in phases {
        let t = Instant::now();
        let p = plans(&cluster(host_access, deny));
        for (r, d) in recs.iter().zip(&p) {
            let rep = r
                .reconcile(d)
                .unwrap_or_else(|e| panic!("{name}: {}: {e}", d.node));
            assert!(
                rep.skipped.is_empty(),
                "{name}: {}: {:?}",
                d.node,
                rep.skipped
            );
        }
        for (r, d) in recs.iter().zip(&p) {
            let rep = r.reconcile(d).unwrap();
            assert_eq!(
                rep.writes, 0,
                "{name}: {}: expected the plan applied twice to write nothing the second time, saw {:?}",
                d.node, rep.sample
            );
        }
        let rules = w.node(1).exec("ip", &["rule"]).unwrap();
        let table = w
            .node(1)
            .exec(
                "ip",
                &[
                    "-6",
                    "route",
                    "show",
                    "table",
                    &HOST_ACCESS_TABLE.to_string(),
                ],
            )
            // Without routes the table does not exist ("FIB table does not exist").
            .unwrap_or_default();
        assert_eq!(
            rules.contains(&format!("iif lo lookup {HOST_ACCESS_TABLE}")),
            host_access,
            "{name}: the rule for host processes' packets, as `ip rule` shows it:\n{rules}"
        );
        assert_eq!(
            table.contains("fd00:1:0:2::/64") && table.contains("fd00:1:0:1::10"),
            host_access,
            "{name}: table {HOST_ACCESS_TABLE} of node1 (IPv6):\n{table}"
        );
        let wrong = check(&w, &probes);
        assert!(
            wrong.is_empty(),
            "{name}:\n{}\n{}",
            wrong.join("\n"),
            w.diagnose()
        );
        eprintln!(
            "{name}: {} probes x 2 families as expected, {:.1}s",
            probes.len(),
            t.elapsed().as_secs_f64()
        );
    }
}
