//! NetworkPolicy in the planned ruleset, beyond the semantics the planner's unit tests judge
//! (`src/plan/netpol/tests.rs`): where the chains sit among Lace's own rules, that pods
//! changing never changes a rule (property test), and that planning the same state twice
//! changes nothing.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use lace::plan::nft::Ruleset;
use lace::plan::plan;
use lace::state::{ClusterState, ObjectKey};
use proptest::prelude::*;

fn ruleset(state: &ClusterState) -> Ruleset {
    plan("node-1", state, &common::golden_attachments())
        .unwrap()
        .base
        .nft
        .clone()
}

/// The rendered chains alone: every rule, no set and no element.
fn rules_text(r: &Ruleset) -> String {
    Ruleset {
        sets: Vec::new(),
        chains: r.chains.clone(),
    }
    .render()
}

#[test]
fn network_policy_runs_first_and_lace_still_decides_and_probes_are_exempt() {
    let r = ruleset(&common::golden_cluster_netpol());
    let established = "ct state established,related accept";
    // Replies of allowed connections pass before any policy: `forward` accepts them before it
    // jumps to `to_pods`, `from_vrfs` before it goes to `from_pods`, after rules that only mark
    // or rewrite packets.
    assert_eq!(r.chain("forward").unwrap().rules[0].statement, established);
    let from_vrfs = &r.chain("from_vrfs").unwrap().rules;
    let accept = from_vrfs.iter().position(|x| x.statement == established);
    let to_policy = from_vrfs
        .iter()
        .position(|x| x.statement == "goto from_pods");
    assert!(accept.unwrap() < to_policy.unwrap(), "{from_vrfs:#?}");
    assert!(from_vrfs[..accept.unwrap()]
        .iter()
        .all(|x| !x.statement.contains("accept") && !x.statement.contains("drop")));
    for (chain, jump) in [
        ("to_pods", "jump np_ingress"),
        ("from_pods", "jump np_egress"),
    ] {
        let rules = &r.chain(chain).unwrap().rules;
        let at = rules
            .iter()
            .position(|x| x.statement.ends_with(jump))
            .unwrap();
        assert!(rules[at + 1].statement.ends_with(jump));
        // Nothing comes before NetworkPolicy (established flows were accepted on the way)...
        assert_eq!(at, 0, "{chain}: {rules:#?}");
        // ... and Lace's own verdicts after: an allowed connection still needs a routing policy.
        assert!(rules[at + 2..]
            .iter()
            .any(|x| x.statement.contains("@pairs_v4")));
    }
    // The kubelet's probes leave the host through output/from_host: no NetworkPolicy there.
    for chain in ["output", "from_host", "prerouting", "from_vrfs", "forward"] {
        assert!(
            !r.chain(chain)
                .unwrap()
                .rules
                .iter()
                .any(|x| x.statement.contains("np_")),
            "{chain}"
        );
    }
    // The NetworkPolicy chains end in a drop and otherwise only return.
    for chain in ["np_ingress", "np_egress"] {
        let rules = &r.chain(chain).unwrap().rules;
        let (last, allows) = rules.split_last().unwrap();
        assert_eq!(last.statement, "counter drop");
        assert!(allows.iter().all(|x| x.statement.ends_with(" return")));
    }
}

#[test]
fn a_pod_label_change_changes_elements_not_rules() {
    let base = common::golden_cluster_netpol();
    let a = ruleset(&base);
    let mut s = base.clone();
    s.pods
        .get_mut(&ObjectKey::new("apps", "web-0"))
        .unwrap()
        .labels
        .insert("app".into(), "static".into());
    let b = ruleset(&s);
    assert_eq!(rules_text(&a), rules_text(&b));
    let changes = a.element_changes(&b).expect("elements only");
    let sets: Vec<&str> = changes
        .deleted
        .iter()
        .map(|(set, _)| *set)
        .chain(changes.added.iter().map(|(set, _, _)| *set))
        .collect();
    // web-0 is no longer isolated nor selected by apps/web; it stays a peer of apps/web
    // (every namespace) only under its address, whose element is unchanged.
    assert!(sets.contains(&"np_isolated_ingress_v4"), "{sets:?}");
    assert!(sets.iter().any(|s| s.ends_with("_pods_v4")), "{sets:?}");
    assert!(
        sets.iter().any(|s| s.ends_with("_in0_named_v4")),
        "{sets:?}"
    );
    assert!(!changes.render().contains("chain"), "no rule in the update");
}

#[test]
fn planning_the_same_state_twice_changes_nothing() {
    let s = common::golden_cluster_netpol();
    let (a, b) = (ruleset(&s), ruleset(&s));
    assert_eq!(a.render(), b.render());
    assert!(a.element_changes(&b).unwrap().is_empty());
}

/// Random labels, pods moved between nodes and pods stopped, over the golden policies.
fn pod_changes() -> impl Strategy<Value = Vec<(usize, u8)>> {
    prop::collection::vec((0usize..7, 0u8..6), 0..8)
}

proptest! {
    #[test]
    fn pods_changing_never_changes_a_rule(changes in pod_changes()) {
        let base = common::golden_cluster_netpol();
        let a = ruleset(&base);
        let mut s = base.clone();
        let keys: Vec<ObjectKey> = s.pods.keys().cloned().collect();
        for (i, what) in changes {
            let key = &keys[i % keys.len()];
            let Some(pod) = s.pods.get_mut(key) else { continue };
            match what {
                0 => { pod.labels.insert("app".into(), "api".into()); }
                1 => { pod.labels.insert("app".into(), "worker".into()); }
                2 => { pod.labels.clear(); }
                3 => pod.node = "node-1".into(),
                4 => pod.ports.clear(),
                _ => { s.pods.remove(key); }
            }
        }
        let b = ruleset(&s);
        prop_assert_eq!(rules_text(&a), rules_text(&b));
        prop_assert!(a.element_changes(&b).is_some());
    }
}
