//! One worker thread per network namespace: it enters the namespace once (`setns` is per
//! thread), opens the namespace's one rtnetlink socket, and then runs the reconciler's jobs.
//! Child processes (`nft`) forked from it start in the same namespace, and
//! `/proc/sys/net` read from it shows that namespace's sysctls.

use std::fs::File;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::nl::{Nl, NlError};

/// Which network namespace a reconciler manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetnsTarget {
    /// The namespace of the process (the node itself, for the agent).
    Current,
    /// A namespace file: `/run/netns/<name>` or `/proc/<pid>/ns/net`.
    Path(PathBuf),
}

impl NetnsTarget {
    /// The namespace `ip netns` calls `name` (`/run/netns/<name>`).
    pub fn named(name: &str) -> Self {
        Self::Path(PathBuf::from("/run/netns").join(name))
    }
}

impl std::fmt::Display for NetnsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Current => write!(f, "the current network namespace"),
            Self::Path(p) => write!(f, "network namespace {}", p.display()),
        }
    }
}

/// Why the worker could not start or answer.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("setns into {path}: {source}")]
    Setns {
        path: String,
        #[source]
        source: nix::Error,
    },
    #[error("rtnetlink socket in {target}: {source}")]
    Socket {
        target: String,
        #[source]
        source: NlError,
    },
    #[error("cannot spawn the worker thread for {target}: {source}")]
    Spawn {
        target: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the worker thread of {target} is gone")]
    Gone { target: String },
}

type Job = Box<dyn FnOnce(&mut Nl) + Send>;

/// The worker thread of one namespace. Dropping it stops the thread.
#[derive(Debug)]
pub struct Worker {
    target: NetnsTarget,
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

fn enter(target: &NetnsTarget) -> Result<Nl, NetnsError> {
    if let NetnsTarget::Path(path) = target {
        let file = File::open(path).map_err(|source| NetnsError::Open {
            path: path.display().to_string(),
            source,
        })?;
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|source| {
            NetnsError::Setns {
                path: path.display().to_string(),
                source,
            }
        })?;
    }
    Nl::open().map_err(|source| NetnsError::Socket {
        target: target.to_string(),
        source,
    })
}

impl Worker {
    /// Starts the worker: enters `target` and opens its rtnetlink socket.
    pub fn start(target: NetnsTarget) -> Result<Self, NetnsError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), NetnsError>>();
        let t = target.clone();
        let thread = std::thread::Builder::new()
            .name("lace-netns".into())
            .spawn(move || {
                let mut nl = match enter(&t) {
                    Ok(nl) => {
                        let _ = ready_tx.send(Ok(()));
                        nl
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    job(&mut nl);
                }
            })
            .map_err(|source| NetnsError::Spawn {
                target: target.to_string(),
                source,
            })?;
        let gone = || NetnsError::Gone {
            target: target.to_string(),
        };
        ready_rx.recv().map_err(|_| gone())??;
        Ok(Self {
            target,
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// The namespace this worker is in.
    pub fn target(&self) -> &NetnsTarget {
        &self.target
    }

    /// Runs `f` on the worker thread (inside the namespace) and returns its result.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Nl) -> T + Send + 'static,
    ) -> Result<T, NetnsError> {
        let gone = || NetnsError::Gone {
            target: self.target.to_string(),
        };
        let (rtx, rrx) = mpsc::channel();
        let job: Job = Box::new(move |nl| {
            let _ = rtx.send(f(nl));
        });
        self.tx
            .as_ref()
            .ok_or_else(gone)?
            .send(job)
            .map_err(|_| gone())?;
        rrx.recv().map_err(|_| gone())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
