//! The rules for a `networking.k8s.io/v1` NetworkPolicy: what the API server checks, for the
//! policies that never passed it (standalone mode's YAML), plus `policyTypes` values Lace
//! cannot tell the meaning of. A policy that breaks one is left out by [`super::admit`].

use super::{check_selector, Errors, ValidationError};
use crate::state::{NetworkPolicy, PolicyPeer, PolicyRule, PortRef};

/// Protocols a NetworkPolicy port may name.
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];

/// Checks NetworkPolicy `key` (`namespace/name`).
pub(super) fn check_network_policy(
    key: &str,
    spec: &NetworkPolicy,
    out: &mut Vec<ValidationError>,
) {
    let mut e = Errors::new("NetworkPolicy", key, out);
    for t in &spec.unknown_policy_types {
        e.push(
            "spec.policyTypes",
            format!("unknown policy type {t:?}: use Ingress and/or Egress"),
        );
    }
    check_selector("spec.podSelector", &spec.pod_selector, &mut e);
    for (i, r) in spec.ingress.iter().enumerate() {
        check_rule(&format!("spec.ingress[{i}]"), "from", r, &mut e);
    }
    for (i, r) in spec.egress.iter().enumerate() {
        check_rule(&format!("spec.egress[{i}]"), "to", r, &mut e);
    }
}

fn check_rule(path: &str, peers: &str, rule: &PolicyRule, e: &mut Errors<'_>) {
    for (j, peer) in rule.peers.iter().enumerate() {
        let at = format!("{path}.{peers}[{j}]");
        match peer {
            PolicyPeer::Pods {
                namespace_selector: None,
                pod_selector: None,
            } => e.push(
                at,
                "a peer needs a podSelector, a namespaceSelector or an ipBlock (`{}` selectors match everything)",
            ),
            PolicyPeer::Pods {
                namespace_selector,
                pod_selector,
            } => {
                if let Some(s) = namespace_selector {
                    check_selector(&format!("{at}.namespaceSelector"), s, e);
                }
                if let Some(s) = pod_selector {
                    check_selector(&format!("{at}.podSelector"), s, e);
                }
            }
            PolicyPeer::IpBlock { cidr, except } => {
                for (k, x) in except.iter().enumerate() {
                    if !cidr.contains(x) || x == cidr {
                        e.push(
                            format!("{at}.ipBlock.except[{k}]"),
                            format!("{x} is not strictly inside the block's cidr {cidr}"),
                        );
                    }
                }
            }
        }
    }
    for (j, p) in rule.ports.iter().enumerate() {
        let at = format!("{path}.ports[{j}]");
        if !PROTOCOLS.contains(&p.protocol.as_str()) {
            e.push(
                format!("{at}.protocol"),
                format!(
                    "unsupported protocol {:?}: use TCP, UDP or SCTP",
                    p.protocol
                ),
            );
        }
        match (&p.port, p.end_port) {
            (Some(PortRef::Name(name)), _) if name.is_empty() => {
                e.push(format!("{at}.port"), "a port name cannot be empty")
            }
            (Some(PortRef::Number(port)), Some(end)) if end < *port => e.push(
                format!("{at}.endPort"),
                format!("{end} is below port {port}: endPort ends the range port..endPort"),
            ),
            (Some(PortRef::Name(_)) | None, Some(_)) => e.push(
                format!("{at}.endPort"),
                "endPort needs a numeric port to start the range; remove it or set port to a number",
            ),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ClusterState, ObjectKey, PolicyPort};

    fn port(protocol: &str, port: Option<PortRef>, end_port: Option<u16>) -> PolicyPort {
        PolicyPort {
            protocol: protocol.into(),
            port,
            end_port,
        }
    }

    fn messages(spec: NetworkPolicy) -> Vec<String> {
        let mut out = Vec::new();
        check_network_policy("ns/p", &spec, &mut out);
        out.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn every_rule_has_a_failing_example_with_its_message() {
        let rule = |peers: Vec<PolicyPeer>, ports: Vec<PolicyPort>| PolicyRule { peers, ports };
        let cases: Vec<(NetworkPolicy, &str)> = vec![
            (
                NetworkPolicy {
                    unknown_policy_types: vec!["Both".into()],
                    ..Default::default()
                },
                "NetworkPolicy/ns/p: spec.policyTypes: unknown policy type \"Both\": use Ingress and/or Egress",
            ),
            (
                NetworkPolicy {
                    ingress: vec![rule(
                        vec![PolicyPeer::Pods { namespace_selector: None, pod_selector: None }],
                        vec![],
                    )],
                    ..Default::default()
                },
                "NetworkPolicy/ns/p: spec.ingress[0].from[0]: a peer needs a podSelector, a namespaceSelector or an ipBlock (`{}` selectors match everything)",
            ),
            (
                NetworkPolicy {
                    egress: vec![rule(
                        vec![PolicyPeer::IpBlock {
                            cidr: "10.0.0.0/16".parse().unwrap(),
                            except: vec!["10.1.0.0/24".parse().unwrap()],
                        }],
                        vec![],
                    )],
                    ..Default::default()
                },
                "NetworkPolicy/ns/p: spec.egress[0].to[0].ipBlock.except[0]: 10.1.0.0/24 is not strictly inside the block's cidr 10.0.0.0/16",
            ),
            (
                NetworkPolicy {
                    ingress: vec![rule(vec![], vec![port("ICMP", None, None)])],
                    ..Default::default()
                },
                "NetworkPolicy/ns/p: spec.ingress[0].ports[0].protocol: unsupported protocol \"ICMP\": use TCP, UDP or SCTP",
            ),
            (
                NetworkPolicy {
                    ingress: vec![rule(vec![], vec![port("TCP", Some(PortRef::Number(90)), Some(80))])],
                    ..Default::default()
                },
                "NetworkPolicy/ns/p: spec.ingress[0].ports[0].endPort: 80 is below port 90: endPort ends the range port..endPort",
            ),
            (
                NetworkPolicy {
                    egress: vec![rule(vec![], vec![port("TCP", Some(PortRef::Name("http".into())), Some(80))])],
                    ..Default::default()
                },
                "NetworkPolicy/ns/p: spec.egress[0].ports[0].endPort: endPort needs a numeric port to start the range; remove it or set port to a number",
            ),
            (
                NetworkPolicy {
                    egress: vec![rule(vec![], vec![port("TCP", Some(PortRef::Name(String::new())), None)])],
                    ..Default::default()
                },
                "NetworkPolicy/ns/p: spec.egress[0].ports[0].port: a port name cannot be empty",
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(messages(spec), [want]);
        }
        let fine = NetworkPolicy {
            ingress: vec![rule(
                vec![PolicyPeer::IpBlock {
                    cidr: "10.0.0.0/8".parse().unwrap(),
                    except: vec!["10.1.0.0/16".parse().unwrap()],
                }],
                vec![port("SCTP", Some(PortRef::Number(80)), Some(80))],
            )],
            ..Default::default()
        };
        assert!(messages(fine).is_empty());
    }

    #[test]
    fn admit_leaves_out_a_bad_network_policy_and_names_it() {
        let mut state = ClusterState::default();
        let bad = NetworkPolicy {
            unknown_policy_types: vec!["x".into()],
            ..Default::default()
        };
        state
            .network_policies
            .insert(ObjectKey::new("ns", "bad"), bad);
        state
            .network_policies
            .insert(ObjectKey::new("ns", "good"), NetworkPolicy::default());
        let (admitted, rejected) = super::super::admit(state);
        assert_eq!(
            admitted.network_policies.keys().collect::<Vec<_>>(),
            [&ObjectKey::new("ns", "good")]
        );
        assert_eq!(
            (rejected[0].kind, rejected[0].name.as_str()),
            ("NetworkPolicy", "ns/bad")
        );
    }
}
