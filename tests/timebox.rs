//! Tests of `netns-tests/vm/timebox.py`, the time limit every tier, VM run and netns test
//! executable runs under: when a limit hits, it must name the test in flight and (with `--ps`)
//! show what the hung processes wait for, then stop them. CI once lost an hour to a netns test
//! that hung without a word; these keep that from coming back unseen.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn timebox(args: &[&str]) -> (i32, String, String, Duration) {
    let started = Instant::now();
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("netns-tests/vm/timebox.py"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

#[test]
fn a_hung_test_is_named_its_processes_shown_and_stopped() {
    // libtest's progress line without its result, then a child that never returns.
    let (code, stdout, stderr, took) = timebox(&[
        "-t",
        "2",
        "--ps",
        "--label",
        "check",
        "--",
        "sh",
        "-c",
        "printf 'test first ... ok\\ntest stuck_here ... '; sleep 300",
    ]);
    assert_eq!(code, 124, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stderr.contains("check: TIMEOUT: limit 2s reached")
            && stderr.contains("test `stuck_here` was running"),
        "{stderr}"
    );
    let tree = stderr
        .split("check: the processes at the timeout (kernel threads left out):")
        .nth(1)
        .unwrap_or_else(|| panic!("no process tree: {stderr}"));
    // The stuck child is there, with its wait channel column (a sleep waits in the kernel's
    // nanosleep, unless the kernel hides wait channels: then "-").
    let sleep = tree
        .lines()
        .find(|l| l.ends_with("\\_ sleep 300"))
        .unwrap_or_else(|| panic!("no `sleep 300` under its shell in the tree: {tree}"));
    let fields: Vec<&str> = sleep.split_whitespace().collect();
    assert!(
        fields.len() >= 7 && fields[2].starts_with('S'),
        "expected pid, ppid, a sleeping state, seconds and the wait channel: {sleep}"
    );
    assert!(
        !tree.lines().any(|l| l.trim_end().ends_with(']')),
        "kernel threads are in the tree: {tree}"
    );
    // SIGTERM to the process group ended the sleep at once, not 300 s later.
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

#[test]
fn without_ps_a_timeout_prints_no_process_tree_and_a_finished_run_keeps_its_status() {
    let (code, _, stderr, _) = timebox(&["-t", "1", "--", "sleep", "30"]);
    assert_eq!(code, 124, "{stderr}");
    assert!(!stderr.contains("the processes at the timeout"), "{stderr}");
    let (code, stdout, stderr, _) =
        timebox(&["-t", "30", "--ps", "--", "sh", "-c", "echo hi; exit 3"]);
    assert_eq!((code, stdout.as_str()), (3, "hi\n"), "{stderr}");
    assert!(!stderr.contains("TIMEOUT"), "{stderr}");
}
