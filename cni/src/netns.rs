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

fn read_link(path: &Path, link: String) -> Result<String, NetnsError> {
    std::fs::read_link(&link)
        .map(|target| target.to_string_lossy().into_owned())
        .map_err(|source| NetnsError::Verify {
            path: path.to_owned(),
            link,
            source,
        })
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
    let target = read_link(path, format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let Some(kind) = namespace_kind(&target) else {
        return Err(NetnsError::NotNamespace(path.to_owned()));
    };
    if kind != "net" {
        return Err(NetnsError::WrongKind {
            path: path.to_owned(),
            kind: kind.to_owned(),
        });
    }
    if target == read_link(path, "/proc/self/ns/net".to_owned())? {
        return Err(NetnsError::HostNamespace(path.to_owned()));
    }
    Ok(())
}

/// `net` for `net:[4026531833]`; `None` for anything not of the form `kind:[digits]` (a
/// path, which is what an ordinary file's fd link reads).
fn namespace_kind(link: &str) -> Option<&str> {
    let (kind, rest) = link.split_once(":[")?;
    let inode = rest.strip_suffix(']')?;
    let valid = !kind.is_empty()
        && kind.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        && !inode.is_empty()
        && inode.chars().all(|c| c.is_ascii_digit());
    valid.then_some(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_kind_parses_proc_links() {
        assert_eq!(namespace_kind("net:[4026531833]"), Some("net"));
        assert_eq!(
            namespace_kind("pid_for_children:[4026531836]"),
            Some("pid_for_children")
        );
        assert_eq!(namespace_kind("/run/netns/x"), None);
        assert_eq!(namespace_kind("/tmp/net:[1]"), None);
        assert_eq!(namespace_kind("net:[]"), None);
        assert_eq!(namespace_kind("socket:[12x]"), None);
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
