//! The bpf(2) syscall, wrapped in safe functions for the probe allowance (`crate::probe`).
//!
//! Each wrapper fills the part of `union bpf_attr` that its command reads (a `#[repr(C)]`
//! struct with the uapi field order) and passes that struct's size: the kernel zero-fills the
//! rest of its own copy, which is what every newer, unused field expects. File descriptors the
//! kernel returns are wrapped in [`OwnedFd`] at once, so they are closed on every path.
//!
//! Layouts and numbers are from `include/uapi/linux/bpf.h`; the unit tests below pin the sizes
//! that the kernel's field offsets imply.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `BPF_PROG_TYPE_CGROUP_SOCK`: programs run on socket events of processes in a cgroup.
pub const BPF_PROG_TYPE_CGROUP_SOCK: u32 = 9;
/// `BPF_CGROUP_INET_SOCK_CREATE`: the attach point run when an AF_INET/AF_INET6 socket is
/// created.
pub const BPF_CGROUP_INET_SOCK_CREATE: u32 = 2;
/// `BPF_LINK_TYPE_CGROUP`: the link type of a program attached to a cgroup by
/// `BPF_LINK_CREATE`.
pub const BPF_LINK_TYPE_CGROUP: u32 = 3;
/// `BPF_OBJ_NAME_LEN`: object names are at most 15 bytes plus the terminating NUL.
pub const BPF_OBJ_NAME_LEN: usize = 16;

const BPF_PROG_LOAD: u32 = 5;
const BPF_OBJ_PIN: u32 = 6;
const BPF_OBJ_GET: u32 = 7;
const BPF_PROG_GET_FD_BY_ID: u32 = 13;
const BPF_OBJ_GET_INFO_BY_FD: u32 = 15;
const BPF_LINK_CREATE: u32 = 28;
const BPF_LINK_UPDATE: u32 = 29;
/// `BPF_F_REPLACE`: `BPF_LINK_UPDATE` succeeds only if the link still runs `old_prog_fd`.
const BPF_F_REPLACE: u32 = 1 << 2;
/// Verifier log level 1: the instructions the verifier walked and why it stopped.
const LOG_LEVEL_VERIFIER: u32 = 1;

/// The bpf(2) command that failed, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `BPF_PROG_LOAD`
    ProgLoad,
    /// `BPF_OBJ_PIN`
    ObjPin,
    /// `BPF_OBJ_GET`
    ObjGet,
    /// `BPF_PROG_GET_FD_BY_ID`
    ProgGetFdById,
    /// `BPF_OBJ_GET_INFO_BY_FD`
    ObjGetInfoByFd,
    /// `BPF_LINK_CREATE`
    LinkCreate,
    /// `BPF_LINK_UPDATE`
    LinkUpdate,
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Command::ProgLoad => "BPF_PROG_LOAD",
            Command::ObjPin => "BPF_OBJ_PIN",
            Command::ObjGet => "BPF_OBJ_GET",
            Command::ProgGetFdById => "BPF_PROG_GET_FD_BY_ID",
            Command::ObjGetInfoByFd => "BPF_OBJ_GET_INFO_BY_FD",
            Command::LinkCreate => "BPF_LINK_CREATE",
            Command::LinkUpdate => "BPF_LINK_UPDATE",
        })
    }
}

/// A failed bpf(2) call.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The kernel returned an error.
    #[error("bpf({command}) failed: {source}")]
    Syscall {
        /// The command.
        command: Command,
        /// The errno, as an I/O error.
        #[source]
        source: io::Error,
    },
    /// `BPF_PROG_LOAD` was refused; `log` is the verifier's explanation (may be empty when the
    /// refusal came before verification, e.g. EPERM).
    #[error("bpf(BPF_PROG_LOAD) refused the program: {source}; verifier log: {log}")]
    Rejected {
        /// The errno, as an I/O error.
        #[source]
        source: io::Error,
        /// The verifier log, trimmed.
        log: String,
    },
    /// An argument does not fit the kernel's 32-bit field.
    #[error("bpf({command}): {what} is too large ({len})")]
    TooLarge {
        /// The command.
        command: Command,
        /// Which argument.
        what: &'static str,
        /// Its length.
        len: usize,
    },
}

impl BpfError {
    /// The errno of a kernel error, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            BpfError::Syscall { source, .. } | BpfError::Rejected { source, .. } => {
                source.raw_os_error()
            }
            BpfError::TooLarge { .. } => None,
        }
    }
}

/// The `BPF_PROG_LOAD` part of `union bpf_attr`, up to `expected_attach_type`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; BPF_OBJ_NAME_LEN],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// The `BPF_OBJ_PIN` / `BPF_OBJ_GET` part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// The `BPF_LINK_CREATE` part of `union bpf_attr`, without the per-type union.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
}

/// The `BPF_LINK_UPDATE` part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// The `BPF_OBJ_GET_INFO_BY_FD` part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The `BPF_*_GET_FD_BY_ID` part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct GetByIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// `struct bpf_link_info` up to the cgroup member of its union (which starts at offset 16
/// because the union holds `u64`s).
#[repr(C)]
#[derive(Default)]
struct RawLinkInfo {
    link_type: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    cgroup_id: u64,
    attach_type: u32,
    _pad2: u32,
}

/// `struct bpf_prog_info` up to `name`. The length and pointer fields stay zero: the kernel
/// then copies no instruction dumps.
#[repr(C)]
#[derive(Default)]
struct RawProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; BPF_OBJ_NAME_LEN],
}

/// What the kernel reports about a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    /// `BPF_LINK_TYPE_*`.
    pub link_type: u32,
    /// The link's id, stable for its lifetime.
    pub id: u32,
    /// The id of the program it runs.
    pub prog_id: u32,
    /// For cgroup links: the cgroup's id (its inode number on cgroup2), 0 once the cgroup is
    /// gone.
    pub cgroup_id: u64,
    /// For cgroup links: the attach type.
    pub attach_type: u32,
}

/// What the kernel reports about a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgInfo {
    /// `BPF_PROG_TYPE_*`.
    pub prog_type: u32,
    /// The program's id.
    pub id: u32,
    /// The kernel's hash of the instructions as loaded: equal tags mean equal programs.
    pub tag: [u8; 8],
    /// The name given at load time.
    pub name: String,
}

/// Calls bpf(2) with `attr` as the attribute union.
fn bpf<T>(cmd: u32, attr: &mut T) -> io::Result<i64> {
    let size = std::mem::size_of::<T>();
    // SAFETY: `attr` is a live, exclusively borrowed `#[repr(C)]` struct of `size` bytes that
    // mirrors the start of `union bpf_attr` for `cmd`; the kernel reads (and for some commands
    // writes) at most `size` bytes of it. Pointers stored inside it were set by the callers to
    // buffers that outlive this call, with the lengths stored beside them.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, size) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Calls a bpf(2) command that returns a new file descriptor.
fn bpf_fd<T>(command: Command, cmd: u32, attr: &mut T) -> Result<OwnedFd, BpfError> {
    let fd = bpf(cmd, attr).map_err(|source| BpfError::Syscall { command, source })?;
    let raw = i32::try_from(fd).map_err(|_| BpfError::Syscall {
        command,
        source: io::Error::other(format!("kernel returned an out-of-range fd {fd}")),
    })?;
    // SAFETY: on success these commands return a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The fd number the kernel's attribute structs take.
fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    // A borrowed fd is never negative, so this conversion is lossless.
    fd.as_raw_fd() as u32
}

fn len_u32(command: Command, what: &'static str, len: usize) -> Result<u32, BpfError> {
    u32::try_from(len).map_err(|_| BpfError::TooLarge { command, what, len })
}

/// Loads a program (`BPF_PROG_LOAD`). `insns` are encoded instructions, 8 bytes each;
/// `name` is truncated to 15 bytes. On refusal the load is repeated with the verifier log on,
/// and the log is returned in [`BpfError::Rejected`].
pub fn prog_load(
    prog_type: u32,
    expected_attach_type: u32,
    insns: &[[u8; 8]],
    license: &CStr,
    name: &str,
) -> Result<OwnedFd, BpfError> {
    let command = Command::ProgLoad;
    let mut prog_name = [0u8; BPF_OBJ_NAME_LEN];
    let n = name.len().min(BPF_OBJ_NAME_LEN - 1);
    prog_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    let mut attr = ProgLoadAttr {
        prog_type,
        insn_cnt: len_u32(command, "instruction count", insns.len())?,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name,
        expected_attach_type,
        ..ProgLoadAttr::default()
    };
    // The first attempt runs without a log: a too-small log buffer makes older kernels fail
    // a load that would succeed (ENOSPC).
    let first = match bpf_fd(command, BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    let source = match first {
        BpfError::Syscall { source, .. } => source,
        other => return Err(other),
    };
    // Permission errors come before the verifier: there is no log to fetch.
    if source.raw_os_error() == Some(libc::EPERM) {
        return Err(BpfError::Rejected {
            source,
            log: String::new(),
        });
    }
    let mut log = vec![0u8; 1 << 16];
    attr.log_level = LOG_LEVEL_VERIFIER;
    attr.log_size = len_u32(command, "log buffer", log.len())?;
    attr.log_buf = log.as_mut_ptr() as u64;
    match bpf_fd(command, BPF_PROG_LOAD, &mut attr) {
        // The first failure was transient (e.g. ENOMEM): the program is loaded now.
        Ok(fd) => Ok(fd),
        Err(BpfError::Syscall { source, .. }) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err(BpfError::Rejected {
                source,
                log: String::from_utf8_lossy(&log[..end]).trim().to_string(),
            })
        }
        Err(other) => Err(other),
    }
}

/// Pins a bpf object (`BPF_OBJ_PIN`) at `path` on a bpffs.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &CStr) -> Result<(), BpfError> {
    let command = Command::ObjPin;
    let mut attr = ObjAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: fd_u32(fd),
        file_flags: 0,
    };
    bpf(BPF_OBJ_PIN, &mut attr)
        .map(drop)
        .map_err(|source| BpfError::Syscall { command, source })
}

/// Opens a pinned bpf object (`BPF_OBJ_GET`).
pub fn obj_get(path: &CStr) -> Result<OwnedFd, BpfError> {
    let mut attr = ObjAttr {
        pathname: path.as_ptr() as u64,
        ..ObjAttr::default()
    };
    bpf_fd(Command::ObjGet, BPF_OBJ_GET, &mut attr)
}

/// Opens a loaded program by id (`BPF_PROG_GET_FD_BY_ID`).
pub fn prog_get_fd_by_id(id: u32) -> Result<OwnedFd, BpfError> {
    let mut attr = GetByIdAttr {
        id,
        ..GetByIdAttr::default()
    };
    bpf_fd(Command::ProgGetFdById, BPF_PROG_GET_FD_BY_ID, &mut attr)
}

/// Attaches `prog` to `target` (a cgroup directory fd) as a link (`BPF_LINK_CREATE`). The
/// program stays attached as long as the link has an fd or a pin.
pub fn link_create(
    prog: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    attach_type: u32,
) -> Result<OwnedFd, BpfError> {
    let mut attr = LinkCreateAttr {
        prog_fd: fd_u32(prog),
        target_fd: fd_u32(target),
        attach_type,
        flags: 0,
    };
    bpf_fd(Command::LinkCreate, BPF_LINK_CREATE, &mut attr)
}

/// Swaps the program of a link in place (`BPF_LINK_UPDATE` with `BPF_F_REPLACE`): the
/// kernel replaces `old` by `new` atomically, and refuses (EPERM) if the link no longer runs
/// `old`, so two agents cannot overwrite each other's update unnoticed.
pub fn link_update(
    link: BorrowedFd<'_>,
    new: BorrowedFd<'_>,
    old: BorrowedFd<'_>,
) -> Result<(), BpfError> {
    let command = Command::LinkUpdate;
    let mut attr = LinkUpdateAttr {
        link_fd: fd_u32(link),
        new_prog_fd: fd_u32(new),
        flags: BPF_F_REPLACE,
        old_prog_fd: fd_u32(old),
    };
    bpf(BPF_LINK_UPDATE, &mut attr)
        .map(drop)
        .map_err(|source| BpfError::Syscall { command, source })
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info`.
fn obj_info<T>(fd: BorrowedFd<'_>, info: &mut T) -> Result<(), BpfError> {
    let command = Command::ObjGetInfoByFd;
    let mut attr = InfoAttr {
        bpf_fd: fd_u32(fd),
        info_len: len_u32(command, "info struct", std::mem::size_of::<T>())?,
        info: info as *mut T as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)
        .map(drop)
        .map_err(|source| BpfError::Syscall { command, source })
}

/// What the kernel says about the link `fd`. The caller must know `fd` is a link: the kernel
/// answers with the info of whatever kind of object the fd is.
pub fn link_info(fd: BorrowedFd<'_>) -> Result<LinkInfo, BpfError> {
    let mut raw = RawLinkInfo::default();
    obj_info(fd, &mut raw)?;
    Ok(LinkInfo {
        link_type: raw.link_type,
        id: raw.id,
        prog_id: raw.prog_id,
        cgroup_id: raw.cgroup_id,
        attach_type: raw.attach_type,
    })
}

/// What the kernel says about the program `fd` (which must be a program fd).
pub fn prog_info(fd: BorrowedFd<'_>) -> Result<ProgInfo, BpfError> {
    let mut raw = RawProgInfo::default();
    obj_info(fd, &mut raw)?;
    let end = raw
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(raw.name.len());
    Ok(ProgInfo {
        prog_type: raw.prog_type,
        id: raw.id,
        tag: raw.tag,
        name: String::from_utf8_lossy(&raw.name[..end]).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};
    use std::os::fd::AsFd;

    /// The attribute structs end where the kernel's fields end (offsets from uapi bpf.h, as
    /// `offsetof(union bpf_attr, expected_attach_type) + 4 == 72` etc.).
    #[test]
    fn attribute_layouts_match_uapi() {
        assert_eq!(offset_of!(ProgLoadAttr, log_buf), 32);
        assert_eq!(offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(size_of::<ProgLoadAttr>(), 72);
        assert_eq!(size_of::<ObjAttr>(), 16);
        assert_eq!(size_of::<LinkCreateAttr>(), 16);
        assert_eq!(size_of::<LinkUpdateAttr>(), 16);
        assert_eq!(size_of::<InfoAttr>(), 16);
        assert_eq!(size_of::<GetByIdAttr>(), 12);
        assert_eq!(offset_of!(RawLinkInfo, cgroup_id), 16);
        assert_eq!(offset_of!(RawLinkInfo, attach_type), 24);
        assert_eq!(offset_of!(RawProgInfo, tag), 8);
        assert_eq!(offset_of!(RawProgInfo, created_by_uid), 48);
        assert_eq!(offset_of!(RawProgInfo, name), 64);
    }

    /// Whether this process may not use bpf(2) at all (not root, or a container's seccomp
    /// filter): `BPF_PROG_GET_FD_BY_ID` needs CAP_SYS_ADMIN and, with it, answers ENOENT for
    /// an unused id. Only then is EPERM an acceptable answer to the calls below.
    fn bpf_restricted() -> bool {
        prog_get_fd_by_id(u32::MAX).err().and_then(|e| e.errno()) == Some(libc::EPERM)
    }

    /// The command must be named, and the errno must be the one the argument deserves
    /// (or EPERM where bpf(2) is not allowed, which the kernel checks first).
    fn assert_errno(err: &BpfError, command: Command, expected: i32) {
        assert!(
            matches!(err, BpfError::Syscall { command: c, .. } if *c == command),
            "wrong command in {err}"
        );
        assert!(
            err.to_string()
                .starts_with(&format!("bpf({command}) failed: ")),
            "{err}"
        );
        match err.errno() {
            Some(e) if e == expected => {}
            Some(libc::EPERM) if bpf_restricted() => {}
            other => panic!("{command}: expected errno {expected}, got {other:?}: {err}"),
        }
    }

    fn dev_null() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn obj_get_of_a_missing_path_is_enoent() {
        let err = obj_get(c"/sys/fs/bpf/lace-unit-test/does-not-exist").unwrap_err();
        assert_errno(&err, Command::ObjGet, libc::ENOENT);
    }

    #[test]
    fn obj_get_of_a_file_that_is_not_on_bpffs_is_refused() {
        // A file outside bpffs is not a bpf object: the kernel says EACCES (its inode has no
        // bpf type).
        let err = obj_get(c"/dev/null").unwrap_err();
        assert_errno(&err, Command::ObjGet, libc::EACCES);
    }

    #[test]
    fn info_of_a_non_bpf_fd_is_einval() {
        let fd = dev_null();
        let err = link_info(fd.as_fd()).unwrap_err();
        assert_errno(&err, Command::ObjGetInfoByFd, libc::EINVAL);
        let err = prog_info(fd.as_fd()).unwrap_err();
        assert_errno(&err, Command::ObjGetInfoByFd, libc::EINVAL);
    }

    #[test]
    fn link_calls_with_non_bpf_fds_are_refused() {
        let fd = dev_null();
        let err = link_create(fd.as_fd(), fd.as_fd(), BPF_CGROUP_INET_SOCK_CREATE).unwrap_err();
        assert_errno(&err, Command::LinkCreate, libc::EINVAL);
        let err = link_update(fd.as_fd(), fd.as_fd(), fd.as_fd()).unwrap_err();
        assert_errno(&err, Command::LinkUpdate, libc::EINVAL);
        let err = obj_pin(fd.as_fd(), c"/sys/fs/bpf/lace-unit-test-pin").unwrap_err();
        assert_errno(&err, Command::ObjPin, libc::EINVAL);
    }

    #[test]
    fn prog_get_fd_by_unused_id_is_enoent() {
        // Ids count up from 1; u32::MAX is never reached on a test machine.
        let err = prog_get_fd_by_id(u32::MAX).unwrap_err();
        assert_errno(&err, Command::ProgGetFdById, libc::ENOENT);
    }
}
