//! `lace-agent`: the node agent.
fn main() -> anyhow::Result<()> {
    Ok(())
}
