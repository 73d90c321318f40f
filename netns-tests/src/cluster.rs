//! Small hand-allocated clusters for the reconciler's netns tests and benches: the
//! [`ClusterState`] the planner takes, with readable addresses instead of the allocator's.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lace::api::{
    NetworkAllocationSpec, NetworkRoutingPolicySpec, NetworkSpec, NodeAllocationSpec, Subnet,
    Underlay,
};
use lace::state::{ClusterState, Node};

use crate::pods::{add_pod_v6, attach_pod};
use crate::{Netns, Result, Topology};

/// A namespace for node `i` alone: its uplink is a dummy `eth0` holding [`underlay`]`(i)`, all
/// the planner needs of a fabric (benches that program a node without traffic).
pub fn lone_node(label: &str, i: u16) -> Result<Netns> {
    let ns = Netns::new(label)?;
    ns.ip("link add eth0 type dummy")?;
    ns.ip("link set eth0 up")?;
    ns.ip(&format!("-6 addr add {}/64 dev eth0 nodad", underlay(i)))?;
    Ok(ns)
}

/// A pod of [`two_nodes`]: its namespace's label, its node and its addresses.
#[derive(Clone, Copy, Debug)]
pub struct PodSeat {
    pub label: &'static str,
    pub node: u16,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

impl PodSeat {
    /// Its host-side interface on its node: `lp-<label>`.
    pub fn host_if(&self) -> String {
        format!("lp-{}", self.label)
    }
}

/// Namespaces `node1` and `node2`, their `eth0`s linked by a veth pair and holding
/// [`underlay`]`(i)`, and `pods`, each wired dual-stack to its node as Lace's CNI wires them.
pub fn two_nodes(pods: &[PodSeat]) -> Result<Topology> {
    let mut topo = Topology::new();
    for i in [1, 2] {
        topo.add(&format!("node{i}"))?;
    }
    for p in pods {
        topo.add(p.label)?;
    }
    topo.link(("node1", "eth0"), ("node2", "eth0"))?;
    for i in [1, 2] {
        topo.ns(&format!("node{i}"))?
            .ip(&format!("-6 addr add {}/64 dev eth0 nodad", underlay(i)))?;
    }
    for p in pods {
        let (node, ns) = (topo.ns(&format!("node{}", p.node))?, topo.ns(p.label)?);
        attach_pod(node, &p.host_if(), ns, p.v4)?;
        add_pod_v6(node, &p.host_if(), ns, p.v6)?;
    }
    Ok(topo)
}

/// Node `i`'s address on the test fabric: `2001:db8:ff::<i>`.
pub fn underlay(i: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, i)
}

/// Node `i`'s IPv4 address on the test fabric: `192.168.255.<i>`.
pub fn underlay4(i: u16) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 255, i as u8)
}

/// Makes every node of a cluster built here IPv4-only: its InternalIP and underlay become
/// [`underlay4`], so the nodes carry SRv6 over IPv4 between them.
pub fn over_ipv4(s: &mut ClusterState) {
    for (name, a) in s.node_allocations.iter_mut() {
        let v4 = underlay4((a.index - 1) as u16);
        a.underlay = Underlay {
            ipv4: Some(v4),
            ipv6: None,
        };
        if let Some(n) = s.nodes.get_mut(name) {
            n.internal_ips = vec![IpAddr::V4(v4)];
        }
    }
}

/// Adds dual-stack Network `name` (allocated SID function `function`): `10.<second>.0.0/16`
/// with /24 blocks and `fd00:<second as hex>::/48` with /64 blocks.
pub fn add_dual_stack_network(s: &mut ClusterState, name: &str, second: u8, function: u16) {
    s.networks.insert(
        name.into(),
        NetworkSpec {
            subnets: vec![
                Subnet {
                    cidr: format!("10.{second}.0.0/16").parse().unwrap(),
                    block_prefix: 24,
                },
                Subnet {
                    cidr: format!("fd00:{second:x}::/48").parse().unwrap(),
                    block_prefix: 64,
                },
            ],
            external: false,
            host_access: false,
        },
    );
    s.network_allocations
        .insert(name.into(), NetworkAllocationSpec { function });
}

/// An IPv4 Network of a test cluster: `10.<second>.0.0/16`, node `i`'s block
/// `10.<second>.<i>.0/24`.
#[derive(Clone, Copy, Debug)]
pub struct TestNetwork<'a> {
    pub name: &'a str,
    pub second: u8,
    /// Its SID function (`NetworkAllocation`).
    pub function: u16,
    /// Whether a NetworkRoutingPolicy `<name>-self` lets it reach itself.
    pub reaches_itself: bool,
}

/// Nodes `<node_prefix>1..=<nodes>` on [`underlay`] addresses with locators
/// `2001:db8:100::<i>:0:0/96`, each holding a block of every one of `networks`.
pub fn ipv4_cluster(node_prefix: &str, nodes: u16, networks: &[TestNetwork]) -> ClusterState {
    let mut s = ClusterState::default();
    for n in networks {
        s.networks.insert(
            n.name.into(),
            NetworkSpec {
                subnets: vec![Subnet {
                    cidr: format!("10.{}.0.0/16", n.second).parse().unwrap(),
                    block_prefix: 24,
                }],
                external: false,
                host_access: false,
            },
        );
        s.network_allocations.insert(
            n.name.into(),
            NetworkAllocationSpec {
                function: n.function,
            },
        );
        if n.reaches_itself {
            s.network_routes.insert(
                format!("{}-self", n.name),
                NetworkRoutingPolicySpec {
                    from: n.name.into(),
                    to: n.name.into(),
                },
            );
        }
    }
    for i in 1..=nodes {
        let node = format!("{node_prefix}{i}");
        s.nodes.insert(
            node.clone(),
            Node {
                labels: BTreeMap::new(),
                internal_ips: vec![IpAddr::V6(underlay(i))],
            },
        );
        s.node_allocations.insert(
            node,
            NodeAllocationSpec {
                // Index i + 1 holds block i of every subnet: `10.<second>.<i>.0/24`.
                index: u32::from(i) + 1,
                locator: format!("2001:db8:100::{i}:0:0/96").parse().unwrap(),
                underlay: Underlay {
                    ipv4: None,
                    ipv6: Some(underlay(i)),
                },
            },
        );
    }
    s
}
