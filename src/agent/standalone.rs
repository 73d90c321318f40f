//! Standalone mode: the cluster state comes from a directory of YAML manifests
//! (`--manifests`), polled once a second for changes (file list, sizes, modification times;
//! no inotify dependency, and a second is well below how fast anyone edits manifests).
//!
//! Allocations (node locators, per-node blocks, SID functions) are read from the directory's
//! `lace-allocations.yaml`, written once by `lace-agent allocate`: every agent reads the same
//! allocation and a restart never moves one. A node missing from it is reported, and the
//! agent stays not ready (STATUS answers 50, no conflist is written).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{cni, install, ipam::IpamStore, metrics, server, Agent, AgentError, Config, Dataplane};
use crate::state::ClusterState;
use crate::wire::{del_queue, Command};

/// How often the manifests directory is checked.
const POLL: Duration = Duration::from_secs(1);
/// How long shutdown waits for CNI requests being handled.
const DRAIN: Duration = Duration::from_secs(10);

/// What identifies a version of the directory: each file's path, length and mtime.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

fn fingerprint(dir: &Path) -> Result<Fingerprint, String> {
    let files = crate::load::manifest_files(dir).map_err(|e| e.to_string())?;
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

/// Loads and validates the directory.
fn load(dir: &Path) -> Result<ClusterState, String> {
    let state = crate::load::load_dir(dir).map_err(|e| e.to_string())?;
    if let Err(errors) = crate::validate::validate_cluster(&state) {
        let list: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        return Err(format!(
            "{}: {} validation error(s): {}",
            dir.display(),
            list.len(),
            list.join("; ")
        ));
    }
    Ok(state)
}

/// Runs the agent until SIGINT or SIGTERM.
pub async fn run(config: Config, dataplane: Arc<dyn Dataplane>) -> Result<(), AgentError> {
    let ipam = IpamStore::open(&config.state_dir)?;
    let agent = Arc::new(Agent::new(config.node.clone(), ipam, dataplane));
    tracing::info!(node = %config.node, manifests = %config.manifests.display(), "starting in standalone mode");

    let mut seen = fingerprint(&config.manifests).ok();
    agent.set_state(load(&config.manifests));
    agent.refresh_underlay_mtu().await;

    cni::verify_against_kernel(&agent)
        .await
        .map_err(AgentError::Verify)?;
    replay_del_queue(&agent, &config.state_dir.join(super::DEL_QUEUE_SUBDIR)).await?;

    if let Some(cgroup) = &config.kubelet_cgroup {
        let mut probe = crate::probe::ProbeConfig::new(cgroup.clone());
        probe.release_pinned = config.release_pinned;
        // Attached before serving when the kubelet's cgroup exists; otherwise in the
        // background once it appears (the kubelet may start after the agent).
        if let Some(probe) = attach_probe_program(probe).await {
            tokio::spawn(attach_once_cgroup_appears(probe));
        }
    }

    let metrics_listener =
        metrics::bind(config.metrics_addr)
            .await
            .map_err(|source| AgentError::Metrics {
                addr: config.metrics_addr,
                source,
            })?;
    let listener = server::bind(&config.socket).await?;
    agent.set_serving();
    tracing::info!(socket = %config.socket.display(), metrics = %config.metrics_addr, "serving");

    let tasks = [
        tokio::spawn(server::serve(listener, Arc::clone(&agent))),
        tokio::spawn(metrics::serve(metrics_listener, Arc::clone(&agent))),
        tokio::spawn(super::reconcile::run(
            Arc::clone(&agent),
            config.resync_interval,
        )),
    ];

    let mut installed = false;
    let mut interval = tokio::time::interval(POLL);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(AgentError::Runtime)?;
    loop {
        if !installed && agent.is_ready() {
            installed = install_plugin(&config);
        }
        tokio::select! {
            _ = interval.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
        let now = fingerprint(&config.manifests).ok();
        if now != seen {
            seen = now;
            tracing::info!(manifests = %config.manifests.display(), "manifests changed, reloading");
            let dir = config.manifests.clone();
            let state = tokio::task::spawn_blocking(move || load(&dir))
                .await
                .unwrap_or_else(|e| Err(format!("loading task failed: {e}")));
            match state {
                Ok(state) => {
                    agent.set_state(Ok(state));
                    agent.refresh_underlay_mtu().await;
                }
                // Keep serving from the last good state: a half-saved edit must not take
                // the node's pods down.
                Err(why) if agent.loaded().is_ok() => {
                    tracing::error!(reason = %why, "manifests invalid; keeping the previous state");
                }
                Err(why) => agent.set_state(Err(why)),
            }
        }
    }
    tracing::info!("shutting down; the conflist stays so the node keeps accepting pods");
    let [server_task, rest @ ..] = tasks;
    server_task.abort();
    // Let the requests being handled finish and be answered (a cut one is safe, but costs
    // the pod a retry).
    let deadline = tokio::time::Instant::now() + DRAIN;
    while agent
        .open_connections
        .load(std::sync::atomic::Ordering::SeqCst)
        > 0
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for t in rest {
        t.abort();
    }
    // The plugin treats a missing socket like a stopped agent (ADD retried, DEL queued).
    let _ = std::fs::remove_file(&config.socket);
    Ok(())
}

/// Installs the binary and the conflist; `false` (retried next poll) if either failed.
fn install_plugin(config: &Config) -> bool {
    let binary = install::install_binary(&config.cni_bin_source, &config.cni_bin_dir);
    let conf = binary.and_then(|bin| {
        install::write_conflist(
            &config.cni_conf_dir,
            &config.cni_conf_name,
            config.plugin_settings(),
        )
        .map(|c| (bin, c))
    });
    match conf {
        Ok((bin, conf)) => {
            tracing::info!(binary = %bin.display(), conflist = %conf.display(), "CNI plugin installed");
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot install the CNI plugin; retrying");
            false
        }
    }
}

/// Replays every DEL the plugin queued while the agent was unreachable, then removes it.
/// Waits for the kubelet's cgroup, then attaches; again if it vanished in between.
async fn attach_once_cgroup_appears(probe: crate::probe::ProbeConfig) {
    let mut pending = Some(probe);
    while let Some(probe) = pending.take() {
        let path = probe.cgroup.clone();
        let wait = tokio::task::spawn_blocking(move || loop {
            match crate::probe::wait_for_cgroup(&path, CGROUP_WAIT_REPORT) {
                Err(crate::probe::ProbeError::CgroupWaitTimedOut { waited, .. }) => {
                    tracing::warn!(path = %path.display(), ?waited, "kubelet cgroup still missing: kubelet probes to pods fail until it appears");
                }
                other => return other,
            }
        });
        match wait.await {
            Ok(Ok(())) => pending = attach_probe_program(probe).await,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "kubelet probe program not attached: kubelet probes to pods will fail")
            }
            Err(e) => tracing::error!(error = %e, "kubelet cgroup wait task failed"),
        }
    }
}

/// How often a still-missing kubelet cgroup is reported while the agent waits for it.
const CGROUP_WAIT_REPORT: Duration = Duration::from_secs(60);

/// Attaches (or reuses) the kubelet probe program. Returns the config back when the kubelet's
/// cgroup does not exist yet, for the caller to retry once it appears; every other failure
/// is logged (pods still get networks, only probes fail).
async fn attach_probe_program(
    probe: crate::probe::ProbeConfig,
) -> Option<crate::probe::ProbeConfig> {
    let attempt = probe.clone();
    match tokio::task::spawn_blocking(move || crate::probe::ensure_attached(&attempt)).await {
        Ok(Ok(a)) => {
            tracing::info!(outcome = ?a.outcome, link = a.link_id, "kubelet probe program attached");
            None
        }
        Ok(Err(e @ crate::probe::ProbeError::CgroupMissing { .. })) => {
            tracing::warn!(error = %e, "kubelet probe program waits for the kubelet's cgroup");
            Some(probe)
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "kubelet probe program not attached: kubelet probes to pods will fail");
            None
        }
        Err(e) => {
            tracing::error!(error = %e, "kubelet probe attach task failed");
            None
        }
    }
}

async fn replay_del_queue(agent: &Arc<Agent>, dir: &Path) -> Result<(), AgentError> {
    for (path, req) in del_queue::pending(dir)? {
        if req.command != Command::Del {
            tracing::warn!(file = %path.display(), verb = %req.command, "ignoring a queued non-DEL request");
        } else if let Err(e) = cni::handle(agent, req).await {
            // Keep the file: the next start tries again.
            tracing::error!(file = %path.display(), error = %e, "replaying a queued DEL failed");
            continue;
        }
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(file = %path.display(), error = %e, "cannot remove a replayed DEL");
        }
    }
    Ok(())
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
    fn invalid_manifests_are_reported_with_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("n.yaml"),
            "apiVersion: lace.io/v1alpha1\nkind: Network\nmetadata:\n  name: a\nspec:\n  subnets:\n  - cidr: 10.0.0.0/16\n    blockPrefix: 8\n",
        )
        .unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
    }
}
