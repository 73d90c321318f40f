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
    /// For verdict maps: the verdict (`accept`, `drop`, `jump x`).
    pub verdict: Option<String>,
    /// Why the element exists: the policies (sorted, comma-separated) or the object behind it.
    pub comment: String,
}

/// A named set, or a verdict map when `verdict_map` is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    pub name: String,
    /// nft key type, e.g. `ipv4_addr . ipv4_addr`.
    pub key_type: String,
    /// Maps the key to a verdict (`type K : verdict`).
    pub verdict_map: bool,
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
            verdict_map: false,
            interval,
            comment: comment.into(),
            elements: BTreeMap::new(),
        }
    }

    /// An empty verdict map.
    pub fn new_vmap(name: &str, key_type: &str, interval: bool, comment: &str) -> Self {
        Self {
            verdict_map: true,
            ..Self::new(name, key_type, interval, comment)
        }
    }

    /// Adds `key` (nft syntax) for `reason`; a key added again collects the extra reason.
    pub fn add(&mut self, key: String, verdict: Option<&str>, reason: &str) {
        let e = self.elements.entry(key).or_default();
        e.verdict = verdict.map(str::to_string);
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

/// Quotes a comment for nft (which has no escape for `"`).
fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "'"))
}

impl Ruleset {
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
            let kind = if s.verdict_map { "map" } else { "set" };
            let _ = writeln!(out, "\t{kind} {} {{", s.name);
            let ty = if s.verdict_map {
                format!("{} : verdict", s.key_type)
            } else {
                s.key_type.clone()
            };
            let _ = writeln!(out, "\t\ttype {ty}");
            if s.interval {
                let _ = writeln!(out, "\t\tflags interval");
            }
            let _ = writeln!(out, "\t\tcomment {}", quote(&s.comment));
            if !s.elements.is_empty() {
                let _ = writeln!(out, "\t\telements = {{");
                for (key, e) in &s.elements {
                    let verdict = e
                        .verdict
                        .as_deref()
                        .map(|v| format!(" : {v}"))
                        .unwrap_or_default();
                    let _ = writeln!(out, "\t\t\t{key} comment {}{verdict},", quote(&e.comment));
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
