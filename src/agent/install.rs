//! Installing the CNI plugin on the node: the `lace` binary into the CNI bin dir and the
//! conflist into the CNI conf dir.
//!
//! Both are written atomically (temporary file in the target directory, fsync, rename), so a
//! runtime never execs half a binary nor parses half a conflist, and a running plugin keeps
//! its old inode. The agent writes them only once it can serve ADD: containerd reports the
//! node's network ready as soon as a conflist exists, so writing it earlier would let the
//! kubelet schedule pods that then fail.
//!
//! The conflist is **kept** on shutdown: removing it would turn the node NotReady (and stop
//! pod creation) during every agent restart or upgrade, while the plugin already handles an
//! absent agent (ADD: retry later; DEL: queued and replayed at the next start).

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::wire::{ConfList, PluginSettings, PLUGIN_TYPE};

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

/// Writes what `content` yields to `dir/name` atomically with `mode`. Streamed: the plugin
/// binary is never held in memory whole.
fn write_atomic(
    dir: &Path,
    name: &str,
    content: &mut dyn std::io::Read,
    mode: u32,
) -> Result<PathBuf, InstallError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| InstallError::Io { path, source }
    };
    fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    std::io::copy(content, &mut f)
        .and_then(|_| f.sync_all())
        .map_err(io(&tmp))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(io(&path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(path)
}

/// Copies the plugin binary `source` to `bin_dir/lace` (mode 0755).
pub fn install_binary(source: &Path, bin_dir: &Path) -> Result<PathBuf, InstallError> {
    let mut binary = File::open(source).map_err(|e| InstallError::Source {
        path: source.to_owned(),
        source: e,
    })?;
    write_atomic(bin_dir, PLUGIN_TYPE, &mut binary, 0o755)
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
}
