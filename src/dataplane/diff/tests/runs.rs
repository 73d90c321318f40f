//! The plan's routes in runs, as the diff walks them: whatever the base's, the served
//! tables' pod-reach and the pods' routes, the runs hold what a map of them holds (a later
//! source's route replacing an earlier's under its key), in key order, for any cut of the
//! tables; and a diff walked by runs against a kernel that holds part of them writes what
//! makes it hold the plan.

use std::ops::Bound;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::plan::{PlannedRun, RouteTable};

fn key(i: u32) -> RouteKey {
    RouteKey::new(
        1000 + i % 4,
        format!("10.{}.0.0/24", i / 4).parse().unwrap(),
    )
}

fn dev(d: u32) -> Nexthop {
    Nexthop::Dev(format!("lp-{d}"))
}

fn routes(of: &[(u32, u32)]) -> impl Iterator<Item = (RouteKey, Nexthop)> + '_ {
    of.iter().map(|&(k, d)| (key(k), dev(d)))
}

proptest! {
    #[test]
    fn a_plans_runs_hold_its_routes_in_order_the_pods_over_the_reach_over_the_base(
        base in proptest::collection::vec((0..60u32, 0..100u32), 0..60),
        reach in proptest::collection::vec((0..60u32, 0..100u32), 0..60),
        pods in proptest::collection::vec((0..60u32, 0..100u32), 0..10),
        served in proptest::collection::btree_set(1000..1004u32, 0..4),
        cut in 1000..1005u32,
    ) {
        let mut d = desired(false);
        let b = Arc::make_mut(&mut d.base);
        b.routes = routes(&base).collect::<RouteTable>();
        b.pod_reach = routes(&reach).collect::<RouteTable>();
        d.served_tables = served.clone();
        d.pod_routes = routes(&pods).collect();
        let mut model: BTreeMap<RouteKey, Nexthop> = routes(&base).collect();
        model.extend(routes(&reach).filter(|(k, _)| served.contains(&k.table)));
        model.extend(routes(&pods));
        let first = RouteKey::first_of(cut);
        for (tables, range) in [
            (Tables::ALL, (Bound::Unbounded, Bound::Unbounded)),
            (Tables::below(cut), (Bound::Unbounded, Bound::Excluded(first))),
            (Tables::from(cut), (Bound::Included(first), Bound::Unbounded)),
        ] {
            let mut walked = Vec::new();
            for run in d.route_runs_of_tables(tables) {
                match run {
                    PlannedRun::Routes(routes) => {
                        prop_assert!(!routes.is_empty());
                        walked.extend(routes.iter().map(|(k, nh)| (*k, nh.clone())));
                    }
                    PlannedRun::One(k, nh) => walked.push((*k, nh.clone())),
                }
            }
            let expected: Vec<_> = model.range(range).map(|(k, nh)| (*k, nh.clone())).collect();
            prop_assert_eq!(&walked, &expected, "{:?}", tables);
            prop_assert!(d.routes_of_tables(tables).map(|(k, nh)| (*k, nh.clone())).eq(expected));
        }
    }

    #[test]
    fn a_diff_walked_by_runs_makes_a_kernel_holding_part_of_the_plan_hold_all_of_it(
        base in proptest::collection::vec((0..60u32, 0..3u32), 0..60),
        reach in proptest::collection::vec((0..60u32, 0..3u32), 0..60),
        kernel in proptest::collection::vec((0..60u32, 0..3u32), 0..60),
    ) {
        let mut d = desired(false);
        let b = Arc::make_mut(&mut d.base);
        b.routes = routes(&base).collect::<RouteTable>();
        b.pod_reach = routes(&reach).collect::<RouteTable>();
        d.served_tables = (1000..1004).collect();
        d.pod_routes = BTreeMap::new();
        let mut o = converged(&d);
        let planned: BTreeMap<RouteKey, KernelNexthop> = o.routes.iter().map(|(k, nh)| (*k, nh.clone())).collect();
        // The kernel's routes of those tables: some planned, some under another device, some
        // not planned.
        o.routes.retain(|k, _| k.table < 1000 || k.table > 1003);
        for (k, nh) in routes(&kernel) {
            let Nexthop::Dev(dev) = nh else { unreachable!() };
            o.routes.insert(k, KernelNexthop::Dev(dev.into()));
        }
        let ops = diff(Some(&d), &o, None).unwrap().ops;
        model(&mut o, &ops);
        let now: BTreeMap<RouteKey, KernelNexthop> = o.routes.iter().map(|(k, nh)| (*k, nh.clone())).collect();
        prop_assert_eq!(now, planned);
    }
}
