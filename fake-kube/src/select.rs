//! The query of a request, percent-decoded, and the namespace, field and label selectors of
//! a list or watch.

use std::collections::BTreeMap;

use serde_json::Value;

/// `?a=b&c=d` as a map, percent-decoded (`+` is a space, as in a form).
pub(crate) fn query(uri: &http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Which objects a list or watch wants: those in `namespace` (all without one) matching
/// every field (`a.b=v`, `a.b==v`) and label (`k=v`, `k!=v`, `k`, `!k`) requirement.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filter {
    namespace: Option<String>,
    fields: Vec<(String, String)>,
    /// Key, value (`None`: only whether the label exists), whether it must match.
    labels: Vec<(String, Option<String>, bool)>,
}

impl Filter {
    pub fn new(namespace: Option<String>, query: &BTreeMap<String, String>) -> Filter {
        let mut f = Filter {
            namespace,
            ..Filter::default()
        };
        let terms = |key: &str| {
            query
                .get(key)
                .into_iter()
                .flat_map(|s| s.split(','))
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        for term in terms("fieldSelector") {
            if let Some((k, v)) = term.split_once('=') {
                f.fields
                    .push((k.to_string(), v.trim_start_matches('=').to_string()));
            }
        }
        for term in terms("labelSelector") {
            let label = if let Some(key) = term.strip_prefix('!') {
                (key.to_string(), None, false)
            } else if let Some((k, v)) = term.split_once("!=") {
                (k.to_string(), Some(v.to_string()), false)
            } else if let Some((k, v)) = term.split_once('=') {
                (
                    k.to_string(),
                    Some(v.trim_start_matches('=').to_string()),
                    true,
                )
            } else {
                (term, None, true)
            };
            f.labels.push(label);
        }
        f
    }

    pub fn matches(&self, object: &Value) -> bool {
        let meta = &object["metadata"];
        if let Some(ns) = &self.namespace {
            if meta["namespace"].as_str() != Some(ns) {
                return false;
            }
        }
        let fields_match = self.fields.iter().all(|(path, want)| {
            let pointer = format!("/{}", path.replace('.', "/"));
            object
                .pointer(&pointer)
                .and_then(Value::as_str)
                .unwrap_or("")
                == want
        });
        let labels_match = self.labels.iter().all(|(key, value, positive)| {
            let have = meta["labels"].get(key).and_then(Value::as_str);
            let found = match value {
                None => have.is_some(),
                Some(v) => have == Some(v.as_str()),
            };
            found == *positive
        });
        fields_match && labels_match
    }
}
