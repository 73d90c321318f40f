//! The fake's own behaviour, request by request through its tower service: what the
//! components' tests rely on it to do as the API server does.

use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::resource::Target;
use crate::{plural, FakeApi, Fault, Mode, Resource};

const APPLY: &str = "application/apply-patch+yaml";

async fn call(
    fake: &FakeApi,
    method: &str,
    uri: &str,
    content_type: &str,
    body: Value,
) -> (u16, Value) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let request = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .body(body)
        .unwrap();
    let response = fake.service().oneshot(request).await.unwrap();
    let code = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap())
}

async fn get(fake: &FakeApi, uri: &str) -> (u16, Value) {
    call(fake, "GET", uri, "", Value::Null).await
}

/// The first `n` events of a watch (the stream stays open).
async fn watch(fake: &FakeApi, uri: &str, n: usize) -> Vec<Value> {
    let request = http::Request::get(uri).body(String::new()).unwrap();
    let mut body = fake.service().oneshot(request).await.unwrap().into_body();
    let mut text = String::new();
    while text.lines().count() < n {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("an event")
            .expect("the watch is open")
            .unwrap();
        text.push_str(std::str::from_utf8(frame.data_ref().unwrap()).unwrap());
    }
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn pod(ns: &str, name: &str, node: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
           "spec": {"nodeName": node}})
}

fn network(name: &str) -> Value {
    json!({"apiVersion": "lace.io/v1alpha1", "kind": "Network", "metadata": {"name": name},
           "spec": {"external": true}})
}

#[test]
fn plurals_are_the_api_servers_guesses() {
    assert_eq!(plural("Network"), "networks");
    assert_eq!(plural("NetworkBindingPolicy"), "networkbindingpolicies");
    assert_eq!(plural("EndpointSlice"), "endpointslices");
    assert_eq!(plural("Ingress"), "ingresses");
    assert_eq!(
        Resource::of("lace.io/v1alpha1", "NodeAllocation").qualified(),
        "nodeallocations.lace.io"
    );
}

#[test]
fn paths_name_group_namespace_object_and_subresource() {
    let t = Target::parse("/api/v1/namespaces/team-a/pods/web/status").unwrap();
    assert_eq!(t.resource, Resource::of("v1", "Pod"));
    assert_eq!(
        (
            t.namespace.as_deref(),
            t.name.as_deref(),
            t.subresource.as_deref()
        ),
        (Some("team-a"), Some("web"), Some("status"))
    );
    let t = Target::parse("/apis/lace.io/v1alpha1/networks").unwrap();
    assert_eq!(
        (t.api_version().as_str(), t.namespace, t.name),
        ("lace.io/v1alpha1", None, None)
    );
    let t = Target::parse("/api/v1/namespaces/team-a").unwrap();
    assert_eq!(
        (t.resource.plural.as_str(), t.name.as_deref()),
        ("namespaces", Some("team-a"))
    );
    assert_eq!(Target::parse("/version"), None);
}

#[tokio::test]
async fn lists_filter_by_namespace_field_and_label() {
    let fake = FakeApi::new();
    fake.put(pod("a", "p1", "node-1", "web"));
    fake.put(pod("a", "p2", "node-2", "web"));
    fake.put(pod("b", "p3", "node-1", "db"));
    let names = |list: Value| -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(get(&fake, "/api/v1/pods").await.1),
        ["p1", "p2", "p3"]
    );
    assert_eq!(
        names(get(&fake, "/api/v1/namespaces/a/pods").await.1),
        ["p1", "p2"]
    );
    let on_node = get(&fake, "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1")
        .await
        .1;
    assert_eq!(names(on_node), ["p1", "p3"]);
    let not_web = get(&fake, "/api/v1/pods?labelSelector=app!%3Dweb").await.1;
    assert_eq!(names(not_web), ["p3"]);
    let list = get(&fake, "/api/v1/pods").await.1;
    assert_eq!(list["metadata"]["resourceVersion"], "3");
}

#[tokio::test]
async fn a_watch_replays_from_its_version_and_gets_410_once_compacted() {
    let fake = FakeApi::new();
    fake.put(network("a"));
    fake.put(network("b"));
    let from_1 = watch(
        &fake,
        "/apis/lace.io/v1alpha1/networks?watch=true&resourceVersion=1",
        1,
    )
    .await;
    assert_eq!(from_1[0]["type"], "ADDED");
    assert_eq!(from_1[0]["object"]["metadata"]["name"], "b");
    // An unchanged object is no write: no version, no event.
    let before = fake.get("lace.io/v1alpha1", "Network", "", "b").unwrap();
    assert_eq!(fake.put(network("b")), before);
    fake.remove("lace.io/v1alpha1", "Network", "", "a");
    let all = watch(
        &fake,
        "/apis/lace.io/v1alpha1/networks?watch=true&resourceVersion=0",
        3,
    )
    .await;
    let events: Vec<(&str, &str)> = all
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["resourceVersion"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(events, [("ADDED", "1"), ("ADDED", "2"), ("DELETED", "3")]);
    fake.compact();
    let gone = watch(
        &fake,
        "/apis/lace.io/v1alpha1/networks?watch=true&resourceVersion=2",
        1,
    )
    .await;
    assert_eq!(
        (gone[0]["type"].as_str(), gone[0]["object"]["code"].as_u64()),
        (Some("ERROR"), Some(410))
    );
}

#[tokio::test]
async fn live_events_reach_the_watches_that_select_them() {
    let fake = FakeApi::new();
    let request =
        http::Request::get("/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dnode-1")
            .body(String::new())
            .unwrap();
    let service = fake.service();
    let id = service.id();
    let mut body = service.oneshot(request).await.unwrap().into_body();
    fake.put(pod("a", "elsewhere", "node-2", "web"));
    fake.put(pod("a", "here", "node-1", "web"));
    let frame = body.frame().await.unwrap().unwrap();
    let event: Value = serde_json::from_slice(frame.data_ref().unwrap()).unwrap();
    assert_eq!(event["object"]["metadata"]["name"], "here");
    assert_eq!(fake.sent(id), 1);
    assert_eq!(fake.open_watches(), 1);
    fake.end_watches();
    assert!(body.frame().await.is_none(), "the watch ended");
}

#[tokio::test]
async fn patches_merge_strategically_by_json_patch_and_by_apply() {
    let fake = FakeApi::new();
    fake.put(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {"a": "1", "b": "2"}},
                    "spec": {"podCIDR": "10.0.0.0/24"},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
    let (code, node) = call(
        &fake,
        "PATCH",
        "/api/v1/nodes/n",
        "application/merge-patch+json",
        json!({"metadata": {"labels": {"a": null, "c": "3"}}, "status": {"conditions": []}}),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(node["metadata"]["labels"], json!({"b": "2", "c": "3"}));
    assert_eq!(
        node["status"]["conditions"][0]["type"], "Ready",
        "status only through /status"
    );
    let (_, node) = call(&fake, "PATCH", "/api/v1/nodes/n/status", "application/strategic-merge-patch+json",
        json!({"spec": {"podCIDR": "x"}, "status": {"conditions": [{"type": "NetworkUnavailable", "status": "False"}]}})).await;
    let types: Vec<&str> = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["Ready", "NetworkUnavailable"],
        "conditions merge by type"
    );
    assert_eq!(
        node["spec"]["podCIDR"], "10.0.0.0/24",
        "only status through /status"
    );
    let ops = json!([{"op": "test", "path": "/metadata/labels/b", "value": "2"},
                     {"op": "replace", "path": "/metadata/labels/b", "value": "4"},
                     {"op": "add", "path": "/spec/taints", "value": []},
                     {"op": "add", "path": "/spec/taints/-", "value": {"key": "k"}}]);
    let (code, node) = call(
        &fake,
        "PATCH",
        "/api/v1/nodes/n",
        "application/json-patch+json",
        ops,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        (
            node["metadata"]["labels"]["b"].as_str(),
            &node["spec"]["taints"]
        ),
        (Some("4"), &json!([{"key": "k"}]))
    );
    let failing = json!([{"op": "remove", "path": "/spec/podCIDR"}, {"op": "test", "path": "/spec/taints", "value": []}]);
    let (code, _) = call(
        &fake,
        "PATCH",
        "/api/v1/nodes/n",
        "application/json-patch+json",
        failing,
    )
    .await;
    assert_eq!(code, 422);
    let node = fake.get("v1", "Node", "", "n").unwrap();
    assert_eq!(node["spec"]["podCIDR"], "10.0.0.0/24", "all or nothing");
    assert_eq!(
        node["metadata"]["generation"], 2,
        "one spec change got through"
    );
}

#[tokio::test]
async fn apply_creates_and_removes_only_what_its_manager_stopped_applying() {
    let fake = FakeApi::new();
    let path = "/apis/lace.io/v1alpha1/nodeallocations/n?fieldManager=ctl&force=true";
    let applied = json!({"apiVersion": "lace.io/v1alpha1", "kind": "NodeAllocation",
        "metadata": {"name": "n", "labels": {"mine": "1"}}, "spec": {"index": 1, "old": true}});
    let (code, created) = call(&fake, "PATCH", path, APPLY, applied).await;
    assert_eq!(
        (code, created["metadata"]["uid"].as_str()),
        (201, Some("uid-1"))
    );
    let mut other = created.clone();
    other["metadata"]["labels"]["theirs"] = "2".into();
    fake.put(other);
    let applied = json!({"apiVersion": "lace.io/v1alpha1", "kind": "NodeAllocation",
        "metadata": {"name": "n"}, "spec": {"index": 2}});
    let (code, updated) = call(&fake, "PATCH", path, APPLY, applied).await;
    assert_eq!(code, 200);
    assert_eq!(updated["metadata"]["labels"], json!({"theirs": "2"}));
    assert_eq!(updated["spec"], json!({"index": 2}));
    let stale = json!({"apiVersion": "lace.io/v1alpha1", "kind": "NodeAllocation",
        "metadata": {"name": "n", "resourceVersion": "1"}, "spec": {"index": 3}});
    assert_eq!(call(&fake, "PATCH", path, APPLY, stale).await.0, 409);
    let status = json!({"apiVersion": "lace.io/v1alpha1", "kind": "Network", "metadata": {"name": "gone"},
        "status": {}});
    let missing = "/apis/lace.io/v1alpha1/networks/gone/status?fieldManager=ctl";
    assert_eq!(call(&fake, "PATCH", missing, APPLY, status).await.0, 404);
    let records: Vec<(String, bool)> = fake
        .requests()
        .iter()
        .map(|r| (r.rbac(), r.created))
        .collect();
    assert_eq!(
        records[0],
        ("patch nodeallocations.lace.io".to_string(), true)
    );
    assert!(!records[1].1);
    assert_eq!(fake.requests()[3].authorized().len(), 1);
}

#[tokio::test]
async fn creates_and_deletes_keep_the_api_servers_rules() {
    let fake = FakeApi::new();
    let events = "/apis/events.k8s.io/v1/namespaces/default/events";
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"}, "note": "x"});
    let (code, stored) = call(&fake, "POST", events, "application/json", event.clone()).await;
    assert_eq!(
        (code, stored["metadata"]["namespace"].as_str()),
        (201, Some("default"))
    );
    assert_eq!(
        call(&fake, "POST", events, "application/json", event)
            .await
            .0,
        409
    );
    let wrong = json!({"preconditions": {"uid": "uid-9"}});
    assert_eq!(
        call(
            &fake,
            "DELETE",
            &format!("{events}/e1"),
            "application/json",
            wrong
        )
        .await
        .0,
        409
    );
    let right = json!({"preconditions": {"uid": "uid-1"}});
    assert_eq!(
        call(
            &fake,
            "DELETE",
            &format!("{events}/e1"),
            "application/json",
            right
        )
        .await
        .0,
        200
    );
    assert_eq!(get(&fake, &format!("{events}/e1")).await.0, 404);
    let writes: Vec<String> = fake.take_writes().iter().map(|w| w.line()).collect();
    assert_eq!(writes.len(), 4);
    assert!(fake.take_writes().is_empty(), "taken");
}

#[tokio::test]
async fn faults_modes_and_missing_resources_answer_instead() {
    let fake = FakeApi::new();
    fake.put(network("a"));
    let nets = "/apis/lace.io/v1alpha1/networks";
    fake.fault(Fault::new("list", nets, 500, "etcd timed out").times(1));
    let (code, status) = get(&fake, nets).await;
    assert_eq!(
        (code, status["message"].as_str()),
        (500, Some("etcd timed out"))
    );
    assert_eq!(get(&fake, nets).await.0, 200, "only once");
    fake.set_missing("lace.io/v1alpha1", "Network", true);
    assert_eq!(get(&fake, nets).await.0, 404);
    fake.set_missing("lace.io/v1alpha1", "Network", false);
    fake.set_mode(Mode::Status(403));
    let (code, status) = get(&fake, nets).await;
    assert_eq!((code, status["reason"].as_str()), (403, Some("Forbidden")));
    fake.set_mode(Mode::Refusing);
    let request = http::Request::get(nets).body(String::new()).unwrap();
    let err = fake.service().oneshot(request).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    assert_eq!(
        fake.count("list networks.lace.io"),
        4,
        "refused requests never arrive"
    );
}

#[tokio::test]
async fn over_tcp_it_serves_the_api_and_takes_objects_on_its_control_path() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fake = FakeApi::new();
    let served = fake.serve().await.unwrap();
    let addr = served.addr;
    let exchange = |request: String| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    let body = network("tcp").to_string();
    let put = exchange(format!("POST /fake/put HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())).await;
    assert!(put.starts_with("HTTP/1.1 204"), "{put}");
    let got = exchange(
        "GET /apis/lace.io/v1alpha1/networks/tcp HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            .into(),
    )
    .await;
    assert!(
        got.starts_with("HTTP/1.1 200") && got.contains("\"uid\":\"uid-1\""),
        "{got}"
    );
    assert_eq!(fake.count("get networks.lace.io"), 1);
}
