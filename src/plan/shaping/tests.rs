//! Tests of the shaping planned for local pods.

use super::*;
use crate::bandwidth::{MIN_BURST_BYTES, MIN_QUEUE_BYTES};

fn attachment(name: &str, veth: &str, bandwidth: Option<Bandwidth>) -> PodAttachment {
    PodAttachment {
        pod: ObjectKey::new("default", name),
        container_id: format!("c-{name}"),
        host_ifname: veth.into(),
        network: "default".into(),
        ips: vec!["10.1.1.10/32".parse().unwrap()],
        host_ports: Vec::new(),
        bandwidth,
    }
}

fn limit(rate: u64) -> Option<Limit> {
    Some(Limit {
        rate,
        burst: Some(u64::from(u32::MAX)),
    })
}

#[test]
fn shapers_are_named_after_the_veth_and_fit_an_interface_name() {
    assert_eq!(shaper_name("lp-0123456789a"), "ls-0123456789a");
    assert_eq!(shaper_name("lp-pa"), "ls-pa");
    let long = shaper_name("lp-0123456789abcdef");
    assert_eq!(long, "ls-0123456789ab");
    assert!(long.len() <= IFNAME_MAX);
}

#[test]
fn only_pods_that_asked_are_shaped_each_direction_on_its_own() {
    let both = Bandwidth {
        ingress: limit(10_000_000),
        egress: limit(1_000_000_000),
    };
    let to_only = Bandwidth {
        ingress: limit(10_000_000),
        egress: None,
    };
    let local = [
        attachment("plain", "lp-a", None),
        attachment("empty", "lp-b", Some(Bandwidth::default())),
        attachment("both", "lp-c", Some(both)),
        attachment("to-only", "lp-d", Some(to_only)),
    ];
    let planned = plan(&local);
    assert_eq!(
        planned.keys().collect::<Vec<_>>(),
        ["lp-c", "lp-d"],
        "{planned:?}"
    );
    let c = &planned["lp-c"];
    assert_eq!(c.pod, ObjectKey::new("default", "both"));
    assert_eq!(c.asked, both);
    assert_eq!(c.ingress, both.ingress.map(Limit::bucket));
    assert_eq!(c.egress, both.egress.map(Limit::bucket));
    let d = &planned["lp-d"];
    assert_eq!(
        (d.ingress.map(|b| b.rate), d.egress),
        (Some(1_250_000), None)
    );
}

#[test]
fn the_plan_shows_each_pod_its_buckets_and_shaper() {
    let local = [attachment(
        "web",
        "lp-0123456789a",
        Some(Bandwidth {
            ingress: limit(10_000_000),
            egress: Some(Limit {
                rate: 1_000_000_000,
                burst: None,
            }),
        }),
    )];
    let mut out = String::new();
    render(&plan(&local), &mut out);
    let want = format!(
        "
## shaping
# pod default/web: to it 10Mbit burst 4294967295bit, from it 1Gbit
qdisc replace dev lp-0123456789a root handle 4c: tbf rate 10Mbit burst {MIN_BURST_BYTES}b limit {}b
link add ls-0123456789a type ifb up
qdisc add dev lp-0123456789a ingress
filter add dev lp-0123456789a parent ffff: prio 76 protocol all u32 match u32 0 0 action mirred egress redirect dev ls-0123456789a
qdisc replace dev ls-0123456789a root handle 4c: tbf rate 1Gbit burst 1250000b limit 4375000b
",
        MIN_BURST_BYTES + MIN_QUEUE_BYTES
    );
    assert_eq!(out, want);
    // Nothing shaped: no section.
    let mut none = String::new();
    render(&plan(&[attachment("plain", "lp-a", None)]), &mut none);
    assert_eq!(none, "");
}
