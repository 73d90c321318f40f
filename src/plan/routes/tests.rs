//! The route builder's precedence and the sorted table it yields.

use super::*;

fn key(table: u32, dst: &str) -> RouteKey {
    RouteKey::new(table, dst.parse().unwrap())
}

fn dev(name: &str) -> Nexthop {
    Nexthop::Dev(name.into())
}

#[test]
fn the_highest_precedence_wins_each_key_and_the_table_is_sorted() {
    let mut rb = RouteBuilder::default();
    rb.add(20, "10.0.0.0/24".parse().unwrap(), PREC_REACH, dev("b"));
    rb.add(
        10,
        "10.0.1.0/24".parse().unwrap(),
        PREC_FALLBACK,
        Nexthop::Unreachable,
    );
    rb.add(
        10,
        "10.0.1.0/24".parse().unwrap(),
        PREC_INGRESS,
        dev("ingress"),
    );
    rb.add(10, "10.0.1.0/24".parse().unwrap(), PREC_REACH, dev("reach"));
    rb.add(
        10,
        "10.0.0.0/24".parse().unwrap(),
        PREC_EGRESS,
        Nexthop::Host,
    );
    let built = rb.finish();
    assert!(built.local_pods.is_empty());
    let t = built.always;
    let all: Vec<(RouteKey, Nexthop)> = t.iter().map(|(k, nh)| (*k, nh.clone())).collect();
    assert_eq!(
        all,
        vec![
            (key(10, "10.0.0.0/24"), Nexthop::Host),
            (key(10, "10.0.1.0/24"), dev("ingress")),
            (key(20, "10.0.0.0/24"), dev("b")),
        ]
    );
    assert_eq!(t.len(), 3);
    assert_eq!(t.get(&key(10, "10.0.1.0/24")), Some(&dev("ingress")));
    assert_eq!(t.get(&key(20, "10.0.0.0/24")), Some(&dev("b")));
    assert_eq!(
        t.get(&key(20, "10.0.1.0/24")),
        None,
        "no route of another table"
    );
    assert_eq!(
        t.get(&key(10, "10.0.1.0/25")),
        None,
        "no route of another length"
    );
}

/// A route for local pods wins its key only while the Network has a pod here: the best
/// always-installed route under the same key stays in the always table for the other times.
#[test]
fn a_route_for_local_pods_keeps_the_best_always_installed_one_under_its_key() {
    let k = "10.0.1.0/24".parse().unwrap();
    let mut rb = RouteBuilder::default();
    rb.add(10, k, PREC_FALLBACK, Nexthop::Unreachable);
    rb.add_for_local_pods(10, k, PREC_REACH, dev("block"));
    rb.add(10, k, PREC_EGRESS, Nexthop::Host);
    rb.add_for_local_pods(10, k, PREC_FALLBACK, dev("lower"));
    // Above every route for local pods: the only route of its key.
    let over = "10.0.2.0/24".parse().unwrap();
    rb.add_for_local_pods(10, over, PREC_REACH, dev("block"));
    rb.add(10, over, PREC_INGRESS, dev("ingress"));
    // Only for local pods.
    rb.add_for_local_pods(11, k, PREC_REACH, dev("only"));
    let built = rb.finish();
    let all = |t: &RouteTable| -> Vec<(RouteKey, Nexthop)> {
        t.iter().map(|(k, nh)| (*k, nh.clone())).collect()
    };
    assert_eq!(
        all(&built.always),
        vec![
            (key(10, "10.0.1.0/24"), Nexthop::Host),
            (key(10, "10.0.2.0/24"), dev("ingress")),
        ]
    );
    assert_eq!(
        all(&built.local_pods),
        vec![
            (key(10, "10.0.1.0/24"), dev("block")),
            (key(11, "10.0.1.0/24"), dev("only")),
        ]
    );
}

#[test]
fn in_tables_walks_only_the_runs_of_those_tables() {
    let t: RouteTable = [
        (key(1, "10.0.0.0/8"), dev("a")),
        (key(2, "10.0.0.0/8"), dev("b")),
        (key(2, "10.1.0.0/16"), dev("c")),
        (key(3, "10.0.0.0/8"), dev("d")),
        (key(5, "10.0.0.0/8"), dev("e")),
    ]
    .into_iter()
    .collect();
    let walk = |tables: &[u32]| -> Vec<String> {
        let tables: BTreeSet<u32> = tables.iter().copied().collect();
        t.in_tables(&tables, crate::plan::Tables::ALL)
            .map(|(_, nh)| nh.to_string())
            .collect()
    };
    assert_eq!(walk(&[2, 5]), ["dev b", "dev c", "dev e"]);
    assert_eq!(walk(&[0, 4, 6]), Vec::<String>::new());
    assert_eq!(walk(&[1, 2, 3, 5]).len(), 5);
    let all: BTreeSet<u32> = [1, 2, 3, 5].into();
    let part = |tables: Tables| -> Vec<String> {
        t.in_tables(&all, tables)
            .map(|(_, nh)| nh.to_string())
            .collect()
    };
    assert_eq!(part(Tables::below(3)), ["dev a", "dev b", "dev c"]);
    assert_eq!(part(Tables::from(3)), ["dev d", "dev e"]);
}

#[test]
fn a_walk_cut_at_any_table_yields_every_route_once_in_order() {
    let t: RouteTable = [
        (key(1, "10.0.0.0/8"), dev("a")),
        (key(2, "0.0.0.0/0"), dev("b")),
        (key(2, "fd00::/64"), dev("c")),
        (key(3, "10.0.0.0/8"), dev("d")),
        (key(u32::MAX, "10.0.0.0/8"), dev("e")),
    ]
    .into_iter()
    .collect();
    let names = |routes: &mut dyn Iterator<Item = (&RouteKey, &Nexthop)>| -> Vec<String> {
        routes.map(|(_, nh)| nh.to_string()).collect()
    };
    let every = names(&mut t.iter());
    assert_eq!(names(&mut t.of_tables(Tables::ALL)), every);
    for cut in [0, 1, 2, 3, 4, u32::MAX] {
        let mut halves = names(&mut t.of_tables(Tables::below(cut)));
        let second = names(&mut t.of_tables(Tables::from(cut)));
        assert!(
            t.of_tables(Tables::from(cut)).all(|(k, _)| k.table >= cut),
            "cut at {cut}"
        );
        halves.extend(second);
        assert_eq!(halves, every, "cut at {cut}");
    }
}

#[test]
fn collected_routes_keep_the_last_of_each_key_like_a_map() {
    let t: RouteTable = [
        (key(1, "fd00::/64"), dev("first")),
        (key(1, "10.0.0.0/8"), dev("a")),
        (key(1, "fd00::/64"), dev("second")),
        (key(0, "10.0.0.0/8"), dev("z")),
    ]
    .into_iter()
    .collect();
    let keys: Vec<RouteKey> = t.iter().map(|(k, _)| *k).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    assert_eq!(t.len(), 3);
    assert_eq!(t.get(&key(1, "fd00::/64")), Some(&dev("second")));
    assert_eq!(t.get(&key(0, "10.0.0.0/8")), Some(&dev("z")));
    assert!(RouteTable::default().is_empty());
}

proptest::proptest! {
    /// `RouteKey`'s order is the order of (table, destination, metric) with `IpNet`'s own order
    /// of destinations, which the kernel's routes and the plan's are merged by.
    #[test]
    fn route_keys_order_as_table_then_ipnet_then_metric(
        a in route_key(), b in route_key(),
    ) {
        let reference = |k: &RouteKey| (k.table, k.dst, k.metric);
        proptest::prop_assert_eq!(a.cmp(&b), reference(&a).cmp(&reference(&b)));
        proptest::prop_assert_eq!(a.partial_cmp(&b), Some(a.cmp(&b)));
        proptest::prop_assert_eq!(a == b, a.cmp(&b).is_eq());
    }
}

proptest::proptest! {
    /// `tables` lists the tables of the routes, each once, ascending.
    #[test]
    fn tables_are_the_routes_tables_once_each_ascending(
        keys in proptest::collection::vec(route_key(), 0..40),
    ) {
        let t: RouteTable = keys.iter().map(|k| (*k, dev("a"))).collect();
        let expected: BTreeSet<u32> = keys.iter().map(|k| k.table).collect();
        proptest::prop_assert_eq!(
            t.tables().collect::<Vec<_>>(),
            expected.into_iter().collect::<Vec<_>>()
        );
    }
}

/// Keys drawn from few values, so that ties at each field are common.
fn route_key() -> impl proptest::strategy::Strategy<Value = RouteKey> {
    use proptest::prelude::*;
    let v4 = (
        prop::sample::select(vec![
            0u32,
            1,
            0x0a00_0000,
            0x0a00_0100,
            0x8000_0000,
            u32::MAX,
        ]),
        0u8..=32,
    )
        .prop_map(|(a, p)| IpNet::V4(ipnet::Ipv4Net::new(a.into(), p).unwrap()));
    let v6 = (
        prop::sample::select(vec![0u128, 1, 0xfd00 << 112, 1 << 127, u128::MAX]),
        0u8..=128,
    )
        .prop_map(|(a, p)| IpNet::V6(ipnet::Ipv6Net::new(a.into(), p).unwrap()));
    (0u32..3, prop_oneof![v4, v6], 0u32..3).prop_map(|(table, dst, metric)| RouteKey {
        table,
        dst,
        metric,
    })
}

/// Past [`PARALLEL_SORT`] the routes are sorted on two threads, split by table: the result is
/// still one sorted table whose every key holds its best route.
#[test]
fn a_large_builder_sorted_on_two_threads_is_one_sorted_table_of_the_best_routes() {
    let mut rb = RouteBuilder::default();
    let mut best: std::collections::HashMap<RouteKey, u8> = Default::default();
    // Tables in descending order and destinations repeating, at several precedences.
    for i in 0..(PARALLEL_SORT as u32 + 5000) {
        let table = 1_000_050 - (i % 37);
        let dst =
            IpNet::V4(ipnet::Ipv4Net::new((0x0a00_0000 + (i % 4093) * 256).into(), 24).unwrap());
        let prec = (i % 3) as u8;
        rb.add(table, dst, prec, dev(&format!("d{prec}")));
        let b = best.entry(RouteKey::new(table, dst)).or_default();
        *b = (*b).max(prec);
    }
    let t = rb.finish().always;
    let keys: Vec<RouteKey> = t.iter().map(|(k, _)| *k).collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "sorted, one route per key"
    );
    assert_eq!(keys.len(), best.len());
    for (k, nh) in t.iter() {
        assert_eq!(nh, &dev(&format!("d{}", best[k])), "{k:?}");
    }
}

/// One added route: table, destination, precedence, next hop, for local pods or always.
type Added = (u32, IpNet, u8, Nexthop, bool);

/// The always-installed routes and the routes for local pods, each sorted by key.
type Yield = (Vec<(RouteKey, Nexthop)>, Vec<(RouteKey, Nexthop)>);

/// What the builder must yield for `added`, computed per key from its definition: the best
/// always-installed route (highest precedence, then least next hop) stays always; the best
/// route for local pods wins for local pods if its precedence is above every always one.
fn expected(added: &[Added]) -> Yield {
    use std::collections::BTreeMap;
    let best = |local: bool| -> BTreeMap<RouteKey, (u8, Nexthop)> {
        let mut best: BTreeMap<RouteKey, (u8, Nexthop)> = BTreeMap::new();
        for (table, dst, prec, nh, _) in added.iter().filter(|a| a.4 == local) {
            let e = best
                .entry(RouteKey::new(*table, *dst))
                .or_insert((*prec, nh.clone()));
            if *prec > e.0 || (*prec == e.0 && *nh < e.1) {
                *e = (*prec, nh.clone());
            }
        }
        best
    };
    let (always, local) = (best(false), best(true));
    let local_wins = local
        .iter()
        .filter(|(k, (p, _))| always.get(k).is_none_or(|(a, _)| a < p))
        .map(|(k, (_, nh))| (*k, nh.clone()))
        .collect();
    let always = always.into_iter().map(|(k, (_, nh))| (k, nh)).collect();
    (always, local_wins)
}

fn built(added: &[Added]) -> Yield {
    let mut rb = RouteBuilder::default();
    for (table, dst, prec, nh, local) in added {
        match local {
            true => rb.add_for_local_pods(*table, *dst, *prec, nh.clone()),
            false => rb.add(*table, *dst, *prec, nh.clone()),
        }
    }
    let b = rb.finish();
    let all = |t: &RouteTable| t.iter().map(|(k, nh)| (*k, nh.clone())).collect();
    (all(&b.always), all(&b.local_pods))
}

proptest::proptest! {
    /// In any order of adding (tables in runs or interleaved, repeated, out of order), the
    /// builder yields the best routes per key, sorted.
    #[test]
    fn the_builder_yields_the_best_routes_in_any_order_of_adding(
        added in proptest::collection::vec(added(), 0..200),
    ) {
        proptest::prop_assert_eq!(built(&added), expected(&added));
    }
}

fn added() -> impl proptest::strategy::Strategy<Value = Added> {
    use proptest::prelude::*;
    let dst = (0u32..6, prop::sample::select(vec![24u8, 25])).prop_map(|(i, p)| {
        IpNet::V4(ipnet::Ipv4Net::new((0x0a00_0000 + i * 256).into(), p).unwrap())
    });
    let nh = prop::sample::select(vec!["a", "b", "c"]).prop_map(dev);
    (0u32..4, dst, 0u8..4, nh, any::<bool>())
}

/// Routes for local pods past [`PARALLEL_SORT`], their tables added in many short runs and out
/// of order: the runs do not make a sorted whole, so the builder sorts them all.
#[test]
fn routes_for_local_pods_added_out_of_table_order_are_sorted_all_at_once() {
    let mut added: Vec<Added> = Vec::new();
    for i in 0..(PARALLEL_SORT as u32 + 5000) {
        let table = 1_000_050 - (i % 37);
        let dst =
            IpNet::V4(ipnet::Ipv4Net::new((0x0a00_0000 + (i % 4093) * 256).into(), 24).unwrap());
        let prec = (i % 3) as u8;
        added.push((table, dst, prec, dev(&format!("d{prec}")), i % 5 != 0));
    }
    let (always, local) = built(&added);
    for t in [&always, &local] {
        assert!(t.windows(2).all(|w| w[0].0 < w[1].0), "sorted, one per key");
    }
    assert_eq!((always, local), expected(&added));
}

/// Each table's routes for local pods added in one run, in table order (as the plan adds the
/// blocks): the same routes as when added in any other order.
#[test]
fn routes_for_local_pods_added_table_by_table_yield_the_same_routes() {
    let mut added: Vec<Added> = Vec::new();
    for table in [3, 5, 9] {
        for i in (0..2000u32).rev() {
            let dst = IpNet::V4(ipnet::Ipv4Net::new((0x0a00_0000 + i * 64).into(), 26).unwrap());
            added.push((table, dst, PREC_REACH, dev(&format!("n{}", i % 7)), true));
        }
    }
    added.push((
        5,
        "10.0.0.64/26".parse().unwrap(),
        PREC_INGRESS,
        dev("over"),
        false,
    ));
    let mut shuffled = added.clone();
    shuffled.reverse();
    let (always, local) = built(&added);
    assert_eq!(
        local.len(),
        3 * 2000 - 1,
        "one route lost its key to a higher precedence"
    );
    assert_eq!((always.clone(), local.clone()), built(&shuffled));
    assert_eq!((always, local), expected(&added));
}
