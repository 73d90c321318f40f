//! The test bed of the CNI netns tests and the CNI latency benchmark: a "node" network
//! namespace with an uplink, a copy of `examples/cluster`, a running `lace-agent run` and
//! helpers that exec the installed plugins exactly as containerd does: the `loopback` network
//! first (the agent's copy, with go-cni's fixed configuration), then Lace's from the conflist
//! the agent wrote, each ADD answer read as the runtime's libcni reads it ([`libcni`]: the
//! bed's `runtime`, libcni 1.2+ unless a test picks 1.1.2).
// Shared by `tests/cni.rs`, `tests/bandwidth.rs`, `tests/probe.rs`, `tests/containerd.rs`,
// `tests/ipv6_off.rs` and `benches/cni_latency.rs`; each uses a subset.
#![allow(dead_code)]

pub mod libcni;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::mem::ManuallyDrop;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::statfs::FsType;
use serde_json::{json, Value};

pub use libcni::Libcni;

/// The loopback network containerd (go-cni) sets up in every sandbox, before its own.
pub const LOOPBACK_CONFLIST: &str =
    r#"{"cniVersion": "0.3.1", "name": "cni-loopback", "plugins": [{"type": "loopback"}]}"#;

/// How long the tests wait for something the agent or the kernel must do (start, become
/// ready, install a route) before they fail: generous, since only a failure waits that long,
/// and an agent start took over 60 s in the VM on the 2-core CI machine at load 11.
pub const DEADLINE: Duration = Duration::from_secs(180);
/// How long the agent's metrics listener may take to answer one request.
const HTTP_TIMEOUT: Duration = Duration::from_secs(60);

pub const NODE: &str = "node-1";
pub const VRF: &str = "lv-default";
pub const TABLE: &str = "1000001";

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// `lace` or `lace-agent` from `$LACE_BIN_DIR` (default: the workspace's `target/debug`).
/// Where that is a 9p mount (the netns VM's view of the host), the binary is copied once per
/// process to the temporary directory (tmpfs) and used from there: 9p pages a binary in
/// several times slower, and the agent copies the plugin from its source at every start.
pub fn binary(name: &str) -> PathBuf {
    static STAGED: OnceLock<Mutex<BTreeMap<String, PathBuf>>> = OnceLock::new();
    let dir = std::env::var_os("LACE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/debug"));
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p lace -p lace-cni` first",
        p.display()
    );
    const V9FS_MAGIC: FsType = FsType(0x0102_1997);
    if nix::sys::statfs::statfs(&p).map(|s| s.filesystem_type()) != Ok(V9FS_MAGIC) {
        return p;
    }
    let mut staged = STAGED.get_or_init(Default::default).lock().unwrap();
    staged
        .entry(name.to_owned())
        .or_insert_with(|| {
            let dir = std::env::temp_dir().join(format!("lace-bin-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let copy = dir.join(name);
            std::fs::copy(&p, &copy)
                .unwrap_or_else(|e| panic!("copy {} to {}: {e}", p.display(), copy.display()));
            copy
        })
        .clone()
}

pub fn require_root_and_vrf() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap();
    assert_eq!(uid, "0", "the CNI netns tests must run as root");
}

pub fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn ip_ok(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A named network namespace, deleted on drop.
pub struct Ns(pub String);

impl Ns {
    pub fn new(name: String) -> Self {
        let ns = Ns::bare(name);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        ns
    }
    /// A namespace as the runtime creates a sandbox's: `lo` down.
    pub fn bare(name: String) -> Self {
        let _ = ip_ok(&["netns", "del", &name]);
        ip(&["netns", "add", &name]);
        Ns(name)
    }
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }
}

impl Ns {
    /// The name, the namespace left in place (something else deletes it).
    fn disarm(self) -> String {
        std::mem::take(&mut ManuallyDrop::new(self).0)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = ip_ok(&["netns", "del", &self.0]);
    }
}

/// `count` pod namespaces `<prefix><i>`, made with one `ip -batch` and deleted the same way
/// when dropped: an `ip` exec per namespace costs ~0.4 s under emulation, minutes for a storm
/// of pods. Their loopback starts down, as in a runtime's new sandbox ([`Bed::add`] brings it
/// up through the loopback plugin).
pub struct PodNamespaces(Vec<Ns>);

impl PodNamespaces {
    pub fn new(prefix: &str, count: usize) -> Self {
        let names: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
        // Leftovers of an earlier, killed run would make `netns add` fail.
        ip_batch(names.iter().map(|n| format!("netns del {n}")), false);
        ip_batch(names.iter().map(|n| format!("netns add {n}")), true);
        PodNamespaces(names.into_iter().map(Ns).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Ns> {
        self.0.iter()
    }
}

impl std::ops::Index<usize> for PodNamespaces {
    type Output = Ns;
    fn index(&self, i: usize) -> &Ns {
        &self.0[i]
    }
}

impl Drop for PodNamespaces {
    fn drop(&mut self) {
        let names: Vec<String> = self.0.drain(..).map(Ns::disarm).collect();
        ip_batch(names.iter().map(|n| format!("netns del {n}")), false);
    }
}

/// `ip -force -batch -` with these commands (`-force`: every line runs even after a failure);
/// panics on failure if `must`.
fn ip_batch(commands: impl Iterator<Item = String>, must: bool) {
    let mut child = Command::new("ip")
        .args(["-force", "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(if must {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .expect("ip");
    let script: String = commands.map(|c| c + "\n").collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let ok = child.wait().unwrap().success();
    assert!(ok || !must, "ip -batch failed:\n{script}");
}

/// The node namespace, a manifests copy and a running agent.
pub struct Bed {
    pub node: Ns,
    pub dir: tempfile::TempDir,
    pub agent: Option<Child>,
    pub metrics_port: u16,
    pub tag: String,
    pub node_name: String,
    /// Extra arguments of `lace-agent run` (e.g. `--kubelet-cgroup-path`), used from the next
    /// start on.
    pub agent_args: Vec<String>,
    /// Which libcni reads the plugins' answers (and so which version they are called with).
    pub runtime: Libcni,
}

impl Bed {
    /// A bed for node-1, with the agent running and ready.
    pub fn new(tag: &str) -> Bed {
        let mut bed = Bed::for_node(tag, NODE);
        bed.start_agent();
        bed
    }

    /// A bed for `node_name`, without an agent yet.
    pub fn for_node(tag: &str, node_name: &str) -> Bed {
        require_root_and_vrf();
        let tag = format!("{tag}{}", std::process::id() % 100_000);
        let node = Ns::new(format!("lace-ct-node-{tag}"));
        let n = node.0.clone();
        // The uplink holds the underlay address; its MTU is what the pod MTU derives from.
        // A veth (its peer unused), since not every kernel here has the dummy driver.
        ip(&[
            "-n", &n, "link", "add", "up0", "mtu", "9000", "type", "veth", "peer", "name", "up0p",
            "mtu", "9000",
        ]);
        ip(&[
            "-n",
            &n,
            "addr",
            "add",
            "fd00:fab::1/64",
            "dev",
            "up0",
            "nodad",
        ]);
        ip(&["-n", &n, "link", "set", "up0", "up"]);
        // Set before the agent's first reconcile so pods can be pinged straight after ADD.
        ip(&[
            "netns",
            "exec",
            &n,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ]);
        ip(&[
            "netns",
            "exec",
            &n,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.forwarding=1",
        ]);
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        for entry in std::fs::read_dir(workspace().join("examples/cluster")).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "yaml") {
                std::fs::copy(&p, manifests.join(p.file_name().unwrap())).unwrap();
            }
        }
        // The bed's pods live in namespace `default`, whose Network does not reach itself in the
        // example; this policy lets them reach each other, so tests can send real traffic.
        std::fs::write(
            manifests.join("bed-default-to-default.yaml"),
            "apiVersion: lace.io/v1alpha1\nkind: NetworkRoutingPolicy\n\
             metadata: {name: bed-default-to-default}\nspec: {from: default, to: default}\n",
        )
        .unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Bed {
            node,
            dir,
            agent: None,
            metrics_port: port,
            tag,
            node_name: node_name.to_owned(),
            agent_args: Vec::new(),
            runtime: Libcni::V1_2,
        }
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Starts the agent and waits until it is ready.
    pub fn start_agent(&mut self) {
        let _ = std::fs::remove_file(self.p("conf/10-lace.conflist"));
        self.spawn_agent();
        // Ready = the conflist is written (the agent does that only once it can serve ADD).
        self.wait_for_conflist(DEADLINE);
    }

    /// Waits for the conflist; panics with the agent's log after `timeout`.
    pub fn wait_for_conflist(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.p("conf/10-lace.conflist").exists() {
            assert!(
                Instant::now() < deadline,
                "agent did not become ready:\n{}\n--- where its threads wait ---\n{}",
                self.log(),
                self.agent_threads()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The agent's threads: name, state and kernel stack (for a stuck agent).
    pub fn agent_threads(&self) -> String {
        let Some(pid) = self.agent.as_ref().map(|c| c.id()) else {
            return "no agent".into();
        };
        let mut out = String::new();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            let dir = task.path();
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let state = read("status")
                .lines()
                .find(|l| l.starts_with("State:"))
                .unwrap_or_default()
                .to_owned();
            out.push_str(&format!(
                "{} {} {}\n{}\n",
                task.file_name().to_string_lossy(),
                read("comm").trim(),
                state,
                read("stack")
            ));
        }
        out
    }

    /// Starts the agent without waiting.
    pub fn spawn_agent(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.p("agent.log"))
            .unwrap();
        let child = Command::new(binary("lace-agent"))
            .arg("run")
            .args(["--node-name", &self.node_name])
            .arg("--manifests")
            .arg(self.p("manifests"))
            .arg("--state-dir")
            .arg(self.p("state"))
            .arg("--socket")
            .arg(self.p("run/cni.sock"))
            .arg("--netns")
            .arg(self.node.path())
            .arg("--cni-bin-dir")
            .arg(self.p("bin"))
            .arg("--cni-conf-dir")
            .arg(self.p("conf"))
            .arg("--cni-bin-source")
            .arg(binary("lace"))
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{}", self.metrics_port),
            ])
            .args(&self.agent_args)
            .env("LACE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.agent = Some(child);
    }

    pub fn kill_agent(&mut self) {
        if let Some(mut c) = self.agent.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.p("agent.log")).unwrap_or_default()
    }

    /// The conflist the agent wrote.
    pub fn conflist(&self) -> Value {
        let path = self.p("conf/10-lace.conflist");
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("cannot read the conflist {}: {e}", path.display()));
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("the conflist {} is not JSON: {e}", path.display()))
    }

    /// The plugin configuration as containerd passes it on stdin: the conflist's plugin
    /// entry with the list's name and the version the bed's libcni negotiates merged in.
    pub fn netconf(&self, extra: Value) -> Value {
        let mut entry = plugin_conf(&self.conflist(), self.runtime);
        if let (Value::Object(entry), Value::Object(extra)) = (&mut entry, extra) {
            entry.extend(extra);
        }
        entry
    }

    /// Execs plugin `plugin` from the bin dir as containerd does (environment, stdin);
    /// returns (exit success, stdout).
    #[allow(clippy::too_many_arguments)]
    pub fn exec(
        &self,
        plugin: &str,
        command: &str,
        id: &str,
        netns: &str,
        pod: &str,
        ifname: &str,
        conf: &Value,
    ) -> (bool, Vec<u8>) {
        let binary = self.p("bin").join(plugin);
        assert!(
            binary.exists(),
            "failed to find plugin {plugin:?} in path [{}] (what containerd reports: the Lace \
             agent installs `lace`, and `loopback` where there is none)\n{}",
            self.p("bin").display(),
            self.log()
        );
        let mut cmd = Command::new(binary);
        cmd.env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_IFNAME", ifname)
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={id}"),
            )
            .env("CNI_PATH", self.p("bin"));
        // containerd leaves out what a verb does not have (GC and STATUS: no container).
        for (k, v) in [("CNI_CONTAINERID", id), ("CNI_NETNS", netns)] {
            if !v.is_empty() {
                cmd.env(k, v);
            }
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.success(), out.stdout)
    }

    /// Execs the installed `lace` plugin for `eth0`; returns (exit success, stdout JSON). A
    /// successful ADD's answer must be one the bed's libcni reads, or the test fails.
    pub fn cni(
        &self,
        command: &str,
        id: &str,
        netns: &str,
        pod: &str,
        conf: Value,
    ) -> (bool, Value) {
        let (ok, stdout) = self.exec("lace", command, id, netns, pod, "eth0", &conf);
        let json = if stdout.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&stdout).unwrap_or_else(|e| {
                panic!(
                    "{command}: stdout is not JSON ({e}): {}",
                    String::from_utf8_lossy(&stdout)
                )
            })
        };
        if ok && command == "ADD" {
            let version = conf["cniVersion"].as_str().unwrap_or_default();
            if let Err(e) = self.runtime.read_add("lace", version, &stdout) {
                panic!(
                    "{} refuses the ADD of {id}: {e}\n{json}",
                    self.runtime.name()
                );
            }
        }
        (ok, json)
    }

    /// The network setup of containerd's RunPodSandbox for sandbox `id` in `pod`: the
    /// loopback network ([`LOOPBACK_CONFLIST`], `lo`), then Lace's conflist (`eth0`), each
    /// ADD answer read by the bed's libcni. The error is what containerd would report.
    pub fn setup(&self, id: &str, pod: &Ns) -> Result<(libcni::Read, libcni::Read), String> {
        let lo_list: Value = serde_json::from_str(LOOPBACK_CONFLIST).unwrap();
        let lo = self.network_add(&lo_list, "lo", id, pod)?;
        let eth0 = self.network_add(&self.conflist(), "eth0", id, pod)?;
        Ok((lo, eth0))
    }

    fn network_add(
        &self,
        list: &Value,
        ifname: &str,
        id: &str,
        pod: &Ns,
    ) -> Result<libcni::Read, String> {
        let conf = plugin_conf(list, self.runtime);
        let plugin = conf["type"].as_str().unwrap().to_owned();
        let version = conf["cniVersion"].as_str().unwrap_or_default().to_owned();
        let (ok, stdout) = self.exec(&plugin, "ADD", id, &pod.path(), &pod.0, ifname, &conf);
        if !ok {
            let error: Value = serde_json::from_slice(&stdout).unwrap_or(Value::Null);
            return Err(format!(
                "plugin type={plugin:?} failed (add): {}",
                error["msg"]
                    .as_str()
                    .unwrap_or(&String::from_utf8_lossy(&stdout))
            ));
        }
        self.runtime.read_add(&plugin, &version, &stdout)
    }

    /// [`Bed::setup`] that must succeed; returns Lace's answer.
    pub fn add(&self, id: &str, pod: &Ns) -> Value {
        match self.setup(id, pod) {
            Ok((_, eth0)) => eth0.raw,
            Err(e) => panic!("ADD {id} failed: {e}\n{}", self.log()),
        }
    }

    /// containerd's teardown of sandbox `id`: DEL of the loopback network, then Lace's.
    pub fn del(&self, id: &str, netns: &str) {
        let lo = plugin_conf(
            &serde_json::from_str(LOOPBACK_CONFLIST).unwrap(),
            self.runtime,
        );
        let (ok, out) = self.exec("loopback", "DEL", id, netns, "x", "lo", &lo);
        assert!(
            ok,
            "loopback DEL {id} failed: {}",
            String::from_utf8_lossy(&out)
        );
        let (ok, out) = self.cni("DEL", id, netns, "x", self.netconf(json!({})));
        assert!(ok, "DEL {id} failed: {out}\n{}", self.log());
    }

    pub fn gc(&self, valid: &[String]) {
        let list: Vec<Value> = valid
            .iter()
            .map(|id| json!({"containerID": id, "ifname": "eth0"}))
            .collect();
        let (ok, out) = self.cni(
            "GC",
            "",
            "",
            "x",
            self.netconf(json!({"cni.dev/valid-attachments": list})),
        );
        assert!(ok, "GC failed: {out}\n{}", self.log());
    }

    /// Addresses in the agent's IPAM state file.
    pub fn ipam_addresses(&self) -> BTreeSet<String> {
        let Ok(bytes) = std::fs::read(self.p("state/ipam.json")) else {
            return BTreeSet::new();
        };
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        v["attachments"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|pair| pair[1]["ips"].as_array().unwrap().clone())
            .map(|ip| ip.as_str().unwrap().to_owned())
            .collect()
    }

    pub fn host_links(&self) -> BTreeSet<String> {
        ip(&["-n", &self.node.0, "-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap().to_owned())
            .filter(|n| n.starts_with("lp-"))
            .collect()
    }

    /// Destinations of pod host routes in the Network's table (both families).
    pub fn vrf_routes(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for fam in ["-4", "-6"] {
            for l in ip(&["-n", &self.node.0, fam, "route", "show", "table", TABLE]).lines() {
                // Pod host routes only, not the kernel's fe80::/64 of each veth.
                if l.contains("dev lp-") && !l.contains("proto kernel") {
                    out.insert(l.split_whitespace().next().unwrap().to_owned());
                }
            }
        }
        out
    }

    /// The agent's resident set size in KiB (`VmRSS`).
    pub fn agent_rss_kib(&self) -> u64 {
        let pid = self.agent.as_ref().map(|c| c.id()).unwrap_or_default();
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// `nft ARGS` in the node's namespace: (success, stdout, stderr).
    pub fn node_nft(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.node.0, "nft"])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `nft delete table inet lace` in the node's namespace.
    pub fn node_nft_delete(&self) {
        let (ok, _, err) = self.node_nft(&["delete", "table", "inet", "lace"]);
        assert!(ok, "nft delete table inet lace: {err}");
    }

    pub fn metrics(&self) -> String {
        self.http_get("/metrics")
    }

    /// The whole HTTP answer (status line, headers, body) of the agent's metrics listener.
    pub fn http_get(&self, path: &str) -> String {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).unwrap();
        // A stuck agent must fail the test, not hang it (and the VM run) without a word.
        s.set_read_timeout(Some(HTTP_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(HTTP_TIMEOUT)).unwrap();
        // One request per connection: the answer ends when the server closes it.
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap_or_else(|e| {
            panic!(
                "GET {path} from the agent's metrics listener: no whole answer within {:?} ({e}); \
                 got {body:?}\n--- agent log ---\n{}",
                HTTP_TIMEOUT,
                self.log()
            )
        });
        body
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.kill_agent();
        if std::thread::panicking() {
            eprintln!("--- agent log ({}) ---\n{}", self.tag, self.log());
        }
    }
}

/// The first plugin entry of `list` as libcni `runtime` passes it on stdin: the list's name
/// and the version it negotiates merged in.
pub fn plugin_conf(list: &Value, runtime: Libcni) -> Value {
    let mut entry = list["plugins"][0].as_object().unwrap().clone();
    entry.insert("cniVersion".into(), Value::from(runtime.negotiate(list)));
    entry.insert("name".into(), list["name"].clone());
    Value::Object(entry)
}

pub fn addresses(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["address"].as_str().unwrap().to_owned())
        .collect()
}
