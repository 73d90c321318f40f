//! The diff's tests: what a plan turns into against a host as observed, and that applying
//! it (to the fake kernel of [`model`]) converges to nothing left to do.

mod runs;
mod underlay;

use super::*;
use crate::api::Subnet;
use crate::dataplane::fixtures::{bare_host, desired, model, state, ul, EGRESS, UPLINK};
use crate::dataplane::observed::{KernelRoutes, ObservedRule};
use crate::plan::{plan, Family};
use crate::state::{ClusterState, ObjectKey, PodAttachment};

/// The routes `ops` put, with their next hops.
fn puts(ops: &[Op]) -> BTreeMap<RouteKey, KernelNexthop> {
    ops.iter()
        .filter_map(|o| match o {
            Op::PutRoute { key, nh } => Some((*key, nh.clone())),
            _ => None,
        })
        .collect()
}

/// A bare host once the diff of `d` against it is applied (to the model).
fn converged(d: &DesiredNode) -> ObservedNode {
    let mut o = bare_host();
    let ops = diff(Some(d), &o, None).unwrap().ops;
    model(&mut o, &ops);
    o
}

fn first(ops: &[Op], f: impl Fn(&Op) -> bool) -> Option<usize> {
    ops.iter().position(f)
}

#[test]
fn from_scratch_everything_is_added_in_a_safe_order() {
    let d = desired(true);
    let diff = diff(Some(&d), &bare_host(), None).unwrap();
    let ops = &diff.ops;
    assert!(diff.skipped.is_empty());
    assert!(ops.windows(2).all(|w| w[0].phase() <= w[1].phase()));
    let first_route = first(ops, |o| matches!(o, Op::PutRoute { .. })).unwrap();
    let last_vrf = ops
        .iter()
        .rposition(|o| matches!(o, Op::AddVrf { .. }))
        .unwrap();
    let nft = first(ops, |o| matches!(o, Op::NftSwap { .. })).unwrap();
    let strict = first(
        ops,
        |o| matches!(o, Op::Sysctl { key, .. } if key == "net.vrf.strict_mode"),
    )
    .unwrap();
    assert!(last_vrf < nft && nft < first_route && strict < first_route);
    assert!(!ops.iter().any(|o| matches!(
        o,
        Op::DelRoute { .. } | Op::DelRule(_) | Op::DelLink { .. } | Op::NftDelete
    )));
    // Every planned route, with symbolic next hops resolved.
    let puts = puts(ops);
    assert_eq!(puts.len(), d.routes().count());
    let egress = RouteKey::new(d.base.vrfs["lv-a"].table, "0.0.0.0/0".parse().unwrap());
    assert_eq!(
        puts[&egress],
        KernelNexthop::Via {
            via: "198.51.100.2".parse().unwrap(),
            dev: EGRESS.into()
        },
        "Host next hop = the main table's default route"
    );
    for (k, nh) in &puts {
        match (d.route(k).unwrap(), nh) {
            (Nexthop::Seg6Encap { .. }, KernelNexthop::Seg6Encap { dev, .. })
            | (Nexthop::Underlay { .. }, KernelNexthop::Via { dev, .. }) => {
                assert_eq!(&**dev, UPLINK, "{k:?}")
            }
            _ => {}
        }
    }
    assert!(ops.contains(&Op::SetMaster {
        link: "lp-pa".into(),
        master: "lv-a".into()
    }));
    assert!(ops.contains(&Op::Tunsrc(ul(1))));
}

#[test]
fn applying_the_diff_converges_to_no_ops() {
    let d = desired(true);
    let o = converged(&d);
    assert_eq!(diff(Some(&d), &o, None).unwrap(), Diff::default());
}

#[test]
fn removing_a_network_deletes_its_state_last_and_nothing_foreign() {
    let mut o = bare_host();
    let ops = diff(Some(&desired(true)), &o, None).unwrap().ops;
    model(&mut o, &ops);
    let d = desired(false);
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    let table_b = 1_000_002;
    assert!(ops.contains(&Op::DelLink {
        name: "lv-b".into()
    }));
    let dels: Vec<&Op> = ops
        .iter()
        .filter(|o| matches!(o, Op::DelRoute { .. }))
        .collect();
    assert!(dels
        .iter()
        .any(|o| matches!(o, Op::DelRoute { key, .. } if key.table == table_b)));
    // Deletions come after every addition.
    let first_del = first(&ops, |o| {
        matches!(o, Op::DelRoute { .. } | Op::DelLink { .. })
    })
    .unwrap();
    assert!(ops[first_del..]
        .iter()
        .all(|o| matches!(o, Op::DelRoute { .. } | Op::DelRule(_) | Op::DelLink { .. })));
    model(&mut o, &ops);
    assert!(o.routes.keys().all(|k| k.table != table_b));
    assert!(o.links.contains_key("keep0") && o.links.contains_key("lp-pb"));
    assert_eq!(diff(Some(&d), &o, None).unwrap(), Diff::default());
}

#[test]
fn a_table_known_to_hold_the_last_ruleset_gets_only_the_changed_elements() {
    let mut o = bare_host();
    let before = desired(true);
    let ops = diff(Some(&before), &o, None).unwrap().ops;
    let known = KnownRuleset::after(None, Some(&before.base.nft), nft::tag_after(&ops, &o.nft));
    model(&mut o, &ops);
    // Removing Network b changes elements only (its VRF, subnets), not the chains.
    let after = desired(false);
    let ops = diff(Some(&after), &o, known.as_ref()).unwrap().ops;
    let nft_ops: Vec<&Op> = ops
        .iter()
        .filter(|op| matches!(op, Op::NftSwap { .. } | Op::NftUpdate { .. }))
        .collect();
    assert!(
        matches!(nft_ops.as_slice(), [Op::NftUpdate { update, .. }] if update.deleted > 0 && update.chains.is_empty()),
        "{nft_ops:#?}"
    );
    // Without that knowledge (a restarted reconciler) the table is replaced.
    let unknown = diff(Some(&after), &o, None).unwrap().ops;
    assert!(unknown.iter().any(|op| matches!(op, Op::NftSwap { .. })));
    model(&mut o, &ops);
    assert_eq!(diff(Some(&after), &o, None).unwrap(), Diff::default());
}

#[test]
fn teardown_removes_all_of_lace_but_the_shared_l3mdev_rule() {
    let mut o = bare_host();
    let ops = diff(Some(&desired(true)), &o, None).unwrap().ops;
    model(&mut o, &ops);
    let ops = diff(None, &o, None).unwrap().ops;
    model(&mut o, &ops);
    assert!(o.routes.is_empty());
    assert!(o.vrfs().next().is_none());
    assert_eq!(o.nft, NftState::Absent);
    let left: Vec<Rule> = o.rules.iter().filter_map(|r| r.rule).collect();
    assert!(left.iter().all(|r| r.action == RuleAction::L3mdev));
    assert_eq!(left.len(), 2);
    for name in ["lo", UPLINK, EGRESS, "lp-pa", "keep0"] {
        assert!(o.links.contains_key(name), "{name}");
    }
    assert!(diff(None, &o, None).unwrap().ops.is_empty());
}

#[test]
fn a_changed_route_is_replaced_and_a_stray_rule_in_the_band_deleted() {
    let d = desired(true);
    let mut o = converged(&d);
    let (key, _) = d.routes().next().map(|(k, n)| (*k, n.clone())).unwrap();
    o.routes
        .insert(key, KernelNexthop::Unknown("edited by hand".into()));
    let stray = ObservedRule {
        rule: Some(Rule {
            priority: 995,
            family: Family::V4,
            action: RuleAction::Fwmark {
                mark: 1,
                mask: 1,
                table: 7,
            },
        }),
        raw: Default::default(),
    };
    o.rules.push(stray.clone());
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    assert_eq!(ops.len(), 2, "{ops:#?}");
    assert!(matches!(&ops[0], Op::PutRoute { key: k, .. } if *k == key));
    assert_eq!(ops[1], Op::DelRule(Box::new(stray)));
}

#[test]
fn routes_at_an_older_metric_are_put_at_the_planned_one_before_they_go() {
    // An older Lace wrote IPv4 routes in its VRF tables at metric 0.
    let d = desired(true);
    let mut o = converged(&d);
    let vrf_v4 = |k: &RouteKey| k.dst.addr().is_ipv4() && k.table != crate::plan::MAIN_TABLE;
    let older: KernelRoutes = std::mem::take(&mut o.routes)
        .into_iter()
        .map(|(k, nh)| match vrf_v4(&k) {
            true => (RouteKey { metric: 0, ..k }, nh),
            false => (k, nh),
        })
        .collect();
    let moved: BTreeSet<RouteKey> = older.keys().filter(|k| vrf_v4(k)).copied().collect();
    assert!(moved.len() > 5, "{moved:?}");
    o.routes = older.clone();
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    let put: BTreeSet<RouteKey> = puts(&ops).into_keys().collect();
    let del: BTreeSet<RouteKey> = ops
        .iter()
        .filter_map(|o| match o {
            Op::DelRoute { key, .. } => Some(*key),
            _ => None,
        })
        .collect();
    assert_eq!(del, moved);
    let want: BTreeSet<RouteKey> = moved
        .iter()
        .map(|k| RouteKey::new(k.table, k.dst))
        .collect();
    assert_eq!(put, want);
    assert!(want.iter().all(|k| k.metric > 0));
    // Each next hop moves with its route, and no destination is left without one between.
    for k in &moved {
        assert_eq!(puts(&ops)[&RouteKey::new(k.table, k.dst)], older[k]);
    }
    let last_put = ops.iter().rposition(|o| matches!(o, Op::PutRoute { .. }));
    let first_del = first(&ops, |o| matches!(o, Op::DelRoute { .. }));
    assert!(last_put < first_del, "{ops:#?}");
    model(&mut o, &ops);
    assert_eq!(diff(Some(&d), &o, None).unwrap(), Diff::default());
}

#[test]
fn no_uplink_is_an_error_missing_host_routes_and_pod_links_are_skipped() {
    let d = desired(true);
    let mut o = bare_host();
    o.addrs.clear();
    assert_eq!(
        diff(Some(&d), &o, None).unwrap_err(),
        DiffError::NoUplink {
            underlay: IpAddr::V6(ul(1))
        }
    );
    let mut o = bare_host();
    o.host_routes.clear();
    let without_host = diff(Some(&d), &o, None).unwrap();
    let host_keys: Vec<RouteKey> = d
        .routes()
        .filter(|(_, nh)| **nh == Nexthop::Host)
        .map(|(k, _)| *k)
        .collect();
    assert!(!host_keys.is_empty());
    assert_eq!(
        without_host.skipped.len(),
        host_keys.len(),
        "{:?}",
        without_host.skipped
    );
    assert!(!without_host
        .ops
        .iter()
        .any(|op| matches!(op, Op::PutRoute { key, .. } if host_keys.contains(key))));
    assert!(without_host
        .ops
        .iter()
        .any(|op| matches!(op, Op::PutRoute { .. })));
    let mut o = bare_host();
    o.links.remove("lp-pb");
    let diff = diff(Some(&d), &o, None).unwrap();
    assert_eq!(diff.skipped.len(), 2, "{:?}", diff.skipped); // VRF table + probe table
    assert!(!diff.ops.iter().any(|op| op.to_string().contains("lp-pb")));
}

#[test]
fn ipv6_probe_routes_get_fe80_1_on_the_pod_veth_first() {
    let mut s = state(false);
    s.networks.get_mut("a").unwrap().subnets.push(Subnet {
        cidr: "fd00:1::/48".parse().unwrap(),
        block_prefix: 64,
    });
    // n1 (index 2) holds block 1 of it: fd00:1:0:1::/64.
    let pod = PodAttachment {
        pod: ObjectKey::new("ns", "pa"),
        container_id: "c1".into(),
        host_ifname: "lp-pa".into(),
        network: "a".into(),
        ips: vec![
            "10.1.1.10/32".parse().unwrap(),
            "fd00:1:0:1::10/128".parse().unwrap(),
        ],
        host_ports: Vec::new(),
        bandwidth: None,
    };
    let d = plan("n1", &s, &[pod]).unwrap();
    let probe6 = RouteKey::new(PROBE_TABLE, "fd00:1:0:1::10/128".parse().unwrap());
    let gw = IpAddr::V6(crate::plan::POD_GATEWAY_V6);
    let add = Op::AddAddress {
        link: "lp-pa".into(),
        addr: "fe80::1/64".parse().unwrap(),
    };

    let mut o = bare_host();
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    let added = first(&ops, |op| *op == add).expect("no fe80::1 on lp-pa");
    let route = first(
        &ops,
        |op| matches!(op, Op::PutRoute { key, .. } if *key == probe6),
    )
    .expect("no IPv6 probe route");
    assert!(added < route, "{ops:#?}");
    assert_eq!(
        ops[route],
        Op::PutRoute {
            key: probe6,
            nh: KernelNexthop::DevSrc {
                dev: "lp-pa".into(),
                src: gw
            }
        }
    );
    assert_eq!(ops.iter().filter(|op| **op == add).count(), 1);
    // Only the pod veth of an IPv6 route gets it, not the IPv4-only one.
    assert!(!ops
        .iter()
        .any(|op| matches!(op, Op::AddAddress { link, .. } if link != "lp-pa")));

    model(&mut o, &ops);
    assert_eq!(
        diff(Some(&d), &o, None).unwrap().ops,
        vec![],
        "not idempotent"
    );

    // Moved out of its VRF (by hand): re-enslaving drops the address, so it is re-added
    // although it is observed now.
    o.links.get_mut("lp-pa").unwrap().master = None;
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    assert!(matches!(ops[0], Op::SetMaster { .. }), "{ops:#?}");
    assert!(ops[1..].contains(&add), "{ops:#?}");
    model(&mut o, &ops);
    assert_eq!(diff(Some(&d), &o, None).unwrap().ops, vec![]);

    // Deleted by hand: added again, the route stays as it is. IPv6 is switched on first
    // (a no-op unless that is why it went: see the tests of hosts that disable IPv6).
    o.addrs.retain(|(a, _)| *a != gw);
    assert_eq!(
        diff(Some(&d), &o, None).unwrap().ops,
        vec![
            Op::Sysctl {
                key: disable_ipv6_key("lp-pa"),
                value: "0".into()
            },
            add
        ]
    );
}

#[test]
fn probe_routes_keep_their_source_only_where_the_node_holds_it() {
    let mut d = desired(false);
    let src: IpAddr = "192.0.2.1".parse().unwrap();
    let key = RouteKey::new(crate::plan::PROBE_TABLE, "10.1.1.10/32".parse().unwrap());
    d.pod_routes.insert(
        key,
        Nexthop::DevSrc {
            dev: "lp-pa".into(),
            src,
        },
    );
    let put = |o: &ObservedNode| {
        diff(Some(&d), o, None)
            .unwrap()
            .ops
            .into_iter()
            .find_map(|op| match op {
                Op::PutRoute { key: k, nh } if k == key => Some(nh),
                _ => None,
            })
    };
    let mut o = bare_host();
    assert_eq!(put(&o), Some(KernelNexthop::Dev("lp-pa".into())));
    o.addrs.push((src, 2));
    assert_eq!(
        put(&o),
        Some(KernelNexthop::DevSrc {
            dev: "lp-pa".into(),
            src
        })
    );
}

/// The plan of just the pod on veth `dev` of `d` (what ADD attaches).
fn just(d: &DesiredNode, dev: &str) -> DesiredNode {
    let mut p = d.clone();
    p.pod_routes
        .retain(|_, nh| matches!(nh, Nexthop::Dev(x) | Nexthop::DevSrc { dev: x, .. } if x == dev));
    let vrf_tables: BTreeSet<u32> = d.base.vrfs.values().map(|v| v.table).collect();
    p.served_tables = p
        .pod_routes
        .keys()
        .map(|k| k.table)
        .filter(|t| vrf_tables.contains(t))
        .collect();
    p
}

/// `d` without its pods: the plan of a node that has none.
fn no_pods(d: &DesiredNode) -> DesiredNode {
    let mut p = d.clone();
    p.pod_routes.clear();
    p.served_tables.clear();
    p.shaping.clear();
    p
}

/// A Network's first pod brings its table's routes to the blocks the Network reaches: ADD
/// installs them with the pod's own, so the pod reaches other nodes when ADD returns; the
/// reconcile that follows writes nothing, and one without the pod deletes them.
#[test]
fn attach_of_a_network_s_first_pod_brings_its_routes_to_the_blocks_it_reaches() {
    let d = desired(false);
    let a_table = d.base.vrfs["lv-a"].table;
    let remote = RouteKey::new(a_table, "10.1.2.0/24".parse().unwrap());
    let via_n2 = KernelNexthop::Seg6Encap {
        segs: "2001:db8:100::2:1:0".parse().unwrap(),
        dev: UPLINK.into(),
    };
    let mut o = bare_host();
    let ops = diff(Some(&no_pods(&d)), &o, None).unwrap().ops;
    model(&mut o, &ops);
    assert_eq!(
        o.routes.get(&remote),
        None,
        "no pod of a: no route to n2's block"
    );
    assert!(
        o.links.contains_key("lv-a"),
        "the VRF is there all the same"
    );

    let pod = just(&d, "lp-pa");
    assert_eq!(pod.served_tables, [a_table].into());
    let ops = attach(&pod, &o, &o.tc).unwrap().ops;
    assert_eq!(puts(&ops).get(&remote), Some(&via_n2), "{ops:#?}");
    model(&mut o, &ops);
    assert_eq!(diff(Some(&d), &o, None).unwrap(), Diff::default());
    assert_eq!(attach(&pod, &o, &o.tc).unwrap(), Diff::default());

    // The last pod of a gone: its routes to the blocks go with it.
    let ops = diff(Some(&no_pods(&d)), &o, None).unwrap().ops;
    assert!(
        ops.iter()
            .any(|op| matches!(op, Op::DelRoute { key, .. } if *key == remote)),
        "{ops:#?}"
    );
}

#[test]
fn attach_writes_the_pod_s_part_of_the_plan_and_the_reconcile_nothing_more() {
    let d = desired(true);
    // The node as reconciled before pod b's ADD: everything but pod b; its veth exists.
    let mut before = d.clone();
    let a_only = just(&d, "lp-pa");
    before.pod_routes = a_only.pod_routes;
    before.served_tables = a_only.served_tables;
    let mut o = bare_host();
    let ops = diff(Some(&before), &o, None).unwrap().ops;
    model(&mut o, &ops);
    assert!(o.links["lp-pb"].master.is_none());

    let pod = just(&d, "lp-pb");
    let ops = attach(&pod, &o, &o.tc).unwrap().ops;
    let b_table = d.base.vrfs["lv-b"].table;
    assert!(ops.windows(2).all(|w| w[0].phase() <= w[1].phase()));
    assert!(ops.contains(&Op::SetMaster {
        link: "lp-pb".into(),
        master: "lv-b".into()
    }));
    for (key, _) in pod_link_sysctls("lp-pb", false) {
        assert!(
            ops.iter()
                .any(|op| matches!(op, Op::Sysctl { key: k, .. } if *k == key)),
            "{key}: {ops:#?}"
        );
    }
    let puts: BTreeSet<RouteKey> = ops
        .iter()
        .filter_map(|op| match op {
            Op::PutRoute { key, .. } => Some(*key),
            _ => None,
        })
        .collect();
    // b reaches nothing: its first pod brings no routes to blocks.
    assert!(pod
        .base
        .pod_reach
        .in_tables(&pod.served_tables, crate::plan::Tables::ALL)
        .next()
        .is_none());
    assert_eq!(puts, pod.pod_routes.keys().copied().collect());
    assert!(puts.iter().any(|k| k.table == b_table));
    assert!(puts.iter().any(|k| k.table == PROBE_TABLE));
    // Nothing but the pod's: no other routes, rules, nft, node sysctls, deletions.
    assert!(
        ops.iter().all(|op| match op {
            Op::SetMaster { .. } | Op::PutRoute { .. } => true,
            Op::Sysctl { key, .. } => key.contains("lp-pb"),
            _ => false,
        }),
        "{ops:#?}"
    );
    model(&mut o, &ops);
    assert_eq!(
        diff(Some(&d), &o, None).unwrap(),
        Diff::default(),
        "the reconcile after the ADD wrote something again"
    );
    assert_eq!(
        attach(&pod, &o, &o.tc).unwrap(),
        Diff::default(),
        "attach twice"
    );
}

#[test]
fn attach_creates_a_missing_vrf_and_a_reconcile_that_ran_first_leaves_it_nothing() {
    let d = desired(false);
    let pod = just(&d, "lp-pa");
    // A fresh node: the first pod's ADD comes before the first reconcile.
    let mut o = bare_host();
    let ops = attach(&pod, &o, &o.tc).unwrap().ops;
    assert_eq!(
        ops[0],
        Op::AddVrf {
            name: "lv-a".into(),
            table: d.base.vrfs["lv-a"].table
        }
    );
    model(&mut o, &ops);
    let rest = diff(Some(&d), &o, None).unwrap().ops;
    assert!(
        !rest.iter().any(|op| op.to_string().contains("lp-pa")),
        "{rest:#?}"
    );
    // The other way round: a reconcile found the veth first and set it up.
    let o = converged(&d);
    assert_eq!(attach(&pod, &o, &o.tc).unwrap(), Diff::default());
}

#[test]
fn a_pod_veth_down_or_out_of_its_vrf_is_put_back() {
    let d = desired(false);
    let mut o = converged(&d);
    o.links.get_mut("lp-pa").unwrap().up = false;
    assert_eq!(
        diff(Some(&d), &o, None).unwrap().ops,
        vec![Op::LinkUp {
            name: "lp-pa".into()
        }]
    );
    o.links.get_mut("lp-pa").unwrap().master = None;
    let ops = diff(Some(&d), &o, None).unwrap().ops;
    assert!(matches!(&ops[0], Op::SetMaster { link, .. } if link == "lp-pa"));
    assert!(!ops.iter().any(|op| matches!(op, Op::LinkUp { .. })));
}

#[test]
fn drift_sees_only_what_notifications_change() {
    let d = desired(true);
    let mut o = converged(&d);
    assert_eq!(drift(&d, &o).unwrap(), vec![]);
    // The nft table, sysctls and tunsrc are no notification's business.
    o.nft = NftState::Absent;
    o.sysctls.clear();
    o.tunsrc = None;
    assert_eq!(drift(&d, &o).unwrap(), vec![]);
    assert!(!diff(Some(&d), &o, None).unwrap().ops.is_empty());
    let (key, _) = d.routes().next().unwrap();
    o.routes.remove(key);
    assert!(matches!(
        drift(&d, &o).unwrap().as_slice(),
        [Op::PutRoute { key: k, .. }] if k == key
    ));
}

#[test]
fn the_locators_rule_reads_back_as_written_and_a_new_span_comes_before_the_old_goes() {
    use crate::dataplane::{msg, observe::classify_rule};
    use netlink_packet_route::rule::RuleAttribute;
    let d = desired(true);
    let rule = *d
        .base
        .rules
        .iter()
        .find(|r| matches!(r.action, RuleAction::ToPrefix { .. }))
        .expect("a plan with locators has the locators' rule");
    assert_eq!(
        classify_rule(msg::rule(&rule)).and_then(|o| o.rule),
        Some(rule)
    );
    // A destination length without its address is no rule of Lace's form (deleted as stray).
    let mut headless = msg::rule(&rule);
    headless
        .attributes
        .retain(|a| !matches!(a, RuleAttribute::Destination(_)));
    assert_eq!(classify_rule(headless).and_then(|o| o.rule), None);

    // A node whose locator lies outside the span widens it: the new rule is added before the
    // old one goes, so encapsulated packets always find the main table.
    let o = converged(&d);
    let mut wider = d.clone();
    let RuleAction::ToPrefix { dst, table } = rule.action else {
        unreachable!()
    };
    let base = std::sync::Arc::make_mut(&mut wider.base);
    base.rules.remove(&rule);
    let widened = Rule {
        action: RuleAction::ToPrefix {
            dst: dst.supernet().unwrap(),
            table,
        },
        ..rule
    };
    base.rules.insert(widened);
    let ops = diff(Some(&wider), &o, None).unwrap().ops;
    let added = ops.iter().position(|op| *op == Op::AddRule(widened));
    let deleted = ops
        .iter()
        .position(|op| matches!(op, Op::DelRule(r) if r.rule == Some(rule)));
    assert!(
        matches!((added, deleted), (Some(a), Some(d)) if a < d),
        "{ops:#?}"
    );
}

#[test]
fn the_host_access_rule_reads_back_as_written_and_another_iif_is_no_form_of_laces() {
    use crate::dataplane::{msg, observe::classify_rule};
    use netlink_packet_route::rule::RuleAttribute;
    let rule = Rule {
        priority: crate::plan::RULE_PRIORITY_HOST_ACCESS,
        family: crate::plan::Family::V6,
        action: RuleAction::FromHost {
            table: crate::plan::HOST_ACCESS_TABLE,
        },
    };
    let written = msg::rule(&rule);
    assert!(written
        .attributes
        .iter()
        .any(|a| matches!(a, RuleAttribute::Iifname(n) if n == "lo")));
    assert_eq!(
        classify_rule(written.clone()).and_then(|o| o.rule),
        Some(rule)
    );
    let mut other = written;
    for a in &mut other.attributes {
        if let RuleAttribute::Iifname(n) = a {
            *n = "eth0".into();
        }
    }
    let observed = classify_rule(other).expect("in Lace's band");
    assert_eq!(observed.rule, None, "deleted as a stray rule in the band");
}

#[test]
fn fib_sync_mem_is_raised_before_the_routes_where_the_kernel_has_it_and_never_lowered() {
    use crate::plan::FIB_SYNC_MEM_BYTES;
    let d = desired(true);
    let want = FIB_SYNC_MEM_BYTES.to_string();
    assert_eq!(d.base.sysctls.get(FIB_SYNC_MEM), Some(&want));
    // `have` as read from a node that holds everything else of the plan already.
    let ops_with = |have: Option<&str>| {
        let mut o = bare_host();
        o.sysctls
            .insert(FIB_SYNC_MEM.to_string(), Some("524288".to_string()));
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        let raise = first(
            &ops,
            |op| matches!(op, Op::Sysctl { key, .. } if key == FIB_SYNC_MEM),
        );
        let route = first(&ops, |op| matches!(op, Op::PutRoute { .. }));
        assert!(raise.unwrap() < route.unwrap(), "raised before the routes");
        model(&mut o, &ops);
        o.sysctls
            .insert(FIB_SYNC_MEM.to_string(), have.map(str::to_string));
        diff(Some(&d), &o, None).unwrap().ops
    };
    let raised = vec![Op::Sysctl {
        key: FIB_SYNC_MEM.to_string(),
        value: want.clone(),
    }];
    // The kernel's default, or something unreadable as a number: raised, nothing else.
    assert_eq!(ops_with(Some("524288")), raised);
    assert_eq!(ops_with(Some("lots")), raised);
    // Already there, or larger (an administrator's): left as it is.
    assert_eq!(ops_with(Some(&want)), vec![]);
    assert_eq!(
        ops_with(Some(&format!("{}\n", FIB_SYNC_MEM_BYTES + 4096))),
        vec![]
    );
    // Absent: a namespace other than the initial one, which has none to raise.
    assert_eq!(ops_with(None), vec![]);
}

#[test]
fn a_remote_blocks_route_is_rewritten_when_its_segment_or_device_differs() {
    let d = desired(true);
    let o = converged(&d);
    assert_eq!(diff(Some(&d), &o, None).unwrap().ops, vec![]);
    let (key, written) = o
        .routes
        .iter()
        .find(|(k, _)| matches!(d.route(k), Some(Nexthop::Seg6Encap { .. })))
        .map(|(k, nh)| (*k, nh.clone()))
        .expect("a plan with remote blocks");
    let KernelNexthop::Seg6Encap { segs, dev } = written.clone() else {
        panic!("{written:?}")
    };
    let edits = [
        KernelNexthop::Seg6Encap {
            segs: Ipv6Addr::from(u128::from(segs) + 1),
            dev: dev.clone(),
        },
        KernelNexthop::Seg6Encap {
            segs,
            dev: EGRESS.into(),
        },
        KernelNexthop::Dev(dev),
    ];
    for edited in edits {
        let mut o = o.clone();
        o.routes.insert(key, edited.clone());
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        assert_eq!(
            ops,
            vec![Op::PutRoute {
                key,
                nh: written.clone()
            }],
            "{edited:?}"
        );
    }
}

#[test]
fn route_ops_of_a_node_cut_at_any_table_are_the_whole_walks() {
    let d = desired(true);
    let mut o = converged(&d);
    // Something to do in every table: a route missing, one changed, one unplanned.
    let keys: Vec<RouteKey> = o.routes.keys().copied().collect();
    for (i, k) in keys.iter().enumerate() {
        match i % 3 {
            0 => {
                o.routes.remove(k);
            }
            1 => o.routes.insert(*k, KernelNexthop::Dev("edited".into())),
            _ => {}
        }
    }
    for k in &keys {
        let extra = RouteKey::new(k.table, "198.51.100.0/24".parse().unwrap());
        o.routes.insert(extra, KernelNexthop::Unreachable);
    }
    let fresh = BTreeSet::new();
    let walk = RouteWalk::new(&d.base, &d.base.vrfs, &o, &fresh);
    let whole = walk.ops(&d, Tables::ALL).unwrap();
    assert!(whole.ops.len() > 10, "{:?}", whole.ops);
    let mut cuts: Vec<u32> = keys.iter().map(|k| k.table).collect();
    cuts.extend([0, u32::MAX]);
    for cut in cuts {
        let mut halves = walk.ops(&d, Tables::below(cut)).unwrap();
        let second = walk.ops(&d, Tables::from(cut)).unwrap();
        halves.ops.extend(second.ops);
        halves.skipped.extend(second.skipped);
        assert_eq!(halves.ops, whole.ops, "cut at table {cut}");
        assert_eq!(halves.skipped, whole.skipped, "cut at table {cut}");
    }
    let on_two_threads = walk.ops_of_all(&d, 0).unwrap();
    assert_eq!(on_two_threads.ops, whole.ops);
    assert_eq!(on_two_threads.skipped, whole.skipped);
}
