//! The `lace-agent` standalone tools, run as a user would, on the example cluster.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

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

/// The new user: a kubeadm cluster whose nodes have IPv4 InternalIPs only. Allocation
/// works and every node's plan carries SRv6 over IPv4 to the others.
#[test]
fn ipv4_only_nodes_are_allocated_and_planned_over_ipv4() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(example()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    // No IPv6 InternalIPs, no allocations yet.
    let nodes = dir.path().join("nodes.yaml");
    let text = std::fs::read_to_string(&nodes).unwrap();
    let kept: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < kept.len() {
        let ipv6 = kept[i].trim() == "- type: InternalIP"
            && kept
                .get(i + 1)
                .is_some_and(|n| n.trim_start().starts_with("address: fd00:"));
        if ipv6 {
            i += 2;
            continue;
        }
        out.push(kept[i]);
        i += 1;
    }
    std::fs::write(&nodes, out.join("\n") + "\n").unwrap();
    std::fs::remove_file(dir.path().join("lace-allocations.yaml")).unwrap();
    let manifests = dir.path().display().to_string();

    let alloc = agent(&["allocate", "--manifests", &manifests]);
    assert!(alloc.status.success(), "{alloc:?}");
    let written = std::fs::read_to_string(dir.path().join("lace-allocations.yaml")).unwrap();
    assert!(
        written.contains("ipv4: \"192.168.0.12\"") && !written.contains("ipv6:"),
        "{written}"
    );

    let plan = agent(&["plan", "--manifests", &manifests, "--node", "node-1"]);
    assert!(plan.status.success(), "{plan:?}");
    let text = String::from_utf8(plan.stdout).unwrap();
    for want in [
        "peer node-2 fou via 192.168.0.12",
        "peer node-3 fou via 192.168.0.13",
        "link lu-ipv4 type sit remote any local 192.168.0.11",
        "fou port 6076 ipproto 41",
        "-6 2001:db8:100::2:0:0/96 via ::192.168.0.12 dev lu-ipv4",
        "seg6 tunsrc 2001:db8:100::1:0:0",
    ] {
        assert!(text.contains(want), "no {want:?} in the plan:\n{text}");
    }
}

#[test]
fn policy_for_one_pod_shows_its_network_policies() {
    let out = agent(&[
        "policy",
        "--manifests",
        &example(),
        "--pod",
        "monitoring/prometheus",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "pod monitoring/prometheus node-2 default default");
    assert_eq!(
        lines[1],
        "ingress isolated by monitoring/prometheus: only what these allow (and its Networks too)"
    );
    assert!(
        lines[2].starts_with("ingress   monitoring/prometheus ingress[0]: from pods all of namespaces {} [default/client kube-system/coredns-1 "),
        "{text}"
    );
    assert!(lines[2].ends_with("] on every port"), "{text}");
    assert_eq!(
        lines[3],
        "egress not isolated: every connection its Networks allow"
    );
    let out = agent(&["policy", "--manifests", &example(), "--pod", "team-a/nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("team-a/nope"));
}

/// `plan --state-dir`: the node's local pods as its agent recorded them (the IPAM store), with
/// a pod's hostPorts as DNAT map elements naming the pod and its route from the main table
/// into its VRF.
#[test]
fn plan_with_the_agents_records_shows_each_host_port_naming_its_pod() {
    use lace::agent::ipam::{AttachmentKey, Claim, IpamStore};
    use lace::hostport::{HostPort, Protocol};
    use lace::state::ObjectKey;
    let state = lace::load::load_dir(Path::new(&example())).unwrap();
    let blocks = lace::alloc::node_blocks(
        state.node_allocations["node-1"].index,
        &state.networks["default"].subnets,
    );
    let dir = tempfile::tempdir().unwrap();
    let key = AttachmentKey {
        container_id: "c-ingress".into(),
        ifname: "eth0".into(),
    };
    let pod = ObjectKey::new("ingress", "controller-0");
    let rec = IpamStore::open(dir.path())
        .unwrap()
        .allocate(
            &key,
            Claim {
                pod: &pod,
                network: "default",
                blocks: &blocks,
                host_ifname: "lp-ingress",
                netns: None,
                host_ports: vec![HostPort {
                    protocol: Protocol::Tcp,
                    host_port: 443,
                    container_port: 8443,
                    host_ip: None,
                }],
                bandwidth: None,
            },
        )
        .unwrap();
    let v4 = rec
        .ips
        .iter()
        .find(|ip| ip.addr().is_ipv4())
        .unwrap()
        .addr();
    let dir_arg = dir.path().display().to_string();
    let out = agent(&[
        "plan",
        "--manifests",
        &example(),
        "--node",
        "node-1",
        "--state-dir",
        &dir_arg,
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let element = format!("tcp . 443 comment \"pod ingress/controller-0\" : {v4} . 8443");
    assert!(text.contains(&element), "no `{element}` in:\n{text}");
    assert!(text.contains(&format!("{v4}/32 dev lv-default")), "{text}");
    // Without the records: no local pods, no hostPorts.
    let out = agent(&["plan", "--manifests", &example(), "--node", "node-1"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("controller-0"), "{text}");
}

/// `plan --state-dir`: a pod's bandwidth, as its agent recorded it, planned as buckets on its
/// veth and shaper, naming the pod.
#[test]
fn plan_with_the_agents_records_shows_each_pods_shaping_naming_it() {
    use lace::agent::ipam::{AttachmentKey, Claim, IpamStore};
    use lace::bandwidth::{Bandwidth, Limit};
    use lace::state::ObjectKey;
    let state = lace::load::load_dir(Path::new(&example())).unwrap();
    let blocks = lace::alloc::node_blocks(
        state.node_allocations["node-1"].index,
        &state.networks["default"].subnets,
    );
    let dir = tempfile::tempdir().unwrap();
    let key = AttachmentKey {
        container_id: "c-shaped".into(),
        ifname: "eth0".into(),
    };
    let pod = ObjectKey::new("apps", "shaped-0");
    let limit = |rate| {
        Some(Limit {
            rate,
            burst: Some(u64::from(u32::MAX)),
        })
    };
    IpamStore::open(dir.path())
        .unwrap()
        .allocate(
            &key,
            Claim {
                pod: &pod,
                network: "default",
                blocks: &blocks,
                host_ifname: "lp-shaped",
                netns: None,
                host_ports: Vec::new(),
                bandwidth: Some(Bandwidth {
                    ingress: limit(10_000_000),
                    egress: limit(20_000_000),
                }),
            },
        )
        .unwrap();
    let dir_arg = dir.path().display().to_string();
    let args = ["plan", "--manifests", &example(), "--node", "node-1"];
    let out = agent(&[&args[..], &["--state-dir", &dir_arg]].concat());
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "# pod apps/shaped-0: to it 10Mbit burst 4294967295bit, from it 20Mbit burst 4294967295bit",
        "qdisc replace dev lp-shaped root handle 4c: tbf rate 10Mbit ",
        "action mirred egress redirect dev ls-shaped",
        "qdisc replace dev ls-shaped root handle 4c: tbf rate 20Mbit ",
    ] {
        assert!(text.contains(want), "no `{want}` in:\n{text}");
    }
    // Without the records: nothing shaped.
    let out = agent(&args);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("## shaping"), "{text}");
}
