//! Kubernetes NetworkPolicy against a real kernel: two node namespaces linked by a veth pair
//! (IPv6 underlay, SRv6 between them), programmed by the real planner and reconciler, and five
//! pods of two Kubernetes namespaces (`alpha`, `beta`) in one dual-stack Network `default` that
//! reaches itself, so Lace's own policies allow everything between them and only NetworkPolicy
//! decides.
//!
//! ```text
//!  node1: alpha/server 10.1.1.10  (app=server tier=web, ports http = TCP 8080,
//!                                   echo-sctp = SCTP 7000)
//!         alpha/other  10.1.1.11  (app=other  tier=web, port http = TCP 9090)
//!         beta/client  10.1.1.12  (app=client)
//!  node2: beta/remote  10.1.2.10  (app=remote)
//!         beta/dns     10.1.2.53  (app=dns, ports dns = UDP 53, dns-tcp = TCP 53)
//!  (and fd00:1:0:<node>::<host> in IPv6)
//! ```
//!
//! One phase per policy set, each planned, applied twice (the second apply writes nothing) and
//! checked with real TCP connections, SCTP associations and UDP datagrams in both families, all
//! of a phase at once: first without any NetworkPolicy (every probe of the later phases
//! connects), then deny-all ingress, allow from a namespace, a pod label change that makes a pod
//! a peer (element updates only, every handle of the table kept), a named port, a named SCTP
//! port, an ipBlock with `except`, and egress to DNS only; every phase after the first updates the table in place
//! (NetworkPolicy's chains and sets written, no new table). A refused probe must also show up in the drop counter of
//! the NetworkPolicy chain that enforces it (`np_ingress` on the destination's node, `np_egress`
//! on the source's).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Instant;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use lace::api::{LabelSelector, NetworkRoutingPolicySpec};
use lace::dataplane::{ApplyReport, NetnsTarget, Reconciler, SAMPLE_OPS};
use lace::plan::{plan, DesiredNode};
use lace::state::{
    ClusterState, ContainerPort, Namespace, NetworkPolicy, ObjectKey, Pod, PodAttachment,
    PolicyPeer, PolicyPort, PolicyRule, PortRef,
};
use lace_netns_tests::cluster::{add_dual_stack_network, ipv4_cluster, two_nodes, PodSeat};
use lace_netns_tests::nft::handles;
use lace_netns_tests::probe::{run_all, Attempt, Expect, Proto, Servers};
use lace_netns_tests::{require_root_and_vrf, Netns, Topology};

const NODES: [u16; 2] = [1, 2];

/// A pod: its namespace label in the test is its name.
struct PodSpec {
    name: &'static str,
    namespace: &'static str,
    node: u16,
    host: u8,
    labels: &'static [(&'static str, &'static str)],
    /// Named container ports: (name, protocol, port).
    ports: &'static [(&'static str, &'static str, u16)],
}

const PODS: [PodSpec; 5] = [
    PodSpec {
        name: "server",
        namespace: "alpha",
        node: 1,
        host: 10,
        labels: &[("app", "server"), ("tier", "web")],
        ports: &[("http", "TCP", 8080), ("echo-sctp", "SCTP", 7000)],
    },
    PodSpec {
        name: "other",
        namespace: "alpha",
        node: 1,
        host: 11,
        labels: &[("app", "other"), ("tier", "web")],
        ports: &[("http", "TCP", 9090)],
    },
    PodSpec {
        name: "client",
        namespace: "beta",
        node: 1,
        host: 12,
        labels: &[("app", "client")],
        ports: &[],
    },
    PodSpec {
        name: "remote",
        namespace: "beta",
        node: 2,
        host: 10,
        labels: &[("app", "remote")],
        ports: &[],
    },
    PodSpec {
        name: "dns",
        namespace: "beta",
        node: 2,
        host: 53,
        labels: &[("app", "dns")],
        ports: &[("dns", "UDP", 53), ("dns-tcp", "TCP", 53)],
    },
];

fn pod(name: &str) -> &'static PodSpec {
    PODS.iter().find(|p| p.name == name).unwrap()
}

impl PodSpec {
    fn v4(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 1, self.node as u8, self.host)
    }

    fn v6(&self) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 1, 0, self.node, 0, 0, 0, u16::from(self.host))
    }

    fn ip(&self, v6: bool) -> IpAddr {
        if v6 {
            self.v6().into()
        } else {
            self.v4().into()
        }
    }

    fn key(&self) -> ObjectKey {
        ObjectKey::new(self.namespace, self.name)
    }

    fn seat(&self) -> PodSeat {
        PodSeat {
            label: self.name,
            node: self.node,
            v4: self.v4(),
            v6: self.v6(),
        }
    }
}

fn node_label(i: u16) -> String {
    format!("node{i}")
}

fn selector(labels: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn port(protocol: &str, port: PortRef) -> PolicyPort {
    PolicyPort {
        protocol: protocol.into(),
        port: Some(port),
        end_port: None,
    }
}

/// The pods of every namespace (`namespaceSelector: {}`) with `pod_selector`.
fn anywhere(pod_selector: Option<LabelSelector>) -> PolicyPeer {
    PolicyPeer::Pods {
        namespace_selector: Some(LabelSelector::default()),
        pod_selector,
    }
}

/// An ingress-only policy (`policyTypes: [Ingress]`) selecting `pods`, with `rules`.
fn ingress(pods: &[(&str, &str)], rules: Vec<PolicyRule>) -> NetworkPolicy {
    NetworkPolicy {
        pod_selector: selector(pods),
        ingress_isolation: true,
        ingress: rules,
        ..Default::default()
    }
}

/// The policies of the phases, by name.
fn policy(name: &str) -> (ObjectKey, NetworkPolicy) {
    let p = match name {
        // Deny-all ingress for the server: selected, no rule.
        "deny-server" => ingress(&[("app", "server")], vec![]),
        // From every pod of the namespaces labelled team=beta, any port.
        "from-beta" => ingress(
            &[("app", "server")],
            vec![PolicyRule {
                peers: vec![PolicyPeer::Pods {
                    namespace_selector: Some(selector(&[("team", "beta")])),
                    pod_selector: None,
                }],
                ports: vec![],
            }],
        ),
        // From the pods labelled role=friend of the policy's namespace.
        "friends" => ingress(
            &[("app", "server")],
            vec![PolicyRule {
                peers: vec![PolicyPeer::Pods {
                    namespace_selector: None,
                    pod_selector: Some(selector(&[("role", "friend")])),
                }],
                ports: vec![],
            }],
        ),
        // To the container port named http of each selected pod, from every pod.
        "http" => ingress(
            &[("tier", "web")],
            vec![PolicyRule {
                peers: vec![anywhere(None)],
                ports: vec![port("TCP", PortRef::Name("http".into()))],
            }],
        ),
        // To the server's SCTP port named echo-sctp, from every pod: not TCP or UDP on it.
        "sctp" => ingress(
            &[("app", "server")],
            vec![PolicyRule {
                peers: vec![anywhere(None)],
                ports: vec![port("SCTP", PortRef::Name("echo-sctp".into()))],
            }],
        ),
        // From the Network's addresses except the first 16 of node 2's block (remote's).
        "cidr" => ingress(
            &[("app", "server")],
            vec![PolicyRule {
                peers: vec![
                    PolicyPeer::IpBlock {
                        cidr: "10.1.0.0/16".parse().unwrap(),
                        except: vec!["10.1.2.0/28".parse().unwrap()],
                    },
                    PolicyPeer::IpBlock {
                        cidr: "fd00:1::/48".parse().unwrap(),
                        except: vec!["fd00:1:0:2::/124".parse().unwrap()],
                    },
                ],
                ports: vec![],
            }],
        ),
        // The client may only ask the dns pods, on UDP and TCP 53 (`policyTypes: [Egress]`).
        "dns-only" => NetworkPolicy {
            pod_selector: selector(&[("app", "client")]),
            egress_isolation: true,
            egress: vec![PolicyRule {
                peers: vec![anywhere(Some(selector(&[("app", "dns")])))],
                ports: vec![
                    port("UDP", PortRef::Number(53)),
                    port("TCP", PortRef::Number(53)),
                ],
            }],
            ..Default::default()
        },
        _ => unreachable!("no policy {name}"),
    };
    let namespace = if name == "dns-only" { "beta" } else { "alpha" };
    (ObjectKey::new(namespace, name), p)
}

/// The cluster with `policies` and, on top of each pod's own labels, `extra` (pod, key, value).
fn cluster(policies: &[&str], extra: &[(&str, &str, &str)]) -> ClusterState {
    let mut s = ipv4_cluster("node", NODES.len() as u16, &[]);
    add_dual_stack_network(&mut s, "default", 1, 1);
    s.network_routes.insert(
        "default-self".into(),
        NetworkRoutingPolicySpec {
            from: "default".into(),
            to: "default".into(),
        },
    );
    for ns in ["alpha", "beta"] {
        s.namespaces.insert(
            ns.into(),
            Namespace {
                labels: [("kubernetes.io/metadata.name", ns), ("team", ns)]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
            },
        );
    }
    for p in &PODS {
        let mut labels: BTreeMap<String, String> = p
            .labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (_, k, v) in extra.iter().filter(|(name, _, _)| *name == p.name) {
            labels.insert(k.to_string(), v.to_string());
        }
        s.pods.insert(
            p.key(),
            Pod {
                labels,
                node: node_label(p.node),
                ips: vec![p.ip(false), p.ip(true)],
                host_network: false,
                ports: p
                    .ports
                    .iter()
                    .map(|(name, protocol, port)| ContainerPort {
                        name: name.to_string(),
                        protocol: protocol.to_string(),
                        port: *port,
                    })
                    .collect(),
            },
        );
    }
    s.network_policies = policies.iter().map(|n| policy(n)).collect();
    s
}

fn attachments(i: u16) -> Vec<PodAttachment> {
    PODS.iter()
        .filter(|p| p.node == i)
        .map(|p| PodAttachment {
            pod: p.key(),
            container_id: format!("c-{}", p.name),
            host_ifname: p.seat().host_if(),
            network: "default".into(),
            ips: vec![
                IpNet::V4(Ipv4Net::from(p.v4())),
                IpNet::V6(Ipv6Net::from(p.v6())),
            ],
            host_ports: Vec::new(),
            bandwidth: None,
        })
        .collect()
}

fn plans(s: &ClusterState) -> Vec<DesiredNode> {
    NODES
        .iter()
        .map(|&i| plan(&node_label(i), s, &attachments(i)).unwrap())
        .collect()
}

/// Applies `plans` node by node; their reports.
fn apply(recs: &[Reconciler], plans: &[DesiredNode]) -> Vec<ApplyReport> {
    recs.iter()
        .zip(plans)
        .map(|(r, p)| {
            let rep = r
                .reconcile(p)
                .unwrap_or_else(|e| panic!("reconcile {}: {e}", p.node));
            assert!(rep.skipped.is_empty(), "{}: {:?}", p.node, rep.skipped);
            rep
        })
        .collect()
}

/// What a probe must meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Allowed,
    /// Refused by the destination's ingress policies (`np_ingress` on its node).
    RefusedIn,
    /// Refused by the source's egress policies (`np_egress` on its node).
    RefusedOut,
}

/// A connection (TCP, SCTP) or a datagram and its answer (UDP) from pod `from` to pod `to`.
#[derive(Clone, Copy)]
struct Probe {
    from: &'static str,
    to: &'static str,
    proto: Proto,
    port: u16,
    want: Want,
}

const fn tcp(from: &'static str, to: &'static str, port: u16, want: Want) -> Probe {
    Probe {
        from,
        to,
        proto: Proto::Tcp,
        port,
        want,
    }
}

const fn udp(from: &'static str, to: &'static str, port: u16, want: Want) -> Probe {
    Probe {
        from,
        to,
        proto: Proto::Udp,
        port,
        want,
    }
}

const fn sctp(from: &'static str, to: &'static str, port: u16, want: Want) -> Probe {
    Probe {
        from,
        to,
        proto: Proto::Sctp,
        port,
        want,
    }
}

impl Probe {
    fn describe(&self, v6: bool) -> String {
        let (from, to) = (pod(self.from), pod(self.to));
        format!(
            "{}/{} -> {}/{} {:?} {} (IPv{})",
            from.namespace,
            from.name,
            to.namespace,
            to.name,
            self.proto,
            self.port,
            if v6 { 6 } else { 4 }
        )
    }

    /// The probe in one family, for [`run_all`]: refused ones counted by the final drop of
    /// `np_ingress` on the destination's node or `np_egress` on the source's.
    fn attempt<'a>(&self, w: &'a World, v6: bool) -> Attempt<'a> {
        let (from, to) = (pod(self.from), pod(self.to));
        Attempt {
            what: self.describe(v6),
            from: w.ns(from.name),
            proto: self.proto,
            server: SocketAddr::new(to.ip(v6), self.port),
            expect: match self.want {
                Want::Allowed => Expect::Answered(vec![from.ip(v6)]),
                Want::RefusedIn => Expect::Refused {
                    node: w.node(to.node),
                    chain: "np_ingress",
                    by: "the destination's ingress policies",
                },
                Want::RefusedOut => Expect::Refused {
                    node: w.node(from.node),
                    chain: "np_egress",
                    by: "the source's egress policies",
                },
            },
        }
    }
}

/// One policy set, its label changes and what the probes must meet under it.
struct Phase {
    name: &'static str,
    policies: &'static [&'static str],
    labels: &'static [(&'static str, &'static str, &'static str)],
    probes: Vec<Probe>,
}

use Want::{Allowed, RefusedIn, RefusedOut};

/// The phases after the first (no NetworkPolicy, every probe of these allowed).
fn phases() -> Vec<Phase> {
    vec![
        Phase {
            name: "deny-all ingress for alpha/server",
            policies: &["deny-server"],
            labels: &[],
            probes: vec![
                tcp("client", "server", 8080, RefusedIn),
                tcp("client", "server", 9090, RefusedIn),
                tcp("other", "server", 8080, RefusedIn),
                tcp("remote", "server", 8080, RefusedIn),
                sctp("client", "server", 7000, RefusedIn),
                sctp("remote", "server", 7000, RefusedIn),
                // Replies of the server's own connections pass.
                tcp("server", "client", 8080, Allowed),
                tcp("server", "remote", 8080, Allowed),
                // An unselected pod is still reachable.
                tcp("client", "other", 8080, Allowed),
                tcp("remote", "other", 8080, Allowed),
            ],
        },
        Phase {
            name: "allow from namespace team=beta (and from role=friend, nobody yet)",
            policies: &["deny-server", "from-beta", "friends"],
            labels: &[],
            probes: vec![
                tcp("client", "server", 8080, Allowed),
                tcp("client", "server", 9090, Allowed),
                tcp("remote", "server", 8080, Allowed),
                tcp("other", "server", 8080, RefusedIn),
                tcp("other", "server", 9090, RefusedIn),
            ],
        },
        Phase {
            name: "alpha/other labelled role=friend",
            policies: &["deny-server", "from-beta", "friends"],
            labels: &[("other", "role", "friend")],
            probes: vec![
                tcp("other", "server", 8080, Allowed),
                tcp("other", "server", 9090, Allowed),
                tcp("client", "server", 8080, Allowed),
            ],
        },
        Phase {
            name: "named port http (8080 on server, 9090 on other)",
            policies: &["http"],
            labels: &[("other", "role", "friend")],
            probes: vec![
                tcp("client", "server", 8080, Allowed),
                tcp("client", "other", 9090, Allowed),
                tcp("remote", "server", 8080, Allowed),
                tcp("remote", "other", 9090, Allowed),
                tcp("client", "server", 9090, RefusedIn),
                tcp("client", "other", 8080, RefusedIn),
                tcp("remote", "other", 8080, RefusedIn),
            ],
        },
        Phase {
            name: "SCTP port echo-sctp (7000 on server)",
            policies: &["sctp"],
            labels: &[],
            probes: vec![
                sctp("client", "server", 7000, Allowed),
                sctp("remote", "server", 7000, Allowed),
                sctp("client", "server", 7001, RefusedIn),
                // The port's number with another protocol is not the port.
                tcp("client", "server", 7000, RefusedIn),
                udp("remote", "server", 7000, RefusedIn),
            ],
        },
        Phase {
            name: "ipBlock 10.1.0.0/16 except 10.1.2.0/28 (fd00:1::/48 except fd00:1:0:2::/124)",
            policies: &["cidr"],
            labels: &[],
            probes: vec![
                tcp("client", "server", 8080, Allowed),
                tcp("other", "server", 9090, Allowed),
                // Node 2 both: dns (.53) outside the except, remote (.10) inside.
                tcp("dns", "server", 8080, Allowed),
                tcp("remote", "server", 8080, RefusedIn),
                tcp("remote", "server", 9090, RefusedIn),
            ],
        },
        Phase {
            name: "egress to DNS only for beta/client",
            policies: &["dns-only"],
            labels: &[],
            probes: vec![
                udp("client", "dns", 53, Allowed),
                tcp("client", "dns", 53, Allowed),
                udp("client", "dns", 5353, RefusedOut),
                tcp("client", "dns", 8080, RefusedOut),
                sctp("client", "dns", 53, RefusedOut),
                tcp("client", "server", 8080, RefusedOut),
                tcp("client", "remote", 8080, RefusedOut),
                // Connections to the client still pass, their replies too; others are free.
                tcp("other", "client", 8080, Allowed),
                tcp("remote", "dns", 8080, Allowed),
            ],
        },
    ]
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
        World {
            topo: two_nodes(&PODS.map(|p| p.seat())).unwrap(),
        }
    }

    /// Both nodes' table `inet lace`, for failure messages.
    fn diagnose(&self) -> String {
        NODES
            .iter()
            .map(|&i| {
                let t = self
                    .node(i)
                    .exec("nft", &["list", "table", "inet", "lace"])
                    .unwrap_or_else(|e| e.to_string());
                format!("--- node{i}: nft list table inet lace\n{t}")
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

/// Every probe of `phases`, once each, allowed: what the first phase (no NetworkPolicy) checks.
fn baseline(phases: &[Phase]) -> Vec<Probe> {
    let mut seen = BTreeSet::new();
    phases
        .iter()
        .flat_map(|p| &p.probes)
        .filter(|p| seen.insert((p.from, p.to, p.proto, p.port)))
        .map(|p| Probe {
            want: Allowed,
            ..*p
        })
        .collect()
}

/// The servers every probe of `probes` needs: TCP, SCTP and UDP, both families.
fn servers(w: &World, probes: &[Probe]) -> Servers {
    let wanted: BTreeSet<(&str, Proto, u16)> =
        probes.iter().map(|p| (p.to, p.proto, p.port)).collect();
    let mut servers = Servers::default();
    for (to, proto, port) in wanted {
        for v6 in [false, true] {
            servers.start(w.ns(to), proto, SocketAddr::new(pod(to).ip(v6), port));
        }
    }
    servers
}

/// The nft operations of `report`, each of which must be an element update of `inet lace`.
fn element_updates_only(node: &str, report: &ApplyReport) -> Result<usize, String> {
    let ops = &report.sample;
    if ops.len() >= SAMPLE_OPS || report.writes != ops.len() as u64 {
        return Err(format!(
            "{node}: expected a few writes, all named in the report, saw {} writes: {ops:#?}",
            report.writes
        ));
    }
    match ops.iter().find(|op| {
        !op.starts_with("nft update table inet lace: ")
            || op.contains("chain(s) written")
            || op.contains("set(s) added")
    }) {
        Some(op) => Err(format!(
            "{node}: expected element updates of inet lace only, saw {op:?} among {ops:#?}"
        )),
        None => Ok(ops.len()),
    }
}

#[test]
fn network_policies_deny_all_namespace_named_port_sctp_ip_block_and_dns_egress() {
    require_root_and_vrf();
    let start = Instant::now();
    let w = World::build();
    let recs: Vec<Reconciler> = NODES
        .iter()
        .map(|&i| Reconciler::new(NetnsTarget::Path(w.node(i).path())).unwrap())
        .collect();
    let phases = phases();
    let first = baseline(&phases);
    let _servers = servers(&w, &first);
    eprintln!("world built in {:.1}s", start.elapsed().as_secs_f64());

    let all = std::iter::once(Phase {
        name: "no NetworkPolicy",
        policies: &[],
        labels: &[],
        probes: first,
    })
    .chain(phases);
    let mut previous: Option<&[&str]> = None;
    for phase in all {
        let t = Instant::now();
        let name = phase.name;
        let p = plans(&cluster(phase.policies, phase.labels));
        // Same policies as the phase before: only pod labels change.
        let labels_only = previous == Some(phase.policies);
        let before: Vec<Vec<String>> = if labels_only {
            NODES.iter().map(|&i| handles(w.node(i))).collect()
        } else {
            Vec::new()
        };
        let reports = apply(&recs, &p);
        for (i, rep) in NODES.iter().zip(&reports) {
            eprintln!("{name}: node{i}: {} writes: {:?}", rep.writes, rep.sample);
        }
        let writes: u64 = reports.iter().map(|r| r.writes).sum();
        assert!(
            writes > 0,
            "{name}: expected writes, the reconcilers wrote none"
        );
        if previous.is_some() {
            // Every change after the first install is made in place: NetworkPolicies coming,
            // changing and going write their chains and sets, not a new table.
            for (i, rep) in NODES.iter().zip(&reports) {
                let replaced = rep.sample.iter().find(|op| op.starts_with("nft replace"));
                assert!(
                    replaced.is_none(),
                    "{name}: node{i}: expected the table updated in place, saw {replaced:?}"
                );
            }
        }
        if labels_only {
            // Element updates and nothing else, every handle of the table (its chains, rules
            // and sets) kept.
            let mut updates = Vec::new();
            for (&i, rep) in NODES.iter().zip(&reports) {
                updates.push(
                    element_updates_only(&node_label(i), rep)
                        .unwrap_or_else(|e| panic!("{name}: {e}")),
                );
                assert_eq!(
                    handles(w.node(i)),
                    before[usize::from(i) - 1],
                    "{name}: node{i}: expected the table's chains, rules and sets kept (same \
                     handles), saw them change (left: after, right: before)"
                );
            }
            assert!(
                updates[0] >= 1,
                "{name}: node1 (the server's) expected an element update, saw {:?}",
                reports[0].sample
            );
        }
        let second: Vec<u64> = apply(&recs, &p).iter().map(|r| r.writes).collect();
        assert_eq!(
            second,
            vec![0; NODES.len()],
            "{name}: expected the plan applied twice to write nothing the second time, saw \
             these writes per node"
        );
        let wrong = check(&w, &phase.probes);
        assert!(
            wrong.is_empty(),
            "{name}:\n{}\n{}",
            wrong.join("\n"),
            w.diagnose()
        );
        eprintln!(
            "{name}: {} probes x 2 families as expected, {:.1}s",
            phase.probes.len(),
            t.elapsed().as_secs_f64()
        );
        previous = Some(phase.policies);
    }
}

/// The planner's side of the label phase, without a kernel: the label change that makes
/// alpha/other a peer of alpha/friends changes set elements only, on node 1 (the server's)
/// at least.
#[test]
fn the_label_change_is_planned_as_element_changes() {
    let policies = &["deny-server", "from-beta", "friends"];
    let before = plans(&cluster(policies, &[]));
    let after = plans(&cluster(policies, &[("other", "role", "friend")]));
    for (i, (a, b)) in NODES.iter().zip(before.iter().zip(&after)) {
        let changes = a.base.nft.element_changes(&b.base.nft);
        let changes = changes.unwrap_or_else(|| {
            panic!("node{i}: expected element changes only, the rules or sets changed")
        });
        if *i == 1 {
            assert!(
                changes
                    .added
                    .iter()
                    .any(|(set, _, _)| set.ends_with("_peers_v4"))
                    && changes
                        .added
                        .iter()
                        .any(|(set, _, _)| set.ends_with("_peers_v6")),
                "node1: expected alpha/other's addresses added to a peer set, saw {}",
                changes.render()
            );
        }
    }
}
