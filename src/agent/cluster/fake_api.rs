//! A fake Kubernetes API server for the agent's tests and its benchmark (no API server can
//! be installed on these machines): an axum app that keeps objects per resource with
//! resource versions and serves what the agent's client sends — lists (with field and label
//! selectors), watches streaming from a resource version (410 Gone when it is compacted
//! away), gets, and strategic-merge patches of `status` — and records every request as
//! `verb resource[.group][/subresource]`, the form RBAC rules are written in.
//!
//! The test side scripts it: objects come and go ([`FakeApi::put`], [`FakeApi::remove`]),
//! watches end (an API server restart), it refuses connections, answers every request with
//! one status (401, 403), compacts its history (the next resumed watch gets 410), or sends
//! an error event into open watches. In-process through [`FakeApi::client`] (kube's client
//! over a tower service), or over TCP ([`FakeApi::router`] with `axum::serve`).
//!
//! Kept free of the crate's own types: the benchmark compiles it too (`#[path]`).
#![allow(dead_code)] // the tests and the benchmark use different parts

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::channel::mpsc::{unbounded, UnboundedSender};
use futures::StreamExt;
use serde_json::{json, Value};

/// A collection: `group/version/plural` (group empty for the core group).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Coll {
    pub group: String,
    pub version: String,
    pub plural: String,
}

impl Coll {
    /// The collection of `apiVersion` and `kind` (plural: lowercase kind, `y` → `ies`).
    pub fn of(api_version: &str, kind: &str) -> Coll {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let lower = kind.to_lowercase();
        let plural = match lower.strip_suffix('y') {
            Some(stem) => format!("{stem}ies"),
            None => format!("{lower}s"),
        };
        Coll {
            group: group.into(),
            version: version.into(),
            plural,
        }
    }

    /// `plural[.group]`, as RBAC names it.
    pub fn resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// How the fake answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Up,
    /// Connections are refused (only [`FakeApi::client`] can do this; watches are closed).
    Refusing,
    /// Every request is answered with this HTTP status (a `Status` body).
    Status(u16),
}

#[derive(Debug)]
struct Logged {
    rv: u64,
    coll: Coll,
    kind: &'static str,
    object: Value,
}

#[derive(Debug)]
struct LiveWatch {
    coll: Coll,
    filter: Filter,
    tx: UnboundedSender<Bytes>,
}

/// A request as RBAC sees it, and its URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// `list pods`, `watch networks.lace.io`, `patch nodes/status`, ...
    pub rbac: String,
    pub uri: String,
}

#[derive(Debug, Default)]
struct Inner {
    rv: u64,
    objects: BTreeMap<Coll, BTreeMap<(String, String), Value>>,
    log: Vec<Logged>,
    /// Watches from before this resource version get 410 Gone.
    oldest: u64,
    watches: Vec<LiveWatch>,
    requests: Vec<Recorded>,
    mode: Option<Mode>,
    /// Collections that do not exist (a CRD not installed): 404.
    missing: BTreeSet<Coll>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct FakeApi {
    inner: Mutex<Inner>,
}

/// Field and label requirements of a list or watch.
#[derive(Clone, Debug, Default)]
struct Filter {
    namespace: Option<String>,
    fields: Vec<(String, String)>,
    labels: Vec<(String, Option<String>, bool)>,
}

impl Filter {
    fn parse(namespace: Option<String>, query: &BTreeMap<String, String>) -> Filter {
        let mut f = Filter {
            namespace,
            ..Filter::default()
        };
        for term in query
            .get("fieldSelector")
            .into_iter()
            .flat_map(|s| s.split(','))
        {
            if let Some((k, v)) = term.split_once('=') {
                f.fields
                    .push((k.to_string(), v.trim_start_matches('=').to_string()));
            }
        }
        for term in query
            .get("labelSelector")
            .into_iter()
            .flat_map(|s| s.split(','))
        {
            let term = term.trim();
            if let Some(key) = term.strip_prefix('!') {
                f.labels.push((key.to_string(), None, false));
            } else if let Some((k, v)) = term.split_once("!=") {
                f.labels.push((k.to_string(), Some(v.to_string()), false));
            } else if let Some((k, v)) = term.split_once('=') {
                let v = v.trim_start_matches('=');
                f.labels.push((k.to_string(), Some(v.to_string()), true));
            } else if !term.is_empty() {
                f.labels.push((term.to_string(), None, true));
            }
        }
        f
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if obj["metadata"]["namespace"].as_str() != Some(ns) {
                return false;
            }
        }
        for (path, want) in &self.fields {
            let pointer = format!("/{}", path.replace('.', "/"));
            if obj.pointer(&pointer).and_then(Value::as_str).unwrap_or("") != want {
                return false;
            }
        }
        let labels = &obj["metadata"]["labels"];
        for (key, value, positive) in &self.labels {
            let have = labels.get(key).and_then(Value::as_str);
            let ok = match value {
                None => have.is_some(),
                Some(v) => have == Some(v.as_str()),
            };
            if ok != *positive {
                return false;
            }
        }
        true
    }
}

/// `?a=b&c=d`, percent-decoded.
fn query(uri: &axum::http::Uri) -> BTreeMap<String, String> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                    match u8::from_str_radix(hex, 16) {
                        Ok(b) => {
                            out.push(b);
                            i += 3;
                            continue;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b'+' => out.push(b' '),
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// What a path names.
#[derive(Debug)]
struct Target {
    coll: Coll,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    Some(Target {
        coll: Coll {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
        },
        namespace,
        name,
        sub,
    })
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn gone_line() -> Bytes {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "too old resource version", "reason": "Expired", "code": 410,
    });
    event_line("ERROR", &status)
}

/// Strategic merge as far as Node status needs it: objects merge, `conditions` merge by
/// `type`, anything else is replaced.
fn merge(target: &mut Value, patch: &Value, field: &str) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k.clone()).or_insert(Value::Null), v, k);
            }
        }
        (Value::Array(t), Value::Array(p)) if field == "conditions" => {
            for c in p {
                match t.iter_mut().find(|x| x["type"] == c["type"]) {
                    Some(x) => merge(x, c, ""),
                    None => t.push(c.clone()),
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl FakeApi {
    pub fn new() -> Arc<FakeApi> {
        Arc::new(FakeApi::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds or replaces `object` (it needs `apiVersion`, `kind`, `metadata.name`) and tells
    /// the open watches.
    pub fn put(&self, object: Value) {
        self.store(object, true);
    }

    /// Adds or replaces `object` without telling the watches (a watch that lags behind).
    pub fn put_quietly(&self, object: Value) {
        self.store(object, false);
    }

    fn store(&self, mut object: Value, announce: bool) {
        let coll = Coll::of(
            object["apiVersion"].as_str().expect("apiVersion"),
            object["kind"].as_str().expect("kind"),
        );
        let key = (
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            object["metadata"]["name"]
                .as_str()
                .expect("metadata.name")
                .to_string(),
        );
        let mut inner = self.lock();
        inner.rv += 1;
        let rv = inner.rv;
        object["metadata"]["resourceVersion"] = rv.to_string().into();
        let items = inner.objects.entry(coll.clone()).or_default();
        let kind = if items.insert(key, object.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        if announce {
            inner.announce(rv, coll, kind, object);
        }
    }

    /// Deletes an object; whether it existed.
    pub fn remove(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> bool {
        let coll = Coll::of(api_version, kind);
        let mut inner = self.lock();
        let Some(mut object) = inner
            .objects
            .get_mut(&coll)
            .and_then(|items| items.remove(&(namespace.to_string(), name.to_string())))
        else {
            return false;
        };
        inner.rv += 1;
        let rv = inner.rv;
        object["metadata"]["resourceVersion"] = rv.to_string().into();
        inner.announce(rv, coll, "DELETED", object);
        true
    }

    /// The stored object, if any.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .get(&Coll::of(api_version, kind))?
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    pub fn set_mode(&self, mode: Mode) {
        let mut inner = self.lock();
        inner.mode = Some(mode);
        if mode != Mode::Up {
            inner.watches.clear();
        }
    }

    /// Ends every open watch (an API server restart; clients resume from their versions).
    pub fn end_watches(&self) {
        self.lock().watches.clear();
    }

    /// Forgets the history: resuming a watch from any version before the current one gets
    /// 410 Gone.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.oldest = inner.rv;
        inner.log.clear();
    }

    /// Sends an `ERROR` event with `code` into every open watch (410 ends them, as the API
    /// server does).
    pub fn watch_error(&self, code: u16) {
        let mut inner = self.lock();
        let line = if code == 410 {
            gone_line()
        } else {
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": "injected", "reason": "InternalError",
                "code": code});
            event_line("ERROR", &status)
        };
        inner
            .watches
            .retain(|w| w.tx.unbounded_send(line.clone()).is_ok());
        if code == 410 {
            inner.watches.clear();
        }
    }

    /// Makes a collection 404 (its CRD is not installed) or exist again.
    pub fn set_missing(&self, api_version: &str, kind: &str, missing: bool) {
        let coll = Coll::of(api_version, kind);
        let mut inner = self.lock();
        if missing {
            inner.missing.insert(coll);
        } else {
            inner.missing.remove(&coll);
        }
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// How many requests so far were `rbac` (`list pods`).
    pub fn count(&self, rbac: &str) -> usize {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.rbac == rbac)
            .count()
    }

    /// How many requests so far started with `prefix` (`watch `).
    pub fn count_prefix(&self, prefix: &str) -> usize {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.rbac.starts_with(prefix))
            .count()
    }

    /// How many watches are open.
    pub fn open_watches(&self) -> usize {
        let mut inner = self.lock();
        inner.watches.retain(|w| !w.tx.is_closed());
        inner.watches.len()
    }

    /// The app, for `axum::serve`.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new().fallback(handle).with_state(Arc::clone(self))
    }

    /// A kube client talking to this fake in-process.
    pub fn client(self: &Arc<Self>) -> kube::Client {
        use tower::ServiceExt;
        let fake = Arc::clone(self);
        let service = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
            let fake = Arc::clone(&fake);
            async move {
                if fake.lock().mode == Some(Mode::Refusing) {
                    return Err(
                        Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
                            as Box<dyn std::error::Error + Send + Sync>,
                    );
                }
                let response = fake.router().oneshot(req.map(Body::new)).await;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(match response {
                    Ok(r) => r,
                    Err(never) => match never {},
                })
            }
        });
        kube::Client::new(service, "default")
    }
}

impl Inner {
    fn announce(&mut self, rv: u64, coll: Coll, kind: &'static str, object: Value) {
        let line = event_line(kind, &object);
        self.watches.retain(|w| {
            w.coll != coll
                || !w.filter.matches(&object)
                || w.tx.unbounded_send(line.clone()).is_ok()
        });
        self.log.push(Logged {
            rv,
            coll,
            kind,
            object,
        });
    }
}

/// The benchmark's control path: `POST /fake/put` with an object adds or replaces it.
const CONTROL_PUT: &str = "/fake/put";

async fn handle(State(fake): State<Arc<FakeApi>>, req: Request) -> Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    if method == Method::POST && uri.path() == CONTROL_PUT {
        let body = axum::body::to_bytes(req.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        return match serde_json::from_slice::<Value>(&body) {
            Ok(object) => {
                fake.put(object);
                StatusCode::NO_CONTENT.into_response()
            }
            Err(e) => status(400, "BadRequest", &e.to_string()),
        };
    }
    let q = query(&uri);
    let Some(target) = parse_path(uri.path()) else {
        return status(404, "NotFound", &format!("no such path {}", uri.path()));
    };
    let verb = match (&method, &target.name) {
        (&Method::GET, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => "watch",
        (&Method::GET, None) => "list",
        (&Method::GET, Some(_)) => "get",
        (&Method::PATCH, _) => "patch",
        (&Method::PUT, _) => "update",
        (&Method::POST, _) => "create",
        (&Method::DELETE, _) => "delete",
        _ => "unknown",
    };
    let mut resource = target.coll.resource();
    if let Some(sub) = &target.sub {
        resource = format!("{resource}/{sub}");
    }
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let mut inner = fake.lock();
    inner.requests.push(Recorded {
        rbac: format!("{verb} {resource}"),
        uri: uri.to_string(),
    });
    if let Some(Mode::Status(code)) = inner.mode {
        let reason = match code {
            401 => "Unauthorized",
            403 => "Forbidden",
            _ => "InternalError",
        };
        return status(code, reason, &format!("{verb} {resource}: injected {code}"));
    }
    if inner.missing.contains(&target.coll) {
        return status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
    }
    let filter = Filter::parse(target.namespace.clone(), &q);
    match verb {
        "list" => {
            let items: Vec<Value> = inner
                .objects
                .get(&target.coll)
                .into_iter()
                .flat_map(|items| items.values())
                .filter(|o| filter.matches(o))
                .cloned()
                .collect();
            let list = json!({
                "apiVersion": if target.coll.group.is_empty() { target.coll.version.clone() } else { format!("{}/{}", target.coll.group, target.coll.version) },
                "kind": "List",
                "metadata": {"resourceVersion": inner.rv.to_string()},
                "items": items,
            });
            (
                [(header::CONTENT_TYPE, "application/json")],
                list.to_string(),
            )
                .into_response()
        }
        "watch" => {
            let from: u64 = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let (tx, rx) = unbounded::<Bytes>();
            if from != 0 && from < inner.oldest {
                let _ = tx.unbounded_send(gone_line());
            } else {
                for e in inner
                    .log
                    .iter()
                    .filter(|e| e.rv > from && e.coll == target.coll && filter.matches(&e.object))
                {
                    let _ = tx.unbounded_send(event_line(e.kind, &e.object));
                }
                inner.watches.push(LiveWatch {
                    coll: target.coll.clone(),
                    filter,
                    tx,
                });
            }
            let stream = rx.map(Ok::<_, Infallible>);
            (
                [(header::CONTENT_TYPE, "application/json")],
                Body::from_stream(stream),
            )
                .into_response()
        }
        "get" => {
            let key = (
                target.namespace.clone().unwrap_or_default(),
                target.name.clone().unwrap_or_default(),
            );
            match inner.objects.get(&target.coll).and_then(|i| i.get(&key)) {
                Some(o) => {
                    ([(header::CONTENT_TYPE, "application/json")], o.to_string()).into_response()
                }
                None => status(
                    404,
                    "NotFound",
                    &format!("{resource} {:?} not found", key.1),
                ),
            }
        }
        "patch" if target.sub.as_deref() == Some("status") => {
            let key = (
                target.namespace.clone().unwrap_or_default(),
                target.name.clone().unwrap_or_default(),
            );
            let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                return status(400, "BadRequest", "patch is not JSON");
            };
            let Some(object) = inner
                .objects
                .get_mut(&target.coll)
                .and_then(|i| i.get_mut(&key))
            else {
                return status(
                    404,
                    "NotFound",
                    &format!("{resource} {:?} not found", key.1),
                );
            };
            merge(object, &patch, "");
            let mut object = object.clone();
            inner.rv += 1;
            let rv = inner.rv;
            object["metadata"]["resourceVersion"] = rv.to_string().into();
            inner
                .objects
                .get_mut(&target.coll)
                .and_then(|i| i.insert(key, object.clone()));
            inner.announce(rv, target.coll.clone(), "MODIFIED", object.clone());
            (
                [(header::CONTENT_TYPE, "application/json")],
                object.to_string(),
            )
                .into_response()
        }
        _ => status(
            405,
            "MethodNotAllowed",
            &format!("{verb} {resource} is not faked"),
        ),
    }
}
