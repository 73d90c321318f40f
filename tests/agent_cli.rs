//! The `lace-agent` standalone tools, run as a user would, on the example cluster.

use std::path::Path;
use std::process::{Command, Output};

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lace-agent"))
        .args(args)
        .output()
        .expect("lace-agent runs")
}

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/cluster")
        .display()
        .to_string()
}

#[test]
fn policy_explains_bindings_and_pairs_of_the_example() {
    let out = agent(&["policy", "--manifests", &example()]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // kube-system pods are bound to system; namespaces labelled lace.io/tenant=a to tenant-a;
    // everything else falls to the catch-all default; hostNetwork pods to nothing.
    assert!(lines.contains(&"pod kube-system/coredns-1 node-1 system system"));
    assert!(lines.contains(&"pod team-a/web-2 node-3 tenant-a tenant-a"));
    assert!(lines.contains(&"pod monitoring/prometheus node-2 default default"));
    assert!(lines.contains(&"pod kube-system/kube-proxy-node-1 node-1 - -"));
    // The default Network does not reach itself; it reaches the internet.
    assert!(lines.contains(&"pair default internet default-to-internet"));
    assert!(!lines.iter().any(|l| l.starts_with("pair default default")));
    assert!(lines.contains(&"external internet"));
}

#[test]
fn plan_names_an_unknown_node() {
    let out = agent(&["plan", "--manifests", &example(), "--node", "node-9"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"node-9\""), "{err}");
}

#[test]
fn validate_reports_every_error_with_its_object() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: lace.io/v1alpha1\nkind: NetworkRoutingPolicy\nmetadata: {name: x}\n\
         spec: {from: nowhere, to: nothing}\n",
    )
    .unwrap();
    let out = agent(&["validate", "--manifests", &dir.path().display().to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NetworkRoutingPolicy/x"), "{err}");
    assert!(err.contains("nowhere") && err.contains("nothing"), "{err}");
}
