//! `lace-controller`: the only cluster-wide writer of Lace. It watches Nodes, Networks, the
//! policies and its own internal objects, allocates node locators and SID functions with the
//! library's allocator, writes NodeAllocations and NetworkAllocations (server-side apply,
//! owned by their Node and Network), and reports on the Networks, policies and Nodes.
//!
//! The core is pure ([`model`], [`desired`], [`diff`]): state in, writes out, unit-tested
//! without an API. The kube layer is thin: [`watch`] reads, [`write`](mod@write) writes, [`controller`]
//! runs the loop between them.
#![forbid(unsafe_code)]

pub mod config;
pub mod controller;
pub mod desired;
pub mod diff;
pub mod error;
pub mod metrics;
pub mod model;
pub mod watch;
pub mod write;

pub use config::{parse_prefix, Settings, FIELD_MANAGER};
pub use controller::run;
pub use error::FatalError;
pub use metrics::{Metrics, Progress};
