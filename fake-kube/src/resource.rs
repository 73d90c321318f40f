//! What a request path or an object names: the resource (API group and plural), the
//! namespace, the object and the subresource, and the RBAC verb of a request. Plurals are
//! named the way the API server guesses them for kinds it has no explicit name for.

use http::Method;

/// A resource as the store keeps it: one per API group and plural, whatever the version
/// (a real API server also serves one resource under every version of its group).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Resource {
    /// Empty for the core group.
    pub group: String,
    pub plural: String,
}

impl Resource {
    /// The resource objects of `api_version` (`v1`, `lace.io/v1alpha1`) and `kind` live in.
    pub fn of(api_version: &str, kind: &str) -> Resource {
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        Resource {
            group: group.to_string(),
            plural: plural(kind),
        }
    }

    /// `plural[.group]`, the way RBAC rules and error messages name it.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// The plural of a kind as the API server guesses it (`UnsafeGuessKindToResource` in
/// k8s.io/apimachinery): lower case, then `+es` after an `s`, `y` → `ies`, otherwise `+s`. Every kind
/// Lace and its tests use is named so (`NetworkPolicy` → `networkpolicies`, `EndpointSlice`
/// → `endpointslices`).
pub fn plural(kind: &str) -> String {
    let lower = kind.to_lowercase();
    if lower.ends_with('s') {
        format!("{lower}es")
    } else if let Some(stem) = lower.strip_suffix('y') {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    }
}

/// What a request path names: `/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]` or
/// `/apis/GROUP/VERSION[/namespaces/NS]/PLURAL[/NAME[/SUB]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub resource: Resource,
    pub version: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl Target {
    /// `None` for a path that names no resource (discovery, `/version`, a typo).
    pub fn parse(path: &str) -> Option<Target> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        // `/api/v1/namespaces/NS` alone is the Namespace NS, not a namespaced collection.
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            _ => (None, rest),
        };
        let (plural, name, subresource) = match rest {
            [plural] => (*plural, None, None),
            [plural, name] => (*plural, Some(name.to_string()), None),
            [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        Some(Target {
            resource: Resource {
                group: group.to_string(),
                plural: plural.to_string(),
            },
            version: version.to_string(),
            namespace,
            name,
            subresource,
        })
    }

    /// The `apiVersion` of the objects under this path.
    pub fn api_version(&self) -> String {
        if self.resource.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.resource.group, self.version)
        }
    }

    /// The resource as RBAC names it: `plural` or `plural/subresource`.
    pub fn rbac_resource(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource.plural),
            None => self.resource.plural.clone(),
        }
    }

    /// The RBAC verb of a request with `method` on this path (`watch`: a GET of a
    /// collection with `watch=true`).
    pub fn verb(&self, method: &Method, watch: bool) -> String {
        let verb = match (method, &self.name) {
            (&Method::GET, None) if watch => "watch",
            (&Method::GET, None) => "list",
            (&Method::GET, Some(_)) => "get",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, None) => "deletecollection",
            (&Method::DELETE, Some(_)) => "delete",
            (other, _) => return other.as_str().to_lowercase(),
        };
        verb.to_string()
    }
}
