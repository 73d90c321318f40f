//! `lace-agent policy --pod`: for one pod, which NetworkPolicies select it and what they
//! allow, in words, resolved against the cluster state (the peer pods, named ports on the
//! pod).

use std::fmt::Write as _;

use super::{named_ports, numeric_ports, peer_pods, resolve_named, selects, Direction};
use crate::api::{LabelSelector, SelectorOperator};
use crate::state::{ClusterState, ObjectKey, Pod, PolicyPeer, PolicyRule};

/// The NetworkPolicy part of a pod's explanation: per direction, whether it is isolated and
/// by which policies, then each rule of those policies. Lines start with `ingress` or
/// `egress`, so scripts can pick them.
pub fn explain_pod(state: &ClusterState, key: &ObjectKey, pod: &Pod) -> String {
    let mut out = String::new();
    for d in Direction::BOTH {
        let policies: Vec<_> = state
            .network_policies
            .iter()
            .filter(|(k, p)| d.isolates(p) && selects(k, p, key, pod))
            .collect();
        if policies.is_empty() {
            let _ = writeln!(
                out,
                "{} not isolated: every connection its Networks allow",
                d.field()
            );
            continue;
        }
        let names: Vec<String> = policies.iter().map(|(k, _)| k.to_string()).collect();
        let _ = writeln!(
            out,
            "{} isolated by {}: only what these allow (and its Networks too)",
            d.field(),
            names.join(", ")
        );
        for (k, p) in &policies {
            let rules = d.rules(p);
            if rules.is_empty() {
                let _ = writeln!(out, "{}   {k}: allows nothing", d.field());
            }
            for (j, rule) in rules.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "{}   {k} {}[{j}]: {} {} on {}",
                    d.field(),
                    d.field(),
                    match d {
                        Direction::Ingress => "from",
                        Direction::Egress => "to",
                    },
                    peers(state, &k.namespace, rule),
                    ports(d, rule, pod)
                );
            }
        }
    }
    out
}

fn peers(state: &ClusterState, namespace: &str, rule: &PolicyRule) -> String {
    if rule.peers.is_empty() {
        return "everywhere".into();
    }
    let parts: Vec<String> = rule
        .peers
        .iter()
        .map(|peer| match peer {
            PolicyPeer::IpBlock { cidr, except } if except.is_empty() => format!("{cidr}"),
            PolicyPeer::IpBlock { cidr, except } => {
                let except: Vec<String> = except.iter().map(ToString::to_string).collect();
                format!("{cidr} except {}", except.join(" "))
            }
            PolicyPeer::Pods {
                namespace_selector,
                pod_selector,
            } => {
                let pods: Vec<String> = peer_pods(state, namespace, peer)
                    .map(|(k, _)| k.to_string())
                    .collect();
                let ns = match namespace_selector {
                    None => format!("namespace {namespace}"),
                    Some(s) => format!("namespaces {}", selector(s)),
                };
                let which = pod_selector.as_ref().map_or("all".into(), selector);
                format!("pods {which} of {ns} [{}]", pods.join(" "))
            }
        })
        .collect();
    parts.join("; ")
}

/// The rule's ports; named ports of an ingress rule resolved on `pod` itself.
fn ports(d: Direction, rule: &PolicyRule, pod: &Pod) -> String {
    if rule.ports.is_empty() {
        return "every port".into();
    }
    let mut parts: Vec<String> = numeric_ports(&rule.ports)
        .iter()
        .map(|r| match (r.lo, r.hi) {
            (0, u16::MAX) => format!("{} (every port)", r.protocol),
            (lo, hi) if lo == hi => format!("{} {lo}", r.protocol),
            (lo, hi) => format!("{} {lo}-{hi}", r.protocol),
        })
        .collect();
    for (protocol, name) in named_ports(&rule.ports) {
        parts.push(match d {
            Direction::Ingress => match resolve_named(pod, protocol, name) {
                Some(port) => format!("{protocol} {name} (= {port} here)"),
                None => format!("{protocol} {name} (not a port of this pod: nothing)"),
            },
            Direction::Egress => format!("{protocol} {name} (as each peer names it)"),
        });
    }
    parts.join(", ")
}

/// A label selector as `{k=v, key In (a,b)}`; `{}` matches everything.
fn selector(s: &LabelSelector) -> String {
    let mut parts: Vec<String> = s
        .match_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for r in &s.match_expressions {
        let op = match r.operator {
            SelectorOperator::In => "In",
            SelectorOperator::NotIn => "NotIn",
            SelectorOperator::Exists => "Exists",
            SelectorOperator::DoesNotExist => "DoesNotExist",
        };
        if r.values.is_empty() {
            parts.push(format!("{} {op}", r.key));
        } else {
            parts.push(format!("{} {op} ({})", r.key, r.values.join(",")));
        }
    }
    format!("{{{}}}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ContainerPort, NetworkPolicy, PolicyPort, PortRef};

    #[test]
    fn says_who_isolates_the_pod_and_what_each_rule_allows() {
        let mut s = ClusterState::default();
        let key = ObjectKey::new("a", "web");
        let pod = Pod {
            labels: [("app".to_string(), "web".to_string())].into(),
            node: "n".into(),
            ips: vec!["10.0.0.2".parse().unwrap()],
            ports: vec![ContainerPort {
                name: "http".into(),
                protocol: "TCP".into(),
                port: 8080,
            }],
            ..Default::default()
        };
        s.pods.insert(key.clone(), pod.clone());
        let rule = PolicyRule {
            peers: vec![
                PolicyPeer::Pods {
                    namespace_selector: None,
                    pod_selector: Some(LabelSelector::default()),
                },
                PolicyPeer::IpBlock {
                    cidr: "10.0.0.0/8".parse().unwrap(),
                    except: vec!["10.1.0.0/16".parse().unwrap()],
                },
            ],
            ports: vec![
                PolicyPort {
                    protocol: "TCP".into(),
                    port: Some(PortRef::Name("http".into())),
                    end_port: None,
                },
                PolicyPort {
                    protocol: "UDP".into(),
                    port: Some(PortRef::Number(53)),
                    end_port: Some(60),
                },
            ],
        };
        s.network_policies.insert(
            ObjectKey::new("a", "web"),
            NetworkPolicy {
                ingress_isolation: true,
                ingress: vec![rule],
                ..Default::default()
            },
        );
        assert_eq!(
            explain_pod(&s, &key, &pod),
            "ingress isolated by a/web: only what these allow (and its Networks too)\n\
             ingress   a/web ingress[0]: from pods {} of namespace a [a/web]; 10.0.0.0/8 except 10.1.0.0/16 on UDP 53-60, TCP http (= 8080 here)\n\
             egress not isolated: every connection its Networks allow\n"
        );
    }
}
