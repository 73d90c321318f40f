//! Kernel state outside rtnetlink: sysctls (`/proc/sys`) and the nft table (written by the
//! `nft` binary, one atomic transaction per change; its tag read back over nfnetlink). All of
//! it runs on the namespace's worker thread, so files, sockets and child processes see that
//! namespace.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::rawnl;
use crate::plan::nft::TABLE;

/// Prefix of the comment Lace writes into its nft table: `lace-plan <digest>`.
const TAG_PREFIX: &str = "lace-plan ";

/// `/proc/sys` path of a dotted sysctl key. Interface names may contain dots, so in
/// `net.ipv{4,6}.{conf,neigh}.<ifname>.<leaf>` everything between the fourth component and the
/// last is the interface name, kept whole.
pub fn sysctl_path(key: &str) -> PathBuf {
    let mut path = PathBuf::from("/proc/sys");
    for prefix in [
        "net.ipv4.conf.",
        "net.ipv6.conf.",
        "net.ipv4.neigh.",
        "net.ipv6.neigh.",
    ] {
        if let Some(rest) = key.strip_prefix(prefix) {
            if let Some((ifname, leaf)) = rest.rsplit_once('.') {
                for part in prefix.trim_end_matches('.').split('.') {
                    path.push(part);
                }
                path.push(ifname);
                path.push(leaf);
                return path;
            }
        }
    }
    for part in key.split('.') {
        path.push(part);
    }
    path
}

/// The sysctl's value, `None` if it does not exist (yet).
pub fn read_sysctl(key: &str) -> Option<String> {
    std::fs::read_to_string(sysctl_path(key))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Writes a sysctl.
pub fn write_sysctl(key: &str, value: &str) -> Result<(), String> {
    std::fs::write(sysctl_path(key), value).map_err(|e| e.to_string())
}

/// 64-bit FNV-1a: stable across builds and Rust versions (unlike `DefaultHasher`), so a
/// restarted agent recognizes the table an earlier one wrote.
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The tag identifying a rendered ruleset.
pub fn nft_tag(rendered: &str) -> String {
    format!("{TAG_PREFIX}{:016x}", fnv1a64(rendered.as_bytes()))
}

/// `rendered` (the planner's `nft -f` text) with the tag as the table's comment, so the next
/// observation can tell whether the kernel holds exactly this ruleset.
pub fn tagged_ruleset(rendered: &str, tag: &str) -> Result<String, String> {
    let open = format!("table inet {TABLE} {{\n");
    if !rendered.contains(&open) {
        return Err(format!("ruleset text has no `{}` line", open.trim_end()));
    }
    Ok(rendered.replacen(&open, &format!("{open}\tcomment \"{tag}\"\n"), 1))
}

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let line = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run `{line}`: {e}"))?;
    // Feed stdin from another thread while this one drains stdout and stderr: a tool that
    // reports many errors before reading all its input would otherwise block on a full pipe
    // while we block writing to it.
    let out = std::thread::scope(|s| {
        let writer = match (stdin, child.stdin.take()) {
            (Some(input), Some(mut pipe)) => {
                Some(s.spawn(move || pipe.write_all(input.as_bytes())))
            }
            _ => None,
        };
        let out = child.wait_with_output();
        let written = writer.map(|w| w.join().unwrap_or(Ok(())));
        (out, written)
    });
    let out = match out {
        (Ok(o), Some(Err(e))) if o.status.success() => {
            return Err(format!("writing to `{line}`: {e}"))
        }
        (Ok(o), _) => o,
        (Err(e), _) => return Err(format!("waiting for `{line}`: {e}")),
    };
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `NFT_MSG_GETTABLE` (nfnetlink subsystem 10, message 1).
const NFT_MSG_GETTABLE: u16 = (10 << 8) | 1;
const NFPROTO_INET: u8 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_USERDATA: u16 = 6;
/// libnftnl's user-data TLV type of a table comment.
const NFTNL_UDATA_TABLE_COMMENT: u8 = 0;

/// The table comment in nftables user data (TLVs of type u8, length u8, value).
fn udata_comment(udata: &[u8]) -> Option<String> {
    let mut i = 0;
    while i + 2 <= udata.len() {
        let (t, l) = (udata[i], usize::from(udata[i + 1]));
        let v = udata.get(i + 2..i + 2 + l)?;
        if t == NFTNL_UDATA_TABLE_COMMENT {
            let v = v.strip_suffix(&[0]).unwrap_or(v);
            return Some(String::from_utf8_lossy(v).into_owned());
        }
        i += 2 + l;
    }
    None
}

/// Whether table `inet lace` exists, and its tag: one `NFT_MSG_GETTABLE` over nfnetlink (the
/// comment `nft` wrote lives in the table's user data), not a run of `nft`.
pub fn nft_observe() -> Result<super::NftState, String> {
    let sock = rawnl::open(rtnetlink::sys::protocols::NETLINK_NETFILTER)?;
    let name = format!("{TABLE}\0");
    let req = rawnl::request(
        NFT_MSG_GETTABLE,
        rawnl::NLM_F_REQUEST,
        [NFPROTO_INET, 0, 0, 0],
        (NFTA_TABLE_NAME, name.as_bytes()),
    );
    let attrs = match rawnl::talk(&sock, &req)? {
        rawnl::Answer::Errno(e) if e == libc::ENOENT => return Ok(super::NftState::Absent),
        a => rawnl::attrs(a, "NFT_MSG_GETTABLE inet lace")?,
    };
    let tag = attrs
        .iter()
        .find(|(t, _)| *t == NFTA_TABLE_USERDATA)
        .and_then(|(_, v)| udata_comment(v))
        .filter(|c| c.starts_with(TAG_PREFIX));
    Ok(super::NftState::Present { tag })
}

/// Runs one `nft -f` transaction.
pub fn nft_apply(script: &str) -> Result<(), String> {
    run("nft", &["-f", "-"], Some(script)).map(|_| ())
}

/// The `delete table` transaction, create-if-missing first so it never fails.
pub fn nft_delete_script() -> String {
    format!("table inet {TABLE}\ndelete table inet {TABLE}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_that_fails_loudly_before_reading_its_input_does_not_hang() {
        // 256 KiB of stderr before reading any of 1 MiB of stdin: both pipes overflow.
        let input = "x".repeat(1 << 20);
        let err = run(
            "sh",
            &["-c", "head -c 262144 /dev/zero >&2; exit 3"],
            Some(&input),
        )
        .unwrap_err();
        assert!(err.contains("exit status: 3"), "{err}");
        assert_eq!(run("cat", &[], Some("abc")).unwrap(), "abc");
    }

    #[test]
    fn table_comments_are_read_from_nftables_user_data() {
        let mut u = vec![1, 2, 9, 9, NFTNL_UDATA_TABLE_COMMENT, 6];
        u.extend_from_slice(b"lace-\0");
        assert_eq!(udata_comment(&u).as_deref(), Some("lace-"));
        assert_eq!(udata_comment(&[1, 1, 0]), None);
        assert_eq!(udata_comment(&[0, 9, 1]), None, "truncated");
    }

    #[test]
    fn sysctl_paths_keep_interface_names_whole() {
        assert_eq!(
            sysctl_path("net.ipv4.conf.lv-a.b.rp_filter"),
            PathBuf::from("/proc/sys/net/ipv4/conf/lv-a.b/rp_filter")
        );
        assert_eq!(
            sysctl_path("net.ipv4.conf.all.rp_filter"),
            PathBuf::from("/proc/sys/net/ipv4/conf/all/rp_filter")
        );
        assert_eq!(
            sysctl_path("net.vrf.strict_mode"),
            PathBuf::from("/proc/sys/net/vrf/strict_mode")
        );
    }

    #[test]
    fn tags_differ_for_different_rulesets_and_land_in_the_table() {
        let a = "table inet lace\ndelete table inet lace\ntable inet lace {\n}\n";
        let b = "table inet lace\ndelete table inet lace\ntable inet lace {\n\tset x {}\n}\n";
        assert_ne!(nft_tag(a), nft_tag(b));
        assert_eq!(nft_tag(a), nft_tag(a));
        let t = tagged_ruleset(a, &nft_tag(a)).unwrap();
        assert_eq!(t.matches("comment \"lace-plan ").count(), 1);
        assert!(t.contains(&format!("table inet lace {{\n\tcomment \"{}\"", nft_tag(a))));
        assert!(tagged_ruleset("table ip other {\n}\n", "x").is_err());
    }
}
