//! One state, two sources: the cluster state built from the YAML directory (standalone mode)
//! equals the state built from watch events (in-cluster mode) carrying the same objects, in
//! any order, with stale versions later updated and extra objects later deleted interleaved.
//!
//! The watch side goes the way the agent's watches go: each object as the API server would
//! send it (JSON, `metadata.namespace` filled in), deserialized as a `lace::k8s::Slim` of its
//! kind, converted, applied to a `ClusterIndex`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;

use lace::index::ClusterIndex;
use lace::k8s::Slim;
use lace::objects::{Body, BodyVisitor, Kind, Object};
use proptest::prelude::*;
use serde_json::Value;

/// Every object of the example cluster, as the API server would serve it.
fn example_objects() -> Vec<(Kind, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cluster");
    let mut out = Vec::new();
    for file in lace::load::manifest_files(&dir).unwrap() {
        let text = std::fs::read_to_string(&file).unwrap();
        // As the loader reads YAML; empty documents are skipped.
        let docs =
            serde_saphyr::from_multiple_with_options::<Value>(&text, lace::load::yaml_options());
        for mut json in docs.unwrap() {
            let Some(kind) = Kind::of(
                json["apiVersion"].as_str().unwrap(),
                json["kind"].as_str().unwrap(),
            ) else {
                continue;
            };
            if kind.namespaced() && json["metadata"]["namespace"].is_null() {
                json["metadata"]["namespace"] = "default".into();
            }
            out.push((kind, json));
        }
    }
    out
}

/// Deserializes `value` as a `Slim` of its kind and converts it, as the watches do.
struct FromApi(Value);

impl BodyVisitor for FromApi {
    type Output = Option<Object>;
    fn visit<B: Body>(self) -> Option<Object> {
        let slim: Slim<B> = serde_json::from_value(self.0).unwrap();
        slim.into_object().unwrap()
    }
}

fn object(kind: Kind, value: &Value) -> Option<Object> {
    kind.visit(FromApi(value.clone()))
}

/// A different version of the same object: other labels, and for some kinds another spec.
fn stale(kind: Kind, value: &Value) -> Value {
    let mut v = value.clone();
    v["metadata"]["labels"]["lace.io/stale"] = "yes".into();
    match kind {
        Kind::Network if v["spec"]["external"].is_null() => {
            v["spec"]["subnets"][0]["blockPrefix"] = 28.into()
        }
        Kind::NetworkBindingPolicy => v["spec"]["priority"] = 7.into(),
        Kind::NodeAllocation => v["spec"]["index"] = 99.into(),
        Kind::Pod => v["spec"]["nodeName"] = "elsewhere".into(),
        Kind::EndpointSlice => v["endpoints"] = serde_json::json!([{"addresses": ["10.9.9.9"]}]),
        _ => {}
    }
    v
}

/// An object that exists for a while and is deleted: a copy under another name (an
/// EndpointSlice with another address, so its Service's merged endpoints show it while it
/// lives).
fn extra(kind: Kind, value: &Value) -> Value {
    let mut v = value.clone();
    let name = v["metadata"]["name"].as_str().unwrap().to_string();
    v["metadata"]["name"] = format!("{name}-extra").into();
    if kind == Kind::EndpointSlice {
        v["endpoints"] = serde_json::json!([{"addresses": ["10.8.8.8"]}]);
    }
    v
}

#[derive(Clone, Debug)]
enum Event {
    Apply(Kind, Value),
    Delete(Kind, Value),
}

/// The events for the example objects, ordered by `keys` (one per event, lower first), with
/// each object's stale version before its real one and each extra's apply before its delete.
fn events(objects: &[(Kind, Value)], mask: &[u8], keys: &[u32]) -> Vec<Event> {
    let mut list: Vec<(u64, Event)> = Vec::new();
    let mut k = keys.iter().cycle();
    let mut next = || u64::from(*k.next().unwrap());
    for (i, (kind, value)) in objects.iter().enumerate() {
        let m = mask[i % mask.len()];
        let real = next() + 1_000_000;
        if m & 1 != 0 {
            // A stale version some time before the real one.
            list.push((
                real - 1 - next() % 1_000_000,
                Event::Apply(*kind, stale(*kind, value)),
            ));
        }
        list.push((real, Event::Apply(*kind, value.clone())));
        if m & 2 != 0 {
            let born = next();
            let extra = extra(*kind, value);
            list.push((born, Event::Apply(*kind, extra.clone())));
            list.push((born + 1 + next(), Event::Delete(*kind, extra)));
        }
    }
    list.sort_by_key(|(t, _)| *t);
    list.into_iter().map(|(_, e)| e).collect()
}

fn run(events: &[Event]) -> ClusterIndex {
    let mut ix = ClusterIndex::new();
    for e in events {
        match e {
            Event::Apply(kind, v) => {
                if let Some(o) = object(*kind, v) {
                    ix.apply(o);
                }
            }
            Event::Delete(kind, v) => {
                let key = match object(*kind, v) {
                    Some(o) => o.key(),
                    None => continue, // an object Lace ignores was never in the index
                };
                ix.delete(*kind, &key);
            }
        }
    }
    ix
}

#[test]
fn the_example_has_every_kind_and_events_carry_them_all() {
    let objects = example_objects();
    let kinds: std::collections::BTreeSet<Kind> = objects.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds.len(), Kind::ALL.len(), "every kind: {kinds:?}");
    // In file order, with no stale versions or extras, the watch side gives the same state.
    let plain = events(&objects, &[0], &[0]);
    let expected =
        lace::load::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cluster"))
            .unwrap();
    assert_eq!(run(&plain).state(), &expected);
    // And the stale versions really differ (or the property below would prove nothing).
    let all_stale = events(&objects, &[1], &[5, 3, 9]);
    let mut ix = ClusterIndex::new();
    for e in &all_stale {
        if let Event::Apply(kind, v) = e {
            if v["metadata"]["labels"]["lace.io/stale"] == "yes" {
                if let Some(o) = object(*kind, v) {
                    ix.apply(o);
                }
            }
        }
    }
    assert_ne!(ix.state(), &expected);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn directory_and_watch_events_in_any_order_give_the_same_state(
        mask in proptest::collection::vec(0u8..4, 1..40),
        keys in proptest::collection::vec(0u32..1_000_000, 1..200),
    ) {
        let objects = example_objects();
        let expected = lace::load::load_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cluster"),
        )
        .unwrap();
        let ix = run(&events(&objects, &mask, &keys));
        prop_assert_eq!(ix.state(), &expected);
        // The index is exactly the objects: none left behind by the extras.
        for kind in Kind::ALL {
            prop_assert!(ix.keys(kind).iter().all(|k| !k.name.ends_with("-extra")));
        }
    }
}
