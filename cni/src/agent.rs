//! The client side of the agent socket: one blocking request/response per connection.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lace::wire::{decode_line, encode_line, FrameError, Request, Response, MAX_MESSAGE_BYTES};

/// Why the agent did not answer usefully.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Nobody listens: socket file missing, connection refused, permission denied.
    #[error("cannot connect to the Lace agent at {socket}: {source}")]
    Unreachable {
        /// The socket path.
        socket: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// No complete answer within the timeout.
    #[error("the Lace agent at {socket} did not answer within {timeout:?}")]
    Timeout {
        /// The socket path.
        socket: PathBuf,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The connection broke.
    #[error("lost the connection to the Lace agent at {socket}: {source}")]
    Io {
        /// The socket path.
        socket: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The agent closed the connection without a full answer (e.g. it was restarted).
    #[error("the Lace agent at {socket} closed the connection without answering")]
    NoAnswer {
        /// The socket path.
        socket: PathBuf,
    },
    /// The request could not be encoded.
    #[error("cannot encode the request for the Lace agent: {0}")]
    Encode(#[source] serde_json::Error),
    /// The answer is not a [`Response`].
    #[error("the Lace agent at {socket} sent an invalid answer: {source}")]
    BadAnswer {
        /// The socket path.
        socket: PathBuf,
        /// What is wrong with it.
        #[source]
        source: FrameError,
    },
}

impl AgentError {
    /// Whether the request may not have reached the agent or the agent may have stopped while
    /// serving it: the conditions a retry (or the DEL queue) cures. An agent that answers
    /// garbage is a bug, not a transient condition.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            AgentError::Unreachable { .. }
                | AgentError::Timeout { .. }
                | AgentError::Io { .. }
                | AgentError::NoAnswer { .. }
        )
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Sends `request` to the agent at `socket` and waits at most `timeout` for its answer.
pub fn call(socket: &Path, timeout: Duration, request: &Request) -> Result<Response, AgentError> {
    let deadline = Instant::now() + timeout;
    let line = encode_line(request).map_err(AgentError::Encode)?;
    let timed_out = || AgentError::Timeout {
        socket: socket.to_owned(),
        timeout,
    };
    let broken = |source| AgentError::Io {
        socket: socket.to_owned(),
        source,
    };

    // Connecting to a unix socket does not wait for the peer to accept (only for backlog
    // space), so a dead agent is detected at once: ENOENT or ECONNREFUSED.
    let mut stream = UnixStream::connect(socket).map_err(|source| AgentError::Unreachable {
        socket: socket.to_owned(),
        source,
    })?;
    stream.set_write_timeout(Some(timeout)).map_err(broken)?;
    stream.write_all(&line).map_err(|e| {
        if is_timeout(&e) {
            timed_out()
        } else {
            broken(e)
        }
    })?;

    let mut answer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(timed_out());
        }
        stream.set_read_timeout(Some(remaining)).map_err(broken)?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&chunk[..n]);
                if chunk[..n].contains(&b'\n') || answer.len() > MAX_MESSAGE_BYTES {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(timed_out()),
            Err(e) => return Err(broken(e)),
        }
    }
    // Only a newline-terminated line is a complete answer; anything shorter means the agent
    // went away mid-answer (or sent nothing).
    let Some(end) = answer.iter().position(|&b| b == b'\n') else {
        return if answer.len() > MAX_MESSAGE_BYTES {
            Err(AgentError::BadAnswer {
                socket: socket.to_owned(),
                source: FrameError::TooLong,
            })
        } else {
            Err(AgentError::NoAnswer {
                socket: socket.to_owned(),
            })
        };
    };
    decode_line(&answer[..end]).map_err(|source| AgentError::BadAnswer {
        socket: socket.to_owned(),
        source,
    })
}
