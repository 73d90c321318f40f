//! A real container runtime runs Lace pods: containerd, driven through its CRI by `crictl` (as
//! a kubelet drives it), with Lace's real agent (standalone mode on `examples/cluster`, as the
//! CNI tests start it) and the conflist and `loopback` plugin the agent installed. containerd
//! runs the pod sandboxes with runc, which the host kernel here cannot run, so this runs in
//! the VM (`netns-tests/run` builds crictl and the pause image on the host first, and passes
//! them in `LACE_CRICTL`, `LACE_PAUSE_IMAGE` and `LACE_PAUSE_REF`).
//!
//! The runtime is a parameter ([`Runtime`]): Debian bookworm's containerd 1.6.20 (libcni
//! 1.1.2, the libcni of every containerd 1.7 too), and containerd 2.x (libcni 1.2+, config
//! version 3) at the version in `scripts/k8s-versions`, built from its Go module by
//! `scripts/k8s-components.sh containerd` (netns-tests/run passes it in `LACE_CONTAINERD_2`).
//!
//! What is checked, per runtime: a pod the example's policies bind gets both its addresses
//! (seen inside its network namespace, and in the agent's IPAM), `lo` is up with 127.0.0.1/8
//! and ::1/128, `crictl stopp` frees the addresses, `crictl rmp` leaves nothing; a pod no
//! binding policy matches fails `crictl runp` with Lace's message and holds nothing.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod cni_bed;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cni_bed::{ip, Bed, NODE};
use serde_json::Value;

/// A containerd to run the test with.
struct Runtime {
    /// What the messages call it.
    name: &'static str,
    /// The `containerd` binary. Its directory is searched first for its shim
    /// (`containerd-shim-runc-v2`) and `ctr`.
    containerd: PathBuf,
    /// The start of the version `containerd --version` must print (its third field).
    version_prefix: &'static str,
    /// The version of containerd's configuration format: 2 for 1.x (3 for 2.x).
    config_version: u32,
}

impl Runtime {
    /// Debian bookworm's `containerd` package (1.6.20; netns-tests/vm/setup.sh installs it),
    /// or the binary `LACE_CONTAINERD_1_6` names.
    fn debian_1_6() -> Runtime {
        Runtime {
            name: "containerd 1.6",
            containerd: std::env::var_os("LACE_CONTAINERD_1_6")
                .map(PathBuf::from)
                .unwrap_or_else(|| "/usr/bin/containerd".into()),
            version_prefix: "1.6.",
            config_version: 2,
        }
    }

    /// containerd 2.x from its Go module (`scripts/k8s-components.sh containerd`: the binary
    /// and its shim and `ctr` side by side), named by `LACE_CONTAINERD_2`.
    fn v2() -> Runtime {
        Runtime {
            name: "containerd 2",
            containerd: env_path(
                "LACE_CONTAINERD_2",
                "LACE_CONTAINERD_2=$(scripts/k8s-components.sh --path containerd)/containerd",
            ),
            version_prefix: "v2.",
            config_version: 3,
        }
    }

    fn dir(&self) -> &Path {
        self.containerd.parent().unwrap()
    }

    /// `ctr` beside the binary.
    fn ctr(&self) -> PathBuf {
        self.dir().join("ctr")
    }

    /// Checks the binary is there and is the version the test is named after.
    fn check(&self) {
        let out = Command::new(&self.containerd)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: cannot run {}: {e} (netns-tests/vm/setup.sh installs Debian's containerd \
                     and runc)",
                    self.name,
                    self.containerd.display()
                )
            });
        let text = String::from_utf8_lossy(&out.stdout);
        // "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"
        let version = text.split_whitespace().nth(2).unwrap_or_default();
        assert!(
            version.starts_with(self.version_prefix),
            "{}: {} --version says {text:?}, not {}*",
            self.name,
            self.containerd.display(),
            self.version_prefix
        );
        eprintln!("{}: {}", self.name, text.trim());
    }

    /// containerd's configuration: root and state in `dir`, the CNI dirs the agent installed
    /// into, the local pause image, runc with cgroupfs.
    fn config(&self, dir: &Path, bed: &Bed, pause_ref: &str) -> String {
        let runc = which("runc");
        if self.config_version == 3 {
            return format!(
                r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.nri.v1.nri"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause_ref}"
[plugins."io.containerd.cri.v1.runtime"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{conf}"
    max_conf_num = 1
"#,
                root = dir.join("root").display(),
                state = dir.join("state").display(),
                sock = dir.join("containerd.sock").display(),
                dir = dir.display(),
                bin = bed.p("bin").display(),
                conf = bed.p("conf").display(),
                runc = runc.display(),
            );
        }
        assert_eq!(
            self.config_version, 2,
            "{}: configuration version 2 or 3",
            self.name
        );
        format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_ref}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
"#,
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            sock = dir.join("containerd.sock").display(),
            dir = dir.display(),
            bin = bed.p("bin").display(),
            conf = bed.p("conf").display(),
            runc = runc.display(),
        )
    }
}

fn which(name: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not found (netns-tests/vm/setup.sh installs it)"))
}

fn env_path(var: &str, how: &str) -> PathBuf {
    let value = std::env::var_os(var).unwrap_or_else(|| {
        panic!(
            "{var} is not set: run this test through netns-tests/run (it builds what the \
             containerd test needs on the host), or set it yourself: {how}"
        )
    });
    PathBuf::from(value)
}

/// A running containerd, its root on a tmpfs of its own (the VM's `/` is an overlay over 9p,
/// which its snapshotter cannot use), stopped and unmounted on drop.
struct Containerd {
    runtime: Runtime,
    dir: PathBuf,
    process: Option<Child>,
    crictl: PathBuf,
}

impl Containerd {
    fn start(runtime: Runtime, bed: &Bed) -> Containerd {
        runtime.check();
        let crictl = env_path(
            "LACE_CRICTL",
            "LACE_CRICTL=$(scripts/k8s-components.sh --path crictl)/crictl",
        );
        let (pause_ref, pause_archive) = (
            std::env::var("LACE_PAUSE_REF").unwrap_or_default(),
            env_path(
                "LACE_PAUSE_IMAGE",
                "read -r _ LACE_PAUSE_REF LACE_PAUSE_IMAGE < <(tests/cluster/images.sh pause)",
            ),
        );
        assert!(
            !pause_ref.is_empty(),
            "LACE_PAUSE_REF is not set (see LACE_PAUSE_IMAGE)"
        );
        let dir = bed.p("containerd");
        std::fs::create_dir_all(dir.join("root")).unwrap();
        run_ok(
            "mount",
            &["-t", "tmpfs", "-o", "mode=0700", "lace-containerd"],
            &dir.join("root"),
        );
        let config = dir.join("config.toml");
        std::fs::write(&config, runtime.config(&dir, bed, &pause_ref)).unwrap();
        std::fs::write(
            dir.join("crictl.yaml"),
            format!(
                "runtime-endpoint: unix://{sock}\nimage-endpoint: unix://{sock}\ntimeout: 120\n",
                sock = dir.join("containerd.sock").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", runtime.dir().display());
        let process = Command::new(&runtime.containerd)
            .arg("--config")
            .arg(&config)
            .env("PATH", &path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", runtime.containerd.display()));
        let mut ctd = Containerd {
            runtime,
            dir,
            process: Some(process),
            crictl,
        };
        ctd.wait_for_cri();
        let started = Instant::now();
        let out = Command::new(ctd.runtime.ctr())
            .arg("--address")
            .arg(ctd.dir.join("containerd.sock"))
            // ctr waits forever by default; crictl.yaml gives crictl the same 120 s.
            .args(["--timeout", "120s", "-n", "k8s.io", "images", "import"])
            .arg(&pause_archive)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ctr images import {}: {}{}",
            pause_archive.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "pause image {pause_ref} imported in {:.1?}",
            started.elapsed()
        );
        ctd
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// `crictl ARGS` against this containerd: (success, stdout, stderr).
    fn crictl(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(&self.crictl)
            .arg("--config")
            .arg(self.dir.join("crictl.yaml"))
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.crictl.display()));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `crictl ARGS` that must succeed; its stdout.
    fn crictl_ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.crictl(args);
        assert!(
            ok,
            "crictl {args:?} failed: {err}{out}\n--- containerd log ---\n{}",
            self.log()
        );
        out
    }

    /// Waits until the CRI answers and reports the network ready (the conflist loaded).
    fn wait_for_cri(&mut self) {
        let deadline = Instant::now() + cni_bed::DEADLINE;
        let started = Instant::now();
        loop {
            if let Some(status) = self.process.as_mut().and_then(|p| p.try_wait().unwrap()) {
                panic!(
                    "{} exited with {status} at start:\n{}",
                    self.runtime.name,
                    self.log()
                );
            }
            let (ok, out, _) = self.crictl(&["info", "-o", "json"]);
            if ok {
                let info: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
                let ready = info["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "NetworkReady" && c["status"] == true);
                if ready {
                    eprintln!(
                        "{}: CRI up, network ready after {:.1?}",
                        self.runtime.name,
                        started.elapsed()
                    );
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{}: CRI not up with its network ready after {:?} (crictl info: {out})\n{}",
                self.runtime.name,
                cni_bed::DEADLINE,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Sandboxes a failed test left: stopped and removed while containerd still runs.
        let _ = self.crictl(&["rmp", "--force", "--all"]);
        if let Some(mut p) = self.process.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &p.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while p.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = p.kill();
            let _ = p.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- {} log ---\n{}", self.runtime.name, self.log());
        }
        let _ = Command::new("umount")
            .args(["--recursive", "--lazy"])
            .arg(self.dir.join("root"))
            .status();
    }
}

/// Runs `program ARGS TARGET`, which must succeed.
fn run_ok(program: &str, args: &[&str], target: &Path) {
    let out = Command::new(program)
        .args(args)
        .arg(target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} {}: {}",
        target.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pod sandbox configuration for `crictl runp`.
fn sandbox_config(dir: &Path, namespace: &str, name: &str) -> PathBuf {
    let logs = dir.join("logs").join(name);
    std::fs::create_dir_all(&logs).unwrap();
    let config = serde_json::json!({
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                     "attempt": 0},
        "hostname": name,
        "log_directory": logs,
        "linux": {}
    });
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// `ip ARGS` inside the network namespace at `netns`.
fn ip_in(netns: &str, args: &[&str]) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .arg("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nsenter --net={netns} ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The example's manifests with the catch-all binding policy narrowed to namespace `default`:
/// a pod in `monitoring` (a namespace of the example without labels) then matches none.
fn narrow_default_binding(bed: &Bed) {
    let path = bed.p("manifests/policies.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let catch_all = "  network: default\n  priority: 0\n";
    assert!(text.contains(catch_all), "policies.yaml changed: {text}");
    let narrowed = text.replace(
        catch_all,
        "  network: default\n  priority: 0\n  namespaceSelector:\n    matchLabels:\n      \
         kubernetes.io/metadata.name: default\n",
    );
    std::fs::write(&path, narrowed).unwrap();
}

fn runs_lace_pods(runtime: Runtime) {
    let mut bed = Bed::for_node("cd", NODE);
    narrow_default_binding(&bed);
    bed.start_agent();
    let ctd = Containerd::start(runtime, &bed);
    let name = ctd.runtime.name;

    // A pod the example binds to Network `default` (node-1's blocks 10.244.64.0/24 and
    // fd00:244:0:100::/64).
    let started = Instant::now();
    let id = ctd
        .crictl_ok(&[
            "runp",
            sandbox_config(&ctd.dir, "default", "web").to_str().unwrap(),
        ])
        .trim()
        .to_owned();
    eprintln!("{name}: runp of default/web took {:.1?}", started.elapsed());
    let inspect: Value = serde_json::from_str(&ctd.crictl_ok(&["inspectp", "-o", "json", &id]))
        .expect("crictl inspectp prints JSON");
    let status = &inspect["status"];
    assert_eq!(status["state"], "SANDBOX_READY", "{status}");
    let primary = status["network"]["ip"].as_str().unwrap_or_default();
    let additional: Vec<&str> = status["network"]["additionalIps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["ip"].as_str())
        .collect();
    assert_eq!(
        (primary, additional.as_slice()),
        ("10.244.64.1", ["fd00:244:0:100::1"].as_slice()),
        "{name} reports other pod addresses: {status}"
    );
    assert_eq!(
        bed.ipam_addresses(),
        ["10.244.64.1/32", "fd00:244:0:100::1/128"]
            .map(String::from)
            .into(),
        "the agent's IPAM"
    );
    let netns = inspect["info"]["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .unwrap_or_else(|| panic!("no network namespace in crictl inspectp: {inspect}"))
        .to_owned();
    // Inside the sandbox, as the kernel has it.
    let eth0 = ip_in(&netns, &["addr", "show", "dev", "eth0"]);
    assert!(
        eth0.contains("inet 10.244.64.1/32") && eth0.contains("inet6 fd00:244:0:100::1/128"),
        "{eth0}"
    );
    let routes = ip_in(&netns, &["route", "show"]);
    assert!(
        routes.contains("default via 169.254.1.1 dev eth0"),
        "{routes}"
    );
    let lo = ip_in(&netns, &["addr", "show", "dev", "lo"]);
    assert!(
        lo.contains(",UP") && lo.contains("inet 127.0.0.1/8") && lo.contains("inet6 ::1/128"),
        "lo in the sandbox: {lo}"
    );
    assert_eq!(bed.host_links().len(), 1, "{:?}", bed.host_links());
    // The runtime set up lo with the agent's loopback copy (no other is in the bin dir),
    // which asked the agent.
    assert!(
        bed.log().contains("installed Lace's"),
        "the agent installed no loopback:\n{}",
        bed.log()
    );
    let metrics = bed.metrics();
    assert!(
        metrics.contains("lace_cni_requests_total{verb=\"LOOPBACK_ADD\",result=\"ok\"} 1"),
        "{name} did not set up lo through Lace's loopback plugin:\n{metrics}"
    );

    // Stopping the sandbox DELs it: the addresses are free again.
    let started = Instant::now();
    ctd.crictl_ok(&["stopp", &id]);
    eprintln!("{name}: stopp took {:.1?}", started.elapsed());
    assert!(
        bed.ipam_addresses().is_empty(),
        "addresses left in the agent's IPAM after stopp: {:?}",
        bed.ipam_addresses()
    );
    assert!(bed.host_links().is_empty(), "{:?}", bed.host_links());
    ctd.crictl_ok(&["rmp", &id]);
    assert!(ctd.crictl_ok(&["pods", "-q"]).trim().is_empty());

    // A pod no binding policy matches: RunPodSandbox fails with Lace's message, and nothing
    // is held for it.
    let (ok, out, err) = ctd.crictl(&[
        "runp",
        sandbox_config(&ctd.dir, "monitoring", "stray")
            .to_str()
            .unwrap(),
    ]);
    assert!(!ok, "runp of an unbound pod succeeded: {out}");
    // crictl logs the CRI error quoted (logfmt): `type=\"lace\"`.
    let err = err.replace("\\\"", "\"");
    for want in [
        r#"plugin type="lace" failed (add)"#,
        "pod monitoring/stray matches no NetworkBindingPolicy, so it has no Network",
    ] {
        assert!(
            err.contains(want),
            "{name}: runp says {err:?}, without {want:?}"
        );
    }
    assert!(
        bed.ipam_addresses().is_empty(),
        "{:?}",
        bed.ipam_addresses()
    );
    assert!(bed.host_links().is_empty(), "{:?}", bed.host_links());
    let log = ctd.log();
    for never in [
        r#"failed to find plugin \"loopback\""#,
        "unsupported CNI result version",
    ] {
        assert!(!log.contains(never), "{name} logged {never:?}:\n{log}");
    }
    let node_links = ip(&["-n", &bed.node.0, "-o", "link", "show"]);
    assert!(!node_links.contains("lp-"), "{node_links}");
}

#[test]
fn containerd_1_6_runs_lace_pods_through_its_cri() {
    cni_bed::require_root_and_vrf();
    runs_lace_pods(Runtime::debian_1_6());
}

#[test]
fn containerd_2_runs_lace_pods_through_its_cri() {
    cni_bed::require_root_and_vrf();
    runs_lace_pods(Runtime::v2());
}
