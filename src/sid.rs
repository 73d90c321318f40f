//! SRv6 SID and locator arithmetic.
//!
//! Layout of every Lace SID (128 bits):
//!
//! ```text
//! | srv6LocatorPrefix | node index | function (16) | argument (16) |
//! |<------------- locator (/96) -->|
//! ```
//!
//! The node's locator is the `srv6LocatorPrefix` with the node's index in the bits up to /96.
//! Index 0 is never handed out, so the prefix's own address is never a locator. A Network's
//! SID on a node is the node's locator with the Network's function in bits 96..112; the
//! argument bits are zero (reserved for later use, e.g. flow or slice hints).

use std::net::Ipv6Addr;

use ipnet::Ipv6Net;

/// Bits of a SID that follow the locator: the function and its argument.
pub const FUNCTION_AND_ARGUMENT_BITS: u8 = 32;
/// Bits of the SID function.
pub const FUNCTION_BITS: u8 = 16;
/// Prefix length of every node locator (128 - 32).
pub const LOCATOR_LEN: u8 = 128 - FUNCTION_AND_ARGUMENT_BITS;

/// Errors of the locator arithmetic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SidError {
    /// The locator prefix is longer than /96, so no bits are left for node indices.
    #[error(
        "srv6LocatorPrefix {prefix} leaves {bits} bits for the SID function and arguments, \
         at least {FUNCTION_AND_ARGUMENT_BITS} are needed (use /{LOCATOR_LEN} or shorter)",
        bits = 128 - u32::from(.prefix.prefix_len())
    )]
    PrefixTooLong { prefix: Ipv6Net },
    /// The locator prefix has bits set after its prefix length.
    #[error("srv6LocatorPrefix {prefix} has host bits set (did you mean {}?)", .prefix.trunc())]
    HostBits { prefix: Ipv6Net },
    /// Index 0 would make the locator equal to the prefix's own address.
    #[error("node index 0 is reserved: the locator would be the prefix {prefix} itself")]
    ReservedIndex { prefix: Ipv6Net },
    /// The index does not fit in the node bits of the prefix.
    #[error("node index {index} does not fit in srv6LocatorPrefix {prefix} (highest index {max})")]
    IndexOutOfRange {
        prefix: Ipv6Net,
        index: u32,
        max: u32,
    },
}

/// Checks that `prefix` is a usable locator prefix: no host bits, at most /96.
pub fn check_prefix(prefix: Ipv6Net) -> Result<(), SidError> {
    if prefix.trunc() != prefix {
        return Err(SidError::HostBits { prefix });
    }
    if prefix.prefix_len() > LOCATOR_LEN {
        return Err(SidError::PrefixTooLong { prefix });
    }
    Ok(())
}

/// Number of bits for the node index between the prefix and the /96 locator length.
pub fn node_bits(prefix: Ipv6Net) -> Result<u8, SidError> {
    check_prefix(prefix)?;
    Ok(LOCATOR_LEN - prefix.prefix_len())
}

/// The highest node index the prefix can hold (index 0 is reserved, so this is also the
/// number of nodes it can hold). Capped at `u32::MAX`, the width of a node index.
pub fn max_node_index(prefix: Ipv6Net) -> Result<u32, SidError> {
    let bits = node_bits(prefix)?;
    Ok(if bits >= 32 {
        u32::MAX
    } else {
        (1u32 << bits) - 1
    })
}

/// The /96 locator of the node with `index` inside `prefix`.
///
/// ```
/// # use lace::sid::node_locator;
/// let prefix = "2001:db8:100::/48".parse().unwrap();
/// assert_eq!(node_locator(prefix, 1).unwrap().to_string(), "2001:db8:100::1:0:0/96");
/// ```
pub fn node_locator(prefix: Ipv6Net, index: u32) -> Result<Ipv6Net, SidError> {
    let max = max_node_index(prefix)?;
    if index == 0 {
        return Err(SidError::ReservedIndex { prefix });
    }
    if index > max {
        return Err(SidError::IndexOutOfRange { prefix, index, max });
    }
    let bits = u128::from(prefix.network()) | (u128::from(index) << FUNCTION_AND_ARGUMENT_BITS);
    // LOCATOR_LEN is a valid IPv6 prefix length, so this cannot fail; map it anyway rather
    // than panic.
    Ipv6Net::new(Ipv6Addr::from(bits), LOCATOR_LEN).map_err(|_| SidError::IndexOutOfRange {
        prefix,
        index,
        max,
    })
}

/// The SID of `function` on `locator` (argument bits zero): the address that a
/// `seg6local` route on the locator's node decapsulates into the function's Network, and that
/// other nodes put in their `seg6` encap towards it.
///
/// ```
/// # use lace::sid::sid;
/// let locator = "2001:db8:100::1:0:0/96".parse().unwrap();
/// assert_eq!(sid(locator, 3).to_string(), "2001:db8:100::1:3:0");
/// ```
pub fn sid(locator: Ipv6Net, function: u16) -> Ipv6Addr {
    let bits = u128::from(locator.network()) | (u128::from(function) << FUNCTION_BITS);
    Ipv6Addr::from(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv6Net {
        s.parse().unwrap()
    }

    #[test]
    fn locators_for_a_table_of_prefixes() {
        let cases = [
            ("2001:db8:100::/48", 1, "2001:db8:100::1:0:0/96"),
            ("2001:db8:100::/48", 2, "2001:db8:100::2:0:0/96"),
            ("2001:db8:100::/48", 0x1_0000, "2001:db8:100::1:0:0:0/96"),
            ("2001:db8::/64", 0xffff_ffff, "2001:db8::ffff:ffff:0:0/96"),
            ("fd00::/94", 3, "fd00::3:0:0/96"),
        ];
        for (prefix, index, want) in cases {
            assert_eq!(
                node_locator(net(prefix), index),
                Ok(net(want)),
                "{prefix} #{index}"
            );
        }
    }

    #[test]
    fn capacity_follows_the_node_bits() {
        assert_eq!(max_node_index(net("fd00::/96")), Ok(0));
        assert_eq!(max_node_index(net("fd00::/95")), Ok(1));
        assert_eq!(max_node_index(net("fd00::/80")), Ok(0xffff));
        assert_eq!(max_node_index(net("fd00::/64")), Ok(u32::MAX));
        assert_eq!(max_node_index(net("2001:db8:100::/48")), Ok(u32::MAX));
    }

    #[test]
    fn bad_prefixes_and_indices_are_errors_with_messages() {
        let cases: [(&str, u32, &str); 5] = [
            (
                "fd00::/100",
                1,
                "srv6LocatorPrefix fd00::/100 leaves 28 bits for the SID function and \
                 arguments, at least 32 are needed (use /96 or shorter)",
            ),
            (
                "fd00::1/64",
                1,
                "srv6LocatorPrefix fd00::1/64 has host bits set (did you mean fd00::/64?)",
            ),
            (
                "fd00::/64",
                0,
                "node index 0 is reserved: the locator would be the prefix fd00::/64 itself",
            ),
            (
                "fd00::/94",
                4,
                "node index 4 does not fit in srv6LocatorPrefix fd00::/94 (highest index 3)",
            ),
            (
                "fd00::/96",
                1,
                "node index 1 does not fit in srv6LocatorPrefix fd00::/96 (highest index 0)",
            ),
        ];
        for (prefix, index, want) in cases {
            let err = node_locator(net(prefix), index).unwrap_err();
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn sid_puts_the_function_after_the_locator() {
        let locator = net("2001:db8:100::7:0:0/96");
        assert_eq!(
            sid(locator, 1),
            "2001:db8:100::7:1:0".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            sid(locator, 0xffff),
            "2001:db8:100::7:ffff:0".parse::<Ipv6Addr>().unwrap()
        );
        // Every SID lies inside its locator.
        assert!(locator.contains(&sid(locator, 0xabcd)));
    }

    proptest::proptest! {
        /// Distinct indices give disjoint locators inside the prefix; SIDs stay in them.
        #[test]
        fn locators_are_disjoint_and_inside_the_prefix(
            len in 32u8..=94, a in 1u32..=u32::MAX, b in 1u32..=u32::MAX, f in 1u16..)
        {
            let prefix = Ipv6Net::new("2001:db8::".parse().unwrap(), len).unwrap().trunc();
            let max = max_node_index(prefix).unwrap();
            let (a, b) = (a % max + 1, b % max + 1);
            let la = node_locator(prefix, a).unwrap();
            let lb = node_locator(prefix, b).unwrap();
            proptest::prop_assert!(prefix.contains(&la) && prefix.contains(&lb));
            proptest::prop_assert_eq!(a == b, la == lb);
            proptest::prop_assert!(a == b || !la.contains(&lb.network()));
            proptest::prop_assert!(la.contains(&sid(la, f)));
        }
    }
}
