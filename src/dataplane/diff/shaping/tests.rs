//! Tests of the pods' shaping: what a plan with bandwidth turns into against a host as
//! observed, that applying it to the fake kernel of [`model`] leaves nothing to do, and what
//! goes when the pod or its bandwidth does.

use super::*;
use crate::bandwidth::{Bandwidth, Limit};
use crate::dataplane::diff::{attach, diff, drift, Diff};
use crate::dataplane::fixtures::{bare_host, desired, model};
use crate::plan::DesiredNode;
use crate::state::ObjectKey;

fn limit(rate: u64) -> Option<Limit> {
    Some(Limit { rate, burst: None })
}

fn shaping(ingress: Option<Limit>, egress: Option<Limit>) -> Shaping {
    Shaping {
        pod: ObjectKey::new("ns", "pa"),
        asked: Bandwidth { ingress, egress },
        ingress: ingress.map(Limit::bucket),
        egress: egress.map(Limit::bucket),
    }
}

/// Pods a and b, a shaped as `s`.
fn shaped(s: Shaping) -> DesiredNode {
    let mut d = desired(true);
    d.shaping.insert("lp-pa".into(), s);
    d
}

fn shaping_ops(ops: &[Op]) -> Vec<String> {
    ops.iter()
        .map(Op::to_string)
        .filter(|o| o.starts_with("tc ") || o.contains("ls-"))
        .collect()
}

/// A node reconciled to `d`.
fn converged(d: &DesiredNode) -> ObservedNode {
    let mut o = bare_host();
    let ops = diff(Some(d), &o, None).unwrap().ops;
    model(&mut o, &ops);
    assert_eq!(diff(Some(d), &o, None).unwrap(), Diff::default());
    o
}

#[test]
fn a_shaped_pod_gets_its_buckets_shaper_and_filter_then_nothing_more() {
    let d = shaped(shaping(limit(10_000_000), limit(20_000_000)));
    let mut o = bare_host();
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    let (to, from) = (
        limit(10_000_000).unwrap().bucket(),
        limit(20_000_000).unwrap().bucket(),
    );
    assert_eq!(
        shaping_ops(&ops),
        [
            "link add ls-pa type ifb up".to_string(),
            format!("tc qdisc replace dev lp-pa root handle 4c: tbf {to}"),
            format!("tc qdisc replace dev ls-pa root handle 4c: tbf {from}"),
            "tc qdisc add dev lp-pa ingress".to_string(),
            "tc filter add dev lp-pa parent ffff: prio 76 protocol all u32 match u32 0 0 action \
             mirred egress redirect dev ls-pa"
                .to_string(),
        ]
    );
    // The shaper exists before anything names it; the shaping is in before the pod's routes.
    let at = |f: &dyn Fn(&Op) -> bool| ops.iter().position(f).unwrap();
    assert!(at(&|o| matches!(o, Op::AddShaper { .. })) < at(&|o| matches!(o, Op::PutTbf { .. })));
    assert!(
        at(&|o| matches!(o, Op::AddRedirect { .. })) < at(&|o| matches!(o, Op::PutRoute { .. }))
    );
    model(&mut o, &ops);
    assert_eq!(
        diff(Some(&d), &o, None).unwrap(),
        Diff::default(),
        "applied twice"
    );
}

#[test]
fn a_changed_bucket_or_hand_edited_filter_is_rewritten_alone() {
    let d = shaped(shaping(limit(10_000_000), limit(20_000_000)));
    let mut o = converged(&d);
    let faster = shaped(shaping(limit(30_000_000), limit(20_000_000)));
    let ops = diff(Some(&faster), &o, None).unwrap().ops;
    assert_eq!(
        ops,
        [Op::PutTbf {
            link: "lp-pa".into(),
            bucket: limit(30_000_000).unwrap().bucket()
        }]
    );
    // Someone pointed the filter elsewhere, and left a second root on the shaper.
    o.tc.get_mut("lp-pa").unwrap().redirect = Some(Redirect::To(1));
    o.tc.get_mut("ls-pa").unwrap().root = Some(RootQdisc::Other("htb".into()));
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    assert_eq!(
        shaping_ops(&ops),
        [
            format!(
                "tc qdisc replace dev ls-pa root handle 4c: tbf {}",
                limit(20_000_000).unwrap().bucket()
            ),
            "tc filter del dev lp-pa parent ffff: prio 76 (to add it as planned)".to_string(),
            "tc filter add dev lp-pa parent ffff: prio 76 protocol all u32 match u32 0 0 action \
             mirred egress redirect dev ls-pa"
                .to_string(),
        ]
    );
    model(&mut o, &ops);
    assert_eq!(diff(Some(&d), &o, None).unwrap(), Diff::default());
}

#[test]
fn the_kernels_rounding_of_the_bucket_is_no_change_but_a_percent_is() {
    let b = limit(10_000_000).unwrap().bucket();
    let ns = u128::from(b.burst) * 1_000_000_000 / u128::from(b.rate);
    let tbf = |ticks: u128| ObservedTbf {
        rate: b.rate,
        limit: b.limit,
        buffer_ticks: u32::try_from(ticks).unwrap(),
    };
    assert!(holds(&tbf(ns / 64), &b));
    assert!(holds(&tbf(ns / 64 + 1), &b));
    assert!(!holds(&tbf(ns * 101 / 100 / 64), &b));
    assert!(!holds(
        &ObservedTbf {
            rate: b.rate + 1,
            ..tbf(ns / 64)
        },
        &b
    ));
    assert!(!holds(
        &ObservedTbf {
            limit: b.limit - 1,
            ..tbf(ns / 64)
        },
        &b
    ));
}

#[test]
fn what_a_pod_no_longer_asks_for_and_pods_gone_lose_their_shaping() {
    let d = shaped(shaping(limit(10_000_000), limit(20_000_000)));
    let mut o = converged(&d);
    // Only towards it now: the egress side goes, the filter before the shaper.
    let to_only = shaped(shaping(limit(10_000_000), None));
    let ops = diff(Some(&to_only), &o, None).unwrap().ops;
    assert_eq!(
        shaping_ops(&ops),
        ["tc qdisc del dev lp-pa ingress", "link del ls-pa"]
    );
    model(&mut o, &ops);
    // Not shaped at all: its root goes too.
    let ops = diff(Some(&desired(true)), &o, None).unwrap().ops;
    assert_eq!(
        shaping_ops(&ops),
        ["tc qdisc del dev lp-pa root handle 4c:"]
    );
    model(&mut o, &ops);
    assert_eq!(o.tc, BTreeMap::new());
    // A pod whose record went (its veth stays until DEL): everything of it goes.
    let mut o = converged(&d);
    let ops = diff(Some(&desired(true)), &o, None).unwrap().ops;
    assert_eq!(
        shaping_ops(&ops),
        [
            "tc qdisc del dev lp-pa root handle 4c:",
            "tc qdisc del dev lp-pa ingress",
            "link del ls-pa"
        ]
    );
    model(&mut o, &ops);
    assert!(o.tc.is_empty() && !o.links.contains_key("ls-pa"));
}

#[test]
fn a_pod_without_its_veth_gets_nothing_and_its_shaper_goes() {
    let d = shaped(shaping(None, limit(20_000_000)));
    let mut o = converged(&d);
    // DEL took the veth (and its qdiscs with it).
    o.links.remove("lp-pa");
    o.tc.remove("lp-pa");
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    assert_eq!(shaping_ops(&ops), ["link del ls-pa"]);
    // A teardown takes every shaper and pod qdisc.
    let o = converged(&d);
    let ops = diff(None, &o, None).unwrap().ops;
    let mut gone = shaping_ops(&ops);
    gone.sort();
    assert_eq!(gone, ["link del ls-pa", "tc qdisc del dev lp-pa ingress"]);
}

#[test]
fn attach_shapes_its_pod_only_and_the_reconcile_after_it_writes_nothing() {
    let d = shaped(shaping(limit(10_000_000), limit(20_000_000)));
    let pod = DesiredNode {
        pod_routes: d
            .pod_routes
            .iter()
            .filter(|(_, nh)| nh.to_string().contains("lp-pa"))
            .map(|(k, nh)| (*k, nh.clone()))
            .collect(),
        shaping: d.shaping.clone(),
        ..d.clone()
    };
    let mut o = converged(&desired(true));
    // Left over on another pod's veth: not attach's to remove.
    o.tc.insert(
        "lp-pb".into(),
        LinkTc {
            ingress: true,
            ..LinkTc::default()
        },
    );
    let ops = attach(&pod, &o, &o.tc).unwrap().ops;
    assert_eq!(shaping_ops(&ops).len(), 5, "{ops:#?}");
    assert!(!ops.iter().any(|op| op.to_string().contains("lp-pb")));
    model(&mut o, &ops);
    let rest = diff(Some(&d), &o, None).unwrap().ops;
    assert_eq!(shaping_ops(&rest), ["tc qdisc del dev lp-pb ingress"]);
}

#[test]
fn a_deleted_shaper_is_drift_and_qdiscs_are_not_watched() {
    let d = shaped(shaping(limit(10_000_000), limit(20_000_000)));
    let mut o = converged(&d);
    assert_eq!(drift(&d, &o).unwrap(), []);
    // The qdiscs are read by reconciles only: what the cache holds of them is not drift.
    o.tc.clear();
    assert_eq!(drift(&d, &o).unwrap(), []);
    o.links.remove("ls-pa");
    assert_eq!(
        drift(&d, &o).unwrap(),
        [Op::AddShaper {
            name: "ls-pa".into()
        }]
    );
}
