//! One malloc arena for the agent.
//!
//! glibc's malloc gives each new thread that allocates an arena of its own (up to eight per
//! CPU), and memory freed in an arena is kept for that arena. The agent builds a node's plan
//! (190,000 routes at 5,000 nodes x 50 Networks) on whichever runtime or blocking thread runs
//! it, so what one plan freed stayed behind in an arena the next plan might not use: with the
//! plan, the same agent measured 92-102 MiB RSS from one run of `benches/agent_watch.rs` to
//! the next, and 83-84 MiB in every run with one arena, for about 1% more time from a watch
//! event to the applied plan. The agent's threads mostly wait; they seldom contend for the
//! arena's lock.
//!
//! An operator's own limit (`glibc.malloc.arena_max` in `GLIBC_TUNABLES`, or
//! `MALLOC_ARENA_MAX`) is kept.

/// What [`use_one_arena`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arenas {
    /// Threads that have no arena yet share those there are (at start: the main arena).
    One,
    /// The environment sets glibc's arena limit, and that limit is kept.
    SetByEnvironment,
    /// Not glibc: there are no per-thread arenas to limit.
    NotGlibc,
}

/// glibc refused the limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "glibc's mallopt(M_ARENA_MAX, 1) failed, so each thread may keep a malloc arena of its \
     own and the agent's memory grows with them; set GLIBC_TUNABLES=glibc.malloc.arena_max=1 \
     in the agent's environment instead"
)]
pub struct ArenaError;

/// Limits glibc to the arenas there are. Call it first thing, before other threads allocate:
/// glibc settles its limit once it has made more than eight arenas, and it never frees an
/// arena.
pub fn use_one_arena() -> Result<Arenas, ArenaError> {
    let tunables = std::env::var("GLIBC_TUNABLES").ok();
    let legacy = std::env::var_os("MALLOC_ARENA_MAX").is_some();
    if arena_limit_in_environment(tunables.as_deref(), legacy) {
        return Ok(Arenas::SetByEnvironment);
    }
    set_arena_max()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max() -> Result<Arenas, ArenaError> {
    // SAFETY: mallopt sets one parameter of glibc's allocator under the allocator's own lock
    // and reads or writes no memory of the caller's.
    let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    if ok == 1 {
        Ok(Arenas::One)
    } else {
        Err(ArenaError)
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max() -> Result<Arenas, ArenaError> {
    Ok(Arenas::NotGlibc)
}

/// Whether glibc took an arena limit from the environment at start: `glibc.malloc.arena_max`
/// in `GLIBC_TUNABLES` (`name=value` pairs separated by `:`), or `MALLOC_ARENA_MAX`.
fn arena_limit_in_environment(tunables: Option<&str>, malloc_arena_max: bool) -> bool {
    malloc_arena_max
        || tunables.is_some_and(|t| {
            t.split(':')
                .any(|pair| pair.starts_with("glibc.malloc.arena_max="))
        })
}

#[cfg(test)]
mod tests;
