//! A fake Kubernetes API server for the controller's tests and benchmark, behind kube-rs's
//! `tower-test` mock client: the ApiServerVerifier pattern of kube-rs/controller-rs, grown
//! into a small in-memory server, so the controller's watches see its own writes come back as
//! watch events, as they do from a real API server (and a test that expects zero writes
//! proves the echoes cause none).
//!
//! It serves list and watch (with replay from a resourceVersion), server-side apply of
//! objects and of `status` (Node conditions merged by type, as their `listType=map` makes a
//! real server do), create and merge patch (Events), and delete with uid preconditions.
//! Every request is recorded (method, path, query, content type, body) for the tests to
//! assert on; [`Fault`]s answer chosen requests with an error.
#![allow(dead_code)] // each test binary uses a part

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use lace_controller::{FatalError, Metrics, Progress, Settings};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// A response body: one JSON document, or a watch's stream of events.
pub struct FakeBody {
    once: Option<Bytes>,
    stream: Option<UnboundedReceiver<Bytes>>,
}

impl http_body::Body for FakeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(b) = self.once.take() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        match &mut self.stream {
            Some(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
            None => Poll::Ready(None),
        }
    }
}

/// One request as the fake received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: String,
    /// `Null` without a body.
    pub body: Value,
    /// A server-side apply that created the object: the API server then also authorizes
    /// `create` (k8s.io/apiserver, endpoints/handlers/patch.go).
    pub created: bool,
}

impl Recorded {
    /// Every RBAC check the request passes: verb, API group, resource.
    pub fn authorized(&self) -> Vec<(String, String, String)> {
        let (verb, group, resource) = self.rbac();
        let mut out = vec![(verb, group.clone(), resource.clone())];
        if self.created {
            out.push(("create".into(), group, resource));
        }
        out
    }

    /// The RBAC verb, API group and resource (`plural` or `plural/subresource`) of the request.
    pub fn rbac(&self) -> (String, String, String) {
        let p = parse_path(&self.path).unwrap_or_else(|| panic!("unexpected path {}", self.path));
        let verb = match (self.method.as_str(), &p.name) {
            ("GET", None)
                if self
                    .query
                    .get("watch")
                    .is_some_and(|w| w == "true" || w == "1") =>
            {
                "watch"
            }
            ("GET", None) => "list",
            ("GET", Some(_)) => "get",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", None) => "deletecollection",
            ("DELETE", Some(_)) => "delete",
            (m, _) => panic!("unexpected method {m}"),
        };
        let resource = match &p.sub {
            Some(s) => format!("{}/{s}", p.resource),
            None => p.resource.clone(),
        };
        (verb.to_string(), p.group, resource)
    }

    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }

    /// `METHOD path`, and for applies `(apply, fieldManager, force)`.
    pub fn line(&self) -> String {
        let mut s = format!("{} {}", self.method, self.path);
        if self.content_type == "application/apply-patch+yaml" {
            let fm = self
                .query
                .get("fieldManager")
                .map(String::as_str)
                .unwrap_or("-");
            let force = self
                .query
                .get("force")
                .map(String::as_str)
                .unwrap_or("false");
            s += &format!(" (apply, fieldManager={fm}, force={force})");
        }
        s
    }
}

struct ApiPath {
    group: String,
    version: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
    sub: Option<String>,
}

impl ApiPath {
    /// The collection: group, resource, namespace.
    fn collection(&self) -> String {
        format!(
            "{}|{}|{}",
            self.group,
            self.resource,
            self.namespace.clone().unwrap_or_default()
        )
    }
}

fn parse_path(path: &str) -> Option<ApiPath> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, version, rest) = match *segs.first()? {
        "api" => ("", *segs.get(1)?, &segs[2..]),
        "apis" => (*segs.get(1)?, *segs.get(2)?, &segs[3..]),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, more @ ..] if !more.is_empty() => (Some(ns.to_string()), more),
        _ => (None, rest),
    };
    Some(ApiPath {
        group: group.into(),
        version: version.into(),
        namespace,
        resource: rest.first()?.to_string(),
        name: rest.get(1).map(|s| s.to_string()),
        sub: rest.get(2).map(|s| s.to_string()),
    })
}

/// The API path of the collection an object of `api_version`/`kind` lives in.
pub fn collection_path(api_version: &str, kind: &str, namespace: Option<&str>) -> String {
    let plural = match kind {
        "Event" => "events".to_string(),
        _ => lace::objects::Kind::of(api_version, kind)
            .unwrap_or_else(|| panic!("no plural for {api_version} {kind}"))
            .plural()
            .to_string(),
    };
    let base = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    match namespace {
        Some(ns) => format!("{base}/namespaces/{ns}/{plural}"),
        None => format!("{base}/{plural}"),
    }
}

/// An error answer for requests matching `verb` (RBAC verb) and `path` (without query).
#[derive(Clone, Debug)]
pub struct Fault {
    pub verb: &'static str,
    pub path: String,
    pub code: u16,
    pub message: String,
    /// How many matching requests fail (`None`: all).
    pub times: Option<usize>,
    /// A concurrent writer's change, applied before the error is answered (a 409 then
    /// means what it means on a real server).
    pub update: Option<Value>,
}

impl Fault {
    pub fn new(verb: &'static str, path: &str, code: u16, message: &str) -> Self {
        Self {
            verb,
            path: path.into(),
            code,
            message: message.into(),
            times: None,
            update: None,
        }
    }

    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }

    pub fn after_update(mut self, object: Value) -> Self {
        self.update = Some(object);
        self
    }
}

#[derive(Default)]
struct State {
    rv: u64,
    uid: u64,
    /// Per collection, objects by name.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    /// Per collection, every watch event with its resourceVersion (for replay).
    log: BTreeMap<String, Vec<(u64, Bytes)>>,
    /// Per collection, the open watches: the client's number and the stream.
    watchers: BTreeMap<String, Vec<(u64, UnboundedSender<Bytes>)>>,
    requests: Vec<Recorded>,
    /// Index into `requests` up to which `take_writes` has returned.
    taken: usize,
    faults: Vec<Fault>,
    /// Per client, watch events delivered into its open watches.
    sent: BTreeMap<u64, u64>,
    clients: u64,
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

fn reason_of(code: u16) -> &'static str {
    match code {
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        422 => "Invalid",
        _ => "InternalError",
    }
}

fn response(code: u16, body: &Value) -> Response<FakeBody> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(FakeBody {
            once: Some(Bytes::from(serde_json::to_vec(body).unwrap())),
            stream: None,
        })
        .unwrap()
}

/// `obj` without the fields the server sets, to tell a no-op write from a change.
fn content(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("generation");
    }
    o
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl State {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Stores `obj` in `coll` (stamping version and identity) and tells the watches.
    fn store(&mut self, coll: &str, mut obj: Value) -> Value {
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let old = self.objects.get(coll).and_then(|m| m.get(&name)).cloned();
        if let Some(old) = &old {
            if content(old) == content(&obj) {
                return old.clone();
            }
        }
        let rv = self.next_rv();
        let meta = obj["metadata"].as_object_mut().unwrap();
        meta.insert("resourceVersion".into(), rv.to_string().into());
        let uid = match old.as_ref().and_then(|o| o["metadata"]["uid"].as_str()) {
            Some(uid) => uid.to_string(),
            None => meta
                .get("uid")
                .and_then(Value::as_str)
                .map(String::from)
                .unwrap_or_else(|| {
                    self.uid += 1;
                    format!("uid-{}", self.uid)
                }),
        };
        let meta = obj["metadata"].as_object_mut().unwrap();
        meta.insert("uid".into(), uid.into());
        let generation = match &old {
            Some(o) if o.get("spec") == obj.get("spec") => {
                o["metadata"]["generation"].as_i64().unwrap_or(1)
            }
            Some(o) => o["metadata"]["generation"].as_i64().unwrap_or(1) + 1,
            None => 1,
        };
        obj["metadata"]["generation"] = generation.into();
        let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.objects
            .entry(coll.to_string())
            .or_default()
            .insert(name, obj.clone());
        self.emit(coll, rv, kind, &obj);
        obj
    }

    fn remove(&mut self, coll: &str, name: &str) -> Option<Value> {
        let obj = self.objects.get_mut(coll)?.remove(name)?;
        let rv = self.next_rv();
        self.emit(coll, rv, "DELETED", &obj);
        Some(obj)
    }

    fn emit(&mut self, coll: &str, rv: u64, kind: &str, obj: &Value) {
        let mut line = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap();
        line.push(b'\n');
        let line = Bytes::from(line);
        self.log
            .entry(coll.to_string())
            .or_default()
            .push((rv, line.clone()));
        let watchers = self.watchers.entry(coll.to_string()).or_default();
        watchers.retain(|(_, w)| w.send(line.clone()).is_ok());
        for (client, _) in watchers.iter() {
            *self.sent.entry(*client).or_default() += 1;
        }
    }

    /// The fault for this request, if one matches (and counts it down).
    fn fault(&mut self, verb: &str, path: &str) -> Option<Fault> {
        let i = self
            .faults
            .iter()
            .position(|f| f.verb == verb && f.path == path)?;
        let f = self.faults[i].clone();
        match &mut self.faults[i].times {
            Some(1) => {
                self.faults.remove(i);
            }
            Some(n) => *n -= 1,
            None => {}
        }
        Some(f)
    }
}

/// The fake API server. Cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// A client whose requests this fake answers (kube-rs's `tower-test` mock), and its
    /// number (for [`FakeApi::sent`]).
    pub fn client(&self) -> (kube::Client, u64) {
        let (mock, mut handle) =
            tower_test::mock::pair::<Request<kube::client::Body>, Response<FakeBody>>();
        let id = {
            let mut s = self.lock();
            s.clients += 1;
            s.clients
        };
        let fake = self.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let response = fake.handle(id, request).await;
                send.send_response(response);
            }
        });
        (kube::Client::new(mock, "default"), id)
    }

    /// Creates or replaces `obj` as another client would (a user, the kubelet).
    pub fn put(&self, obj: Value) -> Value {
        let coll = Self::collection_of(&obj);
        self.lock().store(&coll, obj)
    }

    /// Deletes an object as another client would (the garbage collector, a user).
    pub fn remove(&self, api_version: &str, kind: &str, name: &str) -> Option<Value> {
        let path = format!("{}/{name}", collection_path(api_version, kind, None));
        let coll = parse_path(&path).unwrap().collection();
        self.lock().remove(&coll, name)
    }

    pub fn get(&self, api_version: &str, kind: &str, name: &str) -> Option<Value> {
        let path = format!("{}/{name}", collection_path(api_version, kind, None));
        let coll = parse_path(&path).unwrap().collection();
        self.lock().objects.get(&coll)?.get(name).cloned()
    }

    /// Every object of a kind, by name (namespace `ns` for namespaced kinds).
    pub fn list(&self, api_version: &str, kind: &str, ns: Option<&str>) -> Vec<Value> {
        let path = format!("{}/x", collection_path(api_version, kind, ns));
        let coll = parse_path(&path).unwrap().collection();
        self.lock()
            .objects
            .get(&coll)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Adds a request recorded by another fake (to merge records).
    pub fn record(&self, r: Recorded) {
        self.lock().requests.push(r);
    }

    pub fn fault(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// The writes since the last call (requests other than GET).
    pub fn take_writes(&self) -> Vec<Recorded> {
        let mut s = self.lock();
        let start = s.taken;
        s.taken = s.requests.len();
        s.requests[start..]
            .iter()
            .filter(|r| r.is_write())
            .cloned()
            .collect()
    }

    /// Watch events delivered into the open watches of client `id` so far.
    pub fn sent(&self, id: u64) -> u64 {
        self.lock().sent.get(&id).copied().unwrap_or(0)
    }

    fn collection_of(obj: &Value) -> String {
        let av = obj["apiVersion"].as_str().expect("apiVersion");
        let kind = obj["kind"].as_str().expect("kind");
        let ns = obj["metadata"]["namespace"].as_str();
        let path = format!("{}/x", collection_path(av, kind, ns));
        parse_path(&path).unwrap().collection()
    }

    async fn handle(
        &self,
        client: u64,
        request: Request<kube::client::Body>,
    ) -> Response<FakeBody> {
        let (parts, body) = request.into_parts();
        let bytes = http_body_util::BodyExt::collect(body)
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("request body is not JSON: {e}"))
        };
        let query: BTreeMap<String, String> = parts
            .uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (kv.to_string(), String::new()),
            })
            .collect();
        let recorded = Recorded {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query,
            content_type: parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            body,
            created: false,
        };
        let mut s = self.lock();
        s.requests.push(recorded.clone());
        let index = s.requests.len() - 1;
        let (verb, _, _) = recorded.rbac();
        if let Some(fault) = s.fault(&verb, &recorded.path) {
            if let Some(obj) = fault.update {
                let coll = Self::collection_of(&obj);
                s.store(&coll, obj);
            }
            return response(
                fault.code,
                &status(fault.code, reason_of(fault.code), &fault.message),
            );
        }
        let p = parse_path(&recorded.path).unwrap();
        let coll = p.collection();
        let not_found =
            |what: &str| response(404, &status(404, "NotFound", &format!("{what} not found")));
        match (verb.as_str(), &p.name, p.sub.as_deref()) {
            ("list", None, None) => {
                let items: Vec<Value> = s
                    .objects
                    .get(&coll)
                    .map(|m| m.values().cloned().collect())
                    .unwrap_or_default();
                response(
                    200,
                    &json!({"apiVersion": "v1", "kind": "List",
                            "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
                )
            }
            ("watch", None, None) => {
                let since: u64 = recorded
                    .query
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let (tx, rx) = unbounded_channel();
                let mut replayed = 0;
                for (rv, line) in s.log.get(&coll).into_iter().flatten() {
                    if *rv > since && tx.send(line.clone()).is_ok() {
                        replayed += 1;
                    }
                }
                *s.sent.entry(client).or_default() += replayed;
                s.watchers.entry(coll).or_default().push((client, tx));
                Response::builder()
                    .status(200)
                    .body(FakeBody {
                        once: None,
                        stream: Some(rx),
                    })
                    .unwrap()
            }
            ("get", Some(name), None) => match s.objects.get(&coll).and_then(|m| m.get(name)) {
                Some(o) => response(200, o),
                None => not_found(name),
            },
            ("patch", Some(name), sub)
                if recorded.content_type == "application/apply-patch+yaml" =>
            {
                let applied = &recorded.body;
                let old = s.objects.get(&coll).and_then(|m| m.get(name)).cloned();
                if let Some(want) = applied["metadata"]["resourceVersion"].as_str() {
                    let have = old
                        .as_ref()
                        .and_then(|o| o["metadata"]["resourceVersion"].as_str());
                    if have != Some(want) {
                        let msg = format!("Operation cannot be fulfilled on {}.{} {name:?}: the object has been modified; please apply your changes to the latest version and try again", p.resource, p.group);
                        return response(409, &status(409, "Conflict", &msg));
                    }
                }
                let obj = match sub {
                    None => {
                        let mut obj = old.unwrap_or_else(|| {
                            json!({"apiVersion": applied["apiVersion"], "kind": applied["kind"],
                                   "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"}})
                        });
                        for field in ["ownerReferences", "labels", "annotations"] {
                            if let Some(v) = applied["metadata"].get(field) {
                                obj["metadata"][field] = v.clone();
                            }
                        }
                        if let Some(spec) = applied.get("spec") {
                            obj["spec"] = spec.clone();
                        }
                        obj
                    }
                    Some("status") => {
                        let Some(mut obj) = old else {
                            return not_found(name);
                        };
                        let status = &applied["status"];
                        if p.resource == "nodes" {
                            // NodeStatus.conditions is a map-list keyed by type.
                            let mut conds: Vec<Value> = obj["status"]["conditions"]
                                .as_array()
                                .cloned()
                                .unwrap_or_default();
                            for c in status["conditions"].as_array().into_iter().flatten() {
                                conds.retain(|o| o["type"] != c["type"]);
                                conds.push(c.clone());
                            }
                            obj["status"]["conditions"] = conds.into();
                        } else {
                            obj["status"] = status.clone();
                        }
                        obj
                    }
                    Some(other) => panic!("unexpected subresource {other}"),
                };
                let created = s.objects.get(&coll).is_none_or(|m| !m.contains_key(name));
                s.requests[index].created = created;
                let stored = s.store(&coll, obj);
                response(if created { 201 } else { 200 }, &stored)
            }
            ("patch", Some(name), None) => {
                // A merge patch (the Event recorder's series update).
                let Some(mut obj) = s.objects.get(&coll).and_then(|m| m.get(name)).cloned() else {
                    return not_found(name);
                };
                merge(&mut obj, &recorded.body);
                let stored = s.store(&coll, obj);
                response(200, &stored)
            }
            ("create", None, None) => {
                let mut obj = recorded.body.clone();
                if let Some(ns) = &p.namespace {
                    obj["metadata"]["namespace"] = ns.clone().into();
                }
                let stored = s.store(&coll, obj);
                response(201, &stored)
            }
            ("delete", Some(name), None) => {
                let Some(old) = s.objects.get(&coll).and_then(|m| m.get(name)).cloned() else {
                    return not_found(name);
                };
                if let Some(uid) = recorded.body["preconditions"]["uid"].as_str() {
                    if old["metadata"]["uid"].as_str() != Some(uid) {
                        return response(409, &status(409, "Conflict", "Precondition failed: UID in precondition does not match the object"));
                    }
                }
                let gone = s.remove(&coll, name).unwrap();
                response(200, &gone)
            }
            (verb, name, sub) => panic!(
                "the fake does not serve {verb} {name:?} {sub:?} ({})",
                recorded.path
            ),
        }
    }
}

// ---------------------------------------------------------------- objects

pub const PREFIX: &str = "2001:db8:100::/48";

/// A Node with these InternalIPs.
pub fn node(name: &str, ips: &[&str]) -> Value {
    let addresses: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .chain([json!({"type": "Hostname", "address": name})])
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    })
}

/// A Network with these `(cidr, blockPrefix)` subnets (none: external).
pub fn network(name: &str, subnets: &[(&str, u8)]) -> Value {
    let spec = if subnets.is_empty() {
        json!({"external": true})
    } else {
        let subnets: Vec<Value> = subnets
            .iter()
            .map(|(c, b)| json!({"cidr": c, "blockPrefix": b}))
            .collect();
        json!({"subnets": subnets})
    };
    json!({"apiVersion": "lace.io/v1alpha1", "kind": "Network", "metadata": {"name": name}, "spec": spec})
}

/// A Lace policy of `kind` with `spec`.
pub fn policy(kind: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "lace.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec})
}

// ---------------------------------------------------------------- the controller under test

/// A controller running against a [`FakeApi`].
pub struct Harness {
    pub fake: FakeApi,
    pub metrics: Arc<Metrics>,
    client: u64,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), FatalError>>,
}

/// How long a test waits for the controller before it fails.
const PATIENCE: Duration = Duration::from_secs(60);

impl Harness {
    /// Starts the controller with `prefix` (and fast retries).
    pub fn start(fake: &FakeApi, prefix: &str) -> Self {
        let mut settings = Settings::new(prefix.parse().unwrap());
        settings.retry_min = Duration::from_millis(20);
        settings.retry_max = Duration::from_millis(200);
        Self::with_settings(fake, settings)
    }

    pub fn with_settings(fake: &FakeApi, settings: Settings) -> Self {
        let metrics = Arc::new(Metrics::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (client, id) = fake.client();
        let task = tokio::spawn(lace_controller::run(
            client,
            settings,
            metrics.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            fake: fake.clone(),
            metrics,
            client: id,
            stop: Some(stop),
            task,
        }
    }

    /// Waits until the controller is synced, has nothing pending and has taken in every
    /// watch event the fake delivered (its own writes' echoes included).
    pub async fn settle(&self) -> Progress {
        let mut rx = self.metrics.progress();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let p = rx.borrow_and_update().clone();
            if p.synced
                && p.passes > 0
                && !p.pending
                && p.watch_events >= self.fake.sent(self.client)
            {
                return p;
            }
            if self.task.is_finished() {
                panic!("the controller stopped while the test waited for it: {p:?}");
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "the controller did not settle: {p:?}, fake sent {}",
                    self.fake.sent(self.client)
                );
            }
            let _ = tokio::time::timeout(Duration::from_millis(20), rx.changed()).await;
        }
    }

    /// Stops the controller (as SIGTERM does) and returns how it ended.
    pub async fn stop(mut self) -> Result<(), FatalError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the controller stops")
            .expect("the controller task does not panic")
    }

    /// Waits for the controller to end by itself (a fatal error).
    pub async fn ended(self) -> Result<(), FatalError> {
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the controller ends")
            .expect("the controller task does not panic")
    }
}
