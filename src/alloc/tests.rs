//! Tests of the allocator: locators, blocks and SID functions, from scratch and incrementally.

use std::collections::BTreeSet;

use super::*;
use crate::api::NetworkSpec;
use crate::state::Node;
use proptest::prelude::*;

const PREFIX: &str = "2001:db8:100::/48";

fn mk_node(i: u8) -> Node {
    Node {
        labels: BTreeMap::new(),
        internal_ips: vec![
            IpAddr::V4(Ipv4Addr::new(192, 168, 0, i)),
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0xfab, 0, 0, 0, 0, 0, u16::from(i))),
        ],
    }
}

fn mk_network(subnets: &[(&str, u8)]) -> NetworkSpec {
    NetworkSpec {
        subnets: subnets
            .iter()
            .map(|(c, b)| Subnet {
                cidr: c.parse().unwrap(),
                block_prefix: *b,
            })
            .collect(),
        external: false,
        host_access: false,
    }
}

fn external() -> NetworkSpec {
    NetworkSpec {
        subnets: vec![],
        external: true,
        host_access: false,
    }
}

/// Nodes `node-<i>` and Networks `a` (dual-stack), `b` (IPv4) and `internet` (external).
fn mk_state(nodes: &[u8]) -> ClusterState {
    let mut s = ClusterState::default();
    s.config.srv6_locator_prefix = Some(PREFIX.parse().unwrap());
    s.networks.insert(
        "a".into(),
        mk_network(&[("10.0.0.0/16", 24), ("fd00:a::/56", 64)]),
    );
    s.networks
        .insert("b".into(), mk_network(&[("10.1.0.0/16", 20)]));
    s.networks.insert("internet".into(), external());
    for &i in nodes {
        s.nodes.insert(format!("node-{i}"), mk_node(i));
    }
    s
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

fn run(state: &mut ClusterState) -> Allocation {
    let alloc = allocate(state).unwrap();
    alloc.clone().store_in(state);
    alloc
}

/// node `name`'s blocks of Network `network` in `state` (allocated).
fn blocks_of(state: &ClusterState, alloc: &Allocation, node: &str, network: &str) -> Vec<IpNet> {
    node_blocks(
        alloc.node_allocations[node].index,
        &state.networks[network].subnets,
    )
}

#[test]
fn a_small_cluster_from_scratch() {
    let state = mk_state(&[1, 2, 3]);
    let alloc = allocate(&state).unwrap();
    let functions: Vec<(&str, u16)> = alloc
        .network_allocations
        .iter()
        .map(|(n, a)| (n.as_str(), a.function))
        .collect();
    assert_eq!(functions, [("a", 1), ("b", 2), ("internet", 3)]);
    let want = [
        (
            "node-1",
            1,
            "2001:db8:100::1:0:0/96",
            ("192.168.0.1", "fd00:fab::1"),
            ["10.0.0.0/24", "fd00:a::/64"],
            "10.1.0.0/20",
        ),
        (
            "node-2",
            2,
            "2001:db8:100::2:0:0/96",
            ("192.168.0.2", "fd00:fab::2"),
            ["10.0.1.0/24", "fd00:a:0:1::/64"],
            "10.1.16.0/20",
        ),
        (
            "node-3",
            3,
            "2001:db8:100::3:0:0/96",
            ("192.168.0.3", "fd00:fab::3"),
            ["10.0.2.0/24", "fd00:a:0:2::/64"],
            "10.1.32.0/20",
        ),
    ];
    assert_eq!(alloc.node_allocations.len(), want.len());
    for (node, index, locator, (v4, v6), a, b) in want {
        let got = &alloc.node_allocations[node];
        assert_eq!(got.index, index, "{node}");
        assert_eq!(got.locator, locator.parse::<Ipv6Net>().unwrap(), "{node}");
        assert_eq!(
            got.underlay,
            Underlay {
                ipv4: Some(v4.parse().unwrap()),
                ipv6: Some(v6.parse().unwrap())
            },
            "{node}"
        );
        assert_eq!(blocks_of(&state, &alloc, node, "a"), nets(&a), "{node}");
        assert_eq!(blocks_of(&state, &alloc, node, "b"), nets(&[b]), "{node}");
        assert!(
            blocks_of(&state, &alloc, node, "internet").is_empty(),
            "external Networks have no blocks"
        );
    }
}

#[test]
fn nodes_with_one_family_get_that_underlay() {
    let mut s = mk_state(&[1, 2]);
    s.nodes.get_mut("node-1").unwrap().internal_ips.truncate(1); // IPv4 only
    s.nodes.get_mut("node-2").unwrap().internal_ips.remove(0); // IPv6 only
    let alloc = allocate(&s).unwrap();
    assert_eq!(
        alloc.node_allocations["node-1"].underlay,
        Underlay {
            ipv4: Some(Ipv4Addr::new(192, 168, 0, 1)),
            ipv6: None
        }
    );
    assert_eq!(
        alloc.node_allocations["node-2"].underlay,
        Underlay {
            ipv4: None,
            ipv6: Some("fd00:fab::2".parse().unwrap())
        }
    );
    // Several InternalIPs of a family: the first is the underlay (as the kubelet orders them).
    s.nodes.get_mut("node-1").unwrap().internal_ips =
        vec!["10.0.0.9".parse().unwrap(), "192.168.0.1".parse().unwrap()];
    assert_eq!(
        allocate(&s).unwrap().node_allocations["node-1"]
            .underlay
            .ipv4,
        Some(Ipv4Addr::new(10, 0, 0, 9))
    );
    // Addresses no other node can send to do not count: the first usable one does.
    s.nodes.get_mut("node-1").unwrap().internal_ips =
        ["fe80::1", "127.0.0.1", "169.254.3.4", "10.0.0.9"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
    assert_eq!(
        allocate(&s).unwrap().node_allocations["node-1"].underlay,
        Underlay {
            ipv4: Some(Ipv4Addr::new(10, 0, 0, 9)),
            ipv6: None
        }
    );
    // Nothing usable at all: reported by name.
    s.nodes.get_mut("node-1").unwrap().internal_ips =
        vec!["fe80::1".parse().unwrap(), "0.0.0.0".parse().unwrap()];
    assert_eq!(
        allocate(&s).unwrap_err(),
        AllocError::NoUnderlay {
            node: "node-1".into()
        }
    );
}

#[test]
fn blocks_follow_the_node_index() {
    let subnets = mk_network(&[("10.9.0.0/22", 24), ("fd00:9::/62", 64)]).subnets;
    assert_eq!(
        node_blocks(0, &subnets),
        nets(&[]),
        "index 0 is never a node's"
    );
    assert_eq!(
        node_blocks(1, &subnets),
        nets(&["10.9.0.0/24", "fd00:9::/64"])
    );
    assert_eq!(
        node_blocks(4, &subnets),
        nets(&["10.9.3.0/24", "fd00:9:0:3::/64"])
    );
    assert_eq!(node_blocks(5, &subnets), nets(&[]), "beyond the 4 blocks");
    assert_eq!(block_capacity(&subnets), 4);
    // The smaller subnet limits both families (all or nothing).
    let uneven = mk_network(&[("10.9.0.0/23", 24), ("fd00:9::/56", 64)]).subnets;
    assert_eq!(block_capacity(&uneven), 2);
    assert_eq!(node_blocks(3, &uneven), nets(&[]));
    assert_eq!(block_capacity(&[]), 0);
    assert_eq!(node_blocks(1, &[]), nets(&[]));
    // A /0 of /64 blocks saturates instead of overflowing.
    let huge = mk_network(&[("::/0", 64)]).subnets;
    assert_eq!(block_capacity(&huge), u32::MAX);
    assert_eq!(node_blocks(u32::MAX, &huge).len(), 1);
    // Reverse: which node index holds an address.
    let owner = |a: &str| block_owner(&subnets[0], a.parse().unwrap());
    assert_eq!(owner("10.9.0.0"), Some(1));
    assert_eq!(owner("10.9.2.77"), Some(3));
    assert_eq!(owner("10.9.4.1"), None, "outside the subnet");
    assert_eq!(owner("fd00:9::1"), None, "other family");
    assert_eq!(
        block_owner(&subnets[1], "fd00:9:0:3::5".parse().unwrap()),
        Some(4)
    );
}

#[test]
fn nodes_beyond_a_networks_blocks_are_named() {
    let mut s = mk_state(&[1, 2, 3]);
    s.networks
        .insert("small".into(), mk_network(&[("10.9.0.0/30", 31)]));
    let alloc = allocate(&s).unwrap();
    assert_eq!(
        nodes_without_blocks(&s.networks["small"], &alloc.node_allocations),
        ["node-3"]
    );
    assert!(nodes_without_blocks(&s.networks["a"], &alloc.node_allocations).is_empty());
    assert!(nodes_without_blocks(&s.networks["internet"], &alloc.node_allocations).is_empty());
}

#[test]
fn removal_frees_and_the_lowest_free_is_reused() {
    let mut s = mk_state(&[1, 2, 3]);
    let first = run(&mut s);
    s.nodes.remove("node-2");
    s.networks.remove("a");
    let second = run(&mut s);
    assert_eq!(second.node_allocations["node-1"].index, 1);
    assert_eq!(
        second.node_allocations["node-3"],
        first.node_allocations["node-3"]
    );
    assert!(!second.network_allocations.contains_key("a"));
    // A new node takes node-2's index (so its blocks); a new Network takes a's function.
    s.nodes.insert("node-9".into(), mk_node(9));
    s.networks
        .insert("c".into(), mk_network(&[("10.2.0.0/16", 24)]));
    let third = run(&mut s);
    let n9 = &third.node_allocations["node-9"];
    assert_eq!(n9.index, 2);
    assert_eq!(n9.locator, first.node_allocations["node-2"].locator);
    assert_eq!(third.network_allocations["c"].function, 1);
    assert_eq!(third.network_allocations["b"].function, 2);
    let c_blocks: Vec<_> = third
        .node_allocations
        .keys()
        .map(|n| blocks_of(&s, &third, n, "c")[0].to_string())
        .collect();
    assert_eq!(c_blocks, ["10.2.0.0/24", "10.2.2.0/24", "10.2.1.0/24"]);
}

#[test]
fn existing_allocations_are_kept_even_when_not_lowest() {
    let mut s = mk_state(&[1, 2]);
    s.network_allocations
        .insert("b".into(), NetworkAllocationSpec { function: 40 });
    s.node_allocations.insert(
        "node-2".into(),
        NodeAllocationSpec {
            index: 7,
            locator: "::/96".parse().unwrap(), // stale: re-derived from the index
            underlay: Underlay {
                ipv4: None,
                ipv6: Some("fd00:fab::99".parse().unwrap()), // stale: follows the Node
            },
        },
    );
    let alloc = allocate(&s).unwrap();
    assert_eq!(alloc.network_allocations["b"].function, 40);
    assert_eq!(alloc.network_allocations["a"].function, 1);
    let n2 = &alloc.node_allocations["node-2"];
    assert_eq!(n2.index, 7);
    assert_eq!(
        n2.locator,
        "2001:db8:100::7:0:0/96".parse::<Ipv6Net>().unwrap()
    );
    assert_eq!(n2.underlay, s.nodes["node-2"].underlay());
    assert_eq!(alloc.node_allocations["node-1"].index, 1);
}

#[test]
fn invalid_existing_values_are_replaced() {
    let mut s = mk_state(&[1, 2]);
    s.network_allocations
        .insert("a".into(), NetworkAllocationSpec { function: 0 });
    s.network_allocations
        .insert("b".into(), NetworkAllocationSpec { function: 5 });
    s.network_allocations
        .insert("internet".into(), NetworkAllocationSpec { function: 5 });
    let claim = |index| NodeAllocationSpec {
        index,
        locator: "::/96".parse().unwrap(),
        underlay: Underlay::default(),
    };
    // Both nodes claim index 3; node-1 (first by name) keeps it.
    s.node_allocations.insert("node-1".into(), claim(3));
    s.node_allocations.insert("node-2".into(), claim(3));
    let alloc = allocate(&s).unwrap();
    let f: Vec<u16> = alloc
        .network_allocations
        .values()
        .map(|a| a.function)
        .collect();
    assert_eq!(f, [1, 5, 2], "a: 0 is reserved; internet: 5 is b's");
    assert_eq!(alloc.node_allocations["node-1"].index, 3);
    assert_eq!(alloc.node_allocations["node-2"].index, 1);
    // An index beyond the prefix's node bits is replaced too.
    s.config.srv6_locator_prefix = Some("2001:db8:100::/90".parse().unwrap());
    s.node_allocations.insert("node-1".into(), claim(64));
    let again = allocate(&s).unwrap();
    assert_eq!(again.node_allocations["node-1"].index, 1);
    assert_eq!(again.node_allocations["node-2"].index, 3);
}

#[test]
fn errors_name_what_ran_out() {
    type Setup = fn(&mut ClusterState);
    let cases: Vec<(Setup, &str)> = vec![
        (
            |s| s.config.srv6_locator_prefix = Some("fd00::/95".parse().unwrap()),
            "srv6LocatorPrefix fd00::/95 is exhausted: all 1 node locators are taken, none left for Node node-2",
        ),
        (
            |s| s.config.srv6_locator_prefix = Some("fd00::/97".parse().unwrap()),
            "srv6LocatorPrefix fd00::/97 leaves 31 bits for the SID function and arguments, at least 32 are needed (use /96 or shorter)",
        ),
        (
            |s| s.config.srv6_locator_prefix = None,
            "no srv6LocatorPrefix is configured: cannot allocate locators for 3 nodes",
        ),
        (
            |s| s.nodes.get_mut("node-2").unwrap().internal_ips.clear(),
            "Node node-2 has no usable InternalIP in status.addresses: the other nodes need one (IPv4 or IPv6; not loopback, link-local, multicast or unspecified) to reach its SRv6 locator",
        ),
        (
            |s| { s.networks.insert("bad".into(), mk_network(&[("10.9.0.1/16", 8)])); },
            "cannot allocate for invalid Networks: Network/bad: spec.subnets[0].blockPrefix: blockPrefix 8 is shorter than the prefix of subnet 10.9.0.1/16: a block must fit in the subnet; Network/bad: spec.subnets[0].cidr: 10.9.0.1/16 has host bits set (did you mean 10.9.0.0/16?)",
        ),
    ];
    for (setup, want) in cases {
        let mut s = mk_state(&[1, 2, 3]);
        setup(&mut s);
        assert_eq!(allocate(&s).unwrap_err().to_string(), want);
    }
}

#[test]
fn partial_allocation_leaves_out_only_what_cannot_be_allocated() {
    // /94: 3 node locators for 4 nodes; node-2 has no address; Network bad is invalid.
    let mut s = mk_state(&[1, 2, 3, 4]);
    s.config.srv6_locator_prefix = Some("2001:db8:100::/94".parse().unwrap());
    s.nodes.get_mut("node-2").unwrap().internal_ips.clear();
    s.networks
        .insert("bad".into(), mk_network(&[("10.9.0.1/16", 24)]));
    let Partial {
        allocation,
        failures,
    } = allocate_partial(&s);
    let failures: Vec<String> = failures.iter().map(ToString::to_string).collect();
    assert_eq!(
        failures,
        [
            "cannot allocate for invalid Networks: Network/bad: spec.subnets[0].cidr: 10.9.0.1/16 has host bits set (did you mean 10.9.0.0/16?)",
            "Node node-2 has no usable InternalIP in status.addresses: the other nodes need one (IPv4 or IPv6; not loopback, link-local, multicast or unspecified) to reach its SRv6 locator",
        ]
    );
    let indices: Vec<(&str, u32)> = allocation
        .node_allocations
        .iter()
        .map(|(n, a)| (n.as_str(), a.index))
        .collect();
    assert_eq!(indices, [("node-1", 1), ("node-3", 2), ("node-4", 3)]);
    assert!(!allocation.network_allocations.contains_key("bad"));
    // What allocate accepts, allocate_partial allocates the same way.
    s.networks.remove("bad");
    s.nodes.remove("node-2");
    assert_eq!(allocate_partial(&s).allocation, allocate(&s).unwrap());

    // A fifth node finds no locator left; the others keep theirs.
    allocation.store_in(&mut s);
    s.nodes.insert("node-0".into(), mk_node(10));
    let partial = allocate_partial(&s);
    assert_eq!(
        partial.failures,
        [AllocError::LocatorsExhausted {
            prefix: "2001:db8:100::/94".parse().unwrap(),
            max: 3,
            node: "node-0".into()
        }]
    );
    assert_eq!(partial.allocation.node_allocations.len(), 3);
    assert_eq!(partial.allocation.node_allocations["node-3"].index, 2);
}

#[test]
fn a_node_that_loses_its_address_keeps_its_allocation() {
    let mut s = mk_state(&[1, 2]);
    let before = run(&mut s);
    s.nodes.get_mut("node-1").unwrap().internal_ips.clear();
    s.nodes.insert("node-3".into(), mk_node(3));
    let partial = allocate_partial(&s);
    assert_eq!(
        partial.failures,
        [AllocError::NoUnderlay {
            node: "node-1".into()
        }]
    );
    assert_eq!(
        partial.allocation.node_allocations["node-1"], before.node_allocations["node-1"],
        "index, locator and the last known underlay"
    );
    assert_eq!(
        partial.allocation.node_allocations["node-3"].index, 3,
        "node-1's index is not handed out"
    );
    assert_eq!(
        allocate(&s).unwrap_err(),
        AllocError::NoUnderlay {
            node: "node-1".into()
        },
        "the standalone pass is all or nothing"
    );
}

#[test]
fn sid_functions_run_out_after_65535_networks() {
    let mut s = ClusterState::default();
    for i in 0..=u32::from(u16::MAX) {
        s.networks.insert(format!("n{i:05}"), external());
    }
    assert_eq!(
        allocate(&s).unwrap_err().to_string(),
        "SID functions are exhausted: all 65535 are taken, none left for Network n65535"
    );
    s.networks.remove("n00007");
    let alloc = allocate(&s).unwrap();
    assert_eq!(alloc.network_allocations["n65535"].function, 65535);
    assert_eq!(alloc.network_allocations["n00008"].function, 8);
}

/// Checks every invariant of an allocation against the state it was made for.
fn check_invariants(state: &ClusterState, alloc: &Allocation) -> Result<(), TestCaseError> {
    let functions: BTreeSet<u16> = alloc
        .network_allocations
        .values()
        .map(|a| a.function)
        .collect();
    prop_assert_eq!(
        functions.len(),
        state.networks.len(),
        "one distinct function per Network"
    );
    prop_assert!(!functions.contains(&0));
    prop_assert!(alloc.network_allocations.keys().eq(state.networks.keys()));
    prop_assert!(alloc.node_allocations.keys().eq(state.nodes.keys()));
    let prefix = state.config.srv6_locator_prefix.unwrap();
    let locators: BTreeSet<Ipv6Net> = alloc.node_allocations.values().map(|a| a.locator).collect();
    prop_assert_eq!(locators.len(), state.nodes.len(), "distinct locators");
    for (name, a) in &alloc.node_allocations {
        prop_assert_eq!(a.locator, sid::node_locator(prefix, a.index).unwrap());
        prop_assert_eq!(a.underlay, state.nodes[name].underlay());
    }
    for (network, spec) in state.networks.iter().filter(|(_, n)| !n.external) {
        let capacity = block_capacity(&spec.subnets);
        let mut seen = BTreeSet::new();
        for a in alloc.node_allocations.values() {
            let blocks = node_blocks(a.index, &spec.subnets);
            prop_assert_eq!(blocks.is_empty(), a.index > capacity);
            for (subnet, block) in spec.subnets.iter().zip(&blocks) {
                prop_assert!(
                    subnet.cidr.contains(block) && block.prefix_len() == subnet.block_prefix
                );
                // Aligned blocks of one size overlap exactly when they are equal.
                prop_assert_eq!(block.trunc(), *block);
                prop_assert_eq!(block_owner(subnet, block.network()), Some(a.index));
                prop_assert!(
                    seen.insert(*block),
                    "block {} of {} given twice",
                    block,
                    network
                );
            }
        }
    }
    Ok(())
}

/// Network `net-<i>`: IPv4 10.<i>.0.0/16 in /22 blocks (64 of them) and IPv6
/// fd00:<i>::/48 in /64 blocks; every fourth one is external instead.
fn indexed_network(i: u8) -> NetworkSpec {
    if i % 4 == 3 {
        return external();
    }
    let v4 = format!("10.{i}.0.0/16");
    let v6 = format!("fd00:{i}::/48");
    mk_network(&[(v4.as_str(), 22), (v6.as_str(), 64)])
}

#[derive(Clone, Debug)]
enum Add {
    Node(u8),
    Network(u8),
}

fn base_state() -> ClusterState {
    let mut s = ClusterState::default();
    // /90: 6 node bits, 63 locators.
    s.config.srv6_locator_prefix = Some("2001:db8:100::/90".parse().unwrap());
    s
}

fn add(state: &mut ClusterState, what: &Add) {
    match *what {
        Add::Node(i) => state
            .nodes
            .insert(format!("node-{i:02}"), mk_node(i))
            .is_none(),
        Add::Network(i) => state
            .networks
            .insert(format!("net-{i}"), indexed_network(i))
            .is_none(),
    };
}

fn additions() -> impl Strategy<Value = Vec<Add>> {
    (
        proptest::collection::btree_set(1u8..60, 0..25),
        proptest::collection::btree_set(0u8..12, 0..8),
    )
        .prop_flat_map(|(nodes, networks)| {
            let all: Vec<Add> = nodes
                .into_iter()
                .map(Add::Node)
                .chain(networks.into_iter().map(Add::Network))
                .collect();
            Just(all).prop_shuffle()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// From scratch and incrementally: no overlaps, and each step keeps every earlier
    /// allocation as it was; re-running a step changes nothing.
    #[test]
    fn incremental_additions_never_move_earlier_allocations(adds in additions()) {
        let mut s = base_state();
        for what in &adds {
            let before = Allocation {
                network_allocations: s.network_allocations.clone(),
                node_allocations: s.node_allocations.clone(),
            };
            add(&mut s, what);
            let now = run(&mut s);
            check_invariants(&s, &now)?;
            for (name, f) in &before.network_allocations {
                prop_assert_eq!(&now.network_allocations[name], f);
            }
            for (name, a) in &before.node_allocations {
                let b = &now.node_allocations[name];
                prop_assert_eq!(a, b);
            }
            prop_assert_eq!(allocate(&s).unwrap(), now, "re-running is a no-op");
        }
    }

    /// Starting from the same existing allocations, the same inputs inserted in any order
    /// give the same result.
    #[test]
    fn insertion_order_does_not_matter(adds in additions(), split in 0usize..30, seed in any::<u64>()) {
        let split = split.min(adds.len());
        let mut existing = base_state();
        adds[..split].iter().for_each(|w| add(&mut existing, w));
        run(&mut existing);
        let mut rest = adds[split..].to_vec();
        let mut one = existing.clone();
        rest.iter().for_each(|w| add(&mut one, w));
        // A second, different order of the same remaining additions.
        let mut rng = seed;
        for i in (1..rest.len()).rev() {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            rest.swap(i, usize::try_from(rng >> 33).unwrap() % (i + 1));
        }
        let mut two = existing.clone();
        rest.iter().for_each(|w| add(&mut two, w));
        let a = allocate(&one).unwrap();
        check_invariants(&one, &a)?;
        prop_assert_eq!(a, allocate(&two).unwrap());
    }

    /// Removing nodes and Networks keeps the rest in place; as many new ones then get
    /// exactly the freed indices, blocks and functions (allocated from scratch, the values
    /// are dense, so the freed ones are the lowest free).
    #[test]
    fn removal_frees_values_for_reuse(
        nodes in proptest::collection::btree_set(1u8..30, 1..20),
        networks in proptest::collection::btree_set(0u8..12, 1..8),
        remove_mask in any::<u32>(),
    ) {
        let mut s = base_state();
        nodes.iter().for_each(|&i| add(&mut s, &Add::Node(i)));
        networks.iter().for_each(|&i| add(&mut s, &Add::Network(i)));
        let full = run(&mut s);
        let removed: Vec<u8> = nodes.iter().copied().filter(|i| remove_mask & (1 << i) != 0).collect();
        for i in &removed {
            s.nodes.remove(&format!("node-{i:02}"));
        }
        let fewer = run(&mut s);
        check_invariants(&s, &fewer)?;
        for (name, a) in &fewer.node_allocations {
            prop_assert_eq!(a, &full.node_allocations[name]);
        }
        for i in 0..removed.len() {
            add(&mut s, &Add::Node(100 + u8::try_from(i).unwrap()));
        }
        let refilled = run(&mut s);
        check_invariants(&s, &refilled)?;
        let indices = |a: &Allocation| a.node_allocations.values().map(|n| n.index).collect::<BTreeSet<_>>();
        prop_assert_eq!(indices(&refilled), indices(&full));
    }
}
