//! The kubelet probe allowance against a real kernel: cgroup v2, bpffs, VRF, nftables.
//!
//! Root only, and each test creates its own cgroups (`/sys/fs/cgroup/lace-test-*`), pin
//! directory (`/sys/fs/bpf/lace-test-*`) and network objects (`lace-pt-*`), removing them at
//! the end. Two tests use Lace's own code end to end instead: the planned probe path (IPv4 and
//! IPv6) programs a node namespace of the harness (`lace-t-*`) with the real planner and
//! reconciler, and the restart test runs the real `lace-agent` binary in standalone mode on
//! the CNI test bed (`lace-ct-*`, [`cni_bed`]) with the default pin directory
//! `/sys/fs/bpf/lace` (it refuses to run where a link is pinned there already). Child
//! processes are put "in a cgroup" by writing their pid to `cgroup.procs` before they exec.
//! Sockets are observed with python3 (`getsockopt(SO_MARK)`, TCP clients and a tiny HTTP
//! server), routing with `ip`, filtering with `nft`, attachments with `bpftool`: real tools,
//! not the code under test. Run them one at a time (`--test-threads=1`): they share the
//! host's routing rules.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use lace::probe::{self, Outcome, ProbeConfig, ProbeError, PROBE_MARK, PROBE_MARK_MASK};
use lace::sys::bpf;

/// Panics (never skips) unless the test can do what it claims to test.
fn require_environment() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap();
    assert_eq!(
        uid, "0",
        "the probe netns tests must run as root (effective uid is {uid})"
    );
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.contains(" /sys/fs/cgroup cgroup2 ")),
        "cgroup v2 is not mounted at /sys/fs/cgroup; run these tests in the VM \
         (mount -t cgroup2 none /sys/fs/cgroup)"
    );
    assert!(
        mounts.lines().any(|l| l.contains(" /sys/fs/bpf bpf ")),
        "bpffs is not mounted at /sys/fs/bpf (mount -t bpf bpf /sys/fs/bpf)"
    );
}

fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sh(script: &str) -> String {
    run("sh", &["-euc", script])
}

/// A cgroup directory that is removed (with its children) when dropped.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(name: &str) -> Self {
        let path = PathBuf::from("/sys/fs/cgroup").join(name);
        remove_cgroup(&path);
        std::fs::create_dir_all(&path).unwrap();
        Cgroup(path)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        remove_cgroup(&self.0);
    }
}

/// Removes a cgroup tree, deepest first; processes in it have exited by then.
fn remove_cgroup(path: &Path) {
    if !path.exists() {
        return;
    }
    for entry in std::fs::read_dir(path).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            remove_cgroup(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(path);
}

/// A pin directory on bpffs that is released when dropped.
struct Pins(PathBuf);

impl Pins {
    fn new(name: &str) -> Self {
        let path = PathBuf::from("/sys/fs/bpf").join(name);
        probe::release_pinned(&path).unwrap();
        Pins(path)
    }

    fn config(&self, cgroup: &Cgroup) -> ProbeConfig {
        ProbeConfig {
            pin_dir: self.0.clone(),
            ..ProbeConfig::new(&cgroup.0)
        }
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = probe::release_pinned(&self.0);
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// `command` run by a shell that first moves itself into `cgroup` (None: stay where the test
/// runs, the root cgroup in the VM).
fn in_cgroup(cgroup: Option<&Cgroup>, program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("sh");
    let enter = match cgroup {
        Some(cg) => format!("echo $$ > '{}/cgroup.procs' && ", cg.0.display()),
        None => String::new(),
    };
    cmd.arg("-c")
        .arg(format!("{enter}exec \"$0\" \"$@\""))
        .arg(program)
        .args(args);
    cmd
}

/// `GET /` of `target` from a process in `cgroup` (None: the root cgroup) inside namespace
/// `netns` (the node's).
fn http_get_in(cgroup: Option<&Cgroup>, netns: &str, target: &str) -> Command {
    in_cgroup(
        cgroup,
        "ip",
        &[
            "netns",
            "exec",
            netns,
            python(),
            "-c",
            HTTP_GET,
            target,
            POD_PORT,
        ],
    )
}

const SOCKET_MARKS: &str = r#"
import socket
for fam in (socket.AF_INET, socket.AF_INET6):
    s = socket.socket(fam, socket.SOCK_STREAM)
    print(s.getsockopt(socket.SOL_SOCKET, socket.SO_MARK))
"#;

/// The marks of an IPv4 and an IPv6 socket created by a process in `cgroup`.
fn socket_marks(cgroup: Option<&Cgroup>) -> Vec<u32> {
    let out = in_cgroup(cgroup, python(), &["-c", SOCKET_MARKS])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

#[test]
fn marks_sockets_of_the_kubelet_cgroup_and_its_descendants_only() {
    require_environment();
    let kubelet = Cgroup::new("lace-test-kubelet");
    let child = Cgroup::new("lace-test-kubelet/child");
    let other = Cgroup::new("lace-test-other");
    let pins = Pins::new("lace-test-marks");

    assert_eq!(
        socket_marks(Some(&kubelet)),
        vec![0, 0],
        "marked before attaching"
    );
    let att = probe::ensure_attached(&pins.config(&kubelet)).unwrap();
    assert_eq!(att.outcome, Outcome::Created);
    assert!(att.pin.starts_with(&pins.0));

    assert_eq!(socket_marks(Some(&kubelet)), vec![PROBE_MARK, PROBE_MARK]);
    assert_eq!(socket_marks(Some(&child)), vec![PROBE_MARK, PROBE_MARK]);
    assert_eq!(socket_marks(Some(&other)), vec![0, 0]);
    assert_eq!(socket_marks(None), vec![0, 0]);

    // bpftool, independently: one program, named as Lace names it, at sock_create.
    let shown = run("bpftool", &["cgroup", "show", kubelet.0.to_str().unwrap()]);
    assert!(shown.contains("sock_create"), "{shown}");
    assert!(shown.contains(probe::PROG_NAME), "{shown}");
    let other_shown = run("bpftool", &["cgroup", "show", other.0.to_str().unwrap()]);
    assert!(!other_shown.contains(probe::PROG_NAME), "{other_shown}");
}

/// A pod in its own netns behind a veth enslaved to a VRF, plus the probe routing and an nft
/// table that drops host→pod traffic unless marked or established. Removed on drop.
struct PodNet;

const POD_IP: &str = "10.77.0.2";
const POD_PORT: &str = "8080";
const PROBE_TABLE: &str = "1200";

impl PodNet {
    fn new() -> Self {
        PodNet::cleanup();
        let mark = format!("{PROBE_MARK:#x}/{PROBE_MARK_MASK:#x}");
        sh(&format!(
            "ip netns add lace-pt-pod
             ip link add lace-pt-vrf type vrf table 1100
             ip link set lace-pt-vrf up
             ip link add lace-pt-h0 type veth peer name eth0 netns lace-pt-pod
             ip link set lace-pt-h0 master lace-pt-vrf
             ip addr add 169.254.77.1/32 dev lace-pt-h0
             ip link set lace-pt-h0 up
             ip -n lace-pt-pod link set lo up
             ip -n lace-pt-pod addr add {POD_IP}/32 dev eth0
             ip -n lace-pt-pod link set eth0 up
             ip -n lace-pt-pod route add 169.254.77.1 dev eth0 scope link
             ip -n lace-pt-pod route add default via 169.254.77.1 dev eth0
             ip route add {POD_IP}/32 dev lace-pt-h0 table 1100
             ip route add {POD_IP}/32 dev lace-pt-h0 table {PROBE_TABLE}
             ip rule add pref 900 fwmark {mark} lookup {PROBE_TABLE}
             sysctl -qw net.ipv4.tcp_l3mdev_accept=1"
        ));
        let nft = format!(
            "table inet lace_probe_test {{
               chain output {{
                 type filter hook output priority 0; policy accept;
                 ip daddr {POD_IP} meta mark & {PROBE_MARK_MASK:#x} == {PROBE_MARK:#x} counter accept
                 ip daddr {POD_IP} ct state established,related accept
                 ip daddr {POD_IP} counter drop
               }}
             }}"
        );
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), nft.as_bytes()).unwrap();
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success(), "nft -f failed for:\n{nft}");
        PodNet
    }

    fn cleanup() {
        let _ = Command::new("sh")
            .args([
                "-c",
                "ip netns del lace-pt-pod; ip link del lace-pt-h0; ip link del lace-pt-vrf; \
                 ip rule del pref 900; ip route flush table 1200; \
                 nft delete table inet lace_probe_test",
            ])
            .stderr(Stdio::null())
            .status();
    }

    /// Starts the pod's HTTP server and waits until it listens.
    fn serve(&self) -> Server {
        serve_http("lace-pt-pod", POD_IP)
    }

    fn drop_counter() -> u64 {
        let out = run(
            "nft",
            &["list", "chain", "inet", "lace_probe_test", "output"],
        );
        let line = out.lines().find(|l| l.contains("drop")).unwrap();
        let packets = line.split("packets ").nth(1).unwrap();
        packets.split_whitespace().next().unwrap().parse().unwrap()
    }
}

impl Drop for PodNet {
    fn drop(&mut self) {
        PodNet::cleanup();
    }
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a tiny HTTP server on `addr:POD_PORT` in network namespace `netns` and waits until
/// it listens. `::` serves IPv4 and IPv6 on one socket.
fn serve_http(netns: &str, addr: &str) -> Server {
    let script = format!(
        r#"
import socket
if ":" in "{addr}":
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
else:
    s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("{addr}", {POD_PORT}))
s.listen(128)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.recv(1024)
    c.sendall(b"HTTP/1.0 200 OK\r\n\r\nok")
    c.close()
"#
    );
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns, python(), "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "pod server did not start");
    Server(child)
}

const HTTP_GET: &str = r#"
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    print(s.recv(100).split(b"\r\n")[0].decode())
except OSError as e:
    print("error:", e)
    sys.exit(1)
"#;

/// An HTTP GET to the pod from a process in `cgroup`; the status line or the error.
fn http_get(cgroup: Option<&Cgroup>) -> Result<String, String> {
    http_get_from(in_cgroup(
        cgroup,
        python(),
        &["-c", HTTP_GET, POD_IP, POD_PORT],
    ))
}

/// Runs an [`HTTP_GET`] client command; the status line or the error.
fn http_get_from(mut client: Command) -> Result<String, String> {
    let out = client.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

#[test]
fn only_the_kubelet_cgroup_reaches_a_pod_in_a_vrf() {
    require_environment();
    let kubelet = Cgroup::new("lace-test-kubelet");
    let other = Cgroup::new("lace-test-other");
    let pins = Pins::new("lace-test-reach");
    let net = PodNet::new();
    let _server = net.serve();
    probe::ensure_attached(&pins.config(&kubelet)).unwrap();

    assert_eq!(http_get(Some(&kubelet)).as_deref(), Ok("HTTP/1.0 200 OK"));
    // Without the mark nothing routes the host to the pod: refused at once.
    assert!(http_get(None).is_err(), "root cgroup reached the pod");
    assert!(
        http_get(Some(&other)).is_err(),
        "another service reached the pod"
    );

    // With a host route to the pod, the nft drop is what stops unmarked traffic.
    sh(&format!("ip route add {POD_IP}/32 dev lace-pt-h0"));
    let dropped = PodNet::drop_counter();
    let err = http_get(None).expect_err("root cgroup reached the pod over the main table");
    assert!(
        err.contains("timed out"),
        "expected a timeout from the drop, got {err}"
    );
    assert!(
        PodNet::drop_counter() > dropped,
        "the nft drop rule did not count"
    );
    assert!(
        http_get(Some(&other)).is_err(),
        "another service reached the pod"
    );
    assert_eq!(http_get(Some(&kubelet)).as_deref(), Ok("HTTP/1.0 200 OK"));
    sh(&format!("ip route del {POD_IP}/32 dev lace-pt-h0"));
}

/// A process in `cgroup` (inside network namespace `netns`, if given) that probes each of
/// `targets` on [`POD_PORT`] every 50 ms until `stop` exists, then prints "ok=N fail=M".
fn probe_loop(
    cgroup: &Cgroup,
    netns: Option<&str>,
    targets: &[&str],
    stop: &Path,
) -> (Child, BufReader<ChildStdout>) {
    let script = format!(
        r#"
import os, socket, sys, time
ok = fail = 0
while not os.path.exists(sys.argv[1]):
    for target in sys.argv[2:]:
        try:
            s = socket.create_connection((target, {POD_PORT}), timeout=1)
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            if s.recv(100).startswith(b"HTTP/1.0 200"):
                ok += 1
            else:
                fail += 1
            s.close()
        except OSError:
            fail += 1
        if ok + fail == 1:
            print("started", flush=True)
    time.sleep(0.05)
print("ok=%d fail=%d" % (ok, fail))
"#
    );
    let stop = stop.to_str().unwrap();
    let mut args: Vec<&str> = Vec::new();
    if let Some(ns) = netns {
        args.extend(["netns", "exec", ns, python()]);
    }
    args.extend(["-c", &script, stop]);
    args.extend(targets);
    let program = if netns.is_some() { "ip" } else { python() };
    let mut child = in_cgroup(Some(cgroup), program, &args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_started(&mut out);
    (child, out)
}

/// Waits for a loop's "started" line (python starts slowly under emulation).
fn wait_started(out: &mut BufReader<ChildStdout>) {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "started", "the loop did not start");
}

fn finish_probe_loop(probes: (Child, BufReader<ChildStdout>), stop: &Path) -> (u32, u32) {
    let (mut child, mut out) = probes;
    std::fs::write(stop, b"").unwrap();
    let mut text = String::new();
    out.read_line(&mut text).unwrap();
    assert!(child.wait().unwrap().success());
    std::fs::remove_file(stop).unwrap();
    let mut counts = text
        .trim()
        .split(' ')
        .map(|kv| kv.split('=').nth(1).unwrap().parse().unwrap());
    (counts.next().unwrap(), counts.next().unwrap())
}

#[test]
fn agent_restarts_keep_the_pinned_link_and_probes_never_fail() {
    require_environment();
    let kubelet = Cgroup::new("lace-test-kubelet");
    let pins = Pins::new("lace-test-restart");
    let net = PodNet::new();
    let _server = net.serve();
    let first = probe::ensure_attached(&pins.config(&kubelet)).unwrap();
    assert_eq!(first.outcome, Outcome::Created);

    let stop = std::env::temp_dir().join("lace-probe-loop-stop");
    let _ = std::fs::remove_file(&stop);
    let probes = probe_loop(&kubelet, None, &[POD_IP], &stop);
    let sockets = MarkLoop::start(&kubelet, "restart");
    // Each call is what a restarted agent does; the loader's fds are gone after each.
    for _ in 0..3 {
        let again = probe::ensure_attached(&pins.config(&kubelet)).unwrap();
        assert_eq!(again.outcome, Outcome::Reused);
        assert_eq!(again.link_id, first.link_id, "the pinned link was not kept");
        assert_eq!(again.prog_id, first.prog_id);
        std::thread::sleep(Duration::from_millis(200));
    }
    // releasePinnedMaps: a new link, swapped in over the old pin.
    let released = probe::ensure_attached(&ProbeConfig {
        release_pinned: true,
        ..pins.config(&kubelet)
    })
    .unwrap();
    assert_eq!(released.outcome, Outcome::Replaced);
    assert_ne!(released.link_id, first.link_id);
    assert_eq!(
        probe::pinned_link(&pins.0).unwrap().map(|l| l.id),
        Some(released.link_id)
    );
    std::thread::sleep(Duration::from_millis(500));
    let (ok, fail) = finish_probe_loop(probes, &stop);
    assert_eq!(fail, 0, "probes failed during restarts ({ok} succeeded)");
    assert!(ok >= 5, "the probe loop barely ran ({ok} probes)");
    // Sockets created back to back the whole time: every one was marked, even while the
    // release swapped links.
    let marks = sockets.finish();
    assert_eq!(marks.len(), 1, "sockets without the mark: {marks:?}");
    assert_eq!(marks[0].0, PROBE_MARK, "{marks:?}");

    // The old link is gone from the cgroup: exactly one program is attached.
    let shown = run("bpftool", &["cgroup", "show", kubelet.0.to_str().unwrap()]);
    assert_eq!(shown.matches(probe::PROG_NAME).count(), 1, "{shown}");
}

const MARK_LOOP: &str = r#"
import os, socket, sys
seen = {}
while not os.path.exists(sys.argv[1]):
    s = socket.socket()
    m = s.getsockopt(socket.SOL_SOCKET, socket.SO_MARK)
    seen[m] = seen.get(m, 0) + 1
    s.close()
    if sum(seen.values()) == 1:
        print("started", flush=True)
print(" ".join("%d=%d" % kv for kv in sorted(seen.items())))
"#;

/// A process in a cgroup that creates sockets as fast as it can and counts their marks.
struct MarkLoop {
    child: Child,
    out: BufReader<ChildStdout>,
    stop: PathBuf,
}

impl MarkLoop {
    fn start(cgroup: &Cgroup, name: &str) -> Self {
        let stop = std::env::temp_dir().join(format!("lace-mark-loop-stop-{name}"));
        let _ = std::fs::remove_file(&stop);
        let mut child = in_cgroup(
            Some(cgroup),
            python(),
            &["-c", MARK_LOOP, stop.to_str().unwrap()],
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        wait_started(&mut out);
        MarkLoop { child, out, stop }
    }

    /// Stops the loop; returns (mark, sockets seen with it), sorted by mark.
    fn finish(mut self) -> Vec<(u32, u32)> {
        std::fs::write(&self.stop, b"").unwrap();
        let mut seen = String::new();
        self.out.read_line(&mut seen).unwrap();
        assert!(self.child.wait().unwrap().success());
        std::fs::remove_file(&self.stop).unwrap();
        seen.split_whitespace()
            .map(|kv| {
                let (m, n) = kv.split_once('=').unwrap();
                (m.parse().unwrap(), n.parse().unwrap())
            })
            .collect()
    }
}

#[test]
fn a_changed_program_is_swapped_in_place_without_detaching() {
    require_environment();
    let kubelet = Cgroup::new("lace-test-kubelet");
    let pins = Pins::new("lace-test-update");
    let first = probe::ensure_attached(&pins.config(&kubelet)).unwrap();

    let sockets = MarkLoop::start(&kubelet, "update");
    let changed = ProbeConfig {
        mark: 0x2000,
        ..pins.config(&kubelet)
    };
    let updated = probe::ensure_attached(&changed).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let marks = sockets.finish();

    assert_eq!(updated.outcome, Outcome::Updated);
    assert_eq!(
        updated.link_id, first.link_id,
        "the link was replaced, not updated"
    );
    assert_ne!(updated.prog_id, first.prog_id);
    // Every socket created meanwhile had one of the two marks: never none.
    assert!(
        marks.iter().all(|&(m, _)| m == PROBE_MARK || m == 0x2000),
        "sockets without the mark during the update: {marks:?}"
    );
    assert!(marks.iter().any(|&(m, _)| m == PROBE_MARK), "{marks:?}");
    assert!(marks.iter().any(|&(m, _)| m == 0x2000), "{marks:?}");
    assert_eq!(socket_marks(Some(&kubelet)), vec![0x2000, 0x2000]);

    let again = probe::ensure_attached(&changed).unwrap();
    assert_eq!(again.outcome, Outcome::Reused);
    assert_eq!(again.prog_id, updated.prog_id);
}

#[test]
fn a_changed_kubelet_cgroup_takes_effect_after_restart() {
    require_environment();
    let old = Cgroup::new("lace-test-kubelet-old");
    let new = Cgroup::new("lace-test-kubelet-new");
    let pins = Pins::new("lace-test-cgroup-change");
    let first = probe::ensure_attached(&pins.config(&old)).unwrap();
    assert_eq!(socket_marks(Some(&old)), vec![PROBE_MARK, PROBE_MARK]);

    let moved = probe::ensure_attached(&pins.config(&new)).unwrap();
    assert_eq!(moved.outcome, Outcome::Replaced);
    assert_ne!(moved.link_id, first.link_id);
    assert_eq!(socket_marks(Some(&new)), vec![PROBE_MARK, PROBE_MARK]);
    assert_eq!(
        socket_marks(Some(&old)),
        vec![0, 0],
        "the old cgroup kept the mark"
    );
}

#[test]
fn a_missing_kubelet_cgroup_is_reported_and_picked_up_once_created() {
    require_environment();
    let path = PathBuf::from("/sys/fs/cgroup/lace-test-late-kubelet");
    remove_cgroup(&path);
    let pins = Pins::new("lace-test-late");
    let cfg = ProbeConfig {
        pin_dir: pins.0.clone(),
        ..ProbeConfig::new(&path)
    };

    let err = probe::ensure_attached(&cfg).unwrap_err();
    assert!(matches!(err, ProbeError::CgroupMissing { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("/sys/fs/cgroup/lace-test-late-kubelet"),
        "{err}"
    );
    let err = probe::wait_for_cgroup(&path, Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(err, ProbeError::CgroupWaitTimedOut { .. }),
        "{err}"
    );

    let creator = {
        let path = path.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(700));
            std::fs::create_dir(&path).unwrap();
        })
    };
    let start = Instant::now();
    probe::wait_for_cgroup(&path, Duration::from_secs(20)).unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(600),
        "returned before the cgroup existed"
    );
    creator.join().unwrap();
    let cgroup = Cgroup(path);
    assert_eq!(
        probe::ensure_attached(&cfg).unwrap().outcome,
        Outcome::Created
    );
    assert_eq!(socket_marks(Some(&cgroup)), vec![PROBE_MARK, PROBE_MARK]);
}

#[test]
fn a_program_the_verifier_refuses_is_reported_with_its_log() {
    require_environment();
    // `exit` without setting r0: the verifier refuses to return an uninitialised register.
    let insns = [lace::probe::insn::Insn::exit().encode()];
    let err = bpf::prog_load(
        bpf::BPF_PROG_TYPE_CGROUP_SOCK,
        bpf::BPF_CGROUP_INET_SOCK_CREATE,
        &insns,
        c"Apache-2.0",
        "lace_bad",
    )
    .unwrap_err();
    let shown = ProbeError::ProgramRejected(err).to_string();
    assert!(shown.contains("R0 !read_ok"), "no verifier log in: {shown}");
    assert!(
        shown.contains("refused the kubelet probe program"),
        "{shown}"
    );
}

#[test]
fn something_else_pinned_at_the_link_path_is_not_taken_for_lace() {
    require_environment();
    let kubelet = Cgroup::new("lace-test-kubelet");
    let pins = Pins::new("lace-test-foreign");
    std::fs::create_dir_all(&pins.0).unwrap();
    let pin = pins.0.join(probe::LINK_PIN_NAME);
    let pin_c = std::ffi::CString::new(pin.to_str().unwrap()).unwrap();

    // Another tool's program, attached to the same cgroup, its link pinned at our path.
    let foreign = bpf::prog_load(
        bpf::BPF_PROG_TYPE_CGROUP_SOCK,
        bpf::BPF_CGROUP_INET_SOCK_CREATE,
        &lace::probe::program(0x1)
            .into_iter()
            .map(|i| i.encode())
            .collect::<Vec<_>>(),
        c"Apache-2.0",
        "not_lace",
    )
    .unwrap();
    let dir = std::fs::File::open(&kubelet.0).unwrap();
    use std::os::fd::AsFd;
    let link = bpf::link_create(
        foreign.as_fd(),
        dir.as_fd(),
        bpf::BPF_CGROUP_INET_SOCK_CREATE,
    )
    .unwrap();
    bpf::obj_pin(link.as_fd(), &pin_c).unwrap();
    drop((link, foreign));

    let err = probe::ensure_attached(&pins.config(&kubelet)).unwrap_err();
    assert!(matches!(err, ProbeError::PinnedNotLace { .. }), "{err}");
    assert!(err.to_string().contains("\"not_lace\""), "{err}");
    assert_eq!(
        socket_marks(Some(&kubelet)),
        vec![0x1, 0x1],
        "the foreign link was touched"
    );

    // A pinned program (not a link) is refused too.
    std::fs::remove_file(&pin).unwrap();
    let prog = bpf::prog_load(
        bpf::BPF_PROG_TYPE_CGROUP_SOCK,
        bpf::BPF_CGROUP_INET_SOCK_CREATE,
        &lace::probe::program(0x1)
            .into_iter()
            .map(|i| i.encode())
            .collect::<Vec<_>>(),
        c"Apache-2.0",
        probe::PROG_NAME,
    )
    .unwrap();
    bpf::obj_pin(prog.as_fd(), &pin_c).unwrap();
    let err = probe::ensure_attached(&pins.config(&kubelet)).unwrap_err();
    assert!(err.to_string().contains("a bpf prog,"), "{err}");

    // releasePinnedMaps replaces whatever is there.
    let att = probe::ensure_attached(&ProbeConfig {
        release_pinned: true,
        ..pins.config(&kubelet)
    })
    .unwrap();
    assert_eq!(att.outcome, Outcome::Replaced);
    assert_eq!(socket_marks(Some(&kubelet)), vec![PROBE_MARK, PROBE_MARK]);
}

/// A node planned by Lace's own planner with two Networks: `isolated` (no routing policy at
/// all, not even to itself) and `other` (reaches itself only), one pod in each.
mod planned {
    use std::collections::BTreeMap;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use ipnet::{IpNet, Ipv4Net, Ipv6Net};
    use lace::api::{NetworkRoutingPolicySpec, NodeAllocationSpec, Underlay};
    use lace::state::{ClusterState, Node, ObjectKey, PodAttachment};
    use lace_netns_tests::cluster::add_dual_stack_network;

    pub const NODE: &str = "node1";
    pub const NODE_V4: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
    pub const NODE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 1);
    /// (Network, second octet of its subnet, SID function, pod's host interface).
    pub const NETS: [(&str, u8, u16, &str); 2] = [
        ("isolated", 1, 1, "lp-isolated"),
        ("other", 2, 2, "lp-other"),
    ];

    pub fn pod_addr(second: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, second, 1, 10)
    }

    pub fn pod_addr_v6(second: u8) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, u16::from(second), 0, 1, 0, 0, 0, 0x10)
    }

    pub fn cluster() -> ClusterState {
        let mut s = ClusterState::default();
        for (name, second, function, _) in NETS {
            add_dual_stack_network(&mut s, name, second, function);
        }
        s.network_routes.insert(
            "other-self".into(),
            NetworkRoutingPolicySpec {
                from: "other".into(),
                to: "other".into(),
            },
        );
        s.nodes.insert(
            NODE.into(),
            Node {
                labels: BTreeMap::new(),
                internal_ips: vec![IpAddr::V6(NODE_V6), IpAddr::V4(NODE_V4)],
            },
        );
        s.node_allocations.insert(
            NODE.into(),
            NodeAllocationSpec {
                // Index 2 holds block 1 of every subnet: 10.<second>.1.0/24 and
                // fd00:<second>:0:1::/64, where pod_addr_v4/pod_addr_v6 lie.
                index: 2,
                locator: Ipv6Net::new(Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 1, 0, 0), 96)
                    .unwrap(),
                underlay: Underlay {
                    ipv4: Some(NODE_V4),
                    ipv6: Some(NODE_V6),
                },
            },
        );
        s
    }

    pub fn attachments() -> Vec<PodAttachment> {
        NETS.iter()
            .map(|&(name, second, _, host_if)| PodAttachment {
                pod: ObjectKey::new("test", name),
                container_id: format!("c-{name}"),
                host_ifname: host_if.into(),
                network: name.into(),
                ips: vec![
                    IpNet::V4(Ipv4Net::from(pod_addr(second))),
                    IpNet::V6(Ipv6Net::from(pod_addr_v6(second))),
                ],
                host_ports: Vec::new(),
                bandwidth: None,
            })
            .collect()
    }
}

/// The nft counter of the drop rule of Lace's chain `chain` in `node`.
fn nft_drops(node: &lace_netns_tests::Netns, chain: &str) -> u64 {
    let out = node
        .exec("nft", &["list", "chain", "inet", "lace", chain])
        .unwrap();
    let line = out
        .lines()
        .find(|l| l.contains("drop"))
        .unwrap_or_else(|| panic!("no drop rule in Lace's {chain} chain:\n{out}"));
    lace_netns_tests::bed::number_after(line, "packets").unwrap()
}

/// The nft counter of Lace's "host processes other than the kubelet" drop rule in `node`.
fn from_host_drops(node: &lace_netns_tests::Netns) -> u64 {
    nft_drops(node, "from_host")
}

#[test]
fn probes_use_lace_planned_routes_and_nft_only_the_kubelet_gets_in() {
    use lace::dataplane::{NetnsTarget, Reconciler};
    use lace_netns_tests::pods::{add_pod_v6, attach_pod};
    use lace_netns_tests::{require_root_and_vrf, Netns};

    require_environment();
    require_root_and_vrf();
    let kubelet = Cgroup::new("lace-test-planned-kubelet");
    let other_service = Cgroup::new("lace-test-planned-other");
    let pins = Pins::new("lace-test-planned");
    let node = Netns::new("node").unwrap();
    // The node's underlay: its InternalIPs on a link of its own.
    node.ip("link add ul0 type dummy").unwrap();
    node.ip(&format!(
        "-6 addr add {}/64 dev ul0 nodad",
        planned::NODE_V6
    ))
    .unwrap();
    node.ip(&format!("addr add {}/24 dev ul0", planned::NODE_V4))
        .unwrap();
    node.ip("link set ul0 up").unwrap();
    let pods: Vec<Netns> = planned::NETS
        .iter()
        .map(|&(name, second, _, host_if)| {
            let pod = Netns::new(name).unwrap();
            attach_pod(&node, host_if, &pod, planned::pod_addr(second)).unwrap();
            pod
        })
        .collect();
    let (isolated_pod, other_pod) = (&pods[0], &pods[1]);
    let isolated_if = planned::NETS[0].3;

    let desired = lace::plan::plan(planned::NODE, &planned::cluster(), &planned::attachments())
        .unwrap_or_else(|e| panic!("plan: {e}"));
    let report = Reconciler::new(NetnsTarget::named(node.name()))
        .unwrap()
        .reconcile(&desired)
        .unwrap_or_else(|e| panic!("reconcile: {e}"));
    assert!(report.skipped.is_empty(), "skipped {:?}", report.skipped);
    // The pods' IPv6 side once their veths are in their VRFs, as after a CNI ADD (enslaving
    // an up veth cycles it).
    for (pod, &(_, second, _, host_if)) in pods.iter().zip(&planned::NETS) {
        add_pod_v6(&node, host_if, pod, planned::pod_addr_v6(second)).unwrap();
    }
    // The reconciler put the IPv6 probe source on the pod veth's host end (in the VRF).
    let veth6 = node.ip(&format!("-6 addr show dev {isolated_if}")).unwrap();
    assert!(
        veth6.contains("inet6 fe80::1/64"),
        "no fe80::1 on {isolated_if}: {veth6}"
    );
    // The pod serves HTTP on both families (one dual-stack socket).
    let _server = serve_http(isolated_pod.name(), "::");
    probe::ensure_attached(&pins.config(&kubelet)).unwrap();

    // (target, source the kernel must pick for marked sockets, `ip` family flag)
    let v4 = planned::pod_addr(planned::NETS[0].1).to_string();
    let v6 = planned::pod_addr_v6(planned::NETS[0].1).to_string();
    let families = [
        (v4, planned::NODE_V4.to_string(), "-4", "32"),
        (v6, "fe80::1".to_string(), "-6", "128"),
    ];
    for (target, src, fam, len) in &families {
        // The kernel's own route lookup: a marked socket is sent through Lace's probe table,
        // from the node's IPv4 InternalIP or the veth's fe80::1; an unmarked one has no route.
        let marked = node
            .ip(&format!("{fam} route get {target} mark {PROBE_MARK:#x}"))
            .unwrap();
        assert!(
            marked.contains(&format!("table {}", lace::plan::PROBE_TABLE))
                && marked.contains(&format!("src {src}")),
            "marked route lookup: {marked}"
        );
        assert!(
            node.ip(&format!("{fam} route get {target}")).is_err(),
            "the main table routes the host to the pod"
        );

        // A client process in `cgroup` (None: the root cgroup) inside the node's namespace.
        let from_node =
            |cgroup: Option<&Cgroup>| http_get_from(http_get_in(cgroup, node.name(), target));

        let drops = from_host_drops(&node);
        let reached = from_node(Some(&kubelet));
        if reached.as_deref() != Ok("HTTP/1.0 200 OK") {
            let diag = |ns: &Netns, cmd: &str| format!("{cmd}: {:?}", ns.ip(cmd));
            panic!(
                "the kubelet did not reach the isolated pod at {target} through Lace's probe \
                 route: {reached:?}\n{}\n{}\n{}\n{}\n{}\n{:?}",
                diag(&node, &format!("-6 neigh show dev {isolated_if}")),
                diag(&node, &format!("-6 addr show dev {isolated_if}")),
                diag(isolated_pod, "-6 addr show"),
                diag(isolated_pod, "-6 route show"),
                diag(isolated_pod, "-6 neigh show"),
                node.exec("nft", &["list", "table", "inet", "lace"]),
            );
        }
        assert_eq!(
            from_host_drops(&node),
            drops,
            "the kubelet's probe to {target} hit the drop"
        );

        // Unmarked host traffic: the main table has no route to pods, so it is refused at once.
        assert!(
            from_node(None).is_err(),
            "the node's root cgroup reached the isolated pod at {target}"
        );
        assert!(
            from_node(Some(&other_service)).is_err(),
            "another service's cgroup reached the isolated pod at {target}"
        );
        // With a (foreign) host route to the pod, Lace's nft is what refuses it.
        node.ip(&format!("{fam} route add {target}/{len} dev {isolated_if}"))
            .unwrap();
        for (who, cgroup) in [
            ("the root cgroup", None),
            ("another service", Some(&other_service)),
        ] {
            let err = from_node(cgroup)
                .expect_err(&format!("{who} reached {target} over the main table"));
            assert!(
                err.contains("timed out"),
                "expected the nft drop for {who} to {target}, got {err}"
            );
        }
        assert!(
            from_host_drops(&node) >= drops + 2,
            "Lace's from_host drop rule did not count the unmarked connections to {target}"
        );
        assert_eq!(
            from_node(Some(&kubelet)).as_deref(),
            Ok("HTTP/1.0 200 OK"),
            "the kubelet lost the pod at {target} once the host had a route too"
        );
        node.ip(&format!("{fam} route del {target}/{len} dev {isolated_if}"))
            .unwrap();

        // A pod of a Network with no routing policy towards `isolated`.
        let from_other = other_pod.exec(python(), &["-c", HTTP_GET, target, POD_PORT]);
        assert!(
            from_other.is_err(),
            "the other Network's pod reached the isolated pod at {target}: {from_other:?}"
        );
    }

    // The probe source is the isolated pod's gateway: the pod must not reach a host service
    // through it (nor through the veth's own link-local address), while the host reaches it.
    let _host_service = serve_http(node.name(), "::");
    let local = http_get_in(None, node.name(), "::1");
    assert_eq!(
        http_get_from(local).as_deref(),
        Ok("HTTP/1.0 200 OK"),
        "the host's own service does not answer (the refusals below would prove nothing)"
    );
    let lla = node
        .ip(&format!("-6 -o addr show dev {isolated_if} scope link"))
        .unwrap()
        .split_whitespace()
        .filter_map(|w| w.strip_suffix("/64"))
        .find(|a| *a != "fe80::1")
        .unwrap_or_else(|| panic!("{isolated_if} has no auto-generated link-local address"))
        .to_string();
    let refused = nft_drops(&node, "pods_to_host");
    for gw in ["fe80::1", lla.as_str()] {
        let scoped = format!("{gw}%eth0");
        let r = isolated_pod.exec(python(), &["-c", HTTP_GET, &scoped, POD_PORT]);
        assert!(
            r.is_err(),
            "the pod reached a host service through {scoped}: {r:?}"
        );
    }
    assert!(
        nft_drops(&node, "pods_to_host") >= refused + 2,
        "Lace's pods_to_host drop did not count the pod's connections to the host"
    );
}

mod cni_bed;

/// The agent log written since byte `from` (each start appends to the same file).
fn log_since(bed: &cni_bed::Bed, from: usize) -> String {
    bed.log().get(from..).unwrap_or_default().to_string()
}

/// Restarts the real `lace-agent` (killed, then started with `bed.agent_args`) and returns
/// what it logged while starting.
fn restart_agent(bed: &mut cni_bed::Bed) -> String {
    bed.kill_agent();
    let from = bed.log().len();
    bed.start_agent();
    log_since(bed, from)
}

#[test]
fn real_agent_restarts_keep_kubelet_probes_working_over_both_families() {
    require_environment();
    let pin_dir = PathBuf::from(probe::DEFAULT_PIN_DIR);
    assert!(
        probe::pinned_link(&pin_dir).ok().flatten().is_none(),
        "a kubelet probe link is pinned in {} already: this test does not touch a real \
         installation (run it in the VM)",
        pin_dir.display()
    );
    let _pins = Pins(pin_dir.clone());
    let kubelet = Cgroup::new("lace-test-agent-kubelet");
    let moved = Cgroup::new("lace-test-agent-kubelet-moved");
    let mut bed = cni_bed::Bed::for_node("pr", cni_bed::NODE);
    let node = bed.node.0.clone();
    // node-1's IPv4 InternalIP (examples/cluster), the source of IPv4 probes.
    cni_bed::ip(&["-n", &node, "addr", "add", "192.168.0.11/24", "dev", "up0"]);
    let with_cgroup = |cgroup: &Cgroup, release: bool| {
        vec![
            "--kubelet-cgroup-path".to_string(),
            cgroup.0.display().to_string(),
            "--release-pinned-maps".to_string(),
            release.to_string(),
        ]
    };
    bed.agent_args = with_cgroup(&kubelet, false);
    bed.start_agent();
    let first = probe::pinned_link(&pin_dir)
        .unwrap()
        .unwrap_or_else(|| panic!("the agent pinned no link:\n{}", bed.log()));
    assert!(
        bed.log()
            .contains("kubelet probe program attached and pinned"),
        "{}",
        bed.log()
    );

    // A pod added through the real plugin; the agent's reconciler installs its probe routes.
    let pod = cni_bed::Ns::new(format!("lace-ct-p-{}", bed.tag));
    let result = bed.add("ctr-probe", &pod);
    let addrs: Vec<String> = cni_bed::addresses(&result)
        .iter()
        .map(|a| a.split('/').next().unwrap().to_string())
        .collect();
    assert_eq!(addrs.len(), 2, "{result}");
    let deadline = Instant::now() + cni_bed::DEADLINE;
    loop {
        // Until the first reconcile the table does not exist (`ip` fails): keep waiting.
        let table = lace::plan::PROBE_TABLE.to_string();
        let out = Command::new("ip")
            .args(["-n", &node, "-6", "route", "show", "table", &table])
            .output()
            .unwrap();
        let probe_routes = String::from_utf8_lossy(&out.stdout).into_owned();
        if probe_routes.contains(&format!("{} dev", addrs[1]))
            && probe_routes.contains("src fe80::1")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no IPv6 probe route from fe80::1 for {}: {probe_routes}\n{}",
            addrs[1],
            bed.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _server = serve_http(&pod.0, "::");
    let get =
        |cgroup: &Cgroup, target: &str| http_get_from(http_get_in(Some(cgroup), &node, target));
    for a in &addrs {
        assert_eq!(
            get(&kubelet, a).as_deref(),
            Ok("HTTP/1.0 200 OK"),
            "the kubelet does not reach the pod at {a}"
        );
    }

    let stop = std::env::temp_dir().join("lace-agent-probe-loop-stop");
    let _ = std::fs::remove_file(&stop);
    let targets: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let probes = probe_loop(&kubelet, Some(&node), &targets, &stop);
    // Plain restarts: the pinned link is reused as it is.
    for _ in 0..2 {
        let log = restart_agent(&mut bed);
        assert!(
            log.contains("kubelet probe link is current, reusing it"),
            "{log}"
        );
        assert_eq!(
            probe::pinned_link(&pin_dir).unwrap().map(|l| l.id),
            Some(first.id)
        );
    }
    // node.releasePinnedMaps=true: a fresh link replaces the pinned one, and the log says so.
    bed.agent_args = with_cgroup(&kubelet, true);
    let log = restart_agent(&mut bed);
    assert!(log.contains("node.releasePinnedMaps"), "{log}");
    let released = probe::pinned_link(&pin_dir).unwrap().map(|l| l.id);
    assert!(
        released.is_some() && released != Some(first.id),
        "releasePinnedMaps kept link {} ({released:?})",
        first.id
    );
    std::thread::sleep(Duration::from_secs(1));
    let (ok, fail) = finish_probe_loop(probes, &stop);
    assert_eq!(
        fail,
        0,
        "probes failed across agent restarts ({ok} succeeded)\n{}",
        bed.log()
    );
    assert!(ok >= 10, "the probe loop barely ran ({ok} probes)");

    // A changed kubeletCgroupPath takes effect at the next start: the new cgroup's processes
    // reach the pod, the old one's no longer do.
    bed.agent_args = with_cgroup(&moved, false);
    let log = restart_agent(&mut bed);
    assert!(log.contains("kubelet cgroup changed"), "{log}");
    // Only `now` (the configured cgroup) reaches the pod, `before` no longer does.
    let only_reaches = |now: &Cgroup, before: &Cgroup| {
        for a in &addrs {
            assert_eq!(
                get(now, a).as_deref(),
                Ok("HTTP/1.0 200 OK"),
                "the kubelet in {} does not reach the pod at {a}",
                now.0.display()
            );
            assert!(
                get(before, a).is_err(),
                "the previous kubelet cgroup {} still reaches the pod at {a}",
                before.0.display()
            );
        }
    };
    only_reaches(&moved, &kubelet);

    // A kubeletCgroupPath that does not exist yet (the kubelet starts after the agent): the
    // agent serves pods, says what it waits for, and attaches once the cgroup appears.
    let late_path = PathBuf::from("/sys/fs/cgroup/lace-test-agent-kubelet-late");
    remove_cgroup(&late_path);
    bed.agent_args = vec![
        "--kubelet-cgroup-path".to_string(),
        late_path.display().to_string(),
    ];
    let from = bed.log().len();
    let log = restart_agent(&mut bed);
    assert!(
        log.contains("waits for the kubelet's cgroup") && log.contains("serving"),
        "{log}"
    );
    let late = Cgroup::new("lace-test-agent-kubelet-late");
    let deadline = Instant::now() + cni_bed::DEADLINE;
    while !log_since(&bed, from).contains("kubelet cgroup changed") {
        assert!(
            Instant::now() < deadline,
            "the agent did not attach once {} appeared:\n{}",
            late.0.display(),
            log_since(&bed, from)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    only_reaches(&late, &moved);
    bed.kill_agent();
}
