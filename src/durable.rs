//! Durable file writes: the one way Lace writes a file that must survive a crash or a power
//! cut whole or not at all (the IPAM store, the DEL queue, the installed plugin and conflist,
//! the allocations of standalone mode).
//!
//! The content goes to a temporary file in the same directory, is fsynced, then renamed (or
//! hard-linked, for [`write_new`]) into place, and the directory is fsynced so the new name
//! itself is on disk. A reader sees the old file or the new one, never half of one. Temporary
//! files are named `.<name>.<pid>.tmp`: hidden, and never matching `*.json` or `*.yaml`, so a
//! directory scan for real files skips them; [`is_leftover`] recognises them after a crash.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A durable write failed: the file or directory it failed on, and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {source}", .path.display())]
pub struct DurableError {
    /// The temporary file, the target or the directory.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> DurableError + '_ {
    move |source| DurableError {
        path: path.to_owned(),
        source,
    }
}

/// The temporary file a write of `dir/name` by process `pid` goes through.
pub fn temp_path(dir: &Path, name: &str, pid: u32) -> PathBuf {
    dir.join(format!(".{name}.{pid}.tmp"))
}

/// Whether `file_name` is a temporary file of a write that never finished (a crash): the
/// caller that owns the directory (and holds its lock) may remove it.
pub fn is_leftover(file_name: &str) -> bool {
    file_name.starts_with('.') && file_name.ends_with(".tmp")
}

/// Writes the temporary file of `dir/name` with `content` and `mode`, fsynced.
fn write_temp(
    dir: &Path,
    name: &str,
    content: &mut dyn Read,
    mode: u32,
) -> Result<PathBuf, DurableError> {
    let tmp = temp_path(dir, name, std::process::id());
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(at(&tmp))?;
    std::io::copy(content, &mut f)
        .and_then(|_| f.sync_all())
        .map_err(at(&tmp))?;
    Ok(tmp)
}

fn sync_dir(dir: &Path) -> Result<(), DurableError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(at(dir))
}

/// Replaces `dir/name` with what `content` yields (streamed, never held whole), created with
/// `mode`. Returns the path written.
pub fn write(
    dir: &Path,
    name: &str,
    content: &mut dyn Read,
    mode: u32,
) -> Result<PathBuf, DurableError> {
    let tmp = write_temp(dir, name, content, mode)?;
    let path = dir.join(name);
    if let Err(e) = fs::rename(&tmp, &path) {
        let _ = fs::remove_file(&tmp);
        return Err(at(&path)(e));
    }
    sync_dir(dir)?;
    Ok(path)
}

/// Creates `dir/name` with what `content` yields, unless that name exists: then nothing is
/// written and the result is `false`. Someone else's file is never replaced, even one created
/// between the check and the write (the temporary file is hard-linked into place).
pub fn write_new(
    dir: &Path,
    name: &str,
    content: &mut dyn Read,
    mode: u32,
) -> Result<bool, DurableError> {
    let tmp = write_temp(dir, name, content, mode)?;
    let path = dir.join(name);
    let linked = fs::hard_link(&tmp, &path);
    fs::remove_file(&tmp).map_err(at(&tmp))?;
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(at(&path)(e)),
    }
    sync_dir(dir)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn write_replaces_the_file_whole_with_its_mode_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.json"), b"old").unwrap();
        let path = write(dir.path(), "a.json", &mut &b"new"[..], 0o600).unwrap();
        assert_eq!(path, dir.path().join("a.json"));
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.json"]);
    }

    #[test]
    fn write_new_never_replaces_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(write_new(dir.path(), "loopback", &mut &b"ours"[..], 0o755).unwrap());
        assert!(!write_new(dir.path(), "loopback", &mut &b"second"[..], 0o755).unwrap());
        assert_eq!(fs::read(dir.path().join("loopback")).unwrap(), b"ours");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_failed_write_names_the_path_and_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.json"), b"old").unwrap();
        // A directory where the file should go: the rename fails.
        fs::create_dir(dir.path().join("b.json")).unwrap();
        fs::write(dir.path().join("b.json").join("x"), b"").unwrap();
        let err = write(dir.path(), "b.json", &mut &b"new"[..], 0o600).unwrap_err();
        assert_eq!(err.path, dir.path().join("b.json"), "{err}");
        assert!(err.to_string().contains("b.json"), "{err}");
        assert_eq!(fs::read(dir.path().join("a.json")).unwrap(), b"old");
        let missing = dir.path().join("no-such-dir");
        let err = write(&missing, "a.json", &mut &b"new"[..], 0o600).unwrap_err();
        assert!(err.path.starts_with(&missing), "{err}");
    }

    #[test]
    fn leftovers_are_the_temporary_files_and_nothing_else() {
        let tmp = temp_path(Path::new("/d"), "store.json", 4242);
        let name = tmp.file_name().unwrap().to_string_lossy();
        assert!(is_leftover(&name));
        for real in [
            "store.json",
            "lace-allocations.yaml",
            "10-lace.conflist",
            "lace",
        ] {
            assert!(!is_leftover(real), "{real}");
        }
        assert!(!name.ends_with(".json") && !name.ends_with(".yaml"));
    }
}
