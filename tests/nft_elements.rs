//! Updates of the nft ruleset in place against the real `nft` and kernel: for policy changes
//! of every kind (a Network pair added or removed, an element's reasons changed, a Network
//! removed, a local Service backend gone, a verdict changed: element changes; NetworkPolicies
//! coming, changing and going: chains and sets too), installing ruleset A and then A's changes
//! towards B leaves exactly the table a fresh install of B leaves.
//!
//! Each install runs in a fresh network namespace (`unshare -n`), so it needs root and
//! nf_tables (as `nft -c` in `plan_golden.rs` does). Set `LACE_SKIP_NFT_CHECK=1` only where
//! neither is available.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::process::Command;

use lace::plan::nft::Ruleset;
use lace::plan::plan;
use lace::state::{ClusterState, ObjectKey};
use serde_json::Value;

fn skip() -> bool {
    let skip = std::env::var_os("LACE_SKIP_NFT_CHECK").is_some();
    if skip {
        eprintln!("skipped: LACE_SKIP_NFT_CHECK is set");
    }
    skip
}

/// Runs the `nft -f` scripts in order in a new network namespace and returns table
/// `inet lace` as nft's JSON, normalized: no handles, elements sorted (a hash set lists its
/// elements in no particular order), sets and chains by name, rules by chain in their order
/// (a chain or set added by an update is listed after the others).
fn install(label: &str, scripts: &[&str]) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = String::from("set -e\n");
    for (i, s) in scripts.iter().enumerate() {
        let path = dir.path().join(format!("{i}.nft"));
        std::fs::write(&path, s).expect("write script");
        cmd.push_str(&format!("nft -f {}\n", path.display()));
    }
    cmd.push_str("nft -j list table inet lace\n");
    let out = Command::new("unshare")
        .args(["-n", "sh", "-c", &cmd])
        .output()
        .expect("running unshare (util-linux) and nft");
    assert!(
        out.status.success(),
        "{label}: {}\nscripts in order:\n{}",
        String::from_utf8_lossy(&out.stderr),
        scripts.join("\n----\n")
    );
    let mut v: Value = serde_json::from_slice(&out.stdout).expect("nft -j prints JSON");
    normalize(&mut v);
    v
}

/// `nft -j` output normalized (see [`install`]).
fn normalize(v: &mut Value) {
    strip(v);
    if let Some(Value::Array(objects)) = v.get_mut("nftables") {
        // Stable: rules keep their order inside their chain.
        objects.sort_by_key(|o| {
            let (kind, body) = o
                .as_object()
                .and_then(|m| m.iter().next())
                .expect("an object");
            let name = body.get("chain").or_else(|| body.get("name"));
            (kind.clone(), name.map(Value::to_string))
        });
    }
}

fn strip(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("handle");
            m.remove("metainfo");
            if let Some(Value::Array(elems)) = m.get_mut("elem") {
                elems.sort_by_key(|e| e.to_string());
            }
            m.values_mut().for_each(strip);
        }
        Value::Array(a) => {
            a.iter_mut().for_each(strip);
            // The metainfo object, emptied above.
            a.retain(|x| !matches!(x, Value::Object(m) if m.is_empty()));
        }
        _ => {}
    }
}

/// A then the element changes A → B gives B's table; and B is not A's table (else the
/// comparison would prove nothing).
fn check(label: &str, a: &Ruleset, b: &Ruleset) {
    let changes = a
        .element_changes(b)
        .unwrap_or_else(|| panic!("{label}: more than elements differ"));
    let delta = changes.render();
    for l in delta.lines().filter(|l| !l.starts_with('\t') && *l != "}") {
        assert!(
            l.starts_with("delete element inet lace ") || l.starts_with("add element inet lace "),
            "{label}: not an element command: {l}"
        );
    }
    check_delta(label, a, b, &delta);
}

/// A then the table changes A → B (any, writing exactly `chains`) gives B's table.
fn check_changes(label: &str, a: &Ruleset, b: &Ruleset, chains: &[&str]) {
    let changes = a
        .changes(b)
        .unwrap_or_else(|| panic!("{label}: only a full replace can apply the change"));
    let mut written = changes.chains();
    written.sort_unstable();
    let mut expected = chains.to_vec();
    expected.sort_unstable();
    assert_eq!(written, expected, "{label}: the chains written");
    check_delta(label, a, b, &changes.render());
}

fn check_delta(label: &str, a: &Ruleset, b: &Ruleset, delta: &str) {
    assert!(!delta.is_empty(), "{label}: nothing changes");
    let (ra, rb) = (a.render(), b.render());
    let updated = install(label, &[&ra, delta]);
    let fresh = install(label, &[&rb]);
    assert_eq!(updated, fresh, "{label}: delta\n{delta}");
    assert_ne!(
        install(label, &[&ra]),
        fresh,
        "{label}: A and B list the same"
    );
}

fn ruleset(node: &str, state: &ClusterState, pods: &[lace::state::PodAttachment]) -> Ruleset {
    plan(node, state, pods).expect("plans").base.nft.clone()
}

#[test]
fn element_changes_applied_to_a_leave_the_table_a_fresh_b_leaves() {
    if skip() {
        return;
    }
    let golden = common::golden_cluster();
    let pods = common::golden_attachments();
    let a = ruleset("node-1", &golden, &pods);

    let mut s = golden.clone();
    common::mk_route(&mut s, "default-to-system", "default", "system");
    let pair_added = ruleset("node-1", &s, &pods);

    let mut s = golden.clone();
    s.network_routes.remove("tenant-a-to-system");
    let pair_removed = ruleset("node-1", &s, &pods);

    // A second policy naming the same pair: the element's comment (its reasons) changes.
    let mut s = golden.clone();
    common::mk_route(&mut s, "system-to-system-again", "system", "system");
    let reasons_changed = ruleset("node-1", &s, &pods);

    // The same for an interval set of single prefixes: a second egress policy of `default`.
    let mut s = golden.clone();
    common::mk_route(&mut s, "default-to-internet-again", "default", "internet");
    let egress_reasons_changed = ruleset("node-1", &s, &pods);

    // A whole Network goes: its VRF, its subnets (interval sets), its pairs.
    let mut s = golden.clone();
    s.networks.remove("tenant-a");
    s.network_allocations.remove("tenant-a");
    s.network_bindings.remove("tenant-a");
    s.network_routes
        .retain(|_, r| r.from != "tenant-a" && r.to != "tenant-a");
    let network_removed = ruleset("node-1", &s, &[]);

    // Not a plan the planner makes (pairs only accept), but what an element update must do
    // to a verdict.
    let mut verdict_changed = a.clone();
    let pairs = verdict_changed
        .sets
        .iter_mut()
        .find(|s| s.name == "pairs_v6")
        .expect("pairs_v6");
    let first = pairs.elements.values_mut().next().expect("a v6 pair");
    first.value = Some("drop".into());

    for (label, b) in [
        ("pair added", &pair_added),
        ("pair removed", &pair_removed),
        ("reasons changed", &reasons_changed),
        ("egress reasons changed", &egress_reasons_changed),
        ("Network removed", &network_removed),
        ("verdict changed", &verdict_changed),
    ] {
        check(label, &a, b);
        check(&format!("{label}, reversed"), b, &a);
    }

    // node-2 hosts a kube-dns backend (concatenated interval set with ports); it goes.
    let pods2 = common::golden_attachments_node2();
    let with = ruleset("node-2", &golden, &pods2);
    let mut s = golden.clone();
    let dns = lace::state::ObjectKey::new("kube-system", "kube-dns");
    let ends = s.endpoints.get_mut(&dns).expect("kube-dns endpoints");
    ends.addresses.retain(|a| a.to_string() != "10.10.2.5");
    let without = ruleset("node-2", &s, &pods2);
    check("backend gone", &with, &without);
    check("backend back", &without, &with);
}

/// NetworkPolicies coming, changing and going write NetworkPolicy's chains (and the jumps to
/// them) and its sets, never a new table.
#[test]
fn network_policy_changes_applied_in_place_leave_the_table_a_fresh_install_leaves() {
    if skip() {
        return;
    }
    let pods = common::golden_attachments();
    let without = ruleset("node-1", &common::golden_cluster(), &pods);
    let golden = common::golden_cluster_netpol();
    let with = ruleset("node-1", &golden, &pods);

    let api = ObjectKey::new("tenant-a", "api");
    let mut s = golden.clone();
    let rule = &mut s
        .network_policies
        .get_mut(&api)
        .expect("tenant-a/api")
        .ingress[1];
    rule.ports[0].end_port = Some(8200);
    let port_changed = ruleset("node-1", &s, &pods);

    let mut s = golden.clone();
    s.network_policies.remove(&api);
    let one_removed = ruleset("node-1", &s, &pods);

    let mut s = golden.clone();
    let mut web2 = s.network_policies[&ObjectKey::new("apps", "web")].clone();
    web2.ingress[0].ports.truncate(1);
    s.network_policies
        .insert(ObjectKey::new("apps", "web-2"), web2);
    let one_added = ruleset("node-1", &s, &pods);

    for (label, a, b, chains) in [
        (
            "first policies",
            &without,
            &with,
            &["np_ingress", "np_egress", "to_pods", "from_pods"][..],
        ),
        (
            "last policies gone",
            &with,
            &without,
            &["np_ingress", "np_egress", "to_pods", "from_pods"],
        ),
        // Ports live in sets: elements only.
        ("a port range changed", &with, &port_changed, &[]),
        ("back", &port_changed, &with, &[]),
        ("a policy removed", &with, &one_removed, &["np_ingress"]),
        ("a policy back", &one_removed, &with, &["np_ingress"]),
        ("a policy added", &with, &one_added, &["np_ingress"]),
        ("the added one gone", &one_added, &with, &["np_ingress"]),
    ] {
        check_changes(label, a, b, chains);
    }
}

/// An update computed against another ruleset than the kernel's fails, and as a whole: the
/// deletion of an element the table lacks fails the transaction, and the additions in it do
/// not happen (so a wrong memory is an error, never a silent partial update).
#[test]
fn an_update_against_another_ruleset_fails_as_a_whole() {
    if skip() {
        return;
    }
    let golden = common::golden_cluster();
    let pods = common::golden_attachments();
    let a = ruleset("node-1", &golden, &pods);
    let mut s = golden.clone();
    s.network_routes.remove("tenant-a-to-system");
    let b = ruleset("node-1", &s, &pods);
    common::mk_route(&mut s, "default-to-system", "default", "system");
    let c = ruleset("node-1", &s, &pods);
    let changes = a.element_changes(&c).expect("elements only");
    assert!(!changes.deleted.is_empty() && !changes.added.is_empty());
    let delta = changes.render();
    let dir = tempfile::tempdir().expect("temp dir");
    let (pb, pd) = (dir.path().join("b.nft"), dir.path().join("d.nft"));
    std::fs::write(&pb, b.render()).expect("write");
    std::fs::write(&pd, &delta).expect("write");
    // B holds none of the elements A → C deletes.
    let cmd = format!(
        "nft -f {} || exit 9; nft -f {} 2>/dev/null && exit 8; nft -j list table inet lace",
        pb.display(),
        pd.display()
    );
    let out = Command::new("unshare")
        .args(["-n", "sh", "-c", &cmd])
        .output()
        .expect("running unshare and nft");
    assert_eq!(
        out.status.code(),
        Some(0),
        "9: installing B failed, 8: the update succeeded; {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut after: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    normalize(&mut after);
    assert_eq!(
        after,
        install("B", &[&b.render()]),
        "the failed update changed B"
    );
}

/// NetworkPolicy: what pods do (change labels, start, stop, rename a port) changes set
/// elements only, and the element update leaves the table a fresh install would, in the
/// kernel; a policy's own change replaces the ruleset.
#[test]
fn network_policy_pod_changes_are_element_updates_in_the_kernel() {
    if skip() {
        return;
    }
    let base = common::golden_cluster_netpol();
    let pods = common::golden_attachments();
    let a = ruleset("node-1", &base, &pods);
    let key = |ns: &str, name: &str| lace::state::ObjectKey::new(ns, name);
    let relabel = |ns: &str, name: &str, app: &str| {
        let mut s = base.clone();
        s.pods
            .get_mut(&key(ns, name))
            .unwrap()
            .labels
            .insert("app".into(), app.into());
        ruleset("node-1", &s, &pods)
    };
    // A remote peer leaves a selector; a local pod leaves its policy's selection.
    let peer_left = relabel("tenant-a", "worker-0", "batch");
    let selected_left = relabel("apps", "web-0", "static");
    let mut s = base.clone();
    common::mk_pod(
        &mut s,
        ("kube-system", "coredns-2"),
        "node-3",
        &["10.10.3.5", "fd00:10:0:3::5"],
        &[("k8s-app", "kube-dns")],
        &[("dns", "UDP", 5353)],
    );
    let peer_started = ruleset("node-1", &s, &pods);
    let mut s = base.clone();
    s.pods.get_mut(&key("apps", "web-0")).unwrap().ports[0].port = 8443;
    let port_moved = ruleset("node-1", &s, &pods);
    let mut s = base.clone();
    s.pods.remove(&key("tenant-a", "api-0"));
    let local_gone = ruleset("node-1", &s, &pods);
    for (label, b) in [
        ("peer left a selector", &peer_left),
        ("local pod left a selection", &selected_left),
        ("peer started", &peer_started),
        ("named port moved", &port_moved),
        ("local pod gone", &local_gone),
    ] {
        check(label, &a, b);
        check(&format!("{label}, reversed"), b, &a);
    }
    let mut s = base.clone();
    s.network_policies.remove(&key("apps", "web"));
    assert_eq!(
        a.element_changes(&ruleset("node-1", &s, &pods)),
        None,
        "a policy gone is a ruleset change"
    );
}
