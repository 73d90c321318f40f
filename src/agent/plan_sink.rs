//! [`PlanSink`]: a [`Dataplane`] without a kernel, for tests and benchmarks of what the agent
//! plans (built with `cfg(test)` or the `testing` feature, never into the agent).

use std::path::Path;

use super::reconcile::{Dataplane, DataplaneError, Planning};
use crate::dataplane::{ApplyReport, Drift, NftState, ObservedNode, PodInterface, PodLinkState};
use crate::plan::DesiredNode;

/// A dataplane without a kernel, for tests and benchmarks of what the agent plans: each plan
/// goes to the callback (by default: logged), pods get no interfaces, and the "kernel" holds
/// nothing.
pub struct PlanSink(Box<dyn Fn(&DesiredNode) + Send + Sync>);

impl PlanSink {
    /// Hands each plan to `f`.
    pub fn new(f: impl Fn(&DesiredNode) + Send + Sync + 'static) -> Self {
        Self(Box::new(f))
    }
}

impl Default for PlanSink {
    fn default() -> Self {
        Self::new(|plan| {
            tracing::debug!(
                node = %plan.node,
                vrfs = plan.base.vrfs.len(),
                pod_routes = plan.pod_routes.len(),
                "dataplane: no reconciler plugged in, plan not applied"
            )
        })
    }
}

impl std::fmt::Debug for PlanSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlanSink")
    }
}

impl Dataplane for PlanSink {
    fn reconcile(
        &self,
        plan: Planning,
        _resync: bool,
    ) -> Result<Option<ApplyReport>, DataplaneError> {
        Ok(plan().map(|plan| {
            (self.0)(&plan);
            ApplyReport::default()
        }))
    }

    fn on_drift(&self, _handler: Box<dyn Fn(Drift) + Send + Sync>) {}

    fn create_pod_interface(
        &self,
        _pod_ns: &Path,
        _pod: &PodInterface,
    ) -> Result<Option<Vec<u8>>, DataplaneError> {
        Ok(None)
    }

    fn attach(&self, _pods: DesiredNode) -> Result<ApplyReport, DataplaneError> {
        Ok(ApplyReport::default())
    }

    fn delete_links(&self, _names: Vec<String>) -> Result<Vec<String>, DataplaneError> {
        Ok(Vec::new())
    }

    fn delete_pod_links(
        &self,
        _pod_ns: &Path,
        _names: &[String],
    ) -> Result<Vec<String>, DataplaneError> {
        Ok(Vec::new())
    }

    /// What a new namespace's `lo` looks like once up (nothing is changed anywhere).
    fn loopback_up(&self, _pod_ns: &Path) -> Result<PodLinkState, DataplaneError> {
        Ok(PodLinkState {
            up: true,
            mtu: Some(65536),
            addresses: vec![
                "127.0.0.1/8".parse().expect("literal"),
                "::1/128".parse().expect("literal"),
            ],
            routes: Vec::new(),
        })
    }

    fn inspect_pod_link(
        &self,
        _pod_ns: &Path,
        _ifname: &str,
    ) -> Result<Option<PodLinkState>, DataplaneError> {
        Ok(None)
    }

    fn snapshot(&self) -> Result<ObservedNode, DataplaneError> {
        Ok(ObservedNode {
            links: Default::default(),
            addrs: Vec::new(),
            routes: Default::default(),
            host_routes: Vec::new(),
            rules: Vec::new(),
            sysctls: Default::default(),
            tunsrc: None,
            fou: None,
            nft: NftState::Absent,
            tc: Default::default(),
        })
    }
}
