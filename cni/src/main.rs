//! `lace`: the CNI plugin containerd executes.
#![forbid(unsafe_code)]
fn main() {}
