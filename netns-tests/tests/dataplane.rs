//! The dataplane reconciler against a real kernel: three node namespaces on a fabric (one
//! bridge), an "internet" namespace beyond node 1, a rogue host on the fabric, pods wired as
//! the CNI wires them (at the MTU the agent computes). The plan comes from the real planner
//! over a ClusterState built here; only the reconciler programs the nodes. Everything is
//! asserted with real ICMP and TCP.
//!
//! Networks: `system` reaches itself; `default` does not reach itself and egresses to the
//! external `internet`; `tenant-a` reaches itself and `system`. Every Network is dual-stack
//! (a /24 and a /64 per node), every pod has an IPv4 and an IPv6 address, and every cell of the
//! matrix is checked in both families, with ICMP and with TCP.
//!
//! The fabric comes in four kinds ([`Fabric`]): IPv6 only (SRv6 natively), IPv4 only with
//! IPv6 disabled on every fabric link (SRv6 in fou over IPv4, through `lu-ipv4`), IPv4
//! InternalIPs only with the links' IPv6 on (the kernel's default: link-local addresses only;
//! SRv6 natively with link-local next hops, node 3 with stable-privacy link-locals), and mixed
//! (two segments and a router: the pair 1-2 over global IPv6, 1-3 over link-local, 2-3 routed
//! apart over fou).
//!
//! Where the plan depends on what a node finds on its links (the link-local path), the tests
//! run the agent's probe rounds themselves ([`probe_and_apply`]): the real probes
//! (`Reconciler::probe_underlay`), the agent's [`Tracker`], the planner with those facts.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use lace::agent::paths::{self, Tracker, MISSES};
use lace::api::{NetworkRoutingPolicySpec, NetworkSpec, NodeAllocationSpec, Underlay};
use lace::dataplane::{NetnsTarget, Reconciler, ROUTE_PROTOCOL};
use lace::plan::underlay::{self, link_local_address, UnderlayFacts, FOU_PORT, IPV4_TUNNEL};
use lace::plan::{plan, plan_with, DesiredNode, Planner};
use lace::state::{ClusterState, Node, ObjectKey, PodAttachment};
use lace_netns_tests::bed::number_after;
use lace_netns_tests::cluster::add_dual_stack_network;
use lace_netns_tests::echo::{self, PeerEcho};
use lace_netns_tests::nft::counted_drops;
use lace_netns_tests::pods::{add_pod_v6, attach_pod};
use lace_netns_tests::{require_root_and_vrf, Netns, Topology};

const NODES: [u32; 3] = [1, 2, 3];
/// (Network, second octet, SID function).
const NETS: [(&str, u8, u16); 3] = [("default", 1, 1), ("system", 2, 2), ("tenant-a", 3, 3)];
const TCP_PORT: u16 = 7100;
/// The rogue host's number on the fabric (`2001:db8:ff::99`, `192.168.0.153`).
const ROGUE: u16 = 0x99;
/// How long a check the policies deny waits for an answer that must not come.
const TIMEOUT: Duration = Duration::from_secs(3);
/// How long a check the policies allow waits for its answer: only a failure waits that long,
/// and under emulation on a loaded machine an allowed handshake took over 3 s.
const PATIENT: Duration = Duration::from_secs(15);
/// The internet namespace's address beyond node 1, per family.
const INTERNET_V4: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
const INTERNET_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xeeee, 0, 0, 0, 0, 1);
/// Node 1's addresses on its link to the internet (what masquerade must show).
const NODE1_INET_V4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const NODE1_INET_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xee, 0, 0, 0, 0, 1);

/// A test pod: its namespace label, node, Network and addresses.
#[derive(Clone, Debug)]
struct PodSpec {
    label: &'static str,
    node: u32,
    network: &'static str,
    addr: Ipv4Addr,
    addr6: Ipv6Addr,
}

impl PodSpec {
    /// The pod's address in `family`.
    fn ip(&self, family: Family) -> IpAddr {
        match family {
            Family::V4 => IpAddr::V4(self.addr),
            Family::V6 => IpAddr::V6(self.addr6),
        }
    }
}

/// An address family the matrix is checked in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

/// The Network's IPv6 block on node `node`: `fd00:<second>:0:<node>::/64`.
const fn block6(second: u8, node: u32) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, second as u16, 0, node as u16, 0, 0, 0, 0)
}

const fn pod(label: &'static str, node: u32, network: &'static str, host: u8) -> PodSpec {
    let second = match network.as_bytes()[0] {
        b'd' => 1,
        b's' => 2,
        _ => 3,
    };
    let b = block6(second, node).segments();
    PodSpec {
        label,
        node,
        network,
        addr: Ipv4Addr::new(10, second, node as u8, host),
        addr6: Ipv6Addr::new(b[0], b[1], b[2], b[3], 0, 0, 0, host as u16),
    }
}

const PODS: [PodSpec; 8] = [
    pod("p1-default", 1, "default", 10),
    pod("p1-system", 1, "system", 10),
    pod("p1-system-b", 1, "system", 11),
    pod("p1-tenant", 1, "tenant-a", 10),
    pod("p2-default", 2, "default", 10),
    pod("p2-system", 2, "system", 10),
    pod("p2-tenant", 2, "tenant-a", 10),
    pod("p3-system", 3, "system", 10),
];

fn node_label(i: u32) -> String {
    format!("node{i}")
}

/// What the fabric between the nodes carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fabric {
    /// IPv6 only: SRv6 natively.
    Ipv6,
    /// IPv4 only, IPv6 disabled on every fabric link: SRv6 in fou over IPv4.
    Ipv4,
    /// IPv4 InternalIPs only, IPv6 on at every fabric link (link-local addresses only): the
    /// link-local path. Node 3's link-locals are stable-privacy (`addr_gen_mode` 3).
    LinkLocal,
    /// Two segments: A (`br0`: node 1's `eth0`, node 3, the rogue; IPv4 `192.168.0.0/24`, IPv6
    /// link-local only) and B (`br1`: node 1's `eth1`, node 2; IPv6 `2001:db8:ff::/64`, node
    /// 2's IPv4 `192.168.1.0/24`), and a router between them for IPv4. Node 1 has its IPv4
    /// InternalIP on A and its IPv6 one on B, node 2 both on B, node 3 only IPv4 on A: the pair
    /// 1-2 goes over global IPv6, 1-3 over link-local, 2-3 routed apart over fou.
    Mixed,
}

impl Fabric {
    /// Whether node `i` has an IPv6 InternalIP on the fabric.
    fn v6(self, i: u32) -> bool {
        match self {
            Fabric::Ipv6 => true,
            Fabric::Ipv4 | Fabric::LinkLocal => false,
            Fabric::Mixed => i != 3,
        }
    }

    /// Whether node `i` has an IPv4 InternalIP on the fabric.
    fn v4(self, _i: u32) -> bool {
        self != Fabric::Ipv6
    }

    /// Whether IPv6 is on at node `i`'s fabric links.
    fn ipv6_on(self, _i: u32) -> bool {
        self != Fabric::Ipv4
    }

    /// The segment node `i`'s IPv4 InternalIP is on (0: A, `192.168.0.0/24`; 1: B).
    fn segment4(self, i: u32) -> u8 {
        u8::from(self == Fabric::Mixed && i == 2)
    }

    /// Node `i`'s IPv4 InternalIP.
    fn addr4(self, i: u32) -> Ipv4Addr {
        Ipv4Addr::new(192, 168, self.segment4(i), i as u8)
    }

    /// The facts the agent of node `i` is expected to find once its probes are answered: IPv6
    /// on at its uplink, the peers on its IPv4 segment answering.
    fn expected_facts(self, i: u32) -> UnderlayFacts {
        let peers: std::collections::BTreeSet<String> = NODES
            .iter()
            .filter(|&&j| j != i && self.v4(j) && self.segment4(j) == self.segment4(i))
            .map(|&j| node_label(j))
            .collect();
        UnderlayFacts {
            uplink_ipv6: self.ipv6_on(i) && self.v4(i),
            on_link: peers.clone(),
            answering: if self.ipv6_on(i) {
                peers.clone()
            } else {
                Default::default()
            },
            answered: if self.ipv6_on(i) {
                peers
            } else {
                Default::default()
            },
            uplink_mtu: Some(1500),
        }
    }
}

fn underlay(i: u32) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, i as u16)
}

/// Node `i`'s IPv4 InternalIP (fabric `192.168.0.0/24`).
fn underlay4(i: u32) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 0, i as u8)
}

/// The address node `i` encapsulates from over IPv4 when it has no IPv6: its locator's own.
fn locator_address(i: u32) -> Ipv6Addr {
    locator(i).network()
}

fn locator(i: u32) -> Ipv6Net {
    Ipv6Net::new(
        Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, i as u16, 0, 0),
        96,
    )
    .unwrap()
}

fn sid(i: u32, function: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, i as u16, function, 0)
}

fn host_if(p: &PodSpec) -> String {
    format!("lp-{}", p.label.trim_start_matches('p'))
}

/// The cluster: the example Networks, allocated by hand, with `tenant-a` optional, nodes
/// addressed as `fabric` says.
fn cluster(with_tenant: bool, fabric: Fabric) -> ClusterState {
    let mut s = ClusterState::default();
    for (name, second, function) in NETS {
        if name == "tenant-a" && !with_tenant {
            continue;
        }
        add_dual_stack_network(&mut s, name, second, function);
    }
    s.networks.insert(
        "internet".into(),
        NetworkSpec {
            subnets: vec![],
            external: true,
            host_access: false,
        },
    );
    let mut routes = vec![
        ("system-self", "system", "system"),
        ("default-internet", "default", "internet"),
    ];
    if with_tenant {
        routes.push(("tenant-self", "tenant-a", "tenant-a"));
        routes.push(("tenant-system", "tenant-a", "system"));
    }
    for (name, from, to) in routes {
        s.network_routes.insert(
            name.into(),
            NetworkRoutingPolicySpec {
                from: from.into(),
                to: to.into(),
            },
        );
    }
    for i in NODES {
        let ul = Underlay {
            ipv4: fabric.v4(i).then(|| fabric.addr4(i)),
            ipv6: fabric.v6(i).then(|| underlay(i)),
        };
        s.nodes.insert(
            node_label(i),
            Node {
                labels: BTreeMap::new(),
                internal_ips: ul
                    .ipv4
                    .map(IpAddr::V4)
                    .into_iter()
                    .chain(ul.ipv6.map(IpAddr::V6))
                    .collect(),
            },
        );
        s.node_allocations.insert(
            node_label(i),
            NodeAllocationSpec {
                // Index i + 1 holds block i of every subnet: 10.<octet>.<i>.0/24 and
                // fd00:<octet>:0:<i>::/64 (add_dual_stack_network's subnets).
                index: i + 1,
                locator: locator(i),
                underlay: ul,
            },
        );
    }
    s
}

fn attachments(node: u32, with_tenant: bool) -> Vec<PodAttachment> {
    PODS.iter()
        .filter(|p| p.node == node && (with_tenant || p.network != "tenant-a"))
        .map(|p| PodAttachment {
            pod: ObjectKey::new("test", p.label),
            container_id: format!("c-{}", p.label),
            host_ifname: host_if(p),
            network: p.network.into(),
            ips: vec![
                IpNet::V4(Ipv4Net::from(p.addr)),
                IpNet::V6(Ipv6Net::from(p.addr6)),
            ],
            host_ports: Vec::new(),
            bandwidth: None,
        })
        .collect()
}

fn plans(with_tenant: bool, fabric: Fabric) -> Vec<DesiredNode> {
    let state = cluster(with_tenant, fabric);
    NODES
        .iter()
        .map(|&i| plan(&node_label(i), &state, &attachments(i, with_tenant)).unwrap())
        .collect()
}

/// The plans of every node with `facts` (per node, in [`NODES`] order).
fn plans_with(with_tenant: bool, fabric: Fabric, facts: &[UnderlayFacts]) -> Vec<DesiredNode> {
    let state = cluster(with_tenant, fabric);
    NODES
        .iter()
        .zip(facts)
        .map(|(&i, f)| plan_with(&node_label(i), &state, f, &attachments(i, with_tenant)).unwrap())
        .collect()
}

/// The agent's probe loop for every node, one round at a time: probe (the real probes of
/// `Reconciler::probe_underlay`), update the node's [`Tracker`], and when some node's facts
/// changed (or in the first round) plan with the facts and apply; until the facts are `want`
/// (panics after `rounds` rounds). Returns the last plans.
fn probe_and_apply(
    recs: &[Reconciler],
    fabric: Fabric,
    trackers: &mut [Tracker],
    facts: &mut [UnderlayFacts],
    rounds: usize,
    want: impl Fn(&[UnderlayFacts]) -> bool,
) -> Vec<DesiredNode> {
    let state = cluster(true, fabric);
    let mut plans = plans_with(true, fabric, facts);
    for round in 0..rounds {
        let mut changed = round == 0;
        for (k, &i) in NODES.iter().enumerate() {
            let q = paths::query(&node_label(i), &state);
            let found = recs[k]
                .probe_underlay(q)
                .unwrap_or_else(|e| panic!("node{i}: probing: {e}"));
            let new = trackers[k].update(&found);
            changed |= new != facts[k];
            facts[k] = new;
        }
        if changed {
            plans = plans_with(true, fabric, facts);
            apply_all(recs, &plans);
        }
        if want(facts) {
            return plans;
        }
    }
    panic!("the probes did not find what the test expects after {rounds} rounds: {facts:#?}");
}

/// Each node's facts as `fabric` is expected to give them once every probe is answered.
fn as_expected(fabric: Fabric) -> impl Fn(&[UnderlayFacts]) -> bool {
    move |facts| {
        NODES
            .iter()
            .zip(facts)
            .all(|(&i, f)| *f == fabric.expected_facts(i))
    }
}

struct World {
    topo: Topology,
}

impl World {
    fn ns(&self, label: &str) -> &Netns {
        self.topo.ns(label).unwrap()
    }

    fn node(&self, i: u32) -> &Netns {
        self.ns(&node_label(i))
    }

    fn build(fabric: Fabric) -> World {
        let mut topo = Topology::new();
        for l in ["fabric", "internet", "rogue", "router"] {
            topo.add(l).unwrap();
        }
        for i in NODES {
            topo.add(&node_label(i)).unwrap();
        }
        for p in &PODS {
            topo.add(p.label).unwrap();
        }
        let w = World { topo };
        let kind = fabric;
        let fabric = w.ns("fabric");
        for br in ["br0", "br1"] {
            fabric.ip(&format!("link add {br} type bridge")).unwrap();
            fabric.ip(&format!("link set {br} up")).unwrap();
        }
        let mut on_fabric: Vec<(String, u16)> =
            NODES.iter().map(|&i| (node_label(i), i as u16)).collect();
        on_fabric.push(("rogue".into(), ROGUE));
        for (label, host) in &on_fabric {
            let port = format!("fab-{label}");
            w.topo.link((label, "eth0"), ("fabric", &port)).unwrap();
            let ns = w.ns(label);
            // The rogue host has what the nodes have (both in the mixed fabric).
            let i = if *host == ROGUE { 2 } else { u32::from(*host) };
            let segment = if *host == ROGUE { 0 } else { kind.segment4(i) };
            fabric
                .ip(&format!("link set {port} master br{segment}"))
                .unwrap();
            if kind == Fabric::LinkLocal {
                // Like a NIC: the stack cuts GSO packets to the MTU before the link, so the
                // capture sees what a wire would carry.
                ns.exec("ethtool", &["-K", "eth0", "tso", "off"]).unwrap();
            }
            if kind == Fabric::LinkLocal && *host == 3 {
                // Stable-privacy link-locals (a random secret), as NetworkManager hosts have:
                // regenerated on the next up.
                ns.sysctl("net.ipv6.conf.eth0.addr_gen_mode", "3").unwrap();
                ns.ip("link set eth0 down").unwrap();
                ns.ip("link set eth0 up").unwrap();
            }
            if kind.v6(i) && !(kind == Fabric::Mixed && i == 1) {
                ns.ip(&format!(
                    "-6 addr add 2001:db8:ff::{host:x}/64 dev eth0 nodad"
                ))
                .unwrap();
            } else if !kind.ipv6_on(i) {
                // A fabric link that carries no IPv6 at all, on both of its ends.
                ns.sysctl("net.ipv6.conf.eth0.disable_ipv6", "1").unwrap();
                fabric
                    .sysctl(&format!("net.ipv6.conf.{port}.disable_ipv6"), "1")
                    .unwrap();
            }
            if kind.v4(i) {
                let a = if *host == ROGUE {
                    Ipv4Addr::new(192, 168, 0, ROGUE as u8)
                } else {
                    kind.addr4(i)
                };
                ns.ip(&format!("addr add {a}/24 dev eth0")).unwrap();
            }
        }
        if kind == Fabric::Mixed {
            // Node 1's second link, on segment B: its IPv6 InternalIP.
            w.topo
                .link(("node1", "eth1"), ("fabric", "fab-node1-b"))
                .unwrap();
            fabric.ip("link set fab-node1-b master br1").unwrap();
            w.node(1)
                .ip(&format!("-6 addr add {}/64 dev eth1 nodad", underlay(1)))
                .unwrap();
            // The router between the segments (IPv4).
            let r = w.ns("router");
            for (leg, br, addr) in [
                ("rtr-a", "br0", "192.168.0.254"),
                ("rtr-b", "br1", "192.168.1.254"),
            ] {
                let port = format!("fab-rtr-{leg}");
                w.topo.link(("router", leg), ("fabric", &port)).unwrap();
                fabric.ip(&format!("link set {port} master {br}")).unwrap();
                r.ip(&format!("addr add {addr}/24 dev {leg}")).unwrap();
            }
            r.sysctl("net.ipv4.ip_forward", "1").unwrap();
            for (i, via) in [(1, "192.168.0.254"), (3, "192.168.0.254")] {
                w.node(i)
                    .ip(&format!("route add 192.168.1.0/24 via {via}"))
                    .unwrap();
            }
            w.node(2)
                .ip("route add 192.168.0.0/24 via 192.168.1.254")
                .unwrap();
        }
        if kind == Fabric::Ipv4 {
            fabric
                .sysctl("net.ipv6.conf.br0.disable_ipv6", "1")
                .unwrap();
        }
        for i in NODES {
            let n = w.node(i);
            // Host routing the plan resolves `Host` next hops against: node 1 has the
            // internet behind it, the others a device default towards the fabric.
            if i == 1 {
                w.topo
                    .link(("node1", "inet0"), ("internet", "eth0"))
                    .unwrap();
                n.ip(&format!("addr add {NODE1_INET_V4}/24 dev inet0"))
                    .unwrap();
                n.ip("route add default via 198.51.100.2 dev inet0")
                    .unwrap();
                n.ip(&format!("-6 addr add {NODE1_INET_V6}/64 dev inet0 nodad"))
                    .unwrap();
                n.ip("-6 route add default via 2001:db8:ee::2 dev inet0")
                    .unwrap();
            } else {
                n.ip("route add default dev eth0").unwrap();
                if kind.v6(i) {
                    n.ip("-6 route add default dev eth0").unwrap();
                } else {
                    // The node's IPv6 way out is not the fabric (which has none).
                    n.ip("link add egress6 up type dummy").unwrap();
                    n.ip("-6 route add default dev egress6").unwrap();
                }
            }
            // An observer that is not Lace's: counts SRv6 packets (IPv6 + routing header)
            // and SRv6 in fou (UDP to Lace's port) arriving from the fabric.
            n.exec_stdin("nft", &["-f", "-"], &format!("table inet observe {{\n counter srv6 {{}}\n counter fou {{}}\n chain pre {{\n  type filter hook prerouting priority -300; policy accept;\n  iifname \"eth0\" ip6 nexthdr 43 counter name \"srv6\"\n  iifname \"eth0\" meta nfproto ipv4 udp dport {FOU_PORT} counter name \"fou\"\n }}\n}}\n"))
                .unwrap();
        }
        let inet = w.ns("internet");
        inet.ip("addr add 198.51.100.2/24 dev eth0").unwrap();
        inet.ip(&format!("addr add {INTERNET_V4}/32 dev lo"))
            .unwrap();
        inet.ip("-6 addr add 2001:db8:ee::2/64 dev eth0 nodad")
            .unwrap();
        inet.ip(&format!("-6 addr add {INTERNET_V6}/128 dev lo"))
            .unwrap();
        // The pods' MTU as the agent computes it from the plan's paths (fabric MTU 1500).
        let state = cluster(true, kind);
        for p in &PODS {
            let (node, pod) = (w.node(p.node), w.ns(p.label));
            attach_pod(node, &host_if(p), pod, p.addr).unwrap();
            add_pod_v6(node, &host_if(p), pod, p.addr6).unwrap();
            let mtu = pod_mtu(&state, kind, p.node);
            node.ip(&format!("link set {} mtu {mtu}", host_if(p)))
                .unwrap();
            pod.ip(&format!("link set eth0 mtu {mtu}")).unwrap();
        }
        w
    }

    /// One ICMP echo from pod `from` to `to`, answered within `wait`. ping is started from a
    /// thread inside the pod's namespace (one exec instead of `ip netns exec`'s two).
    fn ping(&self, from: &str, to: IpAddr, wait: Duration) -> bool {
        let (to, wait) = (to.to_string(), wait.as_secs().to_string());
        self.ns(from)
            .enter(|| {
                Command::new("ping")
                    .args(["-c", "1", "-W", &wait, &to])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
            })
            .unwrap()
            .unwrap_or_else(|e| panic!("ping: {e}"))
            .success()
    }

    /// Starts a TCP server on every pod's addresses (both families) and on the internet's.
    fn servers(&self) -> Vec<PeerEcho> {
        let mut all: Vec<PeerEcho> = PODS
            .iter()
            .flat_map(|p| {
                FAMILIES
                    .map(|f| PeerEcho::start(self.ns(p.label), (p.ip(f), TCP_PORT).into(), PATIENT))
            })
            .collect();
        let inet = self.ns("internet");
        all.push(PeerEcho::start(
            inet,
            (IpAddr::V4(INTERNET_V4), TCP_PORT).into(),
            PATIENT,
        ));
        all.push(PeerEcho::start(
            inet,
            (IpAddr::V6(INTERNET_V6), TCP_PORT).into(),
            PATIENT,
        ));
        all
    }

    /// Node `i`'s and pod `pod`'s neighbours, addresses, routes and Lace's nft counters, for
    /// failure messages.
    fn diagnose(&self, i: u32, pod: &str) -> String {
        let mut out = String::new();
        let n = self.node(i);
        for (ns, args) in [
            (n, "-6 neigh show"),
            (n, "-6 addr show"),
            (n, "-6 route show table all"),
            (self.ns(pod), "-6 neigh show"),
            (self.ns(pod), "-6 addr show"),
            (self.ns(pod), "-6 route show"),
        ] {
            let got = ns.ip(args).unwrap_or_else(|e| e.to_string());
            out.push_str(&format!("--- ip -n {} {args}\n{got}\n", ns.name()));
        }
        let nft = n
            .exec("nft", &["list", "table", "inet", "lace"])
            .unwrap_or_else(|e| e.to_string());
        out.push_str(&format!("--- nft list table inet lace (node{i})\n{nft}"));
        out
    }

    /// SRv6 packets node `i` received natively over IPv6 from the fabric (the foreign
    /// observer's counter).
    fn srv6_in(&self, i: u32) -> u64 {
        self.observed(i, "srv6")
    }

    /// SRv6-in-fou packets node `i` received over IPv4 from the fabric.
    fn fou_in(&self, i: u32) -> u64 {
        self.observed(i, "fou")
    }

    fn observed(&self, i: u32, counter: &str) -> u64 {
        let out = self
            .node(i)
            .exec("nft", &["list", "counter", "inet", "observe", counter])
            .unwrap();
        number_after(&out, "packets").unwrap()
    }

    /// Packets node `i`'s guard dropped after `lu-ipv4` decapsulated them (not from a node):
    /// the counted drop of the chain `prerouting` sends what `lu-ipv4` decapsulated to.
    fn guard_v4_drops(&self, i: u32) -> u64 {
        counted_drops(self.node(i), "ipv4_tunnel_guard")
    }

    /// Packets node `i`'s guard dropped on their way to a local SID (not from a node).
    fn guard_drops(&self, i: u32) -> u64 {
        counted_drops(self.node(i), "sid_guard")
    }
}

/// The pod MTU of node `i` in `state`, from the paths its plan is expected to use once its
/// probes are answered (the agent's function), on a fabric of MTU 1500.
fn pod_mtu(state: &ClusterState, fabric: Fabric, i: u32) -> u32 {
    let p = plan_with(&node_label(i), state, &fabric.expected_facts(i), &[]).unwrap();
    underlay::pod_mtu(
        &p.base.underlay,
        p.base.expected_paths().iter(),
        Some(1500),
        Some(1500),
    )
}

fn reconcilers(w: &World) -> Vec<Reconciler> {
    NODES
        .iter()
        .map(|&i| Reconciler::new(NetnsTarget::Path(w.node(i).path())).unwrap())
        .collect()
}

fn apply_all(recs: &[Reconciler], plans: &[DesiredNode]) -> u64 {
    recs.iter()
        .zip(plans)
        .map(|(r, p)| {
            let rep = r
                .reconcile(p)
                .unwrap_or_else(|e| panic!("reconcile {}: {e}", p.node));
            assert!(
                rep.skipped.is_empty(),
                "{}: skipped {:?}",
                p.node,
                rep.skipped
            );
            if rep.writes > 0 {
                eprintln!("{}: {} writes: {:#?}", p.node, rep.writes, rep.sample);
            }
            rep.writes
        })
        .sum()
}

/// Whether pod `from` may open connections to pod `to`, by the policies.
fn allowed(from: &PodSpec, to: &PodSpec) -> bool {
    matches!(
        (from.network, to.network),
        ("system", "system") | ("tenant-a", "tenant-a") | ("tenant-a", "system")
    )
}

/// One connectivity check from pod `from` to `to`: an ICMP echo (and its reply) or a TCP
/// exchange (handshake, request, response), and what the policies expect of it.
struct Check {
    from: &'static str,
    to: IpAddr,
    what: String,
    tcp: bool,
    allowed: bool,
    /// The source address the TCP server must report (the pod's own: no NAT between pods;
    /// node 1's for masquerade).
    seen: IpAddr,
}

impl Check {
    /// Both checks (ICMP and TCP) from `from` to `to`.
    fn both(
        from: &'static PodSpec,
        to: IpAddr,
        what: String,
        allowed: bool,
        seen: IpAddr,
    ) -> [Check; 2] {
        [false, true].map(|tcp| Check {
            from: from.label,
            to,
            what: what.clone(),
            tcp,
            allowed,
            seen,
        })
    }

    /// How long the check waits for an answer.
    fn patience(&self) -> Duration {
        if self.allowed {
            PATIENT
        } else {
            TIMEOUT
        }
    }

    /// Runs the check; a description of how the outcome differs from the policy, if it does.
    fn run(&self, w: &World) -> Option<String> {
        let (what, want) = (&self.what, self.allowed);
        if !self.tcp {
            let icmp = w.ping(self.from, self.to, self.patience());
            return (icmp != want).then(|| format!("{what}: policy {want}, ICMP {icmp}"));
        }
        match (want, tcp(w, self.from, self.to, self.patience())) {
            (true, Ok(seen)) if seen != self.seen => Some(format!(
                "{what}: TCP server saw {seen}, not {} (NAT between pods, or no masquerade)",
                self.seen
            )),
            (true, Err(e)) => Some(format!("{what}: policy true, TCP failed: {e}")),
            (false, Ok(_)) => Some(format!("{what}: policy false, TCP connected")),
            _ => None,
        }
    }
}

/// Checks at once: a denied check waits for its timeout, so they overlap; each spawns at most
/// one process (ping), which bounds the load of a round under emulation.
const CHECKS_AT_ONCE: usize = 24;

/// Runs `checks` on a pool of [`CHECKS_AT_ONCE`] threads; returns every outcome that differs
/// from the policy. [`World::servers`] must be running for the TCP checks.
fn run_checks(w: &World, checks: &[Check]) -> Vec<String> {
    let next = AtomicUsize::new(0);
    let wrong = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..CHECKS_AT_ONCE.min(checks.len()) {
            s.spawn(|| {
                while let Some(c) = checks.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Some(e) = c.run(w) {
                        wrong.lock().unwrap().push(e);
                    }
                }
            });
        }
    });
    let mut wrong = wrong.into_inner().unwrap();
    wrong.sort();
    wrong
}

/// Checks every ordered pair of `pods` in `families`, with ICMP and TCP; returns every check
/// whose outcome differs from the policy. [`World::servers`] must be running.
fn matrix(w: &World, pods: &[&'static PodSpec], families: &[Family]) -> Vec<String> {
    let mut checks = Vec::new();
    for a in pods {
        for b in pods.iter().filter(|b| b.label != a.label) {
            for &f in families {
                let what = format!("{} -> {} ({f:?})", a.label, b.label);
                checks.extend(Check::both(a, b.ip(f), what, allowed(a, b), a.ip(f)));
            }
        }
    }
    run_checks(w, &checks)
}

/// The matrix of all pods, one family at a time; after each, node 2's counter `arrived` must
/// have grown: cross-node traffic to it took the path (`what`) the test expects.
fn matrix_each_family(w: &World, arrived: fn(&World, u32) -> u64, what: &str) {
    let all: Vec<&'static PodSpec> = PODS.iter().collect();
    for f in FAMILIES {
        let before = arrived(w, 2);
        let wrong = matrix(w, &all, &[f]);
        assert!(
            wrong.is_empty(),
            "{f:?} matrix differs from policy:\n{}\n{}",
            wrong.join("\n"),
            w.diagnose(1, "p1-system")
        );
        assert!(
            arrived(w, 2) > before,
            "cross-node {f:?} traffic to node 2 must arrive as {what}"
        );
    }
}

/// Opens a TCP connection from pod `from` to the [`PeerEcho`] at `to` (port [`TCP_PORT`]):
/// the address the server saw (so both directions carried data), or the error.
fn tcp(w: &World, from: &str, to: IpAddr, timeout: Duration) -> Result<IpAddr, String> {
    echo::ask(w.ns(from), (to, TCP_PORT).into(), timeout)
}

fn pod_by(label: &str) -> &'static PodSpec {
    PODS.iter().find(|p| p.label == label).unwrap()
}

/// Runs `f` while `ip monitor` and `nft monitor` watch namespace `ns`; returns their output.
fn monitored(ns: &Netns, f: impl FnOnce()) -> String {
    let spawn = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", ns.name()])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let children = [
        spawn(&["ip", "monitor", "link", "route", "rule", "address"]),
        spawn(&["nft", "monitor"]),
    ];
    std::thread::sleep(Duration::from_millis(800));
    f();
    std::thread::sleep(Duration::from_millis(800));
    let mut out = String::new();
    for mut child in children {
        child.kill().unwrap();
        let o = child.wait_with_output().unwrap();
        out.push_str(&String::from_utf8_lossy(&o.stdout));
    }
    out
}

#[test]
fn dataplane_three_nodes_policies_srv6_teardown_restart() {
    require_root_and_vrf();
    let w = World::build(Fabric::Ipv6);
    let n1 = w.node(1);

    // Foreign state on node 1 that Lace must never touch.
    n1.ip("link add keep0 type dummy").unwrap();
    n1.ip("route add blackhole 192.0.2.0/24 proto static")
        .unwrap();
    n1.ip("route add blackhole 192.0.2.0/24 table 1000002 proto static")
        .unwrap();
    n1.ip("rule add pref 500 from 192.0.2.1 lookup 100")
        .unwrap();

    // Before Lace: no pod reaches another.
    for f in FAMILIES {
        assert!(!w.ping("p1-system", pod_by("p2-system").ip(f), TIMEOUT));
    }

    let recs = reconcilers(&w);
    let first = apply_all(&recs, &plans(true, Fabric::Ipv6));
    assert!(first > 0);
    let servers = w.servers();

    // The routes to remote blocks, as this kernel dumps them, are each read in one pass to
    // what the general read makes of them: the one-pass read follows the kernel's layout.
    let (remote_blocks, in_one_pass) = recs[0].remote_block_routes_read().unwrap();
    assert!(
        remote_blocks > 0,
        "node 1 routes to the other nodes' blocks"
    );
    assert_eq!(
        in_one_pass, remote_blocks,
        "remote blocks' routes read in one pass, of those the general read found"
    );

    // --- The connectivity matrix: same node and across nodes, per family. ----------------
    matrix_each_family(&w, World::srv6_in, "SRv6");

    // `default` egresses to the internet, masqueraded behind node 1, in both families; the
    // other Networks have no way out.
    let mut egress = Vec::new();
    for (internet, node1) in [
        (IpAddr::V4(INTERNET_V4), IpAddr::V4(NODE1_INET_V4)),
        (IpAddr::V6(INTERNET_V6), IpAddr::V6(NODE1_INET_V6)),
    ] {
        for from in ["p1-default", "p1-system", "p1-tenant"] {
            let what = format!("{from} -> internet {internet}");
            let p = pod_by(from);
            egress.extend(Check::both(p, internet, what, from == "p1-default", node1));
        }
    }
    let wrong = run_checks(&w, &egress);
    assert!(
        wrong.is_empty(),
        "egress differs from policy:\n{}",
        wrong.join("\n")
    );

    // A hand-crafted SRv6 packet to node 1's `system` SID from a non-node is dropped.
    let rogue = w.ns("rogue");
    rogue.ip("addr add 10.9.9.9/32 dev lo").unwrap();
    rogue
        .ip(&format!(
            "-6 route add {} via {} dev eth0",
            locator(1),
            underlay(1)
        ))
        .unwrap();
    rogue
        .ip(&format!(
            "route add {}/32 encap seg6 mode encap segs {} dev eth0",
            pod_by("p1-system").addr,
            sid(1, 2)
        ))
        .unwrap();
    let drops = w.guard_drops(1);
    assert!(rogue
        .exec(
            "ping",
            &[
                "-c",
                "1",
                "-W",
                "2",
                "-I",
                "10.9.9.9",
                &pod_by("p1-system").addr.to_string()
            ]
        )
        .is_err());
    assert!(
        w.guard_drops(1) > drops,
        "the ingress guard must count the rogue packet"
    );

    // A pod cannot send its own SRv6 packet into another Network: p1-tenant encapsulates a
    // ping to a `system` pod towards `system`'s SID on node 2 and on its own node, with its own
    // address as the outer source and with node 1's underlay address (spoofed). Node 1 drops
    // each (the policy in the VRF's prerouting pass, before any route lookup, or the guard of
    // its own SIDs): the locators' rule routes SIDs from VRFs, it does not open them to pods.
    let tenant = w.ns("p1-tenant");
    let lace_drops = || counted_drops(n1, "from_pods") + w.guard_drops(1);
    for (target, node) in [("p2-system", 2), ("p1-system", 1)] {
        for spoof in [None, Some(underlay(1))] {
            let to = pod_by(target);
            tenant
                .ip(&format!(
                    "route replace {}/32 encap seg6 mode encap segs {} dev eth0",
                    to.addr,
                    sid(node, 2)
                ))
                .unwrap();
            let src = spoof.map_or("::".to_string(), |a| a.to_string());
            tenant.ip(&format!("sr tunsrc set {src}")).unwrap();
            let before = lace_drops();
            assert!(
                !w.ping("p1-tenant", IpAddr::V4(to.addr), TIMEOUT),
                "p1-tenant reached {target} through node {node}'s system SID (outer source {src})"
            );
            assert!(
                lace_drops() > before,
                "node 1 must drop p1-tenant's SRv6 packet to {target} (outer source {src}) \
                 in from_pods or sid_guard"
            );
            tenant.ip(&format!("route del {}/32", to.addr)).unwrap();
        }
    }
    tenant.ip("sr tunsrc set ::").unwrap();

    // --- Re-applying the same plan writes nothing. --------------------------------------
    let same = plans(true, Fabric::Ipv6);
    let events = monitored(n1, || assert_eq!(apply_all(&recs, &same), 0));
    assert!(
        events.trim().is_empty(),
        "re-apply changed the kernel:\n{events}"
    );

    // --- A Network's routes to the blocks it reaches follow its pods on the node: none in
    // node 1's `system` table while it has no `system` pod, all back with the first pod's ADD
    // (its attach alone, no reconcile), so that pod reaches the other nodes' pods at once.
    let planner = Planner::new(&node_label(1), &cluster(true, Fabric::Ipv6)).unwrap();
    let (system, others): (Vec<_>, Vec<_>) = attachments(1, true)
        .into_iter()
        .partition(|a| a.network == "system");
    recs[0].reconcile(&planner.plan(&others).unwrap()).unwrap();
    let encaps = |table: u32| {
        ["-4", "-6"]
            .iter()
            .map(|fam| n1.ip(&format!("{fam} route show table {table}")).unwrap())
            .map(|routes| routes.matches("encap seg6").count())
            .sum::<usize>()
    };
    let (t_system, t_tenant) = (1_000_002, 1_000_003);
    assert_eq!(encaps(t_system), 0, "no system pod on node 1");
    assert!(encaps(t_tenant) > 0, "p1-tenant is still there");
    for f in FAMILIES {
        assert!(!w.ping("p1-system", pod_by("p2-system").ip(f), TIMEOUT));
    }
    for a in &system {
        recs[0]
            .attach(planner.plan(std::slice::from_ref(a)).unwrap())
            .unwrap();
    }
    // Each of node 2's and 3's blocks of system and tenant-a, in both families.
    assert_eq!(
        encaps(t_system),
        8,
        "{}",
        shown(&w, 1, "route show table all")
    );
    for f in FAMILIES {
        for to in ["p2-system", "p3-system"] {
            assert!(
                w.ping("p1-system", pod_by(to).ip(f), PATIENT),
                "p1-system -> {to} ({f:?}) right after its ADD"
            );
        }
    }
    assert_eq!(apply_all(&recs, &same), 0, "the reconcile after the ADDs");

    // --- Removing tenant-a removes its state; the rest keeps working. -------------------
    apply_all(&recs, &plans(false, Fabric::Ipv6));
    for i in NODES {
        let n = w.node(i);
        let links = n.ip("-d link show").unwrap();
        assert!(
            !links.contains("lv-tenant-a"),
            "node{i} still has lv-tenant-a"
        );
        let routes = n
            .ip(&format!("-6 route show table all proto {ROUTE_PROTOCOL}"))
            .unwrap();
        assert!(
            !routes.contains(&sid(i, 3).to_string()),
            "node{i} still has tenant-a's SID: {routes}"
        );
        for fam in ["-4", "-6"] {
            let left = n.ip(&format!("{fam} route show table 1000003")).unwrap();
            assert!(
                !left.contains(&format!("proto {ROUTE_PROTOCOL}")) && !left.contains("encap"),
                "node{i}: tenant-a's table still holds Lace routes: {left}"
            );
        }
        let nft = n.exec("nft", &["list", "table", "inet", "lace"]).unwrap();
        assert!(
            !nft.contains("tenant-a"),
            "node{i} nft still mentions tenant-a"
        );
    }
    let rest: Vec<&'static PodSpec> = PODS.iter().filter(|p| p.network != "tenant-a").collect();
    let wrong = matrix(&w, &rest[..], &FAMILIES);
    assert!(
        wrong.is_empty(),
        "after removing tenant-a:\n{}",
        wrong.join("\n")
    );

    // --- A restarted reconciler (no memory) converges with zero writes, zero loss. -------
    drop(recs);
    let pings: Vec<_> = FAMILIES
        .iter()
        .map(|&f| {
            Command::new("ip")
                .args(["netns", "exec", w.ns("p1-system").name()])
                .args(["ping", "-c", "15", "-i", "0.2", "-W", "2"])
                .arg(pod_by("p2-system").ip(f).to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let recs = reconcilers(&w);
    assert_eq!(
        apply_all(&recs, &plans(false, Fabric::Ipv6)),
        0,
        "restart must not write"
    );
    for ping in pings {
        let out = ping.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(" 0% packet loss"),
            "pings lost during restart: {text}"
        );
    }

    // --- A fresh reconciler reads its plan's and its VRFs' tables; a resync every table. --
    // One Lace route by hand in a table of the plan, one in a table nothing names (no VRF,
    // no rule looks it up): the first is deleted by the restart, the second by the resync.
    let plan = plans(false, Fabric::Ipv6).swap_remove(0);
    let planned = plan.base.vrfs.values().next().unwrap().table;
    let unnamed = lace::plan::VRF_TABLE_BASE + 900;
    assert!(!plan.tables().contains(&unnamed));
    for table in [planned, unnamed] {
        n1.ip(&format!(
            "route add 198.51.100.0/24 dev lo table {table} proto {ROUTE_PROTOCOL}"
        ))
        .unwrap();
    }
    let held = |table: u32| {
        n1.ip(&format!("route show table {table} 198.51.100.0/24"))
            .unwrap()
            .contains("198.51.100.0/24")
    };
    drop(recs);
    let recs = reconcilers(&w);
    let restart = recs[0].reconcile(&plan).unwrap();
    assert!(restart.full_dump);
    assert_eq!(restart.writes, 1, "{:?}", restart.sample);
    assert!(
        !held(planned),
        "the plan's table keeps a route Lace does not plan"
    );
    assert!(held(unnamed), "a restart read a table nothing names");
    // A snapshot (CNI CHECK and DEL, the uplink's MTU) takes the memory as that dump left it.
    let snapshot = recs[0].snapshot().unwrap();
    assert!(snapshot.routes.keys().any(|k| k.table == planned));
    assert!(
        !snapshot.routes.keys().any(|k| k.table == unnamed),
        "a snapshot dumped every table again"
    );
    let resync = recs[0]
        .reconcile_with(move || Some(plan), true)
        .unwrap()
        .unwrap();
    assert_eq!(resync.writes, 1, "{:?}", resync.sample);
    assert!(
        !held(unnamed),
        "a resync left a Lace route in a table nothing names"
    );

    // --- teardown_all on node 1: Lace's state goes, the host's stays. -------------------
    recs[0].teardown_all().unwrap();
    let links = n1.ip("link show").unwrap();
    assert!(!links.contains("lv-"), "VRFs left: {links}");
    assert!(links.contains("keep0"));
    for fam in ["-4", "-6"] {
        let ours = n1
            .ip(&format!(
                "{fam} route show table all proto {ROUTE_PROTOCOL}"
            ))
            .unwrap();
        assert!(ours.trim().is_empty(), "routes left: {ours}");
    }
    assert!(n1
        .ip("route show proto static")
        .unwrap()
        .contains("192.0.2.0/24"));
    assert!(n1
        .ip("route show table 1000002")
        .unwrap()
        .contains("192.0.2.0/24"));
    let rules = n1.ip("rule show").unwrap();
    assert!(rules.contains("500:"), "foreign rule gone: {rules}");
    assert!(!rules.contains("990:"), "probe rule left: {rules}");
    let tables = n1.exec("nft", &["list", "tables"]).unwrap();
    assert!(!tables.contains("inet lace"), "{tables}");
    assert!(tables.contains("inet observe"), "{tables}");
    // Node 1 without Lace: its pods are cut off again; a second teardown writes nothing.
    for f in FAMILIES {
        assert!(!w.ping("p1-system", pod_by("p2-system").ip(f), TIMEOUT));
    }
    drop(servers);
    assert_eq!(recs[0].teardown_all().unwrap().writes, 0);
}

/// Captures on node 2's `eth0` while pod p1-system sends DF pings of exactly the pod MTU
/// (both families) and 1 MiB over TCP in each family to p2-system; returns the capture (and
/// the directory holding it, removed when dropped).
fn capture_at_pod_mtu(w: &World, mtu: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let (a, b) = (pod_by("p1-system"), pod_by("p2-system"));
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("node2-eth0.pcap");
    capture(w.node(2), &pcap, || {
        for (addr, payload) in [
            (b.ip(Family::V4), mtu - 20 - 8),
            (b.ip(Family::V6), mtu - 40 - 8),
        ] {
            let size = payload.to_string();
            let args = [
                "-c",
                "3",
                "-W",
                "3",
                "-M",
                "do",
                "-s",
                &size,
                &addr.to_string(),
            ];
            w.ns(a.label)
                .exec("ping", &args)
                .unwrap_or_else(|e| panic!("DF ping of {mtu} bytes to {addr}: {e}"));
        }
        bulk(w, a.label, b.label, b.ip(Family::V4), 1 << 20);
        bulk(w, a.label, b.label, b.ip(Family::V6), 1 << 20);
    });
    (dir, pcap)
}

/// Captures on `ns`'s `eth0` (headers only) while `f` runs, into `pcap`.
fn capture(ns: &Netns, pcap: &std::path::Path, f: impl FnOnce()) {
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns.name(),
            "tcpdump",
            "-i",
            "eth0",
            "-nn",
            "-U",
            "-s",
            "200",
        ])
        .arg("-w")
        .arg(pcap)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (Debian package tcpdump)");
    // tcpdump says so once it captures.
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("listening on"), "tcpdump: {line}");
    f();
    std::thread::sleep(Duration::from_millis(500));
    // `ip netns exec` execs tcpdump: the child is tcpdump, which flushes on SIGTERM.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    child.wait().unwrap();
}

/// How many packets of `pcap` match the tcpdump `filter`.
fn count(pcap: &std::path::Path, filter: &str) -> usize {
    let out = Command::new("tcpdump")
        .arg("-r")
        .arg(pcap)
        .args(["-nn", filter])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tcpdump -r {} {filter}",
        pcap.display()
    );
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// The first packets of `pcap` matching `filter`, verbosely (for failure messages).
fn sample(pcap: &std::path::Path, filter: &str) -> String {
    let out = Command::new("tcpdump")
        .arg("-r")
        .arg(pcap)
        .args(["-nn", "-v", "-c", "6", filter])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Sends `bytes` over TCP from pod `from` to a sink in pod `to` at `addr` (port 7200); panics
/// unless all of it arrived.
fn bulk(w: &World, from: &str, to: &str, addr: IpAddr, bytes: usize) {
    let bind: SocketAddr = (addr, 7200).into();
    let listener = w.ns(to).enter(|| TcpListener::bind(bind)).unwrap().unwrap();
    let sink = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut conn, &mut got).unwrap();
        got.len()
    });
    let mut client = w
        .ns(from)
        .enter(|| TcpStream::connect_timeout(&bind, TIMEOUT))
        .unwrap()
        .unwrap_or_else(|e| panic!("{from} -> {bind}: {e}"));
    client.write_all(&vec![0x5a; bytes]).unwrap();
    drop(client);
    assert_eq!(sink.join().unwrap(), bytes, "{from} -> {bind}");
}

/// Node `i`'s `ip` output for `args`.
fn shown(w: &World, i: u32, args: &str) -> String {
    w.node(i).ip(args).unwrap()
}

#[test]
fn dataplane_ipv4_fabric_srv6_in_fou_matrix_capture_guard_restart() {
    require_root_and_vrf();
    let w = World::build(Fabric::Ipv4);
    let recs = reconcilers(&w);
    assert!(apply_all(&recs, &plans(true, Fabric::Ipv4)) > 0);
    let servers = w.servers();

    // What an operator sees: the device, its fou port, the routes through it.
    for i in NODES {
        let link = shown(&w, i, &format!("-d link show {IPV4_TUNNEL}"));
        for want in [
            "mtu 1472".to_string(),
            format!("sit ip6ip remote any local {}", underlay4(i)),
            format!("encap fou encap-sport auto encap-dport {FOU_PORT}"),
        ] {
            assert!(link.contains(&want), "node{i}: no {want:?} in {link}");
        }
        let fou = w.node(i).exec("ip", &["fou", "show"]).unwrap();
        assert!(
            fou.contains(&format!("port {FOU_PORT} ipproto 41")),
            "node{i}: {fou}"
        );
        let routes = shown(&w, i, "-6 route show");
        for j in NODES.iter().filter(|&&j| j != i) {
            let want = format!("{} via ::{} dev {IPV4_TUNNEL}", locator(*j), underlay4(*j));
            assert!(routes.contains(&want), "node{i}: no {want:?} in {routes}");
        }
        // No IPv6 InternalIP: the node encapsulates from its locator's address, which its
        // device holds.
        let tunsrc = w.node(i).exec("ip", &["sr", "tunsrc", "show"]).unwrap();
        assert!(tunsrc.contains(&locator_address(i).to_string()), "{tunsrc}");
        assert!(shown(&w, i, &format!("-6 addr show dev {IPV4_TUNNEL}"))
            .contains(&format!("{}/128", locator_address(i))));
    }

    // The matrix in both families; cross-node traffic arrives as SRv6 in fou, never natively.
    matrix_each_family(&w, World::fou_in, "SRv6 in fou");
    assert_eq!(w.srv6_in(2), 0, "native IPv6 on a fabric without IPv6");

    // Capture on node 2: pod packets of exactly the pod MTU arrive as IPv4 + UDP to Lace's
    // port + IPv6 with a routing header (SRH), 1500 bytes on the wire, DF set, no fragment;
    // no pod address ever appears outside the tunnel.
    let mtu = pod_mtu(&cluster(true, Fabric::Ipv4), Fabric::Ipv4, 1);
    assert_eq!(mtu, 1500 - 64 - 28);
    let (_dir, pcap) = capture_at_pod_mtu(&w, mtu);
    let srv6_in_fou = format!(
        "ip dst {} and ip src {} and udp dst port {FOU_PORT} and udp[8] & 0xf0 == 0x60 and udp[14] == 43",
        underlay4(2),
        underlay4(1)
    );
    // Flags and offset: DF set, MF clear, offset 0.
    let full = format!("{srv6_in_fou} and ip[2:2] == 1500 and ip[6:2] == 0x4000");
    let (all_in, full_size) = (count(&pcap, &srv6_in_fou), count(&pcap, &full));
    assert!(
        full_size >= 6,
        "only {full_size} full-size SRv6-in-fou packets of {all_in}; the largest:\n{}",
        sample(&pcap, &format!("{srv6_in_fou} and greater 1400"))
    );
    assert!(all_in > 500, "{all_in} SRv6-in-fou packets for 2 MiB");
    assert_eq!(
        count(&pcap, "ip[6:2] & 0x3fff != 0"),
        0,
        "IPv4 fragments on the fabric"
    );
    assert_eq!(
        count(&pcap, "ip[2:2] > 1500"),
        0,
        "packets above the fabric MTU"
    );
    assert_eq!(
        count(&pcap, "net 10.0.0.0/8 or ip6"),
        0,
        "pod traffic outside the tunnel"
    );

    // A host outside the cluster encapsulates towards node 1's system SID over IPv4, from a
    // source the IPv6 check would accept (node 2's tunnel source), in fou and plain 6in4:
    // nothing gets into a VRF, the guard counts it.
    let target = pod_by("p1-system").addr.to_string();
    let rogue = w.ns("rogue");
    rogue.ip("addr add 10.9.9.9/32 dev lo").unwrap();
    let rogue_v4 = format!("192.168.0.{ROGUE}");
    // A sit device of its own, in fou to Lace's port or plain 6in4 (`encap` none).
    let encapsulate = |ns: &Netns, local: &str, encap: &str| {
        let _ = ns.ip("link del t0");
        let encap = match encap {
            "fou" => format!("encap fou encap-sport auto encap-dport {FOU_PORT}"),
            _ => String::new(),
        };
        ns.ip(&format!(
            "link add t0 type sit remote any local {local} {encap}"
        ))
        .unwrap();
        ns.ip("link set t0 up").unwrap();
        ns.exec(
            "ip",
            &["sr", "tunsrc", "set", &locator_address(2).to_string()],
        )
        .unwrap();
        ns.ip(&format!(
            "-6 route add {} via ::{} dev t0",
            locator(1),
            underlay4(1)
        ))
        .unwrap();
        ns.ip(&format!(
            "route add {target}/32 encap seg6 mode encap segs {} dev t0",
            sid(1, 2)
        ))
        .unwrap();
    };
    // Sent, and nothing came back (not a local error before sending).
    let knock = |ns: &Netns, src: &str| match ns
        .exec("ping", &["-c", "2", "-W", "2", "-I", src, &target])
    {
        Ok(_) => false,
        Err(e) => {
            assert!(
                e.to_string().contains("2 packets transmitted, 0 received"),
                "{e}"
            );
            true
        }
    };
    for encap in ["fou", "none"] {
        encapsulate(rogue, &rogue_v4, encap);
        let before = w.guard_v4_drops(1);
        assert!(knock(rogue, "10.9.9.9"), "rogue ({encap}) reached {target}");
        assert!(
            w.guard_v4_drops(1) >= before + 2,
            "the guard must count the rogue's SRv6 over IPv4 ({encap})"
        );
    }
    // The internet host, beyond node 1 (not on the fabric), spoofs node 2's InternalIP. The
    // host's own reverse-path filter is off, so only Lace's guard stands in the way.
    let inet = w.ns("internet");
    inet.ip(&format!("addr add {}/32 dev lo", underlay4(2)))
        .unwrap();
    inet.ip(&format!(
        "route add {}/32 via 198.51.100.1 dev eth0",
        underlay4(1)
    ))
    .unwrap();
    encapsulate(inet, &underlay4(2).to_string(), "fou");
    w.node(1)
        .sysctl("net.ipv4.conf.inet0.rp_filter", "0")
        .unwrap();
    let before = w.guard_v4_drops(1);
    assert!(
        knock(inet, &INTERNET_V4.to_string()),
        "spoofed node 2 reached {target}"
    );
    assert!(
        w.guard_v4_drops(1) >= before + 2,
        "the guard must count SRv6 over IPv4 from a node's address on the wrong link"
    );
    // The real nodes still get through.
    assert!(w.ping("p2-system", pod_by("p1-system").ip(Family::V4), PATIENT));

    // Re-applying writes nothing; a restarted reconciler (no memory) neither.
    let same = plans(true, Fabric::Ipv4);
    let events = monitored(w.node(1), || assert_eq!(apply_all(&recs, &same), 0));
    assert!(
        events.trim().is_empty(),
        "re-apply changed the kernel:\n{events}"
    );
    drop(recs);
    let recs = reconcilers(&w);
    assert_eq!(apply_all(&recs, &same), 0, "restart must not write");

    // Teardown takes the device and the fou port; the rogue's stays in its namespace.
    recs[0].teardown_all().unwrap();
    assert!(!shown(&w, 1, "link show").contains(IPV4_TUNNEL));
    let fou = w.node(1).exec("ip", &["fou", "show"]).unwrap();
    assert!(fou.trim().is_empty(), "fou port left: {fou}");
    drop(servers);
    assert_eq!(recs[0].teardown_all().unwrap().writes, 0);
}

#[test]
fn dataplane_mixed_underlay_global_ipv6_link_local_and_routed_fou() {
    require_root_and_vrf();
    let kind = Fabric::Mixed;
    let w = World::build(kind);
    let recs = reconcilers(&w);
    let mut trackers = vec![Tracker::default(); NODES.len()];
    let mut facts = vec![UnderlayFacts::default(); NODES.len()];
    let plans = probe_and_apply(&recs, kind, &mut trackers, &mut facts, 6, as_expected(kind));
    let _servers = w.servers();

    // Each pair's path, as each node planned it and routes it.
    let ll = |i: u32| link_local_address(kind.addr4(i));
    for (k, &i) in NODES.iter().enumerate() {
        assert_eq!(facts[k], kind.expected_facts(i), "node{i}'s probes");
    }
    let kinds = |k: usize| -> Vec<(String, &'static str)> {
        plans[k]
            .base
            .peers
            .iter()
            .map(|(n, p)| (n.clone(), p.kind()))
            .collect()
    };
    fn want(pairs: [(&str, &'static str); 2]) -> Vec<(String, &'static str)> {
        pairs.map(|(n, k)| (n.to_string(), k)).to_vec()
    }
    assert_eq!(kinds(0), want([("node2", "ipv6"), ("node3", "link-local")]));
    assert_eq!(kinds(1), want([("node1", "ipv6"), ("node3", "fou")]));
    assert_eq!(kinds(2), want([("node1", "link-local"), ("node2", "fou")]));
    for (i, needles) in [
        (
            1,
            vec![
                format!("{} via {} dev eth1", locator(2), underlay(2)),
                format!("{} via {} dev eth0", locator(3), ll(3)),
            ],
        ),
        (
            2,
            vec![
                format!("{} via {} dev eth0", locator(1), underlay(1)),
                format!("{} via ::{} dev {IPV4_TUNNEL}", locator(3), kind.addr4(3)),
            ],
        ),
        (
            3,
            vec![
                format!("{} via {} dev eth0", locator(1), ll(1)),
                format!("{} via ::{} dev {IPV4_TUNNEL}", locator(2), kind.addr4(2)),
            ],
        ),
    ] {
        let routes = shown(&w, i, "-6 route show");
        for n in needles {
            assert!(routes.contains(&n), "node{i}: no {n:?} in\n{routes}");
        }
    }
    // Node 1 needs no fou device (no peer on fou); node 3 encapsulates from its locator's
    // address, node 1 from its IPv6 InternalIP on every path.
    assert!(!shown(&w, 1, "link show").contains(IPV4_TUNNEL));
    let tunsrc3 = w.node(3).exec("ip", &["sr", "tunsrc", "show"]).unwrap();
    assert!(
        tunsrc3.contains(&locator_address(3).to_string()),
        "{tunsrc3}"
    );
    let tunsrc1 = w.node(1).exec("ip", &["sr", "tunsrc", "show"]).unwrap();
    assert!(tunsrc1.contains(&underlay(1).to_string()), "{tunsrc1}");

    let all: Vec<&PodSpec> = PODS.iter().collect();
    let wrong = matrix(&w, &all, &FAMILIES);
    assert!(
        wrong.is_empty(),
        "mixed matrix differs from policy:\n{}\n{}",
        wrong.join("\n"),
        w.diagnose(3, "p3-system")
    );

    // Which path each pair took, as the receiving node saw it arrive: 1 -> 2 natively
    // (global IPv6), 3 -> 2 in fou (through the router), 1 -> 3 natively (link-local).
    for (from, to, native, fou) in [
        ("p1-system", 2, true, false),
        ("p3-system", 2, false, true),
        ("p1-system", 3, true, false),
    ] {
        let to_pod = if to == 2 { "p2-system" } else { "p3-system" };
        for f in FAMILIES {
            let (n0, f0) = (w.srv6_in(to), w.fou_in(to));
            assert!(
                w.ping(from, pod_by(to_pod).ip(f), PATIENT),
                "{from} -> {to_pod} ({f:?})"
            );
            assert_eq!(
                w.srv6_in(to) > n0,
                native,
                "{from} -> node{to} ({f:?}): native SRv6"
            );
            assert_eq!(
                w.fou_in(to) > f0,
                fou,
                "{from} -> node{to} ({f:?}): SRv6 in fou"
            );
        }
    }
    // Every pod fits the smallest path of its node: node 1 has no fou pair (1436), nodes 2
    // and 3 have one (1408); a DF ping of exactly the pod MTU goes through on each path.
    let state = cluster(true, kind);
    for (i, mtu) in [(1, 1436), (2, 1408), (3, 1408)] {
        assert_eq!(pod_mtu(&state, kind, i), mtu, "node{i}");
    }
    // A packet's path MTU is the smaller of its two pods' (the receiving veth has the
    // receiving pod's): 1408 across each pair here.
    for (from, to) in [
        ("p1-system", "p2-system"),
        ("p1-system", "p3-system"),
        ("p3-system", "p2-system"),
        ("p3-system", "p1-system"),
    ] {
        let big = (1408 - 28).to_string();
        w.ns(from)
            .exec(
                "ping",
                &[
                    "-c",
                    "1",
                    "-W",
                    "3",
                    "-M",
                    "do",
                    "-s",
                    &big,
                    &pod_by(to).addr.to_string(),
                ],
            )
            .unwrap_or_else(|e| panic!("{from} -> {to}: DF ping at the path MTU 1408: {e}"));
    }
    assert_eq!(apply_all(&recs, &plans), 0, "re-apply must not write");
}

#[test]
fn dataplane_link_local_fabric_matrix_capture_guard_fallback() {
    require_root_and_vrf();
    let kind = Fabric::LinkLocal;
    let w = World::build(kind);
    let recs = reconcilers(&w);
    let mut trackers = vec![Tracker::default(); NODES.len()];
    let mut facts = vec![UnderlayFacts::default(); NODES.len()];
    let plans = probe_and_apply(&recs, kind, &mut trackers, &mut facts, 6, as_expected(kind));
    let servers = w.servers();

    // Every pair over link-local, on the kernel's link-locals of any kind: node 3's own is
    // stable-privacy (no EUI-64 `ff:fe` in it), Lace's derived one sits beside it.
    let eth0_3 = shown(&w, 3, "-6 addr show dev eth0");
    let kernel_ll: Vec<&str> = eth0_3
        .lines()
        .filter(|l| l.contains("inet6 fe80::") && !l.contains("fe80::4c61:6365:"))
        .collect();
    assert!(
        !kernel_ll.is_empty() && kernel_ll.iter().all(|l| !l.contains("ff:fe")),
        "node3's link-local is not stable-privacy:\n{eth0_3}"
    );
    for (k, &i) in NODES.iter().enumerate() {
        assert_eq!(facts[k], kind.expected_facts(i), "node{i}'s probes");
        assert!(
            shown(&w, i, "-6 addr show dev eth0")
                .contains(&format!("{}/64", link_local_address(underlay4(i)))),
            "node{i} holds its link-local underlay address"
        );
        assert!(
            !shown(&w, i, "link show").contains(IPV4_TUNNEL),
            "node{i}: no fou device"
        );
        let routes = shown(&w, i, "-6 route show");
        for j in NODES.iter().filter(|&&j| j != i) {
            assert_eq!(plans[k].base.peers[&node_label(*j)].kind(), "link-local");
            let want = format!(
                "{} via {} dev eth0",
                locator(*j),
                link_local_address(underlay4(*j))
            );
            assert!(routes.contains(&want), "node{i}: no {want:?} in\n{routes}");
        }
    }

    // The matrix in both families; cross-node traffic arrives natively as SRv6.
    matrix_each_family(&w, World::srv6_in, "SRv6 over link-local");
    assert_eq!(w.fou_in(2), 0, "fou on a segment where link-local works");

    // Capture on node 2: pod packets of exactly the pod MTU (1500 - 64) arrive as IPv6 + SRH
    // of 1500 bytes, from node 1's tunnel source to node 2's locator; no IPv4 between the
    // nodes, no fragment, nothing above the fabric MTU, no pod address outside the tunnel.
    let mtu = pod_mtu(&cluster(true, kind), kind, 1);
    assert_eq!(mtu, 1500 - 64);
    let (_dir, pcap) = capture_at_pod_mtu(&w, mtu);
    let srv6 = format!(
        "ip6 src {} and ip6 dst net {} and ip6[6] == 43",
        locator_address(1),
        locator(2)
    );
    let full = format!("{srv6} and ip6[4:2] == 1460");
    let (all_in, full_size) = (count(&pcap, &srv6), count(&pcap, &full));
    assert!(
        full_size >= 6,
        "only {full_size} full-size SRv6 packets of {all_in}; the largest:\n{}",
        sample(&pcap, &format!("{srv6} and greater 1400"))
    );
    assert!(all_in > 500, "{all_in} SRv6 packets for 2 MiB");
    assert_eq!(
        count(&pcap, "ip"),
        0,
        "IPv4 between the nodes:\n{}",
        sample(&pcap, "ip")
    );
    assert_eq!(
        count(&pcap, "ip6[6] == 44"),
        0,
        "IPv6 fragments on the fabric"
    );
    assert_eq!(
        count(&pcap, "greater 1515"),
        0,
        "frames above the fabric MTU"
    );
    assert_eq!(
        count(&pcap, "net 10.0.0.0/8 or net fd00::/8"),
        0,
        "pod traffic outside the tunnel"
    );

    // A rogue host on the same bridge, IPv6 on like the nodes', routes node 1's locator via
    // node 1's link-local underlay address and encapsulates towards its system SID from an
    // address of its own: nothing gets into the VRF, the guard counts it.
    let target = pod_by("p1-system").addr.to_string();
    let rogue = w.ns("rogue");
    rogue.ip("addr add 10.9.9.9/32 dev lo").unwrap();
    rogue.ip("-6 addr add 2001:db8:99::99/128 dev lo").unwrap();
    rogue
        .exec("ip", &["sr", "tunsrc", "set", "2001:db8:99::99"])
        .unwrap();
    rogue
        .ip(&format!(
            "-6 route add {} via {} dev eth0",
            locator(1),
            link_local_address(underlay4(1))
        ))
        .unwrap();
    rogue
        .ip(&format!(
            "route add {target}/32 encap seg6 mode encap segs {} dev eth0",
            sid(1, 2)
        ))
        .unwrap();
    let before = w.guard_drops(1);
    match rogue.exec("ping", &["-c", "2", "-W", "2", "-I", "10.9.9.9", &target]) {
        Ok(out) => panic!("the rogue reached {target} over link-local: {out}"),
        Err(e) => assert!(
            e.to_string().contains("2 packets transmitted, 0 received"),
            "{e}"
        ),
    }
    assert!(
        w.guard_drops(1) >= before + 2,
        "the guard must count the rogue's SRv6 over link-local"
    );

    // Re-applying writes nothing.
    let events = monitored(w.node(1), || assert_eq!(apply_all(&recs, &plans), 0));
    assert!(
        events.trim().is_empty(),
        "re-apply changed the kernel:\n{events}"
    );

    // IPv6 switched off on node 2's uplink: its pairs fall back to fou (node 2 at once, its
    // peers after their probes go unanswered), the pair 1-3 stays on link-local, and traffic
    // keeps flowing, bulk TCP too: the pods keep MTU 1436, the MSS clamp fits their segments
    // to fou's 1408.
    w.node(2)
        .sysctl("net.ipv6.conf.eth0.disable_ipv6", "1")
        .unwrap();
    let plans = probe_and_apply(
        &recs,
        kind,
        &mut trackers,
        &mut facts,
        MISSES as usize + 3,
        |f| {
            !f[1].uplink_ipv6
                && !f[0].answering.contains("node2")
                && !f[2].answering.contains("node2")
        },
    );
    assert!(!facts[1].uplink_ipv6);
    for (k, i) in [(0, 1), (2, 3)] {
        assert_eq!(
            plans[k].base.peers["node2"].kind(),
            "fou",
            "node{i} -> node2"
        );
        let routes = shown(&w, i, "-6 route show");
        let want = format!("{} via ::{} dev {IPV4_TUNNEL}", locator(2), underlay4(2));
        assert!(routes.contains(&want), "node{i}: no {want:?} in\n{routes}");
    }
    assert_eq!(plans[0].base.peers["node3"].kind(), "link-local");
    assert!(plans[1].base.peers.values().all(|p| p.kind() == "fou"));
    let f0 = w.fou_in(2);
    let pair: Vec<&PodSpec> = ["p1-system", "p2-system", "p3-system"].map(pod_by).to_vec();
    let wrong = matrix(&w, &pair, &FAMILIES);
    assert!(
        wrong.is_empty(),
        "after the fallback:\n{}",
        wrong.join("\n")
    );
    assert!(w.fou_in(2) > f0, "traffic to node 2 must arrive in fou now");
    let (a, b) = (pod_by("p1-system"), pod_by("p2-system"));
    bulk(&w, a.label, b.label, b.ip(Family::V4), 1 << 20);
    bulk(&w, b.label, a.label, a.ip(Family::V6), 1 << 20);

    // IPv6 back on: the pairs return to link-local.
    w.node(2)
        .sysctl("net.ipv6.conf.eth0.disable_ipv6", "0")
        .unwrap();
    let plans = probe_and_apply(&recs, kind, &mut trackers, &mut facts, 6, as_expected(kind));
    for p in &plans {
        assert!(
            p.base.peers.values().all(|p| p.kind() == "link-local"),
            "{}: {:?}",
            p.node,
            p.base.peers
        );
    }
    let n0 = w.srv6_in(2);
    assert!(w.ping("p1-system", b.ip(Family::V6), PATIENT));
    assert!(w.srv6_in(2) > n0);

    // Teardown takes Lace's link-local address and leaves the kernel's.
    drop(servers);
    recs[0].teardown_all().unwrap();
    let eth0 = shown(&w, 1, "-6 addr show dev eth0");
    assert!(!eth0.contains("fe80::4c61:6365:"), "{eth0}");
    assert!(
        eth0.contains("inet6 fe80::"),
        "the kernel's own link-local went too:\n{eth0}"
    );
}
