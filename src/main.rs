//! `lace-agent`: the node agent, and the standalone tools built on the same library.
//!
//! Standalone mode reads a directory of YAML manifests (`--manifests`) instead of the
//! Kubernetes API: the demo and the tests use it, and operators can use `validate` and `plan`
//! to see what a node would be programmed with before applying anything.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "lace-agent",
    version,
    about = "Lace node agent and standalone tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions of every Lace kind (YAML).
    Crds,
    /// Validate a directory of manifests; prints every error, exits 1 if there is any.
    Validate {
        /// Directory of YAML manifests (Lace kinds, Namespaces, Pods, Services, ...).
        #[arg(long)]
        manifests: PathBuf,
    },
    /// Allocate SID functions, node locators and per-node blocks for a directory of
    /// manifests and record them in `<manifests>/lace-allocations.yaml` (the standalone pass
    /// of the controller's allocator). Existing allocations never move.
    Allocate {
        #[arg(long)]
        manifests: PathBuf,
    },
    /// Print the plan for one node: VRFs, routes, rules and sysctls in `ip`-like syntax,
    /// then the nftables ruleset (`nft -f` text). Pure: nothing is applied.
    Plan {
        #[arg(long)]
        manifests: PathBuf,
        /// The node to plan for (as named in the manifests' Node objects).
        #[arg(long)]
        node: String,
        /// Print only the nftables ruleset.
        #[arg(long)]
        nft_only: bool,
        /// Plan with what this host's kernel shows, as the node's agent does: look at the
        /// link holding the node's IPv4 InternalIP and probe the peers on its L2 segment
        /// (reads and probes only, writes nothing), so `## underlay` says which path each
        /// peer takes now. Run it on the node (or with `--netns`).
        #[arg(long)]
        probe: bool,
        /// With `--probe`: the network namespace standing in for the node (tests, the demo).
        #[arg(long, requires = "probe")]
        netns: Option<PathBuf>,
        /// Plan with the local pods the node's agent recorded in this state directory (its
        /// `--state-dir`; read without taking the agent's lock): their routes, and their
        /// hostPorts in the ruleset, each naming its pod. Without it the plan has no local pods.
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Explain the policies of a directory of manifests: each pod's Network (and the binding
    /// policy that chose it) and every allowed `from -> to` Network pair (and the routing
    /// policies behind it). One record per line, for people and scripts:
    /// `pod <ns>/<name> <node> <network> <policy>`, `pair <from> <to> <policies>`,
    /// `external <network>`.
    ///
    /// With `--pod`, only that pod: its Network, then whether NetworkPolicies isolate it
    /// for ingress and egress, which ones, and what each of their rules allows.
    Policy {
        #[arg(long)]
        manifests: PathBuf,
        /// `<namespace>/<name>` of one pod.
        #[arg(long)]
        pod: Option<String>,
    },
    /// Run the node agent: serve the CNI plugin, own pod IPAM, keep the node programmed.
    Run(Box<RunArgs>),
}

/// Flags of `lace-agent run` (the chart passes the first six, and the API server address in
/// `LACE_APISERVER_ADDRESS`).
#[derive(Debug, clap::Args)]
struct RunArgs {
    /// This node's name (`spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Where the CNI plugin binary is installed.
    #[arg(long, default_value = "/opt/cni/bin")]
    cni_bin_dir: PathBuf,
    /// Where the conflist is written.
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// The conflist's file name.
    #[arg(long, default_value = "10-lace.conflist")]
    cni_conf_name: String,
    /// The plugin binary to install [default: `lace` next to this executable].
    #[arg(long)]
    cni_bin_source: Option<PathBuf>,
    /// The kubelet's cgroup (v2): its sockets get the probe mark. Unset: no probe program.
    #[arg(long)]
    kubelet_cgroup_path: Option<PathBuf>,
    /// Remove previously pinned BPF objects at start.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    release_pinned_maps: bool,
    /// Standalone mode: read the cluster state from this directory of manifests (instead of
    /// the Kubernetes API).
    #[arg(long)]
    manifests: Option<PathBuf>,
    /// The API server: host:port, `[IPv6]:port` or an https:// URL. Unset: the in-cluster
    /// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT.
    #[arg(long, env = "LACE_APISERVER_ADDRESS")]
    apiserver_address: Option<String>,
    /// Where the pod's service-account token and CA (`token`, `ca.crt`) are mounted.
    #[arg(long, default_value = lace::agent::cluster::SERVICE_ACCOUNT_DIR)]
    service_account_dir: PathBuf,
    /// IPAM store and the plugin's DEL queue.
    #[arg(long, default_value = "/var/lib/lace")]
    state_dir: PathBuf,
    /// The CNI socket.
    #[arg(long, default_value = lace::wire::DEFAULT_AGENT_SOCKET)]
    socket: PathBuf,
    /// Program this network namespace as the node instead of the agent's own (tests).
    #[arg(long)]
    netns: Option<PathBuf>,
    /// Prometheus `/metrics` and `/healthz`.
    #[arg(long, default_value = "127.0.0.1:9964")]
    metrics_addr: std::net::SocketAddr,
    /// Seconds between full resyncs of the dataplane (besides reconciles on every change and
    /// on drift the kernel notifies): the backstop for what no notification reports.
    #[arg(long, default_value_t = lace::agent::reconcile::DEFAULT_RESYNC.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    resync_interval: u64,
}

fn main() -> Result<()> {
    lace::telemetry::init_logging();
    match Cli::parse().command {
        Command::Crds => write_stdout(&lace::crd::crds_yaml())?,
        Command::Validate { manifests } => {
            let state = load(&manifests)?;
            if let Err(errors) = lace::validate::validate_cluster(&state) {
                for e in &errors {
                    eprintln!("{e}");
                }
                bail!(
                    "{}: {} validation error(s)",
                    manifests.display(),
                    errors.len()
                );
            }
            println!("{}: valid", manifests.display());
        }
        Command::Allocate { manifests } => {
            let state = load(&manifests)?;
            let allocation = lace::alloc::allocate(&state)
                .with_context(|| format!("allocating for {}", manifests.display()))?;
            if allocation.network_allocations == state.network_allocations
                && allocation.node_allocations == state.node_allocations
            {
                println!("{}: allocations unchanged", manifests.display());
            } else {
                let path = lace::load::write_allocations(&manifests, &allocation)?;
                println!("{}: allocations written", path.display());
            }
        }
        Command::Plan {
            manifests,
            node,
            nft_only,
            probe,
            netns,
            state_dir,
        } => {
            let state = load(&manifests)?;
            let facts = if probe {
                probe_underlay(&node, &state, netns)?
            } else {
                Default::default()
            };
            let local = match &state_dir {
                Some(dir) => lace::agent::ipam::IpamStore::read_attachments(dir)
                    .with_context(|| format!("reading the agent's records in {}", dir.display()))?,
                None => Vec::new(),
            };
            let plan = lace::plan::plan_with(&node, &state, &facts, &local)
                .with_context(|| format!("planning node {node:?} from {}", manifests.display()))?;
            let mut text = String::new();
            if !nft_only {
                text = plan.render() + "\n";
            }
            text.push_str(&plan.render_nft());
            write_stdout(&text)?;
        }
        Command::Policy {
            manifests,
            pod: None,
        } => write_stdout(&explain(&load(&manifests)?))?,
        Command::Policy {
            manifests,
            pod: Some(pod),
        } => write_stdout(&explain_pod(&load(&manifests)?, &pod)?)?,
        Command::Run(args) => run(*args)?,
    }
    Ok(())
}

/// One look at the node's uplink and one probe of its peers, as the agent's probe loop makes
/// (a single answer counts, as in the agent).
fn probe_underlay(
    node: &str,
    state: &lace::state::ClusterState,
    netns: Option<PathBuf>,
) -> Result<lace::plan::underlay::UnderlayFacts> {
    let target = match netns {
        Some(path) => lace::dataplane::NetnsTarget::Path(path),
        None => lace::dataplane::NetnsTarget::Current,
    };
    let reconciler = lace::dataplane::Reconciler::new(target.clone())
        .with_context(|| format!("opening {target} to look at its links"))?;
    let query = lace::agent::paths::query(node, state);
    let round = reconciler
        .probe_underlay(query)
        .with_context(|| format!("probing the link-local underlay from {target}"))?;
    Ok(lace::agent::paths::Tracker::default().update(&round))
}

fn run(args: RunArgs) -> Result<()> {
    // First, before any thread allocates (see `lace::sys::malloc`).
    match lace::sys::malloc::use_one_arena() {
        Ok(arenas) => tracing::info!(?arenas, "malloc arenas"),
        Err(e) => tracing::warn!("{e}"),
    }
    let source: std::sync::Arc<dyn lace::agent::StateSource> = match args.manifests {
        Some(dir) => std::sync::Arc::new(lace::agent::standalone::DirectorySource::new(dir)),
        None => {
            let api = lace::agent::cluster::ApiServer::new(
                args.apiserver_address.as_deref(),
                &args.service_account_dir,
            )?;
            std::sync::Arc::new(lace::agent::cluster::KubeSource::new(
                args.node_name.clone(),
                api,
            ))
        }
    };
    let cni_bin_source = match args.cni_bin_source {
        Some(p) => p,
        None => std::env::current_exe()
            .context("locating this executable to find the `lace` plugin next to it")?
            .with_file_name(lace::wire::PLUGIN_TYPE),
    };
    // The node's kernel: the agent's own namespace, or (tests, demo) a namespace standing in
    // for a node.
    let target = match &args.netns {
        Some(path) => lace::dataplane::NetnsTarget::Path(path.clone()),
        None => lace::dataplane::NetnsTarget::Current,
    };
    let dataplane = std::sync::Arc::new(
        lace::dataplane::Reconciler::new(target).context("starting the dataplane reconciler")?,
    );
    let config = lace::agent::Config {
        node: args.node_name,
        state_dir: args.state_dir,
        socket: args.socket,
        netns: args.netns,
        cni_bin_dir: args.cni_bin_dir,
        cni_conf_dir: args.cni_conf_dir,
        cni_conf_name: args.cni_conf_name,
        cni_bin_source,
        metrics_addr: args.metrics_addr,
        kubelet_cgroup: args.kubelet_cgroup_path,
        release_pinned: args.release_pinned_maps,
        resync_interval: std::time::Duration::from_secs(args.resync_interval),
    };
    lace::agent::run(config, source, dataplane)?;
    Ok(())
}

fn load(dir: &std::path::Path) -> Result<lace::state::ClusterState> {
    Ok(lace::load::load_dir(dir)?)
}

/// The `policy` subcommand's text.
fn explain(state: &lace::state::ClusterState) -> String {
    let mut out = String::new();
    for (key, pod) in &state.pods {
        let node = if pod.node.is_empty() { "-" } else { &pod.node };
        match lace::binding::pod_network(state, key, pod) {
            Some(b) => out += &format!("pod {key} {node} {} {}\n", b.network, b.policy),
            None => out += &format!("pod {key} {node} - -\n"),
        }
    }
    for ((from, to), policies) in lace::routing::allowed_pairs(state) {
        out += &format!("pair {from} {to} {}\n", policies.join(","));
    }
    for (name, net) in &state.networks {
        if net.external {
            out += &format!("external {name}\n");
        }
    }
    out
}

/// The `policy --pod` subcommand's text: the pod's record as `policy` prints it, then its
/// NetworkPolicies.
fn explain_pod(state: &lace::state::ClusterState, pod: &str) -> Result<String> {
    let Some((namespace, name)) = pod.split_once('/') else {
        bail!("--pod {pod:?}: give the pod as <namespace>/<name>");
    };
    let key = lace::state::ObjectKey::new(namespace, name);
    let Some(p) = state.pods.get(&key) else {
        bail!("--pod {pod}: no such Pod in the manifests (check its namespace and name)");
    };
    let node = if p.node.is_empty() { "-" } else { &p.node };
    let mut out = match lace::binding::pod_network(state, &key, p) {
        Some(b) => format!("pod {key} {node} {} {}\n", b.network, b.policy),
        None => format!("pod {key} {node} - -\n"),
    };
    out += &lace::netpol::explain_pod(state, &key, p);
    Ok(out)
}

/// Writes to stdout; a closed pipe (`lace-agent plan ... | head`) is not an error.
fn write_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
