//! The VRFs' ingress devices (`li-…`, see [`crate::plan::ingress`]): a dummy enslaved to the
//! VRF of each Network that receives NodePort traffic, the device of the seg6 encap routes
//! towards remote backends of that traffic.

use std::collections::{BTreeMap, BTreeSet};

use crate::dataplane::observed::ObservedNode;
use crate::dataplane::op::Op;
use crate::plan::Vrf;

/// The planned VRFs' ingress devices: created (dummy) if missing or of another kind, enslaved
/// to their VRF and up (again after the VRF is re-created); the unplanned ones deleted. Adds
/// the names of those it creates to `fresh`.
pub(super) fn ops<'a>(
    vrfs: &'a BTreeMap<String, Vrf>,
    observed: &ObservedNode,
    fresh: &mut BTreeSet<&'a str>,
    ops: &mut Vec<Op>,
) {
    let mut planned = BTreeSet::new();
    for (vrf, v) in vrfs {
        let Some(dev) = &v.ingress else { continue };
        planned.insert(dev.as_str());
        let master = observed.links.get(vrf).map(|l| l.index);
        match observed.links.get(dev) {
            Some(l) if l.dummy => {
                if !l.up || l.master != master || fresh.contains(vrf.as_str()) {
                    ops.push(Op::SetMaster {
                        link: dev.clone(),
                        master: vrf.clone(),
                    });
                }
                continue;
            }
            Some(_) => ops.push(Op::ReplaceLink { name: dev.clone() }),
            None => {}
        }
        fresh.insert(dev);
        ops.push(Op::AddDummy { name: dev.clone() });
        ops.push(Op::SetMaster {
            link: dev.clone(),
            master: vrf.clone(),
        });
    }
    for (name, _) in observed.ingress_links() {
        if !planned.contains(name.as_str()) {
            ops.push(Op::DelLink { name: name.clone() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ServiceBindingPolicySpec, ServiceRef, ServiceRoutingPolicySpec};
    use crate::dataplane::diff::diff;
    use crate::dataplane::fixtures::{bare_host, link, model, state};
    use crate::dataplane::observed::KernelNexthop;
    use crate::plan::plan;
    use crate::state::{ClusterState, Endpoints, ObjectKey, Service, ServicePort};

    fn vrfs(ingress: bool) -> BTreeMap<String, Vrf> {
        [(
            "lv-a".to_string(),
            Vrf {
                network: "a".into(),
                table: 1_000_001,
                function: 1,
                sid: "2001:db8:100::1:1:0".parse().unwrap(),
                ingress: ingress.then(|| "li-a".to_string()),
            },
        )]
        .into()
    }

    fn run(v: &BTreeMap<String, Vrf>, o: &ObservedNode) -> Vec<Op> {
        let mut fresh = BTreeSet::new();
        let mut out = Vec::new();
        ops(v, o, &mut fresh, &mut out);
        out
    }

    #[test]
    fn created_enslaved_then_left_alone_and_deleted_when_unplanned() {
        let mut o = bare_host();
        model(
            &mut o,
            &[Op::AddVrf {
                name: "lv-a".into(),
                table: 1_000_001,
            }],
        );
        let first = run(&vrfs(true), &o);
        assert_eq!(
            first,
            vec![
                Op::AddDummy {
                    name: "li-a".into()
                },
                Op::SetMaster {
                    link: "li-a".into(),
                    master: "lv-a".into()
                },
            ]
        );
        model(&mut o, &first);
        assert!(o.links["li-a"].up && o.links["li-a"].dummy);
        assert_eq!(run(&vrfs(true), &o), vec![], "applied twice: nothing");
        // Released by a re-created VRF (another index): enslaved again.
        o.links.get_mut("li-a").unwrap().master = Some(9999);
        assert_eq!(
            run(&vrfs(true), &o),
            vec![Op::SetMaster {
                link: "li-a".into(),
                master: "lv-a".into()
            }]
        );
        assert_eq!(
            run(&vrfs(false), &o),
            vec![Op::DelLink {
                name: "li-a".into()
            }]
        );
    }

    #[test]
    fn a_link_of_that_name_of_another_kind_is_replaced() {
        let mut o = bare_host();
        let index = o.links.len() as u32 + 50;
        o.links.insert("li-a".into(), link(index));
        let got = run(&vrfs(true), &o);
        assert_eq!(
            got[0],
            Op::ReplaceLink {
                name: "li-a".into()
            }
        );
        assert_eq!(
            got[1],
            Op::AddDummy {
                name: "li-a".into()
            }
        );
    }

    /// `state(false)` with Service `ns/web` (node port 30080) bound to `a`, its backend on
    /// `n2`, granted from the `internet`.
    fn granted() -> ClusterState {
        let mut s = state(false);
        let key = ObjectKey::new("ns", "web");
        s.services.insert(
            key.clone(),
            Service {
                cluster_ips: vec!["10.96.0.80".parse().unwrap()],
                ports: vec![ServicePort {
                    protocol: "TCP".into(),
                    port: 80,
                    node_port: Some(30080),
                }],
                ..Default::default()
            },
        );
        s.endpoints.insert(
            key,
            Endpoints {
                addresses: vec!["10.1.2.7".parse().unwrap()],
                ports: vec![ServicePort {
                    protocol: "TCP".into(),
                    port: 8080,
                    node_port: None,
                }],
            },
        );
        let web = vec![ServiceRef {
            namespace: "ns".into(),
            name: "web".into(),
        }];
        s.service_bindings.insert(
            "web".into(),
            ServiceBindingPolicySpec {
                network: "a".into(),
                services: web.clone(),
                ..Default::default()
            },
        );
        s.service_routes.insert(
            "internet-to-web".into(),
            ServiceRoutingPolicySpec {
                from: "internet".into(),
                to: "a".into(),
                services: web,
                ..Default::default()
            },
        );
        s
    }

    #[test]
    fn the_full_diff_creates_it_before_the_routes_through_it_and_applies_once() {
        let d = plan("n1", &granted(), &[]).unwrap();
        let mut o = bare_host();
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        let at = |f: &dyn Fn(&Op) -> bool| ops.iter().position(f).unwrap();
        let created = at(&|o| matches!(o, Op::AddDummy { name } if name == "li-a"));
        let enslaved = at(&|o| matches!(o, Op::SetMaster { link, .. } if link == "li-a"));
        let routed = at(&|o| {
            matches!(o, Op::PutRoute { nh: KernelNexthop::Seg6Encap { dev, .. }, key }
                if &**dev == "li-a" && key.dst == "10.1.2.7/32".parse::<ipnet::IpNet>().unwrap())
        });
        assert!(created < enslaved && enslaved < routed, "{ops:#?}");
        model(&mut o, &ops);
        assert_eq!(
            diff(Some(&d), &o, None).unwrap().ops,
            vec![],
            "applied twice"
        );
        // The grant gone: the device goes too.
        let d = plan("n1", &state(false), &[]).unwrap();
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        assert!(ops.contains(&Op::DelLink {
            name: "li-a".into()
        }));
    }
}
