//! 64-bit FNV-1a, the one hash whose values Lace keeps: the host-side veth names and MACs of
//! the CNI (`agent::cni`) and the tag of the nft ruleset the reconciler wrote
//! (`dataplane::diff::nft`). Written out because std's hasher may change between Rust
//! releases, and these values must not: a restarted or upgraded agent finds what an earlier
//! one made by them.

/// The FNV-1a 64 offset basis (also the hash of no bytes).
const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// The FNV-1a 64 prime.
const PRIME: u64 = 0x0100_0000_01b3;

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a64(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes
        .into_iter()
        .fold(OFFSET_BASIS, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_fnv_1a_64_vectors() {
        // From the FNV reference test suite (draft-eastlake-fnv, fnv1a64 of "", "a", "foobar").
        assert_eq!(fnv1a64([]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(*b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(*b"foobar"), 0x8594_4171_f739_67e8);
    }
}
