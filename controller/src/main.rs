//! `lace-controller`: the only cluster-wide writer. One replica (the chart's Deployment uses
//! `Recreate`), so no leader election.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "lace-controller",
    version,
    about = "Lace controller: allocates node locators and SID functions, writes the internal kinds and status"
)]
struct Cli {
    /// IPv6 prefix the per-node SRv6 locators (/96) are carved from: the chart value
    /// controller.srv6LocatorPrefix.
    #[arg(long, env = "LACE_SRV6_LOCATOR_PREFIX", default_value = "")]
    srv6_locator_prefix: String,
    /// Where Prometheus `/metrics` is served (with `/healthz` and `/readyz`).
    #[arg(long, default_value = "0.0.0.0:9965")]
    metrics_addr: SocketAddr,
    /// Where `/healthz` and `/readyz` are served for the kubelet's probes (with `/metrics`);
    /// the same address as `--metrics-addr` serves both on one port.
    #[arg(long, default_value = "0.0.0.0:9966")]
    health_addr: SocketAddr,
    /// `host:port` of the API server, instead of the in-cluster `kubernetes` Service (the
    /// chart sets it from node.apiserverAddress, or its lookup of the API server's endpoint).
    #[arg(long, env = "LACE_APISERVER_ADDRESS")]
    apiserver_address: Option<String>,
}

async fn client(apiserver: Option<&str>) -> Result<kube::Client> {
    let mut config = kube::Config::infer().await.context(
        "loading the Kubernetes client configuration (in-cluster ServiceAccount, or KUBECONFIG)",
    )?;
    if let Some(addr) = apiserver.filter(|a| !a.is_empty()) {
        config.cluster_url = format!("https://{addr}")
            .parse()
            .with_context(|| format!("LACE_APISERVER_ADDRESS {addr:?} is not host:port"))?;
    }
    kube::Client::try_from(config).context("building the Kubernetes client")
}

async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    lace::telemetry::init_logging();
    let cli = Cli::parse();
    let prefix = lace_controller::parse_prefix(&cli.srv6_locator_prefix)?;
    let metrics = Arc::new(lace_controller::Metrics::default());
    let mut addrs = vec![cli.metrics_addr];
    if cli.health_addr != cli.metrics_addr {
        addrs.push(cli.health_addr);
    }
    for addr in addrs {
        let listener = lace::telemetry::bind(addr)
            .await
            .with_context(|| format!("listening on {addr} for /metrics, /healthz and /readyz"))?;
        tokio::spawn(lace::telemetry::serve(listener, metrics.clone()));
    }
    let client = client(cli.apiserver_address.as_deref()).await?;
    tracing::info!(%prefix, "lace-controller starting");
    let settings = lace_controller::Settings::new(prefix);
    lace_controller::run(client, settings, metrics, shutdown())
        .await
        .context("lace-controller stopped")?;
    tracing::info!("lace-controller stopped");
    Ok(())
}
