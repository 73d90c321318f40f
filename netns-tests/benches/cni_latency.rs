//! CNI ADD and DEL latency as the runtime sees it, Lace against Debian's reference plugins
//! (`containernetworking-plugins`: `ptp` + `host-local` and `bridge` + `host-local`) in the
//! same run, plus the Lace agent's memory.
//!
//! Every plugin is exec'd the way containerd does it: `CNI_COMMAND`, `CNI_CONTAINERID`,
//! `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS` (with `K8S_POD_NAMESPACE`/`K8S_POD_NAME`) and
//! `CNI_PATH` in a cleared environment, the network configuration on stdin, from the node's
//! network namespace (the exec'ing thread enters it, so the child starts there), and every
//! pod gets a fresh network namespace made by the bench before its ADD. The time measured is
//! spawn to exit of the plugin process. The plugins run back to back with the same pod counts:
//! per plugin N sequential ADDs then their DELs, then per plugin M ADDs at once then their DELs
//! at once. Then the agent's `VmRSS`/`VmHWM` idle (before any pod) and with `LACE_BENCH_RSS_PODS`
//! pods attached. Lace's configuration adds `logLevel: info`: each request's log line (on
//! stderr) gives the plugin's own time, which splits its sequential ADDs into that and the rest
//! (the process's start and exit); the agent's metrics give its side.
//!
//! The reference configurations are the usual ones: `host-local` with a /16 range (its own
//! `dataDir`), `ptp` with `ipMasq: false`, `bridge` with `isGateway: true` and
//! `ipMasq: false`, IPv4 only (both plugins wait for IPv6 DAD to finish, which would only
//! slow them down). Lace's pods get an IPv4 and an IPv6 address (the example cluster's
//! Networks are dual-stack), so Lace does more per ADD than they do.
//!
//! Root and a VRF-capable kernel (the VM): run `netns-tests/bench-cni.sh`, which builds this
//! and release builds of `lace` and `lace-agent`. Knobs: `LACE_BENCH_PODS` (sequential pods,
//! default 200), `LACE_BENCH_CONCURRENT` (pods at once, default 50), `LACE_BENCH_RSS_PODS`
//! (default 500), `LACE_BIN_DIR` (where `lace` and `lace-agent` are), `LACE_BENCH_CNI_DIR`
//! (the reference plugins, default `/usr/lib/cni`), `LACE_BENCH_PLUGINS` (comma-separated
//! subset of `lace,ptp,bridge`), `LACE_BENCH_BEFORE_DIR` (a directory with an older build's
//! `lace` and `lace-agent`, measured as one more plugin, "lace (before)").
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

#[path = "../tests/cni_bed/mod.rs"]
mod cni_bed;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_bed::{Bed, Ns, PodNamespaces};
use serde_json::{json, Value};

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One CNI plugin as the runtime sees it: a binary, its configuration, the node namespace
/// it runs in.
struct Plugin {
    label: &'static str,
    binary: PathBuf,
    cni_path: PathBuf,
    conf: Vec<u8>,
    node: PathBuf,
}

/// The outcome of one exec: how long it took, whether it succeeded, what it printed.
struct Exec {
    took: Duration,
    ok: bool,
    stdout: String,
}

impl Exec {
    /// The plugin's own time for the request, from its log line (`... ok in 23.4ms`, at
    /// `logLevel` info): from its configuration read to its answer.
    fn own(&self) -> Option<Duration> {
        let (_, after) = self.stdout.split_once(" ok in ")?;
        let text = after.split_whitespace().next()?;
        let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, unit) = text.split_at(split);
        let scale = match unit {
            "s" => 1.0,
            "ms" => 1e-3,
            "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        Some(Duration::from_secs_f64(number.parse::<f64>().ok()? * scale))
    }
}

impl Plugin {
    /// Execs the plugin for `verb` on pod `id` in network namespace `netns`. Must run on a
    /// thread that entered the node namespace ([`in_netns`]).
    fn exec(&self, verb: &str, id: &str, pod_namespace: &str, netns: &Path) -> Exec {
        let mut cmd = Command::new(&self.binary);
        cmd.env_clear()
            .env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env(
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={pod_namespace};K8S_POD_NAME={id};\
                     K8S_POD_INFRA_CONTAINER_ID={id}"
                ),
            )
            .env("CNI_PATH", &self.cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot exec {}: {e}", self.binary.display());
        });
        // A plugin may exit before reading stdin (a usage error): that shows in its output.
        let _ = child.stdin.take().unwrap().write_all(&self.conf);
        let out = child.wait_with_output().unwrap();
        let took = started.elapsed();
        Exec {
            took,
            ok: out.status.success(),
            stdout: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    /// Execs for a pod in Kubernetes namespace `default` and insists on success (a failed
    /// ADD would make every number meaningless).
    fn must(&self, verb: &str, id: &str, netns: &Path) -> Duration {
        self.must_in(verb, id, "default", netns)
    }

    /// [`Plugin::must`] for a pod in Kubernetes namespace `pod_namespace`.
    fn must_in(&self, verb: &str, id: &str, pod_namespace: &str, netns: &Path) -> Duration {
        self.must_exec(verb, id, pod_namespace, netns).took
    }

    /// [`Plugin::must_in`] returning the whole [`Exec`].
    fn must_exec(&self, verb: &str, id: &str, pod_namespace: &str, netns: &Path) -> Exec {
        let e = self.exec(verb, id, pod_namespace, netns);
        assert!(
            e.ok,
            "{} {verb} {id} failed after {:?}: {}",
            self.label, e.took, e.stdout
        );
        e
    }
}

/// Runs `f` on a new thread that entered the network namespace at `ns` (so processes it
/// spawns start there, as containerd's plugins start in the host's namespace).
fn in_netns<T: Send + 'static>(ns: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
    let file = File::open(ns).unwrap_or_else(|e| panic!("open {}: {e}", ns.display()));
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// Pods attached to each plugin in one turn of the sequential run.
const TURN: usize = 20;

/// The sequential run: `pods` ADDs per plugin, one at a time, then their DELs. The plugins
/// take turns of [`TURN`] pods (the ADDs of all turns before the DELs), so a drift of the
/// machine's load hits them alike while each sees the same number of attached pods; Lace's
/// agent is let go idle before another plugin's turn, so its reconciles are not counted
/// against the others. Returns per plugin the ADD and DEL execs.
fn sequential(
    plugins: &[Arc<Plugin>],
    settle: &dyn Fn(),
    pods: usize,
) -> Vec<(Vec<Exec>, Vec<Exec>)> {
    let namespaces: Vec<PodNamespaces> = (0..plugins.len())
        .map(|i| PodNamespaces::new(&format!("lace-bs{i}-"), pods))
        .collect();
    let mut out: Vec<(Vec<Exec>, Vec<Exec>)> =
        (0..plugins.len()).map(|_| Default::default()).collect();
    for verb in ["ADD", "DEL"] {
        for first in (0..pods).step_by(TURN) {
            for (i, p) in plugins.iter().enumerate() {
                let turn: Vec<(String, PathBuf)> = (first..pods.min(first + TURN))
                    .map(|k| (format!("s{i}-{k}"), PathBuf::from(namespaces[i][k].path())))
                    .collect();
                let p2 = Arc::clone(p);
                let samples = in_netns(&p.node, move || {
                    turn.iter()
                        .map(|(id, ns)| p2.must_exec(verb, id, "default", ns))
                        .collect::<Vec<_>>()
                });
                let (adds, dels) = &mut out[i];
                if verb == "ADD" { adds } else { dels }.extend(samples);
                if p.label.starts_with("lace") {
                    settle();
                }
            }
        }
    }
    out
}

/// ADDs `pods` pods at once (one thread each, released together), then their DELs at once.
fn concurrent(plugin: &Arc<Plugin>, tag: &str, pods: usize) -> (Vec<Duration>, Vec<Duration>) {
    let namespaces = PodNamespaces::new(&format!("lace-b{tag}-"), pods);
    let run_all = |verb: &'static str| -> Vec<Duration> {
        let barrier = Arc::new(std::sync::Barrier::new(pods));
        let threads: Vec<_> = (0..pods)
            .map(|i| {
                let (p, ns, barrier) = (
                    Arc::clone(plugin),
                    PathBuf::from(namespaces[i].path()),
                    Arc::clone(&barrier),
                );
                let id = format!("{tag}-con-{i}");
                let node = plugin.node.clone();
                std::thread::spawn(move || {
                    in_netns(&node, move || {
                        barrier.wait();
                        p.must(verb, &id, &ns)
                    })
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    };
    let adds = run_all("ADD");
    let dels = run_all("DEL");
    (adds, dels)
}

/// `VERSION` execs: the cost of starting the binary at all.
fn exec_floor(plugin: &Arc<Plugin>, runs: usize) -> Vec<Duration> {
    let p = Arc::clone(plugin);
    in_netns(&plugin.node.clone(), move || {
        (0..runs)
            .map(|_| p.must("VERSION", "version", Path::new("/nonexistent")))
            .collect()
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// p50 and p99 in milliseconds.
fn p50_p99(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (
        ms(percentile(&samples, 0.5)),
        ms(percentile(&samples, 0.99)),
    )
}

/// A reference plugin chained with `host-local` in its own node namespace. Both binaries
/// are copied from `cni_dir` into `bin_dir` first: Lace's plugin runs from the bin dir its
/// agent installed it into (local storage), so these must not be read over the VM's 9p root.
fn reference(
    label: &'static str,
    cni_dir: &Path,
    bin_dir: &Path,
    node: &Ns,
    data_dir: &Path,
    conf: Value,
) -> Plugin {
    std::fs::create_dir_all(bin_dir).unwrap();
    for name in [conf["type"].as_str().unwrap(), "host-local"] {
        let from = cni_dir.join(name);
        std::fs::copy(&from, bin_dir.join(name)).unwrap_or_else(|e| {
            panic!(
                "copying {}: {e} (install containernetworking-plugins: netns-tests/vm/setup.sh)",
                from.display()
            )
        });
    }
    let binary = bin_dir.join(conf["type"].as_str().unwrap());
    let mut conf = conf;
    conf["cniVersion"] = json!("1.0.0");
    conf["ipam"]["dataDir"] = json!(data_dir);
    Plugin {
        label,
        binary,
        cni_path: bin_dir.to_owned(),
        conf: conf.to_string().into_bytes(),
        node: PathBuf::from(node.path()),
    }
}

/// Whether this kernel can create a VRF (the agent's ADD needs one).
fn vrf_supported() -> bool {
    let ns = Ns::new(format!("lace-bn-probe-{}", std::process::id()));
    cni_bed::ip_ok(&[
        "-n", &ns.0, "link", "add", "v", "type", "vrf", "table", "10",
    ])
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Sum and count of one of the agent's histograms (`name{labels}`).
fn histogram(metrics: &str, name: &str, labels: &str) -> (f64, f64) {
    let value = |series: &str| -> f64 {
        let key = format!("{name}_{series}{labels} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    (value("sum"), value("count"))
}

/// How many observations of histogram `name` with label `label` (`key="value"`) took over
/// `le` seconds (one of its bucket bounds, as the exposition spells it), and how many there
/// were.
fn over(metrics: &str, name: &str, label: &str, le: &str) -> (f64, f64) {
    let value = |key: String| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let within = value(format!("{name}_bucket{{le=\"{le}\",{label}}} "));
    let count = value(format!("{name}_count{{{label}}} "));
    (count - within, count)
}

struct Row {
    plugin: &'static str,
    mode: String,
    add: (f64, f64),
    del: (f64, f64),
}

fn main() {
    // `cargo bench --workspace` runs this on any host; without root or VRF there is nothing
    // to measure, which is said plainly rather than failing every other benchmark's run.
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !root || !vrf_supported() {
        println!(
            "cni_latency: NOT MEASURED: needs root and a kernel with VRF; run \
             netns-tests/bench-cni.sh (it builds release binaries and runs this in the VM)"
        );
        return;
    }
    let sequential_pods = knob("LACE_BENCH_PODS", 200);
    let concurrent_pods = knob("LACE_BENCH_CONCURRENT", 50);
    let rss_pods = knob("LACE_BENCH_RSS_PODS", 500);
    let cni_dir = std::env::var_os("LACE_BENCH_CNI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/cni"));
    let wanted = std::env::var("LACE_BENCH_PLUGINS").unwrap_or_else(|_| "lace,ptp,bridge".into());
    let wanted: Vec<&str> = wanted.split(',').map(str::trim).collect();

    let bed = Bed::new("bn");
    let agent_pid = bed.agent.as_ref().map(|c| c.id()).unwrap_or_default();
    let idle = memory_kib(agent_pid);
    // An older build of Lace to compare with, in the same run: its own node, agent and
    // state. `Bed` takes its binaries from `LACE_BIN_DIR` when it starts the agent.
    let before = std::env::var_os("LACE_BENCH_BEFORE_DIR").map(|dir| {
        let current = std::env::var_os("LACE_BIN_DIR");
        std::env::set_var("LACE_BIN_DIR", dir);
        let before = Bed::new("bb");
        match current {
            Some(c) => std::env::set_var("LACE_BIN_DIR", c),
            None => std::env::remove_var("LACE_BIN_DIR"),
        }
        before
    });
    let agent_pids: Vec<u32> = [Some(&bed), before.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|b| b.agent.as_ref().map(|c| c.id()))
        .collect();
    let ref_dir = tempfile::tempdir().unwrap();
    let ptp_node = Ns::new(format!("lace-bn-ptp-{}", bed.tag));
    let bridge_node = Ns::new(format!("lace-bn-bridge-{}", bed.tag));

    let mut plugins: Vec<Arc<Plugin>> = Vec::new();
    if wanted.contains(&"lace") {
        plugins.push(Arc::new(Plugin {
            label: "lace",
            binary: bed.p("bin/lace"),
            cni_path: bed.p("bin"),
            // One log line per request (stderr), for its own time.
            conf: bed
                .netconf(json!({"logLevel": "info"}))
                .to_string()
                .into_bytes(),
            node: PathBuf::from(bed.node.path()),
        }));
    }
    if let Some(b) = &before {
        plugins.push(Arc::new(Plugin {
            label: "lace (before)",
            binary: b.p("bin/lace"),
            cni_path: b.p("bin"),
            conf: b.netconf(json!({})).to_string().into_bytes(),
            node: PathBuf::from(b.node.path()),
        }));
    }
    if wanted.contains(&"ptp") {
        plugins.push(Arc::new(reference(
            "ptp + host-local",
            &cni_dir,
            &ref_dir.path().join("bin"),
            &ptp_node,
            &ref_dir.path().join("ptp"),
            json!({
                "name": "bench-ptp", "type": "ptp", "ipMasq": false, "mtu": 1436,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.100.0.0/16"}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            }),
        )));
    }
    if wanted.contains(&"bridge") {
        plugins.push(Arc::new(reference(
            "bridge + host-local",
            &cni_dir,
            &ref_dir.path().join("bin"),
            &bridge_node,
            &ref_dir.path().join("bridge"),
            json!({
                "name": "bench-bridge", "type": "bridge", "bridge": "cni0",
                "isGateway": true, "ipMasq": false, "mtu": 1436,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.101.0.0/16"}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            }),
        )));
    }

    let floors: Vec<(&str, f64)> = plugins
        .iter()
        .map(|p| (p.label, p50_p99(exec_floor(p, 20)).0))
        .collect();

    let agent_cpu = || -> u64 {
        // utime + stime of every thread of the agents (fields 14 and 15 of /proc/<pid>/stat,
        // after the command name in parentheses).
        agent_pids
            .iter()
            .map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
                let f: Vec<u64> = rest
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0)
            })
            .sum()
    };
    // Lace's agent goes on working after an answer (the dataplane reconcile): wait until it
    // has used no CPU for 300 ms (at most 10 s).
    let settle = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = agent_cpu();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(300));
            let now = agent_cpu();
            if now == last {
                return;
            }
            last = now;
        }
    };

    let mut rows = Vec::new();
    let mut split = String::new();
    eprintln!("cni_latency: {sequential_pods} sequential pods per plugin, in turns of {TURN}");
    for (p, (adds, dels)) in plugins
        .iter()
        .zip(sequential(&plugins, &settle, sequential_pods))
    {
        // Lace's ADDs split into the plugin's own part and the rest (exec, start, exit).
        let own: Vec<(Duration, Duration)> = adds
            .iter()
            .filter_map(|e| e.own().map(|own| (own, e.took.saturating_sub(own))))
            .collect();
        if p.label == "lace" {
            assert_eq!(
                own.len(),
                adds.len(),
                "every Lace ADD logs its own time at logLevel info"
            );
            let (plugin, rest): (Vec<_>, Vec<_>) = own.into_iter().unzip();
            let ((p50, p99), (rest50, rest99)) = (p50_p99(plugin), p50_p99(rest));
            split = format!(
                "lace sequential ADD: the plugin's own time (its log line) p50 {p50:.1} ms, p99 \
                 {p99:.1} ms; the rest (exec, start, exit) p50 {rest50:.1} ms, p99 {rest99:.1} ms"
            );
        }
        let took = |execs: Vec<Exec>| execs.into_iter().map(|e| e.took).collect();
        rows.push(Row {
            plugin: p.label,
            mode: format!("{sequential_pods} sequential"),
            add: p50_p99(took(adds)),
            del: p50_p99(took(dels)),
        });
    }
    // The agent-side share of Lace's sequential ADDs, before the concurrent ones blur it.
    let sequential_metrics = bed.metrics();
    for (i, p) in plugins.iter().enumerate() {
        eprintln!("cni_latency: {}: {concurrent_pods} concurrent", p.label);
        let (adds, dels) = concurrent(p, &format!("c{i}"), concurrent_pods);
        settle();
        rows.push(Row {
            plugin: p.label,
            mode: format!("{concurrent_pods} concurrent"),
            add: p50_p99(adds),
            del: p50_p99(dels),
        });
    }

    // Memory with many pods: attach them (8 at a time, not measured) to the example's three
    // pod Networks in turn, read, detach.
    let mut loaded = (0, 0);
    if let Some(lace) = plugins.iter().find(|p| p.label == "lace") {
        eprintln!("cni_latency: lace: {rss_pods} pods for the agent's RSS");
        let namespaces = PodNamespaces::new("lace-br-", rss_pods);
        let run = |verb: &'static str| {
            let chunks: Vec<Vec<(usize, PathBuf)>> = (0..rss_pods)
                .map(|i| (i, PathBuf::from(namespaces[i].path())))
                .collect::<Vec<_>>()
                .chunks(rss_pods.div_ceil(8).max(1))
                .map(<[_]>::to_vec)
                .collect();
            let threads: Vec<_> = chunks
                .into_iter()
                .map(|chunk| {
                    let p = Arc::clone(lace);
                    let node = lace.node.clone();
                    std::thread::spawn(move || {
                        in_netns(&node, move || {
                            for (i, ns) in chunk {
                                // Three Networks (one /24 per node each) hold 500 pods.
                                let namespace = ["default", "kube-system", "team-a"][i % 3];
                                p.must_in(verb, &format!("rss-{i}"), namespace, &ns);
                            }
                        })
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        };
        run("ADD");
        std::thread::sleep(Duration::from_secs(2)); // let the reconcile after the last ADD finish
        loaded = memory_kib(agent_pid);
        run("DEL");
    }

    println!();
    println!("| plugin              | mode           | ADD p50 ms | ADD p99 ms | DEL p50 ms | DEL p99 ms |");
    println!("|---------------------|----------------|-----------:|-----------:|-----------:|-----------:|");
    for r in &rows {
        println!(
            "| {:<19} | {:<14} | {:>10.1} | {:>10.1} | {:>10.1} | {:>10.1} |",
            r.plugin, r.mode, r.add.0, r.add.1, r.del.0, r.del.1
        );
    }
    println!();
    let find = |plugin: &str, mode: &str| {
        rows.iter()
            .find(|r| r.plugin == plugin && r.mode.ends_with(mode))
    };
    for mode in ["sequential", "concurrent"] {
        if let Some(lace) = find("lace", mode) {
            let ratio = find("ptp + host-local", mode)
                .map(|ptp| format!("{:.2}", lace.add.0 / ptp.add.0))
                .unwrap_or_else(|| "n/a".into());
            println!(
                "lace {mode}: ADD p50 / ptp ADD p50 = {ratio} (target <= 1), \
                 ADD p99 / ADD p50 = {:.2} (target < 2)",
                lace.add.1 / lace.add.0
            );
        }
    }
    let floors: Vec<String> = floors
        .iter()
        .map(|(l, ms)| format!("{l} {ms:.1} ms"))
        .collect();
    println!("exec floor (VERSION p50): {}", floors.join(", "));
    if plugins.iter().any(|p| p.label == "lace") {
        for verb in ["ADD", "DEL"] {
            let (sum, count) = histogram(
                &sequential_metrics,
                "lace_cni_request_duration_seconds",
                &format!("{{verb=\"{verb}\"}}"),
            );
            println!(
                "lace agent-side {verb} mean over the sequential run: {:.1} ms ({count} requests)",
                sum / count * 1000.0
            );
        }
        let phases: Vec<String> = ["ipam", "pod", "host"]
            .iter()
            .map(|phase| {
                let (sum, count) = histogram(
                    &sequential_metrics,
                    "lace_cni_add_phase_seconds",
                    &format!("{{phase=\"{phase}\"}}"),
                );
                format!("{phase} {:.1} ms", sum / count * 1000.0)
            })
            .collect();
        println!("lace agent-side ADD phases (mean): {}", phases.join(", "));
        println!("{split}");
        // Whether the sequential ADD's tail is the agent's handling (e.g. the host phase
        // waiting for the namespace's worker while it runs a reconcile) or outside it.
        let (slow, n) = over(
            &sequential_metrics,
            "lace_cni_request_duration_seconds",
            "verb=\"ADD\"",
            "0.05",
        );
        let (slow_host, _) = over(
            &sequential_metrics,
            "lace_cni_add_phase_seconds",
            "phase=\"host\"",
            "0.05",
        );
        println!(
            "lace agent-side ADDs over 50 ms in the sequential run: {slow} of {n} (host phase \
             over 50 ms: {slow_host})"
        );
        let (sum, count) = histogram(&sequential_metrics, "lace_reconcile_duration_seconds", "");
        println!(
            "lace dataplane reconciles during the sequential run: {count}, mean {:.1} ms \
             (asynchronous: after an ADD is answered, not part of it)",
            sum / count * 1000.0
        );
        println!(
            "lace-agent memory: idle VmRSS {} KiB (VmHWM {}); with {rss_pods} pods VmRSS {} KiB \
             (VmHWM {})",
            idle.0, idle.1, loaded.0, loaded.1
        );
    }
}
