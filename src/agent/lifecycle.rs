//! The agent's lifecycle, the same whatever the state source: start-up in order, serving,
//! and shutdown. See the module docs of [`super`] for the order and why.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::source::{StateSource, StateUnavailable};
use super::{cni, install, ipam::IpamStore, server, Agent, AgentError, Config, Dataplane};
use crate::plan::PlanError;
use crate::wire::{del_queue, Command};

/// How often the lifecycle checks whether the plugin can be installed and the underlay MTU
/// needs a fresh look.
const TICK: Duration = Duration::from_secs(1);
/// How long shutdown waits for CNI requests being handled.
const DRAIN: Duration = Duration::from_secs(10);

/// Why the agent cannot serve CNI ADD yet (or any more): the start-up step it waits for.
/// CNI STATUS, `/healthz`, `/readyz` and the log say it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NotReady {
    #[error("CNI socket not served yet")]
    NotServing,
    /// The source has not delivered anything yet.
    #[error("cluster state not loaded yet")]
    NotLoaded,
    #[error(transparent)]
    Source(StateUnavailable),
    /// The state has no allocation for this node; the hint says who makes one.
    #[error(
        "{0}; lace-controller allocates it in a cluster (`lace-agent allocate` on the \
         manifests directory in standalone mode)"
    )]
    Unallocated(Box<PlanError>),
    /// The state does not plan for this node.
    #[error(transparent)]
    Plan(Box<PlanError>),
    /// Some peers could take the link-local underlay and the uplink has not been looked at
    /// yet (the first probe round follows the state within a second).
    #[error("the uplink has not been looked at yet (which peers share its L2 segment)")]
    UnderlayUnknown,
}

/// Runs the agent until SIGINT or SIGTERM, fed by `source`.
pub async fn run(
    config: Config,
    source: Arc<dyn StateSource>,
    dataplane: Arc<dyn Dataplane>,
) -> Result<(), AgentError> {
    let ipam = IpamStore::open(&config.state_dir)?;
    tracing::info!(node = %config.node, source = %source.describe(), "starting");
    let agent = Arc::new(Agent::new(
        config.node.clone(),
        ipam,
        dataplane,
        Arc::clone(&source),
    ));
    let source_task = tokio::spawn(Arc::clone(&source).run(Arc::clone(&agent)));

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

    let metrics_listener = crate::telemetry::bind(config.metrics_addr)
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
        tokio::spawn(crate::telemetry::serve(metrics_listener, agent.clone())),
        tokio::spawn(super::reconcile::run(
            Arc::clone(&agent),
            config.resync_interval,
        )),
        tokio::spawn(super::paths::run(Arc::clone(&agent))),
        source_task,
    ];

    let mut installed = false;
    let mut mtu_for = None;
    let mut interval = tokio::time::interval(TICK);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(AgentError::Runtime)?;
    loop {
        // A new state may move the underlay (or bring the first one).
        let generation = agent.generation();
        if mtu_for != Some(generation) && agent.loaded().is_ok() {
            agent.refresh_underlay_mtu().await;
            mtu_for = Some(generation);
        }
        if !installed && agent.is_ready() {
            installed = install_plugin(&config);
        }
        tokio::select! {
            _ = interval.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
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

/// Installs the loopback plugin where the node has none, the binary and the conflist (last:
/// it makes the node ready); `false` (retried next tick) if any failed.
fn install_plugin(config: &Config) -> bool {
    let settings = config.plugin_settings();
    let installed =
        install::install_loopback(&config.cni_bin_source, &config.cni_bin_dir, &settings).and_then(
            |lo| {
                let bin = install::install_binary(&config.cni_bin_source, &config.cni_bin_dir)?;
                let conf =
                    install::write_conflist(&config.cni_conf_dir, &config.cni_conf_name, settings)?;
                Ok((lo, bin, conf))
            },
        );
    match installed {
        Ok((lo, bin, conf)) => {
            match lo {
                install::Loopback::Installed(p) => tracing::info!(
                    loopback = %p.display(),
                    "no loopback plugin was in the CNI bin dir: installed Lace's (a copy of the \
                     plugin); a loopback put there by the host is never replaced"
                ),
                install::Loopback::Updated(p) => {
                    tracing::info!(loopback = %p.display(), "Lace's loopback plugin updated")
                }
                install::Loopback::Current(p) => {
                    tracing::debug!(loopback = %p.display(), "Lace's loopback plugin is current")
                }
                install::Loopback::Host(p) => tracing::info!(
                    loopback = %p.display(),
                    "the CNI bin dir has a loopback plugin that is not Lace's: the runtime uses \
                     it, and Lace leaves it alone"
                ),
            }
            tracing::info!(binary = %bin.display(), conflist = %conf.display(), "CNI plugin installed");
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot install the CNI plugin; retrying");
            false
        }
    }
}

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

/// Replays every DEL the plugin queued while the agent was unreachable, then removes it.
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
