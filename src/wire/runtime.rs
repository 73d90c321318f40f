//! The runtime's capability arguments (`runtimeConfig`) Lace's conflist declares: the pod's
//! hostPorts as `portMappings`: `{"hostPort": 8080, "containerPort": 80, "protocol": "tcp",
//! "hostIP": ""}` as the CNI conventions spell them, or with PascalCase keys as containerd 2.x
//! sends them.

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::hostport::{HostPort, Protocol};

/// The capability key of hostPorts (in the conflist's `capabilities` and in `runtimeConfig`).
pub const PORT_MAPPINGS: &str = "portMappings";

/// Why `runtimeConfig.portMappings` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PortMappingError {
    #[error("runtimeConfig.portMappings is not a list of objects: {0}")]
    Shape(#[source] serde_json::Error),
    #[error("runtimeConfig.portMappings[{index}] ({entry}): {why}")]
    Entry {
        index: usize,
        entry: String,
        why: String,
    },
    #[error(
        "runtimeConfig.portMappings maps {first} and {second}: one host port and protocol can go \
         to one container port only (fix the pod's ports[].hostPort)"
    )]
    Clash { first: String, second: String },
}

/// One entry, in the CNI conventions' camelCase or in the PascalCase containerd 2.x sends
/// (go-cni's `PortMapping` has no JSON tags; Go's decoder, which the reference `portmap`
/// plugin uses, ignores case).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    #[serde(alias = "HostPort")]
    host_port: i64,
    #[serde(alias = "ContainerPort")]
    container_port: i64,
    #[serde(default, alias = "Protocol")]
    protocol: String,
    #[serde(rename = "hostIP", alias = "HostIP", default)]
    host_ip: String,
}

/// The hostPorts in `config` (the whole configuration the runtime passed): none when it has no
/// `runtimeConfig.portMappings`. Identical entries count once.
pub fn host_ports(config: &Map<String, Value>) -> Result<Vec<HostPort>, PortMappingError> {
    let Some(list) = config
        .get("runtimeConfig")
        .and_then(|r| r.get(PORT_MAPPINGS))
        .filter(|v| !v.is_null())
    else {
        return Ok(Vec::new());
    };
    let entries: Vec<Value> =
        serde_json::from_value(list.clone()).map_err(PortMappingError::Shape)?;
    let mut out: BTreeSet<HostPort> = BTreeSet::new();
    for (index, raw) in entries.into_iter().enumerate() {
        let bad = |why: String| PortMappingError::Entry {
            index,
            entry: raw.to_string(),
            why,
        };
        let e: Entry = serde_json::from_value(raw.clone()).map_err(|e| bad(e.to_string()))?;
        let port = |what: &str, p: i64| {
            u16::try_from(p)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad(format!("{what} {p} is not a port (1 to 65535)")))
        };
        let protocol = if e.protocol.is_empty() {
            Protocol::Tcp // Kubernetes' default
        } else {
            Protocol::parse(&e.protocol).ok_or_else(|| {
                bad(format!(
                    "protocol {:?} is not one of TCP, UDP, SCTP",
                    e.protocol
                ))
            })?
        };
        let host_ip = match e.host_ip.as_str() {
            "" => None,
            s => {
                let ip: IpAddr = s
                    .parse()
                    .map_err(|_| bad(format!("hostIP {s:?} is not an IP address")))?;
                (!ip.is_unspecified()).then_some(ip)
            }
        };
        let hp = HostPort {
            protocol,
            host_port: port("hostPort", e.host_port)?,
            container_port: port("containerPort", e.container_port)?,
            host_ip,
        };
        if let Some(first) = out.iter().find(|o| **o != hp && o.conflicts_with(&hp)) {
            return Err(PortMappingError::Clash {
                first: first.to_string(),
                second: hp.to_string(),
            });
        }
        out.insert(hp);
    }
    Ok(out.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Vec<HostPort>, PortMappingError> {
        host_ports(v.as_object().unwrap())
    }

    #[test]
    fn containerd_entries_become_host_ports() {
        let got = parse(json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""},
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "192.0.2.1"},
            {"hostPort": 9000, "containerPort": 9000, "protocol": "SCTP", "hostIP": "::"},
            {"hostPort": 7000, "containerPort": 7001},
            // containerd 2.x (go-cni, seen on the real cluster)
            {"ContainerPort": 8080, "HostIP": "", "HostPort": 18080, "Protocol": "tcp"}
        ]}}))
        .unwrap();
        let want = |p, h, c, ip: Option<&str>| HostPort {
            protocol: p,
            host_port: h,
            container_port: c,
            host_ip: ip.map(|s| s.parse().unwrap()),
        };
        assert_eq!(
            got,
            vec![
                want(Protocol::Tcp, 7000, 7001, None),
                want(Protocol::Tcp, 8080, 80, None),
                want(Protocol::Tcp, 18080, 8080, None),
                want(Protocol::Udp, 5353, 53, Some("192.0.2.1")),
                want(Protocol::Sctp, 9000, 9000, None),
            ]
        );
    }

    #[test]
    fn absent_or_null_or_empty_is_none() {
        for v in [
            json!({}),
            json!({"runtimeConfig": {}}),
            json!({"runtimeConfig": {"portMappings": null}}),
            json!({"runtimeConfig": {"portMappings": []}}),
        ] {
            assert_eq!(parse(v).unwrap(), vec![]);
        }
    }

    #[test]
    fn bad_entries_are_named_with_the_fix() {
        let cases = [
            (json!("8080"), "not a list of objects"),
            (
                json!([{"hostPort": 0, "containerPort": 80}]),
                "hostPort 0 is not a port",
            ),
            (
                json!([{"hostPort": 70000, "containerPort": 80}]),
                "hostPort 70000",
            ),
            (
                json!([{"hostPort": 80, "containerPort": -1}]),
                "containerPort -1",
            ),
            (
                json!([{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]),
                "\"icmp\" is not one of TCP, UDP, SCTP",
            ),
            (
                json!([{"hostPort": 80, "containerPort": 80, "hostIP": "node-1"}]),
                "hostIP \"node-1\" is not an IP address",
            ),
            (json!([{"containerPort": 80}]), "portMappings[0]"),
            (
                json!([{"hostPort": 80, "containerPort": 80}, {"hostPort": 80, "containerPort": 81, "hostIP": "192.0.2.1"}]),
                "maps 80/TCP -> 80 and 192.0.2.1:80/TCP -> 81",
            ),
        ];
        for (list, want) in cases {
            let e = parse(json!({"runtimeConfig": {"portMappings": list}})).unwrap_err();
            assert!(e.to_string().contains(want), "{list}: {e}");
        }
    }
}
