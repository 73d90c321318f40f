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
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
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
        } => {
            let state = load(&manifests)?;
            let plan = lace::plan::plan(&node, &state, &[])
                .with_context(|| format!("planning node {node:?} from {}", manifests.display()))?;
            let mut text = String::new();
            if !nft_only {
                text = plan.render() + "\n";
            }
            text.push_str(&plan.render_nft());
            write_stdout(&text)?;
        }
    }
    Ok(())
}

fn load(dir: &std::path::Path) -> Result<lace::state::ClusterState> {
    Ok(lace::load::load_dir(dir)?)
}

/// Writes to stdout; a closed pipe (`lace-agent plan ... | head`) is not an error.
fn write_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
