//! End to end in process: the controller allocates `examples/cluster` against the fake API
//! server; the objects it wrote, read back the way the agent's Kubernetes source reads them
//! (`lace::k8s::Slim` into a `lace::index::ClusterIndex`, with every other object of the
//! example), give every node the same plan as the standalone path: `lace-agent allocate`
//! (its recorded `lace-allocations.yaml`) + `lace-agent plan`.
//!
//! The agent's own in-cluster source is built in parallel; this test feeds the shared
//! `ClusterIndex` path it is built on.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod support;

use std::path::{Path, PathBuf};

use lace::index::ClusterIndex;
use lace::k8s::Slim;
use lace::objects::{Body, BodyVisitor, Kind, Object};
use lace_fake_kube::FakeApi;
use serde_json::Value;
use support::Harness;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster")
}

/// Every document of the example's manifests but the recorded allocations.
fn documents() -> Vec<Value> {
    let mut docs = Vec::new();
    for file in lace::load::manifest_files(&example()).unwrap() {
        if file
            .file_name()
            .is_some_and(|f| f == "lace-allocations.yaml")
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // As the loader reads YAML; empty documents are skipped.
        let options = lace::load::yaml_options();
        docs.extend(serde_saphyr::from_multiple_with_options::<Value>(&text, options).unwrap());
    }
    docs
}

/// An object as a watch delivers it, through the agent's slim types.
struct Watched(Value);

impl BodyVisitor for Watched {
    type Output = Option<Object>;
    fn visit<B: Body>(self) -> Option<Object> {
        let slim: Slim<B> = serde_json::from_value(self.0).unwrap();
        slim.into_object().unwrap()
    }
}

fn kind_of(doc: &Value) -> Kind {
    Kind::of(
        doc["apiVersion"].as_str().unwrap(),
        doc["kind"].as_str().unwrap(),
    )
    .unwrap()
}

fn plans(state: &lace::state::ClusterState) -> Vec<(String, String)> {
    state
        .nodes
        .keys()
        .map(|node| {
            let p = lace::plan::plan(node, state, &[]).unwrap();
            (node.clone(), p.render() + &p.render_nft())
        })
        .collect()
}

#[tokio::test]
async fn the_controllers_objects_give_the_standalone_plans() {
    let docs = documents();
    let fake = FakeApi::new();
    for doc in &docs {
        fake.put(doc.clone());
    }
    let standalone = lace::load::load_dir(&example()).unwrap();
    let prefix = standalone.config.srv6_locator_prefix.unwrap().to_string();
    let h = Harness::start(&fake, &prefix);
    h.settle().await;
    h.stop().await.unwrap();

    let mut index = ClusterIndex::new();
    let written: Vec<Value> = ["NetworkAllocation", "NodeAllocation"]
        .iter()
        .flat_map(|kind| fake.list("lace.io/v1alpha1", kind, None))
        .collect();
    assert_eq!(
        written.len(),
        4 + 3,
        "a NetworkAllocation per Network, a NodeAllocation per node"
    );
    for doc in docs.iter().chain(&written) {
        if let Some(object) = kind_of(doc).visit(Watched(doc.clone())) {
            index.apply(object);
        }
    }
    let in_cluster = index.into_state();

    // The allocations equal those `lace-agent allocate` recorded, and those it makes from
    // scratch.
    assert_eq!(in_cluster.node_allocations, standalone.node_allocations);
    assert_eq!(
        in_cluster.network_allocations,
        standalone.network_allocations
    );
    let mut fresh = standalone.clone();
    fresh.node_allocations.clear();
    fresh.network_allocations.clear();
    let again = lace::alloc::allocate(&fresh).unwrap();
    assert_eq!(in_cluster.node_allocations, again.node_allocations);
    assert_eq!(in_cluster.network_allocations, again.network_allocations);

    // And so every node's plan.
    let (got, want) = (plans(&in_cluster), plans(&standalone));
    assert_eq!(got.len(), 3);
    for ((node, a), (_, b)) in got.iter().zip(&want) {
        assert_eq!(a, b, "plan of {node}");
    }
    assert_eq!(
        in_cluster, standalone,
        "the whole state, not only what the plans read"
    );
}
