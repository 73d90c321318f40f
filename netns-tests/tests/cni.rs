//! The CNI path end to end against a real kernel: the real `lace` plugin binary, exec'd with
//! containerd's environment and stdin, talking to a real `lace-agent run --manifests ...`
//! that programs a "node" network namespace; pods are network namespaces of their own.
//!
//! Needs root and a kernel with VRF (the agent creates the Network's VRF at ADD), so it runs
//! in the VM: build first (`cargo build -p lace -p lace-cni`), then run the test binary with
//! `--test-threads=1` (the tests share `/run/netns`). The kernel state is observed with `ip`
//! (not the code under test), the agent's IPAM with its state file, and traffic with `ping`.
//!
//! The manifests are `examples/cluster` (node-1: Network `default` has function 1, so VRF
//! `lv-default`, table 1000001, blocks 10.244.64.0/24 and fd00:244:0:100::/64).

use std::collections::BTreeSet;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const NODE: &str = "node-1";
const VRF: &str = "lv-default";
const TABLE: &str = "1000001";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn binary(name: &str) -> PathBuf {
    let p = workspace().join("target/debug").join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p lace -p lace-cni` first",
        p.display()
    );
    p
}

fn require_root_and_vrf() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap();
    assert_eq!(uid, "0", "the CNI netns tests must run as root");
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip_ok(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A named network namespace, deleted on drop.
struct Ns(String);

impl Ns {
    fn new(name: String) -> Self {
        let _ = ip_ok(&["netns", "del", &name]);
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        Ns(name)
    }
    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = ip_ok(&["netns", "del", &self.0]);
    }
}

/// The node namespace, a manifests copy and a running agent.
struct Bed {
    node: Ns,
    dir: tempfile::TempDir,
    agent: Option<Child>,
    metrics_port: u16,
    tag: String,
}

impl Bed {
    fn new(tag: &str) -> Bed {
        require_root_and_vrf();
        let tag = format!("{tag}{}", std::process::id() % 100_000);
        let node = Ns::new(format!("lace-ct-node-{tag}"));
        let n = node.0.clone();
        // The uplink holds the underlay address; its MTU is what the pod MTU derives from.
        ip(&[
            "-n", &n, "link", "add", "up0", "mtu", "9000", "type", "dummy",
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
        // What the plan's sysctls would set (no reconciler is plugged into the agent here).
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
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut bed = Bed {
            node,
            dir,
            agent: None,
            metrics_port: port,
            tag,
        };
        bed.start_agent();
        bed
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn start_agent(&mut self) {
        let _ = std::fs::remove_file(self.p("conf/10-lace.conflist"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.p("agent.log"))
            .unwrap();
        let child = Command::new(binary("lace-agent"))
            .arg("run")
            .args(["--node-name", NODE])
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
            .env("LACE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.agent = Some(child);
        // Ready = the conflist is written (the agent does that only once it can serve ADD).
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.p("conf/10-lace.conflist").exists() {
            assert!(
                Instant::now() < deadline,
                "agent did not become ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill_agent(&mut self) {
        if let Some(mut c) = self.agent.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.p("agent.log")).unwrap_or_default()
    }

    /// The plugin configuration as containerd passes it on stdin: the conflist's plugin
    /// entry with the list's name and version merged in.
    fn netconf(&self, extra: Value) -> Value {
        let list: Value =
            serde_json::from_slice(&std::fs::read(self.p("conf/10-lace.conflist")).unwrap())
                .unwrap();
        let mut entry = list["plugins"][0].as_object().unwrap().clone();
        entry.insert("cniVersion".into(), list["cniVersion"].clone());
        entry.insert("name".into(), list["name"].clone());
        if let Value::Object(extra) = extra {
            entry.extend(extra);
        }
        Value::Object(entry)
    }

    /// Execs the installed plugin; returns (exit success, stdout JSON).
    fn cni(&self, command: &str, id: &str, netns: &str, pod: &str, conf: Value) -> (bool, Value) {
        let mut cmd = Command::new(self.p("bin/lace"));
        cmd.env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_IFNAME", "eth0")
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
        let json = if out.stdout.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "{command}: stdout is not JSON ({e}): {}",
                    String::from_utf8_lossy(&out.stdout)
                )
            })
        };
        (out.status.success(), json)
    }

    fn add(&self, id: &str, pod: &Ns) -> Value {
        let (ok, out) = self.cni("ADD", id, &pod.path(), &pod.0, self.netconf(json!({})));
        assert!(ok, "ADD {id} failed: {out}\n{}", self.log());
        out
    }

    fn del(&self, id: &str, netns: &str) {
        let (ok, out) = self.cni("DEL", id, netns, "x", self.netconf(json!({})));
        assert!(ok, "DEL {id} failed: {out}\n{}", self.log());
    }

    fn gc(&self, valid: &[String]) {
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
    fn ipam_addresses(&self) -> BTreeSet<String> {
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

    fn host_links(&self) -> BTreeSet<String> {
        ip(&["-n", &self.node.0, "-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap().to_owned())
            .filter(|n| n.starts_with("lp-"))
            .collect()
    }

    /// Destinations of pod host routes in the Network's table (both families).
    fn vrf_routes(&self) -> BTreeSet<String> {
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

    fn metrics(&self) -> String {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
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

fn addresses(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["address"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn lifecycle_add_check_del_del() {
    let bed = Bed::new("lc");
    let a = Ns::new(format!("lace-ct-a-{}", bed.tag));
    let b = Ns::new(format!("lace-ct-b-{}", bed.tag));

    let ra = bed.add("ctr-a", &a);
    let rb = bed.add("ctr-b", &b);
    assert_eq!(ra["cniVersion"], "1.1.0");
    let (ips_a, ips_b) = (addresses(&ra), addresses(&rb));
    assert_eq!(ips_a, ["10.244.64.1/32", "fd00:244:0:100::1/128"], "{ra}");
    assert_eq!(ips_b, ["10.244.64.2/32", "fd00:244:0:100::2/128"], "{rb}");
    assert_eq!(ra["ips"][0]["gateway"], "169.254.1.1");
    assert_eq!(ra["ips"][1]["gateway"], "fe80::1");
    let host_a = ra["interfaces"][0]["name"].as_str().unwrap().to_owned();
    assert!(host_a.starts_with("lp-") && host_a.len() <= 15, "{host_a}");
    // MTU: 9000 on the uplink minus 64 bytes of SRv6 overhead.
    assert_eq!(ra["interfaces"][1]["mtu"], 8936);

    // The kernel, as `ip` sees it.
    let pod_addr = ip(&["-n", &a.0, "addr", "show", "dev", "eth0"]);
    assert!(pod_addr.contains("inet 10.244.64.1/32"), "{pod_addr}");
    assert!(
        pod_addr.contains("inet6 fd00:244:0:100::1/128"),
        "{pod_addr}"
    );
    assert!(pod_addr.contains("mtu 8936"), "{pod_addr}");
    let pod_routes = ip(&["-n", &a.0, "route", "show"]);
    assert!(
        pod_routes.contains("default via 169.254.1.1 dev eth0"),
        "{pod_routes}"
    );
    let pod_routes6 = ip(&["-n", &a.0, "-6", "route", "show"]);
    assert!(
        pod_routes6.contains("default via fe80::1 dev eth0"),
        "{pod_routes6}"
    );
    let host = ip(&["-n", &bed.node.0, "link", "show", "dev", &host_a]);
    assert!(
        host.contains(&format!("master {VRF}")) && host.contains("state UP"),
        "{host}"
    );
    let vrf = ip(&["-n", &bed.node.0, "-d", "link", "show", "dev", VRF]);
    assert!(vrf.contains(&format!("vrf table {TABLE}")), "{vrf}");
    let routes = bed.vrf_routes();
    for want in [
        "10.244.64.1",
        "10.244.64.2",
        "fd00:244:0:100::1",
        "fd00:244:0:100::2",
    ] {
        assert!(
            routes.contains(want),
            "{want} not routed in table {TABLE}: {routes:?}"
        );
    }
    let proxy_arp = ip(&[
        "netns",
        "exec",
        &bed.node.0,
        "sysctl",
        "-n",
        &format!("net.ipv4.conf.{host_a}.proxy_arp"),
    ]);
    assert_eq!(proxy_arp.trim(), "1");

    // Real traffic between the two pods through the node's VRF, both families.
    for (fam, dst) in [("-4", "10.244.64.2"), ("-6", "fd00:244:0:100::2")] {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &a.0, "ping", fam, "-c", "1", "-W", "3", dst,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ping {dst} from pod a failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // CHECK passes on what ADD made...
    let check_conf = bed.netconf(json!({"prevResult": ra}));
    let (ok, out) = bed.cni("CHECK", "ctr-a", &a.path(), &a.0, check_conf.clone());
    assert!(ok, "CHECK failed: {out}");
    // ...and names what is broken.
    ip(&["-n", &a.0, "route", "del", "default"]);
    let (ok, out) = bed.cni("CHECK", "ctr-a", &a.path(), &a.0, check_conf.clone());
    assert!(!ok && out["code"] == 100, "{out}");
    assert!(
        out["msg"].as_str().unwrap().contains("169.254.1.1"),
        "{out}"
    );
    ip(&["-n", &bed.node.0, "link", "set", &host_a, "nomaster"]);
    ip(&[
        "-n",
        &a.0,
        "route",
        "add",
        "default",
        "via",
        "169.254.1.1",
        "dev",
        "eth0",
    ]);
    let (ok, out) = bed.cni("CHECK", "ctr-a", &a.path(), &a.0, check_conf);
    assert!(!ok && out["msg"].as_str().unwrap().contains(VRF), "{out}");

    // STATUS is ready.
    let (ok, out) = bed.cni("STATUS", "", "", "x", bed.netconf(json!({})));
    assert!(ok, "STATUS: {out}");
    assert!(bed
        .metrics()
        .contains("lace_addresses_in_use{network=\"default\"} 4"));

    // DEL, DEL again, DEL with the netns gone.
    bed.del("ctr-a", &a.path());
    assert!(
        !ip_ok(&["-n", &bed.node.0, "link", "show", "dev", &host_a]),
        "host veth left"
    );
    assert!(
        !ip_ok(&["-n", &a.0, "link", "show", "dev", "eth0"]),
        "pod interface left"
    );
    bed.del("ctr-a", &a.path());
    drop(b);
    bed.del("ctr-b", "/run/netns/lace-ct-gone");
    bed.del("never-added", "");
    assert!(
        bed.ipam_addresses().is_empty(),
        "{:?}",
        bed.ipam_addresses()
    );
    assert!(bed.host_links().is_empty(), "{:?}", bed.host_links());
    assert!(bed.vrf_routes().is_empty(), "{:?}", bed.vrf_routes());
    // Released addresses are handed out again.
    assert_eq!(addresses(&bed.add("ctr-c", &a))[0], "10.244.64.1/32");
    bed.del("ctr-c", &a.path());
    let metrics = bed.metrics();
    assert!(
        metrics.contains("lace_cni_requests_total{verb=\"ADD\",result=\"ok\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("lace_cni_requests_total{verb=\"CHECK\",result=\"100\"} 2"),
        "{metrics}"
    );
}

/// Pods added concurrently (`LACE_CNI_PODS`, default 100; the VM run uses fewer because
/// every netlink call is ~10x slower under emulation).
#[test]
fn concurrent_adds_never_share_an_address() {
    let n: usize = std::env::var("LACE_CNI_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let bed = Arc::new(Bed::new("cc"));
    let pods: Vec<Arc<Ns>> = (0..n)
        .map(|i| Arc::new(Ns::new(format!("lace-ct-{i}-{}", bed.tag))))
        .collect();
    let threads: Vec<_> = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| {
            let (bed, pod) = (Arc::clone(&bed), Arc::clone(pod));
            std::thread::spawn(move || addresses(&bed.add(&format!("ctr-{i}"), &pod)))
        })
        .collect();
    let mut all = BTreeSet::new();
    for t in threads {
        for a in t.join().unwrap() {
            assert!(all.insert(a.clone()), "{a} handed out twice");
        }
    }
    assert_eq!(all.len(), 2 * n);
    assert_eq!(bed.ipam_addresses(), all);
    assert_eq!(bed.host_links().len(), n);
    assert_eq!(bed.vrf_routes().len(), 2 * n);
    for (i, pod) in pods.iter().enumerate() {
        bed.del(&format!("ctr-{i}"), &pod.path());
    }
    assert!(bed.ipam_addresses().is_empty());
    assert!(bed.host_links().is_empty());
    assert!(bed.vrf_routes().is_empty());
}

/// SIGKILL in the middle of an ADD storm, restart, GC with the attachments the runtime
/// believes in: nothing leaks (address, interface or route) and nothing is handed out twice.
#[test]
fn sigkill_during_adds_then_restart_and_gc_leaks_nothing() {
    let n = 30;
    let mut bed = Bed::new("kl");
    let pods: Vec<Arc<Ns>> = (0..n)
        .map(|i| Arc::new(Ns::new(format!("lace-ct-k{i}-{}", bed.tag))))
        .collect();
    let conf = bed.netconf(json!({}));
    let plugin = bed.p("bin/lace");
    let bin_dir = bed.p("bin");
    let done = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| {
            let (pod, conf, plugin, bin_dir, done) = (
                Arc::clone(pod),
                conf.clone(),
                plugin.clone(),
                bin_dir.clone(),
                Arc::clone(&done),
            );
            std::thread::spawn(move || {
                let id = format!("ctr-{i}");
                let mut child = Command::new(&plugin)
                    .env_clear()
                    .env("CNI_COMMAND", "ADD")
                    .env("CNI_CONTAINERID", &id)
                    .env("CNI_NETNS", pod.path())
                    .env("CNI_IFNAME", "eth0")
                    .env(
                        "CNI_ARGS",
                        format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME=k{i}"),
                    )
                    .env("CNI_PATH", &bin_dir)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(conf.to_string().as_bytes())
                    .unwrap();
                let out = child.wait_with_output().unwrap();
                if out.status.success() {
                    done.fetch_add(1, Ordering::SeqCst);
                    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                    Ok((id, addresses(&v)))
                } else {
                    Err(String::from_utf8_lossy(&out.stdout).into_owned())
                }
            })
        })
        .collect();
    // Let some ADDs finish and others be in flight, then kill.
    let deadline = Instant::now() + Duration::from_secs(60);
    while done.load(Ordering::SeqCst) < n / 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    bed.kill_agent();
    let (succeeded, failed): (Vec<_>, Vec<_>) = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .partition(Result::is_ok);
    let succeeded: Vec<(String, Vec<String>)> = succeeded.into_iter().flatten().collect();
    for f in failed.iter().take(3) {
        eprintln!("failed ADD: {f:?}");
    }
    assert!(!succeeded.is_empty(), "no ADD finished before the kill");
    eprintln!("{} of {n} ADDs succeeded before SIGKILL", succeeded.len());

    bed.start_agent();
    let valid: Vec<String> = succeeded.iter().map(|(id, _)| id.clone()).collect();
    bed.gc(&valid);

    let want: BTreeSet<String> = succeeded.iter().flat_map(|(_, a)| a.clone()).collect();
    assert_eq!(
        want.len(),
        2 * succeeded.len(),
        "duplicate among successful ADDs"
    );
    assert_eq!(
        bed.ipam_addresses(),
        want,
        "IPAM holds exactly the surviving pods"
    );
    let want_hosts: BTreeSet<String> = valid
        .iter()
        .map(|id| lace::agent::cni::host_ifname(id, "eth0"))
        .collect();
    assert_eq!(
        bed.host_links(),
        want_hosts,
        "veths are exactly the surviving pods'"
    );
    let want_routes: BTreeSet<String> = want
        .iter()
        .map(|a| a.split('/').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        bed.vrf_routes(),
        want_routes,
        "routes are exactly the surviving pods'"
    );

    // The runtime retries the failed pods after cleaning them (DEL), and they get addresses
    // that no surviving pod holds.
    let mut all = want.clone();
    for (i, pod) in pods.iter().enumerate() {
        let id = format!("ctr-{i}");
        if valid.contains(&id) {
            continue;
        }
        bed.del(&id, &pod.path());
        for a in addresses(&bed.add(&id, pod)) {
            assert!(all.insert(a.clone()), "{a} handed out twice after restart");
        }
    }
    // Pods deleted while the agent is down: the plugin queues the DELs (and succeeds); the
    // agent replays the queue at start, before serving, removing veths and addresses (the
    // namespaces are still there, so it is the replay and not the start-up check that
    // cleans).
    bed.kill_agent();
    for (i, pod) in pods.iter().enumerate() {
        bed.del(&format!("ctr-{i}"), &pod.path());
    }
    assert!(
        !bed.ipam_addresses().is_empty(),
        "nothing was left for the replay to release"
    );
    assert_eq!(bed.host_links().len(), n);
    bed.start_agent();
    assert!(
        bed.ipam_addresses().is_empty(),
        "{:?}",
        bed.ipam_addresses()
    );
    assert!(bed.host_links().is_empty(), "{:?}", bed.host_links());
    assert!(bed.vrf_routes().is_empty(), "{:?}", bed.vrf_routes());
    let queue = bed.p("state/cni-del-queue");
    assert_eq!(
        std::fs::read_dir(&queue).map(|d| d.count()).unwrap_or(0),
        0,
        "queue not emptied"
    );
}
