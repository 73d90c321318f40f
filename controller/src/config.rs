//! The controller's settings and the checks on them at start-up.

use std::time::Duration;

use ipnet::Ipv6Net;
use lace::sid::{self, SidError, FUNCTION_AND_ARGUMENT_BITS, LOCATOR_LEN};

/// The field manager of every write (server-side apply).
pub const FIELD_MANAGER: &str = "lace-controller";

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--srv6-locator-prefix` (the chart's `controller.srv6LocatorPrefix`), checked.
    pub prefix: Ipv6Net,
    /// Writes in flight at once within a phase of a pass.
    pub concurrency: usize,
    /// First delay before a failed pass is retried; doubles up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
}

impl Settings {
    /// Defaults for everything but the prefix.
    pub fn new(prefix: Ipv6Net) -> Self {
        Self {
            prefix,
            concurrency: 16,
            retry_min: Duration::from_millis(200),
            retry_max: Duration::from_secs(30),
        }
    }
}

/// Why `--srv6-locator-prefix` cannot be used; each message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    #[error("--srv6-locator-prefix is empty: set the chart value controller.srv6LocatorPrefix to the IPv6 prefix node locators are carved from, e.g. 2001:db8:100::/48 (/{max} or shorter)", max = LOCATOR_LEN - 1)]
    Missing,
    #[error("--srv6-locator-prefix {0:?} is not an IPv6 prefix: set controller.srv6LocatorPrefix to one like 2001:db8:100::/48")]
    NotIpv6Prefix(String),
    #[error("--srv6-locator-prefix {prefix} leaves no bits for node locators: a SID is the prefix, the node's index up to /{LOCATOR_LEN} (its locator), then {FUNCTION_AND_ARGUMENT_BITS} bits of function and arguments, so the prefix must be shorter than /{LOCATOR_LEN} (/95 holds 1 node, /84 4,095, /48 2^48 - 1): set controller.srv6LocatorPrefix to e.g. a /48")]
    TooLong { prefix: Ipv6Net },
    #[error("--srv6-locator-prefix: {0}")]
    Sid(#[from] SidError),
}

/// Parses and checks `--srv6-locator-prefix`: an IPv6 prefix without host bits that holds at
/// least one /96 locator besides its own address. Whether it holds one per node is known only
/// once the Nodes are listed; nodes beyond it are reported on their Node.
pub fn parse_prefix(text: &str) -> Result<Ipv6Net, PrefixError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(PrefixError::Missing);
    }
    let prefix: Ipv6Net = text
        .parse()
        .map_err(|_| PrefixError::NotIpv6Prefix(text.to_string()))?;
    if prefix.prefix_len() >= LOCATOR_LEN {
        return Err(PrefixError::TooLong { prefix });
    }
    sid::check_prefix(prefix)?;
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_errors_name_the_fix() {
        assert_eq!(
            parse_prefix("2001:db8:100::/48").unwrap().to_string(),
            "2001:db8:100::/48"
        );
        let err = |t: &str| parse_prefix(t).unwrap_err().to_string();
        assert!(err("").contains("set the chart value controller.srv6LocatorPrefix"));
        assert!(err("10.0.0.0/8").contains("is not an IPv6 prefix"));
        assert!(err("2001:db8::").contains("is not an IPv6 prefix"));
        assert_eq!(
            err("2001:db8::1/48"),
            "--srv6-locator-prefix: srv6LocatorPrefix 2001:db8::1/48 has host bits set (did you mean 2001:db8::/48?)"
        );
        for long in ["2001:db8::/96", "2001:db8::/100"] {
            assert!(
                err(long).starts_with(&format!("--srv6-locator-prefix {long} leaves no bits for node locators: a SID is the prefix, the node's index up to /96 (its locator), then 32 bits of function and arguments")),
                "{}", err(long)
            );
        }
        assert_eq!(
            parse_prefix("2001:db8::/95").map(sid::max_node_index),
            Ok(Ok(1))
        );
    }
}
