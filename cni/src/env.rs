//! The `CNI_*` environment variables, read and validated.
//!
//! Every error here is the spec's code 4 (invalid environment) and names the variable.

use std::path::PathBuf;

use lace::wire::{
    validate_container_id, validate_ifname, CniArgs, CniArgsError, CniError, Command,
    ContainerIdError, ErrorCode, IfnameError,
};

/// What `CNI_COMMAND` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// `VERSION`: answered by the plugin alone.
    Version,
    /// A verb the agent serves.
    Agent(Command),
}

/// Why the environment is unusable.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// `CNI_COMMAND` is unset.
    #[error("CNI_COMMAND is not set; expected one of ADD, DEL, CHECK, STATUS, GC, VERSION")]
    NoCommand,
    /// `CNI_COMMAND` names no verb.
    #[error("CNI_COMMAND={0:?} is not one of ADD, DEL, CHECK, STATUS, GC, VERSION")]
    UnknownCommand(String),
    /// A variable the verb needs is unset or empty.
    #[error("{name} is not set, but {command} requires it")]
    Missing {
        /// The variable.
        name: &'static str,
        /// The verb.
        command: Command,
    },
    /// A variable that is not UTF-8.
    #[error("{0} is not valid UTF-8")]
    NotUnicode(&'static str),
    /// Bad `CNI_CONTAINERID`.
    #[error("CNI_CONTAINERID: {0}")]
    ContainerId(#[from] ContainerIdError),
    /// Bad `CNI_IFNAME`.
    #[error("CNI_IFNAME: {0}")]
    Ifname(#[from] IfnameError),
    /// Bad `CNI_ARGS`.
    #[error(transparent)]
    Args(#[from] CniArgsError),
    /// `CNI_ARGS` lacks a pod key that ADD needs.
    #[error(
        "CNI_ARGS has no {0}; Lace needs the pod's namespace and name to bind it to a Network"
    )]
    MissingPodArg(&'static str),
    /// `CNI_NETNS` is relative.
    #[error("CNI_NETNS={0:?} is not an absolute path")]
    RelativeNetns(String),
}

impl From<EnvError> for CniError {
    fn from(e: EnvError) -> Self {
        CniError::new(ErrorCode::INVALID_ENVIRONMENT, e.to_string())
    }
}

/// The variable's value; unset and empty both count as absent.
pub fn var(name: &'static str) -> Result<Option<String>, EnvError> {
    match std::env::var(name) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(EnvError::NotUnicode(name)),
    }
}

fn required(name: &'static str, command: Command) -> Result<String, EnvError> {
    var(name)?.ok_or(EnvError::Missing { name, command })
}

/// `CNI_COMMAND`.
pub fn verb() -> Result<Verb, EnvError> {
    let command = var("CNI_COMMAND")?.ok_or(EnvError::NoCommand)?;
    if command == "VERSION" {
        return Ok(Verb::Version);
    }
    Command::parse(&command)
        .map(Verb::Agent)
        .ok_or(EnvError::UnknownCommand(command))
}

/// `CNI_CONTAINERID`, required and validated.
pub fn container_id(command: Command) -> Result<String, EnvError> {
    let id = required("CNI_CONTAINERID", command)?;
    validate_container_id(&id)?;
    Ok(id)
}

/// `CNI_IFNAME`, required and validated. A set-but-empty value is reported as empty rather
/// than missing, since that is the more precise complaint.
pub fn ifname(command: Command) -> Result<String, EnvError> {
    match std::env::var("CNI_IFNAME") {
        Ok(name) => {
            validate_ifname(&name)?;
            Ok(name)
        }
        Err(std::env::VarError::NotPresent) => Err(EnvError::Missing {
            name: "CNI_IFNAME",
            command,
        }),
        Err(std::env::VarError::NotUnicode(_)) => Err(EnvError::NotUnicode("CNI_IFNAME")),
    }
}

/// `CNI_NETNS` as an absolute path, if set.
pub fn netns() -> Result<Option<PathBuf>, EnvError> {
    match var("CNI_NETNS")? {
        Some(p) if p.starts_with('/') => Ok(Some(PathBuf::from(p))),
        Some(p) => Err(EnvError::RelativeNetns(p)),
        None => Ok(None),
    }
}

/// `CNI_NETNS`, required.
pub fn required_netns(command: Command) -> Result<PathBuf, EnvError> {
    netns()?.ok_or(EnvError::Missing {
        name: "CNI_NETNS",
        command,
    })
}

/// `CNI_ARGS`, parsed (absent is empty).
pub fn cni_args() -> Result<CniArgs, EnvError> {
    Ok(CniArgs::parse(&var("CNI_ARGS")?.unwrap_or_default())?)
}
