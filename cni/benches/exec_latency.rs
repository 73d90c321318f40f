//! Exec latency of the real `lace` binary: `VERSION` (process start, no I/O) and `ADD`
//! against the in-process fake agent (env and config validation, netns check, one socket
//! round trip), `DEL` and `STATUS` likewise. Prints p50/p99/max over 200 sequential runs.
//! Needs root for the network namespace. Run: `cargo bench -p lace-cni`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use lace::wire::{CniResult, Response};

const RUNS: usize = 200;

fn measure(mut run: impl FnMut()) -> Vec<Duration> {
    run(); // warm the page cache
    let mut samples: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed()
        })
        .collect();
    samples.sort();
    samples
}

fn pct(samples: &[Duration], p: f64) -> Duration {
    let idx = ((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1;
    samples[idx]
}

fn main() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let result: CniResult = serde_json::from_value(serde_json::json!({
        "interfaces": [{"name": "eth0", "sandbox": ns.path}],
        "ips": [{"address": "10.244.1.7/32", "gateway": "169.254.1.1", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]
    }))
    .unwrap();
    let agent = FakeAgent::start(dir.path(), move |req| {
        let answer = match req.command {
            lace::wire::Command::Add => Some(result.clone()),
            _ => None,
        };
        Reply::Respond(Response::Ok(answer))
    });
    let conf = netconf("1.1.0", &agent.socket, dir.path()).to_string();
    let id = container_id();
    let netns = ns.path.to_str().unwrap();

    let version_env = vec![("CNI_COMMAND".to_owned(), "VERSION".to_owned())];
    let status_env = vec![("CNI_COMMAND".to_owned(), "STATUS".to_owned())];
    let add_env = containerd_env("ADD", &id, netns);
    let del_env = containerd_env("DEL", &id, netns);
    let cases: [(&str, &EnvVars, &str); 4] = [
        ("VERSION", &version_env, r#"{"cniVersion":"1.1.0"}"#),
        ("STATUS", &status_env, &conf),
        ("ADD", &add_env, &conf),
        ("DEL", &del_env, &conf),
    ];
    println!("lace CNI plugin exec latency, {RUNS} sequential runs each");
    println!("{:<8} {:>10} {:>10} {:>10}", "verb", "p50", "p99", "max");
    for (verb, env, stdin) in cases {
        let samples = measure(|| {
            let out = run_plugin(env, stdin);
            assert_eq!(out.code, Some(0), "{verb}: {out:?}");
        });
        println!(
            "{verb:<8} {:>10.2?} {:>10.2?} {:>10.2?}",
            pct(&samples, 0.50),
            pct(&samples, 0.99),
            samples[samples.len() - 1]
        );
    }
    assert!(agent.requests().len() >= 3 * RUNS);
}
