//! The own Node's `NetworkUnavailable` condition: set to `False` with reason `LaceIsUp` once
//! the dataplane has applied a plan (what Cilium and Calico do; some platforms keep a node
//! unschedulable until a network plugin says so). One strategic-merge patch of `nodes/status`
//! (the conditions merge by `type`); nothing is written while the watched Node already says
//! so, and it is written again if something else flips it back.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use tokio::sync::watch;

use super::connect::{explain, ApiServer};
use super::watch::{Backoff, Condition, NETWORK_UNAVAILABLE};
use crate::k8s::Slim;
use crate::objects::NodeBody;

/// The reason Lace gives.
pub(super) const REASON: &str = "LaceIsUp";

/// Whether `condition` already says the network is available because Lace is up.
fn is_lace_up(condition: &Option<Condition>) -> bool {
    condition
        .as_ref()
        .is_some_and(|c| c.status == "False" && c.reason == REASON)
}

async fn patch(client: &Client, node: &str) -> Result<(), kube::Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let patch = serde_json::json!({
        "status": {"conditions": [{
            "type": NETWORK_UNAVAILABLE,
            "status": "False",
            "reason": REASON,
            "message": "Lace is running on this node",
            "lastTransitionTime": now,
            "lastHeartbeatTime": now,
        }]}
    });
    let params = PatchParams {
        field_manager: Some("lace-agent".into()),
        ..PatchParams::default()
    };
    Api::<Slim<NodeBody>>::all_with(client.clone(), &())
        .patch_status(node, &params, &Patch::Strategic(patch))
        .await
        .map(drop)
}

/// Keeps the condition set once `applied` (successful dataplane applies) is above zero.
/// `observed` is the watched Node's condition: `None` until the Node is seen, `Some(None)`
/// when it has no such condition.
pub(super) async fn keep_network_available(
    client: Client,
    api: ApiServer,
    node: String,
    mut applied: watch::Receiver<u64>,
    mut observed: watch::Receiver<Option<Option<Condition>>>,
    mut backoff: Backoff,
) {
    if applied.wait_for(|n| *n > 0).await.is_err() {
        return;
    }
    loop {
        let current = observed.borrow_and_update().clone();
        if let Some(condition) = current {
            if !is_lace_up(&condition) {
                match patch(&client, &node).await {
                    Ok(()) => {
                        tracing::info!(node = %node, "node programmed: Node condition {NETWORK_UNAVAILABLE}=False ({REASON})");
                        backoff.reset();
                    }
                    Err(e) => {
                        let delay = backoff.next_delay();
                        let why = explain(&e, &format!("patch nodes/{node}/status"), &api);
                        tracing::warn!(node = %node, error = %why, retry_in = ?delay, "cannot set the Node's {NETWORK_UNAVAILABLE} condition; retrying");
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                }
            }
        }
        if observed.changed().await.is_err() {
            return;
        }
    }
}
