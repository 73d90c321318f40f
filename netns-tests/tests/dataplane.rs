//! The dataplane reconciler against a real kernel: three node namespaces on an IPv6 fabric
//! (one bridge), an "internet" namespace beyond node 1, a rogue host on the fabric, pods wired
//! as the CNI wires them. The plan comes from the real planner over a ClusterState built here;
//! only the reconciler programs the nodes. Everything is asserted with real ICMP and TCP.
//!
//! Networks: `system` reaches itself; `default` does not reach itself and egresses to the
//! external `internet`; `tenant-a` reaches itself and `system`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use lace::api::{
    NetworkAllocationSpec, NetworkRoutingPolicySpec, NetworkSpec, NodeAllocationSpec, Subnet,
};
use lace::dataplane::{NetnsTarget, Reconciler, ROUTE_PROTOCOL};
use lace::plan::{plan, DesiredNode};
use lace::state::{ClusterState, Node, ObjectKey, PodAttachment};
use lace_netns_tests::bed::number_after;
use lace_netns_tests::pods::attach_pod;
use lace_netns_tests::{require_root_and_vrf, Netns, Topology};

const NODES: [u32; 3] = [1, 2, 3];
/// (Network, second octet, SID function).
const NETS: [(&str, u8, u16); 3] = [("default", 1, 1), ("system", 2, 2), ("tenant-a", 3, 3)];
const TCP_PORT: u16 = 7100;
const TIMEOUT: Duration = Duration::from_secs(4);

/// A test pod: its namespace label, node, Network and address.
#[derive(Clone, Debug)]
struct PodSpec {
    label: &'static str,
    node: u32,
    network: &'static str,
    addr: Ipv4Addr,
}

fn octet(network: &str) -> u8 {
    NETS.iter().find(|n| n.0 == network).map(|n| n.1).unwrap()
}

const fn pod(label: &'static str, node: u32, network: &'static str, host: u8) -> PodSpec {
    let second = match network.as_bytes()[0] {
        b'd' => 1,
        b's' => 2,
        _ => 3,
    };
    PodSpec {
        label,
        node,
        network,
        addr: Ipv4Addr::new(10, second, node as u8, host),
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

fn underlay(i: u32) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, i as u16)
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

/// The cluster: the example Networks, allocated by hand, with `tenant-a` optional.
fn cluster(with_tenant: bool) -> ClusterState {
    let mut s = ClusterState::default();
    for (name, second, function) in NETS {
        if name == "tenant-a" && !with_tenant {
            continue;
        }
        s.networks.insert(
            name.into(),
            NetworkSpec {
                subnets: vec![Subnet {
                    cidr: format!("10.{second}.0.0/16").parse().unwrap(),
                    block_prefix: 24,
                }],
                external: false,
            },
        );
        s.network_allocations
            .insert(name.into(), NetworkAllocationSpec { function });
    }
    s.networks.insert(
        "internet".into(),
        NetworkSpec {
            subnets: vec![],
            external: true,
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
        s.nodes.insert(
            node_label(i),
            Node {
                labels: BTreeMap::new(),
                internal_ips: vec![IpAddr::V6(underlay(i))],
            },
        );
        let blocks = s
            .networks
            .iter()
            .filter(|(_, n)| !n.external)
            .map(|(name, _)| {
                let b: IpNet = Ipv4Net::new(Ipv4Addr::new(10, octet(name), i as u8, 0), 24)
                    .unwrap()
                    .into();
                (name.clone(), vec![b])
            })
            .collect();
        s.node_allocations.insert(
            node_label(i),
            NodeAllocationSpec {
                index: i,
                locator: locator(i),
                underlay: underlay(i),
                blocks,
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
            ips: vec![IpNet::V4(Ipv4Net::from(p.addr))],
        })
        .collect()
}

fn plans(with_tenant: bool) -> Vec<DesiredNode> {
    let state = cluster(with_tenant);
    NODES
        .iter()
        .map(|&i| plan(&node_label(i), &state, &attachments(i, with_tenant)).unwrap())
        .collect()
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

    fn build() -> World {
        let mut topo = Topology::new();
        for l in ["fabric", "internet", "rogue"] {
            topo.add(l).unwrap();
        }
        for i in NODES {
            topo.add(&node_label(i)).unwrap();
        }
        for p in &PODS {
            topo.add(p.label).unwrap();
        }
        let w = World { topo };
        let fabric = w.ns("fabric");
        fabric.ip("link add br0 type bridge").unwrap();
        fabric.ip("link set br0 up").unwrap();
        let mut on_fabric: Vec<(String, u16)> =
            NODES.iter().map(|&i| (node_label(i), i as u16)).collect();
        on_fabric.push(("rogue".into(), 0x99));
        for (label, host) in &on_fabric {
            let port = format!("fab-{label}");
            w.topo.link((label, "eth0"), ("fabric", &port)).unwrap();
            fabric.ip(&format!("link set {port} master br0")).unwrap();
            let ns = w.ns(label);
            ns.ip(&format!(
                "-6 addr add 2001:db8:ff::{host:x}/64 dev eth0 nodad"
            ))
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
                n.ip("addr add 198.51.100.1/24 dev inet0").unwrap();
                n.ip("route add default via 198.51.100.2 dev inet0")
                    .unwrap();
            } else {
                n.ip("route add default dev eth0").unwrap();
            }
            n.ip("-6 route add default dev eth0").unwrap();
            // An observer that is not Lace's: counts SRv6 packets (IPv6 + routing header)
            // arriving from the fabric.
            n.exec_stdin(
                "nft",
                &["-f", "-"],
                "table inet observe {\n chain pre {\n  type filter hook prerouting priority -300; policy accept;\n  iifname \"eth0\" ip6 nexthdr 43 counter\n }\n}\n",
            )
            .unwrap();
        }
        let inet = w.ns("internet");
        inet.ip("addr add 198.51.100.2/24 dev eth0").unwrap();
        inet.ip("addr add 203.0.113.1/32 dev lo").unwrap();
        for p in &PODS {
            attach_pod(w.node(p.node), &host_if(p), w.ns(p.label), p.addr).unwrap();
        }
        w
    }

    fn ping(&self, from: &str, to: IpAddr) -> bool {
        self.ns(from)
            .exec("ping", &["-c", "1", "-W", "2", &to.to_string()])
            .is_ok()
    }

    /// SRv6 packets node `i` received from the fabric (the foreign observer's counter).
    fn srv6_in(&self, i: u32) -> u64 {
        let out = self
            .node(i)
            .exec("nft", &["list", "chain", "inet", "observe", "pre"])
            .unwrap();
        number_after(&out, "packets").unwrap()
    }

    fn guard_drops(&self, i: u32) -> u64 {
        let out = self
            .node(i)
            .exec("nft", &["list", "chain", "inet", "lace", "prerouting"])
            .unwrap();
        let line = out
            .lines()
            .find(|l| l.contains("@local_sids"))
            .expect("ingress guard rule");
        number_after(line, "packets").unwrap()
    }
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

/// Pings every ordered pair of `pods` (a few at a time) and returns the pairs whose outcome
/// differs from the policy.
fn matrix(w: &World, pods: &[&PodSpec]) -> Vec<String> {
    let pairs: Vec<(&PodSpec, &PodSpec)> = pods
        .iter()
        .flat_map(|a| pods.iter().map(move |b| (*a, *b)))
        .filter(|(a, b)| a.label != b.label)
        .collect();
    let mut wrong = Vec::new();
    for chunk in pairs.chunks(8) {
        let results: Vec<(String, bool, bool)> = std::thread::scope(|s| {
            let hs: Vec<_> = chunk
                .iter()
                .map(|(a, b)| {
                    s.spawn(move || {
                        let got = w.ping(a.label, IpAddr::V4(b.addr));
                        (format!("{} -> {}", a.label, b.label), allowed(a, b), got)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (pair, want, got) in results {
            if want != got {
                wrong.push(format!("{pair}: policy {want}, ping {got}"));
            }
        }
    }
    wrong
}

/// Opens a TCP connection from pod `from` to a listener at `to_addr` in namespace `to_ns`;
/// returns the address the server saw, or the error.
fn tcp(w: &World, from: &str, to_ns: &str, to_addr: Ipv4Addr) -> Result<IpAddr, String> {
    let server: SocketAddr = (to_addr, TCP_PORT).into();
    let listener = w
        .ns(to_ns)
        .enter(|| TcpListener::bind(server))
        .unwrap()
        .unwrap();
    listener.set_nonblocking(true).unwrap();
    let client = w
        .ns(from)
        .enter(|| TcpStream::connect_timeout(&server, TIMEOUT))
        .unwrap();
    let mut client = client.map_err(|e| e.to_string())?;
    client.set_read_timeout(Some(TIMEOUT)).unwrap();
    // The client's handshake can complete before its last ACK reached the server.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let (mut conn, peer) = loop {
        match listener.accept() {
            Ok(c) => break c,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    };
    conn.set_nonblocking(false).unwrap();
    client.write_all(b"ping\n").map_err(|e| e.to_string())?;
    let mut buf = [0u8; 5];
    conn.read_exact(&mut buf)
        .map_err(|e| format!("server read: {e}"))?;
    conn.write_all(b"pong\n").map_err(|e| e.to_string())?;
    client
        .read_exact(&mut buf)
        .map_err(|e| format!("client read: {e}"))?;
    assert_eq!(&buf, b"pong\n");
    Ok(peer.ip())
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
    let w = World::build();
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
    assert!(!w.ping("p1-system", IpAddr::V4(pod_by("p2-system").addr)));

    let recs = reconcilers(&w);
    let first = apply_all(&recs, &plans(true));
    assert!(first > 0);

    // --- The connectivity matrix: same node and across nodes. ----------------------------
    let srv6_before = w.srv6_in(2);
    let all: Vec<&PodSpec> = PODS.iter().collect();
    let wrong = matrix(&w, &all);
    assert!(
        wrong.is_empty(),
        "matrix differs from policy:\n{}",
        wrong.join("\n")
    );
    assert!(
        w.srv6_in(2) > srv6_before,
        "cross-node traffic to node 2 must arrive as SRv6"
    );

    // TCP: allowed both ways of the conversation, disallowed new connections refused.
    let peer = tcp(&w, "p1-tenant", "p2-system", pod_by("p2-system").addr).unwrap();
    assert_eq!(
        peer,
        IpAddr::V4(pod_by("p1-tenant").addr),
        "no NAT between pods"
    );
    assert!(tcp(&w, "p2-system", "p1-tenant", pod_by("p1-tenant").addr).is_err());
    assert!(tcp(&w, "p1-system", "p3-system", pod_by("p3-system").addr).is_ok());
    assert!(tcp(&w, "p1-default", "p2-default", pod_by("p2-default").addr).is_err());

    // `default` egresses to the internet, masqueraded behind node 1.
    assert!(w.ping("p1-default", "203.0.113.1".parse().unwrap()));
    let seen = tcp(&w, "p1-default", "internet", "203.0.113.1".parse().unwrap()).unwrap();
    assert_eq!(seen, "198.51.100.1".parse::<IpAddr>().unwrap());
    assert!(!w.ping("p1-system", "203.0.113.1".parse().unwrap()));

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

    // --- Re-applying the same plan writes nothing. --------------------------------------
    let same = plans(true);
    let events = monitored(n1, || assert_eq!(apply_all(&recs, &same), 0));
    assert!(
        events.trim().is_empty(),
        "re-apply changed the kernel:\n{events}"
    );

    // --- Removing tenant-a removes its state; the rest keeps working. -------------------
    apply_all(&recs, &plans(false));
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
    let rest: Vec<&PodSpec> = PODS.iter().filter(|p| p.network != "tenant-a").collect();
    let wrong = matrix(&w, &rest[..]);
    assert!(
        wrong.is_empty(),
        "after removing tenant-a:\n{}",
        wrong.join("\n")
    );

    // --- A restarted reconciler (no memory) converges with zero writes, zero loss. -------
    drop(recs);
    let ping = Command::new("ip")
        .args([
            "netns",
            "exec",
            w.ns("p1-system").name(),
            "ping",
            "-c",
            "15",
            "-i",
            "0.2",
            "-W",
            "2",
        ])
        .arg(pod_by("p2-system").addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let recs = reconcilers(&w);
    assert_eq!(apply_all(&recs, &plans(false)), 0, "restart must not write");
    let out = ping.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(" 0% packet loss"),
        "pings lost during restart: {text}"
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
    assert!(!w.ping("p1-system", IpAddr::V4(pod_by("p2-system").addr)));
    assert_eq!(recs[0].teardown_all().unwrap().writes, 0);
}
