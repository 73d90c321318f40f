//! The NetworkPolicy part of the ruleset, judged by what it does: a small evaluator runs the
//! generated `np_ingress` / `np_egress` chains over their sets for one connection, the way
//! nftables would, so each test states upstream semantics (who may connect to whom, on which
//! port) rather than the text of rules.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::*;
use crate::api::LabelSelector;
use crate::state::{ContainerPort, Namespace, NetworkPolicy, PolicyPort, PortRef};

const NODE: &str = "node-1";

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sel(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: labels(pairs),
        match_expressions: Vec::new(),
    }
}

fn ns(s: &mut ClusterState, name: &str, l: &[(&str, &str)]) {
    let mut l = labels(l);
    l.insert("kubernetes.io/metadata.name".into(), name.into());
    s.namespaces.insert(name.into(), Namespace { labels: l });
}

fn pod(s: &mut ClusterState, key: (&str, &str), node: &str, ips: &[&str], l: &[(&str, &str)]) {
    s.pods.insert(
        ObjectKey::new(key.0, key.1),
        Pod {
            labels: labels(l),
            node: node.into(),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
            host_network: false,
            ports: Vec::new(),
        },
    );
}

fn tcp(port: u16) -> PolicyPort {
    PolicyPort {
        protocol: "TCP".into(),
        port: Some(PortRef::Number(port)),
        end_port: None,
    }
}

fn policy(s: &mut ClusterState, key: (&str, &str), p: NetworkPolicy) {
    s.network_policies.insert(ObjectKey::new(key.0, key.1), p);
}

fn ingress_policy(selector: LabelSelector, rules: Vec<PolicyRule>) -> NetworkPolicy {
    NetworkPolicy {
        pod_selector: selector,
        ingress_isolation: true,
        ingress: rules,
        ..Default::default()
    }
}

fn pods_peer(ns: Option<LabelSelector>, pods: Option<LabelSelector>) -> PolicyPeer {
    PolicyPeer::Pods {
        namespace_selector: ns,
        pod_selector: pods,
    }
}

/// Namespaces `a` (team x), `b` (team y), `kube-system`; pods: `a/web` (10.0.1.2,
/// fd00::1:2) and `a/db` on this node, `b/client` (10.0.2.3, fd00::2:3) and `a/client`
/// (10.0.2.4) on node-2, `kube-system/dns` (10.0.2.53) on node-2.
fn cluster() -> ClusterState {
    let mut s = ClusterState::default();
    ns(&mut s, "a", &[("team", "x")]);
    ns(&mut s, "b", &[("team", "y")]);
    ns(&mut s, "kube-system", &[]);
    pod(
        &mut s,
        ("a", "web"),
        NODE,
        &["10.0.1.2", "fd00::1:2"],
        &[("app", "web")],
    );
    pod(&mut s, ("a", "db"), NODE, &["10.0.1.3"], &[("app", "db")]);
    pod(
        &mut s,
        ("b", "client"),
        "node-2",
        &["10.0.2.3", "fd00::2:3"],
        &[("app", "client")],
    );
    pod(
        &mut s,
        ("a", "client"),
        "node-2",
        &["10.0.2.4"],
        &[("app", "client")],
    );
    pod(
        &mut s,
        ("kube-system", "dns"),
        "node-2",
        &["10.0.2.53"],
        &[("k8s-app", "kube-dns")],
    );
    s
}

/// One value of a connection, as a rule's expression reads it.
fn field(word: &str, c: &Conn) -> String {
    match word {
        "saddr" => c.src.to_string(),
        "daddr" => c.dst.to_string(),
        "protocol" => c.proto.to_string(),
        "dport" => c.port.to_string(),
        other => panic!("unexpected field {other}"),
    }
}

/// Whether one part of an element key (address, prefix, protocol, port or port range)
/// matches a value.
fn part_matches(part: &str, value: &str) -> bool {
    if let (Ok(net), Ok(ip)) = (part.parse::<IpNet>(), value.parse::<IpAddr>()) {
        return net.contains(&ip);
    }
    if let (Some((lo, hi)), Ok(v)) = (part.split_once('-'), value.parse::<u16>()) {
        return (lo.parse::<u16>().unwrap()..=hi.parse().unwrap()).contains(&v);
    }
    part == value
}

struct Conn<'a> {
    src: IpAddr,
    dst: IpAddr,
    proto: &'a str,
    port: u16,
}

/// Whether `statement` (only the shapes this module writes) matches `c`.
fn statement_matches(np: &NetworkPolicies, statement: &str, c: &Conn) -> bool {
    let mut fields: Vec<String> = Vec::new();
    for word in statement.split_whitespace() {
        if let Some(set) = word.strip_prefix('@') {
            let set = np
                .sets
                .iter()
                .find(|s| s.name == set)
                .expect("set declared");
            let found = set.elements.keys().any(|k| {
                let parts: Vec<&str> = k.split(" . ").collect();
                parts.len() == fields.len()
                    && parts.iter().zip(&fields).all(|(p, v)| part_matches(p, v))
            });
            if !found {
                return false;
            }
            fields.clear();
        } else if matches!(word, "saddr" | "daddr" | "protocol" | "dport") {
            let fam_ok = !statement.contains("ip6 ") || c.src.is_ipv6();
            if !fam_ok || (statement.starts_with("ip ") && c.src.is_ipv6()) {
                return false;
            }
            fields.push(field(word, c));
        }
    }
    true
}

/// What the NetworkPolicy chains decide for a new connection in direction `d`: `true` when it
/// goes on to Lace's routing policies (not isolated, or allowed), `false` when dropped.
fn passes(np: &NetworkPolicies, d: Direction, c: &Conn) -> bool {
    let own = match d {
        Direction::Ingress => c.dst,
        Direction::Egress => c.src,
    };
    let isolated = np
        .sets
        .iter()
        .find(|s| s.name == isolated_set(d, family(&own)))
        .unwrap();
    if !isolated.elements.contains_key(&own.to_string()) {
        return true;
    }
    let chain = np
        .chains
        .iter()
        .find(|ch| ch.name == chain_name(d))
        .unwrap();
    for r in &chain.rules {
        if r.statement == "counter drop" {
            return false;
        }
        let cond = r
            .statement
            .strip_suffix(" return")
            .expect("allow rules return");
        if statement_matches(np, cond, c) {
            return true;
        }
    }
    unreachable!("the chain ends in a drop")
}

/// Both directions: the source's node polices egress, the destination's ingress. Here both
/// run over this node's sets (tests pick pods so the one that matters is local).
fn check(s: &ClusterState, src: &str, dst: &str, proto: &str, port: u16) -> (bool, bool) {
    let np = build(NODE, s).expect("policies exist");
    let c = Conn {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        proto,
        port,
    };
    (
        passes(&np, Direction::Ingress, &c),
        passes(&np, Direction::Egress, &c),
    )
}

fn ingress(s: &ClusterState, src: &str, dst: &str, proto: &str, port: u16) -> bool {
    check(s, src, dst, proto, port).0
}

fn egress(s: &ClusterState, src: &str, dst: &str, proto: &str, port: u16) -> bool {
    check(s, src, dst, proto, port).1
}

#[test]
fn no_policy_no_netpol_part() {
    assert!(build(NODE, &cluster()).is_none());
}

#[test]
fn deny_all_ingress_isolates_only_the_namespace_selected() {
    let mut s = cluster();
    policy(&mut s, ("a", "deny-all"), ingress_policy(sel(&[]), vec![]));
    assert!(!ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 80));
    assert!(
        !ingress(&s, "10.0.2.4", "10.0.1.3", "udp", 53),
        "own namespace too"
    );
    assert!(
        !ingress(&s, "fd00::2:3", "fd00::1:2", "tcp", 80),
        "IPv6 too"
    );
    // Egress is not isolated by an Ingress-only policy.
    assert!(egress(&s, "10.0.1.2", "10.0.2.3", "tcp", 80));
    let np = build(NODE, &s).unwrap();
    let isolated = &np
        .sets
        .iter()
        .find(|x| x.name == "np_isolated_ingress_v4")
        .unwrap();
    assert_eq!(
        isolated.elements.keys().collect::<Vec<_>>(),
        ["10.0.1.2", "10.0.1.3"],
        "only this node's pods"
    );
    assert_eq!(
        isolated.elements["10.0.1.2"].comment,
        "NetworkPolicy a/deny-all"
    );
}

#[test]
fn a_pod_cannot_block_access_to_itself() {
    let mut s = cluster();
    let p = NetworkPolicy {
        pod_selector: sel(&[]),
        ingress_isolation: true,
        egress_isolation: true,
        ..Default::default()
    };
    policy(&mut s, ("a", "deny-both"), p);
    // Through a Service, DNAT back to itself: both chains see it, both let it on.
    assert_eq!(check(&s, "10.0.1.2", "10.0.1.2", "tcp", 80), (true, true));
    assert_eq!(check(&s, "fd00::1:2", "fd00::1:2", "udp", 53), (true, true));
    assert_eq!(check(&s, "10.0.1.3", "10.0.1.2", "tcp", 80), (false, false));
}

#[test]
fn a_pod_in_no_policy_is_not_isolated() {
    let mut s = cluster();
    policy(
        &mut s,
        ("a", "web-only"),
        ingress_policy(sel(&[("app", "web")]), vec![]),
    );
    assert!(!ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 80));
    assert!(
        ingress(&s, "10.0.2.3", "10.0.1.3", "tcp", 80),
        "a/db is selected by none"
    );
    // A policy in another namespace selects nothing here.
    let mut s = cluster();
    policy(&mut s, ("b", "deny-all"), ingress_policy(sel(&[]), vec![]));
    assert!(ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 80));
}

#[test]
fn allow_from_a_namespace() {
    let mut s = cluster();
    let rule = PolicyRule {
        peers: vec![pods_peer(Some(sel(&[("team", "y")])), None)],
        ports: vec![],
    };
    policy(
        &mut s,
        ("a", "from-b"),
        ingress_policy(sel(&[]), vec![rule]),
    );
    assert!(ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 80), "b/client");
    assert!(
        ingress(&s, "fd00::2:3", "fd00::1:2", "udp", 9),
        "b/client over IPv6"
    );
    assert!(
        !ingress(&s, "10.0.2.4", "10.0.1.2", "tcp", 80),
        "a/client: not team y"
    );
    assert!(!ingress(&s, "10.9.9.9", "10.0.1.2", "tcp", 80), "no pod");
}

#[test]
fn pod_and_namespace_selector_together_need_both() {
    let mut s = cluster();
    pod(
        &mut s,
        ("b", "other"),
        "node-2",
        &["10.0.2.9"],
        &[("app", "other")],
    );
    let rule = PolicyRule {
        peers: vec![pods_peer(
            Some(sel(&[("team", "y")])),
            Some(sel(&[("app", "client")])),
        )],
        ports: vec![tcp(80)],
    };
    policy(
        &mut s,
        ("a", "clients-of-b"),
        ingress_policy(sel(&[("app", "web")]), vec![rule]),
    );
    assert!(ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 80), "b/client");
    assert!(
        !ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 81),
        "other port"
    );
    assert!(
        !ingress(&s, "10.0.2.9", "10.0.1.2", "tcp", 80),
        "b/other: wrong pod"
    );
    assert!(
        !ingress(&s, "10.0.2.4", "10.0.1.2", "tcp", 80),
        "a/client: wrong namespace"
    );
    // A podSelector alone means the policy's namespace.
    let mut s = cluster();
    let rule = PolicyRule {
        peers: vec![pods_peer(None, Some(sel(&[("app", "client")])))],
        ports: vec![],
    };
    policy(
        &mut s,
        ("a", "own-clients"),
        ingress_policy(sel(&[]), vec![rule]),
    );
    assert!(ingress(&s, "10.0.2.4", "10.0.1.2", "tcp", 80), "a/client");
    assert!(!ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 80), "b/client");
}

#[test]
fn named_ports_resolve_on_each_destination_pod() {
    let mut s = cluster();
    let http = |port| ContainerPort {
        name: "http".into(),
        protocol: "TCP".into(),
        port,
    };
    s.pods.get_mut(&ObjectKey::new("a", "web")).unwrap().ports = vec![http(8080)];
    s.pods.get_mut(&ObjectKey::new("a", "db")).unwrap().ports = vec![http(9090)];
    let rule = PolicyRule {
        peers: vec![],
        ports: vec![PolicyPort {
            protocol: "TCP".into(),
            port: Some(PortRef::Name("http".into())),
            end_port: None,
        }],
    };
    policy(&mut s, ("a", "http"), ingress_policy(sel(&[]), vec![rule]));
    assert!(ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 8080));
    assert!(
        ingress(&s, "fd00::2:3", "fd00::1:2", "tcp", 8080),
        "IPv6 address of a/web"
    );
    assert!(
        !ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 9090),
        "db's http is not web's"
    );
    assert!(ingress(&s, "10.0.2.3", "10.0.1.3", "tcp", 9090));
    assert!(
        !ingress(&s, "10.0.2.3", "10.0.1.3", "udp", 9090),
        "the name is of TCP"
    );
}

#[test]
fn ip_block_except_is_carved_out() {
    let mut s = cluster();
    let rule = PolicyRule {
        peers: vec![
            PolicyPeer::IpBlock {
                cidr: "10.0.0.0/8".parse().unwrap(),
                except: vec!["10.0.2.0/24".parse().unwrap()],
            },
            // A pod inside the block: folded into it, not a conflicting element.
            pods_peer(Some(sel(&[("team", "x")])), None),
        ],
        ports: vec![],
    };
    policy(&mut s, ("a", "block"), ingress_policy(sel(&[]), vec![rule]));
    assert!(ingress(&s, "10.7.0.1", "10.0.1.2", "tcp", 80));
    assert!(
        !ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 80),
        "in the except"
    );
    assert!(
        ingress(&s, "10.0.2.4", "10.0.1.2", "tcp", 80),
        "a/client, by its own peer"
    );
    assert!(!ingress(&s, "192.0.2.1", "10.0.1.2", "tcp", 80));
    let np = build(NODE, &s).unwrap();
    let peers = np
        .sets
        .iter()
        .find(|x| x.name.ends_with("_in0_peers_v4"))
        .unwrap();
    // No element inside another (nft refuses overlapping intervals).
    let keys: Vec<IpNet> = peers
        .elements
        .keys()
        .map(|k| {
            k.parse()
                .unwrap_or_else(|_| IpNet::from(k.parse::<IpAddr>().unwrap()))
        })
        .collect();
    for a in &keys {
        assert!(
            !keys.iter().any(|b| b != a && b.contains(a)),
            "{a} nests in {keys:?}"
        );
    }
}

#[test]
fn egress_to_dns_only() {
    let mut s = cluster();
    let dns = PolicyRule {
        peers: vec![pods_peer(
            Some(sel(&[("kubernetes.io/metadata.name", "kube-system")])),
            Some(sel(&[("k8s-app", "kube-dns")])),
        )],
        ports: vec![
            PolicyPort {
                protocol: "UDP".into(),
                port: Some(PortRef::Number(53)),
                end_port: None,
            },
            tcp(53),
        ],
    };
    let p = NetworkPolicy {
        pod_selector: sel(&[]),
        egress_isolation: true,
        egress: vec![dns],
        ..Default::default()
    };
    policy(&mut s, ("a", "dns-only"), p);
    assert!(egress(&s, "10.0.1.2", "10.0.2.53", "udp", 53));
    assert!(egress(&s, "10.0.1.2", "10.0.2.53", "tcp", 53));
    assert!(!egress(&s, "10.0.1.2", "10.0.2.53", "udp", 54));
    assert!(
        !egress(&s, "10.0.1.2", "10.0.2.3", "udp", 53),
        "not the DNS pod"
    );
    assert!(
        !egress(&s, "10.0.1.2", "1.1.1.1", "udp", 53),
        "not even outside"
    );
    assert!(!egress(&s, "fd00::1:2", "fd00::2:3", "tcp", 80), "IPv6 too");
    // Ingress is not isolated by an Egress-only policy.
    assert!(ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 80));
}

#[test]
fn end_port_ranges() {
    let mut s = cluster();
    let rule = PolicyRule {
        peers: vec![],
        ports: vec![PolicyPort {
            protocol: "TCP".into(),
            port: Some(PortRef::Number(8000)),
            end_port: Some(8100),
        }],
    };
    policy(&mut s, ("a", "range"), ingress_policy(sel(&[]), vec![rule]));
    for (port, ok) in [
        (7999, false),
        (8000, true),
        (8050, true),
        (8100, true),
        (8101, false),
    ] {
        assert_eq!(
            ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", port),
            ok,
            "{port}"
        );
    }
    assert!(!ingress(&s, "10.0.2.3", "10.0.1.2", "udp", 8050));
    assert!(!ingress(&s, "10.0.2.3", "10.0.1.2", "sctp", 8050));
}

#[test]
fn a_pod_selected_by_two_policies_gets_the_union() {
    let mut s = cluster();
    let from = |team: &str, port| PolicyRule {
        peers: vec![pods_peer(Some(sel(&[("team", team)])), None)],
        ports: vec![tcp(port)],
    };
    policy(
        &mut s,
        ("a", "x-80"),
        ingress_policy(sel(&[("app", "web")]), vec![from("x", 80)]),
    );
    policy(
        &mut s,
        ("a", "y-443"),
        ingress_policy(sel(&[]), vec![from("y", 443)]),
    );
    assert!(
        ingress(&s, "10.0.2.4", "10.0.1.2", "tcp", 80),
        "a/client by x-80"
    );
    assert!(
        ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 443),
        "b/client by y-443"
    );
    assert!(!ingress(&s, "10.0.2.4", "10.0.1.2", "tcp", 443));
    assert!(!ingress(&s, "10.0.2.3", "10.0.1.2", "tcp", 80));
    assert!(
        !ingress(&s, "10.0.2.4", "10.0.1.3", "tcp", 80),
        "db is only in y-443"
    );
    let np = build(NODE, &s).unwrap();
    let isolated = np
        .sets
        .iter()
        .find(|x| x.name == "np_isolated_ingress_v4")
        .unwrap();
    assert_eq!(
        isolated.elements["10.0.1.2"].comment,
        "NetworkPolicy a/x-80, NetworkPolicy a/y-443"
    );
}

#[test]
fn every_rule_and_element_names_its_policy() {
    let mut s = cluster();
    let rule = PolicyRule {
        peers: vec![pods_peer(None, Some(sel(&[])))],
        ports: vec![tcp(80)],
    };
    policy(&mut s, ("a", "all"), ingress_policy(sel(&[]), vec![rule]));
    let np = build(NODE, &s).unwrap();
    for set in &np.sets {
        for e in set.elements.values() {
            assert!(
                e.comment.contains("NetworkPolicy a/all"),
                "{}: {}",
                set.name,
                e.comment
            );
        }
    }
    for c in &np.chains {
        // The fixed rules (a pod to itself, per family; the final drop) say why instead.
        let (fixed, per_policy): (Vec<_>, Vec<_>) = c
            .rules
            .iter()
            .partition(|r| r.comment.starts_with("NetworkPolicy: "));
        assert_eq!(fixed.len(), 3, "{}", c.name);
        for r in per_policy {
            assert!(
                r.comment.starts_with("NetworkPolicy a/all"),
                "{}",
                r.comment
            );
        }
    }
}

#[test]
fn policy_ids_follow_the_key_and_survive_collisions() {
    let keys = [ObjectKey::new("a", "x"), ObjectKey::new("a", "y")];
    let ids = policy_ids(keys.iter(), |_| 7);
    assert_eq!(ids[&keys[0]], "np_000000000007");
    assert_eq!(ids[&keys[1]], "np_000000000008");
    let real = policy_ids(keys.iter(), |k| fnv1a64(k.to_string().into_bytes()));
    let alone = policy_ids(keys[1..].iter(), |k| fnv1a64(k.to_string().into_bytes()));
    assert_eq!(
        real[&keys[1]], alone[&keys[1]],
        "independent of the other policies"
    );
}
