//! DELs the plugin could not deliver because the agent was unreachable.
//!
//! A runtime retries a failed DEL, but a pod stays `Terminating` until one succeeds, and
//! an agent that is down for good (uninstall, crash loop) would wedge every pod on the node.
//! So when the agent cannot be reached the plugin writes the [`Request`]
//! here and reports success. Nothing leaks: the pod's veth dies with its network namespace,
//! and the agent replays every queued DEL (which is idempotent) before it serves requests
//! again, releasing the address, then removes the file.
//!
//! One file per attachment, `<container id>.<ifname>.json`, written durably
//! ([`crate::durable`]: temporary file, fsync, rename, fsync of the directory) so that the agent never reads half a request.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::{
    decode_line, encode_line, validate_container_id, validate_ifname, Command, FrameError, Request,
};

/// Why the queue could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum DelQueueError {
    /// Only DELs with a container id and interface name can be queued.
    #[error("only DEL requests with container id and ifname can be queued, got {0}")]
    NotADel(Command),
    /// A container id or ifname that is not safe as part of a file name.
    #[error("cannot queue a DEL for attachment {0:?}: invalid container id or ifname")]
    BadName(String),
    /// File-system failure.
    #[error("DEL queue {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A queued file that is not a request.
    #[error("DEL queue file {path}: {source}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: FrameError,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DelQueueError + '_ {
    move |source| DelQueueError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `req` (a DEL) into `dir`, creating `dir` if needed; returns the file written.
/// Queuing the same attachment twice overwrites the earlier copy.
pub fn enqueue(dir: &Path, req: &Request) -> Result<PathBuf, DelQueueError> {
    let (Command::Del, Some(id), Some(ifname)) = (
        req.command,
        req.container_id.as_deref(),
        req.ifname.as_deref(),
    ) else {
        return Err(DelQueueError::NotADel(req.command));
    };
    // Both end up in a file name: refuse anything that could leave `dir`.
    if validate_container_id(id).is_err() || validate_ifname(ifname).is_err() {
        return Err(DelQueueError::BadName(format!("{id}.{ifname}")));
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    let name = format!("{id}.{ifname}.json");
    let line = encode_line(req).map_err(|e| DelQueueError::Io {
        path: dir.join(&name),
        source: std::io::Error::other(e),
    })?;
    crate::durable::write(dir, &name, &mut line.as_slice(), 0o600).map_err(|e| DelQueueError::Io {
        path: e.path,
        source: e.source,
    })
}

/// Every queued request in `dir` (oldest name first), with the file it came from so the
/// caller can remove it once the DEL is done. A missing directory is an empty queue.
pub fn pending(dir: &Path) -> Result<Vec<(PathBuf, Request)>, DelQueueError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.map_err(io(dir))?.path();
        let queued = path.extension().is_some_and(|e| e == "json")
            && path
                .file_name()
                .is_some_and(|n| !n.to_string_lossy().starts_with('.'));
        if !queued {
            continue;
        }
        let bytes = fs::read(&path).map_err(io(&path))?;
        let req = decode_line(&bytes).map_err(|source| DelQueueError::Decode {
            path: path.clone(),
            source,
        })?;
        out.push((path, req));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{del_queue, CniVersion};
    use serde_json::Map;

    #[test]
    fn del_queue_round_trip() {
        let dir = std::env::temp_dir()
            .join(format!("lace-wire-delq-{}", std::process::id()))
            .join("nested");
        let req = Request {
            command: Command::Del,
            container_id: Some("c1".into()),
            netns: None,
            ifname: Some("eth0".into()),
            pod_namespace: None,
            pod_name: None,
            pod_uid: None,
            cni_version: CniVersion::V1_1_0,
            config: Map::new(),
            prev_result: None,
            valid_attachments: None,
        };
        assert!(
            del_queue::pending(&dir).unwrap().is_empty(),
            "missing dir is an empty queue"
        );
        let path = del_queue::enqueue(&dir, &req).unwrap();
        assert_eq!(path.file_name().unwrap(), "c1.eth0.json");
        let mut second = req.clone();
        second.container_id = Some("c0".into());
        del_queue::enqueue(&dir, &second).unwrap();
        let pending = del_queue::pending(&dir).unwrap();
        assert_eq!(
            pending.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(),
            vec![second, req.clone()]
        );
        let mut add = req;
        add.command = Command::Add;
        let mut escape = add.clone();
        escape.command = Command::Del;
        escape.container_id = Some("../../etc/x".into());
        assert!(matches!(
            del_queue::enqueue(&dir, &escape),
            Err(del_queue::DelQueueError::BadName(_))
        ));
        assert!(matches!(
            del_queue::enqueue(&dir, &add),
            Err(del_queue::DelQueueError::NotADel(_))
        ));
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }
}
