//! Errors the controller cannot work around: it stops with one of these, naming the fix.

use lace::objects::Kind;

/// A condition the controller cannot recover from by retrying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FatalError {
    /// A lace.io kind is not served: its CRD is missing.
    #[error("the CustomResourceDefinition {crd} is not installed (list {path}: 404 Not Found): install the lace.io CRDs with the lace-cni chart (they are templated, so helm install and helm upgrade apply them), or run `lace-agent crds | kubectl apply -f -`")]
    CrdMissing { crd: String, path: String },
    /// RBAC denies a request the controller makes.
    #[error("RBAC denied {verb} on {resource} (API group {group}): {message}; the controller's ClusterRole lace-controller (chart/templates/rbac.yaml) must grant it: helm upgrade the lace-cni chart, or add the rule")]
    Forbidden {
        verb: &'static str,
        /// `plural` or `plural/subresource`.
        resource: String,
        /// `core` for the core group.
        group: String,
        message: String,
    },
    /// The credentials are rejected.
    #[error("the API server rejected the controller's credentials (401 Unauthorized): {message}; check the ServiceAccount token mounted into the pod")]
    Unauthorized { message: String },
}

/// An API resource a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource<'a> {
    /// Empty for the core group.
    pub group: &'a str,
    pub version: &'a str,
    pub plural: &'a str,
    pub subresource: Option<&'a str>,
}

impl Resource<'static> {
    /// The resource of `kind`, or of its `subresource`.
    pub fn of(kind: Kind, subresource: Option<&'static str>) -> Self {
        Self {
            group: kind.group(),
            version: kind.version(),
            plural: kind.plural(),
            subresource,
        }
    }

    /// `events.k8s.io/v1` Events (kube-runtime's recorder).
    pub const EVENTS: Resource<'static> = Resource {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        subresource: None,
    };
}

/// The fatal error behind a failed request, if it is one: `verb` on `resource` answered
/// `err`.
pub fn classify(
    verb: &'static str,
    resource: Resource<'_>,
    err: &kube::Error,
) -> Option<FatalError> {
    let kube::Error::Api(status) = err else {
        return None;
    };
    match status.code {
        401 => Some(FatalError::Unauthorized {
            message: status.message.clone(),
        }),
        403 => Some(FatalError::Forbidden {
            verb,
            resource: match resource.subresource {
                Some(sub) => format!("{}/{sub}", resource.plural),
                None => resource.plural.to_string(),
            },
            group: match resource.group {
                "" => "core".to_string(),
                g => g.to_string(),
            },
            message: status.message.clone(),
        }),
        404 if verb == "list" && resource.group == lace::api::GROUP => {
            Some(FatalError::CrdMissing {
                crd: format!("{}.{}", resource.plural, resource.group),
                path: format!(
                    "/apis/{}/{}/{}",
                    resource.group, resource.version, resource.plural
                ),
            })
        }
        _ => None,
    }
}
