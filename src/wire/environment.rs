//! What the runtime passes in the environment besides the verb: the container id
//! (`CNI_CONTAINERID`), the interface name (`CNI_IFNAME`) and `CNI_ARGS`, each checked.

use std::collections::BTreeSet;

/// Linux `IFNAMSIZ` minus the terminating NUL.
pub const MAX_IFNAME_LEN: usize = 15;

/// Whether `s` matches the spec's identifier pattern `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (used for
/// network names and container ids).
pub(super) fn is_cni_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Why a container id (`CNI_CONTAINERID`) is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ContainerIdError {
    /// Empty.
    #[error("container id is empty")]
    Empty,
    /// Characters outside the spec's pattern.
    #[error(
        "container id {0:?} is invalid: it must start with a letter or digit followed by \
         letters, digits, '_', '.' or '-'"
    )]
    Invalid(String),
}

/// Checks a container id against the spec: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn validate_container_id(id: &str) -> Result<(), ContainerIdError> {
    if id.is_empty() {
        Err(ContainerIdError::Empty)
    } else if is_cni_identifier(id) {
        Ok(())
    } else {
        Err(ContainerIdError::Invalid(id.to_owned()))
    }
}

/// Why an interface name (`CNI_IFNAME`) cannot be a Linux interface name.
#[derive(Debug, thiserror::Error)]
pub enum IfnameError {
    /// Empty.
    #[error("interface name is empty")]
    Empty,
    /// Longer than `IFNAMSIZ - 1` bytes.
    #[error("interface name {0:?} is {1} bytes long, the kernel allows at most {MAX_IFNAME_LEN}")]
    TooLong(String, usize),
    /// `.` or `..`, which the kernel refuses (they would clash with sysfs entries).
    #[error("interface name {0:?} is not allowed")]
    Reserved(String),
    /// A character the kernel refuses: `/`, `:` or whitespace.
    #[error("interface name {0:?} contains {1:?}, which the kernel does not allow")]
    BadChar(String, char),
}

/// Checks an interface name the way the kernel's `dev_valid_name` does.
pub fn validate_ifname(name: &str) -> Result<(), IfnameError> {
    if name.is_empty() {
        return Err(IfnameError::Empty);
    }
    if name.len() > MAX_IFNAME_LEN {
        return Err(IfnameError::TooLong(name.to_owned(), name.len()));
    }
    if name == "." || name == ".." {
        return Err(IfnameError::Reserved(name.to_owned()));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(IfnameError::BadChar(name.to_owned(), c));
    }
    Ok(())
}

/// The `CNI_ARGS` keys Lace understands (the ones containerd and CRI-O send for Kubernetes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `K8S_POD_UID`.
    pub pod_uid: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`.
    pub infra_container_id: Option<String>,
}

/// Why `CNI_ARGS` cannot be parsed.
#[derive(Debug, thiserror::Error)]
pub enum CniArgsError {
    /// A `;`-separated part without `=`.
    #[error("CNI_ARGS part {0:?} is not KEY=VALUE")]
    NotKeyValue(String),
    /// A key appears twice.
    #[error("CNI_ARGS sets {0} twice")]
    Duplicate(String),
    /// `IgnoreUnknown` with a value that is not a boolean.
    #[error("CNI_ARGS IgnoreUnknown={0:?} is not a boolean (1, 0, true or false)")]
    BadIgnoreUnknown(String),
    /// Keys Lace does not know, without `IgnoreUnknown=1`.
    #[error("CNI_ARGS has unknown keys {0:?} and no IgnoreUnknown=1")]
    Unknown(Vec<String>),
    /// A Kubernetes name that is not a DNS subdomain.
    #[error(
        "CNI_ARGS {key}={value:?} is not a valid Kubernetes name (lowercase letters, digits, \
         '-' and '.', at most 253 characters)"
    )]
    BadName {
        /// The key.
        key: &'static str,
        /// Its value.
        value: String,
    },
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

impl CniArgs {
    /// Parses `KEY=VALUE;KEY=VALUE`. Unknown keys are an error unless `IgnoreUnknown` is true
    /// (the convention of the reference plugins; containerd always sends `IgnoreUnknown=1`).
    /// Empty values count as absent.
    pub fn parse(s: &str) -> Result<CniArgs, CniArgsError> {
        let mut args = CniArgs::default();
        let mut seen = BTreeSet::new();
        let mut unknown = Vec::new();
        let mut ignore_unknown = false;
        for part in s.split(';').filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| CniArgsError::NotKeyValue(part.to_owned()))?;
            if !seen.insert(key) {
                return Err(CniArgsError::Duplicate(key.to_owned()));
            }
            let slot = match key {
                "IgnoreUnknown" => {
                    ignore_unknown = match value.to_ascii_lowercase().as_str() {
                        "1" | "true" => true,
                        "0" | "false" => false,
                        _ => return Err(CniArgsError::BadIgnoreUnknown(value.to_owned())),
                    };
                    continue;
                }
                "K8S_POD_NAMESPACE" => &mut args.pod_namespace,
                "K8S_POD_NAME" => &mut args.pod_name,
                "K8S_POD_UID" => &mut args.pod_uid,
                "K8S_POD_INFRA_CONTAINER_ID" => &mut args.infra_container_id,
                _ => {
                    unknown.push(key.to_owned());
                    continue;
                }
            };
            if !value.is_empty() {
                *slot = Some(value.to_owned());
            }
        }
        if !unknown.is_empty() && !ignore_unknown {
            return Err(CniArgsError::Unknown(unknown));
        }
        for (key, value) in [
            ("K8S_POD_NAMESPACE", &args.pod_namespace),
            ("K8S_POD_NAME", &args.pod_name),
        ] {
            if let Some(value) = value {
                if !is_dns_subdomain(value) {
                    return Err(CniArgsError::BadName {
                        key,
                        value: value.clone(),
                    });
                }
            }
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_args_from_containerd() {
        let args = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-5d78c9869d-abcde;\
             K8S_POD_INFRA_CONTAINER_ID=0123456789abcdef;K8S_POD_UID=1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        )
        .unwrap();
        assert_eq!(args.pod_namespace.as_deref(), Some("kube-system"));
        assert_eq!(args.pod_name.as_deref(), Some("coredns-5d78c9869d-abcde"));
        assert_eq!(args.infra_container_id.as_deref(), Some("0123456789abcdef"));
        assert_eq!(
            args.pod_uid.as_deref(),
            Some("1b4e28ba-2fa1-11d2-883f-0016d3cca427")
        );
        // containerd may add keys Lace does not know (e.g. for port mappings), and a trailing ';'.
        let args = CniArgs::parse("K8S_POD_NAME=a;FUTURE_KEY=x;IgnoreUnknown=true;").unwrap();
        assert_eq!(args.pod_name.as_deref(), Some("a"));
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert_eq!(CniArgs::parse("K8S_POD_NAME=").unwrap().pod_name, None);
    }

    #[test]
    fn cni_args_errors_name_the_part() {
        let cases = [
            ("K8S_POD_NAME", "\"K8S_POD_NAME\""),
            ("FOO=1", "FOO"),
            ("IgnoreUnknown=0;FOO=1", "FOO"),
            ("IgnoreUnknown=maybe", "maybe"),
            ("K8S_POD_NAME=a;K8S_POD_NAME=b", "twice"),
            ("K8S_POD_NAMESPACE=Kube_System", "Kube_System"),
            ("K8S_POD_NAME=a..b", "a..b"),
        ];
        for (input, needle) in cases {
            let err = CniArgs::parse(input).unwrap_err().to_string();
            assert!(err.contains(needle), "{input}: {err}");
        }
    }

    #[test]
    fn ifname_rules_match_the_kernel() {
        for ok in ["eth0", "net1", "a", "x-y_z.1", "123456789012345"] {
            validate_ifname(ok).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            "1234567890123456",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            "ä23456789012345",
        ] {
            assert!(validate_ifname(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn container_id_rules() {
        validate_container_id("0123abcdef_.-X").unwrap();
        for bad in ["", "-a", ".a", "a/b", "a b", "a;b"] {
            assert!(validate_container_id(bad).is_err(), "{bad:?} accepted");
        }
    }
}
