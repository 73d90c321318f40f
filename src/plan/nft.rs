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

/// The rule accepting packets of allowed connections and their related flows: ahead of the
/// policy in `from_vrfs` and `forward`, after what must see those packets too.
pub const ESTABLISHED: &str = "ct state established,related accept";

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

    /// `set` or `map`, as nft commands name it.
    fn kind(&self) -> &'static str {
        if self.value_type.is_some() {
            "map"
        } else {
            "set"
        }
    }

    /// The set's block inside `table inet lace { }`, with its elements.
    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "\t{} {} {{", self.kind(), self.name);
        let ty = match &self.value_type {
            Some(v) => format!("{} : {v}", self.key_type),
            None => self.key_type.clone(),
        };
        let _ = writeln!(out, "\t\ttype {ty}");
        if self.interval {
            let _ = writeln!(out, "\t\tflags interval");
        }
        let _ = writeln!(out, "\t\tcomment {}", quote(&self.comment));
        if !self.elements.is_empty() {
            let _ = writeln!(out, "\t\telements = {{");
            for (key, e) in &self.elements {
                let _ = writeln!(out, "\t\t\t{},", element_text(key, e));
            }
            let _ = writeln!(out, "\t\t}}");
        }
        let _ = writeln!(out, "\t}}");
    }
}

/// The changes that turn one ruleset into another with the same base chains: elements of the
/// sets and maps both declare alike (an element whose comment or value changed is deleted and
/// added again: nft cannot update one in place), sets and maps that come or go, regular chains
/// that come or go, and chains whose rules change (flushed and written again: NetworkPolicy's
/// chains when a policy changes). What stays the same is not touched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableChanges<'a> {
    /// (set name, key) of elements to delete.
    pub deleted: Vec<(&'a str, &'a str)>,
    /// (set name, key, element) of elements to add.
    pub added: Vec<(&'a str, &'a str, &'a Element)>,
    /// Sets and maps that go.
    pub removed_sets: Vec<&'a Set>,
    /// Sets and maps that come, with their elements.
    pub new_sets: Vec<&'a Set>,
    /// Regular chains that go.
    pub removed_chains: Vec<&'a str>,
    /// Regular chains that come, with their rules.
    pub new_chains: Vec<&'a Chain>,
    /// Chains (base chains included) whose rules change: their new version.
    pub rewritten: Vec<&'a Chain>,
}

impl TableChanges<'_> {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.elements_only() && self.deleted.is_empty() && self.added.is_empty()
    }

    /// Whether only elements change (no set, chain or rule).
    pub fn elements_only(&self) -> bool {
        self.removed_sets.is_empty()
            && self.new_sets.is_empty()
            && self.removed_chains.is_empty()
            && self.new_chains.is_empty()
            && self.rewritten.is_empty()
    }

    /// The names of the chains that come, go or are rewritten.
    pub fn chains(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.removed_chains.clone();
        names.extend(self.new_chains.iter().map(|c| c.name.as_str()));
        names.extend(self.rewritten.iter().map(|c| c.name.as_str()));
        names
    }

    /// `nft -f` commands for the changes, in the order one transaction needs them: the rules
    /// that change or go are flushed first (nothing then uses what goes), elements deleted
    /// (an element deleted and added again is then no duplicate), sets and chains that go
    /// deleted (a map's elements jumping to a chain go with the map), then what comes:
    /// sets, empty chains (a rule may jump to any of them), rules, elements. Run as one
    /// transaction with nothing else, they leave no moment where the table holds a mix of
    /// both rulesets.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in self
            .removed_chains
            .iter()
            .copied()
            .chain(self.rewritten.iter().map(|c| c.name.as_str()))
        {
            let _ = writeln!(out, "flush chain inet {TABLE} {c}");
        }
        let mut deleted = self.deleted.iter().peekable();
        while let Some((set, key)) = deleted.next() {
            let _ = writeln!(out, "delete element inet {TABLE} {set} {{");
            let _ = writeln!(out, "\t{key},");
            while let Some((_, key)) = deleted.next_if(|(s, _)| s == set) {
                let _ = writeln!(out, "\t{key},");
            }
            let _ = writeln!(out, "}}");
        }
        for s in &self.removed_sets {
            let _ = writeln!(out, "delete {} inet {TABLE} {}", s.kind(), s.name);
        }
        for c in &self.removed_chains {
            let _ = writeln!(out, "delete chain inet {TABLE} {c}");
        }
        if !(self.new_sets.is_empty() && self.new_chains.is_empty() && self.rewritten.is_empty()) {
            let _ = writeln!(out, "table inet {TABLE} {{");
            for s in &self.new_sets {
                s.render(&mut out);
            }
            for c in &self.new_chains {
                c.render(&mut out, true, false);
            }
            for c in self.new_chains.iter().chain(&self.rewritten) {
                c.render(&mut out, false, true);
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

impl Chain {
    /// The chain's block inside `table inet lace { }`: its declaration (comment, hook) and
    /// its rules, or only one of them (a block for an existing chain appends its rules).
    fn render(&self, out: &mut String, declaration: bool, rules: bool) {
        let _ = writeln!(out, "\tchain {} {{", self.name);
        if declaration {
            let _ = writeln!(out, "\t\tcomment {}", quote(&self.comment));
            if let Some(h) = &self.hook {
                let _ = writeln!(
                    out,
                    "\t\ttype {} hook {} priority {}; policy accept;",
                    h.kind, h.hook, h.priority
                );
            }
        }
        if rules {
            for r in &self.rules {
                let _ = writeln!(out, "\t\t{} comment {}", r.statement, quote(&r.comment));
            }
        }
        let _ = writeln!(out, "\t}}");
    }
}

impl Ruleset {
    /// The changes from `self` to `new`, or `None` when only a full replace can apply them: a
    /// base chain comes, goes or changes its hook, a chain its comment, or a set or map keeps
    /// its name with another declaration (rules that do not change would still use it).
    pub fn changes<'a>(&'a self, new: &'a Ruleset) -> Option<TableChanges<'a>> {
        let mut changes = TableChanges::default();
        let new_chains: BTreeMap<&str, &Chain> =
            new.chains.iter().map(|c| (c.name.as_str(), c)).collect();
        let old_chains: BTreeMap<&str, &Chain> =
            self.chains.iter().map(|c| (c.name.as_str(), c)).collect();
        for old in &self.chains {
            match new_chains.get(old.name.as_str()) {
                None if old.hook.is_some() => return None,
                None => changes.removed_chains.push(&old.name),
                Some(n) if n.hook != old.hook || n.comment != old.comment => return None,
                Some(n) if n.rules != old.rules => changes.rewritten.push(n),
                Some(_) => {}
            }
        }
        for n in &new.chains {
            if !old_chains.contains_key(n.name.as_str()) {
                if n.hook.is_some() {
                    return None;
                }
                changes.new_chains.push(n);
            }
        }
        let new_sets: BTreeMap<&str, &Set> =
            new.sets.iter().map(|s| (s.name.as_str(), s)).collect();
        let old_sets: BTreeMap<&str, &Set> =
            self.sets.iter().map(|s| (s.name.as_str(), s)).collect();
        for old in &self.sets {
            let Some(new) = new_sets.get(old.name.as_str()) else {
                changes.removed_sets.push(old);
                continue;
            };
            if !old.same_declaration(new) {
                return None;
            }
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
        changes.new_sets.extend(
            new.sets
                .iter()
                .filter(|s| !old_sets.contains_key(s.name.as_str())),
        );
        Some(changes)
    }

    /// [`Ruleset::changes`] when they are element changes only.
    pub fn element_changes<'a>(&'a self, new: &'a Ruleset) -> Option<TableChanges<'a>> {
        self.changes(new).filter(TableChanges::elements_only)
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
            s.render(&mut out);
        }
        for c in &self.chains {
            c.render(&mut out, true, true);
        }
        let _ = writeln!(out, "}}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A regular chain without rules, its comment its name.
    fn chain(name: &str) -> Chain {
        Chain {
            name: name.into(),
            hook: None,
            comment: name.into(),
            rules: Vec::new(),
        }
    }

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
        let mut chain = chain("c");
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
    fn rules_sets_and_chains_changing_are_more_than_element_changes() {
        let a = ruleset(&[(P1, "accept", "x")], &[]);
        let mut b = a.clone();
        b.chains[0].rules[0].comment = "other".into();
        assert_eq!(a.element_changes(&b), None);
        let c = a.changes(&b).unwrap();
        assert_eq!(c.chains(), ["c"]);
        assert!(c.deleted.is_empty() && c.added.is_empty() && c.new_sets.is_empty());
        let mut b = a.clone();
        b.sets.pop();
        assert_eq!(a.element_changes(&b), None);
        assert_eq!(a.changes(&b).unwrap().removed_sets, [&a.sets[1]]);
        // The order of the declarations is not a change.
        let mut b = a.clone();
        b.sets.swap(0, 1);
        assert!(a.changes(&b).unwrap().is_empty());
    }

    /// A hooked chain named `name` with one rule.
    fn base_chain(name: &str, hook: &'static str) -> Chain {
        let mut c = Chain {
            hook: Some(Hook {
                kind: "filter",
                hook,
                priority: "filter",
            }),
            ..chain(name)
        };
        c.rule("jump c", "to c");
        c
    }

    #[test]
    fn only_base_chains_and_declarations_changing_need_a_full_replace() {
        let mut a = ruleset(&[(P1, "accept", "x")], &[]);
        a.chains.push(base_chain("forward", "forward"));
        let replace = |b: &Ruleset| a.changes(b).is_none();
        let mut b = a.clone();
        b.chains.push(base_chain("input", "input"));
        assert!(replace(&b), "a base chain comes");
        let mut b = a.clone();
        b.chains.pop();
        assert!(replace(&b), "a base chain goes");
        let mut b = a.clone();
        b.chains[1].hook.as_mut().unwrap().hook = "output";
        assert!(replace(&b), "a hook changes");
        let mut b = a.clone();
        b.chains[0].comment = "other".into();
        assert!(replace(&b), "a chain's comment changes");
        let mut b = a.clone();
        b.sets[1].interval = true;
        assert!(replace(&b), "a set is declared anew under its name");
        // A base chain's rules changing is a rewrite of that chain.
        let mut b = a.clone();
        b.chains[1].rule("accept", "more");
        assert_eq!(a.changes(&b).unwrap().chains(), ["forward"]);
    }

    #[test]
    fn a_transaction_flushes_and_deletes_first_then_declares_then_writes_rules_and_elements() {
        let a = ruleset(
            &[(P1, "accept", "x"), (P2, "accept", "y")],
            &[("lv-a", "A")],
        );
        let mut b = a.clone();
        // c jumps to a new chain d using a new set; the pairs map loses P2; names goes.
        b.sets.pop();
        b.sets[0].elements.remove(P2);
        let mut extra = Set::new("extra", "ipv4_addr", false, "extra");
        extra.add("10.9.9.9".into(), None, "why");
        b.sets.push(extra);
        b.chains[0].rules.clear();
        b.chains[0].rule("ip saddr . ip daddr vmap @pairs", "r");
        b.chains[0].rule("jump d", "to d");
        let mut d = chain("d");
        d.rule("ip daddr @extra accept", "extra");
        b.chains.push(d);
        let c = a.changes(&b).unwrap();
        assert_eq!(c.chains(), ["d", "c"]);
        assert_eq!((c.new_sets.len(), c.removed_sets.len()), (1, 1));
        let text = c.render();
        let heads: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("\t\t") && *l != "}" && *l != "\t}")
            .collect();
        assert_eq!(
            heads,
            [
                "flush chain inet lace c",
                "delete element inet lace pairs {",
                "\t10.3.0.0/16 . 10.4.0.0/16,",
                "delete set inet lace names",
                "table inet lace {",
                "\tset extra {",
                "\tchain d {",
                "\tchain d {",
                "\tchain c {",
            ],
            "{text}"
        );
        assert!(
            text.contains("\tchain d {\n\t\tcomment \"d\"\n\t}\n"),
            "{text}"
        );
        assert!(text.contains("\t\tjump d comment \"to d\"\n"));
        // Back again: d is flushed and deleted after its rules go, extra with it.
        let back = b.changes(&a).unwrap();
        let text = back.render();
        let flush = text.find("flush chain inet lace d").unwrap();
        let delete = text.find("delete chain inet lace d").unwrap();
        let set = text.find("delete set inet lace extra").unwrap();
        assert!(flush < set && set < delete, "{text}");
        assert!(text.contains("add element inet lace pairs {"));
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
