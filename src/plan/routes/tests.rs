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
    let t = rb.finish();
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
