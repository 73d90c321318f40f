//! The Kubernetes source against the fake API server (`lace-fake-kube`): the real
//! watches, feeder, agent and reconcile loop, with a dataplane that records the plans it is
//! given. Every request the agent makes here is checked against the recorded set the chart's
//! ClusterRole must grant exactly (`tests/golden/agent-api-requests.txt`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lace_fake_kube::{FakeApi, Mode};
use serde_json::{json, Value};

use super::{ApiServer, KubeSource, Timings};
use crate::agent::{ipam::IpamStore, Agent, Dataplane};
use crate::plan::DesiredNode;
use crate::state::ObjectKey;
use crate::wire::ErrorCode;

/// The recorded set of requests the agent makes (`verb resource`), which the chart's
/// ClusterRole must grant exactly (tests/charts/test_agent_rbac.py).
const API_REQUESTS: &str = "tests/golden/agent-api-requests.txt";

/// Records every plan it is asked to apply (rendered as `lace-agent plan` prints them).
#[derive(Debug, Default)]
struct Recorder {
    plans: Mutex<Vec<String>>,
}

fn render(plan: &DesiredNode) -> String {
    plan.render() + "\n" + &plan.render_nft()
}

impl Recorder {
    /// A dataplane that records each plan here.
    fn dataplane(self: &Arc<Self>) -> Arc<dyn Dataplane> {
        let me = Arc::clone(self);
        Arc::new(crate::agent::PlanSink::new(move |plan| {
            me.plans.lock().unwrap().push(render(plan))
        }))
    }

    fn count(&self) -> usize {
        self.plans.lock().unwrap().len()
    }
    fn last(&self) -> Option<String> {
        self.plans.lock().unwrap().last().cloned()
    }
    fn since(&self, n: usize) -> Vec<String> {
        self.plans.lock().unwrap()[n..].to_vec()
    }
}

fn timings() -> Timings {
    Timings {
        debounce: Duration::from_millis(20),
        debounce_max: Duration::from_millis(200),
        resync: Duration::from_secs(3600),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        pod_lookup: Duration::from_secs(2),
    }
}

/// An agent for `node` fed by a [`KubeSource`] on `fake`, with its reconcile loop.
struct Harness {
    agent: Arc<Agent>,
    dataplane: Arc<Recorder>,
    tasks: tokio::task::JoinSet<()>,
    _state: tempfile::TempDir,
}

impl Harness {
    fn start(node: &str, fake: &FakeApi, timings: Timings) -> Harness {
        let state = tempfile::tempdir().unwrap();
        let api = ApiServer::fixed(
            kube::Client::new(fake.service(), "default"),
            "https://fake.invalid:6443 (test)",
        );
        let source = Arc::new(KubeSource::new(node.into(), api).with_timings(timings));
        let dataplane = Arc::new(Recorder::default());
        let agent = Arc::new(Agent::new(
            node.into(),
            IpamStore::open(state.path()).unwrap(),
            dataplane.dataplane(),
            source.clone(),
        ));
        agent.set_serving();
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(crate::agent::StateSource::run(
            Arc::clone(&source),
            Arc::clone(&agent),
        ));
        tasks.spawn(crate::agent::reconcile::run(
            Arc::clone(&agent),
            crate::agent::reconcile::DEFAULT_RESYNC,
        ));
        Harness {
            agent,
            dataplane,
            tasks,
            _state: state,
        }
    }

    fn metrics(&self) -> String {
        crate::telemetry::Probes::refresh(&*self.agent);
        crate::telemetry::encode(crate::telemetry::Probes::registry(&*self.agent))
    }

    async fn stop(mut self) {
        self.tasks.shutdown().await;
    }
}

/// Waits (up to 10 s) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cluster")
}

/// Every object of `examples/cluster` as the API server would serve it.
fn example_objects() -> Vec<Value> {
    let mut out = Vec::new();
    for file in crate::load::manifest_files(&example_dir()).unwrap() {
        let text = std::fs::read_to_string(&file).unwrap();
        // As the loader reads YAML; empty documents are skipped.
        let docs =
            serde_saphyr::from_multiple_with_options::<Value>(&text, crate::load::yaml_options());
        for mut json in docs.unwrap() {
            let kind = crate::objects::Kind::of(
                json["apiVersion"].as_str().unwrap(),
                json["kind"].as_str().unwrap(),
            );
            if kind.is_some_and(|k| k.namespaced()) && json["metadata"]["namespace"].is_null() {
                json["metadata"]["namespace"] = "default".into();
            }
            out.push(json);
        }
    }
    out
}

fn fake_with(objects: &[Value]) -> FakeApi {
    let fake = FakeApi::new();
    for o in objects {
        fake.put(o.clone());
    }
    fake
}

/// What `lace-agent plan --manifests examples/cluster --node <node>` prints.
fn standalone_plan(node: &str) -> String {
    let state = crate::load::load_dir(&example_dir()).unwrap();
    render(&crate::plan::plan(node, &state, &[]).unwrap())
}

fn blessed() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(API_REQUESTS);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {} ({e}); LACE_BLESS=1 creates it", path.display()))
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// Every request `fake` saw is one the chart grants (nothing the agent does is missing).
fn assert_granted(fake: &FakeApi) {
    if std::env::var_os("LACE_BLESS").is_some() {
        return;
    }
    let blessed = blessed();
    for r in fake.requests() {
        assert!(
            blessed.contains(&r.rbac()),
            "the agent made a request not in {API_REQUESTS}: {} ({}); re-bless with LACE_BLESS=1 \
             and grant it in chart/templates/rbac.yaml",
            r.rbac(),
            r.uri
        );
    }
}

fn network_unavailable(fake: &FakeApi, name: &str) -> Option<Value> {
    let node = fake.get("v1", "Node", "", name)?;
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "NetworkUnavailable")
        .cloned()
}

/// Runs `scenario_plans` for one node; what the fake saw.
async fn scenario_plans(node_name: &str) -> FakeApi {
    let objects = example_objects();
    let fake = fake_with(&objects);
    let h = Harness::start(node_name, &fake, timings());
    until("the first plan is applied", || h.dataplane.count() > 0).await;
    assert_eq!(
        h.dataplane.last().unwrap(),
        standalone_plan(node_name),
        "{node_name}: the plan from watch events differs from `lace-agent plan`"
    );
    // Cheap by selector: only this node's Node is in the cache. Pods are all there: a
    // NetworkPolicy's peers run on every node.
    let state = h.agent.loaded().unwrap().state.clone();
    assert!(state.pods.values().any(|p| p.node != node_name));
    assert!(!state.network_policies.is_empty());
    assert_eq!(state.nodes.keys().collect::<Vec<_>>(), [node_name]);
    let uris: Vec<String> = fake.requests().into_iter().map(|r| r.uri).collect();
    let selector = format!("metadata.name%3D{node_name}");
    assert!(
        uris.iter()
            .any(|u| u.contains(&selector) && u.contains("watch=true")),
        "no watch with {selector}: {uris:?}"
    );
    // Programmed: the Node says its network is available, written once.
    until("NetworkUnavailable is False", || {
        network_unavailable(&fake, node_name).is_some_and(|c| c["status"] == "False")
    })
    .await;
    let c = network_unavailable(&fake, node_name).unwrap();
    assert_eq!(c["reason"], "LaceIsUp");
    // Another change of the Node (the watch delivers it) writes nothing more.
    let mut n = fake.get("v1", "Node", "", node_name).unwrap();
    n["metadata"]["labels"]["touched"] = "yes".into();
    fake.put(n);
    until("the label arrives", || {
        h.agent.loaded().unwrap().state.nodes[node_name]
            .labels
            .contains_key("touched")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fake.count("patch nodes/status"), 1, "idempotent");
    // Something flips it back: set again.
    let mut n = fake.get("v1", "Node", "", node_name).unwrap();
    n["status"]["conditions"] = json!([{"type": "NetworkUnavailable", "status": "True",
        "reason": "NoRouteCreated"}]);
    fake.put(n);
    until("NetworkUnavailable is False again", || {
        network_unavailable(&fake, node_name).is_some_and(|c| c["reason"] == "LaceIsUp")
    })
    .await;
    assert_eq!(fake.count("patch nodes/status"), 2);
    assert_granted(&fake);
    h.stop().await;
    fake
}

#[tokio::test]
async fn plans_from_watch_events_are_the_standalone_plans_of_every_example_node() {
    for node in ["node-1", "node-2", "node-3"] {
        scenario_plans(node).await;
    }
}

/// Runs the unknown-pod scenario; what the fake saw.
async fn scenario_unknown_pod() -> FakeApi {
    let objects = example_objects();
    let fake = fake_with(&objects);
    let h = Harness::start("node-1", &fake, timings());
    until("ready", || h.agent.is_ready()).await;
    // The kubelet created team-a/late on node-1; the watch has not delivered it yet.
    fake.put_quietly(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "late", "namespace": "team-a", "labels": {"app": "x"}},
        "spec": {"nodeName": "node-1"},
    }));
    let key = ObjectKey::new("team-a", "late");
    assert!(!h.agent.loaded().unwrap().state.pods.contains_key(&key));
    let placed = crate::agent::cni::place(&h.agent, &key).await.unwrap();
    assert_eq!(
        placed.network, "tenant-a",
        "bound by its namespace's labels"
    );
    assert_eq!(fake.count("get pods"), 1);
    assert!(fake
        .requests()
        .iter()
        .any(|r| r.uri.starts_with("/api/v1/namespaces/team-a/pods/late")));
    // A pod the API server does not have either: a clear, retryable error.
    let err = crate::agent::cni::place(&h.agent, &ObjectKey::new("team-a", "ghost"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code, ErrorCode::TRY_AGAIN_LATER);
    assert!(
        err.msg.contains("team-a/ghost") && err.msg.contains("does not exist"),
        "{}",
        err.msg
    );
    assert!(h
        .metrics()
        .contains("lace_pod_lookups_total{result=\"found\"} 1\n"));
    assert!(h
        .metrics()
        .contains("lace_pod_lookups_total{result=\"missing\"} 1\n"));
    assert_granted(&fake);
    h.stop().await;
    fake
}

#[tokio::test]
async fn cni_add_for_a_pod_the_cache_has_not_seen_fetches_it() {
    scenario_unknown_pod().await;
}

#[tokio::test]
async fn a_pod_no_binding_policy_matches_keeps_failing_retryably() {
    let mut objects = example_objects();
    // Without the catch-all, pods in plain namespaces match nothing.
    objects
        .retain(|o| !(o["kind"] == "NetworkBindingPolicy" && o["metadata"]["name"] == "default"));
    let fake = fake_with(&objects);
    let h = Harness::start("node-1", &fake, timings());
    until("ready", || h.agent.is_ready()).await;
    fake.put_quietly(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "stray", "namespace": "default"},
        "spec": {"nodeName": "node-1"},
    }));
    let err = crate::agent::cni::place(&h.agent, &ObjectKey::new("default", "stray"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code, ErrorCode::TRY_AGAIN_LATER);
    assert!(
        err.msg.contains("matches no NetworkBindingPolicy"),
        "{}",
        err.msg
    );
    h.stop().await;
}

/// The example's objects plus extras that show in node-1's plan (a routing policy that lets
/// default reach itself, and a second Service backend).
fn extras() -> Vec<Value> {
    vec![
        json!({"apiVersion": "lace.io/v1alpha1", "kind": "NetworkRoutingPolicy",
               "metadata": {"name": "extra-default-self"},
               "spec": {"from": "default", "to": "default"}}),
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "extra", "labels": {"lace.io/tenant": "a"}}}),
    ]
}

#[tokio::test]
async fn a_watch_error_and_a_410_relist_converge_to_the_same_plan() {
    let objects = example_objects();
    let mut all = objects.clone();
    all.extend(extras());
    let fake = fake_with(&all);
    let h = Harness::start("node-1", &fake, timings());
    until("the first plan", || h.dataplane.count() > 0).await;
    let with_extras = h.dataplane.last().unwrap();
    assert_ne!(
        with_extras,
        standalone_plan("node-1"),
        "the extras show in the plan"
    );
    let lists = fake.count("list networkroutingpolicies.lace.io");

    // An error event in the watches (the API server's 500): the watches go on.
    fake.watch_error(500);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(h.agent.is_ready());
    assert_eq!(h.dataplane.last().unwrap(), with_extras);

    // The API server goes away; meanwhile the extras are deleted and its history compacted,
    // so the resumed watches get 410 Gone and must relist to see the deletes.
    fake.set_mode(Mode::Refusing);
    assert!(fake
        .remove(
            "lace.io/v1alpha1",
            "NetworkRoutingPolicy",
            "",
            "extra-default-self"
        )
        .is_some());
    assert!(fake.remove("v1", "Namespace", "", "extra").is_some());
    fake.compact();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        h.dataplane.last().unwrap(),
        with_extras,
        "nothing changes while away"
    );
    fake.set_mode(Mode::Up);
    // Each kind relists on its own: the plan can be back before the Namespace is gone.
    until(
        "the relist converges on the example's plan and state",
        || {
            h.dataplane.last().unwrap() == standalone_plan("node-1")
                && h.agent
                    .loaded()
                    .is_ok_and(|l| !l.state.namespaces.contains_key("extra"))
        },
    )
    .await;
    assert!(
        fake.count("list networkroutingpolicies.lace.io") > lists,
        "relisted"
    );
    let state = h.agent.loaded().unwrap().state.clone();
    assert!(!state.namespaces.contains_key("extra"));
    assert!(!state.network_routes.contains_key("extra-default-self"));
    assert!(
        h.metrics().contains(
            "lace_watch_events_total{kind=\"NetworkRoutingPolicy\",event=\"relisted\"} 2\n"
        ),
        "{}",
        h.metrics()
    );
    assert_granted(&fake);
    h.stop().await;
}

#[tokio::test]
async fn a_restarted_api_server_costs_watches_not_relists() {
    let fake = fake_with(&example_objects());
    let h = Harness::start("node-1", &fake, timings());
    until("the first plan", || h.dataplane.count() > 0).await;
    until("every watch is open", || {
        fake.open_watches() == super::WATCHED.len()
    })
    .await;
    // Lists by the watches (the reachability probe of the own Node lists without a limit).
    let watch_lists = |fake: &FakeApi| {
        fake.requests()
            .iter()
            .filter(|r| r.rbac().starts_with("list ") && r.uri.contains("limit="))
            .count()
    };
    let lists = watch_lists(&fake);
    let watches = fake.count_prefix("watch ");
    // Restart: every watch ends, the API server refuses for a moment, a change happens.
    fake.set_mode(Mode::Refusing);
    let mut extra = extras().remove(0);
    extra["metadata"]["name"] = "while-away".into();
    fake.put(extra);
    tokio::time::sleep(Duration::from_millis(100)).await;
    fake.set_mode(Mode::Up);
    until("the change made while away arrives", || {
        h.agent
            .loaded()
            .unwrap()
            .state
            .network_routes
            .contains_key("while-away")
    })
    .await;
    until("every watch is open again", || {
        fake.open_watches() == super::WATCHED.len()
    })
    .await;
    assert_eq!(watch_lists(&fake), lists, "no relist");
    assert!(fake.count_prefix("watch ") >= watches + super::WATCHED.len());
    h.stop().await;
}

#[tokio::test]
async fn the_dataplane_is_untouched_while_the_api_server_is_away() {
    let fake = fake_with(&example_objects());
    let mut t = timings();
    t.resync = Duration::from_millis(150);
    let h = Harness::start("node-1", &fake, t);
    until("the first plan", || h.dataplane.count() > 0).await;
    let before = h.dataplane.last().unwrap();
    let n = h.dataplane.count();
    fake.set_mode(Mode::Refusing);
    until("the loss shows in the metrics", || {
        h.metrics().contains("lace_apiserver_up 0\n")
    })
    .await;
    // Several backoffs and resyncs later (the reconcile loop takes in a burst of triggers
    // for up to `reconcile::MAX_DELAY`): the same plan, re-applied as is, never emptied.
    tokio::time::sleep(crate::agent::reconcile::MAX_DELAY + Duration::from_millis(600)).await;
    let during = h.dataplane.since(n);
    assert!(!during.is_empty(), "resyncs keep re-applying");
    assert!(
        during.iter().all(|p| *p == before),
        "the plan never changes while away"
    );
    assert!(
        h.agent.is_ready(),
        "CNI keeps serving from the last known state"
    );
    // ADD for a pod in the state works; for one it would have to fetch, a clear error.
    let known =
        crate::agent::cni::place(&h.agent, &ObjectKey::new("kube-system", "coredns-1")).await;
    assert_eq!(known.unwrap().network, "system");
    let err = crate::agent::cni::place(&h.agent, &ObjectKey::new("team-a", "new"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code, ErrorCode::TRY_AGAIN_LATER);
    assert!(
        err.msg
            .contains("cannot reach the API server at https://fake.invalid:6443"),
        "{}",
        err.msg
    );
    fake.set_mode(Mode::Up);
    until("the API server is back in the metrics", || {
        h.metrics().contains("lace_apiserver_up 1\n")
    })
    .await;
    assert!(h
        .metrics()
        .contains("lace_watch_errors_total{kind=\"Network\"}"));
    h.stop().await;
}

#[tokio::test]
async fn bad_objects_are_left_out_and_everything_else_keeps_working() {
    let mut objects = example_objects();
    objects.extend([
        // The validator's: overlapping subnets, a missing Network, a bad selector.
        json!({"apiVersion": "lace.io/v1alpha1", "kind": "Network", "metadata": {"name": "overlap"},
               "spec": {"subnets": [{"cidr": "10.244.0.0/20", "blockPrefix": 24}]}}),
        json!({"apiVersion": "lace.io/v1alpha1", "kind": "NetworkRoutingPolicy",
               "metadata": {"name": "to-nowhere"}, "spec": {"from": "default", "to": "nowhere"}}),
        json!({"apiVersion": "lace.io/v1alpha1", "kind": "NetworkBindingPolicy",
               "metadata": {"name": "bad-selector"},
               "spec": {"network": "default", "priority": 5, "podSelector": {"matchExpressions":
                   [{"key": "a", "operator": "In", "values": []}]}}}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "backwards", "namespace": "team-a"},
               "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 90, "endPort": 80}]}]}}),
        // Shapes the API server should never send: a wrong type, unknown fields, no status.
        json!({"apiVersion": "lace.io/v1alpha1", "kind": "NetworkBindingPolicy",
               "metadata": {"name": "wrong-type"},
               "spec": {"network": "default", "priority": "high"}}),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "bare", "namespace": "default"},
               "spec": {"nodeName": "node-1", "someFutureField": {"x": 1}}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "bad-ip", "namespace": "default"},
               "spec": {"clusterIP": "10.96.0.999", "ports": [{"port": 80}]}}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "bad-cidr", "namespace": "team-a"},
               "spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}}),
    ]);
    let fake = fake_with(&objects);
    let h = Harness::start("node-1", &fake, timings());
    until("the first plan", || h.dataplane.count() > 0).await;
    assert_eq!(h.dataplane.last().unwrap(), standalone_plan("node-1"));
    let state = h.agent.loaded().unwrap().state.clone();
    assert!(
        state.pods.contains_key(&ObjectKey::new("default", "bare")),
        "no status is fine"
    );
    assert!(!state.network_bindings.contains_key("wrong-type"));
    assert!(!state
        .services
        .contains_key(&ObjectKey::new("default", "bad-ip")));
    let m = h.metrics();
    for line in [
        "lace_rejected_objects{kind=\"Network\"} 1",
        "lace_rejected_objects{kind=\"NetworkRoutingPolicy\"} 1",
        "lace_rejected_objects{kind=\"NetworkBindingPolicy\"} 1",
        "lace_undecodable_objects{kind=\"NetworkBindingPolicy\"} 1",
        "lace_undecodable_objects{kind=\"Service\"} 1",
        "lace_rejected_objects{kind=\"NetworkPolicy\"} 1",
        "lace_undecodable_objects{kind=\"NetworkPolicy\"} 1",
    ] {
        assert!(m.contains(&format!("{line}\n")), "{line}\n{m}");
    }
    // Fixed, it comes in.
    fake.put(
        json!({"apiVersion": "lace.io/v1alpha1", "kind": "NetworkBindingPolicy",
                    "metadata": {"name": "wrong-type"},
                    "spec": {"network": "default", "priority": 3}}),
    );
    until("the fixed object arrives", || {
        h.agent
            .loaded()
            .unwrap()
            .state
            .network_bindings
            .contains_key("wrong-type")
    })
    .await;
    assert!(!h
        .metrics()
        .contains("lace_undecodable_objects{kind=\"NetworkBindingPolicy\"}"));
    h.stop().await;
}

#[tokio::test]
async fn not_ready_until_every_watch_has_listed() {
    let fake = fake_with(&example_objects());
    // The NodeAllocation CRD is not installed (yet).
    fake.set_missing("lace.io/v1alpha1", "NodeAllocation", true);
    let h = Harness::start("node-1", &fake, timings());
    until("the other watches have listed", || {
        h.metrics()
            .contains("lace_watch_synced{kind=\"Network\"} 1\n")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let why = h.agent.not_ready_reason().unwrap().to_string();
    assert!(
        why.contains("nodeallocations.lace.io") && why.contains("CRDs"),
        "{why}"
    );
    assert!(why.contains("https://fake.invalid:6443"), "{why}");
    assert_eq!(
        h.dataplane.count(),
        0,
        "nothing is applied from a partial state"
    );
    fake.set_missing("lace.io/v1alpha1", "NodeAllocation", false);
    until("ready", || h.agent.is_ready()).await;
    until("the first plan", || h.dataplane.count() > 0).await;
    assert_eq!(h.dataplane.last().unwrap(), standalone_plan("node-1"));
    h.stop().await;
}

#[tokio::test]
async fn an_api_server_that_refuses_the_token_keeps_the_agent_not_ready() {
    let fake = fake_with(&example_objects());
    fake.set_mode(Mode::Status(401));
    let h = Harness::start("node-1", &fake, timings());
    until("a few attempts", || fake.count("list nodes") >= 3).await;
    let why = h.agent.not_ready_reason().unwrap().to_string();
    assert!(why.contains("401") && why.contains("token"), "{why}");
    assert!(h.metrics().contains("lace_apiserver_up 0\n"));
    fake.set_mode(Mode::Status(403));
    until("the 403 is reported", || {
        h.agent
            .not_ready_reason()
            .is_some_and(|w| w.to_string().contains("403"))
    })
    .await;
    assert!(h
        .agent
        .not_ready_reason()
        .unwrap()
        .to_string()
        .contains("ClusterRole"));
    fake.set_mode(Mode::Up);
    until("ready", || h.agent.is_ready()).await;
    h.stop().await;
}

/// Every request the scenarios above make, against the recorded set (which the chart's
/// ClusterRole is checked against): nothing missing, nothing recorded that no code issues.
#[tokio::test]
async fn the_agents_api_requests_are_the_recorded_set() {
    let mut seen = BTreeSet::new();
    for fake in [scenario_plans("node-2").await, scenario_unknown_pod().await] {
        seen.extend(fake.requests().iter().map(|r| r.rbac()));
    }
    let text: String = "# Every request lace-agent makes (verb resource[.group][/subresource]), recorded by\n\
                        # src/agent/cluster/tests.rs; the chart's lace-node ClusterRole grants exactly these\n\
                        # (tests/charts/test_agent_rbac.py). Regenerate with LACE_BLESS=1.\n"
        .to_string()
        + &seen.iter().map(|s| format!("{s}\n")).collect::<String>();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(API_REQUESTS);
    if std::env::var_os("LACE_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    assert_eq!(
        blessed(),
        seen,
        "the agent's requests changed; review, re-bless with LACE_BLESS=1 and update the \
         lace-node ClusterRole"
    );
}

// ---- TLS to the fake served over HTTPS with kubeadm's certificate (and worse ones)

mod tls {
    use lace_fake_kube::pki::{Pki, KUBEADM_NAMES};
    use lace_fake_kube::Served;

    use super::*;

    /// The fake, without objects, over HTTPS with `pki`'s certificate.
    async fn https(pki: &Pki) -> (FakeApi, Served) {
        let fake = FakeApi::new();
        let served = fake.serve_tls(pki).await.unwrap();
        (fake, served)
    }

    fn agent_for(source: &Arc<KubeSource>, state: &Path) -> Agent {
        Agent::new(
            "node-1".into(),
            IpamStore::open(state).unwrap(),
            Arc::new(crate::agent::PlanSink::default()),
            source.clone(),
        )
    }

    /// Whether the source connects within a second; else the agent's not-ready reason.
    async fn connect(pki: &Pki, addr: std::net::SocketAddr) -> Result<(), String> {
        let sa = pki.service_account_dir("token-1").unwrap();
        let api = ApiServer::new(Some(&addr.to_string()), sa.path()).unwrap();
        let source = Arc::new(KubeSource::new("node-1".into(), api).with_timings(timings()));
        let state = tempfile::tempdir().unwrap();
        let agent = agent_for(&source, state.path());
        match tokio::time::timeout(Duration::from_secs(1), source.connect(&agent)).await {
            Ok(_) => Ok(()),
            Err(_) => Err(agent
                .loaded()
                .err()
                .map(|why| why.to_string())
                .unwrap_or_default()),
        }
    }

    async fn list_nodes(api: &ApiServer, in_cluster_name: bool) -> Result<(), kube::Error> {
        let client = api.client(in_cluster_name).unwrap();
        let nodes: kube::Api<crate::k8s::Slim<crate::objects::NodeBody>> =
            kube::Api::all_with(client, &());
        nodes.list(&Default::default()).await.map(drop)
    }

    #[tokio::test]
    async fn kubeadms_certificate_is_verified_for_the_endpointslice_ip() {
        let pki = Pki::kubeadm("127.0.0.1".parse().unwrap()).unwrap();
        let (_fake, server) = https(&pki).await;
        let sa = pki.service_account_dir("token-1").unwrap();
        // The address as the chart bakes it: the EndpointSlice's IP and port.
        let api = ApiServer::new(Some(&server.addr.to_string()), sa.path()).unwrap();
        list_nodes(&api, false)
            .await
            .expect("verified as the IP, no other name needed");
        assert_eq!(connect(&pki, server.addr).await, Ok(()));
    }

    #[tokio::test]
    async fn a_certificate_without_the_ip_is_verified_as_kubernetes_default_svc() {
        let pki = Pki::new(&KUBEADM_NAMES).unwrap();
        let (_fake, server) = https(&pki).await;
        let sa = pki.service_account_dir("token-1").unwrap();
        let api = ApiServer::new(Some(&server.addr.to_string()), sa.path()).unwrap();
        let err = list_nodes(&api, false).await.unwrap_err();
        assert!(super::super::connect::is_name_mismatch(&err), "{err:?}");
        list_nodes(&api, true)
            .await
            .expect("valid for kubernetes.default.svc");
        assert_eq!(
            connect(&pki, server.addr).await,
            Ok(()),
            "the source falls back"
        );
    }

    #[tokio::test]
    async fn a_certificate_of_another_ca_is_refused_naming_the_ca_file() {
        let pki = Pki::kubeadm("127.0.0.1".parse().unwrap()).unwrap();
        let (fake, server) = https(&pki).await;
        let other = Pki::kubeadm("127.0.0.1".parse().unwrap()).unwrap();
        let why = connect(&other, server.addr).await.unwrap_err();
        assert!(
            why.contains("not signed by the CA in") && why.contains("ca.crt"),
            "{why}"
        );
        assert!(why.contains(&format!("https://{}", server.addr)), "{why}");
        assert_eq!(fake.requests().len(), 0);
    }

    #[tokio::test]
    async fn a_certificate_naming_neither_says_what_to_set() {
        let pki = Pki::new(&["api.example.com"]).unwrap();
        let (_fake, server) = https(&pki).await;
        let why = connect(&pki, server.addr).await.unwrap_err();
        assert!(
            why.contains("names neither") && why.contains("node.apiserverAddress"),
            "{why}"
        );
    }
}
