//! The nftables ruleset of table `inet lace` as structured data, rendered to `nft -f` text.
//!
//! Rules stay few and fixed; what grows with the cluster (Network pairs, Service grants,
//! backends, node addresses) lives in named sets and verdict maps, so thousands of Networks or
//! Services add elements, not rules. Every rule and every element carries a comment naming the
//! policy (or the reason) behind it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Name of Lace's one nftables table (family `inet`).
pub const TABLE: &str = "lace";

/// One element of a set or map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Element {
    /// For maps: the value (for verdict maps the verdict: `accept`, `drop`, `jump x`).
    pub value: Option<String>,
    /// Why the element exists: the policies (sorted, comma-separated) or the object behind it.
    pub comment: String,
}

/// A named set, or a map when `value_type` is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    pub name: String,
    /// nft key type, e.g. `ipv4_addr . ipv4_addr`.
    pub key_type: String,
    /// Maps the key to a value of this type (`type K : V`; `verdict` for a verdict map).
    pub value_type: Option<String>,
    /// Keys contain prefixes (`flags interval`).
    pub interval: bool,
    pub comment: String,
    /// Keyed by the element's nft text, so the output is sorted and duplicates merge.
    pub elements: BTreeMap<String, Element>,
}

impl Set {
    /// An empty set.
    pub fn new(name: &str, key_type: &str, interval: bool, comment: &str) -> Self {
        Self {
            name: name.into(),
            key_type: key_type.into(),
            value_type: None,
            interval,
            comment: comment.into(),
            elements: BTreeMap::new(),
        }
    }

    /// An empty verdict map.
    pub fn new_vmap(name: &str, key_type: &str, interval: bool, comment: &str) -> Self {
        Self::new_map(name, key_type, "verdict", interval, comment)
    }

    /// An empty map from `key_type` to `value_type`.
    pub fn new_map(
        name: &str,
        key_type: &str,
        value_type: &str,
        interval: bool,
        comment: &str,
    ) -> Self {
        Self {
            value_type: Some(value_type.into()),
            ..Self::new(name, key_type, interval, comment)
        }
    }

    /// Adds `key` (nft syntax) for `reason`, with `value` in a map; a key added again
    /// collects the extra reason.
    pub fn add(&mut self, key: String, value: Option<&str>, reason: &str) {
        let e = self.elements.entry(key).or_default();
        e.value = value.map(str::to_string);
        if !e.comment.split(", ").any(|c| c == reason) {
            if !e.comment.is_empty() {
                e.comment.push_str(", ");
            }
            e.comment.push_str(reason);
        }
    }
}

/// The hook of a base chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    /// `filter` or `nat`.
    pub kind: &'static str,
    /// `prerouting`, `forward`, `output`, `postrouting`.
    pub hook: &'static str,
    /// nft priority expression, e.g. `dstnat + 10`.
    pub priority: &'static str,
}

/// One rule: the nft statement text and why it exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub statement: String,
    pub comment: String,
}

/// A chain; base chains have a hook and policy `accept` (Lace only ever drops what it owns:
/// traffic from, to or between pods, and SRv6 towards this node's SIDs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub hook: Option<Hook>,
    pub comment: String,
    pub rules: Vec<Rule>,
}

impl Chain {
    /// Appends a rule.
    pub fn rule(&mut self, statement: impl Into<String>, comment: impl Into<String>) {
        self.rules.push(Rule {
            statement: statement.into(),
            comment: comment.into(),
        });
    }
}

/// The whole `inet lace` table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub sets: Vec<Set>,
    pub chains: Vec<Chain>,
}

/// The longest comment nft accepts (bytes).
pub const COMMENT_MAX: usize = 128;

/// Quotes a comment for nft (which has no escape for `"`), cut to [`COMMENT_MAX`] bytes with
/// `...` at the end: nft refuses a whole ruleset over one longer comment, and object names
/// (a NetworkPolicy's namespace and name, lists of policies) can be longer.
fn quote(s: &str) -> String {
    let s = s.replace('"', "'");
    if s.len() <= COMMENT_MAX {
        return format!("\"{s}\"");
    }
    let mut end = COMMENT_MAX - 3;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("\"{}...\"", &s[..end])
}

/// One element as nft writes it inside `{ }`: key, comment and (maps) value.
fn element_text(key: &str, e: &Element) -> String {
    match &e.value {
        Some(v) => format!("{key} comment {} : {v}", quote(&e.comment)),
        None => format!("{key} comment {}", quote(&e.comment)),
    }
}

impl Set {
    /// Whether `other` is declared the same (name, types, flags, comment), elements aside.
    fn same_declaration(&self, other: &Set) -> bool {
        self.name == other.name
            && self.key_type == other.key_type
            && self.value_type == other.value_type
            && self.interval == other.interval
            && self.comment == other.comment
    }
}

/// The element changes that turn one ruleset into another of the same shape (same chains and
/// rules, same set declarations): what to delete and what to add, by set. An element whose
/// comment or value changed is deleted and added again: nft cannot update one in place.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElementChanges<'a> {
    /// (set name, key) of elements to delete.
    pub deleted: Vec<(&'a str, &'a str)>,
    /// (set name, key, element) of elements to add.
    pub added: Vec<(&'a str, &'a str, &'a Element)>,
}

impl ElementChanges<'_> {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.deleted.is_empty() && self.added.is_empty()
    }

    /// `nft -f` commands for the changes: all deletions first (so an element deleted and
    /// added again is not a duplicate), one command per set. Run as one transaction with
    /// nothing else, they leave no moment where the table holds a mix of both rulesets.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut deleted = self.deleted.iter().peekable();
        while let Some((set, key)) = deleted.next() {
            let _ = writeln!(out, "delete element inet {TABLE} {set} {{");
            let _ = writeln!(out, "\t{key},");
            while let Some((_, key)) = deleted.next_if(|(s, _)| s == set) {
                let _ = writeln!(out, "\t{key},");
            }
            let _ = writeln!(out, "}}");
        }
        let mut added = self.added.iter().peekable();
        while let Some((set, key, e)) = added.next() {
            let _ = writeln!(out, "add element inet {TABLE} {set} {{");
            let _ = writeln!(out, "\t{},", element_text(key, e));
            while let Some((_, key, e)) = added.next_if(|(s, _, _)| s == set) {
                let _ = writeln!(out, "\t{},", element_text(key, e));
            }
            let _ = writeln!(out, "}}");
        }
        out
    }
}

impl Ruleset {
    /// The element changes from `self` to `new`, or `None` when they differ in more than
    /// elements (a chain, a rule or a set declaration), which only a full replace can apply.
    pub fn element_changes<'a>(&'a self, new: &'a Ruleset) -> Option<ElementChanges<'a>> {
        if self.chains != new.chains
            || self.sets.len() != new.sets.len()
            || !self
                .sets
                .iter()
                .zip(&new.sets)
                .all(|(a, b)| a.same_declaration(b))
        {
            return None;
        }
        let mut changes = ElementChanges::default();
        for (old, new) in self.sets.iter().zip(&new.sets) {
            let set = new.name.as_str();
            for (key, e) in &old.elements {
                if new.elements.get(key) != Some(e) {
                    changes.deleted.push((set, key));
                }
            }
            for (key, e) in &new.elements {
                if old.elements.get(key) != Some(e) {
                    changes.added.push((set, key, e));
                }
            }
        }
        Some(changes)
    }

    /// The set or map called `name`.
    pub fn set(&self, name: &str) -> Option<&Set> {
        self.sets.iter().find(|s| s.name == name)
    }

    /// The chain called `name`.
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }

    /// `nft -f` text. The leading `table` + `delete table` make it an atomic replace of
    /// whatever table `inet lace` held before (one transaction, no window without policy).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Lace ruleset: table inet {TABLE}. Generated, do not edit."
        );
        let _ = writeln!(out, "table inet {TABLE}");
        let _ = writeln!(out, "delete table inet {TABLE}");
        let _ = writeln!(out, "table inet {TABLE} {{");
        for s in &self.sets {
            let kind = if s.value_type.is_some() { "map" } else { "set" };
            let _ = writeln!(out, "\t{kind} {} {{", s.name);
            let ty = match &s.value_type {
                Some(v) => format!("{} : {v}", s.key_type),
                None => s.key_type.clone(),
            };
            let _ = writeln!(out, "\t\ttype {ty}");
            if s.interval {
                let _ = writeln!(out, "\t\tflags interval");
            }
            let _ = writeln!(out, "\t\tcomment {}", quote(&s.comment));
            if !s.elements.is_empty() {
                let _ = writeln!(out, "\t\telements = {{");
                for (key, e) in &s.elements {
                    let _ = writeln!(out, "\t\t\t{},", element_text(key, e));
                }
                let _ = writeln!(out, "\t\t}}");
            }
            let _ = writeln!(out, "\t}}");
        }
        for c in &self.chains {
            let _ = writeln!(out, "\tchain {} {{", c.name);
            let _ = writeln!(out, "\t\tcomment {}", quote(&c.comment));
            if let Some(h) = &c.hook {
                let _ = writeln!(
                    out,
                    "\t\ttype {} hook {} priority {}; policy accept;",
                    h.kind, h.hook, h.priority
                );
            }
            for r in &c.rules {
                let _ = writeln!(out, "\t\t{} comment {}", r.statement, quote(&r.comment));
            }
            let _ = writeln!(out, "\t}}");
        }
        let _ = writeln!(out, "}}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A map of pairs, a set of names and one chain using both.
    fn ruleset(pairs: &[(&str, &str, &str)], names: &[(&str, &str)]) -> Ruleset {
        let mut map = Set::new_vmap("pairs", "ipv4_addr . ipv4_addr", true, "pairs");
        for (k, v, why) in pairs {
            map.add((*k).into(), Some(v), why);
        }
        let mut set = Set::new("names", "ifname", false, "names");
        for (k, why) in names {
            set.add(format!("\"{k}\""), None, why);
        }
        let mut chain = Chain {
            name: "c".into(),
            hook: None,
            comment: "c".into(),
            rules: Vec::new(),
        };
        chain.rule("iifname @names ip saddr . ip daddr vmap @pairs", "r");
        Ruleset {
            sets: vec![map, set],
            chains: vec![chain],
        }
    }

    const P1: &str = "10.1.0.0/16 . 10.2.0.0/16";
    const P2: &str = "10.3.0.0/16 . 10.4.0.0/16";

    #[test]
    fn element_changes_delete_the_gone_add_the_new_and_replace_the_changed() {
        let a = ruleset(
            &[(P1, "accept", "x"), (P2, "accept", "y")],
            &[("lv-a", "A")],
        );
        let b = ruleset(&[(P1, "drop", "x")], &[("lv-a", "A2"), ("lv-b", "B")]);
        let c = a.element_changes(&b).unwrap();
        assert_eq!(
            c.deleted,
            vec![("pairs", P1), ("pairs", P2), ("names", "\"lv-a\"")]
        );
        let added: Vec<(&str, &str, Option<&str>, &str)> = c
            .added
            .iter()
            .map(|(s, k, e)| (*s, *k, e.value.as_deref(), e.comment.as_str()))
            .collect();
        assert_eq!(
            added,
            vec![
                ("pairs", P1, Some("drop"), "x"),
                ("names", "\"lv-a\"", None, "A2"),
                ("names", "\"lv-b\"", None, "B"),
            ]
        );
        let text = c.render();
        // Deletions before additions, one command per set, nothing but element commands.
        assert_eq!(
            text.lines()
                .filter(|l| !l.starts_with('\t') && *l != "}")
                .collect::<Vec<_>>(),
            vec![
                "delete element inet lace pairs {",
                "delete element inet lace names {",
                "add element inet lace pairs {",
                "add element inet lace names {",
            ]
        );
        assert!(text.contains("\t10.1.0.0/16 . 10.2.0.0/16 comment \"x\" : drop,\n"));
        assert!(a.element_changes(&a).unwrap().is_empty());
        assert!(b.element_changes(&a).unwrap().deleted.len() == 3);
    }

    #[test]
    fn anything_but_elements_changing_needs_a_full_replace() {
        let a = ruleset(&[(P1, "accept", "x")], &[]);
        let mut b = a.clone();
        b.chains[0].rules[0].comment = "other".into();
        assert_eq!(a.element_changes(&b), None);
        let mut b = a.clone();
        b.sets[1].comment = "other".into();
        assert_eq!(a.element_changes(&b), None);
        let mut b = a.clone();
        b.sets.swap(0, 1);
        assert_eq!(a.element_changes(&b), None);
        let mut b = a.clone();
        b.sets.pop();
        assert_eq!(a.element_changes(&b), None);
    }

    #[test]
    fn comments_are_cut_to_what_nft_accepts() {
        assert_eq!(quote("a \"b\""), "\"a 'b'\"");
        let long = format!("NetworkPolicy {}/{}", "n".repeat(63), "é".repeat(100));
        let q = quote(&long);
        // 127 bytes inside the quotes: the cut does not split a two-byte character.
        assert_eq!(q.len(), COMMENT_MAX + 1, "{q}");
        assert!(q.ends_with("...\""));
        assert_eq!(quote(&"x".repeat(COMMENT_MAX)).len(), COMMENT_MAX + 2);
    }

    #[test]
    fn rendering_lists_each_element_with_its_comment_and_verdict() {
        let a = ruleset(&[(P1, "accept", "x")], &[("lv-a", "A")]);
        let text = a.render();
        assert!(text.contains("\t\t\t10.1.0.0/16 . 10.2.0.0/16 comment \"x\" : accept,\n"));
        assert!(text.contains("\t\t\t\"lv-a\" comment \"A\",\n"));
    }
}
