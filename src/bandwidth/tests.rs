//! Tests of the buckets planned for the rates pods ask for.

use proptest::prelude::*;

use super::*;

fn limit(rate: u64, burst: Option<u64>) -> Limit {
    Limit { rate, burst }
}

#[test]
fn containerds_unset_burst_is_capped_to_a_few_ms_of_the_rate() {
    // containerd passes 2^32-1 bits when the pod sets only a rate.
    let b = limit(1_000_000_000, Some(u64::from(u32::MAX))).bucket();
    assert_eq!(b.rate, 125_000_000);
    assert_eq!(b.burst, 1_250_000, "10 ms at 125 MB/s");
    assert_eq!(b.limit, 1_250_000 + 3_125_000, "and 25 ms of queue");
    // No burst at all (CRI-O, a hand-written runtimeConfig): the same.
    assert_eq!(limit(1_000_000_000, None).bucket(), b);
    assert_eq!(limit(1_000_000_000, Some(0)).bucket(), b);
}

#[test]
fn a_burst_below_the_cap_is_kept_and_never_below_four_jumbo_frames() {
    // 100 kB at 1 Gbit/s: under the 1.25 MB cap.
    assert_eq!(limit(1_000_000_000, Some(800_000)).bucket().burst, 100_000);
    // One byte: a bucket smaller than a frame would drop every full-sized packet.
    assert_eq!(
        limit(1_000_000_000, Some(8)).bucket().burst,
        MIN_BURST_BYTES
    );
    // 10 Mbit/s: 10 ms is 12500 bytes, less than four jumbo frames; 25 ms of queue (31250
    // bytes) less than a GSO packet.
    let slow = limit(10_000_000, Some(u64::from(u32::MAX))).bucket();
    assert_eq!((slow.rate, slow.burst), (1_250_000, MIN_BURST_BYTES));
    assert_eq!(slow.limit, MIN_BURST_BYTES + MIN_QUEUE_BYTES);
}

proptest! {
    /// Whatever the runtime passes: the rate in bytes, a bucket of at least four jumbo frames
    /// and at most the cap (or four frames, where the cap is less), a queue of at least a GSO
    /// packet beyond the bucket (unless the kernel's 4 GiB limit is reached).
    #[test]
    fn buckets_stay_in_bounds_for_every_rate_and_burst(
        rate in MIN_RATE..=MAX_RATE,
        burst in proptest::option::of(any::<u64>()),
    ) {
        let b = limit(rate, burst).bucket();
        let cap = u128::from(rate / 8) * u128::from(BURST_TIME_US) / 1_000_000;
        prop_assert_eq!(b.rate, rate / 8);
        prop_assert!(b.burst >= MIN_BURST_BYTES, "{:?}", b);
        prop_assert!(
            u128::from(b.burst) <= cap.max(u128::from(MIN_BURST_BYTES)),
            "{:?}",
            b
        );
        let queue = u64::from(b.limit) - u64::from(b.burst);
        prop_assert!(
            queue >= u64::from(MIN_QUEUE_BYTES) || b.limit == u32::MAX,
            "{:?}",
            b
        );
        if let Some(asked) = burst.map(|b| b / 8).filter(|b| *b > 0) {
            // A burst within the bounds is kept as asked.
            if asked >= u64::from(MIN_BURST_BYTES) && u128::from(asked) <= cap {
                prop_assert_eq!(u64::from(b.burst), asked);
            }
        }
    }
}

#[test]
fn rates_read_as_tc_writes_them() {
    assert_eq!(format_rate(10_000_000), "10Mbit");
    assert_eq!(format_rate(1_500_000), "1500kbit");
    assert_eq!(format_rate(2_000_000_000), "2Gbit");
    assert_eq!(format_rate(1_001), "1001bit");
    let b = limit(10_000_000, None).bucket();
    assert_eq!(
        b.to_string(),
        format!("rate 10Mbit burst {MIN_BURST_BYTES}b limit {}b", b.limit)
    );
    assert_eq!(
        limit(10_000_000, Some(4_294_967_295)).to_string(),
        "10Mbit burst 4294967295bit"
    );
}

#[test]
fn any_is_none_without_a_shaped_direction() {
    assert_eq!(Bandwidth::default().any(), None);
    let b = Bandwidth {
        ingress: None,
        egress: Some(limit(MIN_RATE, None)),
    };
    assert_eq!(b.any(), Some(b));
}
