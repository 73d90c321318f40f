//! The diff over IPv4 underlays: the SRv6-over-IPv4 device and its fou port, IPv6 enabled on
//! every device of Lace's that carries it before its addresses and routes, and the
//! link-local path over the IPv4 uplink.

use super::*;

// --- The SRv6-over-IPv4 device ---------------------------------------------------------

const V4_UPLINK: std::net::Ipv4Addr = std::net::Ipv4Addr::new(192, 0, 2, 1);

/// `state(false)` with IPv4 InternalIPs `192.0.2.<i>`: n2 has no IPv6, n1 has it if `n1_v6`.
fn state_v4(n1_v6: bool) -> ClusterState {
    let mut s = state(false);
    for (n, a) in s.node_allocations.iter_mut() {
        a.underlay.ipv4 = Some(std::net::Ipv4Addr::new(192, 0, 2, a.index as u8 - 1));
        if n == "n2" || !n1_v6 {
            a.underlay.ipv6 = None;
        }
    }
    s
}

fn desired_v4(s: &ClusterState) -> DesiredNode {
    let pod = PodAttachment {
        pod: ObjectKey::new("ns", "pa"),
        container_id: "c1".into(),
        host_ifname: "lp-pa".into(),
        network: "a".into(),
        ips: vec!["10.1.1.10/32".parse().unwrap()],
        host_ports: Vec::new(),
        bandwidth: None,
    };
    plan("n1", s, &[pod]).unwrap()
}

/// [`bare_host`] whose uplink also holds n1's IPv4 InternalIP (and IPv6 only if `v6`).
fn host_v4(v6: bool) -> ObservedNode {
    let mut o = bare_host();
    if !v6 {
        o.addrs.clear();
    }
    o.addrs.push((IpAddr::V4(V4_UPLINK), 2));
    o
}

fn tunnel_of(d: &DesiredNode) -> crate::plan::underlay::Ipv4Tunnel {
    d.base.ipv4_tunnel.expect("a tunnel is planned")
}

#[test]
fn an_ipv4_peer_gets_the_tunnel_up_only_after_its_guard_and_converges() {
    for n1_v6 in [true, false] {
        let d = desired_v4(&state_v4(n1_v6));
        let mut o = host_v4(n1_v6);
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        let at = |f: &dyn Fn(&Op) -> bool| first(&ops, f).unwrap_or_else(|| panic!("{ops:#?}"));
        let add = at(&|o| matches!(o, Op::AddTunnel { .. }));
        assert_eq!(
            ops[add],
            Op::AddTunnel {
                name: IPV4_TUNNEL.into(),
                sit: tunnel::planned_sit(&tunnel_of(&d)),
                mtu: 1500 - 28,
            }
        );
        let nft = at(&|o| matches!(o, Op::NftSwap { .. }));
        let up = at(&|o| matches!(o, Op::TunnelUp { .. }));
        let fou = at(&|o| matches!(o, Op::AddFou { replace: false, .. }));
        let route = at(&|o| matches!(o, Op::PutRoute { .. }));
        assert!(
            add < nft && nft < up && up < route && fou < route,
            "{ops:#?}"
        );
        // Over IPv4: the locator via the peer's IPv4-compatible address, encap on lu-ipv4.
        let puts = puts(&ops);
        let loc = RouteKey::new(
            crate::plan::MAIN_TABLE,
            "2001:db8:100::2:0:0/96".parse().unwrap(),
        );
        assert_eq!(
            puts[&loc],
            KernelNexthop::Via {
                via: "::192.0.2.2".parse().unwrap(),
                dev: IPV4_TUNNEL.into()
            }
        );
        let block = RouteKey::new(d.base.vrfs["lv-a"].table, "10.1.2.0/24".parse().unwrap());
        assert_eq!(
            puts[&block],
            KernelNexthop::Seg6Encap {
                segs: "2001:db8:100::2:1:0".parse().unwrap(),
                dev: IPV4_TUNNEL.into()
            }
        );
        // Without an IPv6 InternalIP, the locator's address is the source, and the device
        // holds it, once IPv6 is enabled on it.
        let src: Ipv6Addr = "2001:db8:100::1:0:0".parse().unwrap();
        if !n1_v6 {
            let sysctl = at(
                &|o| matches!(o, Op::Sysctl { key, value } if key == "net.ipv6.conf.lu-ipv4.disable_ipv6" && value == "0"),
            );
            let addr = at(
                &|o| matches!(o, Op::AddAddress { link, addr } if link == IPV4_TUNNEL && addr.addr() == IpAddr::V6(src)),
            );
            assert!(sysctl < addr && addr < up, "{ops:#?}");
            assert!(ops.contains(&Op::Tunsrc(src)));
        } else {
            assert!(!ops
                .iter()
                .any(|o| matches!(o, Op::AddAddress { link, .. } if link == IPV4_TUNNEL)));
            assert!(ops.contains(&Op::Tunsrc(ul(1))));
        }
        model(&mut o, &ops);
        assert_eq!(
            diff(Some(&d), &o, None).unwrap(),
            Diff::default(),
            "IPv6 {n1_v6}"
        );
    }
}

#[test]
fn the_tunnel_follows_the_uplink_mtu_and_is_recreated_when_it_differs() {
    let s = state_v4(true);
    let d = desired_v4(&s);
    let mut o = host_v4(true);
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    model(&mut o, &ops);
    // A jumbo uplink: only the device's MTU follows.
    o.links.get_mut(UPLINK).unwrap().mtu = 9000;
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    assert_eq!(
        ops,
        vec![Op::SetMtu {
            name: IPV4_TUNNEL.into(),
            mtu: 9000 - 28
        }]
    );
    model(&mut o, &ops);
    // The InternalIP moves: a new device, and everything that went with the old one (the
    // routes through it, its sysctl) is written again although it looked right before.
    let mut moved = s.clone();
    let new_ip = std::net::Ipv4Addr::new(192, 0, 2, 9);
    moved.node_allocations.get_mut("n1").unwrap().underlay.ipv4 = Some(new_ip);
    o.addrs.push((IpAddr::V4(new_ip), 2));
    let d2 = desired_v4(&moved);
    let ops = diff(Some(&d2), &o, None).unwrap().ops;
    assert_eq!(
        ops[0],
        Op::ReplaceLink {
            name: IPV4_TUNNEL.into()
        }
    );
    assert!(matches!(&ops[1], Op::AddTunnel { sit, .. } if sit.local == Some(new_ip)));
    let via_tunnel = d2
        .routes()
        .filter(|(_, nh)| {
            matches!(
                nh,
                Nexthop::Ipv4Tunnel { .. }
                    | Nexthop::Seg6Encap {
                        underlay: crate::plan::Underpath::Fou,
                        ..
                    }
            )
        })
        .count();
    assert!(
        via_tunnel >= 2,
        "{via_tunnel} routes through the tunnel: the locator and a block"
    );
    assert_eq!(
        ops.iter()
            .filter(|o| matches!(o, Op::PutRoute { nh, .. } if nh.dev() == Some(IPV4_TUNNEL)))
            .count(),
        via_tunnel,
        "{ops:#?}"
    );
    assert!(ops
        .iter()
        .any(|o| matches!(o, Op::Sysctl { key, .. } if key.contains(IPV4_TUNNEL))));
    assert!(
        !ops.iter().any(|o| matches!(o, Op::AddFou { .. })),
        "the port stays"
    );
    model(&mut o, &ops);
    assert_eq!(diff(Some(&d2), &o, None).unwrap(), Diff::default());
    // An address nobody planned on the device (by hand, or an old locator's): re-created.
    let index = o.links[IPV4_TUNNEL].index;
    o.addrs.push(("2001:db8:dead::1".parse().unwrap(), index));
    let ops = diff(Some(&d2), &o, None).unwrap().ops;
    assert_eq!(
        ops[0],
        Op::ReplaceLink {
            name: IPV4_TUNNEL.into()
        }
    );
}

#[test]
fn the_fou_port_goes_before_its_device_and_a_foreign_one_on_it_is_replaced() {
    let d = desired_v4(&state_v4(true));
    for without in [Some(desired(false)), None] {
        let mut o = host_v4(true);
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        model(&mut o, &ops);
        assert!(o.fou.is_some() && o.links.contains_key(IPV4_TUNNEL));
        // No IPv4 peer any more (or no Lace at all).
        let ops = diff(without.as_ref(), &o, None).unwrap().ops;
        let del_fou = first(&ops, |o| matches!(o, Op::DelFou { .. })).expect("fou del");
        let del_link = first(&ops, |o| {
            *o == Op::DelLink {
                name: IPV4_TUNNEL.into(),
            }
        })
        .expect("link del");
        assert!(del_fou < del_link, "{ops:#?}");
        model(&mut o, &ops);
        assert!(o.tunnels().next().is_none());
        assert_eq!(diff(without.as_ref(), &o, None).unwrap().ops, vec![]);
    }
    // Someone else listens on Lace's port (GUE): replaced. Other ports are not Lace's.
    let mut o = host_v4(true);
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    model(&mut o, &ops);
    let other = FouListener {
        port: 5555,
        family: libc::AF_INET as u8,
        ipproto: Some(4),
    };
    o.fou = Some(vec![
        other,
        FouListener {
            ipproto: None,
            ..FouListener::direct_v4(FOU_PORT, FOU_IPPROTO)
        },
    ]);
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    assert_eq!(
        ops,
        vec![Op::AddFou {
            listener: FouListener::direct_v4(FOU_PORT, FOU_IPPROTO),
            replace: true
        }]
    );
    model(&mut o, &ops);
    assert!(o.fou.as_ref().unwrap().contains(&other));
    let ops = diff(None, &o, None).unwrap().ops;
    assert!(!ops.contains(&Op::DelFou { listener: other }));
}

#[test]
fn a_tunnel_without_a_link_holding_the_ipv4_internal_ip_is_an_error() {
    let d = desired_v4(&state_v4(true));
    assert_eq!(
        diff(Some(&d), &bare_host(), None).unwrap_err(),
        DiffError::NoUplink {
            underlay: IpAddr::V4(V4_UPLINK)
        }
    );
}

// --- Hosts that disable IPv6 by default ------------------------------------------------

/// `state_v4(v6)` with Network `a` dual-stack (`fd00:1::/56`, blocks of /64).
fn state_dual(n1_v6: bool) -> ClusterState {
    let mut s = state_v4(n1_v6);
    s.networks.get_mut("a").unwrap().subnets.push(Subnet {
        cidr: "fd00:1::/56".parse().unwrap(),
        block_prefix: 64,
    });
    s
}

/// n1's plan in `s`: pod `pa` dual-stack on `lp-pa`, pod `pb` IPv4 only on `lp-pb` (both
/// in Network `a`).
fn desired_dual(s: &ClusterState) -> DesiredNode {
    let pods = [
        PodAttachment {
            pod: ObjectKey::new("ns", "pa"),
            container_id: "c1".into(),
            host_ifname: "lp-pa".into(),
            network: "a".into(),
            ips: vec![
                "10.1.1.10/32".parse().unwrap(),
                "fd00:1:0:1::a/128".parse().unwrap(),
            ],
            host_ports: Vec::new(),
            bandwidth: None,
        },
        PodAttachment {
            pod: ObjectKey::new("ns", "pb"),
            container_id: "c2".into(),
            host_ifname: "lp-pb".into(),
            network: "a".into(),
            ips: vec!["10.1.1.11/32".parse().unwrap()],
            host_ports: Vec::new(),
            bandwidth: None,
        },
    ];
    plan("n1", s, &pods).unwrap()
}

fn lace_link(name: &str) -> bool {
    [
        crate::plan::VRF_PREFIX,
        crate::plan::INGRESS_PREFIX,
        crate::plan::underlay::TUNNEL_PREFIX,
        crate::plan::POD_LINK_PREFIX,
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// Runs `ops` against a kernel whose `default` disables IPv6: links Lace creates, and the
/// pod veths (created by the CNI), start with IPv6 off; the host's links have it as
/// `host_v6` says. Panics where the kernel would refuse an IPv6 address or route on a link
/// with IPv6 off, and where Lace switches IPv6 on for a link that is not its own.
fn check_ipv6_order(o: &ObservedNode, ops: &[Op], host_v6: bool) {
    let mut on: BTreeMap<String, bool> = o
        .links
        .keys()
        .map(|n| (n.clone(), !lace_link(n) && host_v6))
        .collect();
    // A link that exists and already holds an IPv6 address has IPv6 on.
    for (n, l) in &o.links {
        if o.addrs.iter().any(|(a, i)| *i == l.index && a.is_ipv6()) {
            on.insert(n.clone(), true);
        }
    }
    for (i, op) in ops.iter().enumerate() {
        let need = |dev: &str| {
            assert!(
                on.get(dev).copied().unwrap_or(false),
                "op {i} ({op}) needs IPv6 on {dev}, which is off then:\n{ops:#?}"
            )
        };
        match op {
            Op::AddVrf { name, .. } | Op::AddTunnel { name, .. } => {
                on.insert(name.clone(), false);
            }
            Op::Sysctl { key, value } if key.ends_with(".disable_ipv6") => {
                let dev = sysctl_device(key).unwrap();
                assert!(
                    lace_link(dev),
                    "IPv6 switched on a device that is not Lace's: {key}"
                );
                assert_eq!(value, "0");
                on.insert(dev.to_string(), true);
            }
            Op::AddAddress { link, addr } if addr.addr().is_ipv6() => need(link),
            Op::PutRoute { key, nh } => {
                if let (IpNet::V6(_), Some(dev)) = (key.dst, nh.dev()) {
                    need(dev)
                }
            }
            _ => {}
        }
    }
}

/// What the kernel does when someone switches IPv6 off on `link`: its IPv6 addresses and
/// the IPv6 routes through it go (notified); its sysctl reads 1 where it is read.
fn switch_ipv6_off(o: &mut ObservedNode, link: &str) {
    let index = o.links[link].index;
    o.addrs.retain(|(a, i)| !(*i == index && a.is_ipv6()));
    o.routes
        .retain(|k, nh| !(k.dst.addr().is_ipv6() && nh.dev() == Some(link)));
    if let Some(v) = o.sysctls.get_mut(&disable_ipv6_key(link)) {
        *v = Some("1".into());
    }
}

#[test]
fn every_device_of_lace_s_that_carries_ipv6_gets_it_before_its_addresses_and_routes() {
    // A node without IPv6 on its links at all (SRv6 over IPv4), and one whose uplink has
    // IPv6 (SRv6 over IPv6 and IPv4): only Lace's devices are switched on, each before use.
    for n1_v6 in [false, true] {
        let d = desired_dual(&state_dual(n1_v6));
        let mut o = host_v4(n1_v6);
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        check_ipv6_order(&o, &ops, n1_v6);
        let enabled: BTreeSet<&str> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Sysctl { key, .. } if key.ends_with(".disable_ipv6") => sysctl_device(key),
                _ => None,
            })
            .collect();
        // The VRF, the tunnel, the dual-stack pod's veth; not the IPv4-only pod's.
        assert_eq!(
            enabled,
            BTreeSet::from(["lv-a", IPV4_TUNNEL, "lp-pa"]),
            "{ops:#?}"
        );
        model(&mut o, &ops);
        assert_eq!(diff(Some(&d), &o, None).unwrap().ops, vec![]);
    }
}

#[test]
fn attach_switches_ipv6_on_for_the_vrf_it_creates_and_the_pod_s_veth() {
    let s = state_dual(false);
    let d = desired_dual(&s);
    for pod in ["lp-pa", "lp-pb"] {
        let o = host_v4(false);
        let ops = attach(&just(&d, pod), &o, &o.tc).unwrap().ops;
        check_ipv6_order(&o, &ops, false);
        let vrf_on = Op::Sysctl {
            key: disable_ipv6_key("lv-a"),
            value: "0".into(),
        };
        assert!(ops.contains(&vrf_on), "{ops:#?}");
        let veth_on = ops.contains(&Op::Sysctl {
            key: disable_ipv6_key(pod),
            value: "0".into(),
        });
        assert_eq!(veth_on, pod == "lp-pa", "only the pod with IPv6: {ops:#?}");
    }
    // The VRF exists already: attach leaves its sysctls to the reconciles.
    let mut o = host_v4(false);
    let ops = diff(Some(&just(&d, "lp-pb")), &o, None).unwrap().ops;
    model(&mut o, &ops);
    let ops = attach(&just(&d, "lp-pa"), &o, &o.tc).unwrap().ops;
    assert!(
        !ops.iter()
            .any(|op| matches!(op, Op::Sysctl { key, .. } if key.contains("lv-a"))),
        "{ops:#?}"
    );
    check_ipv6_order(&o, &ops, false);
}

#[test]
fn ipv6_switched_off_on_a_lace_device_is_seen_and_switched_on_again_first() {
    let d = desired_dual(&state_dual(false));
    for link in ["lv-a", IPV4_TUNNEL, "lp-pa"] {
        let mut o = host_v4(false);
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        model(&mut o, &ops);
        switch_ipv6_off(&mut o, link);
        // What the kernel notifies (addresses, routes) shows it: the agent repairs at once.
        assert!(!drift(&d, &o).unwrap().is_empty(), "{link}: no drift seen");
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        let on = first(&ops, |op| {
            *op == Op::Sysctl {
                key: disable_ipv6_key(link),
                value: "0".into(),
            }
        })
        .unwrap_or_else(|| panic!("{link}: IPv6 not switched on again: {ops:#?}"));
        // Everything IPv6 through the link comes after.
        for (i, op) in ops.iter().enumerate() {
            let through = match op {
                Op::AddAddress { link: l, addr } => l == link && addr.addr().is_ipv6(),
                Op::PutRoute { key, nh } => key.dst.addr().is_ipv6() && nh.dev() == Some(link),
                _ => false,
            };
            assert!(
                !through || i > on,
                "{link}: {op} before IPv6 is on: {ops:#?}"
            );
        }
        model(&mut o, &ops);
        assert_eq!(diff(Some(&d), &o, None).unwrap().ops, vec![], "{link}");
    }
}

#[test]
fn a_missing_ipv6_underlay_address_names_disable_ipv6() {
    let d = desired(false);
    let mut o = bare_host();
    o.addrs.clear();
    let e = diff(Some(&d), &o, None).unwrap_err().to_string();
    assert!(
        e.contains("disable_ipv6") && e.contains("IPv4 InternalIP"),
        "{e}"
    );
    let d = desired_v4(&state_v4(true));
    let e = diff(Some(&d), &bare_host(), None).unwrap_err().to_string();
    assert!(!e.contains("disable_ipv6"), "{e}");
}
// --- The link-local underlay --------------------------------------------------------------

/// n1 (IPv4 only) with n2 on its L2 segment, answering when `works`.
fn desired_ll(works: bool) -> DesiredNode {
    let s = state_v4(false);
    let facts = crate::plan::underlay::UnderlayFacts {
        uplink_ipv6: true,
        on_link: ["n2".to_string()].into(),
        answering: if works {
            ["n2".to_string()].into()
        } else {
            BTreeSet::new()
        },
        answered: ["n2".to_string()].into(),
        uplink_mtu: Some(1500),
    };
    crate::plan::Planner::with_facts("n1", &s, &facts)
        .unwrap()
        .plan(&[])
        .unwrap()
}

#[test]
fn the_link_local_path_holds_the_address_on_the_ipv4_uplink_and_routes_via_the_peers() {
    use crate::plan::underlay::link_local_address;
    let d = desired_ll(true);
    let mut o = host_v4(false);
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    let own = link_local_address(V4_UPLINK);
    let peer = link_local_address(std::net::Ipv4Addr::new(192, 0, 2, 2));
    let add = first(&ops, |o: &Op| {
        matches!(o, Op::AddAddress { link, addr } if link == UPLINK && addr.addr() == IpAddr::V6(own) && addr.prefix_len() == 64)
    })
    .unwrap_or_else(|| panic!("{ops:#?}"));
    let route = first(&ops, |o: &Op| matches!(o, Op::PutRoute { .. })).unwrap();
    assert!(add < route, "{ops:#?}");
    // No fou device: every peer is on the link-local path.
    assert!(
        !ops.iter().any(|o| matches!(o, Op::AddTunnel { .. })),
        "{ops:#?}"
    );
    let put = puts(&ops);
    let loc = RouteKey::new(
        crate::plan::MAIN_TABLE,
        "2001:db8:100::2:0:0/96".parse().unwrap(),
    );
    assert_eq!(
        put[&loc],
        KernelNexthop::Via {
            via: IpAddr::V6(peer),
            dev: UPLINK.into()
        }
    );
    for (k, nh) in &put {
        if let KernelNexthop::Seg6Encap { dev, .. } = nh {
            assert_eq!(&**dev, UPLINK, "{k:?}");
        }
    }
    // A second apply writes nothing.
    model(&mut o, &ops);
    assert_eq!(diff(Some(&d), &o, None).unwrap().ops, vec![]);
    // The address deleted by hand is drift, put back.
    o.addrs.retain(|(a, _)| *a != IpAddr::V6(own));
    assert!(matches!(
        drift(&d, &o).unwrap().as_slice(),
        [Op::AddAddress { .. }]
    ));
    let repair = drift(&d, &o).unwrap();
    model(&mut o, &repair);
    // Fallen back to fou: the routes move to lu-ipv4, the address stays (the peer's probes
    // need it to find the path working again).
    let fou = desired_ll(false);
    let ops = diff(Some(&fou), &o, None).unwrap().ops;
    assert!(
        !ops.iter().any(|o| matches!(o, Op::DelAddress { .. })),
        "{ops:#?}"
    );
    assert_eq!(
        puts(&ops)[&loc],
        KernelNexthop::Via {
            via: IpAddr::V6(std::net::Ipv4Addr::new(192, 0, 2, 2).to_ipv6_compatible()),
            dev: IPV4_TUNNEL.into()
        }
    );
    model(&mut o, &ops);
    // Without facts (no L2 neighbour): the address goes, after the routes.
    let none = desired_v4(&state_v4(false));
    let ops = diff(Some(&none), &o, None).unwrap().ops;
    assert!(ops.contains(&Op::DelAddress {
        link: UPLINK.into(),
        addr: IpNet::V6(Ipv6Net::new_assert(own, 64))
    }));
    model(&mut o, &ops);
    assert!(!o.addrs.contains(&(IpAddr::V6(own), o.links[UPLINK].index)));
    assert_eq!(diff(Some(&none), &o, None).unwrap().ops, vec![]);
}

#[test]
fn stale_link_local_underlay_addresses_go_and_teardown_takes_them_and_never_the_kernels() {
    use crate::plan::underlay::link_local_address;
    let d = desired_ll(true);
    let mut o = host_v4(false);
    let index = o.links[UPLINK].index;
    // An old InternalIP's address, and the kernel's own link-local: only the first is Lace's.
    let old = link_local_address(std::net::Ipv4Addr::new(192, 0, 2, 99));
    let kernels: Ipv6Addr = "fe80::200:ff:fe00:1".parse().unwrap();
    o.addrs.push((IpAddr::V6(old), index));
    o.addrs.push((IpAddr::V6(kernels), index));
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    let dels: Vec<&Op> = ops
        .iter()
        .filter(|o| matches!(o, Op::DelAddress { .. }))
        .collect();
    assert_eq!(
        dels,
        [&Op::DelAddress {
            link: UPLINK.into(),
            addr: IpNet::V6(Ipv6Net::new_assert(old, 64))
        }]
    );
    model(&mut o, &ops);
    let ops = diff(None, &o, None).unwrap().ops;
    let dels: Vec<IpAddr> = ops
        .iter()
        .filter_map(|o| match o {
            Op::DelAddress { addr, .. } => Some(addr.addr()),
            _ => None,
        })
        .collect();
    assert_eq!(dels, [IpAddr::V6(link_local_address(V4_UPLINK))]);
    model(&mut o, &ops);
    assert!(o.addrs.contains(&(IpAddr::V6(kernels), index)));
}

#[test]
fn the_link_local_path_without_a_link_holding_the_ipv4_internal_ip_names_it() {
    let d = desired_ll(true);
    let e = diff(Some(&d), &bare_host(), None).unwrap_err().to_string();
    assert!(e.contains("192.0.2.1"), "{e}");
}
