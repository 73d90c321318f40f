//! Prometheus metrics and the health endpoint, over plain HTTP/1.1 on a tokio `TcpListener`
//! (two fixed paths do not need a web framework).
//!
//! - `lace_cni_requests_total{verb,result}`: CNI requests by verb and outcome (`ok`, or the
//!   CNI error code);
//! - `lace_cni_request_duration_seconds{verb}`: histogram of the agent-side handling time;
//! - `lace_cni_add_phase_seconds{phase}`: where a successful ADD's time goes: `ipam`
//!   (allocate and persist), `pod` (veth and pod-side configuration, in the pod's
//!   namespace), `host` (VRF, enslavement and host routes, in the node's namespace);
//! - `lace_reconciles_total`, `lace_reconcile_errors_total`,
//!   `lace_reconcile_duration_seconds` (histogram);
//! - `lace_dataplane_drift_total`: times the kernel's notifications showed something Lace
//!   applied changed without Lace (each schedules a repair);
//! - `lace_dataplane_drift_throttled_total`: drift repairs delayed by the rate limit
//!   (something keeps undoing Lace's objects);
//! - `lace_dataplane_resyncs_total`: periodic full resyncs;
//! - `lace_addresses_in_use{network}`: pod addresses held on this node;
//! - `lace_ready`: 1 when ADD can be served.
//!
//! `/healthz` answers 200 when the agent is ready, 503 with the reason otherwise.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// A cumulative histogram in Prometheus' sense.
#[derive(Clone, Debug, Default)]
struct Histogram {
    /// Per bucket of [`BUCKETS`], the observations at or below its bound (not cumulative
    /// yet; made cumulative when rendered).
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum += s;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (b, c) in BUCKETS.iter().zip(self.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

#[derive(Debug, Default)]
struct Inner {
    requests: BTreeMap<(&'static str, String), u64>,
    latency: BTreeMap<&'static str, Histogram>,
    add_phases: BTreeMap<&'static str, Histogram>,
    reconciles: u64,
    reconcile_errors: u64,
    reconcile_latency: Histogram,
    drift: u64,
    drift_throttled: u64,
    resyncs: u64,
}

/// The agent's counters. Cheap to update from any task.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Inner)) {
        // A poisoned lock only means another update panicked midway: the counters are still
        // usable, so keep counting.
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g);
    }

    /// Records one CNI request: `result` is `ok` or the CNI error code.
    pub fn cni_request(&self, verb: &'static str, result: String, took: Duration) {
        self.with(|m| {
            *m.requests.entry((verb, result)).or_default() += 1;
            m.latency.entry(verb).or_default().observe(took);
        });
    }

    /// Records how long one phase of a successful ADD took (`ipam`, `pod`, `host`).
    pub fn add_phase(&self, phase: &'static str, took: Duration) {
        self.with(|m| m.add_phases.entry(phase).or_default().observe(took));
    }

    /// Records one completed dataplane apply.
    pub fn reconciled(&self, took: Duration) {
        self.with(|m| {
            m.reconciles += 1;
            m.reconcile_latency.observe(took);
        });
    }

    /// Records one failed plan or apply.
    pub fn reconcile_failed(&self) {
        self.with(|m| m.reconcile_errors += 1);
    }

    /// Records one drift report of the dataplane.
    pub fn dataplane_drift(&self) {
        self.with(|m| m.drift += 1);
    }

    /// Records one drift repair delayed by the rate limit.
    pub fn dataplane_drift_throttled(&self) {
        self.with(|m| m.drift_throttled += 1);
    }

    /// Records one periodic full resync.
    pub fn dataplane_resync(&self) {
        self.with(|m| m.resyncs += 1);
    }

    /// The Prometheus text exposition, with the gauges passed in.
    pub fn render(&self, in_use: &BTreeMap<String, usize>, ready: bool) -> String {
        let m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        out.push_str("# HELP lace_cni_requests_total CNI requests handled by the agent.\n");
        out.push_str("# TYPE lace_cni_requests_total counter\n");
        for ((verb, result), n) in &m.requests {
            let _ = writeln!(
                out,
                "lace_cni_requests_total{{verb=\"{verb}\",result=\"{result}\"}} {n}"
            );
        }
        out.push_str("# HELP lace_cni_request_duration_seconds Agent-side CNI handling time.\n");
        out.push_str("# TYPE lace_cni_request_duration_seconds histogram\n");
        for (verb, h) in &m.latency {
            h.render(
                &mut out,
                "lace_cni_request_duration_seconds",
                &format!("verb=\"{verb}\""),
            );
        }
        out.push_str("# HELP lace_cni_add_phase_seconds Time of each phase of successful ADDs.\n");
        out.push_str("# TYPE lace_cni_add_phase_seconds histogram\n");
        for (phase, h) in &m.add_phases {
            h.render(
                &mut out,
                "lace_cni_add_phase_seconds",
                &format!("phase=\"{phase}\""),
            );
        }
        out.push_str("# HELP lace_reconciles_total Dataplane applies.\n");
        out.push_str("# TYPE lace_reconciles_total counter\n");
        let _ = writeln!(out, "lace_reconciles_total {}", m.reconciles);
        out.push_str("# HELP lace_reconcile_errors_total Failed plans or applies.\n");
        out.push_str("# TYPE lace_reconcile_errors_total counter\n");
        let _ = writeln!(out, "lace_reconcile_errors_total {}", m.reconcile_errors);
        out.push_str("# HELP lace_reconcile_duration_seconds Dataplane apply time.\n");
        out.push_str("# TYPE lace_reconcile_duration_seconds histogram\n");
        m.reconcile_latency
            .render(&mut out, "lace_reconcile_duration_seconds", "");
        for (name, help, n) in [
            (
                "lace_dataplane_drift_total",
                "Changes to what Lace applied made without Lace, seen in kernel notifications.",
                m.drift,
            ),
            (
                "lace_dataplane_drift_throttled_total",
                "Drift repairs delayed by the rate limit.",
                m.drift_throttled,
            ),
            (
                "lace_dataplane_resyncs_total",
                "Periodic full resyncs of the dataplane.",
                m.resyncs,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {n}"
            );
        }
        out.push_str("# HELP lace_addresses_in_use Pod addresses held on this node.\n");
        out.push_str("# TYPE lace_addresses_in_use gauge\n");
        for (network, n) in in_use {
            let _ = writeln!(out, "lace_addresses_in_use{{network=\"{network}\"}} {n}");
        }
        out.push_str("# HELP lace_ready 1 when the agent can serve CNI ADD.\n");
        out.push_str("# TYPE lace_ready gauge\n");
        let _ = writeln!(out, "lace_ready {}", u8::from(ready));
        out
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until the task is dropped.
pub(crate) async fn serve(listener: TcpListener, agent: Arc<super::Agent>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let agent = Arc::clone(&agent);
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &agent).await {
                tracing::debug!(%peer, error = %e, "metrics: connection failed");
            }
        });
    }
}

async fn answer(stream: tokio::net::TcpStream, agent: &super::Agent) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read).take(8192);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await?;
    // Drain the headers so the client sees a clean close.
    let mut line = String::new();
    while reader.read_line(&mut line).await? > 2 {
        line.clear();
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("");
    let (status, content_type, body) = match path {
        "/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4",
            agent
                .metrics
                .render(&agent.ipam.in_use().unwrap_or_default(), agent.is_ready()),
        ),
        "/healthz" => match agent.not_ready_reason() {
            None => ("200 OK", "text/plain", "ok\n".to_owned()),
            Some(why) => (
                "503 Service Unavailable",
                "text/plain",
                format!("not ready: {why}\n"),
            ),
        },
        _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    write.write_all(head.as_bytes()).await?;
    write.write_all(body.as_bytes()).await?;
    write.shutdown().await
}

/// Binds the metrics listener (a separate step so a bad address fails the start).
pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_counts_and_buckets() {
        let m = Metrics::default();
        m.cni_request("ADD", "ok".into(), Duration::from_micros(700));
        m.cni_request("ADD", "ok".into(), Duration::from_millis(30));
        m.cni_request("ADD", "11".into(), Duration::from_secs(10));
        m.add_phase("ipam", Duration::from_millis(3));
        m.reconciled(Duration::from_millis(2));
        m.reconcile_failed();
        m.dataplane_drift();
        m.dataplane_drift();
        m.dataplane_drift_throttled();
        let text = m.render(&BTreeMap::from([("default".to_owned(), 3)]), true);
        assert!(text.contains("lace_cni_requests_total{verb=\"ADD\",result=\"ok\"} 2\n"));
        assert!(text.contains("lace_cni_requests_total{verb=\"ADD\",result=\"11\"} 1\n"));
        // Cumulative: 1 at <=1ms, 2 at <=50ms, 2 at <=5s (10 s is above every bound), 3 total.
        assert!(text
            .contains("lace_cni_request_duration_seconds_bucket{verb=\"ADD\",le=\"0.001\"} 1\n"));
        assert!(
            text.contains("lace_cni_request_duration_seconds_bucket{verb=\"ADD\",le=\"0.05\"} 2\n")
        );
        assert!(
            text.contains("lace_cni_request_duration_seconds_bucket{verb=\"ADD\",le=\"5\"} 2\n")
        );
        assert!(
            text.contains("lace_cni_request_duration_seconds_bucket{verb=\"ADD\",le=\"+Inf\"} 3\n")
        );
        assert!(text.contains("lace_cni_request_duration_seconds_count{verb=\"ADD\"} 3\n"));
        assert!(
            text.contains("lace_cni_add_phase_seconds_bucket{phase=\"ipam\",le=\"0.0025\"} 0\n")
        );
        assert!(text.contains("lace_cni_add_phase_seconds_bucket{phase=\"ipam\",le=\"0.005\"} 1\n"));
        assert!(text.contains("lace_cni_add_phase_seconds_sum{phase=\"ipam\"} 0.003\n"));
        assert!(text.contains("lace_reconciles_total 1\n"));
        assert!(text.contains("lace_reconcile_errors_total 1\n"));
        assert!(text.contains("lace_reconcile_duration_seconds_count 1\n"));
        assert!(text.contains("lace_dataplane_drift_total 2\n"));
        assert!(text.contains("lace_dataplane_drift_throttled_total 1\n"));
        assert!(text.contains("lace_dataplane_resyncs_total 0\n"));
        assert!(text.contains("lace_addresses_in_use{network=\"default\"} 3\n"));
        assert!(text.contains("lace_ready 1\n"));
        // Every sample line is `name{labels} value` or `name value` with a numeric value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
