//! The `networking.k8s.io/v1` NetworkPolicy body: the fields Lace reads, converted to the
//! kube-free [`NetworkPolicy`] of the cluster state.
//!
//! Only what cannot be represented at all is an [`ObjectError`] here (an address that does not
//! parse, a port number out of range); what parses but makes no sense (`endPort` below
//! `port`, an `except` outside its `cidr`, an unknown protocol) is the validator's, which
//! leaves the policy out and says why ([`crate::validate::admit`]).

use ipnet::IpNet;
use serde::Deserialize;

use super::{null_as_empty, Body, Kind, Meta, Object, ObjectError};
use crate::api::LabelSelector;
use crate::state::{NetworkPolicy, PolicyPeer, PolicyPort, PolicyRule, PortRef};

/// A NetworkPolicy: only its spec matters.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NetworkPolicyBody {
    #[serde(default)]
    pub spec: NetworkPolicySpecBody,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpecBody {
    #[serde(default)]
    pub pod_selector: LabelSelector,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub policy_types: Vec<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub ingress: Vec<IngressRuleBody>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub egress: Vec<EgressRuleBody>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct IngressRuleBody {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub from: Vec<PeerBody>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub ports: Vec<PolicyPortBody>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct EgressRuleBody {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub to: Vec<PeerBody>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub ports: Vec<PolicyPortBody>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerBody {
    #[serde(default)]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default)]
    pub ip_block: Option<IpBlockBody>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct IpBlockBody {
    pub cidr: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub except: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyPortBody {
    #[serde(default = "super::tcp")]
    pub protocol: String,
    #[serde(default)]
    pub port: Option<IntOrString>,
    #[serde(default)]
    pub end_port: Option<i64>,
}

/// Kubernetes' IntOrString.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    Int(i64),
    String(String),
}

impl Body for NetworkPolicyBody {
    const KIND: Kind = Kind::NetworkPolicy;
    fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError> {
        let spec = self.spec;
        let ingress = spec
            .ingress
            .into_iter()
            .enumerate()
            .map(|(i, r)| rule(&format!("spec.ingress[{i}]"), "from", r.from, r.ports))
            .collect::<Result<Vec<_>, _>>()?;
        let egress = spec
            .egress
            .into_iter()
            .enumerate()
            .map(|(i, r)| rule(&format!("spec.egress[{i}]"), "to", r.to, r.ports))
            .collect::<Result<Vec<_>, _>>()?;
        // The API server's defaulting, so a policy from a YAML file means what it would mean
        // once applied.
        let (ingress_isolation, egress_isolation) = if spec.policy_types.is_empty() {
            (true, !egress.is_empty())
        } else {
            (
                spec.policy_types.iter().any(|t| t == "Ingress"),
                spec.policy_types.iter().any(|t| t == "Egress"),
            )
        };
        let unknown_policy_types = spec
            .policy_types
            .into_iter()
            .filter(|t| t != "Ingress" && t != "Egress")
            .collect();
        let policy = NetworkPolicy {
            pod_selector: spec.pod_selector,
            ingress_isolation,
            egress_isolation,
            ingress,
            egress,
            unknown_policy_types,
        };
        Ok(Some(Object::NetworkPolicy(meta.key(), policy)))
    }
}

fn rule(
    path: &str,
    peers_field: &str,
    peers: Vec<PeerBody>,
    ports: Vec<PolicyPortBody>,
) -> Result<PolicyRule, ObjectError> {
    let peers = peers
        .into_iter()
        .enumerate()
        .map(|(j, p)| peer(&format!("{path}.{peers_field}[{j}]"), p))
        .collect::<Result<_, _>>()?;
    let ports = ports
        .into_iter()
        .enumerate()
        .map(|(j, p)| port(&format!("{path}.ports[{j}]"), p))
        .collect::<Result<_, _>>()?;
    Ok(PolicyRule { peers, ports })
}

fn peer(path: &str, p: PeerBody) -> Result<PolicyPeer, ObjectError> {
    match p.ip_block {
        // The API server rejects an ipBlock beside a selector; so does the validator (as
        // the peer with neither), by the kind of peer this becomes.
        Some(block) if p.pod_selector.is_none() && p.namespace_selector.is_none() => {
            let cidr = parse_cidr(&format!("{path}.ipBlock.cidr"), &block.cidr)?;
            let except = block
                .except
                .iter()
                .enumerate()
                .map(|(k, e)| parse_cidr(&format!("{path}.ipBlock.except[{k}]"), e))
                .collect::<Result<_, _>>()?;
            Ok(PolicyPeer::IpBlock { cidr, except })
        }
        Some(_) => Err(ObjectError::PeerMixesIpBlock {
            field: path.to_string(),
        }),
        None => Ok(PolicyPeer::Pods {
            namespace_selector: p.namespace_selector,
            pod_selector: p.pod_selector,
        }),
    }
}

fn port(path: &str, p: PolicyPortBody) -> Result<PolicyPort, ObjectError> {
    let number = |field: String, n: i64| {
        u16::try_from(n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or(ObjectError::InvalidPort { field, value: n })
    };
    let port = match p.port {
        None => None,
        Some(IntOrString::Int(n)) => Some(PortRef::Number(number(format!("{path}.port"), n)?)),
        Some(IntOrString::String(name)) => Some(PortRef::Name(name)),
    };
    let end_port = p
        .end_port
        .map(|n| number(format!("{path}.endPort"), n))
        .transpose()?;
    Ok(PolicyPort {
        protocol: p.protocol,
        port,
        end_port,
    })
}

fn parse_cidr(field: &str, s: &str) -> Result<IpNet, ObjectError> {
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| ObjectError::InvalidCidr {
            field: field.to_string(),
            value: s.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ObjectKey;

    fn convert(spec: serde_json::Value) -> Result<NetworkPolicy, ObjectError> {
        let body: NetworkPolicyBody =
            serde_json::from_value(serde_json::json!({ "spec": spec })).unwrap();
        let meta = Meta {
            name: "np".into(),
            namespace: "ns".into(),
            labels: Default::default(),
        };
        match body.into_object(meta)? {
            Some(Object::NetworkPolicy(key, p)) => {
                assert_eq!(key, ObjectKey::new("ns", "np"));
                Ok(p)
            }
            other => panic!("not a NetworkPolicy: {other:?}"),
        }
    }

    #[test]
    fn policy_types_default_as_the_api_server_does() {
        let p = convert(serde_json::json!({"podSelector": {}})).unwrap();
        assert!(p.ingress_isolation && !p.egress_isolation);
        let p = convert(serde_json::json!({"podSelector": {}, "egress": [{}]})).unwrap();
        assert!(p.ingress_isolation && p.egress_isolation);
        let p = convert(serde_json::json!({"podSelector": {}, "policyTypes": ["Egress"]})).unwrap();
        assert!(!p.ingress_isolation && p.egress_isolation);
        let p =
            convert(serde_json::json!({"podSelector": {}, "policyTypes": ["Ingress", "Sideways"]}))
                .unwrap();
        assert_eq!(p.unknown_policy_types, ["Sideways"]);
    }

    #[test]
    fn peers_and_ports_read_every_form() {
        let p = convert(serde_json::json!({
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{
                "from": [
                    {"podSelector": {"matchLabels": {"role": "client"}}},
                    {"namespaceSelector": {}, "podSelector": {}},
                    {"ipBlock": {"cidr": "10.0.0.1/8", "except": ["10.1.0.0/16"]}}
                ],
                "ports": [{"port": 80}, {"protocol": "UDP", "port": "dns"},
                          {"protocol": "SCTP", "port": 9000, "endPort": 9100}, {}]
            }],
            "egress": null
        }))
        .unwrap();
        let r = &p.ingress[0];
        assert_eq!(r.peers.len(), 3);
        assert_eq!(
            r.peers[2],
            PolicyPeer::IpBlock {
                cidr: "10.0.0.0/8".parse().unwrap(),
                except: vec!["10.1.0.0/16".parse().unwrap()]
            },
            "the cidr's host bits are cleared, as the API server's parser does"
        );
        assert_eq!(r.ports[0].protocol, "TCP");
        assert_eq!(r.ports[1].port, Some(PortRef::Name("dns".into())));
        assert_eq!(r.ports[2].end_port, Some(9100));
        assert_eq!(r.ports[3].port, None);
    }

    #[test]
    fn errors_name_the_field() {
        let bad_cidr = serde_json::json!({"ingress": [{"from": [{"ipBlock": {"cidr": "x"}}]}]});
        assert_eq!(
            convert(bad_cidr).unwrap_err().to_string(),
            "spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR \"x\""
        );
        let bad_port = serde_json::json!({"egress": [{"ports": [{"port": 70000}]}]});
        assert_eq!(
            convert(bad_port).unwrap_err().to_string(),
            "spec.egress[0].ports[0].port: 70000 is not a port number (1-65535)"
        );
        let mixed = serde_json::json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]});
        assert!(convert(mixed)
            .unwrap_err()
            .to_string()
            .starts_with("spec.egress[0].to[0]: an ipBlock peer"));
    }
}
