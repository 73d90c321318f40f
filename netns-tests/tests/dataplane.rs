//! The dataplane reconciler against a real kernel: three node namespaces on an IPv6 fabric
//! (one bridge), an "internet" namespace beyond node 1, a rogue host on the fabric, pods wired
//! as the CNI wires them. The plan comes from the real planner over a ClusterState built here;
//! only the reconciler programs the nodes. Everything is asserted with real ICMP and TCP.
//!
//! Networks: `system` reaches itself; `default` does not reach itself and egresses to the
//! external `internet`; `tenant-a` reaches itself and `system`. Every Network is dual-stack
//! (a /24 and a /64 per node), every pod has an IPv4 and an IPv6 address, and every cell of the
//! matrix is checked in both families, with ICMP and with TCP.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use lace::api::{NetworkRoutingPolicySpec, NetworkSpec, NodeAllocationSpec, Underlay};
use lace::dataplane::{NetnsTarget, Reconciler, ROUTE_PROTOCOL};
use lace::plan::{plan, DesiredNode};
use lace::state::{ClusterState, Node, ObjectKey, PodAttachment};
use lace_netns_tests::bed::number_after;
use lace_netns_tests::cluster::add_dual_stack_network;
use lace_netns_tests::pods::{add_pod_v6, attach_pod};
use lace_netns_tests::{require_root_and_vrf, Netns, Topology};

const NODES: [u32; 3] = [1, 2, 3];
/// (Network, second octet, SID function).
const NETS: [(&str, u8, u16); 3] = [("default", 1, 1), ("system", 2, 2), ("tenant-a", 3, 3)];
const TCP_PORT: u16 = 7100;
const TIMEOUT: Duration = Duration::from_secs(3);
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
        add_dual_stack_network(&mut s, name, second, function);
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
        s.node_allocations.insert(
            node_label(i),
            NodeAllocationSpec {
                // Index i + 1 holds block i of every subnet: 10.<octet>.<i>.0/24 and
                // fd00:<octet>:0:<i>::/64 (add_dual_stack_network's subnets).
                index: i + 1,
                locator: locator(i),
                underlay: Underlay {
                    ipv4: None,
                    ipv6: Some(underlay(i)),
                },
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
                n.ip("-6 route add default dev eth0").unwrap();
            }
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
        inet.ip(&format!("addr add {INTERNET_V4}/32 dev lo"))
            .unwrap();
        inet.ip("-6 addr add 2001:db8:ee::2/64 dev eth0 nodad")
            .unwrap();
        inet.ip(&format!("-6 addr add {INTERNET_V6}/128 dev lo"))
            .unwrap();
        for p in &PODS {
            let (node, pod) = (w.node(p.node), w.ns(p.label));
            attach_pod(node, &host_if(p), pod, p.addr).unwrap();
            add_pod_v6(node, &host_if(p), pod, p.addr6).unwrap();
        }
        w
    }

    fn ping(&self, from: &str, to: IpAddr) -> bool {
        self.ns(from)
            .exec("ping", &["-c", "1", "-W", "2", &to.to_string()])
            .is_ok()
    }

    /// Starts a TCP server on every pod's addresses (both families) and on the internet's.
    fn servers(&self) -> Vec<Server> {
        let mut all: Vec<Server> = PODS
            .iter()
            .flat_map(|p| FAMILIES.map(|f| Server::start(self.ns(p.label), p.ip(f))))
            .collect();
        let inet = self.ns("internet");
        all.push(Server::start(inet, IpAddr::V4(INTERNET_V4)));
        all.push(Server::start(inet, IpAddr::V6(INTERNET_V6)));
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

/// Checks every ordered pair of `pods` in `families`, with ICMP (echo and its reply) and
/// TCP (handshake, request and response), a few pairs at a time; returns every check whose
/// outcome differs from the policy. [`World::servers`] must be running.
fn matrix(w: &World, pods: &[&PodSpec], families: &[Family]) -> Vec<String> {
    let pairs: Vec<(&PodSpec, &PodSpec)> = pods
        .iter()
        .flat_map(|a| pods.iter().map(move |b| (*a, *b)))
        .filter(|(a, b)| a.label != b.label)
        .collect();
    let mut wrong = Vec::new();
    for chunk in pairs.chunks(14) {
        let results: Vec<Vec<String>> = std::thread::scope(|s| {
            let hs: Vec<_> = chunk
                .iter()
                .map(|(a, b)| {
                    s.spawn(move || {
                        let want = allowed(a, b);
                        let mut wrong = Vec::new();
                        for &f in families {
                            let pair = format!("{} -> {} ({f:?})", a.label, b.label);
                            let icmp = w.ping(a.label, b.ip(f));
                            if icmp != want {
                                wrong.push(format!("{pair}: policy {want}, ICMP {icmp}"));
                            }
                            match (want, tcp(w, a.label, b.ip(f))) {
                                (true, Ok(seen)) if seen != a.ip(f) => wrong.push(format!(
                                    "{pair}: TCP server saw {seen}, not the pod (NAT between pods)"
                                )),
                                (true, Err(e)) => {
                                    wrong.push(format!("{pair}: policy true, TCP failed: {e}"))
                                }
                                (false, Ok(_)) => {
                                    wrong.push(format!("{pair}: policy false, TCP connected"))
                                }
                                _ => {}
                            }
                        }
                        wrong
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        wrong.extend(results.into_iter().flatten());
    }
    wrong
}

/// A TCP server on one address in one namespace (port [`TCP_PORT`]): reads one line and
/// answers with the address it saw the client come from. Stops when dropped.
struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(ns: &Netns, addr: IpAddr) -> Server {
        let bind: SocketAddr = (addr, TCP_PORT).into();
        let listener = ns
            .enter(|| TcpListener::bind(bind))
            .unwrap()
            .unwrap_or_else(|e| panic!("bind {bind} in {}: {e}", ns.name()));
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, peer)) => {
                        // One thread per connection: a client that never sends must not stall
                        // the others.
                        std::thread::spawn(move || {
                            let _ = serve(conn, peer);
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => panic!("accept on {bind}: {e}"),
                }
            }
        });
        Server {
            stop,
            thread: Some(thread),
        }
    }
}

fn serve(conn: TcpStream, peer: SocketAddr) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(TIMEOUT))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    if line == "ping\n" {
        (&conn).write_all(format!("{}\n", peer.ip()).as_bytes())?;
    }
    Ok(())
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Opens a TCP connection from pod `from` to a [`Server`] at `to`, sends a request and reads
/// the answer: the address the server saw (so both directions carried data), or the error.
fn tcp(w: &World, from: &str, to: IpAddr) -> Result<IpAddr, String> {
    let server: SocketAddr = (to, TCP_PORT).into();
    let client = w
        .ns(from)
        .enter(|| TcpStream::connect_timeout(&server, TIMEOUT))
        .unwrap();
    let client = client.map_err(|e| format!("connect: {e}"))?;
    client.set_read_timeout(Some(TIMEOUT)).unwrap();
    (&client)
        .write_all(b"ping\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = String::new();
    BufReader::new(&client)
        .read_line(&mut answer)
        .map_err(|e| format!("receive: {e}"))?;
    answer
        .trim()
        .parse()
        .map_err(|e| format!("answer {answer:?}: {e}"))
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
    for f in FAMILIES {
        assert!(!w.ping("p1-system", pod_by("p2-system").ip(f)));
    }

    let recs = reconcilers(&w);
    let first = apply_all(&recs, &plans(true));
    assert!(first > 0);
    let servers = w.servers();

    // --- The connectivity matrix: same node and across nodes, per family. ----------------
    let all: Vec<&PodSpec> = PODS.iter().collect();
    for f in FAMILIES {
        let srv6_before = w.srv6_in(2);
        let wrong = matrix(&w, &all, &[f]);
        assert!(
            wrong.is_empty(),
            "{f:?} matrix differs from policy:\n{}\n{}",
            wrong.join("\n"),
            w.diagnose(1, "p1-system")
        );
        assert!(
            w.srv6_in(2) > srv6_before,
            "cross-node {f:?} traffic to node 2 must arrive as SRv6"
        );
    }

    // `default` egresses to the internet, masqueraded behind node 1, in both families; the
    // other Networks have no way out.
    for (internet, node1) in [
        (IpAddr::V4(INTERNET_V4), IpAddr::V4(NODE1_INET_V4)),
        (IpAddr::V6(INTERNET_V6), IpAddr::V6(NODE1_INET_V6)),
    ] {
        let from = "p1-default";
        assert!(w.ping(from, internet), "{from} -> {internet} (ICMP)");
        let seen =
            tcp(&w, from, internet).unwrap_or_else(|e| panic!("{from} -> {internet} (TCP): {e}"));
        assert_eq!(
            seen, node1,
            "{from} -> {internet}: not masqueraded behind node 1"
        );
        for from in ["p1-system", "p1-tenant"] {
            assert!(!w.ping(from, internet), "{from} reached {internet} (ICMP)");
            assert!(
                tcp(&w, from, internet).is_err(),
                "{from} reached {internet} (TCP)"
            );
        }
    }

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
    assert_eq!(apply_all(&recs, &plans(false)), 0, "restart must not write");
    for ping in pings {
        let out = ping.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(" 0% packet loss"),
            "pings lost during restart: {text}"
        );
    }

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
        assert!(!w.ping("p1-system", pod_by("p2-system").ip(f)));
    }
    drop(servers);
    assert_eq!(recs[0].teardown_all().unwrap().writes, 0);
}
