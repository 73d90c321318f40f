//! The controller's test helpers, for its tests and its benchmark: the objects they put into
//! the fake API server (`lace-fake-kube`) and a [`Harness`] that runs the controller against
//! it and waits until it has settled.
#![allow(dead_code)] // each test binary uses a part

use std::sync::Arc;
use std::time::Duration;

use lace_controller::{FatalError, Metrics, Progress, Settings};
use lace_fake_kube::{ClientId, FakeApi};
use serde_json::{json, Value};

pub const PREFIX: &str = "2001:db8:100::/48";

/// A Node with these InternalIPs.
pub fn node(name: &str, ips: &[&str]) -> Value {
    let addresses: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .chain([json!({"type": "Hostname", "address": name})])
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    })
}

/// A Network with these `(cidr, blockPrefix)` subnets (none: external).
pub fn network(name: &str, subnets: &[(&str, u8)]) -> Value {
    let spec = if subnets.is_empty() {
        json!({"external": true})
    } else {
        let subnets: Vec<Value> = subnets
            .iter()
            .map(|(c, b)| json!({"cidr": c, "blockPrefix": b}))
            .collect();
        json!({"subnets": subnets})
    };
    json!({"apiVersion": "lace.io/v1alpha1", "kind": "Network", "metadata": {"name": name}, "spec": spec})
}

/// A Lace policy of `kind` with `spec`.
pub fn policy(kind: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "lace.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec})
}

// ---------------------------------------------------------------- the controller under test

/// A controller running against a [`FakeApi`].
pub struct Harness {
    pub fake: FakeApi,
    pub metrics: Arc<Metrics>,
    client: ClientId,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), FatalError>>,
}

/// How long a test waits for the controller before it fails.
const PATIENCE: Duration = Duration::from_secs(60);

impl Harness {
    /// Starts the controller with `prefix` (and fast retries).
    pub fn start(fake: &FakeApi, prefix: &str) -> Self {
        let mut settings = Settings::new(prefix.parse().unwrap());
        settings.retry_min = Duration::from_millis(20);
        settings.retry_max = Duration::from_millis(200);
        Self::with_settings(fake, settings)
    }

    pub fn with_settings(fake: &FakeApi, settings: Settings) -> Self {
        let metrics = Arc::new(Metrics::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = fake.service();
        let id = service.id();
        let task = tokio::spawn(lace_controller::run(
            kube::Client::new(service, "default"),
            settings,
            metrics.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            fake: fake.clone(),
            metrics,
            client: id,
            stop: Some(stop),
            task,
        }
    }

    /// Waits until the controller is synced, has nothing pending and has taken in every
    /// watch event the fake delivered (its own writes' echoes included).
    pub async fn settle(&self) -> Progress {
        let mut rx = self.metrics.progress();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let p = rx.borrow_and_update().clone();
            if p.synced
                && p.passes > 0
                && !p.pending
                && p.watch_events >= self.fake.sent(self.client)
            {
                return p;
            }
            if self.task.is_finished() {
                panic!("the controller stopped while the test waited for it: {p:?}");
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "the controller did not settle: {p:?}, fake sent {}",
                    self.fake.sent(self.client)
                );
            }
            let _ = tokio::time::timeout(Duration::from_millis(20), rx.changed()).await;
        }
    }

    /// Stops the controller (as SIGTERM does) and returns how it ended.
    pub async fn stop(mut self) -> Result<(), FatalError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the controller stops")
            .expect("the controller task does not panic")
    }

    /// Waits for the controller to end by itself (a fatal error).
    pub async fn ended(self) -> Result<(), FatalError> {
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the controller ends")
            .expect("the controller task does not panic")
    }
}
