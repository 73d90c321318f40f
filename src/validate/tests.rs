//! Tests of validation and admission: what each kind may hold and the messages that say why not.

use super::*;
use crate::api::{SelectorRequirement, ServiceRef};
use crate::state::Node;

fn subnet(cidr: &str, block_prefix: u8) -> Subnet {
    Subnet {
        cidr: cidr.parse().unwrap(),
        block_prefix,
    }
}

fn mk_network(subnets: &[(&str, u8)]) -> NetworkSpec {
    NetworkSpec {
        subnets: subnets.iter().map(|(c, b)| subnet(c, *b)).collect(),
        external: false,
        host_access: false,
    }
}

fn mk_binding(network: &str, priority: i32) -> NetworkBindingPolicySpec {
    NetworkBindingPolicySpec {
        network: network.into(),
        priority,
        ..Default::default()
    }
}

fn mk_route(from: &str, to: &str) -> NetworkRoutingPolicySpec {
    NetworkRoutingPolicySpec {
        from: from.into(),
        to: to.into(),
    }
}

fn req(op: SelectorOperator, values: &[&str]) -> SelectorRequirement {
    SelectorRequirement {
        key: "k".into(),
        operator: op,
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

/// A small valid cluster the failing examples each break in one way.
fn valid_state() -> ClusterState {
    let mut s = ClusterState::default();
    s.config.srv6_locator_prefix = Some("2001:db8:100::/48".parse().unwrap());
    s.networks.insert(
        "system".into(),
        mk_network(&[("10.244.0.0/18", 24), ("fd00:244::/56", 64)]),
    );
    s.networks
        .insert("default".into(), mk_network(&[("10.244.64.0/18", 24)]));
    s.networks.insert(
        "internet".into(),
        NetworkSpec {
            subnets: vec![],
            external: true,
            host_access: false,
        },
    );
    s.network_bindings
        .insert("system".into(), mk_binding("system", 1000));
    s.network_bindings
        .insert("default".into(), mk_binding("default", 0));
    s.service_bindings.insert(
        "kubernetes".into(),
        ServiceBindingPolicySpec {
            network: "internet".into(),
            services: vec![ServiceRef {
                namespace: "default".into(),
                name: "kubernetes".into(),
            }],
            ..Default::default()
        },
    );
    s.network_routes
        .insert("system-system".into(), mk_route("system", "system"));
    s.network_routes
        .insert("default-internet".into(), mk_route("default", "internet"));
    s.service_routes.insert(
        "system-kubernetes".into(),
        ServiceRoutingPolicySpec {
            from: "system".into(),
            to: "internet".into(),
            ..Default::default()
        },
    );
    for n in ["node-1", "node-2", "node-3"] {
        s.nodes.insert(n.into(), Node::default());
    }
    s
}

fn messages(state: &ClusterState) -> Vec<String> {
    match validate_cluster(state) {
        Ok(()) => vec![],
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn the_valid_examples_pass() {
    assert_eq!(messages(&valid_state()), Vec::<String>::new());
    // Boundaries that are still valid: priorities at both ends, a /31 block, /96 prefix
    // for 0 nodes, a block as large as the subnet, an IPv6-only Network.
    let mut s = valid_state();
    s.network_bindings
        .insert("low".into(), mk_binding("default", PRIORITY_MIN));
    s.network_bindings
        .insert("high".into(), mk_binding("default", PRIORITY_MAX));
    s.networks.insert(
        "tiny".into(),
        mk_network(&[("192.168.0.0/30", 31), ("fd01::/64", 64)]),
    );
    s.networks
        .insert("v6only".into(), mk_network(&[("fd02::/48", 127)]));
    assert_eq!(messages(&s), Vec::<String>::new());
    s.nodes.clear();
    s.config.srv6_locator_prefix = Some("fd00::/96".parse().unwrap());
    assert_eq!(messages(&s), Vec::<String>::new());
}

#[test]
fn every_rule_has_a_failing_example_with_its_message() {
    type Breaker = fn(&mut ClusterState);
    let cases: Vec<(&str, Breaker, Vec<&str>)> = vec![
        (
            "host bits",
            |s| { s.networks.insert("n".into(), mk_network(&[("10.1.0.1/16", 24)])); },
            vec!["Network/n: spec.subnets[0].cidr: 10.1.0.1/16 has host bits set (did you mean 10.1.0.0/16?)"],
        ),
        (
            "two IPv4 subnets",
            |s| { s.networks.insert("n".into(), mk_network(&[("10.1.0.0/16", 24), ("10.2.0.0/16", 24)])); },
            vec!["Network/n: spec.subnets[1]: a second IPv4 subnet (10.2.0.0/16): a Network has at most one IPv4 and one IPv6 subnet"],
        ),
        (
            "two IPv6 subnets",
            |s| { s.networks.insert("n".into(), mk_network(&[("fd01::/48", 64), ("fd02::/48", 64)])); },
            vec!["Network/n: spec.subnets[1]: a second IPv6 subnet (fd02::/48): a Network has at most one IPv4 and one IPv6 subnet"],
        ),
        (
            "external with subnets",
            |s| { s.networks.insert("n".into(), NetworkSpec { subnets: vec![subnet("10.1.0.0/16", 24)], external: true, host_access: false }); },
            vec!["Network/n: spec.subnets: an external Network must not have subnets (it stands for everything outside the cluster)"],
        ),
        (
            "external with hostAccess",
            |s| { s.networks.insert("n".into(), NetworkSpec { subnets: vec![], external: true, host_access: true }); },
            vec!["Network/n: spec.hostAccess: an external Network has no pods for the nodes to reach: remove hostAccess (or external)"],
        ),
        (
            "no subnets",
            |s| { s.networks.insert("n".into(), mk_network(&[])); },
            vec!["Network/n: spec.subnets: a Network needs an IPv4 and/or an IPv6 subnet (or external: true)"],
        ),
        (
            "block shorter than subnet",
            |s| { s.networks.insert("n".into(), mk_network(&[("10.1.0.0/16", 8)])); },
            vec!["Network/n: spec.subnets[0].blockPrefix: blockPrefix 8 is shorter than the prefix of subnet 10.1.0.0/16: a block must fit in the subnet"],
        ),
        (
            "block longer than /32",
            |s| { s.networks.insert("n".into(), mk_network(&[("10.1.0.0/16", 33)])); },
            vec!["Network/n: spec.subnets[0].blockPrefix: blockPrefix 33 is longer than /32, the longest IPv4 prefix"],
        ),
        (
            "block longer than /128",
            |s| { s.networks.insert("n".into(), mk_network(&[("fd01::/48", 129)])); },
            vec!["Network/n: spec.subnets[0].blockPrefix: blockPrefix 129 is longer than /128, the longest IPv6 prefix"],
        ),
        (
            "block without usable addresses",
            |s| { s.networks.insert("n".into(), mk_network(&[("10.1.0.0/16", 32), ("fd01::/48", 128)])); },
            vec![
                "Network/n: spec.subnets[0].blockPrefix: blockPrefix 32 leaves no usable addresses: a block needs at least 2 addresses (/31 or shorter)",
                "Network/n: spec.subnets[1].blockPrefix: blockPrefix 128 leaves no usable addresses: a block needs at least 2 addresses (/127 or shorter)",
            ],
        ),
        (
            "overlapping subnets, reported on the later Network",
            |s| {
                s.networks.insert("a".into(), mk_network(&[("10.244.0.0/16", 24)]));
                s.networks.insert("z".into(), mk_network(&[("fd00:244:0:80::/57", 64)]));
            },
            vec![
                "Network/default: spec.subnets[0].cidr: 10.244.64.0/18 overlaps 10.244.0.0/16 of Network a",
                "Network/system: spec.subnets[0].cidr: 10.244.0.0/18 overlaps 10.244.0.0/16 of Network a",
                "Network/z: spec.subnets[0].cidr: fd00:244:0:80::/57 overlaps fd00:244::/56 of Network system",
            ],
        ),
        (
            "priority too high",
            |s| { s.network_bindings.insert("p".into(), mk_binding("default", 1001)); },
            vec!["NetworkBindingPolicy/p: spec.priority: priority 1001 is outside 0..=1000"],
        ),
        (
            "priority too low on a ServiceBindingPolicy",
            |s| { s.service_bindings.get_mut("kubernetes").unwrap().priority = -1; },
            vec!["ServiceBindingPolicy/kubernetes: spec.priority: priority -1 is outside 0..=1000"],
        ),
        (
            "binding to a missing Network",
            |s| { s.network_bindings.insert("p".into(), mk_binding("nope", 1)); },
            vec!["NetworkBindingPolicy/p: spec.network: Network \"nope\" does not exist"],
        ),
        (
            "service binding to a missing Network",
            |s| { s.service_bindings.get_mut("kubernetes").unwrap().network = "nope".into(); },
            vec!["ServiceBindingPolicy/kubernetes: spec.network: Network \"nope\" does not exist"],
        ),
        (
            "pods bound to an external Network",
            |s| { s.network_bindings.insert("p".into(), mk_binding("internet", 1)); },
            vec!["NetworkBindingPolicy/p: spec.network: pods cannot be bound to the external Network \"internet\" (only Services can)"],
        ),
        (
            "routing from and to missing Networks",
            |s| { s.network_routes.insert("r".into(), mk_route("a", "b")); },
            vec![
                "NetworkRoutingPolicy/r: spec.from: Network \"a\" does not exist",
                "NetworkRoutingPolicy/r: spec.to: Network \"b\" does not exist",
            ],
        ),
        (
            "service routing to a missing Network",
            |s| { s.service_routes.get_mut("system-kubernetes").unwrap().to = "gone".into(); },
            vec!["ServiceRoutingPolicy/system-kubernetes: spec.to: Network \"gone\" does not exist"],
        ),
        (
            "In without values, Exists with values",
            |s| {
                let mut p = mk_binding("default", 1);
                p.namespace_selector.match_expressions = vec![req(SelectorOperator::In, &[]), req(SelectorOperator::In, &["x"])];
                p.pod_selector.match_expressions = vec![req(SelectorOperator::Exists, &["x"])];
                s.network_bindings.insert("p".into(), p);
            },
            vec![
                "NetworkBindingPolicy/p: spec.namespaceSelector.matchExpressions[0].values: operator In needs at least one value",
                "NetworkBindingPolicy/p: spec.podSelector.matchExpressions[0].values: operator Exists must not have values",
            ],
        ),
        (
            "NotIn without values, DoesNotExist with values",
            |s| {
                let r = s.service_routes.get_mut("system-kubernetes").unwrap();
                r.namespace_selector.match_expressions = vec![req(SelectorOperator::DoesNotExist, &[]), req(SelectorOperator::DoesNotExist, &["v"])];
                r.service_selector.match_expressions = vec![req(SelectorOperator::NotIn, &[])];
                let b = s.service_bindings.get_mut("kubernetes").unwrap();
                b.service_selector.match_expressions = vec![req(SelectorOperator::NotIn, &[])];
            },
            vec![
                "ServiceBindingPolicy/kubernetes: spec.serviceSelector.matchExpressions[0].values: operator NotIn needs at least one value",
                "ServiceRoutingPolicy/system-kubernetes: spec.namespaceSelector.matchExpressions[1].values: operator DoesNotExist must not have values",
                "ServiceRoutingPolicy/system-kubernetes: spec.serviceSelector.matchExpressions[0].values: operator NotIn needs at least one value",
            ],
        ),
        (
            "locator prefix longer than /96",
            |s| { s.config.srv6_locator_prefix = Some("2001:db8::/112".parse().unwrap()); },
            vec!["config: srv6LocatorPrefix: srv6LocatorPrefix 2001:db8::/112 leaves 16 bits for the SID function and arguments, at least 32 are needed (use /96 or shorter)"],
        ),
        (
            "locator prefix with host bits",
            |s| { s.config.srv6_locator_prefix = Some("2001:db8::1/64".parse().unwrap()); },
            vec!["config: srv6LocatorPrefix: srv6LocatorPrefix 2001:db8::1/64 has host bits set (did you mean 2001:db8::/64?)"],
        ),
        (
            "locator prefix overlapping a Network",
            |s| { s.config.srv6_locator_prefix = Some("fd00:244::/64".parse().unwrap()); },
            vec!["config: srv6LocatorPrefix: srv6LocatorPrefix fd00:244::/64 overlaps subnet fd00:244::/56 of Network system"],
        ),
        (
            "too few node bits",
            |s| { s.config.srv6_locator_prefix = Some("2001:db8::/95".parse().unwrap()); },
            vec!["config: srv6LocatorPrefix: srv6LocatorPrefix 2001:db8::/95 has 1 node bits, room for 1 nodes, but the cluster has 3"],
        ),
    ];
    for (what, brk, want) in cases {
        let mut s = valid_state();
        brk(&mut s);
        assert_eq!(messages(&s), want, "case: {what}");
    }
}

#[test]
fn a_prefix_exactly_full_of_nodes_is_valid() {
    let mut s = valid_state();
    // /94 leaves 2 node bits: indices 1..=3 for the 3 nodes.
    s.config.srv6_locator_prefix = Some("2001:db8::/94".parse().unwrap());
    assert_eq!(messages(&s), Vec::<String>::new());
    s.nodes.insert("node-4".into(), Node::default());
    assert_eq!(
        messages(&s),
        ["config: srv6LocatorPrefix: srv6LocatorPrefix 2001:db8::/94 has 2 node bits, room for 3 nodes, but the cluster has 4"]
    );
}

#[test]
fn per_object_functions_agree_with_the_cluster_check() {
    let s = valid_state();
    let bad = mk_network(&[("10.1.0.1/16", 24)]);
    let errs = validate_network("n", &bad).unwrap_err();
    assert_eq!(errs[0].path, "Network/n: spec.subnets[0].cidr");
    assert!(validate_network_binding_policy("p", &mk_binding("internet", 5), &s.networks).is_err());
    assert!(validate_network_binding_policy("p", &mk_binding("system", 5), &s.networks).is_ok());
    assert!(validate_network_routing_policy("r", &mk_route("system", "x"), &s.networks).is_err());
    let mut nets = s.networks.clone();
    nets.insert("new".into(), mk_network(&[("10.244.1.0/24", 26)]));
    assert_eq!(
        validate_networks_disjoint(&nets).unwrap_err()[0].to_string(),
        "Network/system: spec.subnets[0].cidr: 10.244.0.0/18 overlaps 10.244.1.0/24 of Network new"
    );
    assert!(validate_config(&s.config, 3, &s.networks).is_ok());
}

#[test]
fn immutable_fields_cannot_change() {
    let old = mk_network(&[("10.1.0.0/16", 24)]);
    assert!(validate_network_update("n", &old, &old).is_ok());
    let new = mk_network(&[("10.2.0.0/16", 24)]);
    assert_eq!(
        validate_network_update("n", &old, &new)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["Network/n: spec.subnets: field is immutable"]
    );
    let ext = NetworkSpec {
        subnets: vec![],
        external: true,
        host_access: false,
    };
    assert_eq!(
        validate_network_update("n", &old, &ext)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "Network/n: spec.external: field is immutable",
            "Network/n: spec.subnets: field is immutable",
        ]
    );
    let f1 = NetworkAllocationSpec { function: 1 };
    let f2 = NetworkAllocationSpec { function: 2 };
    assert!(validate_network_allocation_update("n", &f1, &f1).is_ok());
    assert_eq!(
        validate_network_allocation_update("n", &f1, &f2).unwrap_err()[0].to_string(),
        "NetworkAllocation/n: spec.function: field is immutable"
    );
    let a = NodeAllocationSpec {
        index: 1,
        locator: "2001:db8:100::1:0:0/96".parse().unwrap(),
        underlay: crate::api::Underlay {
            ipv4: None,
            ipv6: Some("fd00:fab::1".parse().unwrap()),
        },
    };
    let mut moved_underlay = a.clone();
    moved_underlay.underlay.ipv6 = Some("fd00:fab::9".parse().unwrap());
    moved_underlay.underlay.ipv4 = Some("192.168.0.1".parse().unwrap());
    assert!(validate_node_allocation_update("node-1", &a, &moved_underlay).is_ok());
    let mut b = a.clone();
    b.index = 2;
    b.locator = "2001:db8:100::2:0:0/96".parse().unwrap();
    assert_eq!(
        validate_node_allocation_update("node-1", &a, &b)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "NodeAllocation/node-1: spec.index: field is immutable",
            "NodeAllocation/node-1: spec.locator: field is immutable",
        ]
    );
}

#[test]
fn admit_leaves_out_only_the_bad_objects_and_says_why() {
    let mut s = ClusterState::default();
    // "aaa" sorts first but arrived last (no allocation): it is the one left out.
    s.networks
        .insert("system".into(), mk_network(&[("10.244.0.0/18", 24)]));
    s.networks
        .insert("aaa".into(), mk_network(&[("10.244.1.0/24", 26)]));
    s.network_allocations
        .insert("system".into(), NetworkAllocationSpec { function: 3 });
    // b overlaps c; neither allocated: the later name (c) goes. d overlaps only c, so it
    // stays (c is out, it pushes nothing out).
    s.networks
        .insert("b".into(), mk_network(&[("10.1.0.0/16", 24)]));
    s.networks.insert(
        "c".into(),
        mk_network(&[("10.1.0.0/17", 24), ("fd00:2::/48", 64)]),
    );
    s.networks
        .insert("d".into(), mk_network(&[("fd00:2::/56", 64)]));
    s.networks
        .insert("bad".into(), mk_network(&[("10.9.0.1/16", 24)]));
    s.network_bindings
        .insert("to-aaa".into(), mk_binding("aaa", 10));
    s.network_bindings
        .insert("to-system".into(), mk_binding("system", 10));
    s.network_bindings
        .insert("too-high".into(), mk_binding("system", 5000));
    s.network_routes.insert("b-b".into(), mk_route("b", "b"));
    s.network_routes.insert("b-c".into(), mk_route("b", "c"));
    let (admitted, rejected) = admit(s.clone());
    assert_eq!(
        admitted.networks.keys().collect::<Vec<_>>(),
        ["b", "d", "system"]
    );
    assert_eq!(
        admitted.network_bindings.keys().collect::<Vec<_>>(),
        ["to-system"]
    );
    assert_eq!(admitted.network_routes.keys().collect::<Vec<_>>(), ["b-b"]);
    let lines: Vec<String> = rejected
        .iter()
        .map(|r| format!("{} {}: {r}", r.kind, r.name))
        .collect();
    assert_eq!(
        lines,
        [
            "Network aaa: Network/aaa: spec.subnets[0].cidr: 10.244.1.0/24 overlaps 10.244.0.0/18 of Network system, which came first",
            "Network bad: Network/bad: spec.subnets[0].cidr: 10.9.0.1/16 has host bits set (did you mean 10.9.0.0/16?)",
            "Network c: Network/c: spec.subnets[0].cidr: 10.1.0.0/17 overlaps 10.1.0.0/16 of Network b, which came first",
            "NetworkBindingPolicy to-aaa: NetworkBindingPolicy/to-aaa: spec.network: Network \"aaa\" does not exist",
            "NetworkBindingPolicy too-high: NetworkBindingPolicy/too-high: spec.priority: priority 5000 is outside 0..=1000",
            "NetworkRoutingPolicy b-c: NetworkRoutingPolicy/b-c: spec.to: Network \"c\" does not exist",
        ]
    );
    // What remains is valid, and admitting it again changes nothing.
    assert_eq!(validate_cluster(&admitted), Ok(()));
    let (again, none) = admit(admitted.clone());
    assert_eq!((again, none), (admitted, vec![]));
}
