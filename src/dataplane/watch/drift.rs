//! Drift bookkeeping: what Lace last applied ([`Applied`]: the last plan reconciled and the
//! pods attached since) and how the kernel, as notified, differs from it ([`Drift`]). Lace's
//! own writes echoing back and changes to foreign objects are not drift: the pure
//! [`diff::drift`] of what was applied against the notified state says what is.

use std::sync::{Arc, Mutex};

use crate::dataplane::diff;
use crate::dataplane::observed::ObservedNode;
use crate::plan::{DesiredNode, Nexthop};

/// What Lace last applied: the last plan reconciled, and the pods attached since (of pods,
/// only those whose host veth exists). Notifications that make the kernel differ from it
/// are drift; changes to anything else, and Lace's own writes echoing back, are not.
#[derive(Debug, Default)]
pub struct Applied(pub(super) Option<DesiredNode>);

impl Applied {
    /// What a reconcile of `plan` against `observed` applies: the plan, but of its pods only
    /// those whose host veth is in `observed` (the others are left to their ADD).
    pub fn of(mut plan: DesiredNode, observed: &ObservedNode) -> DesiredNode {
        retain_pods(&mut plan, observed);
        plan
    }

    /// After a reconcile: `plan` (`None` after a teardown; see [`Applied::of`]) is what Lace
    /// applied.
    pub fn reconciled(&mut self, plan: Option<DesiredNode>) {
        self.0 = plan;
    }

    /// After an attach: the pods of `pods` are part of what Lace applied (their veths exist).
    pub fn attached(&mut self, pods: &DesiredNode) {
        if let Some(plan) = &mut self.0 {
            plan.pod_routes
                .extend(pods.pod_routes.iter().map(|(k, nh)| (*k, nh.clone())));
            plan.served_tables.extend(&pods.served_tables);
            plan.shaping
                .extend(pods.shaping.iter().map(|(v, s)| (v.clone(), s.clone())));
        }
    }

    /// Whether anything was applied (before the first reconcile, nothing can drift).
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    /// Pods whose host veth is gone (deleted by CNI DEL) are no longer part of what Lace
    /// applied: if a link of that name comes back (a retried ADD), it is the ADD's to set up.
    fn prune(&mut self, node: &ObservedNode) {
        if let Some(plan) = &mut self.0 {
            retain_pods(plan, node);
        }
    }

    /// How `node` (the kernel as notified) differs from what Lace applied, if it does.
    pub fn drift(&mut self, node: &ObservedNode) -> Option<Drift> {
        self.prune(node);
        match diff::drift(self.0.as_ref()?, node) {
            Ok(ops) => ops.first().map(|first| Drift {
                ops: ops.len(),
                summary: first.to_string(),
                repairing: false,
            }),
            Err(e) => Some(Drift {
                ops: 0,
                summary: e.to_string(),
                repairing: false,
            }),
        }
    }
}

/// Something Lace owns changed without Lace (seen in the kernel's notifications): what a
/// reconcile would do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// How many operations a reconcile would issue; 0 when the notifications themselves
    /// could not be followed (then nothing is known, and the reconcile dumps).
    pub ops: usize,
    /// The first of those operations, or why the notifications could not be followed.
    pub summary: String,
    /// Found by a reconcile, which repairs it: counted and logged, nothing to schedule.
    pub repairing: bool,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.ops == 0 {
            write!(f, "{}", self.summary)
        } else {
            write!(
                f,
                "{} operation(s) would restore it, first: {}",
                self.ops, self.summary
            )
        }
    }
}

/// Called (on the namespace's worker thread) with each drift found; must not block.
pub type DriftHandler = Box<dyn Fn(Drift) + Send + Sync>;

/// Where drift goes: set once the agent listens ([`Reconciler::on_drift`](crate::dataplane::Reconciler::on_drift)).
pub type DriftSink = Arc<Mutex<Option<DriftHandler>>>;

/// Keeps of `plan`'s pods those whose host veth is in `node`: their routes and shaping.
fn retain_pods(plan: &mut DesiredNode, node: &ObservedNode) {
    plan.pod_routes
        .retain(|_, nh| nexthop_link(nh).is_none_or(|dev| node.links.contains_key(dev)));
    plan.shaping.retain(|veth, _| node.links.contains_key(veth));
}

/// The link a planned next hop names, if any.
fn nexthop_link(nh: &Nexthop) -> Option<&str> {
    match nh {
        Nexthop::Dev(d) | Nexthop::DevSrc { dev: d, .. } => Some(d),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
