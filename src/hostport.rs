//! hostPorts: a pod's port exposed on its node's addresses. The kubelet hands a pod's
//! `ports[].hostPort` to the runtime, which passes them to the plugin as the `portMappings`
//! capability (`runtimeConfig.portMappings`, [`crate::wire::host_ports`]); the agent keeps them
//! in its record of the attachment, and the planner turns them into DNAT map elements
//! (`plan::hostport`).

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The transport protocols a hostPort can carry (Kubernetes' `Protocol`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Parses Kubernetes' (`TCP`) or the runtime's (`tcp`) spelling.
    pub fn parse(s: &str) -> Option<Protocol> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// nft's spelling (`inet_proto` values).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str().to_ascii_uppercase())
    }
}

/// One hostPort of a pod: connections to `host_ip` (every address of the node when `None`)
/// on `host_port` go to the pod's `container_port`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HostPort {
    pub protocol: Protocol,
    pub host_port: u16,
    pub container_port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<IpAddr>,
}

impl HostPort {
    /// Whether both cannot be on one node: the same protocol and port on a common address
    /// (no `host_ip` is every address).
    pub fn conflicts_with(&self, other: &HostPort) -> bool {
        self.protocol == other.protocol
            && self.host_port == other.host_port
            && match (self.host_ip, other.host_ip) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    /// Whether the mapping applies to the pod's address `pod_ip`: a `host_ip` of the other
    /// family does not.
    pub fn applies_to(&self, pod_ip: IpAddr) -> bool {
        self.host_ip.is_none_or(|h| h.is_ipv6() == pod_ip.is_ipv6())
    }
}

impl fmt::Display for HostPort {
    /// `8080/TCP -> 80` or `192.0.2.1:8080/TCP -> 80`, as users write them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host_ip {
            Some(IpAddr::V6(ip)) => write!(f, "[{ip}]:")?,
            Some(IpAddr::V4(ip)) => write!(f, "{ip}:")?,
            None => {}
        }
        write!(
            f,
            "{}/{} -> {}",
            self.host_port, self.protocol, self.container_port
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(protocol: Protocol, port: u16, ip: Option<&str>) -> HostPort {
        HostPort {
            protocol,
            host_port: port,
            container_port: 80,
            host_ip: ip.map(|s| s.parse().unwrap()),
        }
    }

    #[test]
    fn conflicts_need_protocol_port_and_a_common_address() {
        use Protocol::*;
        let any = hp(Tcp, 8080, None);
        assert!(any.conflicts_with(&hp(Tcp, 8080, None)));
        assert!(any.conflicts_with(&hp(Tcp, 8080, Some("192.0.2.1"))));
        assert!(hp(Tcp, 8080, Some("192.0.2.1")).conflicts_with(&any));
        assert!(!any.conflicts_with(&hp(Udp, 8080, None)));
        assert!(!any.conflicts_with(&hp(Tcp, 8081, None)));
        assert!(!hp(Tcp, 8080, Some("192.0.2.1")).conflicts_with(&hp(
            Tcp,
            8080,
            Some("192.0.2.2")
        )));
        assert!(hp(Sctp, 9, Some("2001:db8::1")).conflicts_with(&hp(Sctp, 9, Some("2001:db8::1"))));
    }

    #[test]
    fn a_host_ip_limits_the_mapping_to_its_family() {
        let v4: IpAddr = "10.1.0.5".parse().unwrap();
        let v6: IpAddr = "fd00::5".parse().unwrap();
        let any = hp(Protocol::Tcp, 8080, None);
        assert!(any.applies_to(v4) && any.applies_to(v6));
        let only4 = hp(Protocol::Tcp, 8080, Some("192.0.2.1"));
        assert!(only4.applies_to(v4) && !only4.applies_to(v6));
    }

    #[test]
    fn display_and_protocol_spellings() {
        assert_eq!(hp(Protocol::Udp, 53, None).to_string(), "53/UDP -> 80");
        assert_eq!(
            hp(Protocol::Tcp, 8080, Some("2001:db8::1")).to_string(),
            "[2001:db8::1]:8080/TCP -> 80"
        );
        assert_eq!(Protocol::parse("TCP"), Some(Protocol::Tcp));
        assert_eq!(Protocol::parse("sctp"), Some(Protocol::Sctp));
        assert_eq!(Protocol::parse("icmp"), None);
    }
}
