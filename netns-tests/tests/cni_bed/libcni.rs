//! What the runtime's CNI library does with a conflist and with a plugin's ADD answer, so the
//! tests see the plugin as containerd does, in both generations of libcni:
//! - [`Libcni::V1_1`]: libcni 1.1.2, in containerd 1.6 and every 1.7. It passes the plugins
//!   the conflist's `cniVersion` (it does not know `cniVersions`), and reads a result only in
//!   a version it has a converter for: 0.1.0 to 1.0.0. A 1.1.0 result fails the ADD with
//!   `plugin type="lace" failed (add): unsupported CNI result version "1.1.0"`.
//! - [`Libcni::V1_2`]: libcni 1.2 and 1.3, in containerd 2.x. It passes the highest version of
//!   `cniVersions` and `cniVersion` that it implements (up to 1.1.0), and reads 0.1.0 to 1.1.0.
//!
//! Both take the result's own `cniVersion` (the configuration's when it has none), convert it
//! to their current type, and go-cni (containerd's wrapper) then maps every address to the
//! interface its index names (an index past the list fails the setup). The harness also
//! requires what the spec asks of a plugin and libcni does not check: the result is in the
//! version it was called with.

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde_json::Value;

/// Which libcni reads the answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Libcni {
    /// libcni 1.1.2: containerd 1.6 and 1.7.
    V1_1,
    /// libcni 1.2+: containerd 2.x.
    V1_2,
}

/// Every spec version, oldest first.
const ALL: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

fn rank(version: &str) -> Option<usize> {
    ALL.iter().position(|v| *v == version)
}

/// One interface of a result as go-cni sees it: its MAC, sandbox and addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Iface {
    pub mac: String,
    pub sandbox: String,
    pub ips: Vec<IpNet>,
}

/// An ADD result as the runtime read it.
#[derive(Clone, Debug)]
pub struct Read {
    /// The version the result was read as.
    pub version: String,
    /// By interface name (addresses without an interface index go to `eth0`, as in go-cni).
    pub interfaces: BTreeMap<String, Iface>,
    /// The plugin's stdout.
    pub raw: Value,
}

impl Libcni {
    /// What the tests call it.
    pub fn name(self) -> &'static str {
        match self {
            Libcni::V1_1 => "libcni 1.1.2 (containerd 1.6/1.7)",
            Libcni::V1_2 => "libcni 1.2+ (containerd 2.x)",
        }
    }

    /// The newest version this libcni implements.
    fn current(self) -> &'static str {
        match self {
            Libcni::V1_1 => "1.0.0",
            Libcni::V1_2 => "1.1.0",
        }
    }

    /// The result versions it has converters for.
    pub fn result_versions(self) -> &'static [&'static str] {
        match self {
            Libcni::V1_1 => &ALL[..6],
            Libcni::V1_2 => &ALL,
        }
    }

    /// The `cniVersion` this libcni hands the plugins of conflist `list`.
    pub fn negotiate(self, list: &Value) -> String {
        let own = list["cniVersion"].as_str().unwrap_or("").to_owned();
        if self == Libcni::V1_1 {
            return own;
        }
        let Some(versions) = list.get("cniVersions").and_then(Value::as_array) else {
            return own;
        };
        let current = rank(self.current()).unwrap();
        versions
            .iter()
            .filter_map(Value::as_str)
            .chain((!own.is_empty()).then_some(own.as_str()))
            .filter_map(|v| Some((rank(v)?, v)))
            .filter(|(r, _)| *r <= current)
            .max()
            .map(|(_, v)| v.to_owned())
            .unwrap_or(own)
    }

    /// Reads the ADD answer `stdout` of the plugin `plugin_type` (the conflist entry's
    /// `type`), called with configuration version `conf_version`, as this libcni and go-cni
    /// do; the error is the one containerd would report.
    pub fn read_add(
        self,
        plugin_type: &str,
        conf_version: &str,
        stdout: &[u8],
    ) -> Result<Read, String> {
        let fail = |why: String| format!("plugin type={plugin_type:?} failed (add): {why}");
        let raw: Value = serde_json::from_slice(stdout)
            .map_err(|e| fail(format!("failed to unmarshal raw result: {e}")))?;
        // fixupResultVersion: the result's own version, else the configuration's.
        let version = match raw.get("cniVersion").and_then(Value::as_str) {
            Some(v) if !v.is_empty() => v.to_owned(),
            _ => conf_version.to_owned(),
        };
        if !self.result_versions().contains(&version.as_str()) {
            return Err(fail(format!("unsupported CNI result version {version:?}")));
        }
        if version != conf_version {
            return Err(fail(format!(
                "result version {version:?} is not the configuration's {conf_version:?} (the \
                 spec requires a plugin to answer in the version it was called with)"
            )));
        }
        let interfaces = if rank(&version) <= rank("0.2.0") {
            legacy(&raw).map_err(fail)?
        } else {
            current(&raw).map_err(fail)?
        };
        Ok(Read {
            version,
            interfaces,
            raw,
        })
    }
}

fn net(v: &Value, what: &str) -> Result<IpNet, String> {
    let s = v
        .as_str()
        .ok_or_else(|| format!("{what} is not a string: {v}"))?;
    s.parse()
        .map_err(|e| format!("{what} {s:?} is not an address/prefix: {e}"))
}

/// 0.1.0 / 0.2.0: `ip4` and `ip6`, no interfaces (go-cni puts them on `eth0`).
fn legacy(raw: &Value) -> Result<BTreeMap<String, Iface>, String> {
    let mut eth0 = Iface::default();
    for key in ["ip4", "ip6"] {
        if let Some(cfg) = raw.get(key) {
            eth0.ips.push(net(&cfg["ip"], &format!("{key}.ip"))?);
        }
    }
    Ok([("eth0".to_owned(), eth0)].into())
}

/// 0.3.0 and newer: interfaces and ips, each ip naming its interface by index.
fn current(raw: &Value) -> Result<BTreeMap<String, Iface>, String> {
    let listed: Vec<&Value> = match raw.get("interfaces") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.iter().collect(),
        Some(other) => return Err(format!("interfaces is not a list: {other}")),
    };
    let mut names = Vec::new();
    let mut out = BTreeMap::new();
    for i in &listed {
        let name = i["name"]
            .as_str()
            .ok_or_else(|| format!("interface without a name: {i}"))?
            .to_owned();
        let text = |k: &str| i.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        out.insert(
            name.clone(),
            Iface {
                mac: text("mac"),
                sandbox: text("sandbox"),
                ips: Vec::new(),
            },
        );
        names.push(name);
    }
    let ips = match raw.get("ips") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(other) => return Err(format!("ips is not a list: {other}")),
    };
    for ip in &ips {
        let address = net(&ip["address"], "ips[].address")?;
        let name = match ip.get("interface").and_then(Value::as_u64) {
            None => "eth0".to_owned(),
            Some(i) => names.get(i as usize).cloned().ok_or_else(|| {
                format!(
                    "invalid interface config: invalid IP configuration (interface number {i} \
                     is > number of interfaces {})",
                    names.len()
                )
            })?,
        };
        out.entry(name).or_default().ips.push(address);
    }
    Ok(out)
}
