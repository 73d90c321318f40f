//! Bandwidth: a pod's traffic shaped to the rates of its `kubernetes.io/ingress-bandwidth` and
//! `kubernetes.io/egress-bandwidth` annotations. The kubelet hands them to the runtime, which
//! passes them to the plugin as the `bandwidth` capability (`runtimeConfig.bandwidth`,
//! [`crate::wire::bandwidth`]); the agent keeps them in its record of the attachment, and the
//! planner turns each direction into a token bucket filter ([`Bucket`]) on the pod's host-side
//! veth (`plan::shaping`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The lowest rate a pod may ask for, in bits per second: Kubernetes refuses annotations
/// below 1 kbit/s.
pub const MIN_RATE: u64 = 1_000;
/// The highest, in bits per second: Kubernetes refuses annotations above 1 Pbit/s.
pub const MAX_RATE: u64 = 1_000_000_000_000_000;

/// The longest burst a bucket holds, as time at its rate. Runtimes pass a burst of their own
/// when the pod sets only a rate (containerd: 2^32-1 bits, 512 MiB): a bucket that large lets
/// a pod send unshaped for seconds or minutes, so the burst is capped to this much of the
/// rate. Not less: the bucket also absorbs the shaper's timer firing late, whose tokens a full
/// bucket loses (at 100 Mbit/s in the emulated test VM, 5 ms gave 73-99% of the rate, 10 ms
/// 95-99%).
pub const BURST_TIME_US: u64 = 10_000;
/// The smallest bucket, in bytes: four of the largest Ethernet frames of a 9216-byte (jumbo)
/// MTU, whatever burst was asked for. A token bucket filter drops every packet larger than
/// its bucket, and a bucket of about one packet loses the tokens of every moment its timer
/// fires late (at 8 Mbit/s with 9000-byte frames in the emulated test VM: 88-94% of the
/// rate with one frame's bucket, 98% with four).
pub const MIN_BURST_BYTES: u32 = 4 * (9216 + 14);
/// How long a packet may wait for tokens, which sizes the queue (`limit`) beyond the bucket:
/// the reference `bandwidth` plugin's default latency.
pub const LATENCY_US: u64 = 25_000;
/// The smallest queue beyond the bucket, in bytes: one full-sized GSO packet (64 KiB), which
/// the filter cuts into MTU-sized packets as it queues them. A smaller queue drops most of
/// every large TCP burst (at 4 Mbit/s with 9000-byte frames in the emulated test VM: 84-88% of
/// the rate with 25 ms of queue, and retransmissions; 95% without them with 64 KiB more).
pub const MIN_QUEUE_BYTES: u32 = 64 * 1024;

/// One direction's limit, as the runtime asked for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Limit {
    /// Bits per second ([`MIN_RATE`]`..=`[`MAX_RATE`]).
    pub rate: u64,
    /// The burst asked for, in bits (`None`: none asked for; [`Limit::bucket`] caps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
}

/// What a pod's traffic is shaped to: towards the pod (`ingress`, the annotation
/// `kubernetes.io/ingress-bandwidth`) and from it (`egress`); `None` is not shaped.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Bandwidth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Limit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Limit>,
}

impl Bandwidth {
    /// `Some` when at least one direction is shaped.
    pub fn any(self) -> Option<Self> {
        (self.ingress.is_some() || self.egress.is_some()).then_some(self)
    }
}

/// A token bucket filter's parameters, in the kernel's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bucket {
    /// Bytes per second.
    pub rate: u64,
    /// The bucket's size in bytes: what may leave at once at line rate.
    pub burst: u32,
    /// The queue in bytes: packets waiting for tokens beyond it are dropped.
    pub limit: u32,
}

/// `bytes_per_s` for `us` microseconds, in bytes (saturating at the kernel's `u32`).
fn during(bytes_per_s: u64, us: u64) -> u32 {
    let bytes = u128::from(bytes_per_s) * u128::from(us) / 1_000_000;
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

impl Limit {
    /// The bucket for this limit: the rate in bytes; the burst asked for, but at most
    /// [`BURST_TIME_US`] of the rate and at least [`MIN_BURST_BYTES`] (no burst asked for:
    /// the most); beyond the bucket a queue of [`LATENCY_US`] at the rate, at least
    /// [`MIN_QUEUE_BYTES`].
    pub fn bucket(self) -> Bucket {
        let rate = self.rate / 8;
        let most = during(rate, BURST_TIME_US).max(MIN_BURST_BYTES);
        let asked = self
            .burst
            .filter(|b| *b > 0)
            .map_or(most, |b| u32::try_from(b / 8).unwrap_or(u32::MAX));
        let burst = asked.clamp(MIN_BURST_BYTES, most);
        Bucket {
            rate,
            burst,
            limit: burst.saturating_add(during(rate, LATENCY_US).max(MIN_QUEUE_BYTES)),
        }
    }
}

/// `rate` in bits per second as `tc` writes it (`10Mbit`, `1500kbit`, `999bit`).
pub fn format_rate(rate: u64) -> String {
    for (unit, name) in [
        (1_000_000_000, "Gbit"),
        (1_000_000, "Mbit"),
        (1_000, "kbit"),
    ] {
        if rate >= unit && rate.is_multiple_of(unit) {
            return format!("{}{name}", rate / unit);
        }
    }
    format!("{rate}bit")
}

impl fmt::Display for Limit {
    /// `10Mbit` or `10Mbit burst 4294967295bit`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_rate(self.rate))?;
        if let Some(b) = self.burst {
            write!(f, " burst {b}bit")?;
        }
        Ok(())
    }
}

impl fmt::Display for Bucket {
    /// `rate 10Mbit burst 9230b limit 40480b`, as `tc` writes a `tbf`'s.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rate {} burst {}b limit {}b",
            format_rate(self.rate.saturating_mul(8)),
            self.burst,
            self.limit
        )
    }
}

#[cfg(test)]
mod tests;
