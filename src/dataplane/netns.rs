//! Threads inside network namespaces (`setns` is per thread). The node's namespace has one
//! long-lived [`Worker`]: it enters the namespace once, opens the namespace's sockets (its
//! state `S`), and then runs the reconciler's jobs on that state, and an idle task whenever no
//! job came for a while. Child processes (`nft`) forked from it start in the same namespace,
//! and `/proc/sys/net` read from it shows that namespace's sysctls. A pod's namespace gets a
//! thread for the one CNI request that works there ([`run_in`]): creating it costs far less
//! than the request's netlink round trips, and no thread ever leaves a namespace again.

use std::fs::File;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

impl NetnsTarget {
    /// Opens the namespace (for `IFLA_NET_NS_FD`: creating a link in it from another one).
    /// `Current` is the calling thread's, which is also the one a [`Worker`] it starts lives
    /// in (for the agent: the process's, which its threads never leave).
    pub fn open(&self) -> Result<File, NetnsError> {
        let path = match self {
            Self::Current => std::path::Path::new("/proc/thread-self/ns/net"),
            Self::Path(p) => p.as_path(),
        };
        File::open(path).map_err(|source| NetnsError::Open {
            path: path.display().to_string(),
            source,
        })
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

/// Runs `f` with a fresh rtnetlink socket on a new thread that entered `target`, and returns
/// its result (the thread ends with it).
pub fn run_in<T: Send>(
    target: &NetnsTarget,
    f: impl FnOnce(&mut Nl) -> T + Send,
) -> Result<T, NetnsError> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("lace-netns-pod".into())
            .spawn_scoped(s, move || enter(target, Nl::open).map(|mut nl| f(&mut nl)))
            .map_err(|source| NetnsError::Spawn {
                target: target.to_string(),
                source,
            })?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

impl<S: 'static> Worker<S> {
    /// Starts the worker: enters `target` and opens its state there with `open`; then runs
    /// jobs, and `idle` every `idle_after` (between jobs, however often they come).
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
                // `idle` runs every `idle_after` whether jobs come or not: jobs arriving
                // more often than that (a CNI CHECK every few hundred milliseconds) must not
                // starve it, or drift seen in between would wait for them to stop.
                let mut next_idle = Instant::now() + idle_after;
                loop {
                    let wait = next_idle.saturating_duration_since(Instant::now());
                    match rx.recv_timeout(wait) {
                        Ok(job) => job(&mut state),
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                    if Instant::now() >= next_idle {
                        idle(&mut state);
                        next_idle = Instant::now() + idle_after;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// State of a worker that counts its idles and its jobs.
    #[derive(Default)]
    struct Counts {
        idles: u32,
        jobs: u32,
    }

    #[test]
    fn idle_runs_on_time_while_jobs_keep_coming() {
        let idle_after = Duration::from_millis(100);
        let worker = Worker::start(
            NetnsTarget::Current,
            || Ok(Counts::default()),
            |c: &mut Counts| c.idles += 1,
            idle_after,
        )
        .unwrap();
        // A job every 20 ms for 600 ms: never a gap of `idle_after` between two.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(600) {
            worker.run(|c| c.jobs += 1).unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        let (idles, jobs) = worker.run(|c| (c.idles, c.jobs)).unwrap();
        assert!(jobs >= 10, "{jobs} jobs");
        // Six periods passed; a loaded test machine may lose some, but not all of them.
        assert!(
            idles >= 3,
            "idle ran {idles} times in 600 ms of jobs every 20 ms"
        );
    }

    #[test]
    fn idle_runs_when_no_job_comes() {
        let worker = Worker::start(
            NetnsTarget::Current,
            || Ok(Counts::default()),
            |c: &mut Counts| c.idles += 1,
            Duration::from_millis(50),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let idles = worker.run(|c| c.idles).unwrap();
        assert!(idles >= 2, "idle ran {idles} times in 300 ms without jobs");
    }
}
