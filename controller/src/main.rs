//! `lace-controller`: the only cluster-wide writer.
#![forbid(unsafe_code)]
fn main() -> anyhow::Result<()> {
    Ok(())
}
