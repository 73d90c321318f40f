//! Lace's nft table in the kernel: which ruleset it holds (the plan tag), how a new ruleset
//! gets there (a full replace of the table, or only the elements that changed) and what the
//! reconciler remembers in between.
//!
//! ## The plan tag
//! The tag `lace-plan <fnv64>` is a digest of the planner's rendered ruleset text. It is the
//! comment of the one element of set [`TAG_SET`], written in the same transaction as the
//! ruleset, and read back with one nfnetlink request (`NFT_MSG_GETSETELEM` on that set), so
//! observing costs the same for any table size. It cannot be the table's comment: the kernel
//! does not change a table's comment after creation, and an element update must not
//! recreate the table.
//!
//! ## Replace or update
//! Without knowledge of the table's contents, a new ruleset replaces the table (`table`,
//! `delete table`, the whole table, in one transaction). The [`Reconciler`] remembers the
//! ruleset it last wrote or found ([`KnownRuleset`]); when the kernel's tag is that
//! ruleset's and the new ruleset differs from it only in set and map elements, one
//! transaction deletes and adds just those elements and swaps the tag element. Both are one
//! `nft -f` run, hence atomic: a packet sees the old ruleset or the new one, never a mix and
//! never no table. Checking the kernel's tag first makes the memory safe: a table whose tag
//! is not the remembered one (someone re-tagged it, or it predates a restart) is replaced, or
//! left alone when its tag is already the plan's.
//!
//! [`Reconciler`]: super::Reconciler

use super::diff::{DiffError, Op};
use super::{host, rawnl, NftState};
use crate::plan::nft::{Ruleset, TABLE};

/// Prefix of the plan tag: `lace-plan <digest>`.
const TAG_PREFIX: &str = "lace-plan ";

/// The set whose one element carries the plan tag as its comment.
pub const TAG_SET: &str = "plan";

/// The key of the tag element (the set's type is `ifname`: a short readable string).
const TAG_KEY: &str = "\"digest\"";

/// The table's comment: only for humans reading `nft list table`; the tag is in [`TAG_SET`].
const TABLE_COMMENT: &str = "Lace (lace-agent); the plan tag is the element of set plan";

/// 64-bit FNV-1a: stable across builds and Rust versions (unlike `DefaultHasher`), so a
/// restarted agent recognizes the table an earlier one wrote.
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The tag identifying a rendered ruleset.
pub fn tag(rendered: &str) -> String {
    format!("{TAG_PREFIX}{:016x}", fnv1a64(rendered.as_bytes()))
}

/// The tag element, as nft writes it inside `{ }`.
fn tag_element(tag: &str) -> String {
    format!("{TAG_KEY} comment \"{tag}\"")
}

/// The ruleset text has no line opening Lace's table, so the tag has nowhere to go.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the ruleset text has no `table inet {} {{` line", TABLE)]
pub struct UntaggableRuleset;

/// `rendered` (the planner's whole-table `nft -f` text) with the table comment and the tag
/// set, so the next observation can tell whether the kernel holds exactly this ruleset.
pub fn replace_script(rendered: &str, tag: &str) -> Result<String, UntaggableRuleset> {
    let open = format!("table inet {TABLE} {{\n");
    if !rendered.contains(&open) {
        return Err(UntaggableRuleset);
    }
    let head = format!(
        "{open}\tcomment \"{TABLE_COMMENT}\"\n\tset {TAG_SET} {{\n\t\ttype ifname\n\t\t\
         comment \"digest of the ruleset Lace wrote\"\n\t\telements = {{ {} }}\n\t}}\n",
        tag_element(tag)
    );
    Ok(rendered.replacen(&open, &head, 1))
}

/// The transaction that turns the kernel's `from` into `to` by elements alone, `None` when
/// they differ in more (chains, rules, set declarations). Returns the script and the numbers
/// of elements deleted and added.
pub fn update_script(from: &Ruleset, to: &Ruleset, tag: &str) -> Option<(String, usize, usize)> {
    let changes = from.element_changes(to)?;
    // `flush` rather than `delete element`: the transaction does not depend on the old tag
    // element still being there.
    let script = format!(
        "flush set inet {TABLE} {TAG_SET}\n{}add element inet {TABLE} {TAG_SET} {{ {} }}\n",
        changes.render(),
        tag_element(tag)
    );
    Some((script, changes.deleted.len(), changes.added.len()))
}

/// A ruleset the kernel holds, known by its tag: written by this reconciler, or found
/// carrying the plan's tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownRuleset {
    ruleset: Ruleset,
    tag: String,
}

impl KnownRuleset {
    /// What is known after a successful apply: the kernel's table carries `tag_after` (see
    /// [`tag_after`]) and, when a plan was applied, that tag is the plan's.
    pub(super) fn after(
        prev: Option<KnownRuleset>,
        desired: Option<&Ruleset>,
        tag_after: Option<String>,
    ) -> Option<KnownRuleset> {
        match (desired, tag_after) {
            (Some(ruleset), Some(tag)) => match prev {
                Some(k) if k.tag == tag => Some(k),
                _ => Some(KnownRuleset {
                    ruleset: ruleset.clone(),
                    tag,
                }),
            },
            _ => None,
        }
    }
}

/// The tag the kernel's table carries once `ops` (from [`op`] and [`Op::NftDelete`]) were
/// applied to a table `observed`.
pub fn tag_after(ops: &[Op], observed: &NftState) -> Option<String> {
    for op in ops {
        match op {
            Op::NftSwap { tag, .. } | Op::NftElements { tag, .. } => return Some(tag.clone()),
            Op::NftDelete => return None,
            _ => {}
        }
    }
    match observed {
        NftState::Present { tag } => tag.clone(),
        NftState::Absent => None,
    }
}

/// The operation that makes the kernel's table hold `desired` (rendered as `rendered`), if
/// any: nothing when the kernel's tag is the plan's, an element update when the kernel holds
/// the `known` ruleset and only elements differ, a full replace otherwise.
pub fn op(
    desired: &Ruleset,
    rendered: &str,
    observed: &NftState,
    known: Option<&KnownRuleset>,
) -> Result<Option<Op>, DiffError> {
    let tag = tag(rendered);
    let NftState::Present { tag: Some(have) } = observed else {
        return replace(rendered, tag).map(Some);
    };
    if *have == tag {
        return Ok(None);
    }
    if let Some(k) = known.filter(|k| k.tag == *have) {
        if let Some((script, deleted, added)) = update_script(&k.ruleset, desired, &tag) {
            return Ok(Some(Op::NftElements {
                script,
                tag,
                deleted,
                added,
            }));
        }
    }
    replace(rendered, tag).map(Some)
}

fn replace(rendered: &str, tag: String) -> Result<Op, DiffError> {
    let script = replace_script(rendered, &tag)?;
    Ok(Op::NftSwap { script, tag })
}

/// `NFT_MSG_GETTABLE` and `NFT_MSG_GETSETELEM` (nfnetlink subsystem 10, messages 1 and 13).
const NFT_MSG_GETTABLE: u16 = (10 << 8) | 1;
const NFT_MSG_GETSETELEM: u16 = (10 << 8) | 13;
const NFPROTO_INET: u8 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
/// libnftnl's user-data TLV type of an element's comment.
const NFTNL_UDATA_SET_ELEM_COMMENT: u8 = 0;

/// The comment in nftables user data (TLVs of type u8, length u8, value).
fn udata_comment(udata: &[u8]) -> Option<String> {
    let mut i = 0;
    while i + 2 <= udata.len() {
        let (t, l) = (udata[i], usize::from(udata[i + 1]));
        let v = udata.get(i + 2..i + 2 + l)?;
        if t == NFTNL_UDATA_SET_ELEM_COMMENT {
            let v = v.strip_suffix(&[0]).unwrap_or(v);
            return Some(String::from_utf8_lossy(v).into_owned());
        }
        i += 2 + l;
    }
    None
}

/// The tag in the attributes of an `NFT_MSG_NEWSETELEM` message of set [`TAG_SET`]: the
/// comment of its element, when it has exactly one and the comment is a plan tag.
fn tag_of(attrs: &[(u16, Vec<u8>)]) -> Option<String> {
    let list = attrs
        .iter()
        .find(|(t, _)| *t == NFTA_SET_ELEM_LIST_ELEMENTS)?;
    let elements = rawnl::parse_attrs(&list.1);
    let [(NFTA_LIST_ELEM, element)] = elements.as_slice() else {
        return None;
    };
    rawnl::parse_attrs(element)
        .into_iter()
        .find(|(t, _)| *t == NFTA_SET_ELEM_USERDATA)
        .and_then(|(_, u)| udata_comment(u))
        .filter(|c| c.starts_with(TAG_PREFIX))
}

/// Whether table `inet lace` exists, and its tag: one `NFT_MSG_GETSETELEM` dump of set
/// [`TAG_SET`] (plus an `NFT_MSG_GETTABLE` when there is no such set), not a run of `nft`.
pub fn observe() -> Result<NftState, rawnl::RawNlError> {
    let sock = rawnl::open(netlink_sys::protocols::NETLINK_NETFILTER, "nfnetlink")?;
    let table = format!("{TABLE}\0");
    let set = format!("{TAG_SET}\0");
    let req = rawnl::request(
        NFT_MSG_GETSETELEM,
        rawnl::NLM_F_REQUEST | rawnl::NLM_F_DUMP,
        [NFPROTO_INET, 0, 0, 0],
        &[
            (NFTA_SET_ELEM_LIST_TABLE, table.as_bytes()),
            (NFTA_SET_ELEM_LIST_SET, set.as_bytes()),
        ],
    );
    let what = "NFT_MSG_GETSETELEM inet lace plan";
    match rawnl::talk(&sock, &req, what)? {
        rawnl::Answer::Errno(e) if e == libc::ENOENT => {}
        // An empty set answers with the end of the dump: no attributes, no tag.
        a => {
            let attrs = rawnl::attrs(a, what)?;
            return Ok(NftState::Present {
                tag: tag_of(&attrs),
            });
        }
    }
    // No tag set: is there a table at all?
    let req = rawnl::request(
        NFT_MSG_GETTABLE,
        rawnl::NLM_F_REQUEST,
        [NFPROTO_INET, 0, 0, 0],
        &[(NFTA_TABLE_NAME, table.as_bytes())],
    );
    let what = "NFT_MSG_GETTABLE inet lace";
    match rawnl::talk(&sock, &req, what)? {
        rawnl::Answer::Errno(e) if e == libc::ENOENT => Ok(NftState::Absent),
        a => rawnl::attrs(a, what).map(|_| NftState::Present { tag: None }),
    }
}

/// Runs one `nft -f` transaction.
pub fn apply(script: &str) -> Result<(), host::HostError> {
    host::run("nft", &["-f", "-"], Some(script)).map(|_| ())
}

/// The `delete table` transaction, create-if-missing first so it never fails.
pub fn delete_script() -> String {
    format!("table inet {TABLE}\ndelete table inet {TABLE}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::nft::{Chain, Set};

    /// nlattr bytes: length, type, value, padding.
    fn attr(ty: u16, value: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&ty.to_ne_bytes());
        a.extend_from_slice(value);
        a.resize((a.len() + 3) & !3, 0);
        a
    }

    /// The attributes of a `NFT_MSG_NEWSETELEM` dump message with elements of `comments`.
    fn setelem_message(comments: &[&str]) -> Vec<(u16, Vec<u8>)> {
        let mut list = Vec::new();
        for c in comments {
            let mut udata = vec![NFTNL_UDATA_SET_ELEM_COMMENT, (c.len() + 1) as u8];
            udata.extend_from_slice(c.as_bytes());
            udata.push(0);
            let mut element = attr(1, &attr(1, b"digest\0")); // NFTA_SET_ELEM_KEY
            element.extend(attr(NFTA_SET_ELEM_USERDATA, &udata));
            list.extend(attr(NFTA_LIST_ELEM, &element));
        }
        vec![
            (NFTA_SET_ELEM_LIST_TABLE, b"lace\0".to_vec()),
            (NFTA_SET_ELEM_LIST_SET, b"plan\0".to_vec()),
            (NFTA_SET_ELEM_LIST_ELEMENTS, list),
        ]
    }

    #[test]
    fn the_tag_is_the_comment_of_the_one_element_of_the_tag_set() {
        let t = "lace-plan 0123456789abcdef";
        assert_eq!(tag_of(&setelem_message(&[t])).as_deref(), Some(t));
        assert_eq!(tag_of(&setelem_message(&["hand-written"])), None);
        assert_eq!(tag_of(&setelem_message(&[t, t])), None, "two elements");
        assert_eq!(tag_of(&setelem_message(&[])), None);
        assert_eq!(tag_of(&[]), None, "end of an empty dump");
    }

    #[test]
    fn comments_are_read_from_nftables_user_data() {
        let mut u = vec![1, 2, 9, 9, NFTNL_UDATA_SET_ELEM_COMMENT, 6];
        u.extend_from_slice(b"lace-\0");
        assert_eq!(udata_comment(&u).as_deref(), Some("lace-"));
        assert_eq!(udata_comment(&[1, 1, 0]), None);
        assert_eq!(udata_comment(&[0, 9, 1]), None, "truncated");
    }

    #[test]
    fn tags_differ_for_different_rulesets_and_land_in_the_tag_set() {
        let a = "table inet lace\ndelete table inet lace\ntable inet lace {\n}\n";
        let b = "table inet lace\ndelete table inet lace\ntable inet lace {\n\tset x {}\n}\n";
        assert_ne!(tag(a), tag(b));
        assert_eq!(tag(a), tag(a));
        let t = replace_script(a, &tag(a)).unwrap();
        assert_eq!(t.matches("comment \"lace-plan ").count(), 1);
        assert!(t.contains(&format!(
            "\t\telements = {{ \"digest\" comment \"{}\" }}",
            tag(a)
        )));
        assert!(replace_script("table ip other {\n}\n", "x").is_err());
    }

    fn ruleset(names: &[&str], rule: &str) -> Ruleset {
        let mut set = Set::new("names", "ifname", false, "names");
        for n in names {
            set.add(format!("\"{n}\""), None, "why");
        }
        let mut chain = Chain {
            name: "c".into(),
            hook: None,
            comment: "c".into(),
            rules: Vec::new(),
        };
        chain.rule(rule, "r");
        Ruleset {
            sets: vec![set],
            chains: vec![chain],
        }
    }

    #[test]
    fn only_a_known_table_with_an_element_change_is_updated() {
        let a = ruleset(&["lv-a"], "iifname @names accept");
        let b = ruleset(&["lv-a", "lv-b"], "iifname @names accept");
        let c = ruleset(&["lv-a"], "iifname @names drop");
        let (ra, rb, rc) = (a.render(), b.render(), c.render());
        let have = |r: &str| NftState::Present { tag: Some(tag(r)) };
        let known_a = KnownRuleset::after(None, Some(&a), Some(tag(&ra)));
        let known_a = known_a.as_ref();

        // The kernel holds the plan: nothing to do, known or not.
        assert_eq!(op(&b, &rb, &have(&rb), None).unwrap(), None);
        // The kernel holds the known ruleset, the plan adds an element: an update.
        let Some(Op::NftElements {
            script,
            tag: t,
            deleted: 0,
            added: 1,
        }) = op(&b, &rb, &have(&ra), known_a).unwrap()
        else {
            panic!("no element update");
        };
        assert_eq!(t, tag(&rb));
        assert!(!script.contains("table inet lace {") && !script.contains("delete table"));
        assert!(script.starts_with("flush set inet lace plan\n"));
        assert!(script.ends_with(&format!(
            "add element inet lace plan {{ \"digest\" comment \"{t}\" }}\n"
        )));
        assert!(script.contains("\t\"lv-b\" comment \"why\",\n"));
        // A rule change, an unknown table, a table without tag, no table: a full replace.
        let replaced = |o: Option<Op>| matches!(o, Some(Op::NftSwap { .. }));
        assert!(replaced(op(&c, &rc, &have(&ra), known_a).unwrap()));
        assert!(replaced(op(&b, &rb, &have(&ra), None).unwrap()));
        assert!(replaced(op(&b, &rb, &have(&rc), known_a).unwrap()));
        assert!(replaced(
            op(&b, &rb, &NftState::Present { tag: None }, known_a).unwrap()
        ));
        assert!(replaced(op(&b, &rb, &NftState::Absent, known_a).unwrap()));
    }

    #[test]
    fn what_is_known_follows_the_tag_the_kernel_carries_after_apply() {
        let a = ruleset(&["lv-a"], "iifname @names accept");
        let b = ruleset(&["lv-b"], "iifname @names accept");
        let (ta, tb) = (tag(&a.render()), tag(&b.render()));
        let swap = Op::NftSwap {
            script: String::new(),
            tag: tb.clone(),
        };
        let observed_a = NftState::Present {
            tag: Some(ta.clone()),
        };
        assert_eq!(tag_after(&[swap], &observed_a), Some(tb.clone()));
        assert_eq!(tag_after(&[], &observed_a), Some(ta.clone()));
        assert_eq!(tag_after(&[Op::NftDelete], &observed_a), None);
        assert_eq!(tag_after(&[], &NftState::Absent), None);

        let known_a = KnownRuleset::after(None, Some(&a), Some(ta.clone())).unwrap();
        assert_eq!(known_a.ruleset, a);
        // The same tag keeps what is known; another one learns the new ruleset.
        let same = KnownRuleset::after(Some(known_a.clone()), Some(&b), Some(ta)).unwrap();
        assert_eq!(same, known_a);
        let learnt =
            KnownRuleset::after(Some(known_a.clone()), Some(&b), Some(tb.clone())).unwrap();
        assert_eq!((learnt.ruleset, learnt.tag), (b.clone(), tb.clone()));
        // A teardown, or no table: nothing is known.
        assert_eq!(
            KnownRuleset::after(Some(known_a.clone()), None, Some(tb)),
            None
        );
        assert_eq!(KnownRuleset::after(Some(known_a), Some(&b), None), None);
    }
}
