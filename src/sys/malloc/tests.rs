//! Tests of the arena limit: the environment's own limit is kept, and after
//! [`use_one_arena`] new threads make no new arena (counted by glibc's `malloc_info`, in a
//! fresh process so that no other test's threads count).
use super::*;

#[test]
fn an_arena_limit_from_the_environment_is_kept() {
    assert!(!arena_limit_in_environment(None, false));
    assert!(!arena_limit_in_environment(Some(""), false));
    assert!(!arena_limit_in_environment(
        Some("glibc.malloc.trim_threshold=131072:glibc.malloc.arena_test=2"),
        false
    ));
    assert!(arena_limit_in_environment(
        Some("glibc.malloc.arena_max=2"),
        false
    ));
    assert!(arena_limit_in_environment(
        Some("glibc.malloc.trim_threshold=131072:glibc.malloc.arena_max=4"),
        false
    ));
    assert!(arena_limit_in_environment(None, true));
}

/// Set in the child process this test starts: `one` calls [`use_one_arena`] first, `default`
/// does not.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const CHILD: &str = "LACE_MALLOC_TEST_CHILD";

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn after_use_one_arena_new_threads_make_no_arena_of_their_own() {
    const NAME: &str =
        "sys::malloc::tests::after_use_one_arena_new_threads_make_no_arena_of_their_own";
    if let Ok(mode) = std::env::var(CHILD) {
        if mode == "one" {
            assert_eq!(use_one_arena().unwrap(), Arenas::One);
        }
        let before = arenas();
        four_threads_allocate_at_once();
        // libtest prints the test's name on the same line.
        println!("arenas: {before} -> {}", arenas());
        return;
    }
    let run = |mode: &str| -> (usize, usize) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, mode)
            .env_remove("GLIBC_TUNABLES")
            .env_remove("MALLOC_ARENA_MAX")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child ({mode}) failed: {stdout}");
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("arenas: ").map(|(_, count)| count))
            .unwrap_or_else(|| panic!("child ({mode}) printed no count: {stdout}"));
        let (before, after) = line.split_once(" -> ").unwrap();
        (before.parse().unwrap(), after.parse().unwrap())
    };
    // The count sees new arenas: by default each new thread gets one.
    let (before, after) = run("default");
    assert!(after >= before + 4, "default: {before} -> {after}");
    let (before, after) = run("one");
    assert_eq!(after, before, "with one arena: {before} -> {after}");
}

/// Four threads, each allocating while the others are alive.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn four_threads_allocate_at_once() {
    let barrier = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let boxes: Vec<Box<[u8; 64]>> = (0..1000).map(|_| Box::new([1; 64])).collect();
                barrier.wait();
                assert_eq!(boxes.len(), 1000);
            });
        }
    });
}

/// glibc's arenas: the `<heap nr="…">` elements of `malloc_info`'s report.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn arenas() -> usize {
    let mut buf: *mut libc::c_char = std::ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: open_memstream writes the buffer's address and length into the two locals,
    // which outlive the stream; after fclose they describe `len` initialised bytes that the
    // caller owns and frees with free(3).
    let report = unsafe {
        let stream = libc::open_memstream(&mut buf, &mut len);
        assert!(!stream.is_null(), "open_memstream failed");
        assert_eq!(libc::malloc_info(0, stream), 0, "malloc_info failed");
        assert_eq!(libc::fclose(stream), 0, "fclose failed");
        let report = std::slice::from_raw_parts(buf.cast::<u8>(), len).to_vec();
        libc::free(buf.cast());
        report
    };
    String::from_utf8_lossy(&report)
        .matches("<heap nr=")
        .count()
}
