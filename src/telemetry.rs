//! The HTTP endpoint the agent and the controller share: Prometheus `/metrics`
//! (`prometheus-client`'s OpenMetrics text), `/healthz` and `/readyz` (axum); and their
//! logging ([`init_logging`]).
//!
//! Each component implements [`Probes`]: its registry, what "healthy" and "ready" mean for
//! it, and the gauges it computes at scrape time.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of Lace's latency histograms' buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// The content type of the OpenMetrics text `prometheus-client` encodes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the endpoint serves for one component.
pub trait Probes: Send + Sync + 'static {
    /// Why the component is not healthy or not ready, in its own terms (the 503's body).
    type NotReady: std::fmt::Display;
    /// The metrics `/metrics` encodes.
    fn registry(&self) -> &Registry;
    /// `/healthz`: `Ok` when healthy, else why not (served as 503).
    fn healthz(&self) -> Result<(), Self::NotReady>;
    /// `/readyz`: `Ok` when ready for work, else why not (served as 503).
    fn readyz(&self) -> Result<(), Self::NotReady>;
    /// Brings the gauges computed at scrape time up to date (called before encoding).
    fn refresh(&self) {}
}

/// The routes: `/metrics`, `/healthz`, `/readyz`.
pub fn router<P: Probes>(probes: Arc<P>) -> Router {
    Router::new()
        .route("/metrics", get(metrics::<P>))
        .route(
            "/healthz",
            get(|State(p): State<Arc<P>>| async move { probe(p.healthz()) }),
        )
        .route(
            "/readyz",
            get(|State(p): State<Arc<P>>| async move { probe(p.readyz()) }),
        )
        .with_state(probes)
}

async fn metrics<P: Probes>(State(probes): State<Arc<P>>) -> Response {
    probes.refresh();
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, probes.registry()) {
        Ok(()) => ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}\n"),
        )
            .into_response(),
    }
}

fn probe(result: Result<(), impl std::fmt::Display>) -> Response {
    match result {
        Ok(()) => "ok\n".into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// Binds the endpoint's listener (a separate step, so a bad or taken address fails the start
/// with the address named).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves `probes` on `listener` until the task is dropped.
pub async fn serve<P: Probes>(listener: tokio::net::TcpListener, probes: Arc<P>) {
    if let Err(e) = axum::serve(listener, router(probes)).await {
        tracing::error!(error = %e, "metrics endpoint stopped");
    }
}

/// Logs to stderr, filtered by `LACE_LOG` (an `EnvFilter`, default `info`): the agent's and
/// the controller's logging.
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("LACE_LOG")
                // kube's client logs every failed request at ERROR without context; the
                // agent and the controller log each failure once, explained.
                .unwrap_or_else(|_| EnvFilter::new("info,kube_client::client::builder=off")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: `kubectl logs` and log collectors get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Encodes `registry` as `/metrics` would (tests, benches).
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail; an encoding error would be a bug in a metric.
    prometheus_client::encoding::text::encode(&mut text, registry)
        .expect("metrics encode into a String");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    struct Fixed {
        registry: Registry,
        ready: Result<(), &'static str>,
        counter: Counter,
    }

    impl Probes for Fixed {
        type NotReady = &'static str;
        fn registry(&self) -> &Registry {
            &self.registry
        }
        fn healthz(&self) -> Result<(), &'static str> {
            Ok(())
        }
        fn readyz(&self) -> Result<(), &'static str> {
            self.ready
        }
        fn refresh(&self) {
            self.counter.inc();
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let content_type = head
            .lines()
            .find_map(|l| l.strip_prefix("content-type: "))
            .unwrap_or_default()
            .to_string();
        (status, content_type, body.to_string())
    }

    #[tokio::test]
    async fn serves_metrics_and_both_probes() {
        let counter = Counter::default();
        let mut registry = Registry::default();
        registry.register("lace_scrapes", "Scrapes seen.", counter.clone());
        let probes = Arc::new(Fixed {
            registry,
            ready: Err("caches not synced"),
            counter,
        });
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, probes));
        let (status, ct, body) = get(addr, "/metrics").await;
        assert_eq!((status, ct.as_str()), (200, OPENMETRICS));
        assert!(body.contains("lace_scrapes_total 1\n"), "{body}");
        assert!(body.ends_with("# EOF\n"));
        assert!(
            get(addr, "/metrics")
                .await
                .2
                .contains("lace_scrapes_total 2\n"),
            "refreshed per scrape"
        );
        assert_eq!(get(addr, "/healthz").await.0, 200);
        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (503, "not ready: caches not synced\n")
        );
        assert_eq!(get(addr, "/nope").await.0, 404);
    }
}
