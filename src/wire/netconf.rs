//! The network configuration: what the runtime passes on stdin ([`NetConf`]) and the conflist
//! the agent writes for it ([`ConfList`]), with Lace's own keys ([`PluginSettings`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::environment::is_cni_identifier;
use super::runtime::{
    bandwidth, host_ports, BandwidthError, PortMappingError, BANDWIDTH, PORT_MAPPINGS,
};
use super::{CniError, CniResult, CniVersion, ErrorCode};
use crate::hostport::HostPort;

/// Value of `type` in Lace's conflist entry: the file name of the plugin in the CNI bin dir.
pub const PLUGIN_TYPE: &str = "lace";
/// The `type` of the loopback network runtimes set up beside every pod network (containerd:
/// `{"cniVersion": "0.3.1", "name": "cni-loopback", "plugins": [{"type": "loopback"}]}`). The
/// `lace` binary serves it too; the agent installs a copy named `loopback` in the CNI bin dir
/// where none exists.
pub const LOOPBACK_TYPE: &str = "loopback";
/// The file beside the installed `loopback` copy that tells it the agent's socket (the
/// runtime's loopback configuration carries none): Lace's [`PluginSettings`] as JSON, written
/// by the agent with the conflist's values. Without it the defaults apply.
pub const LOOPBACK_SETTINGS_FILE: &str = "lace-loopback.json";
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

/// The runtime-injected list of attachments that are still in use, passed with `GC`.
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// The name an earlier 1.1.0 draft used for [`VALID_ATTACHMENTS_KEY`]; libcni sends both, we
/// accept either.
pub const LEGACY_ATTACHMENTS_KEY: &str = "cni.dev/attachments";

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
    /// The pod's hostPorts (`runtimeConfig.portMappings`).
    pub host_ports: Vec<HostPort>,
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
        supported = CniVersion::list(&CniVersion::SUPPORTED)
    )]
    MissingVersion,
    /// A `cniVersion` the plugin does not speak.
    #[error("cniVersion {version:?} is not supported; {plugin} supports {list}", list = CniVersion::list(supported))]
    UnsupportedVersion {
        /// The version asked for.
        version: String,
        /// The plugin (`type`) asked.
        plugin: &'static str,
        /// What that plugin speaks.
        supported: &'static [CniVersion],
    },
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
    /// `runtimeConfig.portMappings` (the pod's hostPorts) cannot be used.
    #[error(transparent)]
    PortMappings(PortMappingError),
    /// `runtimeConfig.bandwidth` (the pod's bandwidth annotations) cannot be used.
    #[error(transparent)]
    Bandwidth(BandwidthError),
    /// `type` names another plugin.
    #[error(
        "network configuration type is {0:?}, but this plugin serves {PLUGIN_TYPE:?} (and \
         {LOOPBACK_TYPE:?})"
    )]
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
            NetConfError::MissingVersion | NetConfError::UnsupportedVersion { .. } => {
                ErrorCode::INCOMPATIBLE_VERSION
            }
            NetConfError::Unsupported { .. } => ErrorCode::UNSUPPORTED_FIELD,
            NetConfError::Missing(_)
            | NetConfError::Field { .. }
            | NetConfError::WrongType(_)
            | NetConfError::InvalidName(_)
            | NetConfError::RelativePath { .. }
            | NetConfError::PortMappings(_)
            | NetConfError::Bandwidth(_)
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

impl PluginSettings {
    /// Lace's keys of a configuration object (the conflist entry, or the loopback settings
    /// file), defaults filled in and validated.
    pub fn from_keys(obj: &Map<String, Value>) -> Result<Self, NetConfError> {
        let defaults = PluginSettings::default();
        Ok(PluginSettings {
            agent_socket: absolute(
                "agentSocket",
                field(obj, "agentSocket")?.unwrap_or(defaults.agent_socket),
            )?,
            del_queue_dir: absolute(
                "delQueueDir",
                field(obj, "delQueueDir")?.unwrap_or(defaults.del_queue_dir),
            )?,
            timeout_seconds: match field(obj, "timeoutSeconds")? {
                Some(t) if (1..=MAX_TIMEOUT_SECONDS).contains(&t) => t,
                Some(t) => return Err(NetConfError::Timeout(t)),
                None => defaults.timeout_seconds,
            },
            log_file: field(obj, "logFile")?
                .map(|p| absolute("logFile", p))
                .transpose()?,
            log_level: field(obj, "logLevel")?.unwrap_or(defaults.log_level),
        })
    }

    /// [`PluginSettings::from_keys`] of a JSON document (the loopback settings file).
    pub fn parse(bytes: &[u8]) -> Result<Self, NetConfError> {
        match serde_json::from_slice(bytes).map_err(NetConfError::Json)? {
            Value::Object(map) => Self::from_keys(&map),
            other => Err(NetConfError::NotAnObject(json_kind(&other))),
        }
    }
}

/// What the runtime asked the binary to be, by the configuration's `type`.
#[derive(Clone, Debug, PartialEq)]
pub enum PluginConf {
    /// Lace's own network (`"type": "lace"`).
    Lace(NetConf),
    /// The loopback network (`"type": "loopback"`).
    Loopback(LoopbackConf),
}

impl PluginConf {
    /// Parses the configuration bytes from stdin: `"type": "loopback"` as [`LoopbackConf`],
    /// anything else as Lace's [`NetConf`] (which names what is wrong with it).
    pub fn parse(bytes: &[u8]) -> Result<PluginConf, NetConfError> {
        let raw = object(bytes)?;
        if raw.get("type").and_then(Value::as_str) == Some(LOOPBACK_TYPE) {
            LoopbackConf::from_map(raw).map(PluginConf::Loopback)
        } else {
            NetConf::from_map(raw).map(PluginConf::Lace)
        }
    }
}

/// The configuration bytes as a JSON object.
fn object(bytes: &[u8]) -> Result<Map<String, Value>, NetConfError> {
    let value: Value = serde_json::from_slice(bytes).map_err(NetConfError::Json)?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(NetConfError::NotAnObject(json_kind(&other))),
    }
}

/// The `loopback` plugin's configuration. Like the reference plugin it reads only the
/// version (absent means 0.1.0, as the spec says) and a `prevResult`, which it passes on.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopbackConf {
    /// The version the runtime speaks for this invocation (any of [`CniVersion::ALL`]).
    pub cni_version: CniVersion,
    /// The previous result, passed on unchanged by ADD (as the reference plugin does).
    pub prev_result: Option<CniResult>,
    /// The whole configuration as received.
    pub raw: Map<String, Value>,
}

impl LoopbackConf {
    /// Parses a configuration whose `type` is `loopback`.
    pub fn parse(bytes: &[u8]) -> Result<LoopbackConf, NetConfError> {
        let raw = object(bytes)?;
        match field::<String>(&raw, "type")? {
            Some(t) if t == LOOPBACK_TYPE => Self::from_map(raw),
            Some(t) => Err(NetConfError::WrongType(t)),
            None => Err(NetConfError::Missing("type")),
        }
    }

    fn from_map(raw: Map<String, Value>) -> Result<LoopbackConf, NetConfError> {
        let version: Option<String> = field(&raw, "cniVersion")?;
        let cni_version = match version {
            None => CniVersion::V0_1_0,
            Some(v) => v.parse().map_err(|_| NetConfError::UnsupportedVersion {
                version: v,
                plugin: LOOPBACK_TYPE,
                supported: &CniVersion::ALL,
            })?,
        };
        let prev_result = field(&raw, "prevResult")?;
        Ok(LoopbackConf {
            cni_version,
            prev_result,
            raw,
        })
    }
}

impl NetConf {
    /// Parses and validates the configuration bytes from stdin. Unknown keys are kept in
    /// [`NetConf::raw`] and otherwise ignored, as the spec requires.
    pub fn parse(bytes: &[u8]) -> Result<NetConf, NetConfError> {
        Self::from_map(object(bytes)?)
    }

    fn from_map(raw: Map<String, Value>) -> Result<NetConf, NetConfError> {
        // Version first: a config from another version may legitimately differ in every
        // other key, so the version error is the one that explains the rest.
        let version: String = field(&raw, "cniVersion")?.ok_or(NetConfError::MissingVersion)?;
        let cni_version = version
            .parse()
            .ok()
            .filter(|v| CniVersion::SUPPORTED.contains(v))
            .ok_or(NetConfError::UnsupportedVersion {
                version,
                plugin: PLUGIN_TYPE,
                supported: &CniVersion::SUPPORTED,
            })?;
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
        let settings = PluginSettings::from_keys(&raw)?;
        let prev_result = field(&raw, "prevResult")?;
        let valid_attachments = match field(&raw, VALID_ATTACHMENTS_KEY)? {
            Some(list) => Some(list),
            None => field(&raw, LEGACY_ATTACHMENTS_KEY)?,
        };
        let host_ports = host_ports(&raw).map_err(NetConfError::PortMappings)?;
        // Checked here so that a bad value fails before the agent is asked; the agent reads
        // it from the configuration forwarded to it.
        bandwidth(&raw).map_err(NetConfError::Bandwidth)?;
        Ok(NetConf {
            cni_version,
            name,
            settings,
            prev_result,
            valid_attachments,
            host_ports,
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
    /// The runtime capabilities Lace takes (`{"bandwidth": true, "portMappings": true}`):
    /// the runtime passes what the pod asks of them in `runtimeConfig`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capabilities: BTreeMap<String, bool>,
    /// Lace's keys.
    #[serde(flatten)]
    pub settings: PluginSettings,
}

/// A network configuration list (`10-lace.conflist`), as the agent writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfList {
    /// The version a runtime that reads only this key uses ([`CniVersion::CONFLIST`]).
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
            cni_version: CniVersion::CONFLIST,
            cni_versions: CniVersion::SUPPORTED.to_vec(),
            name: name.into(),
            plugins: vec![PluginEntry {
                plugin_type: PLUGIN_TYPE.to_owned(),
                capabilities: BTreeMap::from([
                    (PORT_MAPPINGS.to_owned(), true),
                    (BANDWIDTH.to_owned(), true),
                ]),
                settings,
            }],
        }
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
        "capabilities": {"portMappings": true, "bandwidth": true},
        "runtimeConfig": {"portMappings": [], "bandwidth": {"IngressRate": 10000000,
            "IngressBurst": 4294967295, "EgressRate": 0, "EgressBurst": 0}},
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
        assert_eq!(
            conf.raw["runtimeConfig"]["bandwidth"]["IngressRate"],
            json!(10_000_000),
            "the runtime's bandwidth is forwarded to the agent"
        );
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
                r#"{"cniVersion":"1.1.0","name":"n","type":"lace","runtimeConfig":{"bandwidth":{"ingressRate":-1}}}"#,
                7,
                "runtimeConfig.bandwidth.ingressRate is -1",
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
        assert_eq!(json["cniVersion"], "1.0.0");
        // The runtime passes a pod's hostPorts and bandwidth only to a plugin declaring them.
        assert_eq!(
            json["plugins"][0]["capabilities"],
            json!({"bandwidth": true, "portMappings": true})
        );
        assert_eq!(json["cniVersions"], json!(["0.4.0", "1.0.0", "1.1.0"]));
        // What the runtime does: copy the list's name and version into the plugin entry.
        let mut entry = json["plugins"][0].as_object().unwrap().clone();
        entry.insert("cniVersion".into(), json["cniVersion"].clone());
        entry.insert("name".into(), json["name"].clone());
        let conf = NetConf::parse(Value::Object(entry).to_string().as_bytes()).unwrap();
        assert_eq!(conf.settings, settings);
        assert_eq!(conf.cni_version, CniVersion::V1_0_0);
    }

    /// The result versions libcni 1.1.x (containerd 1.6 and 1.7) can read: its result
    /// converters are registered for these and no others.
    const LIBCNI_1_1_RESULTS: [&str; 6] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];
    /// The newest version libcni 1.2 and 1.3 (containerd 2.x) implement.
    const LIBCNI_1_2_CURRENT: CniVersion = CniVersion::V1_1_0;

    /// The version libcni 1.1.x hands the plugins of a conflist: its `cniVersion`, nothing
    /// else (it does not know `cniVersions`).
    fn libcni_1_1_version(list: &Value) -> String {
        list["cniVersion"].as_str().unwrap().to_owned()
    }

    /// The version libcni 1.2+ hands them: the highest of `cniVersions` and `cniVersion` that
    /// is not newer than what it implements.
    fn libcni_1_2_version(list: &Value) -> String {
        let mut known: Vec<CniVersion> = list["cniVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(std::iter::once(&list["cniVersion"]))
            .filter_map(|v| v.as_str()?.parse().ok())
            .filter(|v| *v <= LIBCNI_1_2_CURRENT)
            .collect();
        known.sort();
        known.last().unwrap().as_str().to_owned()
    }

    /// What the plugin prints for an ADD under `version`, as the runtime would read it.
    fn result_version_for(list: &Value, version: &str) -> String {
        let mut entry = list["plugins"][0].as_object().unwrap().clone();
        entry.insert("cniVersion".into(), json!(version));
        entry.insert("name".into(), list["name"].clone());
        let conf = NetConf::parse(Value::Object(entry).to_string().as_bytes()).unwrap();
        let json = crate::wire::spec::tests::sample_result().to_json(conf.cni_version);
        json["cniVersion"].as_str().unwrap().to_owned()
    }

    #[test]
    fn containerd_1_6_and_2_x_both_read_the_result_of_the_conflist_the_agent_writes() {
        let list = serde_json::to_value(ConfList::lace("lace", PluginSettings::default())).unwrap();
        // Every version up to the newest stays listed for runtimes that negotiate.
        assert_eq!(list["cniVersions"], json!(["0.4.0", "1.0.0", "1.1.0"]));
        // containerd 1.6/1.7: the plugin answers in `cniVersion`, which libcni 1.1 can read.
        let old = libcni_1_1_version(&list);
        assert_eq!(old, "1.0.0");
        let printed = result_version_for(&list, &old);
        assert!(
            LIBCNI_1_1_RESULTS.contains(&printed.as_str()),
            "libcni 1.1 would refuse the result: unsupported CNI result version {printed:?}"
        );
        // containerd 2.x: the highest common version, 1.1.0 (MTUs and the other 1.1 fields).
        let new = libcni_1_2_version(&list);
        assert_eq!(new, "1.1.0");
        assert_eq!(result_version_for(&list, &new), "1.1.0");
    }

    #[test]
    fn a_conflist_saying_1_1_0_is_what_containerd_1_6_refused() {
        // The conflist as the agent wrote it before: the check above would have caught it.
        let mut list =
            serde_json::to_value(ConfList::lace("lace", PluginSettings::default())).unwrap();
        list["cniVersion"] = json!("1.1.0");
        let printed = result_version_for(&list, &libcni_1_1_version(&list));
        assert_eq!(printed, "1.1.0");
        assert!(!LIBCNI_1_1_RESULTS.contains(&printed.as_str()));
    }

    /// What containerd passes the loopback plugin: go-cni's fixed list, merged by libcni.
    const CONTAINERD_LOOPBACK: &str =
        r#"{"cniVersion":"0.3.1","name":"cni-loopback","type":"loopback"}"#;

    #[test]
    fn loopback_configurations_of_every_version_are_told_from_laces() {
        let PluginConf::Loopback(lo) = PluginConf::parse(CONTAINERD_LOOPBACK.as_bytes()).unwrap()
        else {
            panic!("not a loopback configuration");
        };
        assert_eq!(lo.cni_version, CniVersion::V0_3_1);
        assert!(lo.prev_result.is_none());
        for v in CniVersion::ALL {
            let conf = json!({"cniVersion": v.as_str(), "name": "lo", "type": "loopback"});
            assert_eq!(
                LoopbackConf::parse(conf.to_string().as_bytes())
                    .unwrap()
                    .cni_version,
                v
            );
        }
        // No version means 0.1.0 (the spec), which the reference plugin accepts too.
        assert_eq!(
            LoopbackConf::parse(br#"{"type":"loopback"}"#)
                .unwrap()
                .cni_version,
            CniVersion::V0_1_0
        );
        let err = LoopbackConf::parse(br#"{"cniVersion":"9.0.0","type":"loopback"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"9.0.0\"") && err.contains("loopback supports 0.1.0"),
            "{err}"
        );
        assert!(matches!(
            LoopbackConf::parse(CONTAINERD_ADD.as_bytes()),
            Err(NetConfError::WrongType(t)) if t == "lace"
        ));
        // Lace's own network keeps its versions: 0.3.1 is loopback's only.
        assert!(matches!(
            PluginConf::parse(CONTAINERD_ADD.as_bytes()).unwrap(),
            PluginConf::Lace(_)
        ));
        let err = PluginConf::parse(br#"{"cniVersion":"0.3.1","name":"n","type":"lace"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lace supports 0.4.0, 1.0.0, 1.1.0"), "{err}");
        let err = PluginConf::parse(br#"{"cniVersion":"1.0.0","name":"n","type":"bridge"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"bridge\"") && err.contains("loopback"),
            "{err}"
        );
    }

    #[test]
    fn loopback_settings_file_is_laces_keys() {
        let settings = PluginSettings {
            agent_socket: "/run/lace/other.sock".into(),
            timeout_seconds: 9,
            ..Default::default()
        };
        let bytes = serde_json::to_vec(&settings).unwrap();
        assert_eq!(PluginSettings::parse(&bytes).unwrap(), settings);
        assert_eq!(
            PluginSettings::parse(b"{}").unwrap(),
            PluginSettings::default()
        );
        for (bad, needle) in [
            (&b"[]"[..], "an array"),
            (b"{\"agentSocket\":\"rel.sock\"}", "absolute"),
            (b"{\"timeoutSeconds\":0}", "timeoutSeconds"),
        ] {
            let err = PluginSettings::parse(bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }
}
