//! The network configuration: what the runtime passes on stdin ([`NetConf`]) and the conflist
//! the agent writes for it ([`ConfList`]), with Lace's own keys ([`PluginSettings`]).

use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::environment::is_cni_identifier;
use super::{CniError, CniResult, CniVersion, ErrorCode};

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
}
