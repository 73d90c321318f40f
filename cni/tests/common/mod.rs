//! Shared by the CLI tests and the benchmark: a fake Lace agent on a real unix socket, a
//! temporary directory, a real network namespace, and a runner that execs the real `lace`
//! binary the way containerd does.
#![allow(dead_code)] // each test crate uses a different subset

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use lace::wire::{Request, Response};
use serde_json::Value;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("lace-cni-test"));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A real network namespace (`ip netns add`), deleted on drop. Needs root.
pub struct Netns {
    pub name: String,
    pub path: PathBuf,
}

impl Netns {
    pub fn new() -> Self {
        let name = unique("lace-cni-t");
        let status = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(
            status.success(),
            "ip netns add {name} failed (these tests need root)"
        );
        Netns {
            path: PathBuf::from("/run/netns").join(&name),
            name,
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// What the fake agent does with one connection.
pub enum Reply {
    /// Answer with this response.
    Respond(Response),
    /// Answer with these raw bytes.
    Raw(Vec<u8>),
    /// Read the request, then keep the connection open without answering.
    Hang,
}

type Script = dyn Fn(&Request) -> Reply + Send + Sync;

/// A fake agent: a `UnixListener` answering each request per a script and recording it.
pub struct FakeAgent {
    pub socket: PathBuf,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeAgent {
    pub fn start(dir: &Path, script: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Self {
        let socket = dir.join("agent.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let script: Arc<Script> = Arc::new(script);
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut hung = Vec::new();
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    if let Some(held) = serve(stream, &*script, &requests) {
                        hung.push(held);
                    }
                }
            })
        };
        FakeAgent {
            socket,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(
    stream: UnixStream,
    script: &Script,
    requests: &Mutex<Vec<Request>>,
) -> Option<UnixStream> {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let request: Request = lace::wire::decode_line(line.as_bytes())
        .unwrap_or_else(|e| panic!("plugin sent an undecodable request {line:?}: {e}"));
    assert!(
        line.ends_with('\n'),
        "request must be newline-terminated: {line:?}"
    );
    let reply = script(&request);
    requests.lock().unwrap().push(request);
    let mut stream = stream;
    match reply {
        Reply::Respond(response) => {
            let _ = stream.write_all(&lace::wire::encode_line(&response).unwrap());
            None
        }
        Reply::Raw(bytes) => {
            let _ = stream.write_all(&bytes);
            None
        }
        Reply::Hang => Some(stream),
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An exact process environment.
pub type EnvVars = [(String, String)];

/// What one plugin run produced.
#[derive(Debug)]
pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// stdout as the single JSON document it must be.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {self:?}"))
    }

    /// Asserts a CNI error (exit 1, error JSON) and returns (code, msg).
    pub fn error(&self) -> (u64, String) {
        assert_eq!(self.code, Some(1), "expected failure: {self:?}");
        let json = self.json();
        let code = json["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code: {self:?}"));
        let msg = json["msg"]
            .as_str()
            .unwrap_or_else(|| panic!("no msg: {self:?}"))
            .to_owned();
        assert!(
            json["cniVersion"].is_string(),
            "error without cniVersion: {self:?}"
        );
        (code, msg)
    }

    /// Asserts success with nothing on stdout.
    pub fn assert_silent_success(&self) {
        assert_eq!(self.code, Some(0), "expected success: {self:?}");
        assert!(self.stdout.is_empty(), "stdout must be empty: {self:?}");
    }
}

/// The containerd-style environment for an attachment verb.
pub fn containerd_env(command: &str, container_id: &str, netns: &str) -> Vec<(String, String)> {
    [
        ("CNI_COMMAND", command.to_owned()),
        ("CNI_CONTAINERID", container_id.to_owned()),
        ("CNI_NETNS", netns.to_owned()),
        ("CNI_IFNAME", "eth0".to_owned()),
        (
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;\
                 K8S_POD_INFRA_CONTAINER_ID={container_id};\
                 K8S_POD_UID=7d3f1c2e-9b8a-4c5d-8e6f-0a1b2c3d4e5f"
            ),
        ),
        ("CNI_PATH", "/opt/cni/bin".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// A 64-hex-digit container id like containerd's.
pub fn container_id() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) as u64;
    format!("{:016x}{:048x}", std::process::id(), n)
}

/// Execs the real plugin with exactly `env` (nothing inherited) and `stdin`.
pub fn run_plugin(env: &EnvVars, stdin: &str) -> Outcome {
    run_binary(Path::new(env!("CARGO_BIN_EXE_lace")), env, stdin)
}

/// A copy of the real plugin installed as `loopback` in `dir` (as the agent installs it),
/// with the settings file beside it pointing at `socket` when given.
pub fn install_loopback_copy(dir: &Path, socket: Option<&Path>) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let copy = bin.join("loopback");
    std::fs::copy(env!("CARGO_BIN_EXE_lace"), &copy).unwrap();
    if let Some(socket) = socket {
        std::fs::write(
            bin.join(lace::wire::LOOPBACK_SETTINGS_FILE),
            serde_json::json!({"agentSocket": socket, "timeoutSeconds": 5}).to_string(),
        )
        .unwrap();
    }
    copy
}

/// Execs `binary` with exactly `env` (nothing inherited) and `stdin`.
pub fn run_binary(binary: &Path, env: &EnvVars, stdin: &str) -> Outcome {
    let mut child = Command::new(binary)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A plugin that fails before reading stdin closes it: EPIPE here is expected then.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    Outcome {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Lace's network configuration as containerd passes it (list name/version merged in), with
/// the agent socket and DEL queue pointed into the test's directory.
pub fn netconf(version: &str, socket: &Path, dir: &Path) -> Value {
    serde_json::json!({
        "cniVersion": version,
        "name": "lace",
        "type": "lace",
        "agentSocket": socket,
        "delQueueDir": dir.join("del-queue"),
        "timeoutSeconds": 5,
        "x-unknown-key": {"kept": true},
    })
}
