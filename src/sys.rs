//! The library's only `unsafe` code: the raw calls that no safe crate wraps, each behind safe
//! functions whose module keeps the invariants the call needs.
//! - [`bpf`]: the bpf(2) syscall, for the kubelet probe allowance (`crate::probe`);
//! - [`malloc`]: glibc's `mallopt`, so that the agent keeps its heap in one malloc arena;
//! - [`priority`]: setpriority(2) of one thread, for the dump read beside a long one
//!   (`crate::dataplane::observe::dump`).
#![allow(unsafe_code)]

pub mod bpf;
pub mod malloc;
pub mod priority;
