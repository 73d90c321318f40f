//! The CNI server: a unix socket, one JSON request per connection ([`crate::wire::Request`]),
//! answered by one [`crate::wire::Response`].
//!
//! The socket is created with mode 0600 (only root — the runtime running the plugin — may
//! talk to the agent) in a directory created 0700 if missing. A leftover socket of a dead
//! agent is replaced; a live one (a connect succeeds) is an error, as is any path that is
//! not a socket (nothing else is ever deleted).

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::Agent;
use crate::wire::{
    decode_line, encode_line, CniError, ErrorCode, Request, Response, MAX_MESSAGE_BYTES,
};

/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the socket could not be served; names the path.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("CNI socket {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CNI socket {0} is in use by a running agent")]
    InUse(PathBuf),
    #[error("CNI socket path {0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
}

/// Binds `path`, replacing a stale socket.
pub async fn bind(path: &Path) -> Result<UnixListener, ServerError> {
    let io = |source| ServerError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).await.is_ok() {
                return Err(ServerError::InUse(path.to_owned()));
            }
            std::fs::remove_file(path).map_err(io)?;
        }
        Ok(_) => return Err(ServerError::NotASocket(path.to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    Ok(listener)
}

/// Counts a connection as open (request read, handled, answer written) while alive, so
/// shutdown can wait for the answers.
struct Open<'a>(&'a Agent);

impl<'a> Open<'a> {
    fn new(agent: &'a Agent) -> Self {
        agent.open_connections.fetch_add(1, Ordering::SeqCst);
        Open(agent)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts connections until the task is dropped.
pub async fn serve(listener: UnixListener, agent: Arc<Agent>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let agent = Arc::clone(&agent);
                tokio::spawn(async move { connection(stream, agent).await });
            }
            Err(e) => {
                tracing::warn!(error = %e, "CNI socket: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn connection(stream: UnixStream, agent: Arc<Agent>) {
    let _open = Open::new(&agent);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read).take(MAX_MESSAGE_BYTES as u64 + 1);
    let mut line = Vec::new();
    let read = tokio::time::timeout(READ_TIMEOUT, reader.read_until(b'\n', &mut line)).await;
    let response = match read {
        Err(_) => Response::Err(CniError::new(
            ErrorCode::IO,
            format!("no request within {READ_TIMEOUT:?}"),
        )),
        Ok(Err(e)) => Response::Err(CniError::new(
            ErrorCode::IO,
            format!("reading the request: {e}"),
        )),
        Ok(Ok(_)) => match decode_line::<Request>(&line) {
            Err(e) => Response::Err(CniError::new(
                ErrorCode::DECODE,
                format!("bad request: {e}"),
            )),
            Ok(req) => {
                let verb = req.command.as_str();
                let started = Instant::now();
                let outcome = super::cni::handle(&agent, req).await;
                let result = match &outcome {
                    Ok(_) => "ok".to_owned(),
                    Err(e) => e.code.to_string(),
                };
                if let Err(e) = &outcome {
                    tracing::warn!(verb, code = %e.code, msg = %e.msg, "CNI request failed");
                }
                agent.metrics.cni_request(verb, result, started.elapsed());
                match outcome {
                    Ok(r) => Response::Ok(r),
                    Err(e) => Response::Err(e),
                }
            }
        },
    };
    let bytes = match encode_line(&response) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode a response");
            return;
        }
    };
    if let Err(e) = write.write_all(&bytes).await {
        // The plugin gave up (timeout, killed); the work is done and DEL is idempotent.
        tracing::debug!(error = %e, "CNI client went away before the answer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{CniVersion, Command};

    #[tokio::test]
    async fn socket_is_private_and_stale_ones_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/lace/cni.sock");
        let first = bind(&path).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A live agent is not displaced.
        assert!(matches!(bind(&path).await, Err(ServerError::InUse(_))));
        // A dead one's socket is.
        drop(first);
        let _second = bind(&path).await.unwrap();
        // Anything that is not a socket is left alone.
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(bind(&file).await, Err(ServerError::NotASocket(_))));
        assert_eq!(std::fs::read(&file).unwrap(), b"x");
    }

    #[tokio::test]
    async fn one_request_one_answer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cni.sock");
        let agent = Arc::new(Agent::new(
            "node-1".into(),
            super::super::ipam::IpamStore::open(&dir.path().join("state")).unwrap(),
            Arc::new(super::super::PlanSink::default()),
            Arc::new(super::super::source::Known::default()),
        ));
        let listener = bind(&path).await.unwrap();
        tokio::spawn(serve(listener, Arc::clone(&agent)));
        let ask = |bytes: Vec<u8>| {
            let path = path.clone();
            async move {
                let mut s = UnixStream::connect(&path).await.unwrap();
                s.write_all(&bytes).await.unwrap();
                let mut out = Vec::new();
                tokio::io::AsyncReadExt::read_to_end(&mut s, &mut out)
                    .await
                    .unwrap();
                decode_line::<Response>(&out).unwrap()
            }
        };
        let status = Request::without_attachment(Command::Status, CniVersion::V1_1_0);
        // Not ready: no state loaded, and serving not flagged.
        match ask(encode_line(&status).unwrap()).await {
            Response::Err(e) => assert_eq!(e.code, ErrorCode::NOT_AVAILABLE),
            other => panic!("{other:?}"),
        }
        match ask(b"{\"command\":\"NOPE\"}\n".to_vec()).await {
            Response::Err(e) => assert_eq!(e.code, ErrorCode::DECODE, "{e}"),
            other => panic!("{other:?}"),
        }
        let text = crate::telemetry::encode(crate::telemetry::Probes::registry(&*agent));
        assert!(
            text.contains("lace_cni_requests_total{verb=\"STATUS\",result=\"50\"} 1"),
            "{text}"
        );
    }
}
