//! Standalone mode's state source: a directory of YAML manifests (`--manifests`), polled
//! once a second for changes (file list, sizes, modification times; no inotify dependency,
//! and a second is well below how fast anyone edits manifests).
//!
//! Allocations (node locators, SID functions) are read from the directory's
//! `lace-allocations.yaml`, written once by `lace-agent allocate`: every agent reads the same
//! allocation and a restart never moves one. A node missing from it is reported, and the
//! agent stays not ready (STATUS answers 50, no conflist is written).
//!
//! **Unknown pods**: the manifests need not list every pod the runtime creates (the demo and
//! the tests create pods by exec'ing the plugin): a pod missing from them is bound by its
//! namespace's labels alone, with empty pod labels.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use futures::FutureExt;

use super::source::{PodLookupError, StateSource, StateUnavailable};
use super::Agent;
use crate::load::LoadError;
use crate::state::{ClusterState, ObjectKey, Pod};

/// How often the manifests directory is checked.
const POLL: Duration = Duration::from_secs(1);

/// What identifies a version of the directory: each file's path, length and mtime.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

/// Why the manifests give no state now.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    /// The directory, a file or a document in it (each named) cannot be used.
    #[error(transparent)]
    Load(LoadError),
    #[error("loading task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

fn fingerprint(dir: &Path) -> Result<Fingerprint, LoadError> {
    let files = crate::load::manifest_files(dir)?;
    Ok(files
        .into_iter()
        .map(|f| {
            let meta = std::fs::metadata(&f).ok();
            let len = meta.as_ref().map_or(0, |m| m.len());
            let mtime = meta.and_then(|m| m.modified().ok());
            (f, len, mtime)
        })
        .collect())
}

/// The cluster state from a directory of manifests. See the module docs.
#[derive(Debug)]
pub struct DirectorySource {
    dir: PathBuf,
}

impl DirectorySource {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Loads the directory (blocking).
    fn load(&self) -> Result<ClusterState, LoadError> {
        crate::load::load_dir(&self.dir)
    }

    async fn feed(self: Arc<Self>, agent: Arc<Agent>) {
        // The fingerprint of the last load; `None` before the first.
        let mut seen: Option<Option<Fingerprint>> = None;
        let mut interval = tokio::time::interval(POLL);
        loop {
            interval.tick().await;
            let now = fingerprint(&self.dir).ok();
            if seen.as_ref() == Some(&now) {
                continue;
            }
            if seen.is_some() {
                tracing::info!(manifests = %self.dir.display(), "manifests changed, reloading");
            }
            seen = Some(now);
            let this = Arc::clone(&self);
            let state = tokio::task::spawn_blocking(move || this.load())
                .await
                .map_err(StandaloneError::Task)
                .and_then(|loaded| loaded.map_err(StandaloneError::Load));
            match state {
                Ok(state) => agent.set_state(Ok(state)),
                // Keep serving from the last good state: a half-saved edit must not take
                // the node's pods down.
                Err(why) if agent.loaded().is_ok() => {
                    tracing::error!(reason = %why, "manifests unreadable; keeping the previous state");
                }
                Err(why) => agent.set_state(Err(StateUnavailable::new(why))),
            }
        }
    }
}

impl StateSource for DirectorySource {
    fn describe(&self) -> String {
        format!("manifests {}", self.dir.display())
    }

    fn run(self: Arc<Self>, agent: Arc<Agent>) -> BoxFuture<'static, ()> {
        self.feed(agent).boxed()
    }

    fn unknown_pod<'a>(
        &'a self,
        _pod: &'a ObjectKey,
    ) -> BoxFuture<'a, Result<Option<Pod>, PodLookupError>> {
        futures::future::ready(Ok(Some(Pod::default()))).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_sees_edits_additions_and_removals() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), "x: 1\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let first = fingerprint(dir.path()).unwrap();
        assert_eq!(first.len(), 1, "only manifests count");
        assert_eq!(
            fingerprint(dir.path()).unwrap(),
            first,
            "stable without changes"
        );
        std::fs::write(dir.path().join("notes.txt"), "still ignored").unwrap();
        assert_eq!(fingerprint(dir.path()).unwrap(), first);
        std::fs::write(dir.path().join("a.yaml"), "x: 12\n").unwrap();
        let edited = fingerprint(dir.path()).unwrap();
        assert_ne!(edited, first);
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b.yml"), "y: 2\n").unwrap();
        let added = fingerprint(dir.path()).unwrap();
        assert_eq!(added.len(), 2);
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        assert_eq!(fingerprint(dir.path()).unwrap().len(), 1);
    }

    #[test]
    fn unreadable_manifests_are_reported_with_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("n.yaml"), "kind: [").unwrap();
        let err = DirectorySource::new(dir.path().to_path_buf())
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&dir.path().join("n.yaml").display().to_string()),
            "{err}"
        );
    }
}
