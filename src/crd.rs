//! The CustomResourceDefinitions of every Lace kind, generated from the types in [`crate::api`]
//! (the one source of truth for the schema). The chart templates the YAML from
//! [`crds_yaml`].

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;

use crate::api::{
    Network, NetworkAllocation, NetworkBindingPolicy, NetworkRoutingPolicy, NodeAllocation,
    ServiceBindingPolicy, ServiceRoutingPolicy,
};

/// The CRDs of all Lace kinds, sorted by CRD name.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        Network::crd(),
        NetworkBindingPolicy::crd(),
        ServiceBindingPolicy::crd(),
        NetworkRoutingPolicy::crd(),
        ServiceRoutingPolicy::crd(),
        NetworkAllocation::crd(),
        NodeAllocation::crd(),
    ];
    crds.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                drop_unknown_formats(schema);
            }
        }
    }
    crds
}

/// Whether the API server knows `format` on a schema of type `ty` (as its
/// `GetUnrecognizedFormats` decides for numbers and the rest; string formats are left as
/// they are). schemars writes `uint8`, `uint16`, `uint32` and `uint64` for Rust's unsigned
/// integers, which the server warns about on every install ("unrecognized format"); the
/// `minimum`/`maximum` it writes beside them keep the ranges.
fn known_format(ty: Option<&str>, format: &str) -> bool {
    match ty {
        None | Some("string") => true,
        Some("integer") => matches!(format, "int32" | "int64"),
        Some("number") => matches!(format, "float" | "double"),
        Some(_) => false,
    }
}

fn drop_unknown_formats(schema: &mut JSONSchemaProps) {
    if let Some(format) = &schema.format {
        if !known_format(schema.type_.as_deref(), format) {
            schema.format = None;
        }
    }
    let props = schema.properties.iter_mut().flat_map(|p| p.values_mut());
    let extra = schema
        .additional_properties
        .iter_mut()
        .filter_map(|a| match a {
            JSONSchemaPropsOrBool::Schema(s) => Some(s.as_mut()),
            JSONSchemaPropsOrBool::Bool(_) => None,
        });
    let items = schema.items.iter_mut().flat_map(|i| match i {
        JSONSchemaPropsOrArray::Schema(s) => std::slice::from_mut(s.as_mut()),
        JSONSchemaPropsOrArray::Schemas(v) => v.as_mut_slice(),
    });
    let combined = [&mut schema.all_of, &mut schema.any_of, &mut schema.one_of]
        .into_iter()
        .flat_map(|v| v.iter_mut().flatten());
    for sub in props.chain(extra).chain(items).chain(combined) {
        drop_unknown_formats(sub);
    }
}

/// All CRDs as one multi-document YAML text, in [`crds`] order (deterministic).
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|crd| {
            // A CRD is plain data with string keys: serializing it cannot fail.
            serde_saphyr::to_string(crd).expect("a CustomResourceDefinition serializes to YAML")
        })
        .map(|doc| format!("---\n{doc}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use serde_json::Value;

    use super::*;

    /// Every kind with whether it has a status subresource and its printer columns.
    const KINDS: [(&str, bool, &[&str]); 7] = [
        ("Network", true, &["External", "Subnets", "Ready", "Age"]),
        ("NetworkAllocation", false, &["Function"]),
        (
            "NetworkBindingPolicy",
            true,
            &["Network", "Priority", "Age"],
        ),
        ("NetworkRoutingPolicy", true, &["From", "To", "Age"]),
        (
            "NodeAllocation",
            false,
            &["Index", "Locator", "IPv4", "IPv6"],
        ),
        (
            "ServiceBindingPolicy",
            true,
            &["Network", "Priority", "Age"],
        ),
        ("ServiceRoutingPolicy", true, &["From", "To", "Age"]),
    ];

    fn crd_json(kind: &str) -> Value {
        let crd = crds()
            .into_iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap();
        serde_json::to_value(crd).unwrap()
    }

    fn schema(kind: &str) -> Value {
        crd_json(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
    }

    #[test]
    fn every_kind_is_cluster_scoped_v1alpha1_with_status_and_columns() {
        let all = crds();
        assert_eq!(all.len(), KINDS.len());
        for (kind, has_status, columns) in KINDS {
            let crd = all.iter().find(|c| c.spec.names.kind == kind).unwrap();
            assert_eq!(crd.spec.group, "lace.io", "{kind}");
            assert_eq!(crd.spec.scope, "Cluster", "{kind}");
            let plural = &crd.spec.names.plural;
            assert_eq!(
                crd.metadata.name.as_deref(),
                Some(format!("{plural}.lace.io").as_str())
            );
            assert_eq!(crd.spec.versions.len(), 1, "{kind}");
            let v = &crd.spec.versions[0];
            assert_eq!(
                (v.name.as_str(), v.served, v.storage),
                ("v1alpha1", true, true),
                "{kind}"
            );
            let status = v.subresources.as_ref().and_then(|s| s.status.as_ref());
            assert_eq!(status.is_some(), has_status, "{kind} status subresource");
            let got: Vec<&str> = v
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect();
            assert_eq!(got, columns, "{kind} printer columns");
            assert!(!crd
                .spec
                .names
                .short_names
                .as_deref()
                .unwrap_or_default()
                .is_empty());
        }
    }

    /// Every `format` in `schema` with the path to it and its schema's type.
    fn formats(schema: &Value, path: &str, out: &mut Vec<(String, String, String)>) {
        match schema {
            Value::Object(map) => {
                if let Some(Value::String(f)) = map.get("format") {
                    let ty = map.get("type").and_then(Value::as_str).unwrap_or("");
                    out.push((path.to_string(), ty.to_string(), f.clone()));
                }
                for (k, v) in map {
                    formats(v, &format!("{path}.{k}"), out);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    formats(v, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn the_api_server_recognises_every_format_in_the_schemas() {
        // The API server's rule (apiextensions-apiserver `GetUnrecognizedFormats`): integers
        // take int32 or int64, numbers float or double; anything else warns on install.
        let mut found = Vec::new();
        for (kind, ..) in KINDS {
            formats(&schema(kind), kind, &mut found);
        }
        let unknown: Vec<_> = found
            .iter()
            .filter(|(_, ty, f)| match ty.as_str() {
                "integer" => !["int32", "int64"].contains(&f.as_str()),
                "number" => !["float", "double"].contains(&f.as_str()),
                "string" | "" => false,
                _ => true,
            })
            .collect();
        assert!(unknown.is_empty(), "{unknown:?}");
        // The unsigned fields keep their ranges without the format.
        let block = &schema("Network")["properties"]["spec"]["properties"]["subnets"]["items"]
            ["properties"]["blockPrefix"];
        assert_eq!(block["type"], "integer", "{block}");
        assert_eq!(block["maximum"], 255.0, "{block}");
        assert_eq!(block["minimum"], 0.0, "{block}");
    }

    #[test]
    fn crds_yaml_is_deterministic_and_parses_back() {
        let text = crds_yaml();
        assert_eq!(text, crds_yaml());
        let docs: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(docs, crds());
    }

    #[test]
    fn the_schemas_hold_the_fields() {
        let net = schema("Network");
        let subnet = &net["properties"]["spec"]["properties"]["subnets"]["items"];
        assert_eq!(subnet["properties"]["cidr"]["type"], "string");
        assert_eq!(subnet["properties"]["blockPrefix"]["type"], "integer");
        assert_eq!(
            subnet["required"],
            serde_json::json!(["blockPrefix", "cidr"])
        );
        assert_eq!(
            net["properties"]["spec"]["properties"]["external"]["type"],
            "boolean"
        );
        assert_eq!(
            net["properties"]["status"]["properties"]["conditions"]["type"],
            "array"
        );
        let nbp = &schema("NetworkBindingPolicy")["properties"]["spec"];
        assert_eq!(nbp["properties"]["priority"]["type"], "integer");
        let op = &nbp["properties"]["podSelector"]["properties"]["matchExpressions"]["items"]
            ["properties"]["operator"];
        assert_eq!(
            op["enum"],
            serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"])
        );
        let node = &schema("NodeAllocation")["properties"]["spec"];
        assert_eq!(node["properties"]["locator"]["type"], "string");
        let underlay = &node["properties"]["underlay"];
        assert_eq!(underlay["type"], "object");
        assert_eq!(underlay["properties"]["ipv4"]["type"], "string");
        assert_eq!(underlay["properties"]["ipv6"]["type"], "string");
        assert!(
            node["properties"].get("blocks").is_none(),
            "blocks derive from the index"
        );
        let srp = &schema("ServiceRoutingPolicy")["properties"]["spec"];
        assert_eq!(srp["required"], serde_json::json!(["from", "to"]));
    }

    /// A small structural-schema check (types, required, unknown fields, enums, integer
    /// bounds), enough to tell whether the API server would accept `value` as is.
    fn check(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
        if value.is_null() && schema["nullable"] == true {
            return;
        }
        let ok = match schema["type"].as_str() {
            Some("object") => {
                let Some(map) = value.as_object() else {
                    errors.push(format!("{path}: not an object"));
                    return;
                };
                let required = schema["required"].as_array().into_iter().flatten();
                for required in required.filter_map(Value::as_str) {
                    if !map.contains_key(required) {
                        errors.push(format!("{path}.{required}: required"));
                    }
                }
                for (key, v) in map {
                    let sub = &schema["properties"][key];
                    if !sub.is_null() {
                        check(sub, v, &format!("{path}.{key}"), errors);
                    } else if schema["additionalProperties"].is_object() {
                        check(
                            &schema["additionalProperties"],
                            v,
                            &format!("{path}.{key}"),
                            errors,
                        );
                    } else if schema["x-kubernetes-preserve-unknown-fields"] != true {
                        errors.push(format!("{path}.{key}: unknown field"));
                    }
                }
                true
            }
            Some("array") => {
                let Some(items) = value.as_array() else {
                    errors.push(format!("{path}: not an array"));
                    return;
                };
                for (i, v) in items.iter().enumerate() {
                    check(&schema["items"], v, &format!("{path}[{i}]"), errors);
                }
                true
            }
            Some("string") => {
                value.is_string()
                    && schema["enum"]
                        .as_array()
                        .is_none_or(|allowed| allowed.contains(value))
            }
            Some("integer") => value.as_i64().is_some_and(|n| {
                schema["minimum"].as_f64().is_none_or(|min| n as f64 >= min)
                    && schema["maximum"].as_f64().is_none_or(|max| n as f64 <= max)
            }),
            Some("boolean") => value.is_boolean(),
            _ => true,
        };
        if !ok {
            errors.push(format!("{path}: {value} does not match {}", schema["type"]));
        }
    }

    /// Every object of the example cluster, by kind: each validates against its CRD's schema
    /// and deserializes into its kube type.
    #[test]
    fn the_example_objects_fit_the_schemas() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cluster");
        let mut by_kind: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for file in ["networks.yaml", "policies.yaml", "lace-allocations.yaml"] {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            let options = crate::load::yaml_options();
            for v in serde_saphyr::from_multiple_with_options::<Value>(&text, options).unwrap() {
                by_kind
                    .entry(v["kind"].as_str().unwrap().to_string())
                    .or_default()
                    .push(v);
            }
        }
        assert_eq!(by_kind.keys().collect::<Vec<_>>(), KINDS.map(|k| k.0));
        for (kind, objects) in &by_kind {
            let schema = schema(kind);
            for object in objects {
                let mut errors = Vec::new();
                check(
                    &schema["properties"]["spec"],
                    &object["spec"],
                    "spec",
                    &mut errors,
                );
                assert_eq!(
                    errors,
                    Vec::<String>::new(),
                    "{kind} {}",
                    object["metadata"]["name"]
                );
                let o = object.clone();
                let parsed = match kind.as_str() {
                    "Network" => serde_json::from_value::<Network>(o).map(|_| ()),
                    "NetworkAllocation" => {
                        serde_json::from_value::<NetworkAllocation>(o).map(|_| ())
                    }
                    "NetworkBindingPolicy" => {
                        serde_json::from_value::<NetworkBindingPolicy>(o).map(|_| ())
                    }
                    "NetworkRoutingPolicy" => {
                        serde_json::from_value::<NetworkRoutingPolicy>(o).map(|_| ())
                    }
                    "NodeAllocation" => serde_json::from_value::<NodeAllocation>(o).map(|_| ()),
                    "ServiceBindingPolicy" => {
                        serde_json::from_value::<ServiceBindingPolicy>(o).map(|_| ())
                    }
                    "ServiceRoutingPolicy" => {
                        serde_json::from_value::<ServiceRoutingPolicy>(o).map(|_| ())
                    }
                    other => panic!("unexpected kind {other}"),
                };
                assert!(parsed.is_ok(), "{kind}: {parsed:?}");
            }
        }
    }

    #[test]
    fn the_schema_check_rejects_what_the_api_server_would() {
        let schema = schema("Network");
        let bad = serde_json::json!({
            "subnets": [{"cidr": "10.0.0.0/8", "blockPrefix": "24"}, {"blockPrefix": 300}],
            "externl": true,
        });
        let mut errors = Vec::new();
        check(&schema["properties"]["spec"], &bad, "spec", &mut errors);
        errors.sort();
        assert_eq!(
            errors,
            [
                "spec.externl: unknown field",
                "spec.subnets[0].blockPrefix: \"24\" does not match \"integer\"",
                "spec.subnets[1].blockPrefix: 300 does not match \"integer\"",
                "spec.subnets[1].cidr: required",
            ]
        );
    }

    /// The plugin chart templates exactly these CRDs (regenerate with `LACE_BLESS=1`). The
    /// chart tier validates the rendered file against the real Kubernetes schemas.
    #[test]
    fn the_chart_templates_the_generated_crds() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("chart/templates/crds.yaml");
        let generated = format!("{CHART_HEADER}{}", crds_yaml());
        if std::env::var_os("LACE_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let in_chart = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            in_chart == generated,
            "{} is not what crds_yaml() generates; run LACE_BLESS=1 cargo test -p lace --features kube --lib crd",
            path.display()
        );
    }

    const CHART_HEADER: &str =
        "# Generated from src/api.rs by `LACE_BLESS=1 cargo test -p lace --lib crd`; do not edit.\n";
}
