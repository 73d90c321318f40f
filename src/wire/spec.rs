//! The CNI spec 1.1.0's own objects besides the configuration: the versions and the `VERSION`
//! answer, the error object, and the result of `ADD` (interfaces, addresses, routes, DNS).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------------------------

/// A CNI specification version. Lace's own network speaks [`CniVersion::SUPPORTED`]; the
/// `loopback` plugin the same binary also serves speaks every version ([`CniVersion::ALL`]),
/// as the reference plugin does (containerd configures it as 0.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CniVersion {
    /// 0.1.0: results are `ip4`/`ip6` objects.
    #[serde(rename = "0.1.0")]
    V0_1_0,
    /// 0.2.0: as 0.1.0.
    #[serde(rename = "0.2.0")]
    V0_2_0,
    /// 0.3.0: results list interfaces and ips (with `ips[].version`); chaining (`prevResult`).
    #[serde(rename = "0.3.0")]
    V0_3_0,
    /// 0.3.1: as 0.3.0 (the version containerd configures `loopback` with).
    #[serde(rename = "0.3.1")]
    V0_3_1,
    /// 0.4.0: first version with `CHECK`; results carry `ips[].version`.
    #[serde(rename = "0.4.0")]
    V0_4_0,
    /// 1.0.0: conflists only, no `ips[].version`.
    #[serde(rename = "1.0.0")]
    V1_0_0,
    /// 1.1.0: adds `STATUS`, `GC` and the route/interface extras.
    #[serde(rename = "1.1.0")]
    V1_1_0,
}

impl CniVersion {
    /// Every version of the spec, oldest first: what the `loopback` plugin accepts and what
    /// `VERSION` reports (one binary serves both plugins).
    pub const ALL: [CniVersion; 7] = [
        CniVersion::V0_1_0,
        CniVersion::V0_2_0,
        CniVersion::V0_3_0,
        CniVersion::V0_3_1,
        CniVersion::V0_4_0,
        CniVersion::V1_0_0,
        CniVersion::V1_1_0,
    ];
    /// Every version Lace's own network (`"type": "lace"`) accepts, oldest first.
    pub const SUPPORTED: [CniVersion; 3] =
        [CniVersion::V0_4_0, CniVersion::V1_0_0, CniVersion::V1_1_0];
    /// The newest version, used where no configuration names one.
    pub const LATEST: CniVersion = CniVersion::V1_1_0;
    /// The `cniVersion` of the conflist the agent writes. Not [`CniVersion::LATEST`]: libcni
    /// up to 1.1.x (containerd 1.6 and every 1.7) reads only `cniVersion`, hands it to the
    /// plugin, and then refuses a result of any version it does not know (1.1.0 among them:
    /// `unsupported CNI result version "1.1.0"`). libcni 1.2 and newer (containerd 2.x) pick
    /// the highest version they know from `cniVersions` instead, which still lists 1.1.0.
    pub const CONFLIST: CniVersion = CniVersion::V1_0_0;

    /// The version string as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_1_0 => "0.1.0",
            CniVersion::V0_2_0 => "0.2.0",
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// Whether `CHECK` exists in this version (it was added in 0.4.0).
    pub fn has_check(self) -> bool {
        self >= CniVersion::V0_4_0
    }

    /// Whether `STATUS` and `GC` exist in this version (they were added in 1.1.0).
    pub fn has_status_and_gc(self) -> bool {
        self >= CniVersion::V1_1_0
    }

    /// `versions` as a comma-separated list, for messages.
    pub fn list(versions: &[CniVersion]) -> String {
        versions
            .iter()
            .map(|v| v.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CniVersion {
    type Err = UnknownVersion;

    /// Any version of the spec; which ones a plugin accepts is the plugin's to check.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnknownVersion(s.to_owned()))
    }
}

/// A version string that names no CNI specification version.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a CNI specification version (known: {known})", known = CniVersion::list(&CniVersion::ALL))]
pub struct UnknownVersion(pub String);

/// The answer to `VERSION`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// The version of this answer's own format: the newest one we speak.
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// Every configuration version the plugin accepts.
    #[serde(rename = "supportedVersions")]
    pub supported_versions: Vec<String>,
}

impl VersionInfo {
    /// What the `lace` binary reports: every version, since the same binary serves the
    /// `loopback` plugin (which accepts them all, as the reference plugin does) and `VERSION`
    /// carries no `type` to tell the two apart. A configuration of `"type": "lace"` older than
    /// 0.4.0 is refused when it is used, with a message naming the versions Lace supports.
    pub fn lace() -> Self {
        Self {
            cni_version: CniVersion::LATEST.as_str().to_owned(),
            supported_versions: CniVersion::ALL
                .iter()
                .map(|v| v.as_str().to_owned())
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Errors (the spec's error object)
// ---------------------------------------------------------------------------------------------

/// A CNI error code. Codes below 100 are the spec's well-known ones; 100 and above are free for
/// plugins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    /// 1: the configuration's `cniVersion` is not one the plugin speaks (or the verb does not
    /// exist in it).
    pub const INCOMPATIBLE_VERSION: ErrorCode = ErrorCode(1);
    /// 2: a configuration field the plugin does not support; the message names key and value.
    pub const UNSUPPORTED_FIELD: ErrorCode = ErrorCode(2);
    /// 3: the container is unknown or does not exist; no cleanup is needed.
    pub const UNKNOWN_CONTAINER: ErrorCode = ErrorCode(3);
    /// 4: a required environment variable is missing or invalid; the message names it.
    pub const INVALID_ENVIRONMENT: ErrorCode = ErrorCode(4);
    /// 5: I/O failure, e.g. reading stdin.
    pub const IO: ErrorCode = ErrorCode(5);
    /// 6: content could not be decoded, e.g. the configuration is not JSON.
    pub const DECODE: ErrorCode = ErrorCode(6);
    /// 7: the network configuration is invalid.
    pub const INVALID_NETCONF: ErrorCode = ErrorCode(7);
    /// 11: a transient condition; the runtime should retry later.
    pub const TRY_AGAIN_LATER: ErrorCode = ErrorCode(11);
    /// 50 (`STATUS`): the plugin cannot serve `ADD` now.
    pub const NOT_AVAILABLE: ErrorCode = ErrorCode(50);
    /// 51 (`STATUS`): not available, and existing containers may have limited connectivity.
    pub const NOT_AVAILABLE_LIMITED_CONNECTIVITY: ErrorCode = ErrorCode(51);
    /// 999: an internal error of the plugin (the code libcni uses for the same purpose).
    pub const INTERNAL: ErrorCode = ErrorCode(999);
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The error object printed on stdout (and carried over the agent socket).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("CNI error {code}: {msg}")]
pub struct CniError {
    /// The version of the configuration the error answers; filled in by the plugin.
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cni_version: Option<String>,
    /// What kind of error (see [`ErrorCode`]).
    pub code: ErrorCode,
    /// A short message naming what was wrong.
    pub msg: String,
    /// Longer explanation, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
}

impl CniError {
    /// An error with `code` and `msg` and no details.
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self {
            cni_version: None,
            code,
            msg: msg.into(),
            details: None,
        }
    }

    /// The same error with `details` set.
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = Some(details.into());
        self
    }
}

// ---------------------------------------------------------------------------------------------
// Result
// ---------------------------------------------------------------------------------------------

/// The result of `ADD` (and the `prevResult` of `CHECK`/`DEL`), in the 1.x shape. Converted to
/// the configuration's version on output by [`CniResult::to_json`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    /// Set on output to the configuration's version; ignored on input.
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cni_version: Option<String>,
    /// Interfaces the plugin created or configured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    /// Routes installed in the sandbox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// DNS information for the runtime.
    #[serde(default, skip_serializing_if = "Dns::is_empty")]
    pub dns: Dns,
}

/// One interface of a [`CniResult`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// Interface name (inside the sandbox for the pod side).
    pub name: String,
    /// Hardware address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Path of the network namespace, for interfaces inside the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// vhost-user socket path (1.1.0).
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    /// PCI address of a device (1.1.0).
    #[serde(rename = "pciID", default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

/// One address of a [`CniResult`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Address with prefix length, e.g. `10.1.0.5/24` (host bits kept).
    pub address: IpNet,
    /// Default gateway for this address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into [`CniResult::interfaces`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// One route of a [`CniResult`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination prefix.
    pub dst: IpNet,
    /// Next hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// Route MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Advertised MSS (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// Route priority/metric (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Routing table (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Route scope (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

/// DNS information of a [`CniResult`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Local domain for short names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// No DNS information at all (the field is then left out).
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// Why a [`CniResult`] is not a consistent result.
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    /// An `ips[i].interface` index points past the interface list.
    #[error("ips[{ip}].interface is {index} but the result lists only {count} interfaces")]
    InterfaceIndex {
        /// Position in `ips`.
        ip: usize,
        /// The offending index.
        index: usize,
        /// Length of `interfaces`.
        count: usize,
    },
    /// An interface without a name.
    #[error("interfaces[{0}].name is empty")]
    EmptyInterfaceName(usize),
}

impl CniResult {
    /// Checks the result is self-consistent (indices in range, names present).
    pub fn validate(&self) -> Result<(), ResultError> {
        if let Some(i) = self.interfaces.iter().position(|i| i.name.is_empty()) {
            return Err(ResultError::EmptyInterfaceName(i));
        }
        for (ip, cfg) in self.ips.iter().enumerate() {
            if let Some(index) = cfg.interface {
                if index >= self.interfaces.len() {
                    return Err(ResultError::InterfaceIndex {
                        ip,
                        index,
                        count: self.interfaces.len(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The result as the JSON a runtime speaking `version` expects: `cniVersion` set, each ip
    /// tagged with `version` ("4"/"6") for 0.3.0 to 0.4.0, and the fields that 1.1.0 added to
    /// interfaces and routes left out for older versions (whose consumers do not know them);
    /// for 0.1.0 and 0.2.0 the `ip4`/`ip6` shape ([`CniResult::to_legacy_json`]).
    pub fn to_json(&self, version: CniVersion) -> Value {
        if version <= CniVersion::V0_2_0 {
            return self.to_legacy_json(version);
        }
        let mut out = self.clone();
        out.cni_version = Some(version.as_str().to_owned());
        if version < CniVersion::V1_1_0 {
            for i in &mut out.interfaces {
                i.mtu = None;
                i.socket_path = None;
                i.pci_id = None;
            }
            for r in &mut out.routes {
                r.mtu = None;
                r.advmss = None;
                r.priority = None;
                r.table = None;
                r.scope = None;
            }
        }
        let mut json = serde_json::to_value(&out).unwrap_or(Value::Null);
        if version < CniVersion::V1_0_0 {
            if let Some(Value::Array(ips)) = json.get_mut("ips") {
                for (ip, cfg) in ips.iter_mut().zip(&self.ips) {
                    let family = if cfg.address.addr().is_ipv4() {
                        "4"
                    } else {
                        "6"
                    };
                    if let Value::Object(map) = ip {
                        map.insert("version".to_owned(), Value::from(family));
                    }
                }
            }
        }
        json
    }

    /// The 0.1.0/0.2.0 shape: the first address of each family as `ip4` / `ip6` (with its
    /// gateway, and the routes of its family), as libcni converts a newer result down.
    /// Interfaces did not exist yet.
    pub fn to_legacy_json(&self, version: CniVersion) -> Value {
        let mut out = serde_json::Map::new();
        out.insert("cniVersion".to_owned(), Value::from(version.as_str()));
        for (key, v4) in [("ip4", true), ("ip6", false)] {
            let Some(ip) = self.ips.iter().find(|c| c.address.addr().is_ipv4() == v4) else {
                continue;
            };
            let mut cfg = serde_json::Map::new();
            cfg.insert("ip".to_owned(), Value::from(ip.address.to_string()));
            if let Some(gw) = ip.gateway {
                cfg.insert("gateway".to_owned(), Value::from(gw.to_string()));
            }
            let routes: Vec<Value> = self
                .routes
                .iter()
                .filter(|r| r.dst.addr().is_ipv4() == v4)
                .map(|r| {
                    let mut route = serde_json::Map::new();
                    route.insert("dst".to_owned(), Value::from(r.dst.to_string()));
                    if let Some(gw) = r.gw {
                        route.insert("gw".to_owned(), Value::from(gw.to_string()));
                    }
                    Value::Object(route)
                })
                .collect();
            if !routes.is_empty() {
                cfg.insert("routes".to_owned(), Value::Array(routes));
            }
            out.insert(key.to_owned(), Value::Object(cfg));
        }
        if !self.dns.is_empty() {
            out.insert(
                "dns".to_owned(),
                serde_json::to_value(&self.dns).unwrap_or(Value::Null),
            );
        }
        Value::Object(out)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    // Also the protocol tests' sample: a result crosses the agent socket.
    pub(in crate::wire) fn sample_result() -> CniResult {
        CniResult {
            cni_version: None,
            interfaces: vec![
                Interface {
                    name: "lace0a1b2c3d".into(),
                    mac: Some("aa:bb:cc:dd:ee:ff".into()),
                    ..Default::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: Some("aa:bb:cc:dd:ee:00".into()),
                    mtu: Some(1410),
                    sandbox: Some("/var/run/netns/cni-1".into()),
                    ..Default::default()
                },
            ],
            ips: vec![
                IpConfig {
                    address: "10.1.0.5/24".parse().unwrap(),
                    gateway: Some("169.254.1.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00::5/64".parse().unwrap(),
                    gateway: Some("fe80::1".parse().unwrap()),
                    interface: Some(1),
                },
            ],
            routes: vec![Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: Some("169.254.1.1".parse().unwrap()),
                mtu: Some(1410),
                advmss: None,
                priority: None,
                table: None,
                scope: None,
            }],
            dns: Dns::default(),
        }
    }

    #[test]
    fn result_shape_per_version() {
        let r = sample_result();
        let v11 = r.to_json(CniVersion::V1_1_0);
        assert_eq!(v11["cniVersion"], "1.1.0");
        assert_eq!(
            v11["ips"][0],
            json!({"address":"10.1.0.5/24","gateway":"169.254.1.1","interface":1})
        );
        assert_eq!(v11["interfaces"][1]["mtu"], 1410);
        assert_eq!(v11["routes"][0]["mtu"], 1410);
        assert!(v11.get("dns").is_none());

        let v10 = r.to_json(CniVersion::V1_0_0);
        assert!(v10["interfaces"][1].get("mtu").is_none());
        assert!(v10["routes"][0].get("mtu").is_none());
        assert!(v10["ips"][0].get("version").is_none());

        let v04 = r.to_json(CniVersion::V0_4_0);
        assert_eq!(v04["cniVersion"], "0.4.0");
        assert_eq!(v04["ips"][0]["version"], "4");
        assert_eq!(v04["ips"][1]["version"], "6");
        // And each shape reads back as the same addresses.
        for json in [v11, v10, v04] {
            let back: CniResult = serde_json::from_value(json).unwrap();
            assert_eq!(back.ips, r.ips);
        }
    }

    #[test]
    fn result_validation_catches_bad_index() {
        let mut r = sample_result();
        r.validate().unwrap();
        r.ips[0].interface = Some(2);
        assert!(r
            .validate()
            .unwrap_err()
            .to_string()
            .contains("ips[0].interface is 2"));
    }

    #[test]
    fn error_json_shape() {
        let mut e = CniError::new(ErrorCode::INVALID_ENVIRONMENT, "CNI_IFNAME is not set");
        e.cni_version = Some("1.1.0".into());
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({"cniVersion":"1.1.0","code":4,"msg":"CNI_IFNAME is not set"})
        );
    }

    #[test]
    fn version_info() {
        assert_eq!(
            serde_json::to_value(VersionInfo::lace()).unwrap(),
            json!({"cniVersion":"1.1.0","supportedVersions":
                ["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]})
        );
        assert!(!CniVersion::V1_0_0.has_status_and_gc() && CniVersion::V1_1_0.has_status_and_gc());
        assert!(!CniVersion::V0_3_1.has_check() && CniVersion::V0_4_0.has_check());
        for v in CniVersion::ALL {
            assert_eq!(v.as_str().parse::<CniVersion>().unwrap(), v);
            assert_eq!(serde_json::to_value(v).unwrap(), v.as_str());
        }
        let unknown = "2.0.0".parse::<CniVersion>().unwrap_err().to_string();
        assert!(
            unknown.contains("\"2.0.0\"") && unknown.contains("0.1.0"),
            "{unknown}"
        );
    }

    #[test]
    fn result_shape_of_the_versions_before_0_4_0() {
        let r = sample_result();
        // 0.3.x: the 0.4.0 shape (what containerd's loopback network, 0.3.1, reads).
        let v031 = r.to_json(CniVersion::V0_3_1);
        assert_eq!(v031["cniVersion"], "0.3.1");
        assert_eq!(v031["ips"][0]["version"], "4");
        assert_eq!(v031["ips"][1]["version"], "6");
        assert!(v031["interfaces"][1].get("mtu").is_none());
        // 0.2.0: the first address of each family, with its family's routes.
        let v020 = r.to_json(CniVersion::V0_2_0);
        assert_eq!(
            v020,
            json!({
                "cniVersion": "0.2.0",
                "ip4": {"ip": "10.1.0.5/24", "gateway": "169.254.1.1",
                        "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]},
                "ip6": {"ip": "fd00::5/64", "gateway": "fe80::1"}
            })
        );
    }
}
