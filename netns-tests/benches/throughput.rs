//! Pod-to-pod throughput across two nodes, one TCP stream (Debian's `iperf3`), in network
//! namespaces (root; run by `netns-tests/bench.sh --throughput`, in the VM when the host kernel
//! lacks VRF). Prints one table; the ratios compare cases measured in the same run, runs
//! interleaved (case 1, 2, 3, 4, case 1, 2, ...) so drift of a shared machine hits all alike.
//!
//! Every case is its own world of the same shape: two node namespaces joined by one veth pair
//! (the fabric, MTU 1500, IPv6 and IPv4 addresses), one pod behind each node, wired the way the
//! CNI wires pods (`/32`, default via `169.254.1.1`). The fabric comes in two kinds, and every
//! case runs on each ([`Fabric`]):
//!
//! - `veth`: the veth pair as it comes (TSO on): what the sender's stack hands it, up to 64 kB
//!   GSO packets, crosses whole, never cut to the MTU on the way. The receiving veth does no
//!   GRO here (a veth merges only what its peer sent segmented, i.e. with the peer's TSO off),
//!   so a path that was segmented before the fabric arrives packet by packet;
//! - `nic`: like two NICs on a wire: TSO off on the fabric veths, so every packet crosses at
//!   most 1,500 bytes long (the kernel segments in software before the veth), and GRO on, so
//!   the receiver merges what it can, as a NIC's driver does.
//!
//! Only the way node A reaches node B's pod differs:
//!
//! - `native`: plain routes over the fabric, no encapsulation (pod MTU 1500);
//! - `srv6`: Lace's dataplane, programmed by the real reconciler from the real planner's plan
//!   (VRF, `seg6` encap towards the remote SID, `seg6local End.DT4/DT46` decap, nftables
//!   policy); pod MTU = 1500 minus Lace's SRv6 overhead (64), as the agent computes it;
//! - `srv6-ll`: the same with IPv4-only nodes whose fabric link keeps IPv6 on (link-local
//!   addresses only): SRv6 natively over IPv6 with link-local next hops, as the reconciler
//!   programs it once the nodes' probes answer (the real probes run); pod MTU 1500 - 64;
//! - `ll-nonft`: `srv6-ll` with Lace's nftables table deleted after programming (no
//!   policy, no guard, no conntrack): what Lace's ruleset costs on that path, by difference;
//! - `srv6-fou`: the same with IPv4-only nodes (IPv6 disabled on the fabric link): the SRv6
//!   packet rides in UDP over IPv4 through `lu-ipv4`, as the reconciler programs it; pod MTU
//!   1500 - 64 - 28;
//! - `srv6-sit`: that world with `lu-ipv4` switched by hand to plain 6in4 (`encap none`, device
//!   MTU 1480): what the protocol-41 form Lace does not use would give; pod MTU 1500 - 64 - 20;
//! - `ipip-fou`: no SRv6, the pod's IPv4 packet straight in UDP over IPv4 (an `ipip` device with
//!   `encap fou`, by hand): what a single-level IPv4 underlay would give; pod MTU 1500 - 28;
//! - `vxlan4`: a vxlan device per node over the fabric's IPv4 (pod MTU 1500 - 50);
//! - `vxlan6`: the same over the fabric's IPv6, the underlay SRv6 uses (pod MTU 1500 - 70).
//!
//! A run counts only if node B's observer (an nft table that is not Lace's) saw the stream
//! arrive the way the case says (SRv6 = IPv6 with a routing header, SRv6 in fou = UDP to
//! Lace's port, 6in4 = IP protocol 41, VXLAN = UDP 4789, native = bare TCP) and no fragment
//! at all: the MTUs are honest or the bench fails.
//!
//! The `B/pkt` column is the stream's bytes per packet as node B's observer saw them arrive
//! from the fabric: about the MTU where every packet crosses alone, tens of kB where the
//! stream stays segmentation-offloaded (GSO) end to end. It tells a path the kernel has to
//! handle packet by packet from one it handles 64 kB at a time.
//!
//! env: LACE_BENCH_SECONDS (default 5) per run, LACE_BENCH_REPEATS (default 3) runs per case,
//! LACE_BENCH_CASES (default all) a comma-separated list of case names to run,
//! LACE_BENCH_FABRICS (default `veth,nic`) the fabrics to run them on.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net};
use lace::agent::SRV6_OVERHEAD;
use lace::dataplane::{NetnsTarget, Reconciler};
use lace::plan::underlay::{UnderlayFacts, FOU_PORT, IPV4_FOU_OVERHEAD, IPV4_TUNNEL};
use lace::plan::{plan, plan_with};
use lace::state::{ClusterState, ObjectKey, PodAttachment};
use lace_netns_tests::bed::number_after;
use lace_netns_tests::cluster::{ipv4_cluster, over_ipv4, underlay, underlay4, TestNetwork};
use lace_netns_tests::pods::{attach_pod, POD_GATEWAY_V4};
use lace_netns_tests::{require_root_and_vrf, veth, Netns};
use serde_json::Value;

/// The fabric's MTU (the underlay MTU every case starts from).
const UNDERLAY_MTU: u32 = 1500;
const IPERF_PORT: &str = "5201";
/// The pods' host-side interface, as the CNI would name it.
const HOST_IF: &str = "lp-bench";

/// What the fabric between the nodes is like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fabric {
    /// A veth pair as it comes: GSO packets cross whole.
    Veth,
    /// NIC-like: TSO off (packets of at most 1,500 bytes on the wire), GRO on the receiver.
    Nic,
}

impl Fabric {
    const ALL: [Fabric; 2] = [Fabric::Veth, Fabric::Nic];

    fn name(self) -> &'static str {
        match self {
            Fabric::Veth => "veth",
            Fabric::Nic => "nic",
        }
    }
}

/// How node A reaches node B's pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    Native,
    Srv6,
    Srv6Ll,
    Srv6LlNoNft,
    Srv6Fou,
    Srv6Sit,
    IpipFou,
    Vxlan4,
    Vxlan6,
}

impl Case {
    const ALL: [Case; 9] = [
        Case::Native,
        Case::Srv6,
        Case::Srv6Ll,
        Case::Srv6LlNoNft,
        Case::Srv6Fou,
        Case::Srv6Sit,
        Case::IpipFou,
        Case::Vxlan4,
        Case::Vxlan6,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::Native => "native",
            Case::Srv6 => "srv6",
            Case::Srv6Ll => "srv6-ll",
            Case::Srv6LlNoNft => "ll-nonft",
            Case::Srv6Fou => "srv6-fou",
            Case::Srv6Sit => "srv6-sit",
            Case::IpipFou => "ipip-fou",
            Case::Vxlan4 => "vxlan4",
            Case::Vxlan6 => "vxlan6",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Case::Native => "routed, no encapsulation",
            Case::Srv6 => "Lace: VRF + seg6 encap over IPv6",
            Case::Srv6Ll => "Lace, IPv4 nodes: over IPv6 link-local",
            Case::Srv6LlNoNft => "srv6-ll without Lace's nft table",
            Case::Srv6Fou => "Lace over IPv4: + fou (UDP) in lu-ipv4",
            Case::Srv6Sit => "as srv6-fou, plain 6in4 (by hand)",
            Case::IpipFou => "IPv4 in fou, no SRv6 (by hand)",
            Case::Vxlan4 => "vxlan over the fabric's IPv4",
            Case::Vxlan6 => "vxlan over the fabric's IPv6",
        }
    }

    /// Whether the nodes reach each other over IPv4 only (IPv6 off on the fabric link).
    fn ipv4_only(self) -> bool {
        matches!(self, Case::Srv6Fou | Case::Srv6Sit)
    }

    /// The pods' MTU: the underlay MTU minus what the encapsulation adds.
    fn pod_mtu(self) -> u32 {
        UNDERLAY_MTU
            - match self {
                Case::Native => 0,
                Case::Srv6 | Case::Srv6Ll | Case::Srv6LlNoNft => SRV6_OVERHEAD,
                Case::Srv6Fou => SRV6_OVERHEAD + IPV4_FOU_OVERHEAD,
                // Outer IPv4 only, no UDP.
                Case::Srv6Sit => SRV6_OVERHEAD + 20,
                // Outer Ethernet 14 + IP + UDP 8 + VXLAN 8.
                // Outer IPv4 20 + UDP 8.
                Case::IpipFou => 28,
                Case::Vxlan4 => 14 + 20 + 8 + 8,
                Case::Vxlan6 => 14 + 40 + 8 + 8,
            }
    }

    /// The node-B observer counter the stream must show up in.
    fn counter(self) -> &'static str {
        match self {
            Case::Native => "plain_tcp",
            Case::Srv6 | Case::Srv6Ll | Case::Srv6LlNoNft => "srv6",
            Case::Srv6Fou => "fou",
            Case::Srv6Sit => "sit",
            Case::IpipFou => "ipip_fou",
            Case::Vxlan4 | Case::Vxlan6 => "vxlan",
        }
    }
}

/// Every observer counter but `fragments`.
const PATHS: [&str; 6] = ["srv6", "fou", "sit", "ipip_fou", "vxlan", "plain_tcp"];
/// The by-hand IPv4-in-UDP case's fou port (not Lace's).
const IPIP_FOU_PORT: u16 = 5555;

/// Node B's observer: how packets arrive from the fabric. Not Lace's table (Lace owns only
/// `inet lace`), so the reconciler leaves it alone.
fn observer() -> String {
    format!(
        r#"
table inet observe {{
  counter srv6 {{ }}
  counter fou {{ }}
  counter sit {{ }}
  counter ipip_fou {{ }}
  counter vxlan {{ }}
  counter plain_tcp {{ }}
  counter fragments {{ }}
  chain pre {{
    type filter hook prerouting priority -300; policy accept;
    iifname "eth0" ip6 nexthdr 43 counter name "srv6"
    iifname "eth0" meta nfproto ipv4 udp dport {FOU_PORT} counter name "fou"
    iifname "eth0" ip protocol ipv6 counter name "sit"
    iifname "eth0" udp dport {IPIP_FOU_PORT} counter name "ipip_fou"
    iifname "eth0" udp dport 4789 counter name "vxlan"
    iifname "eth0" ip protocol tcp counter name "plain_tcp"
    iifname "eth0" ip6 nexthdr 44 counter name "fragments"
    iifname "eth0" ip frag-off & 0x3fff != 0 counter name "fragments"
  }}
}}
"#
    )
}

fn underlay6(i: u8) -> Ipv6Addr {
    underlay(u16::from(i))
}

fn pod_addr(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, i, 10)
}

/// One case's world: node A and B, a pod behind each.
struct World {
    case: Case,
    fabric: Fabric,
    nodes: [Netns; 2],
    pods: [Netns; 2],
    /// Keeps the SRv6 case's reconcilers (and their namespace threads) alive while it runs.
    _reconcilers: Vec<Reconciler>,
    /// `iperf3 -s` in pod B for the world's lifetime (a one-off server, `-1`, sometimes
    /// never exits under TCG although its test completed).
    server: Child,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

impl World {
    fn build(case: Case, fabric: Fabric) -> World {
        // Labels are at most 16 characters: the fabric by its initial.
        let label =
            |what: &str, i: u8| format!("{}-{}-{what}{i}", &fabric.name()[..1], case.name());
        let nodes = [1, 2].map(|i| Netns::new(&label("node", i)).unwrap());
        let pods = [1, 2].map(|i| Netns::new(&label("pod", i)).unwrap());
        veth(&nodes[0], "eth0", &nodes[1], "eth0").unwrap();
        if fabric == Fabric::Nic {
            // Packets of at most the MTU on the wire (the stack segments before the veth) and
            // the receiver merging them again (a veth runs GRO only for a peer with TSO off).
            for n in &nodes {
                n.exec("ethtool", &["-K", "eth0", "tso", "off", "gro", "on"])
                    .unwrap();
            }
        }
        for (n, i) in nodes.iter().zip([1u8, 2]) {
            n.ip(&format!("link set eth0 mtu {UNDERLAY_MTU}")).unwrap();
            if case.ipv4_only() {
                n.sysctl("net.ipv6.conf.eth0.disable_ipv6", "1").unwrap();
            } else {
                n.ip(&format!("-6 addr add {}/64 dev eth0 nodad", underlay6(i)))
                    .unwrap();
            }
            n.ip(&format!("addr add {}/24 dev eth0", underlay4(u16::from(i))))
                .unwrap();
            n.sysctl("net.ipv4.ip_forward", "1").unwrap();
            n.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
        }
        nodes[1]
            .exec_stdin("nft", &["-f", "-"], &observer())
            .unwrap();
        for (i, (n, p)) in nodes.iter().zip(&pods).enumerate() {
            let idx = i as u8 + 1;
            attach_pod(n, HOST_IF, p, pod_addr(idx)).unwrap();
            let mtu = case.pod_mtu();
            n.ip(&format!("link set {HOST_IF} mtu {mtu}")).unwrap();
            p.ip(&format!("link set eth0 mtu {mtu}")).unwrap();
        }
        let mut reconcilers = Vec::new();
        match case {
            Case::Native => route_natively(&nodes, |peer| {
                format!("via {} dev eth0", underlay4(u16::from(peer)))
            }),
            Case::IpipFou => {
                for (n, (me, peer)) in nodes.iter().zip([(1u8, 2u8), (2, 1)]) {
                    n.ip(&format!("fou add port {IPIP_FOU_PORT} ipproto 4"))
                        .unwrap();
                    n.ip(&format!(
                        "link add lt-ipip type ipip local {} remote {} encap fou encap-sport auto encap-dport {IPIP_FOU_PORT}",
                        underlay4(u16::from(me)),
                        underlay4(u16::from(peer))
                    ))
                    .unwrap();
                    n.ip(&format!("link set lt-ipip mtu {}", case.pod_mtu()))
                        .unwrap();
                    n.ip("link set lt-ipip up").unwrap();
                }
                route_natively(&nodes, |_| "dev lt-ipip".into());
            }
            Case::Vxlan4 | Case::Vxlan6 => {
                for (n, (me, peer)) in nodes.iter().zip([(1u8, 2u8), (2, 1)]) {
                    let (local, remote) = if case == Case::Vxlan4 {
                        (
                            underlay4(u16::from(me)).to_string(),
                            underlay4(u16::from(peer)).to_string(),
                        )
                    } else {
                        (underlay6(me).to_string(), underlay6(peer).to_string())
                    };
                    n.ip(&format!(
                        "link add vx0 type vxlan id 42 local {local} remote {remote} dstport 4789 dev eth0"
                    ))
                    .unwrap();
                    // The kernel derives vx0's MTU from eth0 and the outer family; the pods'
                    // MTU above must match it exactly.
                    let shown = n.ip("link show dev vx0").unwrap();
                    assert!(
                        shown.contains(&format!("mtu {} ", case.pod_mtu())),
                        "{}: vx0 MTU differs from the pod MTU {}: {shown}",
                        case.name(),
                        case.pod_mtu()
                    );
                    n.ip(&format!("addr add 10.99.0.{me}/24 dev vx0")).unwrap();
                    n.ip("link set vx0 up").unwrap();
                }
                route_natively(&nodes, |peer| format!("via 10.99.0.{peer} dev vx0"));
            }
            Case::Srv6Ll | Case::Srv6LlNoNft => {
                let mut state = srv6_cluster();
                over_ipv4(&mut state);
                reconcilers = link_local(&nodes, &state);
                if case == Case::Srv6LlNoNft {
                    for n in &nodes {
                        n.exec("nft", &["delete", "table", "inet", "lace"]).unwrap();
                    }
                }
            }
            Case::Srv6 | Case::Srv6Fou | Case::Srv6Sit => {
                let mut state = srv6_cluster();
                if case.ipv4_only() {
                    over_ipv4(&mut state);
                }
                for (i, n) in nodes.iter().enumerate() {
                    let name = format!("node{}", i + 1);
                    let p = plan(&name, &state, &[attachment(i as u8 + 1)]).unwrap();
                    let rec = Reconciler::new(NetnsTarget::Path(n.path())).unwrap();
                    let report = rec
                        .reconcile(&p)
                        .unwrap_or_else(|e| panic!("reconcile {name}: {e}"));
                    assert!(report.skipped.is_empty(), "{name}: {:?}", report.skipped);
                    if case == Case::Srv6Sit {
                        // Not what Lace programs: the same device without its UDP header.
                        n.ip(&format!("link set {IPV4_TUNNEL} type sit encap none"))
                            .unwrap();
                        n.ip(&format!("link set {IPV4_TUNNEL} mtu {}", UNDERLAY_MTU - 20))
                            .unwrap();
                    }
                    reconcilers.push(rec);
                }
            }
        }
        // `ip netns exec` execs iperf3 itself, so the child is the server.
        let server = Command::new("ip")
            .args(["netns", "exec", pods[1].name()])
            .args(["iperf3", "-s", "-p", IPERF_PORT])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        World {
            case,
            fabric,
            nodes,
            pods,
            _reconcilers: reconcilers,
            server,
        }
    }

    fn counter(&self, name: &str) -> u64 {
        self.counted(name).0
    }

    /// Node B's observer counter `name`: packets and bytes.
    fn counted(&self, name: &str) -> (u64, u64) {
        let out = self.nodes[1]
            .exec("nft", &["list", "counter", "inet", "observe", name])
            .unwrap();
        (
            number_after(&out, "packets").unwrap(),
            number_after(&out, "bytes").unwrap(),
        )
    }

    /// One iperf3 run from pod A to pod B, after checking the stream took this case's path
    /// without fragments.
    fn run(&self, seconds: u32) -> Run {
        let before = self.counted(self.case.counter());
        let target = pod_addr(2).to_string();
        // A stalled path must fail the bench, not hang it: iperf3 waits forever on a stream
        // that no longer moves.
        let limit = (seconds + 60).to_string();
        let secs = seconds.to_string();
        let args = [
            &limit,
            "iperf3",
            "-c",
            &target,
            "-p",
            IPERF_PORT,
            "-t",
            &secs,
            "-O",
            "1",
            "-J",
            "--connect-timeout",
            "5000",
        ];
        // The server needs a moment to listen after start (slow under TCG): retry refused
        // connects.
        let mut attempt = 0;
        let out = loop {
            match self.pods[0].exec("timeout", &args) {
                Ok(out) => break out,
                Err(e) if attempt < 50 && e.to_string().contains("refused") => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!(
                    "{}: iperf3 client: {e}\nnode B's observer:\n{}",
                    self.case.name(),
                    self.nodes[1]
                        .exec("nft", &["list", "table", "inet", "observe"])
                        .unwrap_or_default()
                ),
            }
        };
        let json: Value = serde_json::from_str(&out).unwrap();
        let bps = json["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or_else(|| panic!("{}: no sum_received in {out}", self.case.name()));
        let retransmits = json["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
        // Every byte the receiver counted came the case's way (GRO may merge packets before
        // the observer counts them, so bytes, not packets).
        let received = json["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
        let after = self.counted(self.case.counter());
        let (packets, seen) = (after.0 - before.0, after.1 - before.1);
        assert!(
            received > 0 && seen >= received,
            "{}: {received} bytes received, only {seen} arrived on node B as {}",
            self.case.name(),
            self.case.counter()
        );
        for other in PATHS {
            if other != self.case.counter() {
                assert_eq!(
                    self.counter(other),
                    0,
                    "{}: traffic arrived as {other}",
                    self.case.name()
                );
            }
        }
        assert_eq!(
            self.counter("fragments"),
            0,
            "{}: fragments on the fabric (MTU {} too large)",
            self.case.name(),
            self.case.pod_mtu()
        );
        Run {
            bps,
            retransmits,
            bytes_per_packet: seen / packets.max(1),
        }
    }
}

/// The link-local case: both nodes planned as their agents would once the peer shares their
/// segment (their link-local underlay addresses added), then probed for real, then planned
/// with what the probes found: the pair must take the link-local path.
fn link_local(nodes: &[Netns; 2], state: &ClusterState) -> Vec<Reconciler> {
    let recs: Vec<Reconciler> = nodes
        .iter()
        .map(|n| Reconciler::new(NetnsTarget::Path(n.path())).unwrap())
        .collect();
    let name = |i: usize| format!("node{}", i + 1);
    let apply = |facts: &[UnderlayFacts]| {
        for (i, rec) in recs.iter().enumerate() {
            let p = plan_with(&name(i), state, &facts[i], &[attachment(i as u8 + 1)]).unwrap();
            let report = rec
                .reconcile(&p)
                .unwrap_or_else(|e| panic!("reconcile {}: {e}", name(i)));
            assert!(
                report.skipped.is_empty(),
                "{}: {:?}",
                name(i),
                report.skipped
            );
        }
    };
    let mut facts: Vec<UnderlayFacts> = (0..2)
        .map(|i| UnderlayFacts {
            uplink_ipv6: true,
            on_link: [name(1 - i)].into(),
            answering: Default::default(),
            answered: Default::default(),
            uplink_mtu: Some(UNDERLAY_MTU),
        })
        .collect();
    apply(&facts);
    for (i, rec) in recs.iter().enumerate() {
        let round = rec
            .probe_underlay(lace::agent::paths::query(&name(i), state))
            .unwrap();
        facts[i] = lace::agent::paths::Tracker::default().update(&round);
        assert!(
            facts[i].link_local_works(&name(1 - i)),
            "{}: the peer's link-local underlay address does not answer: {round:?}",
            name(i)
        );
    }
    apply(&facts);
    recs
}

/// What one iperf3 run measured.
struct Run {
    /// Received bits per second.
    bps: f64,
    /// The sender's retransmitted segments.
    retransmits: u64,
    /// Bytes per packet of the stream arriving on node B from the fabric.
    bytes_per_packet: u64,
}

/// Node `i` routes its own pod on the host veth and the peer's pod block via `via(peer)`.
fn route_natively(nodes: &[Netns; 2], via: impl Fn(u8) -> String) {
    for (n, (me, peer)) in nodes.iter().zip([(1u8, 2u8), (2, 1)]) {
        n.ip(&format!("route add {}/32 dev {HOST_IF}", pod_addr(me)))
            .unwrap();
        n.ip(&format!("route add 10.0.{peer}.0/24 {}", via(peer)))
            .unwrap();
    }
}

/// The SRv6 case's cluster: one Network `bench` (10.0.0.0/16, a /24 per node) that reaches
/// itself, two nodes on the fabric.
fn srv6_cluster() -> ClusterState {
    ipv4_cluster(
        "node",
        2,
        &[TestNetwork {
            name: "bench",
            second: 0,
            function: 1,
            reaches_itself: true,
        }],
    )
}

fn attachment(i: u8) -> PodAttachment {
    PodAttachment {
        pod: ObjectKey::new("bench", format!("pod{i}")),
        container_id: format!("c-pod{i}"),
        host_ifname: HOST_IF.into(),
        network: "bench".into(),
        ips: vec![IpNet::V4(Ipv4Net::from(pod_addr(i)))],
        host_ports: Vec::new(),
        bandwidth: None,
    }
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn env_u32(key: &str, default: u32) -> u32 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; a plain run (e.g. `cargo test --benches`) is a no-op.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    require_root_and_vrf();
    let seconds = env_u32("LACE_BENCH_SECONDS", 5);
    let repeats = env_u32("LACE_BENCH_REPEATS", 3);
    let cases = selected_cases();
    let fabrics = selected_fabrics();
    let worlds: Vec<World> = fabrics
        .iter()
        .flat_map(|&f| cases.iter().map(move |&c| (c, f)))
        .map(|(c, f)| World::build(c, f))
        .collect();
    // Every pod reaches its peer before anything is measured (also warms ARP/ND caches).
    for w in &worlds {
        w.pods[0]
            .exec("ping", &["-c", "2", "-W", "3", &pod_addr(2).to_string()])
            .unwrap_or_else(|e| panic!("{}: pods do not reach each other: {e}", w.case.name()));
    }
    let mut results: BTreeMap<(&str, &str), Vec<Run>> = BTreeMap::new();
    for rep in 0..repeats {
        for w in &worlds {
            let (f, c) = (w.fabric.name(), w.case.name());
            eprintln!("run {}/{repeats} {f:<4} {c:<8} ...", rep + 1);
            let run = w.run(seconds);
            eprintln!(
                "run {}/{repeats} {f:<4} {c:<8} {:>9.1} Mbit/s, {} retransmits, {} B/pkt",
                rep + 1,
                run.bps / 1e6,
                run.retransmits,
                run.bytes_per_packet
            );
            results.entry((f, c)).or_default().push(run);
        }
    }
    println!(
        "kernel {}, {} CPUs, one TCP stream pod to pod across nodes, iperf3 {repeats} x {seconds} s \
         (first second omitted), fabric MTU {UNDERLAY_MTU}, gateway {POD_GATEWAY_V4}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "| {:<6} | {:<8} | {:<38} | {:>7} | {:<26} | {:>13} | {:>9} | {:>7} | {:>6} |",
        "fabric",
        "case",
        "path",
        "pod MTU",
        "runs Mbit/s",
        "median Mbit/s",
        "vs native",
        "retrans",
        "B/pkt"
    );
    println!("|{}|", "-".repeat(153));
    let median_of = |fabric: &str, name: &str| {
        results
            .get(&(fabric, name))
            .map(|runs| median(&runs.iter().map(|r| r.bps).collect::<Vec<_>>()))
    };
    for (fabric, case) in fabrics
        .iter()
        .flat_map(|f| cases.iter().map(move |c| (f.name(), c)))
    {
        let runs = &results[&(fabric, case.name())];
        let m = median_of(fabric, case.name()).unwrap_or_default();
        let list = runs
            .iter()
            .map(|r| format!("{:.0}", r.bps / 1e6))
            .collect::<Vec<_>>()
            .join(" ");
        let vs_native =
            median_of(fabric, "native").map_or("-".into(), |n| format!("{:.2}x", m / n));
        let retr: u64 = runs.iter().map(|r| r.retransmits).sum();
        let bytes_per_packet =
            runs.iter().map(|r| r.bytes_per_packet).sum::<u64>() / runs.len() as u64;
        println!(
            "| {fabric:<6} | {:<8} | {:<38} | {:>7} | {list:<26} | {:>13.1} | {vs_native:>9} | {retr:>7} | {bytes_per_packet:>6} |",
            case.name(),
            case.describe(),
            case.pod_mtu(),
            m / 1e6,
        );
    }
    // Each SRv6 underlay against VXLAN over the same fabric family, per fabric.
    for fabric in &fabrics {
        for (a, b) in [
            ("srv6", "vxlan6"),
            ("srv6-ll", "vxlan4"),
            ("ll-nonft", "vxlan4"),
            ("srv6-fou", "vxlan4"),
            ("srv6-sit", "vxlan4"),
            ("ipip-fou", "vxlan4"),
        ] {
            let f = fabric.name();
            if let (Some(x), Some(y)) = (median_of(f, a), median_of(f, b)) {
                println!("{f}: {a} / {b}: {:.2}x (medians)", x / y);
            }
        }
    }
}

/// The fabrics LACE_BENCH_FABRICS names (both when unset); an unknown name fails the bench.
fn selected_fabrics() -> Vec<Fabric> {
    let Ok(list) = std::env::var("LACE_BENCH_FABRICS") else {
        return Fabric::ALL.to_vec();
    };
    list.split(',')
        .filter(|n| !n.is_empty())
        .map(|n| {
            Fabric::ALL
                .into_iter()
                .find(|f| f.name() == n)
                .unwrap_or_else(|| {
                    panic!("LACE_BENCH_FABRICS: no fabric {n:?}; the fabrics are veth, nic")
                })
        })
        .collect()
}

/// The cases LACE_BENCH_CASES names (all when unset); an unknown name fails the bench.
fn selected_cases() -> Vec<Case> {
    let Ok(list) = std::env::var("LACE_BENCH_CASES") else {
        return Case::ALL.to_vec();
    };
    list.split(',')
        .filter(|n| !n.is_empty())
        .map(|n| {
            Case::ALL
                .into_iter()
                .find(|c| c.name() == n)
                .unwrap_or_else(|| {
                    let known: Vec<_> = Case::ALL.iter().map(|c| c.name()).collect();
                    panic!(
                        "LACE_BENCH_CASES: no case {n:?}; the cases are {}",
                        known.join(", ")
                    )
                })
        })
        .collect()
}
