//! Harness for Lace's netns tests: real network namespaces, real `ip`, real kernel.
//!
//! Every test builds its world out of [`Netns`] values (uniquely named, deleted on drop), links
//! them with veth pairs ([`veth`], [`Topology::link`]) and drives them with the stock tools, so a
//! failing command reports exactly what was run and what the kernel said. The harness shells
//! out to `ip` on purpose: netlink is the library's job, and the tests must not share the code
//! under test.
//!
//! A netns test starts with [`require_root_and_vrf`]: on a host that cannot run it the test
//! *fails* with the reason, it never passes silently. `netns-tests/run` runs these tests on the
//! host when its kernel is capable, else in a VM booting a stock Debian kernel.

// Test support: a failed unwrap is a failed test (clippy exempts only `#[cfg(test)]` code).
#![allow(clippy::unwrap_used)]

pub mod bed;
pub mod cluster;
pub mod echo;
pub mod nft;
pub mod pods;
pub mod probe;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Prefix of every namespace the harness creates (`ip netns list | grep lace-t-` finds leftovers).
pub const NS_PREFIX: &str = "lace-t-";

/// Longest label accepted for a namespace (keeps `ip netns list` readable).
const MAX_LABEL: usize = 16;

/// Longest interface name the kernel accepts (IFNAMSIZ - 1).
const MAX_IFNAME: usize = 15;

/// What went wrong in the harness.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A namespace label is empty, too long or has characters outside `[a-z0-9-]`.
    #[error("invalid namespace label {label:?}: use 1-{MAX_LABEL} characters of [a-z0-9-]")]
    InvalidLabel {
        /// The rejected label.
        label: String,
    },
    /// An interface name is empty, too long for the kernel or contains `/` or whitespace.
    #[error("invalid interface name {name:?}: use 1-{MAX_IFNAME} characters, no '/' or spaces")]
    InvalidIfName {
        /// The rejected name.
        name: String,
    },
    /// A command could not be started at all (binary missing, ...).
    #[error("could not start `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("`{command}` failed ({status}): {output}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its standard error, trimmed; its standard output when stderr is empty (ping reports
        /// "0 received" there).
        output: String,
    },
    /// A thread could not switch into a namespace.
    #[error("could not enter namespace {name}: {reason}")]
    Enter {
        /// The namespace's name.
        name: String,
        /// Why (open or setns error).
        reason: String,
    },
    /// A sysctl could not be written.
    #[error("sysctl {key} in namespace {netns}: {reason}")]
    Sysctl {
        /// The sysctl key (`net.vrf.strict_mode`).
        key: String,
        /// The namespace's name.
        netns: String,
        /// The file and the OS error.
        reason: String,
    },
    /// A [`Topology`] was asked for a label it does not hold, or given one twice.
    #[error("topology: {0}")]
    Topology(String),
}

/// Result type of the harness.
pub type Result<T, E = NetnsError> = std::result::Result<T, E>;

/// Checks a namespace label: 1..=16 characters of `[a-z0-9-]`.
pub fn validate_label(label: &str) -> Result<()> {
    let ok = !label.is_empty()
        && label.len() <= MAX_LABEL
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(NetnsError::InvalidLabel {
            label: label.to_owned(),
        })
    }
}

/// Checks an interface name the way the kernel will: at most 15 bytes, no `/`, no whitespace.
pub fn validate_ifname(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_IFNAME
        && !name.bytes().any(|b| b == b'/' || b.is_ascii_whitespace());
    if ok {
        Ok(())
    } else {
        Err(NetnsError::InvalidIfName {
            name: name.to_owned(),
        })
    }
}

/// The name of the `counter`-th namespace of process `pid` with `label`:
/// `lace-t-<pid>-<counter>-<label>`. Unique per process (counter) and across concurrently
/// running test binaries (pid); the label says which role it plays.
pub fn ns_name(pid: u32, counter: u64, label: &str) -> String {
    format!("{NS_PREFIX}{pid}-{counter}-{label}")
}

/// The `/proc/sys` file of a sysctl key (`net.vrf.strict_mode` -> `/proc/sys/net/vrf/strict_mode`).
pub fn sysctl_path(key: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(key.replace('.', "/"))
}

/// Renders a command line for error messages.
fn render(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` (optionally feeding `stdin`), returns its stdout; errors carry the command line
/// and its stderr.
fn run(mut cmd: Command, stdin: Option<&str>) -> Result<String> {
    let command = render(&cmd);
    let spawn_err = |source| NetnsError::Spawn {
        command: command.clone(),
        source,
    };
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(spawn_err)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).map_err(spawn_err)?;
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        let output = if stderr.is_empty() {
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        } else {
            stderr
        };
        Err(NetnsError::Failed {
            command,
            status: out.status,
            output,
        })
    }
}

/// A named network namespace (`/run/netns/<name>`), deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a fresh namespace for the role `label` (`[a-z0-9-]`, ≤ 16 chars) and brings its
    /// loopback up.
    pub fn new(label: &str) -> Result<Self> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        validate_label(label)?;
        let name = ns_name(
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            label,
        );
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "add", &name]);
        run(cmd, None)?;
        // From here on Drop cleans up, also when bringing lo up fails.
        let ns = Netns { name };
        ns.ip("link set lo up")?;
        Ok(ns)
    }

    /// The namespace's name as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted namespace file.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Runs `program args...` inside the namespace (`ip netns exec`), returns its stdout.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        run(self.exec_command(program, args), None)
    }

    /// Like [`Netns::exec`], with `stdin` fed to the program (e.g. `nft -f -`).
    pub fn exec_stdin(&self, program: &str, args: &[&str], stdin: &str) -> Result<String> {
        run(self.exec_command(program, args), Some(stdin))
    }

    fn exec_command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]).args(args);
        cmd
    }

    /// Runs `ip -n <ns> <args>`; `args` is split on whitespace (no argument of `ip` needs a
    /// space), e.g. `ns.ip("-6 route add fc00:b::/48 via 2001:db8::1")`.
    pub fn ip(&self, args: &str) -> Result<String> {
        let mut cmd = Command::new("ip");
        cmd.args(["-n", &self.name]).args(args.split_whitespace());
        run(cmd, None)
    }

    /// Sets a sysctl inside the namespace (`net.*` keys are per namespace), e.g.
    /// `sysctl("net.ipv4.conf.vrf-blue.rp_filter", "0")`. Written to `/proc/sys` from a thread
    /// inside the namespace: no `sysctl` binary needed, no process to start (slow under TCG).
    /// Interface names in keys must not contain dots.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = sysctl_path(key);
        self.enter(|| std::fs::write(&path, value))?
            .map_err(|e| NetnsError::Sysctl {
                key: key.to_owned(),
                netns: self.name.clone(),
                reason: format!("{}: {e}", path.display()),
            })
    }

    /// Runs `f` on a thread that has entered this namespace and returns its result. Sockets
    /// created by `f` stay in this namespace even when used later from other threads, so a test
    /// can bind a `TcpListener` "inside a pod" and drive it from the test thread.
    pub fn enter<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        let enter_err = |reason: String| NetnsError::Enter {
            name: self.name.clone(),
            reason,
        };
        let file = File::open(self.path()).map_err(|e| enter_err(e.to_string()))?;
        let joined = std::thread::scope(|s| {
            s.spawn(move || {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map(|()| f())
                    .map_err(|e| format!("setns: {e}"))
            })
            .join()
        });
        match joined {
            Ok(result) => result.map_err(enter_err),
            // The closure panicked: let the test see its panic, not ours.
            Err(payload) => std::panic::resume_unwind(payload),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace also destroys its interfaces (veth peers included).
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "del", &self.name]);
        if let Err(e) = run(cmd, None) {
            eprintln!("netns-tests: could not delete namespace: {e}");
        }
    }
}

/// Creates a veth pair `a_if` (in `a`) <-> `b_if` (in `b`) and brings both ends up.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<()> {
    validate_ifname(a_if)?;
    validate_ifname(b_if)?;
    a.ip(&format!(
        "link add {a_if} type veth peer name {b_if} netns {}",
        b.name()
    ))?;
    a.ip(&format!("link set {a_if} up"))?;
    b.ip(&format!("link set {b_if} up"))?;
    Ok(())
}

/// A set of namespaces addressed by role label ("node-a", "pod-a", "fabric", ...), all deleted
/// when the topology is dropped.
#[derive(Debug, Default)]
pub struct Topology {
    namespaces: BTreeMap<String, Netns>,
}

impl Topology {
    /// An empty topology.
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates the namespace for `label`; a label can be added once.
    pub fn add(&mut self, label: &str) -> Result<&Netns> {
        if self.namespaces.contains_key(label) {
            return Err(NetnsError::Topology(format!(
                "namespace {label:?} added twice"
            )));
        }
        let ns = Netns::new(label)?;
        Ok(self.namespaces.entry(label.to_owned()).or_insert(ns))
    }

    /// The namespace for `label`.
    pub fn ns(&self, label: &str) -> Result<&Netns> {
        self.namespaces
            .get(label)
            .ok_or_else(|| NetnsError::Topology(format!("no namespace {label:?}")))
    }

    /// Links `a`'s interface `a_if` to `b`'s `b_if` with a veth pair (both ends up).
    pub fn link(&self, (a, a_if): (&str, &str), (b, b_if): (&str, &str)) -> Result<()> {
        veth(self.ns(a)?, a_if, self.ns(b)?, b_if)
    }
}

/// Why this process cannot run netns tests, or `None` if it can: not root, or the kernel cannot
/// create a VRF device. Probed once per process in a throw-away namespace.
fn root_and_vrf_problem() -> Option<String> {
    static PROBLEM: OnceLock<Option<String>> = OnceLock::new();
    PROBLEM
        .get_or_init(|| {
            let euid = nix::unistd::geteuid();
            if !euid.is_root() {
                return Some(format!("not root (euid {euid})"));
            }
            let probe = Netns::new("vrf-probe")
                .and_then(|ns| ns.ip("link add lace-probe type vrf table 4242"));
            probe
                .err()
                .map(|e| format!("this kernel cannot create a VRF device: {e}"))
        })
        .clone()
}

/// Panics with a readable message unless running as root on a kernel with VRF support.
///
/// Netns tests call this first: a test that cannot run must fail, never pass by returning early.
pub fn require_root_and_vrf() {
    if let Some(problem) = root_and_vrf_problem() {
        panic!(
            "this netns test needs root and a kernel with VRF: {problem} (kernel {}). Run the \
             netns tests with netns-tests/run, which boots a stock Debian kernel in a VM when the \
             host kernel lacks VRF.",
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ns_names_carry_prefix_pid_counter_and_label() {
        assert_eq!(ns_name(4242, 7, "node-a"), "lace-t-4242-7-node-a");
        assert_ne!(ns_name(1, 2, "x"), ns_name(1, 3, "x"));
        assert_ne!(ns_name(1, 2, "x"), ns_name(2, 2, "x"));
    }

    #[test]
    fn sysctl_keys_map_to_proc_sys_files() {
        assert_eq!(
            sysctl_path("net.ipv4.conf.vrf-blue.rp_filter"),
            PathBuf::from("/proc/sys/net/ipv4/conf/vrf-blue/rp_filter")
        );
        assert_eq!(
            sysctl_path("net.vrf.strict_mode"),
            PathBuf::from("/proc/sys/net/vrf/strict_mode")
        );
    }

    #[test]
    fn labels_are_checked() {
        for good in ["a", "node-a", "pod-b-2", "0123456789abcdef"] {
            assert!(validate_label(good).is_ok(), "{good}");
        }
        for bad in ["", "Node", "pod_a", "a b", "a/b", "0123456789abcdefg"] {
            let err = validate_label(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn interface_names_fit_the_kernel_limit() {
        assert!(validate_ifname("veth-pod-a").is_ok());
        assert!(validate_ifname("123456789012345").is_ok());
        assert!(validate_ifname("1234567890123456").is_err());
        assert!(validate_ifname("").is_err());
        assert!(validate_ifname("a/b").is_err());
        assert!(validate_ifname("a b").is_err());
    }

    #[test]
    fn failed_commands_report_command_line_and_stderr() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo boom >&2; exit 3"]);
        let err = run(cmd, None).unwrap_err().to_string();
        assert!(err.contains("sh -c echo boom >&2; exit 3"), "{err}");
        assert!(err.contains("boom"), "{err}");
        assert!(err.contains('3'), "{err}");
    }

    #[test]
    fn failed_commands_without_stderr_report_stdout() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo '1 packets transmitted, 0 received'; exit 1"]);
        let err = run(cmd, None).unwrap_err().to_string();
        assert!(err.contains("0 received"), "{err}");
    }

    #[test]
    fn stdin_is_fed_and_stdout_returned() {
        let out = run(Command::new("cat"), Some("hello\n")).unwrap();
        assert_eq!(out, "hello\n");
    }

    #[test]
    fn missing_binaries_are_spawn_errors() {
        let err = run(Command::new("/nonexistent/lace-no-such-binary"), None).unwrap_err();
        assert!(matches!(err, NetnsError::Spawn { .. }), "{err}");
        assert!(err.to_string().contains("lace-no-such-binary"), "{err}");
    }
}
