//! The calling thread's scheduling priority.

/// Gives the calling thread the lowest priority (`nice` 19), for work that should take only
/// CPU time other threads leave: the kernel's scheduler runs it when they wait or yield.
/// Linux applies `setpriority(PRIO_PROCESS, tid)` to that one thread.
pub fn lowest_for_this_thread() -> std::io::Result<()> {
    let tid = nix::unistd::gettid().as_raw() as libc::id_t;
    // SAFETY: setpriority changes the nice value of the thread `tid` (this one) and reads or
    // writes no memory of the caller's.
    match unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 19) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    /// The nice value of this thread, from `/proc/thread-self/stat` (its 19th field).
    fn nice_of_this_thread() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // The command name (field 2) may hold spaces; the fields after it do not.
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn only_the_calling_thread_gets_the_lowest_priority() {
        let before = nice_of_this_thread();
        let lowered = std::thread::spawn(|| {
            super::lowest_for_this_thread().unwrap();
            nice_of_this_thread()
        })
        .join()
        .unwrap();
        assert_eq!(lowered, 19);
        assert_eq!(nice_of_this_thread(), before);
        assert_ne!(
            before, 19,
            "the test thread itself must not run at nice 19 already"
        );
    }
}
