//! `lace`: the CNI plugin containerd executes.
//!
//! It validates what the runtime passed (environment and the configuration on stdin),
//! forwards ADD, DEL, CHECK, STATUS and GC to the node agent over its unix socket, and prints
//! the agent's answer in the runtime's CNI version. A configuration of `"type": "loopback"`
//! makes it the `loopback` plugin instead (the agent installs a copy under that name where
//! the node has none): `lo` up in the sandbox, through the agent. stdout carries exactly one JSON document
//! (the result, `VERSION`'s answer or an error) or nothing; logs go to stderr or the
//! configured log file. No panic escapes: a panic becomes CNI error 999.
#![forbid(unsafe_code)]

mod agent;
mod cmd;
mod env;
mod log;
mod loopback;
mod netns;

use std::io::Write;
use std::process::ExitCode;

use lace::wire::{CniError, CniVersion, ErrorCode};

fn main() -> ExitCode {
    // The default panic hook writes to stderr only, which is what we want; the payload is also
    // turned into the error JSON below so the runtime sees it.
    let (stdout, success) = match std::panic::catch_unwind(cmd::run) {
        Ok(Ok(output)) => (output, true),
        Ok(Err(error)) => (Some(error_json(error)), false),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            let error = CniError::new(
                ErrorCode::INTERNAL,
                format!("internal error in lace: {what}"),
            );
            (Some(error_json(error)), false)
        }
    };
    if let Some(bytes) = stdout {
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(&bytes).and_then(|()| out.flush()) {
            eprintln!("lace: cannot write the answer to stdout: {e}");
            return ExitCode::FAILURE;
        }
    }
    if success {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The error as printed: with a `cniVersion` (the configuration's if it was read, else ours).
fn error_json(mut error: CniError) -> Vec<u8> {
    error
        .cni_version
        .get_or_insert_with(|| CniVersion::LATEST.as_str().to_owned());
    serde_json::to_vec(&error).unwrap_or_else(|_| {
        // Serializing a struct of strings and a number cannot fail; keep a literal fallback
        // anyway so stdout is never empty on failure.
        br#"{"cniVersion":"1.1.0","code":999,"msg":"internal error in lace: cannot encode error"}"#
            .to_vec()
    })
}
