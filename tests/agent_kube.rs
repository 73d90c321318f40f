//! The real `lace-agent run` in Kubernetes mode against API servers that cannot back it: an
//! address where nothing listens, and the fake API server (`lace-fake-kube`) over HTTPS (a
//! kubeadm-like certificate from the pod's CA) answering 401 or 403. The agent must say so clearly (the address, what to
//! check), keep retrying, and serve nothing it cannot back: CNI STATUS and `/readyz` answer
//! not ready, and neither the plugin nor the conflist is installed.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lace::wire::{decode_line, encode_line, CniVersion, Command as Verb, Request, Response};
use lace_fake_kube::pki::Pki;
use lace_fake_kube::{FakeApi, Mode, Served};

/// A running `lace-agent run` and what it logged.
struct Agent {
    child: Child,
    log: Arc<Mutex<String>>,
    dir: tempfile::TempDir,
    metrics: SocketAddr,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Agent {
    fn start(address: &str, service_account: &Path) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("lace-plugin");
        std::fs::write(&plugin, "#!/bin/sh\n").unwrap();
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let arg = |p: &str| dir.path().join(p).display().to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_lace-agent"))
            .args(["run", "--node-name", "node-1"])
            .args([
                "--state-dir",
                &arg("state"),
                "--socket",
                &arg("run/lace.sock"),
            ])
            .args(["--cni-bin-dir", &arg("bin"), "--cni-conf-dir", &arg("conf")])
            .args(["--cni-bin-source", &plugin.display().to_string()])
            .args(["--metrics-addr", &metrics.to_string()])
            .args([
                "--service-account-dir",
                &service_account.display().to_string(),
            ])
            .env("LACE_APISERVER_ADDRESS", address)
            .env_remove("LACE_LOG")
            .env("NO_COLOR", "1")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lace-agent starts");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Agent {
            child,
            log,
            dir,
            metrics,
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits (up to 20 s) until the log holds `n` lines containing every one of `parts`.
    fn wait_for_log(&mut self, n: usize, parts: &[&str]) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let lines: Vec<String> = self
                .log()
                .lines()
                .filter(|l| parts.iter().all(|p| l.contains(p)))
                .map(str::to_string)
                .collect();
            if lines.len() >= n {
                return lines;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("lace-agent exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "no {n} log lines with {parts:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// CNI STATUS over the agent's socket, as the plugin sends it.
    fn status(&self) -> Response {
        let socket = self.dir.path().join("run/lace.sock");
        let mut s = UnixStream::connect(&socket).expect("the CNI socket is served");
        let req = Request::without_attachment(Verb::Status, CniVersion::V1_1_0);
        s.write_all(&encode_line(&req).unwrap()).unwrap();
        let mut line = Vec::new();
        BufReader::new(&mut s).read_until(b'\n', &mut line).unwrap();
        decode_line(&line).unwrap()
    }

    /// `GET path` on the metrics endpoint: status code and body.
    fn get(&self, path: &str) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(self.metrics).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        (
            head.split(' ').nth(1).unwrap().parse().unwrap(),
            body.to_string(),
        )
    }

    fn wait_serving(&self) {
        let socket = self.dir.path().join("run/lace.sock");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !(socket.exists() && std::net::TcpStream::connect(self.metrics).is_ok()) {
            assert!(Instant::now() < deadline, "never served:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Not ready everywhere, for `why`; nothing installed.
    fn assert_serves_nothing(&self, why: &[&str]) {
        self.wait_serving();
        match self.status() {
            Response::Err(e) => {
                assert_eq!(e.code, lace::wire::ErrorCode::NOT_AVAILABLE, "{e:?}");
                for w in why {
                    assert!(e.msg.contains(w), "STATUS {:?} lacks {w:?}", e.msg);
                }
            }
            ok => panic!("STATUS answered {ok:?} without an API server"),
        }
        let (code, body) = self.get("/readyz");
        assert_eq!(code, 503, "{body}");
        assert!(body.contains(why[0]), "{body}");
        let (_, metrics) = self.get("/metrics");
        assert!(metrics.contains("lace_ready 0\n"), "{metrics}");
        assert!(metrics.contains("lace_apiserver_up 0\n"), "{metrics}");
        assert!(
            !self.path("conf/10-lace.conflist").exists(),
            "conflist written"
        );
        assert!(!self.path("bin/lace").exists(), "plugin installed");
        assert!(!self.path("bin/loopback").exists(), "loopback installed");
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn no_api_server_listening_is_reported_with_the_address_and_retried() {
    let pki = Pki::kubeadm("127.0.0.1".parse().unwrap()).unwrap();
    let sa = pki.service_account_dir("token-1").unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let mut agent = Agent::start(&address, sa.path());
    let at = format!("cannot reach the API server at https://{address}");
    let lines = agent.wait_for_log(3, &[&at, "retrying"]);
    assert!(lines[0].contains("Connection refused"), "{}", lines[0]);
    assert!(lines[0].contains("node.apiserverAddress"), "{}", lines[0]);
    assert!(lines[0].contains("LACE_APISERVER_ADDRESS"), "{}", lines[0]);
    agent.assert_serves_nothing(&[&at]);
    // Still trying after that.
    let before = agent.wait_for_log(1, &[&at, "retrying"]).len();
    agent.wait_for_log(before + 1, &[&at, "retrying"]);
}

/// The agent against the fake over HTTPS answering every request with `code`.
struct Rejected {
    agent: Agent,
    fake: FakeApi,
    server: Served,
    _rt: tokio::runtime::Runtime,
    _sa: tempfile::TempDir,
}

fn rejecting(code: u16) -> Rejected {
    let rt = runtime();
    let pki = Pki::kubeadm("127.0.0.1".parse().unwrap()).unwrap();
    let fake = FakeApi::new();
    fake.set_mode(Mode::Status(code));
    let server = rt.block_on(fake.serve_tls(&pki)).unwrap();
    let sa = pki.service_account_dir("token-of-another-cluster").unwrap();
    let agent = Agent::start(&server.addr.to_string(), sa.path());
    Rejected {
        agent,
        fake,
        server,
        _rt: rt,
        _sa: sa,
    }
}

#[test]
fn an_api_server_refusing_the_token_is_reported_and_retried() {
    let mut r = rejecting(401);
    let lines = r.agent.wait_for_log(2, &["401 Unauthorized", "retrying"]);
    assert!(
        lines[0].contains(&format!("https://{}", r.server.addr)),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("service account token"), "{}", lines[0]);
    assert!(lines[0].contains("/token"), "{}", lines[0]);
    r.agent.assert_serves_nothing(&["401", "token"]);
    let seen = r.fake.requests().len();
    assert!(seen >= 2, "TLS worked and it kept asking: {seen}");
}

#[test]
fn an_api_server_forbidding_the_agent_is_reported_and_retried() {
    let mut r = rejecting(403);
    let lines = r.agent.wait_for_log(2, &["forbidden (403)", "retrying"]);
    assert!(
        lines[0].contains(&format!("https://{}", r.server.addr)),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("lace-node ClusterRole"), "{}", lines[0]);
    r.agent.assert_serves_nothing(&["403", "ClusterRole"]);
}

#[test]
fn a_malformed_address_stops_the_agent_with_what_to_fix() {
    let sa = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lace-agent"))
        .args(["run", "--node-name", "node-1", "--service-account-dir"])
        .arg(sa.path())
        .env("LACE_APISERVER_ADDRESS", "10.0.0.1:http")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("LACE_APISERVER_ADDRESS") && err.contains("\"10.0.0.1:http\""),
        "{err}"
    );
}
