//! CNI ADD and DEL latency as the runtime sees it (exec of the real `lace` plugin, agent
//! round trip, veth, addresses, VRF, routes), plus the agent's RSS.
//!
//! Root and a VRF-capable kernel (the VM): `cargo test -p lace-netns-tests --bench
//! cni_latency --no-run` builds it, then run the printed executable in the VM. Knobs:
//! `LACE_BENCH_PODS` (sequential pods, default 200), `LACE_BENCH_CONCURRENT` (pods added at
//! once, default 50), `LACE_BIN_DIR` (where `lace` and `lace-agent` are; use release builds
//! for numbers worth comparing).

#[path = "../tests/cni_bed/mod.rs"]
mod cni_bed;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_bed::{Bed, Ns};

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn row(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "| {what:<24} | {:>5} | {:>9.2} | {:>9.2} | {:>9.2} |",
        samples.len(),
        ms(percentile(&samples, 0.5)),
        ms(percentile(&samples, 0.99)),
        ms(*samples.last().unwrap())
    );
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

/// Whether this kernel can create a VRF (the agent's ADD needs one).
fn vrf_supported() -> bool {
    let ns = Ns::new(format!("lace-bn-probe-{}", std::process::id()));
    cni_bed::ip_ok(&[
        "-n", &ns.0, "link", "add", "v", "type", "vrf", "table", "10",
    ])
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
            "cni_latency: NOT MEASURED: needs root and a kernel with VRF; build with `cargo \
             test -p lace-netns-tests --bench cni_latency --no-run` and run it in the VM"
        );
        return;
    }
    let sequential = knob("LACE_BENCH_PODS", 200);
    let concurrent = knob("LACE_BENCH_CONCURRENT", 50);
    let bed = Arc::new(Bed::new("bn"));
    let idle_rss = bed.agent_rss_kib();

    let pods: Vec<Ns> = (0..sequential)
        .map(|i| Ns::new(format!("lace-bn-{i}-{}", bed.tag)))
        .collect();
    let adds: Vec<Duration> = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| timed(|| drop(bed.add(&format!("seq-{i}"), pod))))
        .collect();
    let full_rss = bed.agent_rss_kib();
    let dels: Vec<Duration> = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| timed(|| bed.del(&format!("seq-{i}"), &pod.path())))
        .collect();
    drop(pods);

    let pods: Vec<Arc<Ns>> = (0..concurrent)
        .map(|i| Arc::new(Ns::new(format!("lace-bc-{i}-{}", bed.tag))))
        .collect();
    let run_all = |verb: &'static str| -> Vec<Duration> {
        let threads: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let (bed, pod) = (Arc::clone(&bed), Arc::clone(pod));
                std::thread::spawn(move || {
                    let id = format!("con-{i}");
                    timed(|| match verb {
                        "ADD" => drop(bed.add(&id, &pod)),
                        _ => bed.del(&id, &pod.path()),
                    })
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    };
    let cadds = run_all("ADD");
    let cdels = run_all("DEL");

    println!("| operation                | pods  |  p50 (ms) |  p99 (ms) |  max (ms) |");
    println!("|--------------------------|-------|-----------|-----------|-----------|");
    row("ADD sequential", adds);
    row("DEL sequential", dels);
    row(&format!("ADD {concurrent} concurrent"), cadds);
    row(&format!("DEL {concurrent} concurrent"), cdels);
    println!();
    // The agent's own share (socket to answer), from its histogram: the rest is the plugin's
    // exec and the runtime side.
    let metrics = bed.metrics();
    for verb in ["ADD", "DEL"] {
        let value = |series: &str| -> f64 {
            let key = format!("lace_cni_request_duration_seconds_{series}{{verb=\"{verb}\"}} ");
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(key.as_str()))
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN)
        };
        println!(
            "agent-side {verb} mean over all runs: {:.2} ms",
            value("sum") / value("count") * 1000.0
        );
    }
    println!("agent RSS: idle {idle_rss} KiB, with {sequential} pods {full_rss} KiB");
}
