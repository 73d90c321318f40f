//! Golden test: the full plan of node-1 in a 3-node, 4-Network cluster, as text a reviewer can
//! read (`tests/golden/node-1.plan`) and the nft ruleset (`tests/golden/node-1.nft`), which the
//! real `nft` binary must accept in check mode. Regenerate with `LACE_BLESS=1 cargo test`.
//! The goldens' properties are checked independently by `plan_props.rs` and `plan_unit.rs`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::PathBuf;
use std::process::Command;

use std::collections::BTreeSet;

use lace::plan::underlay::UnderlayFacts;
use lace::plan::{plan, plan_with};

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("LACE_BLESS").is_some() {
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading {} ({e}); run with LACE_BLESS=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let diff: Vec<String> = expected
            .lines()
            .zip(actual.lines())
            .enumerate()
            .filter(|(_, (e, a))| e != a)
            .take(10)
            .map(|(i, (e, a))| format!("line {}:\n  golden: {e}\n  actual: {a}", i + 1))
            .collect();
        panic!(
            "{} differs from the plan ({} vs {} lines); first differences:\n{}\nRe-bless with LACE_BLESS=1 after reviewing.",
            path.display(),
            expected.lines().count(),
            actual.lines().count(),
            diff.join("\n")
        );
    }
}

#[test]
fn golden_plan_node_1() {
    let state = common::golden_cluster();
    let desired =
        plan("node-1", &state, &common::golden_attachments()).expect("golden cluster plans");
    golden("node-1.plan", &desired.render());
    golden("node-1.nft", &desired.render_nft());
}

/// Network `tenant-a` with `hostAccess`: the `iif lo` rule, the table of host processes'
/// routes (api-0 and the other nodes' blocks of tenant-a), the other nodes' InternalIPs in
/// tenant-a's table, and the ruleset's host_access and nodes sets.
#[test]
fn golden_plan_host_access() {
    let mut state = common::golden_cluster();
    state.networks.get_mut("tenant-a").unwrap().host_access = true;
    let desired =
        plan("node-1", &state, &common::golden_attachments()).expect("golden cluster plans");
    golden("hostaccess-node-1.plan", &desired.render());
    golden("hostaccess-node-1.nft", &desired.render_nft());
}

/// node-2 hosts a kube-dns backend: its ruleset has the backend grant, its system table the
/// reply routes towards default's blocks.
#[test]
fn golden_plan_node_2() {
    let state = common::golden_cluster();
    let desired =
        plan("node-2", &state, &common::golden_attachments_node2()).expect("golden cluster plans");
    golden("node-2.plan", &desired.render());
    golden("node-2.nft", &desired.render_nft());
}

/// The mixed cluster (node-3 without IPv6): node-1 reaches node-2 over IPv6 and node-3 over
/// IPv4 through `lu-ipv4`; node-3 reaches everyone over IPv4, from its locator's address.
#[test]
fn golden_plan_mixed_underlay() {
    let state = common::golden_cluster_mixed();
    let node1 = plan("node-1", &state, &common::golden_attachments()).expect("plans");
    golden("mixed-node-1.plan", &node1.render());
    golden("mixed-node-1.nft", &node1.render_nft());
    let node3 = plan("node-3", &state, &node_3_attachments()).expect("plans");
    golden("mixed-node-3.plan", &node3.render());
    golden("mixed-node-3.nft", &node3.render_nft());
}

/// A pod of `system` and one of `tenant-a` on node-3: the tables of those Networks route the
/// other nodes' blocks (a Network without a pod on the node leaves them out).
fn node_3_attachments() -> Vec<lace::state::PodAttachment> {
    vec![
        common::mk_attachment(
            "kube-system",
            "coredns-3",
            "system",
            "lp-coredns3",
            &["10.10.3.2", "fd00:10:0:3::2"],
        ),
        common::mk_attachment("tenant-a", "api-3", "tenant-a", "lp-api3", &["10.30.3.2"]),
    ]
}

/// The mixed cluster's node-3 (IPv4 only) on one L2 segment with the others, as its probes
/// found it: IPv6 on at its uplink, node-1 answering on its link-local underlay address (the
/// link-local path), node-2 on-link but not answering yet (fou, with the TCP MSS clamp
/// towards node-2's pod blocks).
#[test]
fn golden_plan_link_local() {
    let state = common::golden_cluster_mixed();
    let on: BTreeSet<String> = ["node-1".to_string(), "node-2".to_string()].into();
    let facts = UnderlayFacts {
        uplink_ipv6: true,
        on_link: on,
        answering: ["node-1".to_string()].into(),
        answered: ["node-1".to_string()].into(),
        uplink_mtu: Some(1500),
    };
    let node3 = plan_with("node-3", &state, &facts, &node_3_attachments()).expect("plans");
    golden("linklocal-node-3.plan", &node3.render());
    golden("linklocal-node-3.nft", &node3.render_nft());
}

/// The golden cluster with NetworkPolicies ([`common::golden_cluster_netpol`]): node-1 holds
/// pods of every policy, node-2 the other web pod (its `http` is 8081) and the other api pod.
/// Only the ruleset differs from the plain golden cluster's (routes do not know policies).
#[test]
fn golden_plan_network_policies() {
    let state = common::golden_cluster_netpol();
    let node1 = plan("node-1", &state, &common::golden_attachments()).expect("plans");
    let plain = plan(
        "node-1",
        &common::golden_cluster(),
        &common::golden_attachments(),
    )
    .expect("plans");
    assert_eq!(
        node1.render(),
        plain.render(),
        "NetworkPolicy changes only nft"
    );
    golden("netpol-node-1.nft", &node1.render_nft());
    let node2 = plan("node-2", &state, &common::golden_attachments_node2()).expect("plans");
    golden("netpol-node-2.nft", &node2.render_nft());
}

/// node-1 with hostPorts ([`common::golden_attachments_host_ports`]): the DNAT maps, the
/// accepted pods and the main-table routes into the pods' VRFs.
#[test]
fn golden_plan_host_ports() {
    let desired = plan(
        "node-1",
        &common::golden_cluster(),
        &common::golden_attachments_host_ports(),
    )
    .expect("plans");
    golden("hostports-node-1.plan", &desired.render());
    golden("hostports-node-1.nft", &desired.render_nft());
}

/// node-1 with bandwidth ([`common::golden_attachments_bandwidth`]): each shaped pod's
/// buckets, shaper and filter; the ruleset is unchanged.
#[test]
fn golden_plan_bandwidth() {
    let desired = plan(
        "node-1",
        &common::golden_cluster(),
        &common::golden_attachments_bandwidth(),
    )
    .expect("plans");
    golden("bandwidth-node-1.plan", &desired.render());
    let plain = plan(
        "node-1",
        &common::golden_cluster(),
        &common::golden_attachments(),
    )
    .expect("plans");
    assert_eq!(desired.render_nft(), plain.render_nft());
}

/// Every golden ruleset.
const GOLDEN_NFT: [&str; 8] = [
    "hostports-node-1.nft",
    "node-1.nft",
    "node-2.nft",
    "mixed-node-1.nft",
    "mixed-node-3.nft",
    "linklocal-node-3.nft",
    "netpol-node-1.nft",
    "netpol-node-2.nft",
];

/// `nft -c -f` needs CAP_NET_ADMIN (it validates against the kernel without committing).
/// Set `LACE_SKIP_NFT_CHECK=1` only where no nft binary or privilege is available.
#[test]
fn golden_nft_passes_nft_check_mode() {
    if std::env::var_os("LACE_SKIP_NFT_CHECK").is_some() {
        eprintln!("skipped: LACE_SKIP_NFT_CHECK is set");
        return;
    }
    for name in GOLDEN_NFT {
        nft_check(
            &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/golden")
                .join(name),
        );
    }
}

fn nft_check(path: &std::path::Path) {
    let out = Command::new("nft")
        .arg("-c")
        .arg("-f")
        .arg(path)
        .output()
        .expect(
            "running `nft` (Debian package nftables; set LACE_SKIP_NFT_CHECK=1 where unavailable)",
        );
    assert!(
        out.status.success(),
        "nft -c -f {} failed: {}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every node of the golden cluster produces a ruleset nft accepts (not only the golden one).
#[test]
fn every_node_ruleset_passes_nft_check_mode() {
    if std::env::var_os("LACE_SKIP_NFT_CHECK").is_some() {
        eprintln!("skipped: LACE_SKIP_NFT_CHECK is set");
        return;
    }
    for (state, node) in ["node-1", "node-2", "node-3"].into_iter().flat_map(|n| {
        [
            (common::golden_cluster(), n),
            (common::golden_cluster_mixed(), n),
        ]
    }) {
        let text = plan(node, &state, &[]).expect("plans").render_nft();
        let dir = std::env::temp_dir().join(format!("lace-nft-{}-{node}", std::process::id()));
        std::fs::write(&dir, &text).expect("write temp ruleset");
        let out = Command::new("nft")
            .arg("-c")
            .arg("-f")
            .arg(&dir)
            .output()
            .expect("running nft");
        let _ = std::fs::remove_file(&dir);
        assert!(
            out.status.success(),
            "{node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Kernels carrying "netfilter: nft_byteorder: remove multi-register support" (Debian's 6.12
/// since 6.12.115) reject, with EOPNOTSUPP, a `byteorder` expression whose length differs from
/// its element size; older kernels (6.1) accept it. nft 1.0.6 emits such an expression for a
/// one-byte host-endian field (`meta l4proto`) in a concatenation looked up in an interval set.
/// This reads the bytecode nft generates for the golden rulesets (`--debug=netlink`, printed
/// as `[ byteorder reg D = hton(reg S, SIZE, LEN) ]`) so the host catches what only a 6.12
/// kernel would refuse; the netns-6.12 tier of scripts/test.sh applies the ruleset for real.
#[test]
fn golden_nft_bytecode_has_no_byteorder_newer_kernels_reject() {
    if std::env::var_os("LACE_SKIP_NFT_CHECK").is_some() {
        eprintln!("skipped: LACE_SKIP_NFT_CHECK is set");
        return;
    }
    for name in GOLDEN_NFT {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
        let out = Command::new("nft")
            .arg("--debug=netlink")
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .output()
            .expect("running nft");
        assert!(
            out.status.success(),
            "nft --debug=netlink -c -f {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let bytecode = String::from_utf8_lossy(&out.stdout);
        let rules = bytecode.matches("[ lookup ").count();
        assert!(
            rules > 0,
            "{name}: no lookup expression in nft's debug output; did its format change?\n{bytecode}"
        );
        let bad: Vec<&str> = bytecode
            .lines()
            .filter(|l| l.contains("[ byteorder ") && !byteorder_len_equals_size(l))
            .collect();
        assert!(
            bad.is_empty(),
            "{name}: byteorder expressions with length != size (EOPNOTSUPP on 6.12):\n{}\nin:\n{bytecode}",
            bad.join("\n")
        );
    }
}

/// `[ byteorder reg 10 = hton(reg 10, 2, 1) ]` -> size 2, length 1 -> false.
fn byteorder_len_equals_size(line: &str) -> bool {
    let args = line
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(args, _)| args)
        .unwrap_or_else(|| panic!("unexpected byteorder expression: {line}"));
    let nums: Vec<&str> = args.split(',').map(str::trim).collect();
    match nums.as_slice() {
        [_, size, len] => size == len,
        _ => panic!("unexpected byteorder expression: {line}"),
    }
}
