//! One function per CNI verb, in the style of the reference plugins: each gathers and
//! validates exactly the inputs its verb needs, then asks the agent. A configuration of
//! `"type": "loopback"` goes to [`crate::loopback`] instead.
//!
//! What happens when the agent cannot be reached (socket missing, connection refused, no
//! answer in time):
//! - `ADD`, `CHECK`, `GC`: code 11 "try again later", naming the socket; the runtime retries.
//! - `STATUS`: code 50 "not available", so the runtime does not schedule ADDs (after at most
//!   5 s even if `timeoutSeconds` is longer).
//! - `DEL`: queued on disk ([`lace::wire::del_queue`]) and reported as success. A DEL that
//!   fails keeps the pod `Terminating` until one succeeds, and an agent that is gone for good
//!   would wedge every pod on the node. Succeeding without the agent leaks nothing: the
//!   pod-side veth dies with the pod's network namespace (taking the host side and its route
//!   along), and the agent replays the queued DEL (which is idempotent) before it serves
//!   requests again, releasing the address. Only if the queue cannot be written either does
//!   DEL fail with 11. Errors the agent itself reports are passed on unchanged for every verb.

use std::io::{IsTerminal, Read};
use std::time::{Duration, Instant};

use lace::wire::{
    del_queue, CniError, CniResult, Command, ErrorCode, LogLevel, NetConf, PluginConf, Request,
    Response, VersionInfo, MAX_MESSAGE_BYTES,
};

use crate::agent::{self, AgentError};
use crate::env::{self, EnvError, Verb};
use crate::log::Logger;
use crate::loopback;
use crate::netns;

/// Upper bound for the STATUS round trip.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// What a verb prints on success: JSON bytes, or nothing.
type Output = Option<Vec<u8>>;

/// Everything a verb needs besides the environment.
struct Ctx {
    conf: NetConf,
    log: Logger,
}

macro_rules! log {
    ($ctx:expr, $level:ident, $($arg:tt)*) => {
        $ctx.log.log(LogLevel::$level, format_args!($($arg)*))
    };
}

/// Runs the verb named by `CNI_COMMAND`. Errors carry the configuration's `cniVersion` once
/// it is known.
pub fn run() -> Result<Output, CniError> {
    // Debug builds only: lets the tests prove that a panic still yields a CNI error.
    #[cfg(debug_assertions)]
    if std::env::var_os("LACE_CNI_TEST_PANIC").is_some() {
        panic!("panic requested by LACE_CNI_TEST_PANIC");
    }
    let command = match env::verb()? {
        Verb::Version => return cmd_version(),
        Verb::Agent(command) => command,
    };
    let stdin = read_stdin()?;
    let conf = match PluginConf::parse(&stdin)? {
        PluginConf::Lace(conf) => conf,
        PluginConf::Loopback(conf) => return loopback::run(command, conf),
    };
    let version = conf.cni_version;
    let (log, open_error) =
        Logger::open(conf.settings.log_level, conf.settings.log_file.as_deref());
    let ctx = Ctx { conf, log };
    if let Some((path, e)) = open_error {
        log!(
            ctx,
            Warn,
            "cannot open log file {path}: {e}; logging to stderr"
        );
    }
    let started = Instant::now();
    let result = if matches!(command, Command::Status | Command::Gc) && !version.has_status_and_gc()
    {
        Err(CniError::new(
            ErrorCode::INCOMPATIBLE_VERSION,
            format!("config version {version} does not allow {command}: it was added in CNI 1.1.0"),
        ))
    } else {
        match command {
            Command::Add => cmd_add(&ctx),
            Command::Del => cmd_del(&ctx),
            Command::Check => cmd_check(&ctx),
            Command::Status => cmd_status(&ctx),
            Command::Gc => cmd_gc(&ctx),
            // Not CNI_COMMAND values (`Command::parse` never gives them).
            Command::LoopbackAdd | Command::LoopbackCheck => Err(CniError::new(
                ErrorCode::INVALID_ENVIRONMENT,
                format!("CNI_COMMAND={command} is not a CNI verb"),
            )),
        }
    };
    let elapsed = started.elapsed();
    match &result {
        Ok(_) => log!(ctx, Info, "{command}{} ok in {elapsed:.1?}", describe_env()),
        Err(e) => log!(
            ctx,
            Error,
            "{command}{} failed in {elapsed:.1?}: code {} {}",
            describe_env(),
            e.code,
            e.msg
        ),
    }
    result.map_err(|mut e| {
        e.cni_version = Some(version.as_str().to_owned());
        e
    })
}

/// The invocation's identity for log lines, read leniently (it is only for humans).
fn describe_env() -> String {
    ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS", "CNI_ARGS"]
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| format!(" {name}={v}")))
        .collect()
}

/// Reads the configuration from stdin, at most [`MAX_MESSAGE_BYTES`] (it has to fit into one
/// request to the agent).
fn read_stdin() -> Result<Vec<u8>, CniError> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_MESSAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            CniError::new(
                ErrorCode::IO,
                format!("cannot read the network configuration from stdin: {e}"),
            )
        })?;
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(CniError::new(
            ErrorCode::INVALID_NETCONF,
            format!("network configuration on stdin is larger than {MAX_MESSAGE_BYTES} bytes"),
        ));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(CniError::new(
            ErrorCode::DECODE,
            "stdin is empty; the runtime must pass the network configuration on stdin",
        ));
    }
    Ok(bytes)
}

/// `VERSION`: the versions we speak. Needs nothing but `CNI_COMMAND`; the configuration the
/// runtime sends (`{"cniVersion": ...}`) is read and ignored, whatever it says.
fn cmd_version() -> Result<Output, CniError> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        // Drain what the runtime wrote so it never sees EPIPE; the content does not matter.
        let _ = stdin
            .lock()
            .take(MAX_MESSAGE_BYTES as u64)
            .read_to_end(&mut Vec::new());
    }
    to_json(&VersionInfo::lace())
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<Output, CniError> {
    serde_json::to_vec(value).map(Some).map_err(|e| {
        CniError::new(
            ErrorCode::INTERNAL,
            format!("cannot encode the answer: {e}"),
        )
    })
}

/// A request for `command` with the configuration filled in and no attachment fields.
fn request(ctx: &Ctx, command: Command) -> Request {
    Request {
        config: ctx.conf.raw.clone(),
        prev_result: ctx.conf.prev_result.clone(),
        valid_attachments: ctx.conf.valid_attachments.clone(),
        ..Request::without_attachment(command, ctx.conf.cni_version)
    }
}

/// A request for an attachment verb: container id, ifname and pod identity filled in.
fn attachment_request(ctx: &Ctx, command: Command) -> Result<Request, EnvError> {
    let args = env::cni_args()?;
    Ok(Request {
        container_id: Some(env::container_id(command)?),
        ifname: Some(env::ifname(command)?),
        pod_namespace: args.pod_namespace,
        pod_name: args.pod_name,
        pod_uid: args.pod_uid,
        ..request(ctx, command)
    })
}

fn call(ctx: &Ctx, request: &Request) -> Result<Response, AgentError> {
    if ctx.log.enabled(LogLevel::Debug) {
        let json = serde_json::to_string(request).unwrap_or_default();
        log!(
            ctx,
            Debug,
            "request to {}: {json}",
            ctx.conf.settings.agent_socket.display()
        );
    }
    let mut timeout = Duration::from_secs(ctx.conf.settings.timeout_seconds);
    if request.command == Command::Status {
        // The runtime polls STATUS to decide node readiness; a hung agent must turn into
        // "not available" quickly, not after a full ADD-sized timeout.
        timeout = timeout.min(STATUS_TIMEOUT);
    }
    agent::call(&ctx.conf.settings.agent_socket, timeout, request)
}

/// The CNI error for a failed agent call: `transport_code` when the agent could not be
/// reached, 999 when it answered nonsense.
fn agent_error(e: &AgentError, transport_code: ErrorCode) -> CniError {
    if e.is_transport() {
        CniError::new(transport_code, e.to_string())
    } else {
        CniError::new(ErrorCode::INTERNAL, e.to_string())
    }
}

/// An answer that carries no result (every verb but ADD).
fn expect_empty(ctx: &Ctx, command: Command, response: Response) -> Result<Output, CniError> {
    match response {
        Response::Ok(None) => Ok(None),
        Response::Ok(Some(_)) => {
            log!(
                ctx,
                Warn,
                "the Lace agent answered {command} with a result; ignored"
            );
            Ok(None)
        }
        Response::Err(e) => Err(e),
    }
}

/// `ADD`: attach the container. Needs container id, ifname, a real network namespace and the
/// pod's identity (Lace binds pods to Networks by namespace and labels).
/// A `prevResult` (Lace chained after another plugin) goes to the agent with the request; the
/// agent's result is what the runtime gets.
fn cmd_add(ctx: &Ctx) -> Result<Output, CniError> {
    let mut req = attachment_request(ctx, Command::Add)?;
    let netns = env::required_netns(Command::Add)?;
    netns::check(&netns)?;
    req.netns = Some(netns);
    if req.pod_namespace.is_none() {
        return Err(EnvError::MissingPodArg("K8S_POD_NAMESPACE").into());
    }
    if req.pod_name.is_none() {
        return Err(EnvError::MissingPodArg("K8S_POD_NAME").into());
    }
    let response = call(ctx, &req).map_err(|e| agent_error(&e, ErrorCode::TRY_AGAIN_LATER))?;
    match response {
        Response::Ok(Some(result)) => add_output(ctx, &result),
        Response::Ok(None) => Err(CniError::new(
            ErrorCode::INTERNAL,
            "the Lace agent answered ADD without a result",
        )),
        Response::Err(e) => Err(e),
    }
}

fn add_output(ctx: &Ctx, result: &CniResult) -> Result<Output, CniError> {
    result.validate().map_err(|e| {
        CniError::new(
            ErrorCode::INTERNAL,
            format!("the Lace agent returned an inconsistent result: {e}"),
        )
    })?;
    to_json(&result.to_json(ctx.conf.cni_version))
}

/// `DEL`: detach the container; succeeds when there is nothing left to delete. The network
/// namespace may already be gone, so it is passed on only if it still is one.
fn cmd_del(ctx: &Ctx) -> Result<Output, CniError> {
    let mut req = attachment_request(ctx, Command::Del)?;
    req.netns = match env::netns()? {
        Some(path) => match netns::check(&path) {
            Ok(()) => Some(path),
            Err(e) => {
                log!(ctx, Info, "DEL without the network namespace: {e}");
                None
            }
        },
        None => None,
    };
    match call(ctx, &req) {
        Ok(response) => expect_empty(ctx, Command::Del, response),
        Err(e) if e.is_transport() => queue_del(ctx, &req, &e),
        Err(e) => Err(agent_error(&e, ErrorCode::TRY_AGAIN_LATER)),
    }
}

fn queue_del(ctx: &Ctx, req: &Request, cause: &AgentError) -> Result<Output, CniError> {
    let dir = &ctx.conf.settings.del_queue_dir;
    match del_queue::enqueue(dir, req) {
        Ok(path) => {
            log!(
                ctx,
                Warn,
                "{cause}; DEL queued as {} for the agent to replay",
                path.display()
            );
            Ok(None)
        }
        Err(queue_error) => Err(CniError::new(
            ErrorCode::TRY_AGAIN_LATER,
            format!("{cause}, and the DEL could not be queued: {queue_error}"),
        )),
    }
}

/// `CHECK`: ask the agent to verify the attachment against the `prevResult` of the ADD.
fn cmd_check(ctx: &Ctx) -> Result<Output, CniError> {
    let mut req = attachment_request(ctx, Command::Check)?;
    let netns = env::required_netns(Command::Check)?;
    netns::check(&netns)?;
    req.netns = Some(netns);
    if req.prev_result.is_none() {
        return Err(CniError::new(
            ErrorCode::INVALID_NETCONF,
            "CHECK needs prevResult (the result of the ADD) in the network configuration",
        ));
    }
    let response = call(ctx, &req).map_err(|e| agent_error(&e, ErrorCode::TRY_AGAIN_LATER))?;
    expect_empty(ctx, Command::Check, response)
}

/// `STATUS`: is the agent ready to serve ADD?
fn cmd_status(ctx: &Ctx) -> Result<Output, CniError> {
    let response = call(ctx, &request(ctx, Command::Status)).map_err(|e| {
        let mut error = agent_error(&e, ErrorCode::NOT_AVAILABLE);
        if error.code == ErrorCode::NOT_AVAILABLE {
            error.msg = format!("Lace is not ready: {}", error.msg);
        }
        error
    })?;
    expect_empty(ctx, Command::Status, response)
}

/// `GC`: release everything not in `cni.dev/valid-attachments`. A configuration without the
/// list is refused rather than read as "nothing is valid", which would detach every pod.
fn cmd_gc(ctx: &Ctx) -> Result<Output, CniError> {
    if ctx.conf.valid_attachments.is_none() {
        return Err(CniError::new(
            ErrorCode::INVALID_NETCONF,
            "GC needs cni.dev/valid-attachments in the network configuration",
        ));
    }
    let response = call(ctx, &request(ctx, Command::Gc))
        .map_err(|e| agent_error(&e, ErrorCode::TRY_AGAIN_LATER))?;
    expect_empty(ctx, Command::Gc, response)
}
