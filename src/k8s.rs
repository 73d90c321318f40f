//! The objects Lace reads, as kube resources: [`Slim`] wraps a kind's body of
//! [`crate::objects`] with the object's metadata, so the Kubernetes watches deserialize only
//! the fields Lace reads and hand them to the same conversion the YAML loader uses.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicResourceScope;
use kube::Resource;
use serde::Deserialize;

use crate::objects::{Body, Meta, Object, ObjectError};

/// An object of body `B` as the API server sends it: `metadata` and the body's fields.
#[derive(Clone, Debug, Deserialize)]
pub struct Slim<B> {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(flatten)]
    pub body: B,
}

/// What Lace reads of `metadata`.
pub fn meta_of(m: &ObjectMeta) -> Meta {
    Meta {
        name: m.name.clone().unwrap_or_default(),
        namespace: m.namespace.clone().unwrap_or_default(),
        labels: m.labels.clone().unwrap_or_default(),
    }
}

impl<B: Body> Slim<B> {
    /// The object for the cluster state; `Ok(None)` for one Lace ignores. The error names the
    /// field (see [`Body::into_object`]).
    pub fn into_object(self) -> Result<Option<Object>, ObjectError> {
        let meta = meta_of(&self.metadata);
        self.body.into_object(meta)
    }
}

/// Every slim kind is watched cluster-wide (`Api::all`), namespaced or not, so the scope is
/// the dynamic one; group, version, kind and plural come from the body's [`Body::KIND`].
impl<B: Body> Resource for Slim<B> {
    type DynamicType = ();
    type Scope = DynamicResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        B::KIND.name().into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        B::KIND.group().into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        B::KIND.version().into()
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        B::KIND.api_version().into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        B::KIND.plural().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{BodyVisitor, Kind, NodeBody, PodBody};

    #[test]
    fn slim_resources_have_the_api_paths_of_their_kinds() {
        assert_eq!(Slim::<PodBody>::url_path(&(), None), "/api/v1/pods");
        assert_eq!(
            Slim::<crate::objects::EndpointSliceBody>::url_path(&(), Some("ns")),
            "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"
        );
        // The Lace kinds' paths are those of the CRDs kube derives from src/api.rs.
        struct PathOf;
        impl BodyVisitor for PathOf {
            type Output = String;
            fn visit<B: Body>(self) -> String {
                Slim::<B>::url_path(&(), None)
            }
        }
        assert_eq!(
            Kind::Network.visit(PathOf),
            crate::api::Network::url_path(&(), None)
        );
        assert_eq!(
            Kind::NodeAllocation.visit(PathOf),
            crate::api::NodeAllocation::url_path(&(), None)
        );
        assert_eq!(
            Kind::ServiceRoutingPolicy.visit(PathOf),
            crate::api::ServiceRoutingPolicy::url_path(&(), None)
        );
    }

    #[test]
    fn a_node_from_the_api_server_is_read_slim() {
        let node: Slim<NodeBody> = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "labels": {"a": "b"}, "resourceVersion": "7",
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"podCIDR": "10.244.1.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.11"},
                                     {"type": "Hostname", "address": "n1"}],
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let Some(Object::Node(name, n)) = node.into_object().unwrap() else {
            panic!("a Node")
        };
        assert_eq!(name, "n1");
        assert_eq!(
            n.internal_ips,
            ["192.168.0.11".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(n.labels["a"], "b");
    }
}
