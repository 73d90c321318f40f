//! When an apply reads its routes back with a dump instead of its own notifications.

use super::*;
use crate::dataplane::observed::KernelNexthop;
use crate::plan::RouteKey;

fn route(i: u32) -> (RouteKey, KernelNexthop) {
    let dst = ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(0x0a00_0000 + (i << 8)), 24).unwrap();
    (
        RouteKey::new(1_000_001, dst.into()),
        KernelNexthop::Unreachable,
    )
}

fn puts(n: u32) -> Vec<Op> {
    (0..n)
        .map(|i| {
            let (key, nh) = route(i);
            Op::PutRoute { key, nh }
        })
        .collect()
}

fn holding(n: u32) -> ObservedNode {
    ObservedNode {
        routes: (0..n).map(route).collect(),
        ..Default::default()
    }
}

#[test]
fn an_apply_dumps_its_routes_only_when_it_writes_many_and_more_than_the_namespace_holds() {
    // A fresh namespace and a first apply at the threshold.
    assert!(dump_after(&puts(100), &holding(0), 100));
    assert!(!dump_after(&puts(99), &holding(0), 100), "below it");
    // As many writes as routes held: following the notifications is cheaper.
    assert!(!dump_after(&puts(150), &holding(150), 100));
    assert!(dump_after(&puts(151), &holding(150), 100));
    // Deletes count; other operations do not.
    let (key, nh) = route(0);
    let mut ops = vec![Op::DelRoute { key, nh }; 100];
    assert!(dump_after(&ops, &holding(0), 100));
    ops.truncate(99);
    ops.push(Op::LinkUp {
        name: "lv-a".into(),
    });
    assert!(!dump_after(&ops, &holding(0), 100));
    // The host's own routes are dumped too.
    let mut host = holding(0);
    host.host_routes = vec![
        crate::dataplane::observed::HostRoute {
            dst: "192.0.2.0/24".parse().unwrap(),
            gateway: None,
            dev: Some("eth0".into()),
        };
        100
    ];
    assert!(!dump_after(&puts(100), &host, 100));
}
