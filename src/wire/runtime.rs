//! The runtime's capability arguments (`runtimeConfig`) Lace's conflist declares, as the CNI
//! conventions spell them or with PascalCase keys as containerd 2.x sends them (go-cni's types
//! have no JSON tags; Go's decoder, which the reference plugins use, ignores case):
//! - the pod's hostPorts as `portMappings`: `{"hostPort": 8080, "containerPort": 80,
//!   "protocol": "tcp", "hostIP": ""}`;
//! - its bandwidth as `bandwidth`: `{"ingressRate": 10000000, "ingressBurst": 4294967295,
//!   "egressRate": 0, "egressBurst": 0}` (rates in bits per second, bursts in bits; a rate of
//!   0 or none leaves that direction unshaped).

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::bandwidth::{Bandwidth, Limit, MAX_RATE, MIN_RATE};
use crate::hostport::{HostPort, Protocol};

/// The capability key of hostPorts (in the conflist's `capabilities` and in `runtimeConfig`).
pub const PORT_MAPPINGS: &str = "portMappings";
/// The capability key of bandwidth shaping.
pub const BANDWIDTH: &str = "bandwidth";

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

/// Why `runtimeConfig.bandwidth` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BandwidthError {
    #[error("runtimeConfig.bandwidth is not an object: {0}")]
    Shape(String),
    #[error("runtimeConfig.bandwidth.{field} is {value}: {why}; {fix}")]
    Field {
        field: &'static str,
        value: String,
        why: String,
        fix: String,
    },
}

/// One entry, in the CNI conventions' camelCase or in the PascalCase containerd 2.x sends
/// (go-cni's `PortMapping`).
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

/// `runtimeConfig.bandwidth`, either spelling (go-cni's `BandWidth`); numbers are checked by
/// [`bandwidth`], so a bad one is named.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Shaping {
    #[serde(default, alias = "IngressRate")]
    ingress_rate: Value,
    #[serde(default, alias = "IngressBurst")]
    ingress_burst: Value,
    #[serde(default, alias = "EgressRate")]
    egress_rate: Value,
    #[serde(default, alias = "EgressBurst")]
    egress_burst: Value,
}

/// What `config` (the whole configuration the runtime passed) asks the pod's traffic to be
/// shaped to: `None` without `runtimeConfig.bandwidth` or with no rate in it. A rate of 0 or
/// none leaves its direction unshaped (and its burst unread); a rate must be within what
/// Kubernetes accepts in the annotations ([`MIN_RATE`]`..=`[`MAX_RATE`]), a burst a
/// non-negative number of bits (0: none).
pub fn bandwidth(config: &Map<String, Value>) -> Result<Option<Bandwidth>, BandwidthError> {
    let Some(raw) = config
        .get("runtimeConfig")
        .and_then(|r| r.get(BANDWIDTH))
        .filter(|v| !v.is_null())
    else {
        return Ok(None);
    };
    // serde would read a list as the fields in order: only an object is one.
    let s: Shaping = raw
        .is_object()
        .then(|| serde_json::from_value(raw.clone()).ok())
        .flatten()
        .ok_or_else(|| BandwidthError::Shape(raw.to_string()))?;
    let ingress = limit(
        ("ingressRate", &s.ingress_rate),
        ("ingressBurst", &s.ingress_burst),
        "kubernetes.io/ingress-bandwidth",
    )?;
    let egress = limit(
        ("egressRate", &s.egress_rate),
        ("egressBurst", &s.egress_burst),
        "kubernetes.io/egress-bandwidth",
    )?;
    Ok(Bandwidth { ingress, egress }.any())
}

/// One direction: its rate and burst fields (name, value) and the pod annotation that sets
/// the rate.
fn limit(
    (rate_field, rate): (&'static str, &Value),
    (burst_field, burst): (&'static str, &Value),
    annotation: &str,
) -> Result<Option<Limit>, BandwidthError> {
    let rate_fix = || {
        format!(
            "fix the pod's {annotation} annotation (bits per second from 1k to 1P, e.g. \"10M\", \
             or remove it)"
        )
    };
    let Some(rate) = bits(rate_field, rate, rate_fix)? else {
        return Ok(None);
    };
    let out_of_range = match rate {
        r if r < MIN_RATE => "below 1 kbit/s, the least Kubernetes accepts",
        r if r > MAX_RATE => "above 1 Pbit/s, the most Kubernetes accepts",
        _ => {
            let burst_fix = || "the runtime sets it: fix the runtime's bandwidth settings".into();
            let burst = bits(burst_field, burst, burst_fix)?;
            return Ok(Some(Limit { rate, burst }));
        }
    };
    Err(BandwidthError::Field {
        field: rate_field,
        value: rate.to_string(),
        why: out_of_range.into(),
        fix: rate_fix(),
    })
}

/// A field's whole, non-negative number of bits (per second), `None` when absent or 0.
fn bits(
    field: &'static str,
    v: &Value,
    fix: impl Fn() -> String,
) -> Result<Option<u64>, BandwidthError> {
    if v.is_null() {
        return Ok(None);
    }
    let why = match v.as_u64() {
        Some(0) => return Ok(None),
        Some(n) => return Ok(Some(n)),
        None if v.as_i64().is_some() => "negative",
        None if v.is_number() => "not a whole number",
        None => "not a number",
    };
    Err(BandwidthError::Field {
        field,
        value: v.to_string(),
        why: why.into(),
        fix: fix(),
    })
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

    fn shaping(v: Value) -> Result<Option<Bandwidth>, BandwidthError> {
        bandwidth(
            json!({"runtimeConfig": {"bandwidth": v}})
                .as_object()
                .unwrap(),
        )
    }

    #[test]
    fn bandwidth_in_either_spelling() {
        let want = Bandwidth {
            ingress: Some(Limit {
                rate: 10_000_000,
                burst: Some(4_294_967_295),
            }),
            egress: Some(Limit {
                rate: 20_000_000,
                burst: None,
            }),
        };
        // CRI-O and the CNI conventions.
        let camel = json!({"ingressRate": 10_000_000, "ingressBurst": 4_294_967_295_u64,
                           "egressRate": 20_000_000, "egressBurst": 0});
        assert_eq!(shaping(camel).unwrap(), Some(want));
        // containerd 2.x (go-cni's BandWidth, no JSON tags).
        let pascal = json!({"IngressRate": 10_000_000, "IngressBurst": 4_294_967_295_u64,
                            "EgressRate": 20_000_000, "EgressBurst": 0});
        assert_eq!(shaping(pascal).unwrap(), Some(want));
    }

    #[test]
    fn no_rate_is_no_shaping() {
        for v in [
            json!({}),
            json!({"runtimeConfig": {}}),
            json!({"runtimeConfig": {"bandwidth": null}}),
            json!({"runtimeConfig": {"bandwidth": {}}}),
            // A burst without a rate shapes nothing, and is not read.
            json!({"runtimeConfig": {"bandwidth": {"ingressRate": 0, "ingressBurst": -1,
                                                   "EgressBurst": 4_294_967_295_u64}}}),
        ] {
            assert_eq!(bandwidth(v.as_object().unwrap()).unwrap(), None, "{v}");
        }
        let one = shaping(json!({"egressRate": 1000})).unwrap().unwrap();
        assert_eq!(one.ingress, None);
        assert_eq!(one.egress.map(|l| l.rate), Some(1000));
    }

    #[test]
    fn bad_bandwidth_is_named_with_the_fix() {
        let cases = [
            (json!([1, 2]), "runtimeConfig.bandwidth is not an object"),
            (
                json!({"ingressRate": -5}),
                "runtimeConfig.bandwidth.ingressRate is -5: negative; fix the pod's \
                 kubernetes.io/ingress-bandwidth annotation",
            ),
            (
                json!({"EgressRate": 999}),
                "bandwidth.egressRate is 999: below 1 kbit/s",
            ),
            (
                json!({"egressRate": 2_000_000_000_000_000_u64}),
                "above 1 Pbit/s, the most Kubernetes accepts; fix the pod's \
                 kubernetes.io/egress-bandwidth annotation",
            ),
            (
                json!({"ingressRate": 1.5e6}),
                "is 1500000.0: not a whole number",
            ),
            (json!({"ingressRate": "10M"}), "is \"10M\": not a number"),
            (
                json!({"ingressRate": 10_000_000, "ingressBurst": -1}),
                "ingressBurst is -1: negative; the runtime sets it",
            ),
        ];
        for (v, want) in cases {
            let e = shaping(v.clone()).unwrap_err();
            assert!(e.to_string().contains(want), "{v}: {e}");
        }
    }
}
