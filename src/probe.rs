//! Kubelet probe allowance: a cgroup eBPF program that marks the kubelet's sockets, and nothing
//! else from the host.
//!
//! Networks are isolated from the host as well; only the kubelet must reach local pods (for
//! probes). A `BPF_PROG_TYPE_CGROUP_SOCK` program attached at `BPF_CGROUP_INET_SOCK_CREATE` to
//! the kubelet's cgroup (`node.kubeletCgroupPath`) ORs [`PROBE_MARK`] into the mark of every
//! socket that a process in that cgroup, or in one of its descendants, creates. The planner
//! routes that mark to a table reaching the local pods of every Network (`ip rule fwmark`) and
//! nftables lets it (and replies) through; other host processes never get the mark.
//!
//! The program is attached with `BPF_LINK_CREATE` and the link is pinned under
//! [`DEFAULT_PIN_DIR`], so it stays attached while the agent restarts or is upgraded. On start,
//! [`ensure_attached`] reuses a pinned link that is Lace's and current, swaps the program in
//! place with `BPF_LINK_UPDATE` when the program changed, and replaces the link when the
//! cgroup changed or `node.releasePinnedMaps` asks for fresh objects.
//!
//! What the rest of the node must provide (verified by `netns-tests/tests/probe.rs` in a VM):
//! `ip rule fwmark PROBE_MARK/PROBE_MARK_MASK lookup <probe table>` with a route to each local
//! pod (`<pod ip> dev <host-side veth>`, the veth being a VRF port); nftables accepting host →
//! pod packets carrying the mark; and `net.ipv4.tcp_l3mdev_accept=1`, because the pod's replies
//! arrive through the VRF and the kubelet's socket is bound to no VRF.
//!
//! All functions here are blocking (a few syscalls; [`wait_for_cgroup`] sleeps): call them from
//! a blocking thread in async code.

pub mod insn;

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::statfs::{statfs, FsType, BPF_FS_MAGIC, CGROUP2_SUPER_MAGIC};

use crate::sys::bpf::{self, BpfError, LinkInfo, ProgInfo};
use insn::{Insn, Reg};

// One definition for the program, the fwmark rule and the nft allowance (the planner is pure,
// so it lives there).
pub use crate::plan::{PROBE_MARK, PROBE_MARK_MASK};

/// Where Lace pins its bpf objects (on the bpffs mounted at `/sys/fs/bpf`).
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/lace";

/// The file name of the pinned link inside the pin directory.
pub const LINK_PIN_NAME: &str = "kubelet-probe-link";

/// The program's name in the kernel (at most 15 bytes): how a pinned link is recognised as
/// Lace's, and what `bpftool prog` shows.
pub const PROG_NAME: &str = "lace_kubelet_pr";

/// The license string given to the kernel; the program calls no GPL-only helper.
const LICENSE: &std::ffi::CStr = c"Apache-2.0";

/// `offsetof(struct bpf_sock, mark)` in uapi linux/bpf.h: the fields before it are
/// `bound_dev_if`, `family`, `type`, `protocol`, four `__u32`s.
const BPF_SOCK_MARK_OFFSET: i16 = 16;

/// Longest pause between two looks at a missing cgroup.
const MAX_CGROUP_BACKOFF: Duration = Duration::from_secs(5);

/// A failure to set up the kubelet probe allowance.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The path is not on a cgroup v2 (unified) hierarchy.
    #[error(
        "cgroup v2 is not mounted at {path} (filesystem type {fs_type:#x}); the kubelet probe \
         program needs the unified hierarchy (node.kubeletCgroupPath must be on cgroup2)"
    )]
    CgroupNotV2 {
        /// The path looked at (the configured one, or its nearest existing ancestor).
        path: PathBuf,
        /// The filesystem magic found there.
        fs_type: u64,
    },
    /// The kubelet cgroup does not exist (yet).
    #[error(
        "kubelet cgroup {path} does not exist (node.kubeletCgroupPath; the kubelet may not \
         have started yet)"
    )]
    CgroupMissing {
        /// The configured path.
        path: PathBuf,
    },
    /// The kubelet cgroup did not appear in time.
    #[error("kubelet cgroup {path} still does not exist after waiting {waited:?} (node.kubeletCgroupPath)")]
    CgroupWaitTimedOut {
        /// The configured path.
        path: PathBuf,
        /// How long [`wait_for_cgroup`] waited.
        waited: Duration,
    },
    /// No bpffs where the pins go.
    #[error(
        "bpffs is not mounted at {path} (filesystem type {fs_type:#x}); mount it with \
         `mount -t bpf bpf /sys/fs/bpf` so the kubelet probe link can be pinned"
    )]
    BpffsNotMounted {
        /// The nearest existing ancestor of the pin directory.
        path: PathBuf,
        /// The filesystem magic found there.
        fs_type: u64,
    },
    /// The kernel refused the program; the message carries the verifier log.
    #[error("the kernel refused the kubelet probe program: {0}")]
    ProgramRejected(#[source] BpfError),
    /// Something else is pinned where Lace's link belongs.
    #[error(
        "{path} holds {found}, not Lace's kubelet probe link; remove it or start once with \
         node.releasePinnedMaps=true"
    )]
    PinnedNotLace {
        /// The pin path.
        path: PathBuf,
        /// What is there.
        found: String,
    },
    /// A bpf(2) call failed.
    #[error("{action} {path}: {source}")]
    Bpf {
        /// What was being done.
        action: &'static str,
        /// The object's path (cgroup or pin).
        path: PathBuf,
        /// The syscall error.
        #[source]
        source: BpfError,
    },
    /// A file system operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// The kubelet probe program for `mark`: `*(u32 *)(ctx + mark) |= mark; return 1`.
///
/// OR rather than store, so a mark the socket already carries keeps its other bits; returning
/// 1 lets the socket be created (0 would refuse it).
pub fn program(mark: u32) -> Vec<Insn> {
    vec![
        Insn::load_u32(Reg::R2, Reg::R1, BPF_SOCK_MARK_OFFSET),
        Insn::or32_imm(Reg::R2, mark),
        Insn::store_u32(Reg::R1, BPF_SOCK_MARK_OFFSET, Reg::R2),
        Insn::mov64_imm(Reg::R0, 1),
        Insn::exit(),
    ]
}

/// What [`ensure_attached`] should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    /// The kubelet's cgroup (`node.kubeletCgroupPath`), on cgroup v2.
    pub cgroup: PathBuf,
    /// Where the link is pinned, on bpffs.
    pub pin_dir: PathBuf,
    /// The mark to set.
    pub mark: u32,
    /// `node.releasePinnedMaps`: do not reuse anything pinned; attach afresh, swap the pin,
    /// and remove every other object under `pin_dir`.
    pub release_pinned: bool,
}

impl ProbeConfig {
    /// The defaults for a kubelet cgroup: [`DEFAULT_PIN_DIR`], [`PROBE_MARK`], reuse pins.
    pub fn new(cgroup: impl Into<PathBuf>) -> Self {
        ProbeConfig {
            cgroup: cgroup.into(),
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            mark: PROBE_MARK,
            release_pinned: false,
        }
    }
}

/// How [`ensure_attached`] got to an attached program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was pinned: a new link was created and pinned.
    Created,
    /// The pinned link is Lace's, on the right cgroup, with the same program: kept as is.
    Reused,
    /// The pinned link runs an older program: swapped in place (`BPF_LINK_UPDATE`), same link.
    Updated,
    /// A new link replaced the pinned one (other cgroup, dead cgroup, or release requested).
    Replaced,
}

/// The attached program, as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// What was done.
    pub outcome: Outcome,
    /// The pinned link's id.
    pub link_id: u32,
    /// The id of the program the link runs.
    pub prog_id: u32,
    /// The cgroup's id (inode number on cgroup2).
    pub cgroup_id: u64,
    /// Where the link is pinned.
    pub pin: PathBuf,
}

/// A pinned link that was checked to be Lace's.
struct PinnedLink {
    fd: OwnedFd,
    info: LinkInfo,
    prog_fd: OwnedFd,
    prog: ProgInfo,
}

/// Attaches the probe program to `cfg.cgroup` and pins the link, reusing or updating what an
/// earlier agent pinned (see [`Outcome`]).
pub fn ensure_attached(cfg: &ProbeConfig) -> Result<Attachment, ProbeError> {
    prepare_pin_dir(&cfg.pin_dir)?;
    let (cgroup, cgroup_id) = open_cgroup(&cfg.cgroup)?;
    let prog = bpf::prog_load(
        bpf::BPF_PROG_TYPE_CGROUP_SOCK,
        bpf::BPF_CGROUP_INET_SOCK_CREATE,
        &program(cfg.mark)
            .into_iter()
            .map(Insn::encode)
            .collect::<Vec<_>>(),
        LICENSE,
        PROG_NAME,
    )
    .map_err(ProbeError::ProgramRejected)?;
    let pin = cfg.pin_dir.join(LINK_PIN_NAME);
    let prog_info =
        bpf::prog_info(prog.as_fd()).map_err(bpf_err("inspect the program for", &pin))?;

    let existing = if cfg.release_pinned {
        None
    } else {
        open_pinned(&pin)?
    };
    let attachment = |outcome, link_id| Attachment {
        outcome,
        link_id,
        prog_id: prog_info.id,
        cgroup_id,
        pin: pin.clone(),
    };
    match existing {
        Some(old) if old.info.cgroup_id == cgroup_id && old.prog.tag == prog_info.tag => {
            // `prog` (just loaded to learn its tag) is dropped unused: the kernel frees it.
            tracing::info!(link_id = old.info.id, prog_id = old.prog.id, pin = %pin.display(),
                "kubelet probe link is current, reusing it");
            Ok(Attachment {
                prog_id: old.prog.id,
                ..attachment(Outcome::Reused, old.info.id)
            })
        }
        Some(old) if old.info.cgroup_id == cgroup_id => {
            bpf::link_update(old.fd.as_fd(), prog.as_fd(), old.prog_fd.as_fd())
                .map_err(bpf_err("swap the program of", &pin))?;
            tracing::info!(link_id = old.info.id, old_prog_id = old.prog.id, prog_id = prog_info.id,
                pin = %pin.display(), "kubelet probe program changed, swapped it in place");
            Ok(attachment(Outcome::Updated, old.info.id))
        }
        None if !cfg.release_pinned => {
            let link = bpf::link_create(
                prog.as_fd(),
                cgroup.as_fd(),
                bpf::BPF_CGROUP_INET_SOCK_CREATE,
            )
            .map_err(bpf_err("attach the kubelet probe program to", &cfg.cgroup))?;
            bpf::obj_pin(link.as_fd(), &c_path(&pin)?).map_err(bpf_err("pin", &pin))?;
            let info = bpf::link_info(link.as_fd()).map_err(bpf_err("inspect the link", &pin))?;
            tracing::info!(link_id = info.id, prog_id = prog_info.id, cgroup = %cfg.cgroup.display(),
                pin = %pin.display(), "kubelet probe program attached and pinned");
            Ok(attachment(Outcome::Created, info.id))
        }
        old => {
            let link_id = replace_link(&prog, &cgroup, cfg, &pin)?;
            match &old {
                Some(old) => tracing::info!(old_link_id = old.info.id, link_id,
                    cgroup = %cfg.cgroup.display(), "kubelet cgroup changed (or is gone), replaced the pinned link"),
                None => tracing::info!(link_id, pin = %pin.display(),
                    "node.releasePinnedMaps: attached a fresh kubelet probe link in place of any pinned one"),
            }
            if cfg.release_pinned {
                for removed in release_except(&cfg.pin_dir, Some(&pin))? {
                    tracing::info!(path = %removed.display(), "node.releasePinnedMaps: removed pinned object");
                }
            }
            Ok(attachment(Outcome::Replaced, link_id))
        }
    }
}

/// Creates a new link and moves its pin over `pin` in one rename, so the old link (released
/// when its pin goes) and the new one overlap instead of leaving a gap; both set the same bit.
fn replace_link(
    prog: &OwnedFd,
    cgroup: &File,
    cfg: &ProbeConfig,
    pin: &Path,
) -> Result<u32, ProbeError> {
    let link = bpf::link_create(
        prog.as_fd(),
        cgroup.as_fd(),
        bpf::BPF_CGROUP_INET_SOCK_CREATE,
    )
    .map_err(bpf_err("attach the kubelet probe program to", &cfg.cgroup))?;
    // bpffs refuses names with a dot (EPERM): they are reserved for its own entries.
    let mut tmp = pin.as_os_str().to_owned();
    tmp.push("-new");
    let tmp = PathBuf::from(tmp);
    remove_if_present(&tmp)?;
    bpf::obj_pin(link.as_fd(), &c_path(&tmp)?).map_err(bpf_err("pin", &tmp))?;
    std::fs::rename(&tmp, pin).map_err(io_err("move the new pin over", pin))?;
    Ok(bpf::link_info(link.as_fd())
        .map_err(bpf_err("inspect the link", pin))?
        .id)
}

/// Removes every object pinned under `pin_dir` (`node.releasePinnedMaps`, uninstall) and
/// returns their paths. Removing the link's pin detaches the program once no process holds
/// the link open. A missing directory is nothing to release.
pub fn release_pinned(pin_dir: &Path) -> Result<Vec<PathBuf>, ProbeError> {
    release_except(pin_dir, None)
}

fn release_except(pin_dir: &Path, keep: Option<&Path>) -> Result<Vec<PathBuf>, ProbeError> {
    let entries = match std::fs::read_dir(pin_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list pinned objects in", pin_dir)(e)),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(io_err("list pinned objects in", pin_dir))?
            .path();
        if Some(path.as_path()) == keep {
            continue;
        }
        if path.is_dir() {
            std::fs::remove_dir_all(&path).map_err(io_err("remove pinned objects in", &path))?;
        } else {
            std::fs::remove_file(&path).map_err(io_err("remove pinned object", &path))?;
        }
        removed.push(path);
    }
    removed.sort();
    Ok(removed)
}

/// The link pinned in `pin_dir`, if there is one and it is Lace's (for inspection and tests).
pub fn pinned_link(pin_dir: &Path) -> Result<Option<LinkInfo>, ProbeError> {
    Ok(open_pinned(&pin_dir.join(LINK_PIN_NAME))?.map(|p| p.info))
}

/// Waits until `path` exists as a cgroup v2 directory, looking again after 100 ms, 200 ms, …
/// up to 5 s apart, for at most `timeout`. Other errors (not cgroup v2, I/O) return at once.
pub fn wait_for_cgroup(path: &Path, timeout: Duration) -> Result<(), ProbeError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match open_cgroup(path) {
            Ok(_) => return Ok(()),
            Err(ProbeError::CgroupMissing { .. }) => {}
            Err(e) => return Err(e),
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(ProbeError::CgroupWaitTimedOut {
                path: path.to_path_buf(),
                waited,
            });
        }
        tracing::debug!(path = %path.display(), "kubelet cgroup does not exist yet, waiting");
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(MAX_CGROUP_BACKOFF);
    }
}

/// Opens the cgroup directory and returns it with the cgroup's id.
fn open_cgroup(path: &Path) -> Result<(File, u64), ProbeError> {
    match statfs(path) {
        Ok(st) if st.filesystem_type() == CGROUP2_SUPER_MAGIC => {}
        Ok(st) => {
            return Err(ProbeError::CgroupNotV2 {
                path: path.to_path_buf(),
                fs_type: magic(st.filesystem_type()),
            })
        }
        Err(nix::errno::Errno::ENOENT) => {
            // Missing is worth waiting for only if it would be created on cgroup2.
            let (ancestor, fs_type) = nearest_existing_fs(path)?;
            return Err(if fs_type == magic(CGROUP2_SUPER_MAGIC) {
                ProbeError::CgroupMissing {
                    path: path.to_path_buf(),
                }
            } else {
                ProbeError::CgroupNotV2 {
                    path: ancestor,
                    fs_type,
                }
            });
        }
        Err(e) => return Err(io_err("inspect cgroup", path)(e.into())),
    }
    let dir = File::open(path).map_err(io_err("open cgroup", path))?;
    let meta = dir.metadata().map_err(io_err("inspect cgroup", path))?;
    if !meta.is_dir() {
        return Err(io_err("open cgroup", path)(io::Error::from(
            io::ErrorKind::NotADirectory,
        )));
    }
    // On cgroup2 the directory's inode number is the cgroup id the kernel reports for links.
    Ok((dir, meta.ino()))
}

/// Checks that the pin directory is (or will be) on bpffs and creates it.
fn prepare_pin_dir(pin_dir: &Path) -> Result<(), ProbeError> {
    let (at, fs_type) = nearest_existing_fs(pin_dir)?;
    if fs_type != magic(BPF_FS_MAGIC) {
        return Err(ProbeError::BpffsNotMounted { path: at, fs_type });
    }
    std::fs::create_dir_all(pin_dir).map_err(io_err("create pin directory", pin_dir))
}

/// The nearest existing path among `path` and its ancestors, with its filesystem magic.
fn nearest_existing_fs(path: &Path) -> Result<(PathBuf, u64), ProbeError> {
    for candidate in path.ancestors() {
        // A relative path ends in "": look at the working directory.
        let candidate = if candidate.as_os_str().is_empty() {
            Path::new(".")
        } else {
            candidate
        };
        match statfs(candidate) {
            Ok(st) => return Ok((candidate.to_path_buf(), magic(st.filesystem_type()))),
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(e) => return Err(io_err("inspect", candidate)(e.into())),
        }
    }
    Err(io_err("inspect", path)(io::ErrorKind::NotFound.into()))
}

/// Opens what is pinned at `pin` and checks that it is Lace's kubelet probe link: a cgroup
/// link at `BPF_CGROUP_INET_SOCK_CREATE` running a cgroup-sock program named [`PROG_NAME`].
fn open_pinned(pin: &Path) -> Result<Option<PinnedLink>, ProbeError> {
    let fd = match bpf::obj_get(&c_path(pin)?) {
        Ok(fd) => fd,
        Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(bpf_err("open pinned object", pin)(e)),
    };
    // The info call answers for whatever kind of object the fd is; fdinfo tells which kind.
    let kind = bpf_object_kind(&fd).map_err(io_err("inspect pinned object", pin))?;
    if kind != "link" {
        return Err(ProbeError::PinnedNotLace {
            path: pin.to_path_buf(),
            found: format!("a bpf {kind}"),
        });
    }
    let info = bpf::link_info(fd.as_fd()).map_err(bpf_err("inspect pinned link", pin))?;
    if info.link_type != bpf::BPF_LINK_TYPE_CGROUP
        || info.attach_type != bpf::BPF_CGROUP_INET_SOCK_CREATE
    {
        return Err(ProbeError::PinnedNotLace {
            path: pin.to_path_buf(),
            found: format!(
                "a link of type {} with attach type {}",
                info.link_type, info.attach_type
            ),
        });
    }
    let prog_fd =
        bpf::prog_get_fd_by_id(info.prog_id).map_err(bpf_err("open the program of", pin))?;
    let prog = bpf::prog_info(prog_fd.as_fd()).map_err(bpf_err("inspect the program of", pin))?;
    if prog.name != PROG_NAME || prog.prog_type != bpf::BPF_PROG_TYPE_CGROUP_SOCK {
        return Err(ProbeError::PinnedNotLace {
            path: pin.to_path_buf(),
            found: format!(
                "a link running program {:?} of type {}",
                prog.name, prog.prog_type
            ),
        });
    }
    Ok(Some(PinnedLink {
        fd,
        info,
        prog_fd,
        prog,
    }))
}

/// "link", "prog" or "map", from the kernel's `/proc/self/fdinfo` lines for bpf objects.
fn bpf_object_kind(fd: &OwnedFd) -> io::Result<&'static str> {
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    Ok(fdinfo
        .lines()
        .find_map(|line| match line.split(':').next() {
            Some("link_type") => Some("link"),
            Some("prog_type") => Some("prog"),
            Some("map_type") => Some("map"),
            _ => None,
        })
        .unwrap_or("object of unknown kind"))
}

fn remove_if_present(path: &Path) -> Result<(), ProbeError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", path)(e)),
        _ => Ok(()),
    }
}

/// A filesystem magic number as `statfs(2)` reports it (the C type differs by platform).
fn magic(fs_type: FsType) -> u64 {
    fs_type.0 as u64
}

fn c_path(path: &Path) -> Result<CString, ProbeError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| ProbeError::Io {
        action: "use path",
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"),
    })
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ProbeError + 'a {
    move |source| ProbeError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn bpf_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(BpfError) -> ProbeError + 'a {
    move |source| ProbeError::Bpf {
        action,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_avoids_bits_other_components_use() {
        // kube-proxy, Calico's mask, Cilium's magic nibble, Weave, Antrea, AWS VPC CNI, Istio,
        // wg-quick: see PROBE_MARK's documentation.
        for used in [
            0x4000u32,
            0x8000,
            0xffff_0000,
            0x0f00,
            0x20000,
            0x40000,
            0x8000_0000,
            0xff,
            0x80,
            0x220,
            0x210,
            0x539,
            0xca6c,
        ] {
            assert_eq!(PROBE_MARK & used, 0, "PROBE_MARK overlaps {used:#x}");
        }
        assert_eq!(PROBE_MARK.count_ones(), 1);
        assert_eq!(PROBE_MARK & PROBE_MARK_MASK, PROBE_MARK);
    }

    #[test]
    fn program_ors_the_mark_into_bpf_sock_mark_and_allows() {
        let bytes: Vec<[u8; 8]> = program(0x1000).into_iter().map(Insn::encode).collect();
        let expected: [[u8; 8]; 5] = [
            [0x61, 0x12, 16, 0, 0, 0, 0, 0],      // r2 = *(u32 *)(r1 + 16)
            [0x44, 0x02, 0, 0, 0x00, 0x10, 0, 0], // w2 |= 0x1000
            [0x63, 0x21, 16, 0, 0, 0, 0, 0],      // *(u32 *)(r1 + 16) = r2
            [0xb7, 0x00, 0, 0, 1, 0, 0, 0],       // r0 = 1
            [0x95, 0x00, 0, 0, 0, 0, 0, 0],       // exit
        ];
        if cfg!(target_endian = "little") {
            assert_eq!(bytes, expected);
        }
        // A different mark changes exactly the immediate of the OR.
        let other: Vec<[u8; 8]> = program(0x2000).into_iter().map(Insn::encode).collect();
        let diff: Vec<usize> = (0..5).filter(|&i| bytes[i] != other[i]).collect();
        assert_eq!(diff, vec![1]);
    }

    #[test]
    fn prog_name_fits_the_kernel_limit() {
        assert!(PROG_NAME.len() < bpf::BPF_OBJ_NAME_LEN);
        assert!(PROG_NAME
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    }

    #[test]
    fn missing_cgroup_on_a_non_cgroup2_fs_is_not_waited_for() {
        // /tmp is not cgroup2: a missing directory under it could never be a cgroup.
        let path = Path::new("/tmp/lace-probe-unit-test-no-such-cgroup");
        let start = Instant::now();
        let err = wait_for_cgroup(path, Duration::from_secs(30)).unwrap_err();
        assert!(matches!(err, ProbeError::CgroupNotV2 { .. }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5), "it waited");
        assert!(err.to_string().contains("/tmp"), "{err}");
    }

    #[test]
    fn existing_non_cgroup_dir_is_not_v2() {
        let err = open_cgroup(Path::new("/tmp")).unwrap_err();
        match err {
            ProbeError::CgroupNotV2 { path, fs_type } => {
                assert_eq!(path, Path::new("/tmp"));
                assert_ne!(fs_type, magic(CGROUP2_SUPER_MAGIC));
            }
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn pin_dir_outside_bpffs_is_reported() {
        let dir = std::env::temp_dir().join("lace-probe-unit-pins");
        let err = ensure_attached(&ProbeConfig {
            pin_dir: dir.clone(),
            ..ProbeConfig::new("/tmp")
        })
        .unwrap_err();
        assert!(matches!(err, ProbeError::BpffsNotMounted { .. }), "{err}");
        assert!(err.to_string().contains("mount -t bpf"), "{err}");
        assert!(!dir.exists(), "created a pin directory outside bpffs");
    }

    #[test]
    fn release_of_a_missing_pin_dir_is_empty() {
        let removed = release_pinned(Path::new("/tmp/lace-probe-unit-no-pins")).unwrap();
        assert!(removed.is_empty());
    }

    #[test]
    fn release_removes_everything_but_the_kept_path() {
        let dir =
            std::env::temp_dir().join(format!("lace-probe-unit-release-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for f in ["a", "keep", "sub/b"] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let removed = release_except(&dir, Some(&dir.join("keep"))).unwrap();
        assert_eq!(removed, vec![dir.join("a"), dir.join("sub")]);
        assert!(dir.join("keep").exists());
        assert!(!dir.join("a").exists() && !dir.join("sub").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fdinfo_tells_a_non_bpf_fd_apart() {
        let fd: OwnedFd = File::open("/dev/null").unwrap().into();
        assert_eq!(bpf_object_kind(&fd).unwrap(), "object of unknown kind");
    }
}
