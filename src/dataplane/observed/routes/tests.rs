//! `KernelRoutes` against a `BTreeMap` holding the same routes: after any dump and any
//! sequence of replaces, additions, removals and retains, both hold the same routes, look up
//! and walk alike, and the merge of the map into the list loses nothing.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::plan::Tables;

fn key(i: u32) -> RouteKey {
    // Few tables and destinations, both families: keys repeat across a test's steps.
    let table = 1000 + i % 3;
    let dst = match i % 2 {
        0 => format!("10.{}.0.0/24", i % 64),
        _ => format!("fd00:{:x}::/64", i % 64),
    };
    RouteKey::new(table, dst.parse().unwrap())
}

fn dev(name: u32) -> KernelNexthop {
    KernelNexthop::Dev(format!("lp-{name}").into())
}

#[derive(Clone, Debug)]
enum Step {
    Insert(u32, u32),
    Remove(u32),
    /// Keeps the routes whose device's number is not a multiple of this.
    RetainNotMultipleOf(u32),
    /// Renames every device to its number plus this.
    Rename(u32),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..200u32, 0..1000u32).prop_map(|(k, d)| Step::Insert(k, d)),
        3 => (0..200u32).prop_map(Step::Remove),
        1 => (2..7u32).prop_map(Step::RetainNotMultipleOf),
        1 => (1..5u32).prop_map(Step::Rename),
    ]
}

fn number(nh: &KernelNexthop) -> u32 {
    nh.dev()
        .and_then(|d| d.strip_prefix("lp-")?.parse().ok())
        .unwrap()
}

fn apply(step: &Step, routes: &mut KernelRoutes, model: &mut BTreeMap<RouteKey, KernelNexthop>) {
    match *step {
        Step::Insert(k, d) => {
            routes.insert(key(k), dev(d));
            model.insert(key(k), dev(d));
        }
        Step::Remove(k) => {
            let had = routes.remove(&key(k));
            assert_eq!(had, model.remove(&key(k)).is_some(), "{step:?}");
        }
        Step::RetainNotMultipleOf(m) => {
            routes.retain(|_, nh| !number(nh).is_multiple_of(m));
            model.retain(|_, nh| !number(nh).is_multiple_of(m));
        }
        Step::Rename(by) => {
            for nh in routes.values_mut() {
                *nh = dev(number(nh) + by);
            }
            for nh in model.values_mut() {
                *nh = dev(number(nh) + by);
            }
        }
    }
}

fn assert_same(routes: &KernelRoutes, model: &BTreeMap<RouteKey, KernelNexthop>) {
    assert_eq!(routes.len(), model.len());
    assert_eq!(routes.is_empty(), model.is_empty());
    assert!(routes.iter().eq(model.iter()), "{routes:?} vs {model:?}");
    for i in 0..200 {
        let k = key(i);
        assert_eq!(routes.get(&k), model.get(&k), "get {k:?}");
        assert!(
            routes.range_from(&k).eq(model.range(k..)),
            "range from {k:?}"
        );
    }
    for cut in [0, 1000, 1001, 1002, 1003] {
        let first = RouteKey::first_of(cut);
        assert!(
            routes
                .of_tables(Tables::below(cut))
                .eq(model.range(..first)),
            "below table {cut}"
        );
        assert!(
            routes.of_tables(Tables::from(cut)).eq(model.range(first..)),
            "from table {cut}"
        );
    }
    assert!(routes.of_tables(Tables::ALL).eq(model.iter()));
    let rebuilt: KernelRoutes = model.clone().into_iter().collect();
    assert_eq!(*routes, rebuilt, "equal to the same routes dumped at once");
    assert!(routes.clone().into_iter().eq(model.clone()));
}

proptest! {
    #[test]
    fn kernel_routes_hold_what_a_map_holds_after_any_dump_and_changes(
        dumped in proptest::collection::vec((0..200u32, 0..1000u32), 0..120),
        steps in proptest::collection::vec(step(), 0..60),
    ) {
        let dump: Vec<(RouteKey, KernelNexthop)> =
            dumped.iter().map(|&(k, d)| (key(k), dev(d))).collect();
        // A map's collect keeps the later of two routes with one key, as a dump's must.
        let mut model: BTreeMap<RouteKey, KernelNexthop> = dump.iter().cloned().collect();
        let mut routes = KernelRoutes::from_dump(dump);
        assert_same(&routes, &model);
        for s in &steps {
            apply(s, &mut routes, &mut model);
            assert_same(&routes, &model);
        }
    }
}

proptest! {
    /// As the kernel sends a dump: runs of one table each, the tables in any order, a table's
    /// routes split across runs (at a datagram the other thread decoded), keys repeated.
    #[test]
    fn a_dump_in_runs_of_tables_holds_what_a_map_of_its_routes_in_order_holds(
        dumped in proptest::collection::vec((0..200u32, 0..1000u32, any::<bool>()), 0..150),
    ) {
        let mut runs: Vec<TableRun> = Vec::new();
        let mut model = BTreeMap::new();
        for &(k, d, split) in &dumped {
            let route = (key(k), dev(d));
            model.insert(route.0, route.1.clone());
            match runs.last_mut() {
                Some(run) if run.table == route.0.table && !split => run.routes.push(route),
                _ => runs.push(TableRun::new(route)),
            }
        }
        let routes = KernelRoutes::from_table_runs(runs);
        assert_same(&routes, &model);
        assert_lists_in_key_order(&routes);
    }
}

fn assert_lists_in_key_order(routes: &KernelRoutes) {
    for list in &routes.dumped {
        assert!(
            list.iter().all(|(k, _)| k.table == list[0].0.table),
            "one table's routes: {list:?}"
        );
    }
    for lists in routes.dumped.windows(2) {
        assert!(
            lists[0].last().unwrap().0 < lists[1][0].0,
            "each list after the one before: {:?}",
            routes.dumped
        );
    }
}

proptest! {
    /// As a node's dump comes: each table's routes in key order, the tables in any order, cut
    /// into runs anywhere (at datagrams the other thread decoded). Each run stays a list of its
    /// own, nothing copied, and lookups, walks and any changes after agree with a map.
    #[test]
    fn a_dump_in_key_order_keeps_its_runs_as_lists_and_holds_what_a_map_holds(
        dumped in proptest::collection::btree_map(0..200u32, 0..1000u32, 0..120),
        rotate in 0..3u32,
        cuts in proptest::collection::vec(prop_oneof![6 => Just(false), 1 => Just(true)], 120),
        steps in proptest::collection::vec(step(), 0..40),
    ) {
        let mut model: BTreeMap<RouteKey, KernelNexthop> =
            dumped.iter().map(|(&k, &d)| (key(k), dev(d))).collect();
        let mut sent: Vec<_> = model.iter().map(|(k, nh)| (*k, nh.clone())).collect();
        // Stable: each table's routes stay in key order.
        sent.sort_by_key(|(k, _)| (k.table + rotate) % 3);
        let mut runs: Vec<TableRun> = Vec::new();
        for (route, &cut) in sent.into_iter().zip(&cuts) {
            match runs.last_mut() {
                Some(run) if run.table == route.0.table && !cut => run.routes.push(route),
                _ => runs.push(TableRun::new(route)),
            }
        }
        let sent_runs = runs.len();
        let mut routes = KernelRoutes::from_table_runs(runs);
        prop_assert_eq!(routes.dumped.len(), sent_runs, "every run kept as a list");
        assert_lists_in_key_order(&routes);
        assert_same(&routes, &model);
        for s in &steps {
            apply(s, &mut routes, &mut model);
            assert_same(&routes, &model);
        }
    }
}

proptest! {
    /// Two dumps (of one family each, or of any keys), joined: `other`'s route wins a key
    /// both hold, and routes changed since either dump are not lost.
    #[test]
    fn two_dumps_joined_hold_what_a_map_of_both_in_order_holds(
        first in proptest::collection::vec((0..200u32, 0..1000u32), 0..80),
        second in proptest::collection::vec((0..200u32, 0..1000u32), 0..80),
        inserted in proptest::option::of((0..200u32, 0..1000u32)),
        by_family in any::<bool>(),
    ) {
        // `key` gives even numbers IPv4 destinations, odd ones IPv6.
        let family = |k: u32, odd: u32| if by_family { (k & !1) | odd } else { k };
        let dump = |routes: &[(u32, u32)], odd| -> Vec<(RouteKey, KernelNexthop)> {
            routes.iter().map(|&(k, d)| (key(family(k, odd)), dev(d))).collect()
        };
        let mut model: BTreeMap<RouteKey, KernelNexthop> = dump(&first, 0).into_iter().collect();
        let mut routes = KernelRoutes::from_dump(dump(&first, 0));
        if let Some((k, d)) = inserted {
            routes.insert(key(k), dev(d));
            model.insert(key(k), dev(d));
        }
        model.extend(dump(&second, 1));
        let (lists, other) = (routes.dumped.len(), KernelRoutes::from_dump(dump(&second, 1)));
        let other_lists = other.dumped.len();
        let joined = routes.join(other);
        assert_same(&joined, &model);
        assert_lists_in_key_order(&joined);
        if by_family && inserted.is_none() {
            prop_assert_eq!(joined.dumped.len(), lists + other_lists, "the families' lists kept");
        }
    }
}

proptest! {
    /// A diff's walk: from any point of any routes (dumped, then changed), `skip_same` passes
    /// over exactly the planned routes that a walk route by route finds next under the same
    /// key with a route `same` accepts, and leaves the walk where that one would. The planned
    /// routes are the kernel's from that point, a few dropped or given another device, and
    /// other keys among them: routes removed since the dump as it read them, and any.
    #[test]
    fn skip_same_passes_over_what_a_walk_route_by_route_would_match(
        dumped in proptest::collection::vec((0..200u32, 0..1000u32), 0..120),
        steps in proptest::collection::vec(step(), 0..30),
        from in 0..130usize,
        edits in proptest::collection::vec(prop_oneof![8 => Just(0u8), 1 => Just(1), 1 => Just(2)], 0..130),
        others in proptest::collection::vec((0..200u32, 0..1000u32), 0..10),
    ) {
        let dump: Vec<(RouteKey, KernelNexthop)> =
            dumped.iter().map(|&(k, d)| (key(k), dev(d))).collect();
        let mut model: BTreeMap<RouteKey, KernelNexthop> = dump.iter().cloned().collect();
        let mut routes = KernelRoutes::from_dump(dump);
        let mut removed = model.clone();
        for s in &steps {
            apply(s, &mut routes, &mut model);
        }
        removed.retain(|k, _| !model.contains_key(k));
        let after = model.keys().nth(from.wrapping_sub(1)).copied();
        let later = |k: &RouteKey| after.is_none_or(|a| *k > a) && (from == 0 || after.is_some());
        let mut planned: BTreeMap<RouteKey, u32> = others
            .iter()
            .map(|&(k, d)| (key(k), d))
            .filter(|(k, _)| later(k))
            .collect();
        // A removed route planned as the dump read it.
        planned.extend(removed.iter().filter(|(k, _)| later(k)).map(|(k, nh)| (*k, number(nh))));
        for ((k, nh), edit) in model.iter().skip(from).zip(edits.iter().chain(std::iter::repeat(&0))) {
            match edit {
                0 => planned.insert(*k, number(nh)),
                1 => planned.insert(*k, number(nh) + 1),
                _ => None,
            };
        }
        let planned: Vec<(RouteKey, u32)> = planned.into_iter().collect();
        let same = |p: &u32, nh: &KernelNexthop| *p == number(nh);
        let at = |n: usize| {
            let mut walk = routes.iter();
            walk.by_ref().take(n).for_each(drop);
            walk
        };
        let (mut walked, mut skipping) = (at(from), at(from));
        let mut expected = 0;
        while let Some((k, p)) = planned.get(expected) {
            match walked.peek() {
                Some((have, nh)) if have == k && same(p, nh) => {
                    walked.next();
                    expected += 1;
                }
                _ => break,
            }
        }
        prop_assert_eq!(skipping.skip_same(&planned, same), expected, "{:?}", planned);
        prop_assert!(skipping.eq(walked));
    }
}

#[test]
fn many_additions_and_removals_merge_the_map_into_the_list_and_lose_nothing() {
    let keys = |n: u32| {
        (0..n).map(|i| {
            RouteKey::new(
                1000 + i % 7,
                format!("10.{}.{}.0/24", i / 256, i % 256).parse().unwrap(),
            )
        })
    };
    let mut model: BTreeMap<RouteKey, KernelNexthop> = BTreeMap::new();
    let dump: Vec<_> = keys(3000).step_by(3).map(|k| (k, dev(1))).collect();
    model.extend(dump.iter().cloned());
    let mut routes = KernelRoutes::from_dump(dump);
    for (i, k) in keys(3000).enumerate() {
        match i % 4 {
            3 => {
                assert_eq!(routes.remove(&k), model.remove(&k).is_some());
            }
            _ => {
                routes.insert(k, dev(i as u32));
                model.insert(k, dev(i as u32));
            }
        }
    }
    assert!(
        routes.changed.len() < MERGE_MIN,
        "{} changes were merged into the list as they came",
        routes.changed.len()
    );
    assert!(routes.iter().eq(model.iter()));
    assert_eq!(routes.len(), model.len());
}

#[test]
fn a_replace_of_a_dumped_route_is_written_in_place() {
    let mut routes = KernelRoutes::from_dump(vec![(key(0), dev(1)), (key(1), dev(2))]);
    routes.insert(key(0), dev(3));
    assert!(routes.changed.is_empty());
    assert_eq!(routes.get(&key(0)), Some(&dev(3)));
    assert_eq!(routes[&key(1)], dev(2));
}
