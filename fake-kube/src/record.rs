//! The requests the fake received, as the tests assert on them and as RBAC authorizes them.

use std::collections::BTreeMap;

use serde_json::Value;

/// One request as the fake received it.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    /// `GET`, `PATCH`, ...
    pub method: String,
    /// The path and query as sent (percent-encoded).
    pub uri: String,
    pub path: String,
    /// The query, percent-decoded.
    pub query: BTreeMap<String, String>,
    pub content_type: String,
    /// The JSON body; `Null` without one.
    pub body: Value,
    /// The RBAC verb: `get`, `list`, `watch`, `create`, `patch`, `delete`, ...
    pub verb: String,
    /// The API group (empty for the core group).
    pub group: String,
    /// The resource as RBAC names it: `plural` or `plural/subresource` (for a path that
    /// names no resource, the path).
    pub resource: String,
    /// A server-side apply that created the object: the API server then also authorizes
    /// `create` (k8s.io/apiserver, endpoints/handlers/patch.go).
    pub created: bool,
}

impl Recorded {
    /// `verb plural[.group][/subresource]` (`list pods`, `watch networks.lace.io`,
    /// `patch nodes/status`), the form RBAC rules are written in.
    pub fn rbac(&self) -> String {
        let (plural, sub) = match self.resource.split_once('/') {
            Some((plural, sub)) => (plural, format!("/{sub}")),
            None => (self.resource.as_str(), String::new()),
        };
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!(".{}", self.group)
        };
        format!("{} {plural}{group}{sub}", self.verb)
    }

    /// Every RBAC check the request passes: verb, API group, resource.
    pub fn authorized(&self) -> Vec<(String, String, String)> {
        let mut out = vec![(self.verb.clone(), self.group.clone(), self.resource.clone())];
        if self.created {
            out.push(("create".into(), self.group.clone(), self.resource.clone()));
        }
        out
    }

    /// Whether it is a write (anything but a GET).
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }

    /// `METHOD path`, and for applies `(apply, fieldManager=..., force=...)`.
    pub fn line(&self) -> String {
        let mut s = format!("{} {}", self.method, self.path);
        if self.content_type == crate::serve::APPLY {
            let param = |name: &str, default: &'static str| {
                self.query.get(name).cloned().unwrap_or(default.into())
            };
            s += &format!(
                " (apply, fieldManager={}, force={})",
                param("fieldManager", "-"),
                param("force", "false")
            );
        }
        s
    }
}
