//! Installing the CNI plugin on the node: the `lace` binary into the CNI bin dir and the
//! conflist into the CNI conf dir.
//!
//! Both are written durably ([`crate::durable`]: temporary file, fsync, rename), so a
//! runtime never execs half a binary nor parses half a conflist, and a running plugin keeps
//! its old inode. The agent writes them only once it can serve ADD: containerd reports the
//! node's network ready as soon as a conflist exists, so writing it earlier would let the
//! kubelet schedule pods that then fail.
//!
//! The runtime also needs a `loopback` plugin in the bin dir (containerd sets up every
//! sandbox's `lo` through it and fails without it). The `lace` binary serves that plugin too,
//! so where the bin dir has no `loopback`, a copy of `lace` is installed under that name,
//! with [`LOOPBACK_SETTINGS_FILE`] beside it naming the agent's socket. A `loopback` that is
//! not Lace's (the host's reference plugin) is never replaced; Lace's own copy is updated
//! with the binary ([`install_loopback`]).
//!
//! The conflist is **kept** on shutdown: removing it would turn the node NotReady (and stop
//! pod creation) during every agent restart or upgrade, while the plugin already handles an
//! absent agent (ADD: retry later; DEL: queued and replayed at the next start).

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::durable;
use crate::wire::{ConfList, PluginSettings, LOOPBACK_SETTINGS_FILE, LOOPBACK_TYPE, PLUGIN_TYPE};

/// The network name in the conflist (what runtimes log and key their caches by).
pub const NETWORK_NAME: &str = "lace";

/// Why installing failed; names the file.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("installing {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the CNI plugin binary {path} to install it: {source}")]
    Source {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writes what `content` yields to `dir/name` durably ([`crate::durable::write`]) with
/// `mode`, creating `dir`. Streamed: the plugin binary is never held in memory whole.
fn write_atomic(
    dir: &Path,
    name: &str,
    content: &mut dyn std::io::Read,
    mode: u32,
) -> Result<PathBuf, InstallError> {
    fs::create_dir_all(dir).map_err(|source| InstallError::Io {
        path: dir.to_owned(),
        source,
    })?;
    durable::write(dir, name, content, mode).map_err(InstallError::from)
}

impl From<durable::DurableError> for InstallError {
    fn from(e: durable::DurableError) -> Self {
        Self::Io {
            path: e.path,
            source: e.source,
        }
    }
}

/// Copies the plugin binary `source` to `bin_dir/lace` (mode 0755).
pub fn install_binary(source: &Path, bin_dir: &Path) -> Result<PathBuf, InstallError> {
    let mut binary = File::open(source).map_err(|e| InstallError::Source {
        path: source.to_owned(),
        source: e,
    })?;
    write_atomic(bin_dir, PLUGIN_TYPE, &mut binary, 0o755)
}

/// What [`install_loopback`] found in the bin dir and did.
#[derive(Debug, PartialEq, Eq)]
pub enum Loopback {
    /// There was no `loopback`: Lace's copy is installed here.
    Installed(PathBuf),
    /// Lace's copy of an earlier version was here: replaced with this one.
    Updated(PathBuf),
    /// Lace's copy of this version is here already.
    Current(PathBuf),
    /// A `loopback` that is not Lace's (the host's, e.g. the reference plugin): left alone,
    /// and the runtime uses it.
    Host(PathBuf),
}

/// Makes sure the runtime finds a `loopback` plugin in `bin_dir`: installs a copy of the plugin
/// binary `source` as `bin_dir/loopback` (0755) when there is none, with the settings file
/// [`LOOPBACK_SETTINGS_FILE`] (the conflist's `settings`, 0644) beside it, written first.
///
/// An existing `loopback` is Lace's own when its bytes are those of `source` or of the
/// `bin_dir/lace` being replaced (both are always installed together): then it is updated.
/// Anything else is the host's and is never written to. Call this before
/// [`install_binary`] replaces `bin_dir/lace`. A `loopback` that appears between the look and
/// the write is not overwritten either (the copy is linked into place, which fails if the
/// name exists).
pub fn install_loopback(
    source: &Path,
    bin_dir: &Path,
    settings: &PluginSettings,
) -> Result<Loopback, InstallError> {
    let path = bin_dir.join(LOOPBACK_TYPE);
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| InstallError::Io { path, source }
    };
    let source_error = |e| InstallError::Source {
        path: source.to_owned(),
        source: e,
    };
    let ours = match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(&path)(e)),
        Ok(_) => {
            if same_contents(&path, source).map_err(source_error)? {
                Some(Loopback::Current(path.clone()))
            } else if same_contents(&path, &bin_dir.join(PLUGIN_TYPE)).unwrap_or(false) {
                Some(Loopback::Updated(path.clone()))
            } else {
                return Ok(Loopback::Host(path));
            }
        }
    };
    let mut json = serde_json::to_vec_pretty(settings).map_err(|e| InstallError::Io {
        path: bin_dir.join(LOOPBACK_SETTINGS_FILE),
        source: std::io::Error::other(e),
    })?;
    json.push(b'\n');
    write_atomic(bin_dir, LOOPBACK_SETTINGS_FILE, &mut json.as_slice(), 0o644)?;
    let mut binary = File::open(source).map_err(source_error)?;
    match ours {
        Some(Loopback::Current(path)) => Ok(Loopback::Current(path)),
        Some(_) => {
            write_atomic(bin_dir, LOOPBACK_TYPE, &mut binary, 0o755)?;
            Ok(Loopback::Updated(path))
        }
        None => match durable::write_new(bin_dir, LOOPBACK_TYPE, &mut binary, 0o755)? {
            true => Ok(Loopback::Installed(path)),
            false => Ok(Loopback::Host(path)),
        },
    }
}

/// Whether the files at `a` and `b` hold the same bytes. `a` that cannot be read (a dangling
/// symlink) holds nothing of Lace's: `false`; an unreadable `b` is the error.
fn same_contents(a: &Path, b: &Path) -> Result<bool, std::io::Error> {
    use std::io::Read;
    let Ok(mut fa) = File::open(a) else {
        return Ok(false);
    };
    let mut fb = File::open(b)?;
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(fb.read(&mut bb[..1])? == 0);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Writes the conflist pointing the plugin at `settings` to `conf_dir/conf_name` (0644).
pub fn write_conflist(
    conf_dir: &Path,
    conf_name: &str,
    settings: PluginSettings,
) -> Result<PathBuf, InstallError> {
    let list = ConfList::lace(NETWORK_NAME, settings);
    let mut bytes = serde_json::to_vec_pretty(&list).map_err(|e| InstallError::Io {
        path: conf_dir.join(conf_name),
        source: std::io::Error::other(e),
    })?;
    bytes.push(b'\n');
    write_atomic(conf_dir, conf_name, &mut bytes.as_slice(), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::NetConf;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn conflist_is_what_the_plugin_parses() {
        let dir = tempfile::tempdir().unwrap();
        let settings = PluginSettings {
            agent_socket: "/run/lace/x.sock".into(),
            del_queue_dir: "/var/lib/lace/q".into(),
            ..Default::default()
        };
        let path = write_conflist(dir.path(), "10-lace.conflist", settings.clone()).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        // What a runtime does with a conflist: merge name and version into the entry.
        let mut entry = json["plugins"][0].as_object().unwrap().clone();
        entry.insert("cniVersion".into(), json["cniVersion"].clone());
        entry.insert("name".into(), json["name"].clone());
        let conf = NetConf::parse(serde_json::Value::Object(entry).to_string().as_bytes()).unwrap();
        assert_eq!(conf.settings, settings);
        assert_eq!(conf.name, NETWORK_NAME);
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn binary_is_copied_executable_and_replaced_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src-lace");
        fs::write(&src, b"v1").unwrap();
        let bin = dir.path().join("bin");
        let path = install_binary(&src, &bin).unwrap();
        assert_eq!(path, bin.join("lace"));
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o755
        );
        // A process running the old binary keeps its inode.
        let old = File::open(&path).unwrap();
        fs::write(&src, b"v2").unwrap();
        install_binary(&src, &bin).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"v2");
        let mut kept = String::new();
        std::io::Read::read_to_string(&mut &old, &mut kept).unwrap();
        assert_eq!(kept, "v1");
        let missing = install_binary(&dir.path().join("nope"), &bin)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("nope"), "{missing}");
    }

    #[test]
    fn conflist_says_1_0_0_and_lists_every_version_up_to_1_1_0() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_conflist(dir.path(), "10-lace.conflist", Default::default()).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        // libcni 1.1 (containerd 1.6/1.7) uses this and refuses a 1.1.0 result.
        assert_eq!(json["cniVersion"], "1.0.0");
        // libcni 1.2+ (containerd 2.x) picks the highest it knows from these.
        assert_eq!(
            json["cniVersions"],
            serde_json::json!(["0.4.0", "1.0.0", "1.1.0"])
        );
    }

    fn settings() -> PluginSettings {
        PluginSettings {
            agent_socket: "/run/lace/x.sock".into(),
            ..Default::default()
        }
    }

    fn read_settings(bin: &Path) -> PluginSettings {
        PluginSettings::parse(&fs::read(bin.join(LOOPBACK_SETTINGS_FILE)).unwrap()).unwrap()
    }

    #[test]
    fn loopback_is_installed_where_there_is_none_and_kept_current() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let (v1, v2) = (dir.path().join("v1"), dir.path().join("v2"));
        fs::write(&v1, b"lace v1").unwrap();
        fs::write(&v2, b"lace v2").unwrap();
        // First start: nothing there.
        let lo = bin.join("loopback");
        assert_eq!(
            install_loopback(&v1, &bin, &settings()).unwrap(),
            Loopback::Installed(lo.clone())
        );
        install_binary(&v1, &bin).unwrap();
        assert_eq!(fs::read(&lo).unwrap(), b"lace v1");
        assert_eq!(
            fs::metadata(&lo).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert_eq!(read_settings(&bin), settings());
        // A restart of the same version: nothing to replace, settings rewritten.
        fs::remove_file(bin.join(LOOPBACK_SETTINGS_FILE)).unwrap();
        assert_eq!(
            install_loopback(&v1, &bin, &settings()).unwrap(),
            Loopback::Current(lo.clone())
        );
        assert_eq!(read_settings(&bin), settings());
        // An upgrade: the copy is Lace's (the bytes of the `lace` it replaces), so updated.
        assert_eq!(
            install_loopback(&v2, &bin, &settings()).unwrap(),
            Loopback::Updated(lo.clone())
        );
        install_binary(&v2, &bin).unwrap();
        assert_eq!(fs::read(&lo).unwrap(), b"lace v2");
        // Only the binaries and the settings file; no temporary file left behind.
        let mut names: Vec<String> = fs::read_dir(&bin)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["lace", "lace-loopback.json", "loopback"]);
    }

    #[test]
    fn the_hosts_loopback_is_never_touched() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let lace = dir.path().join("lace-src");
        fs::write(&lace, b"lace v1").unwrap();
        fs::create_dir_all(&bin).unwrap();
        let lo = bin.join("loopback");
        fs::write(&lo, b"the reference plugin").unwrap();
        fs::set_permissions(&lo, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(
            install_loopback(&lace, &bin, &settings()).unwrap(),
            Loopback::Host(lo.clone())
        );
        install_binary(&lace, &bin).unwrap();
        // Also when a later start finds it (it differs from `lace` and from the source).
        assert_eq!(
            install_loopback(&lace, &bin, &settings()).unwrap(),
            Loopback::Host(lo.clone())
        );
        assert_eq!(fs::read(&lo).unwrap(), b"the reference plugin");
        assert_eq!(
            fs::metadata(&lo).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert!(!bin.join(LOOPBACK_SETTINGS_FILE).exists());
        // A name taken between the look and the write is not overwritten either.
        fs::remove_file(&lo).unwrap();
        fs::write(&lo, b"raced in").unwrap();
        assert!(!durable::write_new(&bin, "loopback", &mut &b"lace"[..], 0o755).unwrap());
        assert_eq!(fs::read(&lo).unwrap(), b"raced in");
        // A dangling symlink is not Lace's either.
        fs::remove_file(&lo).unwrap();
        std::os::unix::fs::symlink(dir.path().join("gone"), &lo).unwrap();
        assert_eq!(
            install_loopback(&lace, &bin, &settings()).unwrap(),
            Loopback::Host(lo.clone())
        );
        assert!(fs::symlink_metadata(&lo).unwrap().file_type().is_symlink());
    }
}
