//! Tests of the agent's CNI handlers: host veth names, results, CHECK and the request paths.

use super::*;

#[test]
fn host_ifnames_are_short_stable_and_distinct() {
    let a = host_ifname("0123456789abcdef", "eth0");
    assert_eq!(a.len(), 14);
    assert!(a.len() <= crate::wire::MAX_IFNAME_LEN);
    assert!(a.starts_with(HOST_IFNAME_PREFIX));
    assert!(a[3..].chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(a, host_ifname("0123456789abcdef", "eth0"));
    assert_ne!(a, host_ifname("0123456789abcdef", "eth1"));
    // The separator keeps ("ab", "c") and ("a", "bc") apart.
    assert_ne!(host_ifname("ab", "c"), host_ifname("a", "bc"));
    // FNV-1a 64 reference value: the hash of the empty input is the offset basis, so the
    // name of ("", "") is the basis ^ 0 * prime of the single NUL byte.
    let expected = (0xcbf2_9ce4_8422_2325_u64).wrapping_mul(0x0100_0000_01b3) & ((1 << 44) - 1);
    assert_eq!(host_ifname("", ""), format!("lp-{expected:011x}"));
    let names: BTreeSet<String> = (0..10_000)
        .map(|i| host_ifname(&format!("c{i}"), "eth0"))
        .collect();
    assert_eq!(names.len(), 10_000, "no collision among 10k containers");
}

fn agent(node: &str, dir: &Path) -> Arc<Agent> {
    agent_with(node, dir, super::super::source::Known::default())
}

fn agent_with(node: &str, dir: &Path, source: super::super::source::Known) -> Arc<Agent> {
    Arc::new(Agent::new(
        node.into(),
        super::super::ipam::IpamStore::open(dir).unwrap(),
        Arc::new(super::super::PlanSink::default()),
        Arc::new(source),
    ))
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn example() -> crate::state::ClusterState {
    crate::load::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cluster")).unwrap()
}

fn status(agent: &Arc<Agent>) -> Result<Option<CniResult>, CniError> {
    let req = Request::without_attachment(Command::Status, crate::wire::CniVersion::V1_1_0);
    block_on(handle(agent, req))
}

#[test]
fn placement_follows_bindings_and_blocks() {
    let dir = tempfile::tempdir().unwrap();
    // The source knows default/web (not in the manifests) with no labels.
    let pod = ObjectKey::new("default", "web");
    let source = super::super::source::Known([(pod.clone(), Pod::default())].into());
    let a = agent_with("node-1", dir.path(), source);
    let place = |key: &ObjectKey| block_on(place(&a, key));
    let err = place(&pod).err().unwrap();
    assert_eq!(err.code, ErrorCode::TRY_AGAIN_LATER);
    assert!(err.msg.contains("not ready"), "{}", err.msg);
    assert_eq!(status(&a).unwrap_err().code, ErrorCode::NOT_AVAILABLE);

    a.set_state(Ok(example()));
    a.set_serving();
    assert_eq!(status(&a).unwrap(), None);
    let p = place(&pod).unwrap();
    assert_eq!(
        (p.network.as_str(), p.vrf.as_str(), p.table),
        ("default", "lv-default", 1_000_001)
    );
    assert_eq!(
        p.blocks,
        ["10.244.64.0/24", "fd00:244:0:100::/64"].map(|b| b.parse::<IpNet>().unwrap()),
        "node-1 has index 1: the first block of each subnet"
    );
    // A pod in the state is placed by its own labels, without asking the source.
    let sys = place(&ObjectKey::new("kube-system", "coredns-1")).unwrap();
    assert_eq!(sys.network, "system");
    // A pod neither the state nor the source knows: retryable, says so.
    let err = place(&ObjectKey::new("default", "ghost")).err().unwrap();
    assert_eq!(err.code, ErrorCode::TRY_AGAIN_LATER);
    assert!(
        err.msg.contains("default/ghost does not exist"),
        "{}",
        err.msg
    );

    // No binding: retryable, names the pod.
    let mut unbound = example();
    unbound.network_bindings.clear();
    a.set_state(Ok(unbound));
    let err = place(&pod).err().unwrap();
    assert_eq!(err.code, ErrorCode::TRY_AGAIN_LATER);
    assert!(
        err.msg.contains("default/web") && err.msg.contains("NetworkBindingPolicy"),
        "{}",
        err.msg
    );

    // Bound to a Network without a block here: retryable, names Network and node.
    let mut no_block = example();
    no_block.node_allocations.get_mut("node-1").unwrap().index = 65; // beyond the 64 blocks of default's subnets
    a.set_state(Ok(no_block));
    let err = place(&pod).err().unwrap();
    assert_eq!(err.code, ErrorCode::TRY_AGAIN_LATER);
    assert!(
        err.msg.contains("\"default\"") && err.msg.contains("\"node-1\""),
        "{}",
        err.msg
    );

    // An invalid object is left out, the rest keeps working: a binding naming a missing
    // Network does not stop default/web from being placed.
    let mut one_bad = example();
    one_bad.network_bindings.insert(
        "broken".into(),
        crate::api::NetworkBindingPolicySpec {
            network: "nope".into(),
            priority: 1000,
            ..Default::default()
        },
    );
    a.set_state(Ok(one_bad));
    assert_eq!(place(&pod).unwrap().network, "default");
    assert!(a.is_ready());
}

#[test]
fn a_node_without_allocation_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let a = agent("node-9", dir.path());
    a.set_serving();
    a.set_state(Ok(example()));
    let err = status(&a).unwrap_err();
    assert_eq!(err.code, ErrorCode::NOT_AVAILABLE);
    assert!(
        err.msg.contains("node-9") && err.msg.contains("lace-agent allocate"),
        "{}",
        err.msg
    );
    assert!(!a.is_ready());
}

#[test]
fn pod_mtu_leaves_room_for_one_segment() {
    let dir = tempfile::tempdir().unwrap();
    // 1500 - (40 IPv6 + 8 SRH + 16 segment) until the uplink is found.
    assert_eq!(agent("node-1", dir.path()).pod_mtu(), 1436);
}

/// examples/cluster with IPv4 InternalIPs only (as the demo's `--underlay ipv4`).
fn example_ipv4() -> crate::state::ClusterState {
    let mut s = example();
    for a in s.node_allocations.values_mut() {
        a.underlay.ipv6 = None;
    }
    for n in s.nodes.values_mut() {
        n.internal_ips.retain(|ip| ip.is_ipv4());
    }
    s
}

#[test]
fn the_underlay_facts_re_plan_each_pair_report_it_and_gate_readiness() {
    use crate::plan::underlay::{PeerPath, UnderlayFacts};
    let dir = tempfile::tempdir().unwrap();
    let a = agent("node-1", dir.path());
    a.set_serving();
    a.set_state(Ok(example_ipv4()));
    // Peers a link-local path could serve, uplink not looked at yet: not ready.
    assert!(matches!(
        a.not_ready_reason(),
        Some(super::super::NotReady::UnderlayUnknown)
    ));
    let kinds = |a: &Arc<Agent>| -> Vec<&'static str> {
        let l = a.loaded().unwrap();
        l.planner
            .base()
            .peers
            .values()
            .map(PeerPath::kind)
            .collect()
    };
    assert_eq!(kinds(&a), ["fou", "fou"]);
    let generation = a.generation();
    let facts = UnderlayFacts {
        uplink_ipv6: true,
        on_link: ["node-2".to_string(), "node-3".to_string()].into(),
        answering: ["node-2".to_string()].into(),
        answered: ["node-2".to_string()].into(),
        uplink_mtu: Some(1500),
    };
    a.set_underlay_facts(facts.clone());
    a.underlay_looked();
    assert!(a.is_ready(), "{:?}", a.not_ready_reason());
    assert_eq!(kinds(&a), ["link-local", "fou"]);
    assert!(a.generation() > generation, "new facts are a new plan");
    // The same facts again change nothing.
    let generation = a.generation();
    a.set_underlay_facts(facts.clone());
    assert_eq!(a.generation(), generation);
    // A new state keeps the facts.
    a.set_state(Ok(example_ipv4()));
    assert_eq!(kinds(&a), ["link-local", "fou"]);
    let text = crate::telemetry::encode(crate::telemetry::Probes::registry(&*a));
    for line in [
        "lace_underlay_peers{path=\"link-local\"} 1",
        "lace_underlay_peers{path=\"fou\"} 1",
        "lace_underlay_path_changes_total{from=\"fou\",to=\"link-local\"} 1",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
    // node-3 shares the segment but never answered (its IPv6 may be off): its pair stays on
    // fou and the pods get fou's MTU.
    block_on(a.refresh_underlay_mtu());
    assert_eq!(a.pod_mtu(), 1408);
    // Both answered once: the pods get the link-local path's MTU, also while node-3 is
    // back on fou for a moment.
    let mut both = facts.clone();
    both.answered.insert("node-3".into());
    a.set_underlay_facts(both);
    assert_eq!(kinds(&a), ["link-local", "fou"]);
    assert_eq!(a.pod_mtu(), 1436);
    // The uplink loses IPv6: every pair on fou, the pods' MTU for fou from then on.
    a.set_underlay_facts(UnderlayFacts {
        uplink_ipv6: false,
        ..facts
    });
    assert_eq!(kinds(&a), ["fou", "fou"]);
    block_on(a.refresh_underlay_mtu());
    assert_eq!(a.pod_mtu(), 1408);
}

#[test]
fn host_macs_are_local_unicast_and_stable() {
    let m = host_mac("0123456789abcdef", "eth0");
    assert_eq!(m[0] & 0x01, 0, "unicast");
    assert_eq!(m[0] & 0x02, 0x02, "locally administered");
    assert_eq!(m, host_mac("0123456789abcdef", "eth0"));
    assert_ne!(m, host_mac("0123456789abcdef", "eth1"));
}

#[test]
fn result_shape() {
    let ips: Vec<IpNet> = vec![
        "10.0.0.5/32".parse().unwrap(),
        "fd00::5/128".parse().unwrap(),
    ];
    let r = result(
        "eth0",
        "lp-1",
        "aa:aa:aa:aa:aa:aa",
        "bb:bb:bb:bb:bb:bb",
        1436,
        Path::new("/run/netns/p"),
        &ips,
    );
    r.validate().unwrap();
    assert_eq!(r.ips[0].gateway, Some("169.254.1.1".parse().unwrap()));
    assert_eq!(r.ips[1].gateway, Some("fe80::1".parse().unwrap()));
    assert_eq!(r.routes[0].dst.to_string(), "0.0.0.0/0");
    assert_eq!(r.routes[1].dst.to_string(), "::/0");
    assert_eq!(r.interfaces[1].sandbox.as_deref(), Some("/run/netns/p"));
    assert!(r.ips.iter().all(|c| c.interface == Some(1)));
}

#[test]
fn loopback_is_served_before_the_agent_is_ready_in_the_reference_plugins_shape() {
    let dir = tempfile::tempdir().unwrap();
    let a = agent("node-1", dir.path());
    assert!(a.not_ready_reason().is_some());
    let mut req =
        Request::without_attachment(Command::LoopbackAdd, crate::wire::CniVersion::V0_3_1);
    req.netns = Some("/var/run/netns/cni-1".into());
    let r = block_on(handle(&a, req.clone())).unwrap().unwrap();
    r.validate().unwrap();
    assert_eq!(
        serde_json::to_value(r.to_json(crate::wire::CniVersion::V0_3_1)).unwrap(),
        serde_json::json!({
            "cniVersion": "0.3.1",
            "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00",
                            "sandbox": "/var/run/netns/cni-1"}],
            "ips": [{"version": "4", "address": "127.0.0.1/8", "interface": 0},
                    {"version": "6", "address": "::1/128", "interface": 0}]
        })
    );
    // The plan sink's `lo` has no record to check against, but CHECK asks the kernel:
    // none here, so it names the missing interface.
    req.command = Command::LoopbackCheck;
    let err = block_on(handle(&a, req.clone())).unwrap_err();
    assert_eq!(err.code, CHECK_FAILED);
    assert!(
        err.msg
            .contains("no loopback interface lo in /var/run/netns/cni-1"),
        "{}",
        err.msg
    );
    req.netns = None;
    let err = block_on(handle(&a, req)).unwrap_err();
    assert_eq!(err.code, ErrorCode::INVALID_ENVIRONMENT);
    assert!(err.msg.contains("CNI_NETNS"), "{}", err.msg);
}
