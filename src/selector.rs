//! Kubernetes label-selector semantics for [`LabelSelector`].

use std::collections::BTreeMap;

use crate::api::{LabelSelector, SelectorOperator, SelectorRequirement};

impl LabelSelector {
    /// Whether `labels` satisfy this selector, exactly as Kubernetes evaluates it: every
    /// `matchLabels` pair AND every `matchExpressions` requirement must hold; the empty selector
    /// matches everything.
    ///
    /// Malformed requirements that the API server would reject (`In`/`NotIn` with no values)
    /// are evaluated literally rather than panicking: `In []` matches nothing, `NotIn []`
    /// matches everything.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|req| req.matches(labels))
    }

    /// Whether this is the empty selector (matches everything).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }
}

impl SelectorRequirement {
    /// Whether `labels` satisfy this one requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            SelectorOperator::In => value.is_some_and(|v| self.values.contains(v)),
            // As in Kubernetes, `NotIn` also matches objects that lack the key.
            SelectorOperator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, operator: SelectorOperator, values: &[&str]) -> SelectorRequirement {
        SelectorRequirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn selector_table() {
        use SelectorOperator::*;
        let app_web = labels(&[("app", "web"), ("tier", "front")]);
        let none = labels(&[]);
        let cases: Vec<(&str, LabelSelector, &BTreeMap<String, String>, bool)> = vec![
            (
                "empty matches labelled",
                LabelSelector::default(),
                &app_web,
                true,
            ),
            (
                "empty matches unlabelled",
                LabelSelector::default(),
                &none,
                true,
            ),
            (
                "matchLabels equal",
                LabelSelector {
                    match_labels: labels(&[("app", "web")]),
                    ..Default::default()
                },
                &app_web,
                true,
            ),
            (
                "matchLabels different value",
                LabelSelector {
                    match_labels: labels(&[("app", "db")]),
                    ..Default::default()
                },
                &app_web,
                false,
            ),
            (
                "matchLabels missing key",
                LabelSelector {
                    match_labels: labels(&[("app", "web")]),
                    ..Default::default()
                },
                &none,
                false,
            ),
            (
                "In hit",
                LabelSelector {
                    match_expressions: vec![req("app", In, &["db", "web"])],
                    ..Default::default()
                },
                &app_web,
                true,
            ),
            (
                "In missing key",
                LabelSelector {
                    match_expressions: vec![req("app", In, &["web"])],
                    ..Default::default()
                },
                &none,
                false,
            ),
            (
                "In with no values matches nothing",
                LabelSelector {
                    match_expressions: vec![req("app", In, &[])],
                    ..Default::default()
                },
                &app_web,
                false,
            ),
            (
                "NotIn hit",
                LabelSelector {
                    match_expressions: vec![req("app", NotIn, &["web"])],
                    ..Default::default()
                },
                &app_web,
                false,
            ),
            (
                "NotIn missing key matches",
                LabelSelector {
                    match_expressions: vec![req("app", NotIn, &["web"])],
                    ..Default::default()
                },
                &none,
                true,
            ),
            (
                "Exists",
                LabelSelector {
                    match_expressions: vec![req("tier", Exists, &[])],
                    ..Default::default()
                },
                &app_web,
                true,
            ),
            (
                "DoesNotExist",
                LabelSelector {
                    match_expressions: vec![req("tier", DoesNotExist, &[])],
                    ..Default::default()
                },
                &app_web,
                false,
            ),
            (
                "labels AND expressions: one fails",
                LabelSelector {
                    match_labels: labels(&[("app", "web")]),
                    match_expressions: vec![req("tier", In, &["back"])],
                },
                &app_web,
                false,
            ),
            (
                "labels AND expressions: both hold",
                LabelSelector {
                    match_labels: labels(&[("app", "web")]),
                    match_expressions: vec![req("tier", In, &["front"])],
                },
                &app_web,
                true,
            ),
        ];
        for (name, selector, labels, want) in cases {
            assert_eq!(selector.matches(labels), want, "case {name}");
        }
    }
}
