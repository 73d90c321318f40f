//! Lace: Kubernetes cluster networking as isolated L3 Networks, forwarded by the kernel's own
//! routing (VRFs, SRv6 seg6/seg6local) and policed by nftables.
//!
//! The seam is **state → plan → diff → apply**: [`state`] holds the cluster state without
//! Kubernetes types, the planner turns it into one node's desired kernel state, and only the
//! reconciler talks to the kernel.
// `unsafe` is denied workspace-wide; only `sys` (raw calls behind safe functions) may allow it.
#![deny(unsafe_code)]

#[cfg(feature = "agent")]
pub mod agent;
pub mod alloc;
pub mod api;
pub mod bandwidth;
pub mod binding;
#[cfg(feature = "kube")]
pub mod crd;
#[cfg(feature = "agent")]
pub mod dataplane;
pub mod durable;
mod hash;
pub mod hostport;
pub mod index;
#[cfg(feature = "kube")]
pub mod k8s;
pub mod load;
pub mod netpol;
pub mod objects;
pub mod plan;
#[cfg(feature = "agent")]
pub mod probe;
pub mod routing;
pub mod selector;
pub mod sid;
pub mod state;
#[cfg(feature = "agent")]
pub mod sys;
#[cfg(feature = "serve")]
pub mod telemetry;
pub mod validate;
pub mod wire;
