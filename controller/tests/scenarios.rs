//! The controller against the fake API server (`lace-fake-kube`, in process): each
//! scenario asserts the requests it makes (method, path, field manager, body), and every
//! request it makes is recorded for the RBAC check (`rbac_is_exactly_what_the_scenarios_use`).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod support;

use std::collections::BTreeSet;

use lace::telemetry::Probes;
use lace_controller::FatalError;
use lace_fake_kube::{FakeApi, Fault, Recorded};
use serde_json::{json, Value};
use support::{network, node, policy, Harness, PREFIX};

const NA: &str = "/apis/lace.io/v1alpha1/nodeallocations";
const NETA: &str = "/apis/lace.io/v1alpha1/networkallocations";
const NETS: &str = "/apis/lace.io/v1alpha1/networks";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const APPLY: &str = "(apply, fieldManager=lace-controller, force=true)";

fn lines(writes: &[Recorded]) -> Vec<String> {
    let mut l: Vec<String> = writes.iter().map(Recorded::line).collect();
    l.sort();
    l
}

fn find<'a>(writes: &'a [Recorded], method: &str, path: &str) -> &'a Recorded {
    writes
        .iter()
        .find(|w| w.method == method && w.path == path)
        .unwrap_or_else(|| panic!("no {method} {path} in {:#?}", lines(writes)))
}

/// The Events the writes published: `(regarding, type, reason, note)`, sorted.
fn events(writes: &[Recorded]) -> Vec<(String, String, String, String)> {
    let mut e: Vec<_> = writes
        .iter()
        .filter(|w| w.path.starts_with(EVENTS))
        .map(|w| {
            let b = &w.body;
            let r = &b["regarding"];
            (
                format!(
                    "{}/{}",
                    r["kind"].as_str().unwrap_or("?"),
                    r["name"].as_str().unwrap_or("?")
                ),
                b["type"].as_str().unwrap_or_default().to_string(),
                b["reason"].as_str().unwrap_or_default().to_string(),
                b["note"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    e.sort();
    e
}

fn uid(fake: &FakeApi, api_version: &str, kind: &str, name: &str) -> String {
    fake.get(api_version, kind, "", name).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A condition with its stamps removed (they are the time of the run).
fn unstamped(c: &Value) -> Value {
    let mut c = c.clone();
    let t = c.as_object_mut().unwrap().remove("lastTransitionTime");
    assert!(
        t.is_some_and(|t| t
            .as_str()
            .is_some_and(|t| t.ends_with('Z') && !t.contains('.'))),
        "RFC 3339, whole seconds"
    );
    c
}

fn conditions(body: &Value) -> Vec<Value> {
    body["status"]["conditions"]
        .as_array()
        .unwrap_or_else(|| panic!("no status.conditions in {body:#}"))
        .iter()
        .map(unstamped)
        .collect()
}

fn ready(status: &str, reason: &str, message: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": message, "observedGeneration": 1})
}

fn dual_node(name: &str, i: u8) -> Value {
    node(
        name,
        &[&format!("192.168.0.{i}"), &format!("fd00:fab::{i}")],
    )
}

/// Two nodes (one IPv4-only), a dual-stack Network, the internet, a binding policy.
fn small_cluster(fake: &FakeApi) {
    fake.put(dual_node("node-1", 11));
    fake.put(node("node-2", &["192.168.0.12"]));
    fake.put(network(
        "tenant",
        &[("10.244.0.0/16", 24), ("fd00:244::/56", 64)],
    ));
    fake.put(network("internet", &[]));
    fake.put(policy(
        "NetworkBindingPolicy",
        "tenant",
        json!({"network": "tenant", "priority": 10}),
    ));
    fake.put(policy(
        "ServiceBindingPolicy",
        "kubernetes",
        json!({"network": "internet", "services": [{"namespace": "default", "name": "kubernetes"}]}),
    ));
    fake.put(policy(
        "ServiceRoutingPolicy",
        "tenant-kubernetes",
        json!({"from": "tenant", "to": "internet"}),
    ));
}

// ---------------------------------------------------------------- scenarios

/// From scratch: one apply per internal object, one status per Network and policy.
async fn new_cluster() -> FakeApi {
    let fake = FakeApi::new();
    small_cluster(&fake);
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    let writes = fake.take_writes();
    assert_eq!(
        lines(&writes),
        [
            format!("PATCH {NETA}/internet {APPLY}"),
            format!("PATCH {NETA}/tenant {APPLY}"),
            format!("PATCH /apis/lace.io/v1alpha1/networkbindingpolicies/tenant/status {APPLY}"),
            format!("PATCH {NETS}/internet/status {APPLY}"),
            format!("PATCH {NETS}/tenant/status {APPLY}"),
            format!("PATCH {NA}/node-1 {APPLY}"),
            format!("PATCH {NA}/node-2 {APPLY}"),
            format!("PATCH /apis/lace.io/v1alpha1/servicebindingpolicies/kubernetes/status {APPLY}"),
            format!("PATCH /apis/lace.io/v1alpha1/serviceroutingpolicies/tenant-kubernetes/status {APPLY}"),
            format!("POST {EVENTS}"),
            format!("POST {EVENTS}"),
            format!("POST {EVENTS}"),
            format!("POST {EVENTS}"),
        ]
    );
    let n1 = find(&writes, "PATCH", &format!("{NA}/node-1"));
    assert_eq!(n1.content_type, "application/apply-patch+yaml");
    assert_eq!(
        n1.body,
        json!({
            "apiVersion": "lace.io/v1alpha1", "kind": "NodeAllocation",
            "metadata": {"name": "node-1", "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": "node-1",
                "uid": uid(&fake, "v1", "Node", "node-1"), "controller": true}]},
            "spec": {"index": 1, "locator": "2001:db8:100::1:0:0/96",
                     "underlay": {"ipv4": "192.168.0.11", "ipv6": "fd00:fab::11"}},
        })
    );
    assert_eq!(
        find(&writes, "PATCH", &format!("{NA}/node-2")).body["spec"],
        json!({"index": 2, "locator": "2001:db8:100::2:0:0/96", "underlay": {"ipv4": "192.168.0.12"}})
    );
    assert_eq!(
        find(&writes, "PATCH", &format!("{NETA}/tenant")).body,
        json!({
            "apiVersion": "lace.io/v1alpha1", "kind": "NetworkAllocation",
            "metadata": {"name": "tenant", "ownerReferences": [{
                "apiVersion": "lace.io/v1alpha1", "kind": "Network", "name": "tenant",
                "uid": uid(&fake, "lace.io/v1alpha1", "Network", "tenant"), "controller": true}]},
            "spec": {"function": 2},
        })
    );
    assert_eq!(
        find(&writes, "PATCH", &format!("{NETA}/internet")).body["spec"],
        json!({"function": 1})
    );
    let status = find(&writes, "PATCH", &format!("{NETS}/tenant/status"));
    assert_eq!(
        (
            &status.body["apiVersion"],
            &status.body["kind"],
            &status.body["metadata"]
        ),
        (
            &json!("lace.io/v1alpha1"),
            &json!("Network"),
            &json!({"name": "tenant"})
        )
    );
    assert_eq!(
        conditions(&status.body),
        [
            ready("True", "Allocated", "SID function 2"),
            json!({"type": "BlocksExhausted", "status": "False", "reason": "BlocksAvailable",
                   "message": "its subnets hold blocks for 256 nodes", "observedGeneration": 1}),
        ]
    );
    assert_eq!(
        conditions(&find(&writes, "PATCH", &format!("{NETS}/internet/status")).body),
        [ready("True", "Allocated", "SID function 1")],
        "an external Network has no blocks"
    );
    assert_eq!(
        conditions(
            &find(
                &writes,
                "PATCH",
                "/apis/lace.io/v1alpha1/networkbindingpolicies/tenant/status"
            )
            .body
        ),
        [json!({"type": "Ready", "status": "True", "reason": "Valid", "observedGeneration": 1})]
    );
    assert_eq!(
        events(&writes),
        [
            ("Network/internet".into(), "Normal".into(), "Allocated".into(), "SID function 1".into()),
            ("Network/tenant".into(), "Normal".into(), "Allocated".into(), "SID function 2".into()),
            ("Node/node-1".into(), "Normal".into(), "Allocated".into(),
             "index 1, SRv6 locator 2001:db8:100::1:0:0/96, underlay 192.168.0.11 and fd00:fab::11".into()),
            ("Node/node-2".into(), "Normal".into(), "Allocated".into(),
             "index 2, SRv6 locator 2001:db8:100::2:0:0/96, underlay 192.168.0.12".into()),
        ]
    );
    assert_eq!(h.metrics.readyz(), Ok(()));
    let metrics = h.metrics.encode();
    for line in [
        r#"lace_controller_nodes{state="allocated"} 2"#,
        r#"lace_controller_networks{state="ready"} 2"#,
        r#"lace_controller_writes_total{verb="patch",resource="nodeallocations",result="ok"} 2"#,
        r#"lace_controller_events_total{event_type="Normal",result="ok"} 4"#,
        "lace_controller_caches_synced 1",
        "lace_controller_node_locators_free 4294967293",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    let event = find(&writes, "POST", EVENTS);
    assert_eq!(event.body["reportingController"], "lace-controller");
    assert_eq!(event.body["action"], "Allocate");

    // The same objects through the standalone allocator (`lace-agent allocate`) give the
    // same values.
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = String::new();
    for (av, kind, name) in [
        ("v1", "Node", "node-1"),
        ("v1", "Node", "node-2"),
        ("lace.io/v1alpha1", "Network", "tenant"),
        ("lace.io/v1alpha1", "Network", "internet"),
    ] {
        yaml += &format!(
            "---\n{}",
            serde_saphyr::to_string(&fake.get(av, kind, "", name).unwrap()).unwrap()
        );
    }
    std::fs::write(dir.path().join("cluster.yaml"), yaml).unwrap();
    let mut state = lace::load::load_dir(dir.path()).unwrap();
    state.config.srv6_locator_prefix = Some(PREFIX.parse().unwrap());
    let standalone = lace::alloc::allocate(&state).unwrap();
    assert_eq!(standalone.node_allocations.len(), 2);
    for (name, a) in &standalone.node_allocations {
        let written = fake
            .get("lace.io/v1alpha1", "NodeAllocation", "", name)
            .unwrap();
        assert_eq!(written["spec"], serde_json::to_value(a).unwrap(), "{name}");
    }
    for (name, a) in &standalone.network_allocations {
        let written = fake
            .get("lace.io/v1alpha1", "NetworkAllocation", "", name)
            .unwrap();
        assert_eq!(written["spec"], serde_json::to_value(a).unwrap(), "{name}");
    }
    h.stop().await.unwrap();
    fake
}

/// A node joins: one NodeAllocation and its Event; no Network or other node is written.
async fn new_node() -> FakeApi {
    let fake = FakeApi::new();
    small_cluster(&fake);
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    fake.take_writes();
    fake.put(dual_node("node-3", 13));
    h.settle().await;
    let writes = fake.take_writes();
    assert_eq!(
        lines(&writes),
        [
            format!("PATCH {NA}/node-3 {APPLY}"),
            format!("POST {EVENTS}")
        ]
    );
    assert_eq!(
        find(&writes, "PATCH", &format!("{NA}/node-3")).body["spec"],
        json!({"index": 3, "locator": "2001:db8:100::3:0:0/96",
               "underlay": {"ipv4": "192.168.0.13", "ipv6": "fd00:fab::13"}})
    );
    // Its labels or heartbeat change nothing.
    let mut n3 = fake.get("v1", "Node", "", "node-3").unwrap();
    n3["metadata"]["labels"]["team"] = json!("blue");
    n3["status"]["conditions"][0]["lastHeartbeatTime"] = json!("2026-01-01T00:01:00Z");
    fake.put(n3);
    h.settle().await;
    assert_eq!(lines(&fake.take_writes()), Vec::<String>::new());
    h.stop().await.unwrap();
    fake
}

/// A Network is created: one NetworkAllocation, one status, one Event; no NodeAllocation.
async fn new_network() -> FakeApi {
    let fake = FakeApi::new();
    small_cluster(&fake);
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    fake.take_writes();
    fake.put(network("blue", &[("10.245.0.0/16", 26)]));
    h.settle().await;
    let writes = fake.take_writes();
    assert_eq!(
        lines(&writes),
        [
            format!("PATCH {NETA}/blue {APPLY}"),
            format!("PATCH {NETS}/blue/status {APPLY}"),
            format!("POST {EVENTS}"),
        ]
    );
    assert_eq!(
        find(&writes, "PATCH", &format!("{NETA}/blue")).body["spec"],
        json!({"function": 3}),
        "the lowest free: internet holds 1, tenant 2"
    );
    h.stop().await.unwrap();
    fake
}

/// A Node and a Network are deleted: the sweep deletes their internal objects (uid as
/// precondition), and the freed index goes to the next node.
async fn deleted_node_and_network() -> FakeApi {
    let fake = FakeApi::new();
    small_cluster(&fake);
    fake.put(dual_node("node-3", 13));
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    fake.take_writes();
    let alloc_uid = uid(&fake, "lace.io/v1alpha1", "NodeAllocation", "node-1");
    fake.remove("v1", "Node", "", "node-1");
    h.settle().await;
    let writes = fake.take_writes();
    assert_eq!(lines(&writes), [format!("DELETE {NA}/node-1")]);
    assert_eq!(
        writes[0].body["preconditions"],
        json!({"uid": alloc_uid}),
        "never deletes a re-created object of the same name"
    );
    assert!(fake
        .get("lace.io/v1alpha1", "NodeAllocation", "", "node-1")
        .is_none());

    // The garbage collector may be first (owner reference): then the sweep has nothing to do.
    fake.remove("v1", "Node", "", "node-2");
    fake.remove("lace.io/v1alpha1", "NodeAllocation", "", "node-2");
    h.settle().await;
    assert_eq!(lines(&fake.take_writes()), Vec::<String>::new());

    fake.put(dual_node("node-9", 19));
    h.settle().await;
    let writes = fake.take_writes();
    assert_eq!(
        find(&writes, "PATCH", &format!("{NA}/node-9")).body["spec"]["index"],
        1,
        "node-1's freed index, the lowest free"
    );

    let net_alloc_uid = uid(&fake, "lace.io/v1alpha1", "NetworkAllocation", "tenant");
    fake.remove("lace.io/v1alpha1", "Network", "", "tenant");
    h.settle().await;
    let writes = fake.take_writes();
    assert_eq!(
        lines(&writes),
        [
            format!("DELETE {NETA}/tenant"),
            // The policies naming it now name a missing Network.
            format!("PATCH /apis/lace.io/v1alpha1/networkbindingpolicies/tenant/status {APPLY}"),
            format!("PATCH /apis/lace.io/v1alpha1/serviceroutingpolicies/tenant-kubernetes/status {APPLY}"),
            format!("POST {EVENTS}"),
            format!("POST {EVENTS}"),
        ]
    );
    assert_eq!(
        find(&writes, "DELETE", &format!("{NETA}/tenant")).body["preconditions"],
        json!({"uid": net_alloc_uid})
    );
    h.stop().await.unwrap();
    fake
}

/// A restart over an allocated cluster writes nothing; allocations that exist are taken as
/// given (even when not the lowest), also when the list of them arrives late.
async fn restart() -> FakeApi {
    let fake = FakeApi::new();
    small_cluster(&fake);
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    h.stop().await.unwrap();
    fake.take_writes();

    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    assert_eq!(
        lines(&fake.take_writes()),
        Vec::<String>::new(),
        "a restart writes nothing"
    );
    h.stop().await.unwrap();

    // Allocations recorded before (by `lace-agent allocate` and kubectl, say): a node at
    // index 7, a Network at function 9; the list of NodeAllocations fails once first.
    let fake = FakeApi::new();
    small_cluster(&fake);
    fake.put(json!({
        "apiVersion": "lace.io/v1alpha1", "kind": "NodeAllocation", "metadata": {"name": "node-2"},
        "spec": {"index": 7, "locator": "2001:db8:100::7:0:0/96", "underlay": {"ipv4": "192.168.0.12"}},
    }));
    fake.put(json!({
        "apiVersion": "lace.io/v1alpha1", "kind": "NetworkAllocation", "metadata": {"name": "tenant"},
        "spec": {"function": 9},
    }));
    fake.fault(Fault::new("list", NA, 500, "etcdserver: request timed out").times(1));
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    let writes = fake.take_writes();
    let n2 = find(&writes, "PATCH", &format!("{NA}/node-2"));
    assert_eq!(n2.body["spec"]["index"], 7, "kept");
    assert_eq!(
        n2.body["metadata"]["ownerReferences"][0]["uid"],
        json!(uid(&fake, "v1", "Node", "node-2")),
        "adopted"
    );
    assert!(
        n2.body["metadata"]["resourceVersion"].is_string(),
        "an update, with the version it read"
    );
    assert_eq!(
        find(&writes, "PATCH", &format!("{NA}/node-1")).body["spec"]["index"],
        1
    );
    assert_eq!(
        find(&writes, "PATCH", &format!("{NETA}/tenant")).body["spec"]["function"],
        9
    );
    assert_eq!(
        find(&writes, "PATCH", &format!("{NETA}/internet")).body["spec"]["function"],
        1
    );
    let lists: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| r.path == NA && r.verb == "list")
        .map(|r| r.line())
        .collect();
    assert_eq!(lists.len(), 2, "the failed list is retried: {lists:?}");
    let first_write = fake.requests().iter().position(Recorded::is_write).unwrap();
    let second_list = fake
        .requests()
        .iter()
        .enumerate()
        .filter(|(_, r)| r.path == NA && r.verb == "list")
        .nth(1)
        .unwrap()
        .0;
    assert!(
        second_list < first_write,
        "nothing is written before every watch has listed"
    );
    // Allocated only where nothing was: no Reallocated Events.
    assert!(
        events(&writes).iter().all(|e| e.2 == "Allocated"),
        "{:?}",
        events(&writes)
    );
    h.stop().await.unwrap();
    fake
}

/// A 409: the NodeAllocation changed since it was read; the controller backs off and applies
/// again with the version it now sees.
async fn conflict() -> FakeApi {
    let fake = FakeApi::new();
    small_cluster(&fake);
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    fake.take_writes();
    let before = fake
        .get("lace.io/v1alpha1", "NodeAllocation", "", "node-1")
        .unwrap();
    let mut edited = before.clone();
    edited["metadata"]["labels"] = json!({"edited-by": "someone-else"});
    fake.fault(
        Fault::new(
            "patch",
            &format!("{NA}/node-1"),
            409,
            "the object has been modified",
        )
        .times(1)
        .after_update(edited),
    );
    // The node's address changes: the NodeAllocation's underlay follows.
    fake.put(node("node-1", &["192.168.0.21", "fd00:fab::11"]));
    h.settle().await;
    let writes = fake.take_writes();
    let patches: Vec<&Recorded> = writes
        .iter()
        .filter(|w| w.path == format!("{NA}/node-1"))
        .collect();
    assert_eq!(patches.len(), 2, "{:#?}", lines(&writes));
    let rv = |w: &Recorded| {
        w.body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        rv(patches[0]),
        before["metadata"]["resourceVersion"].as_str().unwrap()
    );
    assert_ne!(
        rv(patches[1]),
        rv(patches[0]),
        "the retry applies over the version it now sees"
    );
    assert_eq!(
        patches[1].body["spec"]["underlay"],
        json!({"ipv4": "192.168.0.21", "ipv6": "fd00:fab::11"})
    );
    assert_eq!(patches[1].body["spec"]["index"], 1);
    assert_eq!(
        events(&writes),
        [(
            "Node/node-1".into(),
            "Normal".into(),
            "UnderlayChanged".into(),
            "underlay 192.168.0.11 and fd00:fab::11 -> 192.168.0.21 and fd00:fab::11".into()
        )]
    );
    let metrics = h.metrics.encode();
    assert!(metrics.contains(r#"lace_controller_writes_total{verb="patch",resource="nodeallocations",result="conflict"} 1"#), "{metrics}");
    assert!(
        metrics.contains(r#"lace_controller_passes_total{result="retry"} 1"#),
        "{metrics}"
    );
    h.stop().await.unwrap();
    fake
}

/// Invalid Networks are reported on their status (the validator's message) and with a
/// Warning Event, get no SID function, and do not stop the valid ones; policies naming them
/// or a missing Network say which.
async fn invalid_network() -> FakeApi {
    let fake = FakeApi::new();
    small_cluster(&fake);
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    fake.take_writes();
    fake.put(network("hostbits", &[("10.9.0.1/16", 24)]));
    fake.put(network("overlap", &[("10.244.128.0/17", 24)]));
    fake.put(network("sids", &[("2001:db8:100:8000::/56", 64)]));
    let mut unreadable = network("unreadable", &[]);
    unreadable["spec"] = json!({"subnets": [{"cidr": "10.250.0.0/33", "blockPrefix": 24}]});
    fake.put(unreadable);
    fake.put(policy(
        "NetworkRoutingPolicy",
        "to-hostbits",
        json!({"from": "tenant", "to": "hostbits"}),
    ));
    fake.put(policy(
        "NetworkRoutingPolicy",
        "to-later",
        json!({"from": "tenant", "to": "later"}),
    ));
    h.settle().await;
    let writes = fake.take_writes();
    let status =
        |name: &str| conditions(&find(&writes, "PATCH", &format!("{NETS}/{name}/status")).body);
    let hostbits = "Network/hostbits: spec.subnets[0].cidr: 10.9.0.1/16 has host bits set (did you mean 10.9.0.0/16?)";
    assert_eq!(status("hostbits"), [ready("False", "Invalid", hostbits)]);
    let overlap = "Network/overlap: spec.subnets[0].cidr: 10.244.128.0/17 overlaps 10.244.0.0/16 of Network tenant, which came first";
    assert_eq!(status("overlap"), [ready("False", "Invalid", overlap)]);
    let sids = "Network/sids: spec.subnets: srv6LocatorPrefix 2001:db8:100::/48 overlaps subnet 2001:db8:100:8000::/56 of Network sids (controller.srv6LocatorPrefix): SIDs would also be pod addresses; use subnets outside it";
    assert_eq!(status("sids"), [ready("False", "Invalid", sids)]);
    let unreadable = "Network/unreadable: spec.subnets[0].cidr: cidr \"10.250.0.0/33\" is not a CIDR: the prefix length is too long for the address";
    assert_eq!(
        status("unreadable"),
        [ready("False", "Invalid", unreadable)]
    );
    let route = |name: &str| {
        conditions(
            &find(
                &writes,
                "PATCH",
                &format!("/apis/lace.io/v1alpha1/networkroutingpolicies/{name}/status"),
            )
            .body,
        )
    };
    let to_hostbits = "NetworkRoutingPolicy/to-hostbits: spec.to: Network \"hostbits\" is not Ready (see its status)";
    assert_eq!(
        route("to-hostbits"),
        [ready("False", "NetworkNotReady", to_hostbits)]
    );
    let to_later = "NetworkRoutingPolicy/to-later: spec.to: Network \"later\" does not exist";
    assert_eq!(route("to-later"), [ready("False", "Invalid", to_later)]);
    let allocated: BTreeSet<String> = writes
        .iter()
        .filter(|w| w.path.starts_with(&format!("{NETA}/")))
        .map(|w| w.path[NETA.len() + 1..].to_string())
        .collect();
    assert_eq!(
        allocated,
        BTreeSet::new(),
        "no SID function for invalid Networks"
    );
    let warnings: Vec<(String, String, String, String)> = events(&writes)
        .into_iter()
        .filter(|e| e.1 == "Warning")
        .collect();
    assert_eq!(
        warnings,
        [
            (
                "Network/hostbits".into(),
                "Warning".into(),
                "Invalid".into(),
                hostbits.into()
            ),
            (
                "Network/overlap".into(),
                "Warning".into(),
                "Invalid".into(),
                overlap.into()
            ),
            (
                "Network/sids".into(),
                "Warning".into(),
                "Invalid".into(),
                sids.into()
            ),
            (
                "Network/unreadable".into(),
                "Warning".into(),
                "Invalid".into(),
                unreadable.into()
            ),
            (
                "NetworkRoutingPolicy/to-hostbits".into(),
                "Warning".into(),
                "NetworkNotReady".into(),
                to_hostbits.into()
            ),
            (
                "NetworkRoutingPolicy/to-later".into(),
                "Warning".into(),
                "Invalid".into(),
                to_later.into()
            ),
        ]
    );

    // The missing Network appears: the policy is Ready; it goes again: the same Warning
    // repeats, which the Event recorder sends as a series update (a patch).
    fake.put(network("later", &[("10.246.0.0/16", 24)]));
    h.settle().await;
    let writes = fake.take_writes();
    assert_eq!(
        conditions(
            &find(
                &writes,
                "PATCH",
                "/apis/lace.io/v1alpha1/networkroutingpolicies/to-later/status"
            )
            .body
        ),
        [json!({"type": "Ready", "status": "True", "reason": "Valid", "observedGeneration": 1})]
    );
    fake.remove("lace.io/v1alpha1", "Network", "", "later");
    h.settle().await;
    let writes = fake.take_writes();
    let series = writes
        .iter()
        .find(|w| w.method == "PATCH" && w.path.starts_with(EVENTS))
        .unwrap_or_else(|| panic!("no Event series patch in {:#?}", lines(&writes)));
    assert_eq!(series.body["reason"], "Invalid");
    assert_eq!(series.body["series"]["count"], 2);
    h.stop().await.unwrap();
    fake
}

/// A node without an InternalIP cannot be allocated: a condition on the Node and a Warning;
/// once it has an address it is allocated and the condition turns True.
async fn node_without_address() -> FakeApi {
    let fake = FakeApi::new();
    small_cluster(&fake);
    fake.put(node("node-x", &[]));
    let h = Harness::start(&fake, PREFIX);
    h.settle().await;
    let writes = fake.take_writes();
    assert!(writes.iter().all(|w| w.path != format!("{NA}/node-x")));
    let status = find(&writes, "PATCH", "/api/v1/nodes/node-x/status");
    assert_eq!(
        status.line(),
        format!("PATCH /api/v1/nodes/node-x/status {APPLY}")
    );
    let message = "Node node-x has no usable InternalIP in status.addresses: the other nodes need one (IPv4 or IPv6; not loopback, link-local, multicast or unspecified) to reach its SRv6 locator";
    assert_eq!(
        status.body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(unstamped)
            .collect::<Vec<_>>(),
        [
            json!({"type": "lace.io/Allocated", "status": "False", "reason": "NoUnderlayAddress", "message": message})
        ]
    );
    assert!(events(&writes).contains(&(
        "Node/node-x".into(),
        "Warning".into(),
        "NoUnderlayAddress".into(),
        message.into()
    )));
    let stored = fake.get("v1", "Node", "", "node-x").unwrap();
    assert_eq!(
        stored["status"]["conditions"].as_array().unwrap().len(),
        2,
        "the kubelet's Ready stays"
    );

    let mut fixed = node("node-x", &["192.168.0.99"]);
    fixed["status"]["conditions"] = stored["status"]["conditions"].clone();
    fake.put(fixed);
    h.settle().await;
    let writes = fake.take_writes();
    assert_eq!(
        find(&writes, "PATCH", &format!("{NA}/node-x")).body["spec"]["index"],
        3
    );
    assert_eq!(
        conditions(&find(&writes, "PATCH", "/api/v1/nodes/node-x/status").body),
        [
            json!({"type": "lace.io/Allocated", "status": "True", "reason": "Allocated",
                "message": "index 3, locator 2001:db8:100::3:0:0/96"})
        ]
    );
    // Then it loses its address again: it keeps its allocation, and says so.
    let mut lost = fake.get("v1", "Node", "", "node-x").unwrap();
    lost["status"]["addresses"] = json!([]);
    fake.put(lost);
    h.settle().await;
    let writes = fake.take_writes();
    assert!(
        writes.iter().all(|w| w.path != format!("{NA}/node-x")),
        "{:#?}",
        lines(&writes)
    );
    assert_eq!(
        conditions(&find(&writes, "PATCH", "/api/v1/nodes/node-x/status").body)[0]["message"],
        format!("{message}; it keeps its allocation, with the last underlay recorded")
    );
    h.stop().await.unwrap();
    fake
}

/// More nodes than the locator prefix holds, and than a Network has blocks for.
async fn exhausted() -> FakeApi {
    let fake = FakeApi::new();
    for i in 1..=4 {
        fake.put(dual_node(&format!("node-{i}"), i));
    }
    fake.put(network("small", &[("10.9.0.0/23", 24)]));
    // /94: three node locators.
    let h = Harness::start(&fake, "2001:db8:100::/94");
    h.settle().await;
    let writes = fake.take_writes();
    let allocated: Vec<&str> = writes
        .iter()
        .filter_map(|w| w.path.strip_prefix(&format!("{NA}/")))
        .collect();
    assert_eq!(allocated.len(), 3, "{allocated:?}");
    let c = conditions(&find(&writes, "PATCH", "/api/v1/nodes/node-4/status").body);
    assert_eq!(
        c,
        [
            json!({"type": "lace.io/Allocated", "status": "False", "reason": "LocatorsExhausted",
                "message": "srv6LocatorPrefix 2001:db8:100::/94 is exhausted: all 3 node locators are taken, none left for Node node-4: delete the Nodes that are gone, or reinstall with a shorter controller.srv6LocatorPrefix (which moves every node's locator)"})
        ]
    );
    let small = conditions(&find(&writes, "PATCH", &format!("{NETS}/small/status")).body);
    let exhausted = "its subnets hold blocks for 2 nodes and the cluster has more: pods bound to this Network on the nodes beyond get no address (subnets cannot change: bind those pods to another Network)";
    assert_eq!(
        small[1],
        json!({"type": "BlocksExhausted", "status": "True", "reason": "BlocksExhausted", "message": exhausted, "observedGeneration": 1})
    );
    let ev = events(&writes);
    assert!(
        ev.contains(&(
            "Network/small".into(),
            "Warning".into(),
            "BlocksExhausted".into(),
            exhausted.into()
        )),
        "{ev:#?}"
    );
    assert!(ev.contains(&("Node/node-3".into(), "Warning".into(), "NoAddressBlock".into(),
        "no address block of Network(s) small for this node (index 3): their subnets hold fewer blocks; pods bound to them cannot start here".into())), "{ev:#?}");
    h.stop().await.unwrap();
    fake
}

/// Without the CRDs the controller stops at once, naming the fix, and writes nothing.
async fn crds_missing() -> FakeApi {
    let fake = FakeApi::new();
    small_cluster(&fake);
    fake.fault(Fault::new(
        "list",
        NETS,
        404,
        "the server could not find the requested resource",
    ));
    let h = Harness::start(&fake, PREFIX);
    let metrics = h.metrics.clone();
    let err = h.ended().await.unwrap_err();
    assert_eq!(
        metrics.healthz().map_err(|why| why.to_string()),
        Err(err.to_string()),
        "/healthz says why"
    );
    assert!(metrics.readyz().is_err());
    assert_eq!(
        err.to_string(),
        "the CustomResourceDefinition networks.lace.io is not installed (list /apis/lace.io/v1alpha1/networks: 404 Not Found): install the lace.io CRDs with the lace-cni chart (they are templated, so helm install and helm upgrade apply them), or run `lace-agent crds | kubectl apply -f -`"
    );
    assert_eq!(lines(&fake.take_writes()), Vec::<String>::new());
    fake
}

/// RBAC denials stop the controller with the verb and resource named: a list at start-up,
/// a write in the first pass.
async fn rbac_denied() -> FakeApi {
    let fake = FakeApi::new();
    small_cluster(&fake);
    let denied = "nodes is forbidden: User \"system:serviceaccount:kube-system:lace-controller\" cannot list resource \"nodes\" in API group \"\" at the cluster scope";
    fake.fault(Fault::new("list", "/api/v1/nodes", 403, denied));
    let err = Harness::start(&fake, PREFIX).ended().await.unwrap_err();
    assert_eq!(
        err,
        FatalError::Forbidden {
            verb: "list",
            resource: "nodes".into(),
            group: "core".into(),
            message: denied.into()
        }
    );
    assert_eq!(
        err.to_string(),
        format!("RBAC denied list on nodes (API group core): {denied}; the controller's ClusterRole lace-controller (chart/templates/rbac.yaml) must grant it: helm upgrade the lace-cni chart, or add the rule")
    );

    let fake2 = FakeApi::new();
    small_cluster(&fake2);
    let denied = "nodeallocations.lace.io \"node-1\" is forbidden: User \"system:serviceaccount:kube-system:lace-controller\" cannot patch resource \"nodeallocations\" in API group \"lace.io\" at the cluster scope";
    fake2.fault(Fault::new("patch", &format!("{NA}/node-1"), 403, denied));
    let err = Harness::start(&fake2, PREFIX).ended().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("RBAC denied patch on nodeallocations (API group lace.io): {denied}; the controller's ClusterRole lace-controller (chart/templates/rbac.yaml) must grant it: helm upgrade the lace-cni chart, or add the rule")
    );
    let statuses = fake2
        .take_writes()
        .into_iter()
        .filter(|w| w.path.ends_with("/status"))
        .count();
    assert_eq!(
        statuses, 0,
        "no status claims what the failed phase did not write"
    );
    // One fake's requests are enough for the record: merge the two.
    for r in fake2.requests() {
        fake.record(r);
    }
    fake
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn a_new_cluster_gets_one_write_per_object() {
    new_cluster().await;
}

#[tokio::test]
async fn a_new_node_costs_one_write() {
    new_node().await;
}

#[tokio::test]
async fn a_new_network_costs_one_allocation_and_its_status() {
    new_network().await;
}

#[tokio::test]
async fn deleting_a_node_or_network_frees_its_values() {
    deleted_node_and_network().await;
}

#[tokio::test]
async fn a_restart_with_existing_allocations_writes_nothing() {
    restart().await;
}

#[tokio::test]
async fn a_conflict_is_retried_over_the_newer_version() {
    conflict().await;
}

#[tokio::test]
async fn an_invalid_network_gets_a_condition_and_an_event() {
    invalid_network().await;
}

#[tokio::test]
async fn a_node_without_an_address_gets_a_condition() {
    node_without_address().await;
}

#[tokio::test]
async fn exhausted_locators_and_blocks_are_reported() {
    exhausted().await;
}

#[tokio::test]
async fn missing_crds_stop_the_controller_naming_the_fix() {
    crds_missing().await;
}

#[tokio::test]
async fn rbac_denials_stop_the_controller_naming_verb_and_resource() {
    rbac_denied().await;
}

/// The (verb, API group, resource) of every request the scenarios made equals the checked-in
/// `controller/rbac-requests.txt` (`LACE_BLESS=1` rewrites it), which the chart tier checks
/// against the rendered ClusterRole: nothing missing, nothing unused.
#[tokio::test]
async fn rbac_is_exactly_what_the_scenarios_use() {
    let fakes = [
        new_cluster().await,
        new_node().await,
        new_network().await,
        deleted_node_and_network().await,
        restart().await,
        conflict().await,
        invalid_network().await,
        node_without_address().await,
        exhausted().await,
        crds_missing().await,
        rbac_denied().await,
    ];
    let used: BTreeSet<String> = fakes
        .iter()
        .flat_map(FakeApi::requests)
        .flat_map(|r| r.authorized())
        .map(|(verb, group, resource)| {
            let group = if group.is_empty() {
                "core".to_string()
            } else {
                group
            };
            format!("{verb} {group} {resource}")
        })
        .collect();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rbac-requests.txt");
    let text = format!(
        "# Every (verb, API group, resource) lace-controller's requests are authorized for, as\n# recorded by controller/tests/scenarios.rs (a server-side apply that creates an object is\n# also authorized as create). LACE_BLESS=1 cargo test -p lace-controller --test scenarios\n# rewrites it; tests/charts/test_rbac.py checks the chart's ClusterRole grants exactly these.\n{}\n",
        used.iter().cloned().collect::<Vec<_>>().join("\n")
    );
    if std::env::var_os("LACE_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(checked_in, text, "run with LACE_BLESS=1 to accept");
}
