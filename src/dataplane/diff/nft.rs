//! The nft table's part of the diff: which ruleset the kernel's table holds (the plan tag),
//! which transaction gets a new ruleset there (a full replace of the table, or only the
//! elements that changed) and what the reconciler remembers in between. Pure: reading the tag
//! and running the transaction are the kernel half's (`dataplane::nft`).
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
//! ruleset's and the new ruleset has the same base chains, one transaction changes the table
//! in place ([`Ruleset::changes`]): the elements that differ, the sets and regular chains that
//! come or go, the rules of the chains that change (flushed and written again), and the tag
//! element. Both are one `nft -f` run, hence atomic: a packet sees the old ruleset or the new
//! one, never a mix and never no table. Checking the kernel's tag first makes the memory
//! safe: a table whose tag is not the remembered one (someone re-tagged it, or it predates a
//! restart) is replaced, or left alone when its tag is already the plan's.
//!
//! [`Reconciler`]: crate::dataplane::Reconciler

use crate::dataplane::observed::NftState;
use crate::dataplane::op::{Op, Update};
use crate::hash::fnv1a64;
use crate::plan::nft::{Ruleset, TABLE};

/// Prefix of the plan tag: `lace-plan <digest>`.
pub const TAG_PREFIX: &str = "lace-plan ";

/// The set whose one element carries the plan tag as its comment.
pub const TAG_SET: &str = "plan";

/// The key of the tag element (the set's type is `ifname`: a short readable string).
const TAG_KEY: &str = "\"digest\"";

/// The table's comment: only for humans reading `nft list table`; the tag is in [`TAG_SET`].
const TABLE_COMMENT: &str = "Lace (lace-agent); the plan tag is the element of set plan";

/// The tag identifying a rendered ruleset: FNV-1a, stable across builds and Rust versions
/// (unlike `DefaultHasher`), so a restarted agent recognizes the table an earlier one wrote.
pub fn tag(rendered: &str) -> String {
    format!("{TAG_PREFIX}{:016x}", fnv1a64(rendered.bytes()))
}

/// A ruleset's `nft -f` text and its [`tag`], made together off the reconcile's path (at
/// 5,000 nodes the text is megabytes, and the tag a pass over every byte).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub tag: String,
}

impl Rendered {
    pub fn of(text: String) -> Self {
        let tag = tag(&text);
        Self { text, tag }
    }
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

/// The transaction that turns the kernel's `from` into `to` without replacing the table
/// ([`Ruleset::changes`]), `None` when only a replace can. Returns the script and what it
/// changes.
pub fn update_script(from: &Ruleset, to: &Ruleset, tag: &str) -> Option<(String, Update)> {
    let changes = from.changes(to)?;
    // `flush` rather than `delete element`: the transaction does not depend on the old tag
    // element still being there.
    let script = format!(
        "flush set inet {TABLE} {TAG_SET}\n{}add element inet {TABLE} {TAG_SET} {{ {} }}\n",
        changes.render(),
        tag_element(tag)
    );
    let update = Update {
        deleted: changes.deleted.len(),
        added: changes.added.len(),
        chains: changes.chains().into_iter().map(str::to_string).collect(),
        sets_added: changes.new_sets.len(),
        sets_removed: changes.removed_sets.len(),
    };
    Some((script, update))
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
    /// `tag_after`) and, when a plan was applied, that tag is the plan's.
    pub fn after(
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
            Op::NftSwap { tag, .. } | Op::NftUpdate { tag, .. } => return Some(tag.clone()),
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
    rendered: &Rendered,
    observed: &NftState,
    known: Option<&KnownRuleset>,
) -> Result<Option<Op>, UntaggableRuleset> {
    let Rendered {
        text: rendered,
        tag,
    } = rendered;
    let tag = tag.clone();
    let NftState::Present { tag: Some(have) } = observed else {
        return replace(rendered, tag).map(Some);
    };
    if *have == tag {
        return Ok(None);
    }
    if let Some(k) = known.filter(|k| k.tag == *have) {
        if let Some((script, update)) = update_script(&k.ruleset, desired, &tag) {
            return Ok(Some(Op::NftUpdate {
                script,
                tag,
                update,
            }));
        }
    }
    replace(rendered, tag).map(Some)
}

fn replace(rendered: &str, tag: String) -> Result<Op, UntaggableRuleset> {
    let script = replace_script(rendered, &tag)?;
    Ok(Op::NftSwap { script, tag })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::nft::{Chain, Set};

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
    fn only_a_known_table_is_updated_in_place() {
        let a = ruleset(&["lv-a"], "iifname @names accept");
        let b = ruleset(&["lv-a", "lv-b"], "iifname @names accept");
        let c = ruleset(&["lv-a"], "iifname @names drop");
        let (ra, rb, rc) = (a.render(), b.render(), c.render());
        let have = |r: &str| NftState::Present { tag: Some(tag(r)) };
        let known_a = KnownRuleset::after(None, Some(&a), Some(tag(&ra)));
        let known_a = known_a.as_ref();

        // The kernel holds the plan: nothing to do, known or not.
        assert_eq!(
            op(&b, &Rendered::of(rb.clone()), &have(&rb), None).unwrap(),
            None
        );
        // The kernel holds the known ruleset, the plan adds an element: an update.
        let Some(Op::NftUpdate {
            script,
            tag: t,
            update,
        }) = op(&b, &Rendered::of(rb.clone()), &have(&ra), known_a).unwrap()
        else {
            panic!("no element update");
        };
        assert_eq!((update.deleted, update.added), (0, 1));
        assert!(update.chains.is_empty());
        assert_eq!(t, tag(&rb));
        assert!(!script.contains("table inet lace {") && !script.contains("delete table"));
        assert!(script.starts_with("flush set inet lace plan\n"));
        assert!(script.ends_with(&format!(
            "add element inet lace plan {{ \"digest\" comment \"{t}\" }}\n"
        )));
        assert!(script.contains("\t\"lv-b\" comment \"why\",\n"));
        // A rule change of a regular chain: that chain written again, in place.
        let Some(Op::NftUpdate { script, update, .. }) =
            op(&c, &Rendered::of(rc.clone()), &have(&ra), known_a).unwrap()
        else {
            panic!("no update in place");
        };
        assert_eq!(
            (update.chains, update.deleted, update.added),
            (vec!["c".to_string()], 0, 0)
        );
        assert!(script.contains("flush chain inet lace c\n"), "{script}");
        assert!(
            script.contains("\t\tiifname @names drop comment \"r\"\n"),
            "{script}"
        );
        // An unknown table, a table without tag, no table: a full replace.
        let replaced = |o: Option<Op>| matches!(o, Some(Op::NftSwap { .. }));
        assert!(replaced(
            op(&b, &Rendered::of(rb.clone()), &have(&ra), None).unwrap()
        ));
        assert!(replaced(
            op(&b, &Rendered::of(rb.clone()), &have(&rc), known_a).unwrap()
        ));
        assert!(replaced(
            op(
                &b,
                &Rendered::of(rb.clone()),
                &NftState::Present { tag: None },
                known_a
            )
            .unwrap()
        ));
        assert!(replaced(
            op(&b, &Rendered::of(rb.clone()), &NftState::Absent, known_a).unwrap()
        ));
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
