//! Is `CNI_NETNS` really a network namespace?
//!
//! A namespace file (a bind mount under `/run/netns`, or `/proc/<pid>/ns/net`) is a regular
//! file on nsfs. Opening it and reading the link `/proc/self/fd/<fd>` gives `net:[<inode>]`
//! for a network namespace, `mnt:[...]`, `uts:[...]`... for other kinds, and the file's own
//! path for anything that is not a namespace. That answers both questions (is it nsfs, is it
//! a network namespace) without `unsafe` ioctls.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lace::wire::{CniError, ErrorCode};

/// Why `CNI_NETNS` is not a usable network namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Nothing at the path.
    #[error("CNI_NETNS={0} does not exist")]
    NotFound(PathBuf),
    /// The path cannot be examined.
    #[error("CNI_NETNS={path}: {source}")]
    Inaccessible {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Something other than a file (a directory, a FIFO...).
    #[error("CNI_NETNS={path} is not a network namespace: it is a {kind}")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// A file, but not on nsfs.
    #[error("CNI_NETNS={0} is not a network namespace: it is an ordinary file, not a namespace (nsfs) file")]
    NotNamespace(PathBuf),
    /// A namespace of another kind.
    #[error("CNI_NETNS={path} is a {kind} namespace, not a network namespace")]
    WrongKind {
        /// The path.
        path: PathBuf,
        /// The namespace kind (`mnt`, `pid`...).
        kind: String,
    },
    /// The host's own network namespace: attaching a pod there would rewire the node.
    #[error("CNI_NETNS={0} is the host's own network namespace, not a pod's")]
    HostNamespace(PathBuf),
    /// `/proc` cannot tell us what the file is.
    #[error("cannot verify CNI_NETNS={path}: reading {link}: {source}")]
    Verify {
        /// The path.
        path: PathBuf,
        /// The `/proc` link read.
        link: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl From<NetnsError> for CniError {
    fn from(e: NetnsError) -> Self {
        let code = match e {
            NetnsError::Verify { .. } => ErrorCode::IO,
            _ => ErrorCode::INVALID_ENVIRONMENT,
        };
        CniError::new(code, e.to_string())
    }
}

fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

fn read_proc(
    path: &Path,
    link: String,
    read: fn(&str) -> io::Result<String>,
) -> Result<String, NetnsError> {
    read(&link).map_err(|source| NetnsError::Verify {
        path: path.to_owned(),
        link,
        source,
    })
}

fn readlink(p: &str) -> io::Result<String> {
    std::fs::read_link(p).map(|target| target.to_string_lossy().into_owned())
}

/// Checks that `path` is a network namespace other than the host's.
pub fn check(path: &Path) -> Result<(), NetnsError> {
    let meta = std::fs::metadata(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => NetnsError::NotFound(path.to_owned()),
        _ => NetnsError::Inaccessible {
            path: path.to_owned(),
            source,
        },
    })?;
    // nsfs files are regular files; checking first also keeps us from blocking on a FIFO.
    if !meta.is_file() {
        return Err(NetnsError::NotAFile {
            path: path.to_owned(),
            kind: kind_of(&meta),
        });
    }
    let file = File::open(path).map_err(|source| NetnsError::Inaccessible {
        path: path.to_owned(),
        source,
    })?;
    let fd = file.as_raw_fd();
    let target = read_proc(path, format!("/proc/self/fd/{fd}"), readlink)?;
    let kind = match namespace_kind(&target) {
        // Opened through nsfs's own mount (`/proc/<pid>/ns/net`): the link names the kind.
        Some((kind, _)) => kind.to_owned(),
        // Opened through a bind mount (`/run/netns/<name>`): the link is the mount point, and
        // the mount's root in mountinfo names the namespace, if the mount is nsfs at all.
        None => {
            let fdinfo = read_proc(path, format!("/proc/self/fdinfo/{fd}"), |p| {
                std::fs::read_to_string(p)
            })?;
            let mountinfo = read_proc(path, "/proc/self/mountinfo".to_owned(), |p| {
                std::fs::read_to_string(p)
            })?;
            mount_id(&fdinfo)
                .and_then(|id| nsfs_root(&mountinfo, id))
                .and_then(namespace_kind)
                .filter(|(_, inode)| *inode == meta.ino())
                .map(|(kind, _)| kind.to_owned())
                .ok_or_else(|| NetnsError::NotNamespace(path.to_owned()))?
        }
    };
    if kind != "net" {
        return Err(NetnsError::WrongKind {
            path: path.to_owned(),
            kind,
        });
    }
    let host = std::fs::metadata("/proc/self/ns/net").map_err(|source| NetnsError::Verify {
        path: path.to_owned(),
        link: "/proc/self/ns/net".to_owned(),
        source,
    })?;
    if (host.dev(), host.ino()) == (meta.dev(), meta.ino()) {
        return Err(NetnsError::HostNamespace(path.to_owned()));
    }
    Ok(())
}

/// `("net", 4026531833)` for `net:[4026531833]`; `None` for anything not of the form
/// `kind:[inode]` (a path, which is what an ordinary file's fd link reads).
fn namespace_kind(link: &str) -> Option<(&str, u64)> {
    let (kind, rest) = link.split_once(":[")?;
    let inode = rest.strip_suffix(']')?.parse().ok()?;
    let valid = !kind.is_empty() && kind.chars().all(|c| c.is_ascii_lowercase() || c == '_');
    valid.then_some((kind, inode))
}

/// The `mnt_id:` line of `/proc/self/fdinfo/<fd>`.
fn mount_id(fdinfo: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The root (4th field) of mount `id` in mountinfo, if that mount is nsfs. Line format:
/// `id parent major:minor root mountpoint options [optional...] - fstype source superoptions`.
fn nsfs_root(mountinfo: &str, id: u64) -> Option<&str> {
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        if fields.next()?.parse::<u64>().ok()? != id {
            return None;
        }
        let root = fields.nth(2)?;
        let fstype = line.split(" - ").nth(1)?.split(' ').next()?;
        (fstype == "nsfs").then_some(root)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_kind_parses_proc_links() {
        assert_eq!(
            namespace_kind("net:[4026531833]"),
            Some(("net", 4026531833))
        );
        assert_eq!(
            namespace_kind("pid_for_children:[4026531836]"),
            Some(("pid_for_children", 4026531836))
        );
        assert_eq!(namespace_kind("/run/netns/x"), None);
        assert_eq!(namespace_kind("/tmp/net:[1]"), None);
        assert_eq!(namespace_kind("net:[]"), None);
        assert_eq!(namespace_kind("socket:[12x]"), None);
    }

    #[test]
    fn mountinfo_lookup() {
        let mountinfo = "22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n\
                         634 29 0:4 net:[4026532281] /run/netns/a rw shared:300 - nsfs nsfs rw\n\
                         635 29 0:4 / /run/other\\040dir rw - tmpfs tmpfs rw\n";
        assert_eq!(nsfs_root(mountinfo, 634), Some("net:[4026532281]"));
        assert_eq!(nsfs_root(mountinfo, 635), None, "not nsfs");
        assert_eq!(nsfs_root(mountinfo, 22), None);
        assert_eq!(
            nsfs_root(mountinfo, 63),
            None,
            "ids match exactly, not by prefix"
        );
        assert_eq!(
            mount_id("pos:\t0\nflags:\t02100000\nmnt_id:\t634\nino:\t4026532281\n"),
            Some(634)
        );
    }

    #[test]
    fn proc_namespace_files_are_classified() {
        // The test process's own namespaces: the host's netns must be refused, a mount
        // namespace is the wrong kind, a directory and a regular file are not namespaces.
        assert!(matches!(
            check(Path::new("/proc/self/ns/net")),
            Err(NetnsError::HostNamespace(_))
        ));
        assert!(matches!(
            check(Path::new("/proc/self/ns/mnt")),
            Err(NetnsError::WrongKind { ref kind, .. }) if kind == "mnt"
        ));
        assert!(matches!(
            check(Path::new("/proc")),
            Err(NetnsError::NotAFile {
                kind: "directory",
                ..
            })
        ));
        assert!(matches!(
            check(Path::new("/proc/self/status")),
            Err(NetnsError::NotNamespace(_))
        ));
        assert!(matches!(
            check(Path::new("/nonexistent/netns")),
            Err(NetnsError::NotFound(_))
        ));
    }
}
