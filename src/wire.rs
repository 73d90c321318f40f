//! Wire types shared by the CNI plugin and the node agent. Builds without kube, tokio or
//! rtnetlink so the plugin binary stays small.
//!
//! Three contracts live here:
//! - the CNI spec 1.1.0 types the runtime and the plugin exchange: the network
//!   configuration ([`NetConf`]), `CNI_ARGS` ([`CniArgs`]), the result ([`CniResult`]), the
//!   error ([`CniError`]) and the `VERSION` answer ([`VersionInfo`]);
//! - the agent socket protocol ([`Request`], [`Response`]): one newline-terminated JSON
//!   request per connection, answered by one newline-terminated JSON response;
//! - the DEL queue ([`del_queue`]): DELs the plugin could not hand to the agent, kept on disk
//!   for the agent to replay at start.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

use ipnet::IpNet;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Value of `type` in Lace's conflist entry: the file name of the plugin in the CNI bin dir.
pub const PLUGIN_TYPE: &str = "lace";
/// Where the agent listens unless the conflist says otherwise (`agentSocket`).
pub const DEFAULT_AGENT_SOCKET: &str = "/run/lace/cni.sock";
/// Where the plugin queues DELs it could not deliver (`delQueueDir`). Under `/var/lib`, not
/// `/run`, so that a DEL queued just before a reboot still releases its address afterwards.
pub const DEFAULT_DEL_QUEUE_DIR: &str = "/var/lib/lace/cni-del-queue";
/// How long the plugin waits for the agent's answer unless `timeoutSeconds` says otherwise.
/// Below kubelet's default runtime request timeout (2 min) so the runtime sees our error,
/// not its own deadline.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 60;
/// Largest accepted `timeoutSeconds`: anything longer outlasts every runtime's own deadline.
pub const MAX_TIMEOUT_SECONDS: u64 = 3600;
/// Upper bound of one protocol message (request or response line), so that neither side
/// can be made to buffer without limit.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Linux `IFNAMSIZ` minus the terminating NUL.
pub const MAX_IFNAME_LEN: usize = 15;

/// The runtime-injected list of attachments that are still in use, passed with `GC`.
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// The name an earlier 1.1.0 draft used for [`VALID_ATTACHMENTS_KEY`]; libcni sends both, we
/// accept either.
pub const LEGACY_ATTACHMENTS_KEY: &str = "cni.dev/attachments";

// ---------------------------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------------------------

/// A CNI specification version Lace speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CniVersion {
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
    /// Every version Lace accepts, oldest first (what `VERSION` reports).
    pub const SUPPORTED: [CniVersion; 3] =
        [CniVersion::V0_4_0, CniVersion::V1_0_0, CniVersion::V1_1_0];
    /// The newest version, used where no configuration names one.
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    /// The version string as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// Whether `STATUS` and `GC` exist in this version (they were added in 1.1.0).
    pub fn has_status_and_gc(self) -> bool {
        self >= CniVersion::V1_1_0
    }

    fn supported_list() -> String {
        Self::SUPPORTED
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
    type Err = NetConfError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::SUPPORTED
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| NetConfError::UnsupportedVersion(s.to_owned()))
    }
}

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
    /// What the Lace plugin reports.
    pub fn lace() -> Self {
        Self {
            cni_version: CniVersion::LATEST.as_str().to_owned(),
            supported_versions: CniVersion::SUPPORTED
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
    /// tagged with `version` ("4"/"6") for 0.4.0, and the fields that 1.1.0 added to interfaces
    /// and routes left out for older versions (whose consumers do not know them).
    pub fn to_json(&self, version: CniVersion) -> Value {
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
        if version == CniVersion::V0_4_0 {
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
}

// ---------------------------------------------------------------------------------------------
// Network configuration
// ---------------------------------------------------------------------------------------------

/// How much the plugin logs (`logLevel`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Only failures.
    Error,
    /// Failures and degraded operation (e.g. a DEL queued because the agent was down).
    #[default]
    Warn,
    /// One line per invocation.
    Info,
    /// Everything, including the requests sent to the agent.
    Debug,
}

impl LogLevel {
    /// Upper-case name for log lines.
    pub fn label(self) -> &'static str {
        match self {
            LogLevel::Error => "ERROR",
            LogLevel::Warn => "WARN",
            LogLevel::Info => "INFO",
            LogLevel::Debug => "DEBUG",
        }
    }
}

/// The Lace-specific keys of Lace's conflist entry. The agent serializes this (plus `type`)
/// when it writes `10-lace.conflist`; the plugin reads it back with [`NetConf::parse`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginSettings {
    /// Path of the agent's unix socket.
    #[serde(rename = "agentSocket")]
    pub agent_socket: PathBuf,
    /// Directory DELs are queued in while the agent cannot be reached.
    #[serde(rename = "delQueueDir")]
    pub del_queue_dir: PathBuf,
    /// Seconds to wait for the agent's answer.
    #[serde(rename = "timeoutSeconds")]
    pub timeout_seconds: u64,
    /// Log file; stderr when absent.
    #[serde(rename = "logFile", default, skip_serializing_if = "Option::is_none")]
    pub log_file: Option<PathBuf>,
    /// Log verbosity.
    #[serde(rename = "logLevel")]
    pub log_level: LogLevel,
}

impl Default for PluginSettings {
    fn default() -> Self {
        Self {
            agent_socket: PathBuf::from(DEFAULT_AGENT_SOCKET),
            del_queue_dir: PathBuf::from(DEFAULT_DEL_QUEUE_DIR),
            timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
            log_file: None,
            log_level: LogLevel::default(),
        }
    }
}

/// One attachment the runtime still considers valid (`GC`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Attachment {
    /// The container (sandbox) id.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name inside it.
    pub ifname: String,
}

/// The network configuration the runtime passes on stdin: the list's `cniVersion` and `name`
/// merged into Lace's plugin entry, plus runtime-injected keys.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    /// The version the runtime speaks for this invocation.
    pub cni_version: CniVersion,
    /// The network (conflist) name.
    pub name: String,
    /// Lace's own keys, defaults filled in.
    pub settings: PluginSettings,
    /// The previous result (`CHECK`, `DEL`, and `ADD` after another plugin).
    pub prev_result: Option<CniResult>,
    /// Attachments still in use (`GC` only).
    pub valid_attachments: Option<Vec<Attachment>>,
    /// The whole configuration as received, unknown keys included, forwarded to the agent.
    pub raw: Map<String, Value>,
}

/// Why stdin is not a usable Lace network configuration.
#[derive(Debug, thiserror::Error)]
pub enum NetConfError {
    /// Not JSON at all.
    #[error("network configuration on stdin is not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// JSON, but not an object.
    #[error("network configuration on stdin must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    /// No `cniVersion` (which the spec reads as 0.1.0).
    #[error(
        "network configuration has no cniVersion (that means 0.1.0); lace supports {supported}",
        supported = CniVersion::supported_list()
    )]
    MissingVersion,
    /// A `cniVersion` we do not speak.
    #[error("cniVersion {0:?} is not supported; lace supports {supported}", supported = CniVersion::supported_list())]
    UnsupportedVersion(String),
    /// A required key is absent.
    #[error("network configuration has no {0:?}")]
    Missing(&'static str),
    /// A key has the wrong JSON type.
    #[error("network configuration key {field:?}: {source}")]
    Field {
        /// The key.
        field: &'static str,
        /// What serde found wrong.
        #[source]
        source: serde_json::Error,
    },
    /// `type` names another plugin.
    #[error("network configuration type is {0:?}, but this plugin is {PLUGIN_TYPE:?}")]
    WrongType(String),
    /// `name` does not match the spec's pattern.
    #[error(
        "network name {0:?} is invalid: it must start with a letter or digit followed by letters, \
         digits, '_', '.' or '-'"
    )]
    InvalidName(String),
    /// A path key is empty or relative.
    #[error("network configuration key {field:?} must be an absolute path, got {value:?}")]
    RelativePath {
        /// The key.
        field: &'static str,
        /// Its value.
        value: PathBuf,
    },
    /// `timeoutSeconds` out of range.
    #[error(
        "network configuration key \"timeoutSeconds\" is {0}, it must be between 1 and \
         {MAX_TIMEOUT_SECONDS}"
    )]
    Timeout(u64),
    /// A key Lace deliberately does not support.
    #[error("unsupported network configuration key {field:?} = {value}: {why}")]
    Unsupported {
        /// The key.
        field: &'static str,
        /// Its value, as JSON.
        value: String,
        /// Why Lace rejects it.
        why: &'static str,
    },
}

impl NetConfError {
    /// The CNI error code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            NetConfError::Json(_) | NetConfError::NotAnObject(_) => ErrorCode::DECODE,
            NetConfError::MissingVersion | NetConfError::UnsupportedVersion(_) => {
                ErrorCode::INCOMPATIBLE_VERSION
            }
            NetConfError::Unsupported { .. } => ErrorCode::UNSUPPORTED_FIELD,
            NetConfError::Missing(_)
            | NetConfError::Field { .. }
            | NetConfError::WrongType(_)
            | NetConfError::InvalidName(_)
            | NetConfError::RelativePath { .. }
            | NetConfError::Timeout(_) => ErrorCode::INVALID_NETCONF,
        }
    }
}

impl From<NetConfError> for CniError {
    fn from(e: NetConfError) -> Self {
        CniError::new(e.code(), e.to_string())
    }
}

/// Reads `key` from `obj` as a `T`; absent and `null` are both `None`.
fn field<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<T>, NetConfError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v)
            .map(Some)
            .map_err(|source| NetConfError::Field { field: key, source }),
    }
}

fn absolute(field: &'static str, value: PathBuf) -> Result<PathBuf, NetConfError> {
    if value.is_absolute() {
        Ok(value)
    } else {
        Err(NetConfError::RelativePath { field, value })
    }
}

/// Whether `s` matches the spec's identifier pattern `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (used for
/// network names and container ids).
fn is_cni_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

impl NetConf {
    /// Parses and validates the configuration bytes from stdin. Unknown keys are kept in
    /// [`NetConf::raw`] and otherwise ignored, as the spec requires.
    pub fn parse(bytes: &[u8]) -> Result<NetConf, NetConfError> {
        let value: Value = serde_json::from_slice(bytes).map_err(NetConfError::Json)?;
        let raw = match value {
            Value::Object(map) => map,
            other => return Err(NetConfError::NotAnObject(json_kind(&other))),
        };
        // Version first: a config from another version may legitimately differ in every
        // other key, so the version error is the one that explains the rest.
        let version: String = field(&raw, "cniVersion")?.ok_or(NetConfError::MissingVersion)?;
        let cni_version = version.parse()?;
        let plugin_type: String = field(&raw, "type")?.ok_or(NetConfError::Missing("type"))?;
        if plugin_type != PLUGIN_TYPE {
            return Err(NetConfError::WrongType(plugin_type));
        }
        let name: String = field(&raw, "name")?.ok_or(NetConfError::Missing("name"))?;
        if !is_cni_identifier(&name) {
            return Err(NetConfError::InvalidName(name));
        }
        if let Some(ipam) = raw.get("ipam") {
            return Err(NetConfError::Unsupported {
                field: "ipam",
                value: ipam.to_string(),
                why: "the Lace agent allocates pod addresses itself; remove the ipam section",
            });
        }
        let defaults = PluginSettings::default();
        let settings = PluginSettings {
            agent_socket: absolute(
                "agentSocket",
                field(&raw, "agentSocket")?.unwrap_or(defaults.agent_socket),
            )?,
            del_queue_dir: absolute(
                "delQueueDir",
                field(&raw, "delQueueDir")?.unwrap_or(defaults.del_queue_dir),
            )?,
            timeout_seconds: match field(&raw, "timeoutSeconds")? {
                Some(t) if (1..=MAX_TIMEOUT_SECONDS).contains(&t) => t,
                Some(t) => return Err(NetConfError::Timeout(t)),
                None => defaults.timeout_seconds,
            },
            log_file: field(&raw, "logFile")?
                .map(|p| absolute("logFile", p))
                .transpose()?,
            log_level: field(&raw, "logLevel")?.unwrap_or(defaults.log_level),
        };
        let prev_result = field(&raw, "prevResult")?;
        let valid_attachments = match field(&raw, VALID_ATTACHMENTS_KEY)? {
            Some(list) => Some(list),
            None => field(&raw, LEGACY_ATTACHMENTS_KEY)?,
        };
        Ok(NetConf {
            cni_version,
            name,
            settings,
            prev_result,
            valid_attachments,
            raw,
        })
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Lace's entry in a conflist, as the agent writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginEntry {
    /// Always [`PLUGIN_TYPE`].
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// Lace's keys.
    #[serde(flatten)]
    pub settings: PluginSettings,
}

/// A network configuration list (`10-lace.conflist`), as the agent writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfList {
    /// The version the runtime should use with it.
    #[serde(rename = "cniVersion")]
    pub cni_version: CniVersion,
    /// Every version the list works with (1.1.0: the runtime picks the highest it knows).
    #[serde(rename = "cniVersions", default, skip_serializing_if = "Vec::is_empty")]
    pub cni_versions: Vec<CniVersion>,
    /// The network name.
    pub name: String,
    /// Just Lace.
    pub plugins: Vec<PluginEntry>,
}

impl ConfList {
    /// The conflist for a Lace node with `settings`.
    pub fn lace(name: impl Into<String>, settings: PluginSettings) -> Self {
        Self {
            cni_version: CniVersion::LATEST,
            cni_versions: CniVersion::SUPPORTED.to_vec(),
            name: name.into(),
            plugins: vec![PluginEntry {
                plugin_type: PLUGIN_TYPE.to_owned(),
                settings,
            }],
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Environment values
// ---------------------------------------------------------------------------------------------

/// Why a container id (`CNI_CONTAINERID`) is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ContainerIdError {
    /// Empty.
    #[error("container id is empty")]
    Empty,
    /// Characters outside the spec's pattern.
    #[error(
        "container id {0:?} is invalid: it must start with a letter or digit followed by \
         letters, digits, '_', '.' or '-'"
    )]
    Invalid(String),
}

/// Checks a container id against the spec: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn validate_container_id(id: &str) -> Result<(), ContainerIdError> {
    if id.is_empty() {
        Err(ContainerIdError::Empty)
    } else if is_cni_identifier(id) {
        Ok(())
    } else {
        Err(ContainerIdError::Invalid(id.to_owned()))
    }
}

/// Why an interface name (`CNI_IFNAME`) cannot be a Linux interface name.
#[derive(Debug, thiserror::Error)]
pub enum IfnameError {
    /// Empty.
    #[error("interface name is empty")]
    Empty,
    /// Longer than `IFNAMSIZ - 1` bytes.
    #[error("interface name {0:?} is {1} bytes long, the kernel allows at most {MAX_IFNAME_LEN}")]
    TooLong(String, usize),
    /// `.` or `..`, which the kernel refuses (they would clash with sysfs entries).
    #[error("interface name {0:?} is not allowed")]
    Reserved(String),
    /// A character the kernel refuses: `/`, `:` or whitespace.
    #[error("interface name {0:?} contains {1:?}, which the kernel does not allow")]
    BadChar(String, char),
}

/// Checks an interface name the way the kernel's `dev_valid_name` does.
pub fn validate_ifname(name: &str) -> Result<(), IfnameError> {
    if name.is_empty() {
        return Err(IfnameError::Empty);
    }
    if name.len() > MAX_IFNAME_LEN {
        return Err(IfnameError::TooLong(name.to_owned(), name.len()));
    }
    if name == "." || name == ".." {
        return Err(IfnameError::Reserved(name.to_owned()));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(IfnameError::BadChar(name.to_owned(), c));
    }
    Ok(())
}

/// The `CNI_ARGS` keys Lace understands (the ones containerd and CRI-O send for Kubernetes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `K8S_POD_UID`.
    pub pod_uid: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`.
    pub infra_container_id: Option<String>,
}

/// Why `CNI_ARGS` cannot be parsed.
#[derive(Debug, thiserror::Error)]
pub enum CniArgsError {
    /// A `;`-separated part without `=`.
    #[error("CNI_ARGS part {0:?} is not KEY=VALUE")]
    NotKeyValue(String),
    /// A key appears twice.
    #[error("CNI_ARGS sets {0} twice")]
    Duplicate(String),
    /// `IgnoreUnknown` with a value that is not a boolean.
    #[error("CNI_ARGS IgnoreUnknown={0:?} is not a boolean (1, 0, true or false)")]
    BadIgnoreUnknown(String),
    /// Keys Lace does not know, without `IgnoreUnknown=1`.
    #[error("CNI_ARGS has unknown keys {0:?} and no IgnoreUnknown=1")]
    Unknown(Vec<String>),
    /// A Kubernetes name that is not a DNS subdomain.
    #[error(
        "CNI_ARGS {key}={value:?} is not a valid Kubernetes name (lowercase letters, digits, \
         '-' and '.', at most 253 characters)"
    )]
    BadName {
        /// The key.
        key: &'static str,
        /// Its value.
        value: String,
    },
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

impl CniArgs {
    /// Parses `KEY=VALUE;KEY=VALUE`. Unknown keys are an error unless `IgnoreUnknown` is true
    /// (the convention of the reference plugins; containerd always sends `IgnoreUnknown=1`).
    /// Empty values count as absent.
    pub fn parse(s: &str) -> Result<CniArgs, CniArgsError> {
        let mut args = CniArgs::default();
        let mut seen = BTreeSet::new();
        let mut unknown = Vec::new();
        let mut ignore_unknown = false;
        for part in s.split(';').filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| CniArgsError::NotKeyValue(part.to_owned()))?;
            if !seen.insert(key) {
                return Err(CniArgsError::Duplicate(key.to_owned()));
            }
            let slot = match key {
                "IgnoreUnknown" => {
                    ignore_unknown = match value.to_ascii_lowercase().as_str() {
                        "1" | "true" => true,
                        "0" | "false" => false,
                        _ => return Err(CniArgsError::BadIgnoreUnknown(value.to_owned())),
                    };
                    continue;
                }
                "K8S_POD_NAMESPACE" => &mut args.pod_namespace,
                "K8S_POD_NAME" => &mut args.pod_name,
                "K8S_POD_UID" => &mut args.pod_uid,
                "K8S_POD_INFRA_CONTAINER_ID" => &mut args.infra_container_id,
                _ => {
                    unknown.push(key.to_owned());
                    continue;
                }
            };
            if !value.is_empty() {
                *slot = Some(value.to_owned());
            }
        }
        if !unknown.is_empty() && !ignore_unknown {
            return Err(CniArgsError::Unknown(unknown));
        }
        for (key, value) in [
            ("K8S_POD_NAMESPACE", &args.pod_namespace),
            ("K8S_POD_NAME", &args.pod_name),
        ] {
            if let Some(value) = value {
                if !is_dns_subdomain(value) {
                    return Err(CniArgsError::BadName {
                        key,
                        value: value.clone(),
                    });
                }
            }
        }
        Ok(args)
    }
}

// ---------------------------------------------------------------------------------------------
// Agent socket protocol
// ---------------------------------------------------------------------------------------------

/// The CNI verbs the agent serves (`VERSION` is answered by the plugin alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Command {
    /// Attach a container.
    Add,
    /// Detach a container; idempotent.
    Del,
    /// Verify an attachment.
    Check,
    /// Is the agent ready to serve ADD?
    Status,
    /// Release everything not in the valid attachments.
    Gc,
}

impl Command {
    /// The `CNI_COMMAND` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }

    /// Parses a `CNI_COMMAND` value other than `VERSION`.
    pub fn parse(s: &str) -> Option<Command> {
        [
            Command::Add,
            Command::Del,
            Command::Check,
            Command::Status,
            Command::Gc,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request from the plugin to the agent: everything the runtime told the plugin, already
/// validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The verb.
    pub command: Command,
    /// `CNI_CONTAINERID` (absent for `STATUS` and `GC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// `CNI_NETNS`, only when it names an existing network namespace (for `DEL` it may be
    /// gone already: then absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME` (absent for `STATUS` and `GC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    /// `K8S_POD_NAMESPACE` from `CNI_ARGS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME` from `CNI_ARGS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// `K8S_POD_UID` from `CNI_ARGS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The configuration's version.
    pub cni_version: CniVersion,
    /// The whole configuration as the runtime passed it.
    pub config: Map<String, Value>,
    /// The configuration's `prevResult`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_result: Option<CniResult>,
    /// `GC` only: the attachments to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_attachments: Option<Vec<Attachment>>,
}

impl Request {
    /// A request for `command` with no attachment fields (STATUS, GC, VERSION-like verbs).
    pub fn without_attachment(command: Command, cni_version: CniVersion) -> Self {
        Self {
            command,
            container_id: None,
            netns: None,
            ifname: None,
            pod_namespace: None,
            pod_name: None,
            pod_uid: None,
            cni_version,
            config: Map::new(),
            prev_result: None,
            valid_attachments: None,
        }
    }
}

/// The agent's answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Response {
    /// Success; `ADD` carries the result, every other verb `null`.
    Ok(Option<CniResult>),
    /// Failure, passed on to the runtime as is (the plugin sets `cniVersion`).
    Err(CniError),
}

/// Why a protocol line cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Longer than [`MAX_MESSAGE_BYTES`].
    #[error("message is longer than {MAX_MESSAGE_BYTES} bytes")]
    TooLong,
    /// Not the expected JSON.
    #[error("message is not valid JSON of the expected shape: {0}")]
    Json(#[from] serde_json::Error),
}

/// Serializes `msg` as one protocol line (JSON and `\n`).
pub fn encode_line<T: Serialize>(msg: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut line = serde_json::to_vec(msg)?;
    line.push(b'\n');
    Ok(line)
}

/// Decodes one protocol line (with or without its `\n`).
pub fn decode_line<T: DeserializeOwned>(line: &[u8]) -> Result<T, FrameError> {
    if line.len() > MAX_MESSAGE_BYTES + 1 {
        return Err(FrameError::TooLong);
    }
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    Ok(serde_json::from_slice(line)?)
}

// ---------------------------------------------------------------------------------------------
// DEL queue
// ---------------------------------------------------------------------------------------------

pub mod del_queue {
    //! DELs the plugin could not deliver because the agent was unreachable.
    //!
    //! A runtime retries a failed DEL, but a pod stays `Terminating` until one succeeds, and
    //! an agent that is down for good (uninstall, crash loop) would wedge every pod on the node.
    //! So when the agent cannot be reached the plugin writes the [`Request`](super::Request)
    //! here and reports success. Nothing leaks: the pod's veth dies with its network namespace,
    //! and the agent replays every queued DEL (which is idempotent) before it serves requests
    //! again, releasing the address, then removes the file.
    //!
    //! One file per attachment, `<container id>.<ifname>.json`, written atomically (temporary
    //! file, fsync, rename, fsync of the directory) so that the agent never reads half a request.

    use std::fs::{self, File, OpenOptions};
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    use std::path::{Path, PathBuf};

    use super::{
        decode_line, encode_line, validate_container_id, validate_ifname, Command, FrameError,
        Request,
    };

    /// Why the queue could not be written or read.
    #[derive(Debug, thiserror::Error)]
    pub enum DelQueueError {
        /// Only DELs with a container id and interface name can be queued.
        #[error("only DEL requests with container id and ifname can be queued, got {0}")]
        NotADel(Command),
        /// A container id or ifname that is not safe as part of a file name.
        #[error("cannot queue a DEL for attachment {0:?}: invalid container id or ifname")]
        BadName(String),
        /// File-system failure.
        #[error("DEL queue {path}: {source}")]
        Io {
            /// The file or directory.
            path: PathBuf,
            /// The OS error.
            #[source]
            source: std::io::Error,
        },
        /// A queued file that is not a request.
        #[error("DEL queue file {path}: {source}")]
        Decode {
            /// The file.
            path: PathBuf,
            /// What is wrong with it.
            #[source]
            source: FrameError,
        },
    }

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DelQueueError + '_ {
        move |source| DelQueueError::Io {
            path: path.to_owned(),
            source,
        }
    }

    /// Writes `req` (a DEL) into `dir`, creating `dir` if needed; returns the file written.
    /// Queuing the same attachment twice overwrites the earlier copy.
    pub fn enqueue(dir: &Path, req: &Request) -> Result<PathBuf, DelQueueError> {
        let (Command::Del, Some(id), Some(ifname)) = (
            req.command,
            req.container_id.as_deref(),
            req.ifname.as_deref(),
        ) else {
            return Err(DelQueueError::NotADel(req.command));
        };
        // Both end up in a file name: refuse anything that could leave `dir`.
        if validate_container_id(id).is_err() || validate_ifname(ifname).is_err() {
            return Err(DelQueueError::BadName(format!("{id}.{ifname}")));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io(dir))?;
        let name = format!("{id}.{ifname}.json");
        let path = dir.join(&name);
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let line = encode_line(req).map_err(|e| DelQueueError::Io {
            path: tmp.clone(),
            source: std::io::Error::other(e),
        })?;
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp))?;
        file.write_all(&line)
            .and_then(|()| file.sync_all())
            .map_err(io(&tmp))?;
        fs::rename(&tmp, &path).map_err(io(&path))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
        Ok(path)
    }

    /// Every queued request in `dir` (oldest name first), with the file it came from so the
    /// caller can remove it once the DEL is done. A missing directory is an empty queue.
    pub fn pending(dir: &Path) -> Result<Vec<(PathBuf, Request)>, DelQueueError> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry.map_err(io(dir))?.path();
            let queued = path.extension().is_some_and(|e| e == "json")
                && path
                    .file_name()
                    .is_some_and(|n| !n.to_string_lossy().starts_with('.'));
            if !queued {
                continue;
            }
            let bytes = fs::read(&path).map_err(io(&path))?;
            let req = decode_line(&bytes).map_err(|source| DelQueueError::Decode {
                path: path.clone(),
                source,
            })?;
            out.push((path, req));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What containerd (go-cni/libcni) hands a plugin for ADD after merging a conflist entry.
    const CONTAINERD_ADD: &str = r#"{
        "cniVersion": "1.1.0",
        "name": "lace",
        "type": "lace",
        "agentSocket": "/run/lace/cni.sock",
        "logLevel": "info",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": []},
        "somethingElse": {"nested": [1, 2, 3]}
    }"#;

    #[test]
    fn parses_containerd_config_and_keeps_unknown_keys() {
        let conf = NetConf::parse(CONTAINERD_ADD.as_bytes()).unwrap();
        assert_eq!(conf.cni_version, CniVersion::V1_1_0);
        assert_eq!(conf.name, "lace");
        assert_eq!(
            conf.settings.agent_socket,
            PathBuf::from("/run/lace/cni.sock")
        );
        assert_eq!(conf.settings.log_level, LogLevel::Info);
        assert_eq!(
            conf.settings.del_queue_dir,
            PathBuf::from(DEFAULT_DEL_QUEUE_DIR)
        );
        assert_eq!(conf.raw["somethingElse"], json!({"nested": [1, 2, 3]}));
        assert!(conf.prev_result.is_none() && conf.valid_attachments.is_none());
    }

    #[test]
    fn defaults_apply_when_lace_keys_are_absent() {
        let conf = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"n","type":"lace"}"#).unwrap();
        assert_eq!(conf.settings, PluginSettings::default());
        assert_eq!(
            conf.settings.agent_socket,
            PathBuf::from("/run/lace/cni.sock")
        );
    }

    #[test]
    fn parses_0_4_0_check_with_prev_result() {
        let conf = NetConf::parse(
            br#"{"cniVersion":"0.4.0","name":"lace","type":"lace",
            "prevResult":{"cniVersion":"0.4.0",
              "interfaces":[{"name":"lace1a2b","mac":"aa:bb:cc:dd:ee:ff"},
                            {"name":"eth0","mac":"aa:bb:cc:dd:ee:00","sandbox":"/var/run/netns/cni-1"}],
              "ips":[{"version":"4","address":"10.1.0.5/24","gateway":"169.254.1.1","interface":1},
                     {"version":"6","address":"fd00::5/64","interface":1}],
              "routes":[{"dst":"0.0.0.0/0","gw":"169.254.1.1"}],
              "dns":{}}}"#,
        )
        .unwrap();
        let prev = conf.prev_result.unwrap();
        assert_eq!(prev.ips.len(), 2);
        assert_eq!(prev.ips[0].address.to_string(), "10.1.0.5/24");
        assert_eq!(prev.ips[0].gateway, Some("169.254.1.1".parse().unwrap()));
        assert_eq!(
            prev.interfaces[1].sandbox.as_deref(),
            Some("/var/run/netns/cni-1")
        );
        prev.validate().unwrap();
    }

    #[test]
    fn gc_attachments_under_either_key() {
        for key in [VALID_ATTACHMENTS_KEY, LEGACY_ATTACHMENTS_KEY] {
            let conf = NetConf::parse(
                json!({"cniVersion":"1.1.0","name":"lace","type":"lace",
                       key: [{"containerID":"abc","ifname":"eth0"}]})
                .to_string()
                .as_bytes(),
            )
            .unwrap();
            assert_eq!(
                conf.valid_attachments,
                Some(vec![Attachment {
                    container_id: "abc".into(),
                    ifname: "eth0".into()
                }]),
                "{key}"
            );
        }
    }

    #[test]
    fn config_errors_have_the_spec_codes_and_name_the_problem() {
        let cases: &[(&str, u32, &str)] = &[
            ("{not json", 6, "not valid JSON"),
            ("[1]", 6, "an array"),
            (r#"{"name":"n","type":"lace"}"#, 1, "no cniVersion"),
            (
                r#"{"cniVersion":"0.3.1","name":"n","type":"lace"}"#,
                1,
                "\"0.3.1\"",
            ),
            (
                r#"{"cniVersion":1,"name":"n","type":"lace"}"#,
                7,
                "\"cniVersion\"",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"bridge"}"#,
                7,
                "\"bridge\"",
            ),
            (r#"{"cniVersion":"1.1.0","name":"n"}"#, 7, "\"type\""),
            (r#"{"cniVersion":"1.1.0","type":"lace"}"#, 7, "\"name\""),
            (
                r#"{"cniVersion":"1.1.0","name":"-x","type":"lace"}"#,
                7,
                "\"-x\"",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"lace","agentSocket":5}"#,
                7,
                "agentSocket",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"lace","agentSocket":"x.sock"}"#,
                7,
                "absolute",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"lace","logLevel":"loud"}"#,
                7,
                "logLevel",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"lace","timeoutSeconds":0}"#,
                7,
                "timeoutSeconds",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"lace","timeoutSeconds":-1}"#,
                7,
                "timeoutSeconds",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"lace","timeoutSeconds":18446744073709551615}"#,
                7,
                "between 1 and 3600",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"lace","ipam":{"type":"host-local"}}"#,
                2,
                "host-local",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"lace","prevResult":{"ips":[{"address":"x"}]}}"#,
                7,
                "prevResult",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","type":"lace","cni.dev/valid-attachments":{}}"#,
                7,
                "valid-attachments",
            ),
        ];
        for (input, code, needle) in cases {
            let err = NetConf::parse(input.as_bytes()).unwrap_err();
            let cni: CniError = err.into();
            assert_eq!(cni.code, ErrorCode(*code), "{input}: {cni}");
            assert!(
                cni.msg.contains(needle),
                "{input}: {:?} lacks {needle:?}",
                cni.msg
            );
        }
    }

    #[test]
    fn conflist_written_by_agent_parses_after_runtime_merge() {
        let settings = PluginSettings {
            agent_socket: "/run/lace/other.sock".into(),
            del_queue_dir: "/var/lib/lace/q".into(),
            timeout_seconds: 7,
            log_file: Some("/var/log/lace-cni.log".into()),
            log_level: LogLevel::Debug,
        };
        let list = ConfList::lace("lace", settings.clone());
        let json = serde_json::to_value(&list).unwrap();
        assert_eq!(json["cniVersions"], json!(["0.4.0", "1.0.0", "1.1.0"]));
        // What the runtime does: copy the list's name and version into the plugin entry.
        let mut entry = json["plugins"][0].as_object().unwrap().clone();
        entry.insert("cniVersion".into(), json["cniVersion"].clone());
        entry.insert("name".into(), json["name"].clone());
        let conf = NetConf::parse(Value::Object(entry).to_string().as_bytes()).unwrap();
        assert_eq!(conf.settings, settings);
        assert_eq!(conf.cni_version, CniVersion::V1_1_0);
    }

    #[test]
    fn cni_args_from_containerd() {
        let args = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-5d78c9869d-abcde;\
             K8S_POD_INFRA_CONTAINER_ID=0123456789abcdef;K8S_POD_UID=1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        )
        .unwrap();
        assert_eq!(args.pod_namespace.as_deref(), Some("kube-system"));
        assert_eq!(args.pod_name.as_deref(), Some("coredns-5d78c9869d-abcde"));
        assert_eq!(args.infra_container_id.as_deref(), Some("0123456789abcdef"));
        assert_eq!(
            args.pod_uid.as_deref(),
            Some("1b4e28ba-2fa1-11d2-883f-0016d3cca427")
        );
        // containerd may add keys Lace does not know (e.g. for port mappings), and a trailing ';'.
        let args = CniArgs::parse("K8S_POD_NAME=a;FUTURE_KEY=x;IgnoreUnknown=true;").unwrap();
        assert_eq!(args.pod_name.as_deref(), Some("a"));
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert_eq!(CniArgs::parse("K8S_POD_NAME=").unwrap().pod_name, None);
    }

    #[test]
    fn cni_args_errors_name_the_part() {
        let cases = [
            ("K8S_POD_NAME", "\"K8S_POD_NAME\""),
            ("FOO=1", "FOO"),
            ("IgnoreUnknown=0;FOO=1", "FOO"),
            ("IgnoreUnknown=maybe", "maybe"),
            ("K8S_POD_NAME=a;K8S_POD_NAME=b", "twice"),
            ("K8S_POD_NAMESPACE=Kube_System", "Kube_System"),
            ("K8S_POD_NAME=a..b", "a..b"),
        ];
        for (input, needle) in cases {
            let err = CniArgs::parse(input).unwrap_err().to_string();
            assert!(err.contains(needle), "{input}: {err}");
        }
    }

    #[test]
    fn ifname_rules_match_the_kernel() {
        for ok in ["eth0", "net1", "a", "x-y_z.1", "123456789012345"] {
            validate_ifname(ok).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            "1234567890123456",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            "ä23456789012345",
        ] {
            assert!(validate_ifname(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn container_id_rules() {
        validate_container_id("0123abcdef_.-X").unwrap();
        for bad in ["", "-a", ".a", "a/b", "a b", "a;b"] {
            assert!(validate_container_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    fn sample_result() -> CniResult {
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
    fn protocol_round_trips() {
        let req = Request {
            command: Command::Add,
            container_id: Some("abc".into()),
            netns: Some("/var/run/netns/cni-1".into()),
            ifname: Some("eth0".into()),
            pod_namespace: Some("default".into()),
            pod_name: Some("web-0".into()),
            pod_uid: None,
            cni_version: CniVersion::V1_0_0,
            config: json!({"cniVersion":"1.0.0","x":1})
                .as_object()
                .unwrap()
                .clone(),
            prev_result: Some(sample_result()),
            valid_attachments: None,
        };
        let line = encode_line(&req).unwrap();
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(
            line.iter().filter(|&&b| b == b'\n').count(),
            1,
            "exactly one line"
        );
        let text = String::from_utf8(line.clone()).unwrap();
        assert!(text.contains(r#""command":"ADD""#) && text.contains(r#""cni_version":"1.0.0""#));
        assert_eq!(decode_line::<Request>(&line).unwrap(), req);

        for resp in [
            Response::Ok(Some(sample_result())),
            Response::Ok(None),
            Response::Err(CniError::new(ErrorCode::TRY_AGAIN_LATER, "busy").with_details("d")),
        ] {
            let line = encode_line(&resp).unwrap();
            assert_eq!(decode_line::<Response>(&line).unwrap(), resp);
        }
        assert_eq!(
            encode_line(&Response::Ok(None)).unwrap(),
            b"{\"ok\":null}\n"
        );
        let err: Response = decode_line(br#"{"err":{"code":50,"msg":"not ready"}}"#).unwrap();
        assert_eq!(
            err,
            Response::Err(CniError::new(ErrorCode::NOT_AVAILABLE, "not ready"))
        );
        assert!(matches!(
            decode_line::<Response>(&vec![b' '; MAX_MESSAGE_BYTES + 2]),
            Err(FrameError::TooLong)
        ));
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
            json!({"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]})
        );
        assert!(!CniVersion::V1_0_0.has_status_and_gc() && CniVersion::V1_1_0.has_status_and_gc());
    }

    #[test]
    fn del_queue_round_trip() {
        let dir = std::env::temp_dir()
            .join(format!("lace-wire-delq-{}", std::process::id()))
            .join("nested");
        let req = Request {
            command: Command::Del,
            container_id: Some("c1".into()),
            netns: None,
            ifname: Some("eth0".into()),
            pod_namespace: None,
            pod_name: None,
            pod_uid: None,
            cni_version: CniVersion::V1_1_0,
            config: Map::new(),
            prev_result: None,
            valid_attachments: None,
        };
        assert!(
            del_queue::pending(&dir).unwrap().is_empty(),
            "missing dir is an empty queue"
        );
        let path = del_queue::enqueue(&dir, &req).unwrap();
        assert_eq!(path.file_name().unwrap(), "c1.eth0.json");
        let mut second = req.clone();
        second.container_id = Some("c0".into());
        del_queue::enqueue(&dir, &second).unwrap();
        let pending = del_queue::pending(&dir).unwrap();
        assert_eq!(
            pending.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(),
            vec![second, req.clone()]
        );
        let mut add = req;
        add.command = Command::Add;
        let mut escape = add.clone();
        escape.command = Command::Del;
        escape.container_id = Some("../../etc/x".into());
        assert!(matches!(
            del_queue::enqueue(&dir, &escape),
            Err(del_queue::DelQueueError::BadName(_))
        ));
        assert!(matches!(
            del_queue::enqueue(&dir, &add),
            Err(del_queue::DelQueueError::NotADel(_))
        ));
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }
}
