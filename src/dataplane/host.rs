//! Kernel state outside rtnetlink: sysctls (`/proc/sys`), and running a tool (the `nft`
//! binary, see [`super::nft`]). All of it runs on the namespace's worker thread, so files and
//! child processes see that namespace.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Where the chart mounts the host's `/proc/sys/net` in the agent's container (as `net/`
/// below this). A container that is not privileged gets `/proc/sys` mounted read-only by the
/// runtime; a bind mount of the host's `/proc/sys/net` elsewhere stays writable, and its files
/// still resolve against the network namespace of the thread that opens them, exactly like
/// `/proc/sys/net` (so pod-namespace sysctls work through it too).
pub const CONTAINER_PROC_SYS: &str = "/host/proc/sys";

/// The root sysctls are read and written under: [`CONTAINER_PROC_SYS`] when its `net/` is
/// mounted (in the chart's DaemonSet), else `/proc/sys`. Every Lace sysctl is under `net`.
pub fn proc_sys() -> &'static Path {
    static ROOT: OnceLock<&'static Path> = OnceLock::new();
    ROOT.get_or_init(|| proc_sys_root(Path::new(CONTAINER_PROC_SYS)))
}

fn proc_sys_root(container: &'static Path) -> &'static Path {
    if container.join("net").is_dir() {
        container
    } else {
        Path::new("/proc/sys")
    }
}

/// Path of a dotted sysctl key under [`proc_sys`].
pub fn sysctl_path(key: &str) -> PathBuf {
    sysctl_path_in(proc_sys(), key)
}

/// Path of a dotted sysctl key under `root`. Interface names may contain dots, so in
/// `net.ipv{4,6}.{conf,neigh}.<ifname>.<leaf>` everything between the fourth component and the
/// last is the interface name, kept whole.
fn sysctl_path_in(root: &Path, key: &str) -> PathBuf {
    let mut path = root.to_path_buf();
    if let Some((prefix, ifname, leaf)) = crate::plan::split_device_sysctl(key) {
        path.extend(prefix.split('.'));
        path.push(ifname);
        path.push(leaf);
        return path;
    }
    path.extend(key.split('.'));
    path
}

/// The sysctl's value, `None` if it does not exist (yet).
pub fn read_sysctl(key: &str) -> Option<String> {
    std::fs::read_to_string(sysctl_path(key))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Why a sysctl write or a tool failed; each names the file or the command line.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("writing {}: {source}", path.display())]
    Sysctl {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run `{line}`: {source}")]
    Spawn {
        line: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{step} `{line}`: {source}")]
    Pipe {
        line: String,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("`{line}` failed ({status}): {stderr}")]
    Failed {
        line: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// Writes a sysctl.
pub fn write_sysctl(key: &str, value: &str) -> Result<(), HostError> {
    let path = sysctl_path(key);
    std::fs::write(&path, value).map_err(|source| HostError::Sysctl { path, source })
}

/// Runs `program` with `args`, feeding it `stdin`; its stdout, or an error naming the
/// command and what it said.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, HostError> {
    let line = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| HostError::Spawn {
            line: line.clone(),
            source,
        })?;
    // Feed stdin from another thread while this one drains stdout and stderr: a tool that
    // reports many errors before reading all its input would otherwise block on a full pipe
    // while we block writing to it.
    let out = std::thread::scope(|s| {
        let writer = match (stdin, child.stdin.take()) {
            (Some(input), Some(mut pipe)) => {
                Some(s.spawn(move || pipe.write_all(input.as_bytes())))
            }
            _ => None,
        };
        let out = child.wait_with_output();
        let written = writer.map(|w| w.join().unwrap_or(Ok(())));
        (out, written)
    });
    let out = match out {
        (Ok(o), Some(Err(source))) if o.status.success() => {
            return Err(HostError::Pipe {
                line,
                step: "writing to",
                source,
            })
        }
        (Ok(o), _) => o,
        (Err(source), _) => {
            return Err(HostError::Pipe {
                line,
                step: "waiting for",
                source,
            })
        }
    };
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(HostError::Failed {
            line,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_that_fails_loudly_before_reading_its_input_does_not_hang() {
        // 256 KiB of stderr before reading any of 1 MiB of stdin: both pipes overflow.
        let input = "x".repeat(1 << 20);
        let err = run(
            "sh",
            &["-c", "head -c 262144 /dev/zero >&2; exit 3"],
            Some(&input),
        )
        .unwrap_err();
        assert!(
            matches!(&err, HostError::Failed { status, .. } if status.code() == Some(3)),
            "{err}"
        );
        assert!(err.to_string().contains("exit status: 3"), "{err}");
        assert_eq!(run("cat", &[], Some("abc")).unwrap(), "abc");
    }

    #[test]
    fn sysctl_paths_keep_interface_names_whole() {
        let root = Path::new("/proc/sys");
        assert_eq!(
            sysctl_path_in(root, "net.ipv4.conf.lv-a.b.rp_filter"),
            PathBuf::from("/proc/sys/net/ipv4/conf/lv-a.b/rp_filter")
        );
        assert_eq!(
            sysctl_path_in(root, "net.ipv4.conf.all.rp_filter"),
            PathBuf::from("/proc/sys/net/ipv4/conf/all/rp_filter")
        );
        assert_eq!(
            sysctl_path_in(root, "net.vrf.strict_mode"),
            PathBuf::from("/proc/sys/net/vrf/strict_mode")
        );
        assert_eq!(
            sysctl_path_in(root, &crate::plan::disable_ipv6_key("lv-a.b")),
            PathBuf::from("/proc/sys/net/ipv6/conf/lv-a.b/disable_ipv6")
        );
    }

    #[test]
    fn the_container_mount_of_the_hosts_proc_sys_net_is_used_when_present() {
        let dir = tempfile::tempdir().unwrap();
        let root: &'static Path = Box::leak(dir.path().to_path_buf().into_boxed_path());
        assert_eq!(proc_sys_root(root), Path::new("/proc/sys"));
        std::fs::create_dir(root.join("net")).unwrap();
        assert_eq!(proc_sys_root(root), root);
        assert_eq!(
            sysctl_path_in(proc_sys_root(root), "net.vrf.strict_mode"),
            root.join("net/vrf/strict_mode")
        );
    }
}
