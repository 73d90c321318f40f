//! `lace-controller`: the only cluster-wide writer.
#![forbid(unsafe_code)]

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "lace-controller",
    version,
    about = "Lace controller: allocates locators and per-node blocks"
)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    Cli::parse();
    Ok(())
}
