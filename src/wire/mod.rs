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
//!
//! The spec's types are split by what they describe: `spec` (versions, the error, the result),
//! `netconf` (the configuration) and `environment` (`CNI_ARGS` and the names the runtime
//! passes); the protocol is `protocol`. Everything is re-exported here.

pub mod del_queue;
mod environment;
mod netconf;
mod protocol;
mod runtime;
mod spec;

pub use environment::{
    validate_container_id, validate_ifname, CniArgs, CniArgsError, ContainerIdError, IfnameError,
    MAX_IFNAME_LEN,
};
pub use netconf::{
    Attachment, ConfList, LogLevel, LoopbackConf, NetConf, NetConfError, PluginConf, PluginEntry,
    PluginSettings, DEFAULT_AGENT_SOCKET, DEFAULT_DEL_QUEUE_DIR, DEFAULT_TIMEOUT_SECONDS,
    LEGACY_ATTACHMENTS_KEY, LOOPBACK_SETTINGS_FILE, LOOPBACK_TYPE, MAX_TIMEOUT_SECONDS,
    PLUGIN_TYPE, VALID_ATTACHMENTS_KEY,
};
pub use protocol::{
    decode_line, encode_line, Command, FrameError, Request, Response, MAX_MESSAGE_BYTES,
};
pub use runtime::{
    bandwidth, host_ports, BandwidthError, PortMappingError, BANDWIDTH, PORT_MAPPINGS,
};
pub use spec::{
    CniError, CniResult, CniVersion, Dns, ErrorCode, Interface, IpConfig, ResultError, Route,
    UnknownVersion, VersionInfo,
};
