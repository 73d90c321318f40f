//! Fixture builders for planner tests and the plan benchmark: small, explicit, no kernel.
//!
//! Allocation is done by hand here (the real allocator lives elsewhere): Network functions
//! are 1, 2, 3... in name order; node `i` gets locator `2001:db8:100:0:0:i::/96`, underlay
//! `2001:db8:ff::i` and block `i` of every subnet of every internal Network.
#![allow(dead_code)] // each test crate uses a different subset

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};

use ipnet::{IpNet, Ipv6Net};
use lace::api::{
    LabelSelector, NetworkAllocationSpec, NetworkBindingPolicySpec, NetworkRoutingPolicySpec,
    NetworkSpec, NodeAllocationSpec, ServiceBindingPolicySpec, ServiceRef,
    ServiceRoutingPolicySpec, Subnet, Underlay,
};
use lace::state::{
    ClusterState, ContainerPort, Endpoints, Namespace, NetworkPolicy, Node, ObjectKey, Pod,
    PodAttachment, PolicyPeer, PolicyPort, PolicyRule, PortRef, Service, ServicePort,
};

/// An internal Network with the given `(cidr, block prefix)` subnets.
pub fn mk_network(subnets: &[(&str, u8)]) -> NetworkSpec {
    NetworkSpec {
        subnets: subnets
            .iter()
            .map(|(c, p)| Subnet {
                cidr: c.parse().expect("fixture cidr"),
                block_prefix: *p,
            })
            .collect(),
        external: false,
        host_access: false,
    }
}

/// An external Network (the internet).
pub fn mk_external() -> NetworkSpec {
    NetworkSpec {
        subnets: vec![],
        external: true,
        host_access: false,
    }
}

/// A node with an IPv6 InternalIP equal to its underlay address, locator `locator(index)`
/// and block number `index` of every subnet (its allocation's index is `index + 1`, since
/// node index `i` holds block `i - 1`).
pub fn mk_node(state: &mut ClusterState, name: &str, index: u32) {
    state.nodes.insert(
        name.into(),
        Node {
            labels: BTreeMap::new(),
            internal_ips: vec![IpAddr::V6(underlay(index))],
        },
    );
    state.node_allocations.insert(
        name.into(),
        NodeAllocationSpec {
            index: index + 1,
            locator: locator(index),
            underlay: Underlay {
                ipv4: None,
                ipv6: Some(underlay(index)),
            },
        },
    );
}

/// [`mk_node`] with the underlay families given: IPv4 `192.168.0.<index>` and/or IPv6
/// [`underlay`]`(index)`, both as InternalIPs.
pub fn mk_node_families(state: &mut ClusterState, name: &str, index: u32, v4: bool, v6: bool) {
    mk_node(state, name, index);
    let ipv4 = v4.then(|| underlay_v4(index));
    let ipv6 = v6.then(|| underlay(index));
    let node = state.nodes.get_mut(name).expect("just added");
    node.internal_ips = ipv4
        .map(IpAddr::V4)
        .into_iter()
        .chain(ipv6.map(IpAddr::V6))
        .collect();
    state
        .node_allocations
        .get_mut(name)
        .expect("just added")
        .underlay = Underlay { ipv4, ipv6 };
}

/// Node `index`'s IPv4 underlay address in [`mk_node_families`].
pub fn underlay_v4(index: u32) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(192, 168, (index >> 8) as u8, index as u8)
}

pub fn locator(index: u32) -> Ipv6Net {
    let base = u128::from("2001:db8:100::".parse::<Ipv6Addr>().unwrap());
    Ipv6Net::new(Ipv6Addr::from(base | (u128::from(index) << 32)), 96).unwrap()
}

pub fn underlay(index: u32) -> Ipv6Addr {
    Ipv6Addr::from(u128::from("2001:db8:ff::".parse::<Ipv6Addr>().unwrap()) | u128::from(index))
}

/// Gives every internal Network a function (1.. in name order). Overwrites earlier allocations.
pub fn alloc_all(state: &mut ClusterState) {
    state.network_allocations.clear();
    let internal: Vec<(String, NetworkSpec)> = state
        .networks
        .iter()
        .filter(|(_, n)| !n.external)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (i, (name, _)) in internal.iter().enumerate() {
        state.network_allocations.insert(
            name.clone(),
            NetworkAllocationSpec {
                function: i as u16 + 1,
            },
        );
    }
    // Blocks derive from the node index; check the fixture's subnets are big enough.
    for (node, alloc) in &state.node_allocations {
        for (name, n) in &internal {
            assert!(
                !lace::alloc::node_blocks(alloc.index, &n.subnets).is_empty(),
                "fixture: Network {name} has no block for {node} (index {})",
                alloc.index
            );
        }
    }
}

pub fn mk_route(state: &mut ClusterState, name: &str, from: &str, to: &str) {
    state.network_routes.insert(
        name.into(),
        NetworkRoutingPolicySpec {
            from: from.into(),
            to: to.into(),
        },
    );
}

pub fn mk_binding(
    state: &mut ClusterState,
    name: &str,
    network: &str,
    priority: i32,
    namespace: Option<&str>,
) {
    let namespace_selector = match namespace {
        Some(ns) => LabelSelector {
            match_labels: [("kubernetes.io/metadata.name".to_string(), ns.to_string())].into(),
            ..Default::default()
        },
        None => LabelSelector::default(),
    };
    state.network_bindings.insert(
        name.into(),
        NetworkBindingPolicySpec {
            network: network.into(),
            priority,
            namespace_selector,
            pod_selector: LabelSelector::default(),
        },
    );
}

/// A Service with one cluster IP and port, bound by name to `network`, with `backends`.
pub fn mk_service(
    state: &mut ClusterState,
    key: (&str, &str),
    network: &str,
    cluster_ip: &str,
    port: (&str, u16, u16),
    backends: &[&str],
) {
    let k = ObjectKey::new(key.0, key.1);
    state.services.insert(
        k.clone(),
        Service {
            labels: BTreeMap::new(),
            cluster_ips: vec![cluster_ip.parse().unwrap()],
            ports: vec![ServicePort {
                protocol: port.0.into(),
                port: port.1,
                node_port: None,
            }],
        },
    );
    state.endpoints.insert(
        k,
        Endpoints {
            addresses: backends.iter().map(|b| b.parse().unwrap()).collect(),
            ports: vec![ServicePort {
                protocol: port.0.into(),
                port: port.2,
                node_port: None,
            }],
        },
    );
    state.service_bindings.insert(
        format!("{}-{}", key.0, key.1),
        ServiceBindingPolicySpec {
            network: network.into(),
            priority: 0,
            services: vec![ServiceRef {
                namespace: key.0.into(),
                name: key.1.into(),
            }],
            ..Default::default()
        },
    );
}

/// Gives the first port of Service `key` node port `node_port` (type NodePort).
pub fn set_node_port(state: &mut ClusterState, key: (&str, &str), node_port: u16) {
    let svc = state
        .services
        .get_mut(&ObjectKey::new(key.0, key.1))
        .expect("fixture: the Service exists");
    svc.ports[0].node_port = Some(node_port);
}

pub fn mk_service_route(
    state: &mut ClusterState,
    name: &str,
    from: &str,
    to: &str,
    service: (&str, &str),
) {
    state.service_routes.insert(
        name.into(),
        ServiceRoutingPolicySpec {
            from: from.into(),
            to: to.into(),
            services: vec![ServiceRef {
                namespace: service.0.into(),
                name: service.1.into(),
            }],
            ..Default::default()
        },
    );
}

/// An attachment of pod `ns/name` on `network` with host interface `ifname`.
pub fn mk_attachment(
    ns: &str,
    name: &str,
    network: &str,
    ifname: &str,
    ips: &[&str],
) -> PodAttachment {
    PodAttachment {
        pod: ObjectKey::new(ns, name),
        container_id: format!("cid-{name}"),
        host_ifname: ifname.into(),
        network: network.into(),
        ips: ips
            .iter()
            .map(|ip| {
                let a: IpAddr = ip.parse().unwrap();
                IpNet::from(a)
            })
            .collect(),
        host_ports: Vec::new(),
        bandwidth: None,
    }
}

/// The golden cluster with node-3 reachable over IPv4 only (no IPv6 InternalIP): node-1 and
/// node-2 use IPv6 between them and IPv4 towards node-3.
pub fn golden_cluster_mixed() -> ClusterState {
    let mut s = golden_cluster();
    s.nodes
        .get_mut("node-3")
        .unwrap()
        .internal_ips
        .retain(|ip| ip.is_ipv4());
    s.node_allocations.get_mut("node-3").unwrap().underlay.ipv6 = None;
    s
}

/// The cluster of the golden test and many unit tests: 3 nodes, 4 Networks.
/// - `system` (10.10.0.0/16, fd00:10::/48) reaches itself; kube-system binds to it.
/// - `default` (10.20.0.0/16) catch-all, does NOT reach itself, reaches the internet.
/// - `tenant-a` (10.30.0.0/16, fd00:30::/48) reaches itself and `system`.
/// - `internet` external; `default/kubernetes` is bound to it and granted to `system`.
/// - `kube-system/kube-dns` bound to `system`, granted to `tenant-a` (backends on node-2/3).
/// - NodePort Services bound to `default`: `apps/web` (node port 30080, backends web-0 on
///   node-1 and web-1 on node-2) granted from the `internet`, `apps/admin` (30081, backend on
///   node-2) granted to no one.
pub fn golden_cluster() -> ClusterState {
    let mut s = ClusterState::default();
    s.config.srv6_locator_prefix = Some("2001:db8:100::/48".parse().unwrap());
    s.networks.insert(
        "system".into(),
        mk_network(&[("10.10.0.0/16", 24), ("fd00:10::/48", 64)]),
    );
    s.networks
        .insert("default".into(), mk_network(&[("10.20.0.0/16", 24)]));
    s.networks.insert(
        "tenant-a".into(),
        mk_network(&[("10.30.0.0/16", 24), ("fd00:30::/48", 64)]),
    );
    s.networks.insert("internet".into(), mk_external());
    for (i, n) in ["node-1", "node-2", "node-3"].iter().enumerate() {
        mk_node(&mut s, n, i as u32 + 1);
        // An IPv4 InternalIP too (the kubelet's probe source for IPv4 pods), first as the
        // kubelet lists it; the allocator records it as the node's IPv4 underlay.
        let v4: std::net::Ipv4Addr = format!("198.51.100.{}", i + 1).parse().unwrap();
        s.nodes
            .get_mut(*n)
            .unwrap()
            .internal_ips
            .insert(0, IpAddr::V4(v4));
        s.node_allocations.get_mut(*n).unwrap().underlay.ipv4 = Some(v4);
    }
    alloc_all(&mut s);
    mk_binding(&mut s, "system", "system", 1000, Some("kube-system"));
    mk_binding(&mut s, "default", "default", 0, None);
    mk_binding(&mut s, "tenant-a", "tenant-a", 500, Some("tenant-a"));
    mk_route(&mut s, "system-to-system", "system", "system");
    mk_route(&mut s, "tenant-a-to-tenant-a", "tenant-a", "tenant-a");
    mk_route(&mut s, "tenant-a-to-system", "tenant-a", "system");
    mk_route(&mut s, "default-to-internet", "default", "internet");
    mk_service(
        &mut s,
        ("default", "kubernetes"),
        "internet",
        "10.96.0.1",
        ("TCP", 443, 6443),
        &["192.0.2.10"],
    );
    mk_service_route(
        &mut s,
        "system-to-kubernetes",
        "system",
        "internet",
        ("default", "kubernetes"),
    );
    mk_service(
        &mut s,
        ("kube-system", "kube-dns"),
        "system",
        "10.96.0.10",
        ("UDP", 53, 5353),
        &["10.10.2.5", "10.10.3.5"],
    );
    mk_service_route(
        &mut s,
        "default-to-dns",
        "default",
        "system",
        ("kube-system", "kube-dns"),
    );
    mk_service(
        &mut s,
        ("apps", "web"),
        "default",
        "10.96.0.80",
        ("TCP", 80, 8080),
        &["10.20.1.2", "10.20.2.2"],
    );
    set_node_port(&mut s, ("apps", "web"), 30080);
    mk_service_route(
        &mut s,
        "internet-to-web",
        "internet",
        "default",
        ("apps", "web"),
    );
    mk_service(
        &mut s,
        ("apps", "admin"),
        "default",
        "10.96.0.81",
        ("TCP", 81, 8081),
        &["10.20.2.3"],
    );
    set_node_port(&mut s, ("apps", "admin"), 30081);
    s
}

/// Local pods of node-1 in the golden cluster.
pub fn golden_attachments() -> Vec<PodAttachment> {
    vec![
        mk_attachment(
            "kube-system",
            "coredns-0",
            "system",
            "lp-coredns0",
            &["10.10.1.2", "fd00:10:0:1::2"],
        ),
        mk_attachment("apps", "web-0", "default", "lp-web0", &["10.20.1.2"]),
        mk_attachment(
            "tenant-a",
            "api-0",
            "tenant-a",
            "lp-api0",
            &["10.30.1.2", "fd00:30:0:1::2"],
        ),
    ]
}

/// [`golden_attachments`] with hostPorts: web-0 (IPv4 only) exposes 8080/TCP on every address
/// of the node and 8443/TCP on 192.0.2.10 only, coredns-0 (dual-stack) 5353/UDP on every
/// address (both families) and 5354/UDP on 2001:db8::10 only (IPv6).
pub fn golden_attachments_host_ports() -> Vec<PodAttachment> {
    use lace::hostport::{HostPort, Protocol};
    let hp = |protocol, host_port, container_port, host_ip: Option<&str>| HostPort {
        protocol,
        host_port,
        container_port,
        host_ip: host_ip.map(|ip| ip.parse().unwrap()),
    };
    let mut out = golden_attachments();
    out[0].host_ports = vec![
        hp(Protocol::Udp, 5353, 53, None),
        hp(Protocol::Udp, 5354, 53, Some("2001:db8::10")),
    ];
    out[1].host_ports = vec![
        hp(Protocol::Tcp, 8080, 80, None),
        hp(Protocol::Tcp, 8443, 443, Some("192.0.2.10")),
    ];
    out
}

/// [`golden_attachments`] with bandwidth: web-0 asks for 10 Mbit/s towards it with
/// containerd's burst (2^32-1 bits, capped), api-0 for 1 Gbit/s from it with no burst.
pub fn golden_attachments_bandwidth() -> Vec<PodAttachment> {
    use lace::bandwidth::{Bandwidth, Limit};
    let mut out = golden_attachments();
    out[1].bandwidth = Some(Bandwidth {
        ingress: Some(Limit {
            rate: 10_000_000,
            burst: Some(u64::from(u32::MAX)),
        }),
        egress: None,
    });
    let api = out.iter_mut().find(|a| a.pod.name == "api-0").unwrap();
    api.bandwidth = Some(Bandwidth {
        ingress: None,
        egress: Some(Limit {
            rate: 1_000_000_000,
            burst: None,
        }),
    });
    out
}

/// Local pods of node-2 in the golden cluster (coredns-1 is a kube-dns backend).
pub fn golden_attachments_node2() -> Vec<PodAttachment> {
    vec![
        mk_attachment(
            "kube-system",
            "coredns-1",
            "system",
            "lp-coredns1",
            &["10.10.2.5", "fd00:10:0:2::5"],
        ),
        mk_attachment("apps", "web-1", "default", "lp-web1", &["10.20.2.2"]),
        mk_attachment(
            "tenant-a",
            "api-1",
            "tenant-a",
            "lp-api1",
            &["10.30.2.2", "fd00:30:0:2::2"],
        ),
    ]
}

/// A pod in the cluster state (what the watches deliver), with named container ports
/// `(name, protocol, port)`.
pub fn mk_pod(
    state: &mut ClusterState,
    key: (&str, &str),
    node: &str,
    ips: &[&str],
    labels: &[(&str, &str)],
    ports: &[(&str, &str, u16)],
) {
    state.pods.insert(
        ObjectKey::new(key.0, key.1),
        Pod {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            node: node.into(),
            ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            host_network: false,
            ports: ports
                .iter()
                .map(|(name, protocol, port)| ContainerPort {
                    name: name.to_string(),
                    protocol: protocol.to_string(),
                    port: *port,
                })
                .collect(),
        },
    );
}

pub fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        match_expressions: Vec::new(),
    }
}

pub fn np_port(protocol: &str, port: PortRef, end_port: Option<u16>) -> PolicyPort {
    PolicyPort {
        protocol: protocol.into(),
        port: Some(port),
        end_port,
    }
}

/// The golden cluster with its pods in the state (those of [`golden_attachments`] and
/// [`golden_attachments_node2`], and `tenant-a/worker-0` on node-3), their Namespaces and
/// NetworkPolicies:
/// - `tenant-a/default-deny`: every tenant-a pod isolated both ways;
/// - `tenant-a/api`: api pods accept workers on the named port `http`, and `10.20.0.0/16`
///   except `10.20.2.0/24` on TCP 8000-8100;
/// - `tenant-a/dns`: tenant-a pods may reach kube-dns pods on the named UDP port `dns` and
///   TCP 5353;
/// - `apps/web`: web pods accept pods of every namespace on the named port `http` (8080 on
///   web-0, 8081 on web-1) and SCTP 9000.
pub fn golden_cluster_netpol() -> ClusterState {
    let mut s = golden_cluster();
    for (name, labels) in [
        ("kube-system", vec![]),
        ("apps", vec![("team", "web")]),
        ("tenant-a", vec![("lace.io/tenant", "a")]),
    ] {
        let mut labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v): &(&str, &str)| (k.to_string(), v.to_string()))
            .collect();
        labels.insert("kubernetes.io/metadata.name".into(), name.into());
        s.namespaces.insert(name.into(), Namespace { labels });
    }
    let dns = [("dns", "UDP", 5353), ("dns-tcp", "TCP", 5353)];
    mk_pod(
        &mut s,
        ("kube-system", "coredns-0"),
        "node-1",
        &["10.10.1.2", "fd00:10:0:1::2"],
        &[("k8s-app", "kube-dns")],
        &dns,
    );
    mk_pod(
        &mut s,
        ("kube-system", "coredns-1"),
        "node-2",
        &["10.10.2.5", "fd00:10:0:2::5"],
        &[("k8s-app", "kube-dns")],
        &dns,
    );
    mk_pod(
        &mut s,
        ("apps", "web-0"),
        "node-1",
        &["10.20.1.2"],
        &[("app", "web")],
        &[("http", "TCP", 8080)],
    );
    mk_pod(
        &mut s,
        ("apps", "web-1"),
        "node-2",
        &["10.20.2.2"],
        &[("app", "web")],
        &[("http", "TCP", 8081)],
    );
    mk_pod(
        &mut s,
        ("tenant-a", "api-0"),
        "node-1",
        &["10.30.1.2", "fd00:30:0:1::2"],
        &[("app", "api")],
        &[("http", "TCP", 8000)],
    );
    mk_pod(
        &mut s,
        ("tenant-a", "api-1"),
        "node-2",
        &["10.30.2.2", "fd00:30:0:2::2"],
        &[("app", "api")],
        &[("http", "TCP", 8000)],
    );
    mk_pod(
        &mut s,
        ("tenant-a", "worker-0"),
        "node-3",
        &["10.30.3.4", "fd00:30:0:3::4"],
        &[("app", "worker")],
        &[],
    );
    let mut put = |ns: &str, name: &str, p: NetworkPolicy| {
        s.network_policies.insert(ObjectKey::new(ns, name), p);
    };
    put(
        "tenant-a",
        "default-deny",
        NetworkPolicy {
            ingress_isolation: true,
            egress_isolation: true,
            ..Default::default()
        },
    );
    put(
        "tenant-a",
        "api",
        NetworkPolicy {
            pod_selector: selector(&[("app", "api")]),
            ingress_isolation: true,
            ingress: vec![
                PolicyRule {
                    peers: vec![PolicyPeer::Pods {
                        namespace_selector: None,
                        pod_selector: Some(selector(&[("app", "worker")])),
                    }],
                    ports: vec![np_port("TCP", PortRef::Name("http".into()), None)],
                },
                PolicyRule {
                    peers: vec![PolicyPeer::IpBlock {
                        cidr: "10.20.0.0/16".parse().unwrap(),
                        except: vec!["10.20.2.0/24".parse().unwrap()],
                    }],
                    ports: vec![np_port("TCP", PortRef::Number(8000), Some(8100))],
                },
            ],
            ..Default::default()
        },
    );
    put(
        "tenant-a",
        "dns",
        NetworkPolicy {
            egress_isolation: true,
            egress: vec![PolicyRule {
                peers: vec![PolicyPeer::Pods {
                    namespace_selector: Some(selector(&[(
                        "kubernetes.io/metadata.name",
                        "kube-system",
                    )])),
                    pod_selector: Some(selector(&[("k8s-app", "kube-dns")])),
                }],
                ports: vec![
                    np_port("UDP", PortRef::Name("dns".into()), None),
                    np_port("TCP", PortRef::Number(5353), None),
                ],
            }],
            ..Default::default()
        },
    );
    put(
        "apps",
        "web",
        NetworkPolicy {
            pod_selector: selector(&[("app", "web")]),
            ingress_isolation: true,
            ingress: vec![PolicyRule {
                peers: vec![PolicyPeer::Pods {
                    namespace_selector: Some(LabelSelector::default()),
                    pod_selector: None,
                }],
                ports: vec![
                    np_port("TCP", PortRef::Name("http".into()), None),
                    np_port("SCTP", PortRef::Number(9000), None),
                ],
            }],
            ..Default::default()
        },
    );
    s
}

/// A synthetic cluster at scale, for the benchmarks: its name, state and the planned node's
/// (`node-0000`'s) pod attachments.
pub struct Scenario {
    pub name: String,
    pub state: ClusterState,
    pub local: Vec<PodAttachment>,
}

/// `nodes` nodes and `networks` Networks, each routed to itself, `pods_per_node` pods on every
/// node spread over the Networks, a few cross-Network pairs, an external Network with egress
/// and ten Services granted from `net-001` to `net-000`. Over 250 nodes each Network is a
/// /12 of synthetic space with /26 blocks; otherwise a /16 with /24 blocks.
pub fn scenario(nodes: u32, networks: u32, pods_per_node: u32, dual_stack: bool) -> Scenario {
    let mut s = ClusterState::default();
    let names: Vec<String> = (0..networks).map(|i| format!("net-{i:03}")).collect();
    for (i, n) in names.iter().enumerate() {
        // Small: a /16 per Network, /24 blocks. Big: a /12 per Network (synthetic space from
        // 16.0.0.0), /26 blocks (64 addresses for 30 pods): 16,384 blocks per Network.
        let (v4, p4) = if nodes > 250 {
            (format!("{}.{}.0.0/12", 16 + i / 16, (i % 16) * 16), 26)
        } else {
            (format!("10.{}.0.0/16", i + 1), 24)
        };
        let v6 = format!("fd00:{:x}::/48", i + 1);
        let mut subnets = vec![(v4.as_str(), p4)];
        if dual_stack {
            subnets.push((v6.as_str(), 64));
        }
        s.networks.insert(n.clone(), mk_network(&subnets));
        mk_route(&mut s, &format!("{n}-to-self"), n, n);
    }
    // A few cross pairs and an external Network with egress for the first Network.
    s.networks.insert("internet".into(), mk_external());
    mk_route(&mut s, "net-000-to-internet", "net-000", "internet");
    for i in 1..networks.min(5) as usize {
        mk_route(
            &mut s,
            &format!("{}-to-net-000", names[i]),
            &names[i],
            &names[0],
        );
    }
    for i in 0..nodes {
        mk_node(&mut s, &format!("node-{i:04}"), i);
    }
    alloc_all(&mut s);
    // Pods of every node in the state (the planner ignores them, the agent's binding uses them).
    for i in 0..nodes {
        for p in 0..pods_per_node {
            let net = &names[(p % networks) as usize];
            let index = s.node_allocations[&format!("node-{i:04}")].index;
            let block = lace::alloc::node_blocks(index, &s.networks[net].subnets)[0];
            let ip = match block {
                ipnet::IpNet::V4(b) => {
                    std::net::IpAddr::V4((u32::from(b.network()) + 2 + p).into())
                }
                ipnet::IpNet::V6(_) => unreachable!("v4 block first"),
            };
            let key = ObjectKey::new("bench", format!("pod-{i}-{p}"));
            s.pods.insert(
                key,
                Pod {
                    node: format!("node-{i:04}"),
                    ips: vec![ip],
                    ..Default::default()
                },
            );
        }
    }
    // Ten Services on net-000 granted to net-001, backends spread over nodes.
    if networks > 1 {
        for k in 0..10u32 {
            let backends: Vec<String> = (0..3)
                .map(|j| {
                    let node = format!("node-{:04}", (k * 7 + j) % nodes);
                    let index = s.node_allocations[&node].index;
                    let b = lace::alloc::node_blocks(index, &s.networks["net-000"].subnets)[0];
                    match b {
                        ipnet::IpNet::V4(b) => {
                            std::net::Ipv4Addr::from(u32::from(b.network()) + 2).to_string()
                        }
                        ipnet::IpNet::V6(_) => unreachable!(),
                    }
                })
                .collect();
            let refs: Vec<&str> = backends.iter().map(String::as_str).collect();
            let name = format!("svc-{k}");
            mk_service(
                &mut s,
                ("bench", &name),
                "net-000",
                &format!("172.31.0.{}", k + 1),
                ("TCP", 80, 8080),
                &refs,
            );
            mk_service_route(
                &mut s,
                &format!("grant-{k}"),
                "net-001",
                "net-000",
                ("bench", &name),
            );
        }
    }
    let local = scenario_attachments(&s, 0, networks, pods_per_node);
    Scenario {
        name: format!("{nodes} nodes x {networks} Networks x {pods_per_node} pods/node"),
        state: s,
        local,
    }
}

/// The attachments of node `node-<i>`'s pods in a [`scenario`] of `networks` Networks and
/// `pods_per_node` pods per node: pod `p` on host link `lp-<p>` (five digits), in Network
/// `p % networks`.
pub fn scenario_attachments(
    s: &ClusterState,
    i: u32,
    networks: u32,
    pods_per_node: u32,
) -> Vec<PodAttachment> {
    (0..pods_per_node)
        .map(|p| {
            let key = ObjectKey::new("bench", format!("pod-{i}-{p}"));
            let ips = s.pods[&key]
                .ips
                .iter()
                .map(|ip| ipnet::IpNet::from(*ip))
                .collect();
            PodAttachment {
                pod: key,
                container_id: format!("c{p}"),
                host_ifname: format!("lp-{p:05}"),
                network: format!("net-{:03}", p % networks),
                ips,
                host_ports: Vec::new(),
                bandwidth: None,
            }
        })
        .collect()
}

/// The planned route for `dst` in `table`, if any.
pub fn planned_route(
    d: &lace::plan::DesiredNode,
    table: u32,
    dst: &str,
) -> Option<lace::plan::Nexthop> {
    d.route(&lace::plan::RouteKey::new(table, dst.parse().unwrap()))
        .cloned()
}

/// The keys of set `set` in the plan's ruleset.
pub fn set_keys(d: &lace::plan::DesiredNode, set: &str) -> Vec<String> {
    d.base
        .nft
        .set(set)
        .unwrap_or_else(|| panic!("no set {set}"))
        .elements
        .keys()
        .cloned()
        .collect()
}
