//! The `loopback` plugin, served by the same binary for configurations of `"type":
//! "loopback"` (the agent installs a copy of it as `loopback` in the CNI bin dir where none
//! exists: containerd always sets up a sandbox's `lo` through that plugin).
//!
//! What it answers, like the reference plugin (containernetworking/plugins `loopback`):
//! - `ADD`: `lo` up in the sandbox, and a result of interface `lo` (MAC all zeros, the
//!   sandbox) with the first IPv4 and IPv6 address `lo` holds (127.0.0.1/8, and ::1/128 where
//!   IPv6 is on); a `prevResult` is passed on instead. The plugin has no netlink stack: the
//!   agent does the kernel work ([`Command::LoopbackAdd`]).
//! - `CHECK`: `lo` is up ([`Command::LoopbackCheck`], at the agent).
//! - `DEL`, `STATUS`, `GC`: success, without the agent. The reference plugin sets `lo` down at
//!   `DEL`; Lace leaves it: the runtime deletes the sandbox's namespace right after, and `lo`
//!   goes with it. So `DEL` is idempotent and needs no namespace (`CNI_NETNS` may be empty).
//!
//! The runtime's loopback configuration names no agent socket, so the settings (socket,
//! timeout, log) come from [`LOOPBACK_SETTINGS_FILE`] beside the executable, which the agent
//! writes with the conflist's values when it installs the copy; without it the defaults apply.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lace::wire::{
    CniError, Command, ErrorCode, LogLevel, LoopbackConf, PluginSettings, Request, Response,
    LOOPBACK_SETTINGS_FILE, LOOPBACK_TYPE,
};

use crate::agent::{self, AgentError};
use crate::env;
use crate::log::Logger;
use crate::netns;

/// What a verb prints on success: JSON bytes, or nothing.
type Output = Option<Vec<u8>>;

/// Where the settings came from, for messages.
enum Source {
    /// The settings file.
    File(PathBuf),
    /// The defaults: no settings file at this path (or the executable's directory unknown).
    Defaults(Option<PathBuf>),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::File(p) => write!(f, "the socket named in {}", p.display()),
            Source::Defaults(Some(p)) => write!(
                f,
                "the default socket: there is no {} (the Lace agent writes it when it installs \
                 this loopback plugin)",
                p.display()
            ),
            Source::Defaults(None) => write!(
                f,
                "the default socket: the plugin's own directory is unknown, so no \
                 {LOOPBACK_SETTINGS_FILE} was read"
            ),
        }
    }
}

/// The settings from [`LOOPBACK_SETTINGS_FILE`] beside the running executable, else the
/// defaults.
fn settings() -> Result<(PluginSettings, Source), CniError> {
    let Some(file) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(LOOPBACK_SETTINGS_FILE)))
    else {
        return Ok((PluginSettings::default(), Source::Defaults(None)));
    };
    read_settings(&file)
}

fn read_settings(file: &Path) -> Result<(PluginSettings, Source), CniError> {
    let bytes = match std::fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((
                PluginSettings::default(),
                Source::Defaults(Some(file.to_owned())),
            ))
        }
        Err(e) => {
            return Err(CniError::new(
                ErrorCode::IO,
                format!(
                    "loopback: cannot read the Lace settings file {}: {e}",
                    file.display()
                ),
            ))
        }
    };
    let settings = PluginSettings::parse(&bytes).map_err(|e| {
        CniError::new(
            ErrorCode::INVALID_NETCONF,
            format!(
                "loopback: the Lace settings file {} is invalid: {e}; the Lace agent rewrites it \
                 when it starts (restart it), or delete the file to use the default socket",
                file.display()
            ),
        )
    })?;
    Ok((settings, Source::File(file.to_owned())))
}

/// Runs CNI verb `command` of the loopback plugin. Errors carry the configuration's version.
pub fn run(command: Command, conf: LoopbackConf) -> Result<Output, CniError> {
    let version = conf.cni_version;
    let result = run_inner(command, conf);
    result.map_err(|mut e| {
        e.cni_version = Some(version.as_str().to_owned());
        e
    })
}

fn run_inner(command: Command, conf: LoopbackConf) -> Result<Output, CniError> {
    let version = conf.cni_version;
    let needs = match command {
        Command::Check => Some(("0.4.0", version.has_check())),
        Command::Status | Command::Gc => Some(("1.1.0", version.has_status_and_gc())),
        _ => None,
    };
    if let Some((since, false)) = needs {
        return Err(CniError::new(
            ErrorCode::INCOMPATIBLE_VERSION,
            format!(
                "config version {version} does not allow {command}: it was added in CNI {since}"
            ),
        ));
    }
    let Some(agent_command) = command.for_loopback() else {
        // DEL, STATUS, GC: nothing to do (see the module's description).
        return Ok(None);
    };
    let (settings, source) = settings()?;
    let (log, open_error) = Logger::open(settings.log_level, settings.log_file.as_deref());
    if let Some((path, e)) = open_error {
        log.log(
            LogLevel::Warn,
            format_args!("cannot open log file {path}: {e}; logging to stderr"),
        );
    }
    let started = Instant::now();
    let result = ask_agent(agent_command, &conf, &settings, &source);
    let elapsed = started.elapsed();
    match &result {
        Ok(_) => log.log(
            LogLevel::Info,
            format_args!("{LOOPBACK_TYPE} {command} ok in {elapsed:.1?}"),
        ),
        Err(e) => log.log(
            LogLevel::Error,
            format_args!(
                "{LOOPBACK_TYPE} {command} failed in {elapsed:.1?}: code {} {}",
                e.code, e.msg
            ),
        ),
    }
    result
}

/// ADD or CHECK at the agent: `lo` of the sandbox in `CNI_NETNS`.
fn ask_agent(
    command: Command,
    conf: &LoopbackConf,
    settings: &PluginSettings,
    source: &Source,
) -> Result<Output, CniError> {
    let netns = env::required_netns(command)?;
    netns::check(&netns)?;
    // The pod's identity only labels the agent's log lines; a CNI_ARGS Lace cannot read does
    // not stop the loopback network.
    let args = env::cni_args().unwrap_or_default();
    let request = Request {
        command,
        container_id: env::var("CNI_CONTAINERID")?,
        netns: Some(netns),
        ifname: Some("lo".to_owned()),
        pod_namespace: args.pod_namespace,
        pod_name: args.pod_name,
        pod_uid: args.pod_uid,
        cni_version: conf.cni_version,
        config: conf.raw.clone(),
        prev_result: conf.prev_result.clone(),
        valid_attachments: None,
    };
    let timeout = Duration::from_secs(settings.timeout_seconds);
    let response = agent::call(&settings.agent_socket, timeout, &request)
        .map_err(|e| agent_error(&e, source))?;
    match response {
        Response::Ok(_) if command == Command::LoopbackCheck => Ok(None),
        Response::Ok(Some(result)) => {
            result.validate().map_err(|e| {
                CniError::new(
                    ErrorCode::INTERNAL,
                    format!("the Lace agent returned an inconsistent loopback result: {e}"),
                )
            })?;
            // As the reference plugin: a previous result is passed on as it is.
            let printed = conf.prev_result.as_ref().unwrap_or(&result);
            serde_json::to_vec(&printed.to_json(conf.cni_version))
                .map(Some)
                .map_err(|e| {
                    CniError::new(
                        ErrorCode::INTERNAL,
                        format!("cannot encode the answer: {e}"),
                    )
                })
        }
        Response::Ok(None) => Err(CniError::new(
            ErrorCode::INTERNAL,
            "the Lace agent answered the loopback ADD without a result",
        )),
        Response::Err(e) if e.code == ErrorCode::DECODE && e.msg.contains("LOOPBACK_") => {
            Err(CniError::new(
                ErrorCode::INTERNAL,
                format!(
                    "the Lace agent does not serve the loopback plugin (it is older than this \
                     plugin: {}): upgrade the Lace agent, or install the reference loopback \
                     plugin in its place",
                    e.msg
                ),
            ))
        }
        Response::Err(e) => Err(e),
    }
}

fn agent_error(e: &AgentError, source: &Source) -> CniError {
    if e.is_transport() {
        CniError::new(
            ErrorCode::TRY_AGAIN_LATER,
            format!("loopback: {e} (using {source})"),
        )
    } else {
        CniError::new(ErrorCode::INTERNAL, format!("loopback: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_file_is_read_and_its_faults_named() {
        let dir = std::env::temp_dir().join(format!("lace-lo-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(LOOPBACK_SETTINGS_FILE);
        let (s, source) = read_settings(&file).unwrap();
        assert_eq!(s, PluginSettings::default());
        assert!(source.to_string().contains("there is no"), "{source}");
        std::fs::write(&file, br#"{"agentSocket":"/run/x.sock"}"#).unwrap();
        let (s, source) = read_settings(&file).unwrap();
        assert_eq!(s.agent_socket, PathBuf::from("/run/x.sock"));
        assert!(source.to_string().contains(LOOPBACK_SETTINGS_FILE));
        std::fs::write(&file, b"{\"agentSocket\":3}").unwrap();
        let err = read_settings(&file).err().unwrap();
        assert_eq!(err.code, ErrorCode::INVALID_NETCONF);
        assert!(
            err.msg.contains("agentSocket") && err.msg.contains("restart"),
            "{}",
            err.msg
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
