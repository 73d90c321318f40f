//! One worker thread per network namespace: it enters the namespace once (`setns` is per
//! thread), opens the namespace's sockets (its state `S`), and then runs the reconciler's
//! jobs on that state, and an idle task whenever no job came for a while. Child processes
//! (`nft`) forked from it start in the same namespace, and `/proc/sys/net` read from it shows
//! that namespace's sysctls.

use std::fs::File;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::nl::NlError;

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

type Job<S> = Box<dyn FnOnce(&mut S) + Send>;

/// The worker thread of one namespace, holding state `S`. Dropping it stops the thread.
#[derive(Debug)]
pub struct Worker<S> {
    target: NetnsTarget,
    tx: Option<mpsc::Sender<Job<S>>>,
    thread: Option<JoinHandle<()>>,
}

fn enter<S>(
    target: &NetnsTarget,
    open: impl FnOnce() -> Result<S, NlError>,
) -> Result<S, NetnsError> {
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
    open().map_err(|source| NetnsError::Socket {
        target: target.to_string(),
        source,
    })
}

impl<S: 'static> Worker<S> {
    /// Starts the worker: enters `target` and opens its state there with `open`; then runs
    /// jobs, and `idle` after every `idle_after` without one.
    pub fn start(
        target: NetnsTarget,
        open: impl FnOnce() -> Result<S, NlError> + Send + 'static,
        idle: fn(&mut S),
        idle_after: Duration,
    ) -> Result<Self, NetnsError> {
        let (tx, rx) = mpsc::channel::<Job<S>>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), NetnsError>>();
        let t = target.clone();
        let thread = std::thread::Builder::new()
            .name("lace-netns".into())
            .spawn(move || {
                let mut state = match enter(&t, open) {
                    Ok(state) => {
                        let _ = ready_tx.send(Ok(()));
                        state
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                loop {
                    match rx.recv_timeout(idle_after) {
                        Ok(job) => job(&mut state),
                        Err(mpsc::RecvTimeoutError::Timeout) => idle(&mut state),
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
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
        f: impl FnOnce(&mut S) -> T + Send + 'static,
    ) -> Result<T, NetnsError> {
        let gone = || NetnsError::Gone {
            target: self.target.to_string(),
        };
        let (rtx, rrx) = mpsc::channel();
        let job: Job<S> = Box::new(move |state| {
            let _ = rtx.send(f(state));
        });
        self.tx
            .as_ref()
            .ok_or_else(gone)?
            .send(job)
            .map_err(|_| gone())?;
        rrx.recv().map_err(|_| gone())
    }
}

impl<S> Drop for Worker<S> {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
