//! Lace's nftables ruleset for one node, built from the routing policies (the types and their
//! rendering are in [`super::nft`]).
//!
//! The sending node polices in `prerouting` (seg6 encapsulation happens at route input, before
//! forward), the receiving node in `forward`, host processes in `output` (only kubelet probes
//! open connections to pods, and any process to Networks with `hostAccess`) and pods towards
//! the host's link-local addresses in `input`;
//! `postrouting` masquerades what leaves to external Networks. The SRv6 guard and the
//! untracked underlay chains come from [`super::underlay`]; the NetworkPolicy chains, which
//! `from_pods` and `to_pods` run before their own verdicts, from [`super::netpol`].

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;

use super::host_access;
use super::hostport;
use super::ingress::{self, Ingress};
use super::netpol;
use super::nft::{self, Chain, Hook, Set, ESTABLISHED};
use super::{underlay, Networks, POD_LINK_PREFIX, PROBE_MARK, PROBE_MARK_MASK};
use crate::api::NodeAllocationSpec;
use crate::netpol::Direction;
use crate::routing::{BackendLocation, ServiceGrant};
use crate::state::ClusterState;

/// Joins policy names into an element/rule comment.
fn by_policies(kind: &str, policies: &[&str]) -> String {
    format!("{kind} {}", policies.join(", "))
}

/// What the routing policies allow, as the ruleset needs it.
pub(super) struct Policies<'a> {
    /// Allowed pairs of Networks, with the NetworkRoutingPolicies behind each.
    pub pairs: &'a BTreeMap<(&'a str, &'a str), Vec<&'a str>>,
    /// Networks allowed to external Networks, with the policies.
    pub egress: &'a BTreeMap<&'a str, Vec<&'a str>>,
    pub grants: &'a [ServiceGrant<'a>],
    pub ingress: &'a Ingress<'a, 'a>,
    /// The Networks with `hostAccess` ([`host_access`]).
    pub host_access: &'a BTreeSet<&'a str>,
}

/// The ruleset of node `node` (allocation `me`): the sets hold what the Networks, pairs,
/// egress and Service grants name, the chains are fixed.
pub(super) fn build_ruleset(
    node: &str,
    state: &ClusterState,
    me: &NodeAllocationSpec,
    nets: &Networks<'_>,
    policies: &Policies<'_>,
) -> nft::Ruleset {
    let Policies {
        pairs,
        egress,
        grants,
        ingress,
        host_access,
    } = *policies;
    let [underlays, underlays_v4] = underlay::node_sets(state);
    let sids = local_sids(node, me);
    let link_scope = link_scope();
    let (vrfs, [c4, c6]) = vrf_and_cluster_sets(nets);
    let [p4, p6] = pair_maps(nets, pairs);
    let [e4, e6] = egress_sets(nets, egress);
    let [[s4, s6], [x4, x6], [b4, b6]] = service_sets(node, nets, grants);
    let [[snat4, snat6], [i4, i6], [np4, np6], [ib4, ib6]] =
        ingress::sets(node, state, me, nets, ingress);

    let [hairpin4, hairpin6] = ingress::hairpin_maps(node, state, me, nets);
    let [[ha4, ha6], [n4, n6]] = host_access::sets(state, nets, host_access);
    let network_policies = netpol::build(node, state);

    let [raw_prerouting, raw_output, sid_guard] = underlay::untracked();
    let [prerouting, from_vrfs, nodeport_replies, ipv4_tunnel_guard] = prerouting();
    let [from_pods, to_pods, forward] = policy_chains(network_policies.is_some());
    let [output, from_host] = host_to_pods_chains();
    let [input, pods_to_host] = pods_to_host_chains();
    let (np_sets, np_chains) = network_policies
        .map(|np| (np.sets, np.chains))
        .unwrap_or_default();
    nft::Ruleset {
        sets: [
            vec![
                underlays,
                underlays_v4,
                sids,
                vrfs,
                link_scope,
                c4,
                c6,
                p4,
                p6,
                e4,
                e6,
                s4,
                s6,
                x4,
                x6,
                b4,
                b6,
                snat4,
                snat6,
                i4,
                i6,
                np4,
                np6,
                ib4,
                ib6,
                hairpin4,
                hairpin6,
                ha4,
                ha6,
                n4,
                n6,
            ],
            hostport::sets(node, state),
            np_sets,
        ]
        .concat(),
        // Jump targets first, so every chain a rule jumps to is already declared.
        chains: [
            np_chains,
            vec![
                from_pods,
                to_pods,
                nodeport_replies,
                ipv4_tunnel_guard,
                from_vrfs,
                from_host,
                pods_to_host,
                sid_guard,
                raw_prerouting,
                raw_output,
                prerouting,
                input,
                forward,
                output,
                ingress::snat_chain(),
                masquerade(),
            ],
            hostport::chains().into(),
        ]
        .concat(),
    }
}

/// This node's locator, which holds every local SID.
fn local_sids(node: &str, me: &NodeAllocationSpec) -> Set {
    let mut sids = Set::new(
        "local_sids",
        "ipv6_addr",
        true,
        "this node's SRv6 locator (every local SID)",
    );
    sids.add(
        me.locator.trunc().to_string(),
        None,
        &format!("locator of node {node}"),
    );
    sids
}

/// The IPv6 destinations that never leave a pod's veth.
fn link_scope() -> Set {
    let mut link_scope = Set::new(
        "link_scope_v6",
        "ipv6_addr",
        true,
        "IPv6 destinations a pod's packet never leaves its veth for",
    );
    link_scope.add("fe80::/10".into(), None, "link-local unicast");
    link_scope.add("ff00::/8".into(), None, "multicast");
    link_scope
}

/// The VRF devices, and the subnets of all internal Networks per family.
fn vrf_and_cluster_sets(nets: &Networks<'_>) -> (Set, [Set; 2]) {
    let mut vrfs = Set::new(
        "vrfs",
        "ifname",
        false,
        "Lace VRF devices: traffic from local pods enters through them",
    );
    let mut cluster = [
        Set::new(
            "cluster_v4",
            "ipv4_addr",
            true,
            "subnets of all internal Networks",
        ),
        Set::new(
            "cluster_v6",
            "ipv6_addr",
            true,
            "subnets of all internal Networks",
        ),
    ];
    for n in nets.values() {
        vrfs.add(
            format!("\"{}\"", n.vrf),
            None,
            &format!("Network {}", n.name),
        );
        for s in &n.subnets {
            cluster[usize::from(matches!(s, IpNet::V6(_)))].add(
                s.to_string(),
                None,
                &format!("Network {}", n.name),
            );
        }
    }
    (vrfs, cluster)
}

/// The allowed pairs of internal Networks, per family: source subnet . destination subnet.
fn pair_maps(nets: &Networks<'_>, pairs: &BTreeMap<(&str, &str), Vec<&str>>) -> [Set; 2] {
    let mut pair_maps = [
        Set::new_vmap(
            "pairs_v4",
            "ipv4_addr . ipv4_addr",
            true,
            "NetworkRoutingPolicy: source subnet . destination subnet",
        ),
        Set::new_vmap(
            "pairs_v6",
            "ipv6_addr . ipv6_addr",
            true,
            "NetworkRoutingPolicy: source subnet . destination subnet",
        ),
    ];
    for (&(from, to), policies) in pairs {
        let (Some(f), Some(t)) = (nets.get(from), nets.get(to)) else {
            continue;
        };
        let reason = by_policies("NetworkRoutingPolicy", policies);
        for fs in &f.subnets {
            for ts in t
                .subnets
                .iter()
                .filter(|ts| matches!(ts, IpNet::V6(_)) == matches!(fs, IpNet::V6(_)))
            {
                pair_maps[usize::from(matches!(fs, IpNet::V6(_)))].add(
                    format!("{fs} . {ts}"),
                    Some("accept"),
                    &reason,
                );
            }
        }
    }
    pair_maps
}

/// The subnets of Networks allowed to an external Network, per family.
fn egress_sets(nets: &Networks<'_>, egress: &BTreeMap<&str, Vec<&str>>) -> [Set; 2] {
    let mut egress_sets = [
        Set::new(
            "egress_v4",
            "ipv4_addr",
            true,
            "NetworkRoutingPolicy to an external Network: source subnets",
        ),
        Set::new(
            "egress_v6",
            "ipv6_addr",
            true,
            "NetworkRoutingPolicy to an external Network: source subnets",
        ),
    ];
    for (from, policies) in egress {
        let Some(f) = nets.get(from) else { continue };
        let reason = by_policies("NetworkRoutingPolicy", policies);
        for s in &f.subnets {
            egress_sets[usize::from(matches!(s, IpNet::V6(_)))].add(s.to_string(), None, &reason);
        }
    }
    egress_sets
}

/// The Service grants, each per family: by Service address, by Service address for Services
/// on external Networks (masqueraded), and by backend on this node.
fn service_sets(node: &str, nets: &Networks<'_>, grants: &[ServiceGrant<'_>]) -> [[Set; 2]; 3] {
    let mut svc_sets = [
        Set::new(
            "services_v4",
            "ipv4_addr . ipv4_addr",
            true,
            "ServiceRoutingPolicy: source subnet . Service address",
        ),
        Set::new(
            "services_v6",
            "ipv6_addr . ipv6_addr",
            true,
            "ServiceRoutingPolicy: source subnet . Service address",
        ),
    ];
    let mut svc_ext_sets = [
        Set::new(
            "services_external_v4",
            "ipv4_addr . ipv4_addr",
            true,
            "ServiceRoutingPolicy to external Services (masqueraded)",
        ),
        Set::new(
            "services_external_v6",
            "ipv6_addr . ipv6_addr",
            true,
            "ServiceRoutingPolicy to external Services (masqueraded)",
        ),
    ];
    let mut backend_sets = [
        Set::new(
            "backends_v4",
            "ipv4_addr . ipv4_addr . inet_proto . inet_service",
            true,
            "ServiceRoutingPolicy: source subnet . backend on this node . protocol . target port",
        ),
        Set::new(
            "backends_v6",
            "ipv6_addr . ipv6_addr . inet_proto . inet_service",
            true,
            "ServiceRoutingPolicy: source subnet . backend on this node . protocol . target port",
        ),
    ];
    for g in grants {
        let Some(f) = nets.get(g.from) else { continue };
        let reason = format!("ServiceRoutingPolicy {}: {}", g.policy, g.service);
        let ext = !nets.contains_key(g.to);
        for fs in &f.subnets {
            let fam6 = matches!(fs, IpNet::V6(_));
            let i = usize::from(fam6);
            for ip in g.spec.cluster_ips.iter().filter(|ip| ip.is_ipv6() == fam6) {
                svc_sets[i].add(format!("{fs} . {ip}"), None, &reason);
                if ext {
                    svc_ext_sets[i].add(format!("{fs} . {ip}"), None, &reason);
                }
            }
            for b in &g.backends {
                let BackendLocation::Pod { node: bnode, .. } = b.location else {
                    continue;
                };
                if bnode != node || b.address.is_ipv6() != fam6 {
                    continue;
                }
                for p in g.target_ports {
                    let proto = p.protocol.to_ascii_lowercase();
                    backend_sets[i].add(
                        format!("{fs} . {} . {proto} . {}", b.address, p.port),
                        None,
                        &reason,
                    );
                }
            }
        }
    }
    [svc_sets, svc_ext_sets, backend_sets]
}

/// The sending node's policy, beside the SRv6-over-IPv4 guard: `prerouting` hands what comes
/// out of Lace's VRFs to `from_vrfs`, which accepts established flows and ends in `from_pods`
/// (new connections from local pods). A pod's packet traverses prerouting twice, first from
/// its veth, then from its VRF (the VRF driver runs the hook again); only the second pass has
/// anything to do. These chains are on the path of every packet a pod sends or a node
/// decapsulates, so each pass is settled within the first rules: a VRF's pass by one lookup of
/// the input device, a veth's by one comparison, an established flow's by two rules of
/// `from_vrfs` (four while the fou MSS clamp is there).
fn prerouting() -> [Chain; 4] {
    let mut prerouting = Chain {
        name: "prerouting".into(),
        hook: Some(Hook { kind: "filter", hook: "prerouting", priority: "dstnat + 10" }),
        comment: "after kube-proxy's DNAT; the sending node's policy lives here because seg6 encap happens at route input, before forward".into(),
        rules: Vec::new(),
    };
    prerouting.rule(
        "iifname @vrfs goto from_vrfs",
        "packets from local pods, as their VRF hands them over",
    );
    prerouting.rule(
        format!("iifname \"{POD_LINK_PREFIX}*\" accept"),
        "packets from local pods on their first pass, from their veth: policed on their VRF's pass",
    );
    let ipv4_tunnel_guard = underlay::guard(&mut prerouting);
    let mut from_vrfs = Chain {
        name: "from_vrfs".into(),
        hook: None,
        comment:
            "packets from local pods (or decapsulated into a VRF), on their second prerouting pass"
                .into(),
        rules: Vec::new(),
    };
    let nodeport_replies = ingress::mark_replies(&mut from_vrfs);
    // The fou MSS clamp (underlay::MssClamp) goes before this rule: it rewrites SYN-ACKs too.
    from_vrfs.rule(
        ESTABLISHED,
        "replies and related flows of allowed connections",
    );
    // The VRF driver runs a pod's neighbour discovery frames through prerouting a second time
    // with the VRF as input device, untracked (vrf_ip6_rcv): from_pods would drop the
    // advertisements answering the host, which then cannot resolve IPv6 pods (seen in a VM).
    // Link-local and multicast destinations are never forwarded; the input chain polices what
    // of them reaches the host.
    from_vrfs.rule(
        "ip6 daddr @link_scope_v6 accept",
        "link-local and multicast from pods: never forwarded, policed in input (pods_to_host)",
    );
    from_vrfs.rule("goto from_pods", "connections opened by local pods");
    [prerouting, from_vrfs, nodeport_replies, ipv4_tunnel_guard]
}

/// `from_pods` and `to_pods`: what the routing policies allow, then drop; and `forward`, the
/// receiving node's policy, which sends what goes to pods through `to_pods`. With
/// `network_policies`, a new connection of an isolated pod first passes its NetworkPolicy
/// chain (egress in `from_pods`, ingress in `to_pods`), which drops what no policy allows.
fn policy_chains(network_policies: bool) -> [Chain; 3] {
    let mut from_pods = Chain {
        name: "from_pods".into(),
        hook: None,
        comment: "new connections from local pods: only what a routing policy allows".into(),
        rules: Vec::new(),
    };
    let mut to_pods = Chain {
        name: "to_pods".into(),
        hook: None,
        comment: "new forwarded connections towards pods (decapsulated or leaked between VRFs)"
            .into(),
        rules: Vec::new(),
    };
    // `from_vrfs` and `forward` accept established flows before they hand packets over: the
    // one check most packets need.
    for (c, d) in [
        (&mut from_pods, Direction::Egress),
        (&mut to_pods, Direction::Ingress),
    ] {
        if network_policies {
            netpol::isolation_jumps(d, c);
        }
        c.rule(
            "ip saddr . ip daddr vmap @pairs_v4",
            "NetworkRoutingPolicy pairs",
        );
        c.rule(
            "ip6 saddr . ip6 daddr vmap @pairs_v6",
            "NetworkRoutingPolicy pairs",
        );
        c.rule(
            "ct status dnat ip saddr . ct original ip daddr @services_v4 accept",
            "ServiceRoutingPolicy grants, by the Service address before DNAT",
        );
        c.rule(
            "ct status dnat ip6 saddr . ct original ip6 daddr @services_v6 accept",
            "ServiceRoutingPolicy grants, by the Service address before DNAT",
        );
    }
    for c in [&mut from_pods, &mut to_pods] {
        // In from_pods too: with nf_hooks_lwtunnel=1 a decapsulated packet may traverse
        // prerouting with its VRF as input device.
        // The protocol is `ct protocol`, not `meta l4proto`: in a concatenation looked up in
        // an interval set, nft (1.0.6) converts the host-endian one-byte `meta l4proto` with
        // a `byteorder` expression of size 2 and length 1, which kernels carrying
        // "netfilter: nft_byteorder: remove multi-register support" (Debian 6.12.115+) reject
        // with EOPNOTSUPP. `ct protocol` needs no conversion and is the packet's transport
        // protocol whenever the packet has a conntrack entry, as every new connection does; a
        // packet without one (invalid, untracked) cannot open a connection and meets the drop.
        c.rule(
            "ip saddr . ip daddr . ct protocol . th dport @backends_v4 accept",
            "ServiceRoutingPolicy grants: backends on this node (DNAT happened on the client's node)",
        );
        c.rule(
            "ip6 saddr . ip6 daddr . ct protocol . th dport @backends_v6 accept",
            "ServiceRoutingPolicy grants: backends on this node (DNAT happened on the client's node)",
        );
        ingress::accept_from_ingress(c);
        host_access::accept_from_nodes(c);
    }
    ingress::accept_nodeports(&mut to_pods);
    hostport::accept(&mut to_pods);
    from_pods.rule(
        "ip saddr @egress_v4 ip daddr != @cluster_v4 accept",
        "NetworkRoutingPolicy to an external Network",
    );
    from_pods.rule(
        "ip6 saddr @egress_v6 ip6 daddr != @cluster_v6 accept",
        "NetworkRoutingPolicy to an external Network",
    );
    from_pods.rule(
        "counter drop",
        "no Lace routing policy allows this new connection",
    );
    to_pods.rule(
        "counter drop",
        "no Lace routing policy allows this new connection",
    );

    let mut forward = Chain {
        name: "forward".into(),
        hook: Some(Hook {
            kind: "filter",
            hook: "forward",
            priority: "filter",
        }),
        comment: "the receiving node's policy: decapsulated packets traverse forward".into(),
        rules: Vec::new(),
    };
    forward.rule(
        ESTABLISHED,
        "replies and related flows of allowed connections",
    );
    forward.rule("ip daddr @cluster_v4 jump to_pods", "towards pods");
    forward.rule("ip6 daddr @cluster_v6 jump to_pods", "towards pods");
    [from_pods, to_pods, forward]
}

/// `output` and `from_host`: only the kubelet's probes open connections from the host to pods,
/// and host processes to pods of Networks with `hostAccess`.
fn host_to_pods_chains() -> [Chain; 2] {
    let mark = format!("meta mark & {PROBE_MARK_MASK:#010x} == {PROBE_MARK:#010x}");
    let mut output = Chain {
        name: "output".into(),
        hook: Some(Hook {
            kind: "filter",
            hook: "output",
            priority: "filter",
        }),
        comment: "host processes towards pods".into(),
        rules: Vec::new(),
    };
    // A pod source means a packet leaked between VRFs re-entering through the VRF device's
    // transmit path (which runs the output hook); it was policed in prerouting and forward.
    output.rule(
        "ip daddr @cluster_v4 ip saddr != @cluster_v4 jump from_host",
        "host processes towards pods",
    );
    output.rule(
        "ip6 daddr @cluster_v6 ip6 saddr != @cluster_v6 jump from_host",
        "host processes towards pods",
    );
    let mut from_host = Chain {
        name: "from_host".into(),
        hook: None,
        comment: "only the kubelet (probes) opens connections from the host to pods".into(),
        rules: Vec::new(),
    };
    from_host.rule(
        "ct state established,related accept",
        "replies of connections pods opened",
    );
    from_host.rule(
        format!("{mark} accept"),
        "kubelet probes: socket mark set by Lace's cgroup program",
    );
    // NodePort connections forwarded into a VRF keep the client's source when kube-proxy
    // does not masquerade them (externalTrafficPolicy Local), and the VRF's transmit path
    // runs this hook for them.
    ingress::accept_nodeports(&mut from_host);
    hostport::accept(&mut from_host);
    host_access::accept_from_host(&mut from_host);
    from_host.rule(
        "counter drop",
        "host processes other than the kubelet open no connections to pods of Networks without hostAccess",
    );
    [output, from_host]
}

/// `input` and `pods_to_host`: pods towards the host's link-local and multicast addresses.
fn pods_to_host_chains() -> [Chain; 2] {
    let mut input = Chain {
        name: "input".into(),
        hook: Some(Hook {
            kind: "filter",
            hook: "input",
            priority: "filter",
        }),
        comment: "local pods towards the host's link-local and multicast addresses".into(),
        rules: Vec::new(),
    };
    // Other packets from pods to link-local or multicast addresses get no second prerouting
    // pass; they arrive here with the VRF as input device and reach even the host's unbound
    // sockets through the l3mdev_accept sysctls. Neighbour discovery keeps the veth as input
    // device, so it never comes here.
    input.rule(
        "iifname @vrfs ip6 daddr @link_scope_v6 jump pods_to_host",
        "pods towards the host over their veth",
    );
    let mut pods_to_host = Chain {
        name: "pods_to_host".into(),
        hook: None,
        comment: "pods do not open connections to the host; replies to the kubelet do come back"
            .into(),
        rules: Vec::new(),
    };
    pods_to_host.rule(
        "ct state established,related accept",
        "replies to IPv6 kubelet probes (sent from fe80::1)",
    );
    pods_to_host.rule(
        "counter drop",
        "pods reach no host service through their gateway fe80::1 or the veth's link-local address",
    );
    [input, pods_to_host]
}

/// Masquerade of what leaves to external Networks (and external Services) behind the node.
fn masquerade() -> Chain {
    let mut postrouting = Chain {
        name: "postrouting".into(),
        hook: Some(Hook {
            kind: "nat",
            hook: "postrouting",
            priority: "srcnat + 10",
        }),
        comment: "masquerade traffic leaving to external Networks behind the node".into(),
        rules: Vec::new(),
    };
    postrouting.rule(
        "ip saddr @egress_v4 ip daddr != @cluster_v4 masquerade",
        "NetworkRoutingPolicy to an external Network",
    );
    postrouting.rule(
        "ip6 saddr @egress_v6 ip6 daddr != @cluster_v6 masquerade",
        "NetworkRoutingPolicy to an external Network",
    );
    postrouting.rule(
        "ct status dnat ip saddr . ct original ip daddr @services_external_v4 masquerade",
        "ServiceRoutingPolicy to a Service on an external Network uses host routing",
    );
    postrouting.rule(
        "ct status dnat ip6 saddr . ct original ip6 daddr @services_external_v6 masquerade",
        "ServiceRoutingPolicy to a Service on an external Network uses host routing",
    );
    postrouting
}
