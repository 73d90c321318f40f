//! The admission corpus (`tests/admission/corpus.yaml`) judged by Lace's validator, the one
//! source of truth: each case's errors must name exactly the fields the corpus lists. The chart
//! tier evaluates the chart's ValidatingAdmissionPolicies (CEL) on the same corpus against the
//! same lists (`tests/charts/test_admission_cel.py`), so the two agree case by case.
//!
//! A case is judged the way `lace-agent validate` judges a directory (load, then
//! `validate_cluster`), with the corpus's context Networks beside the object; an UPDATE case by
//! `validate_network_update`, old object against new.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::path::Path;

use lace::load::{load_dir, LoadError};
use lace::state::ClusterState;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Corpus {
    context: Vec<Value>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Case {
    name: String,
    object: Value,
    old_object: Option<Value>,
    invalid: BTreeSet<String>,
}

/// `spec.subnets[1].cidr` -> `spec.subnets[].cidr`: the CEL rules cannot name an index.
fn without_indices(field: &str) -> String {
    let mut out = String::new();
    let mut in_index = false;
    for c in field.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push('[');
            }
            ']' => {
                in_index = false;
                out.push(']');
            }
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    out
}

/// `Kind/name: spec.x` -> `spec.x`.
fn field_of(path: &str) -> String {
    without_indices(path.split_once(": ").map_or(path, |(_, field)| field))
}

fn with_api_version(object: &Value) -> Value {
    let mut object = object.clone();
    object
        .as_object_mut()
        .expect("a case's object is a mapping")
        .insert("apiVersion".into(), lace::api::API_VERSION.into());
    object
}

/// Loads the objects as `lace-agent validate` would; a malformed object is judged invalid in
/// the field the loader names.
fn load(objects: &[Value]) -> Result<ClusterState, BTreeSet<String>> {
    let dir = tempfile::tempdir().unwrap();
    let docs: Vec<String> = objects
        .iter()
        .map(|o| serde_saphyr::to_string(o).unwrap())
        .collect();
    std::fs::write(dir.path().join("objects.yaml"), docs.join("---\n")).unwrap();
    match load_dir(dir.path()) {
        Ok(state) => Ok(state),
        // The loader's message starts with the path of the value it rejects
        // (`spec.subnets[0].cidr: cidr "…" is not a CIDR: …`).
        Err(LoadError::Invalid { message, .. }) => {
            let path = message
                .split_once(": ")
                .map_or(message.as_str(), |(path, _)| path);
            Err(BTreeSet::from([without_indices(path)]))
        }
        Err(e) => panic!("cannot load {objects:?}: {e}"),
    }
}

fn judge(context: &[Value], case: &Case) -> BTreeSet<String> {
    let object = with_api_version(&case.object);
    let mut objects = context.to_vec();
    objects.push(object.clone());
    let state = match load(&objects) {
        Ok(state) => state,
        Err(fields) => return fields,
    };
    let errors = match &case.old_object {
        None => lace::validate::validate_cluster(&state).err(),
        Some(old) => {
            let name = object["metadata"]["name"].as_str().unwrap();
            let old_state = load(&[with_api_version(old)]).expect("old objects are valid");
            lace::validate::validate_network_update(
                name,
                &old_state.networks[name],
                &state.networks[name],
            )
            .err()
        }
    };
    errors
        .unwrap_or_default()
        .iter()
        .map(|e| field_of(&e.path))
        .collect()
}

#[test]
fn the_validator_names_the_fields_the_corpus_lists() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/admission/corpus.yaml");
    let corpus: Corpus = serde_saphyr::from_str_with_options(
        &std::fs::read_to_string(path).unwrap(),
        lace::load::yaml_options(),
    )
    .unwrap();
    assert!(corpus.cases.len() >= 40, "the corpus shrank");
    let mut wrong = Vec::new();
    for case in &corpus.cases {
        let fields = judge(&corpus.context, case);
        if fields != case.invalid {
            wrong.push(format!(
                "{}: validator says {fields:?}, corpus {:?}",
                case.name, case.invalid
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Both verdicts occur for every kind, so neither side can pass by always saying one thing.
    for kind in [
        "Network",
        "NetworkBindingPolicy",
        "ServiceBindingPolicy",
        "NetworkRoutingPolicy",
        "ServiceRoutingPolicy",
    ] {
        let of_kind = corpus.cases.iter().filter(|c| c.object["kind"] == kind);
        let (valid, invalid): (Vec<_>, Vec<_>) = of_kind.partition(|c| c.invalid.is_empty());
        assert!(
            !valid.is_empty() && !invalid.is_empty(),
            "{kind}: need both verdicts"
        );
    }
}
