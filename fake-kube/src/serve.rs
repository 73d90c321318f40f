//! Answering a request: record it, apply the mode and faults, then serve it from the store
//! as the API server would (list, watch, get, create, the four patch types on an object or
//! its `status`, delete with preconditions). Also the tower service a kube `Client` is
//! built on.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::body::FakeBody;
use crate::fault::{reason, Mode};
use crate::patch;
use crate::record::Recorded;
use crate::resource::Target;
use crate::select::{self, Filter};
use crate::store::{key_of, status, ClientId, Key};
use crate::{FakeApi, State};

/// The content type of a server-side apply.
pub(crate) const APPLY: &str = "application/apply-patch+yaml";

/// When objects created through the API were created: one fixed time, so that what the
/// tests compare stays the same from run to run.
const CREATED: &str = "2026-01-01T00:00:00Z";

fn respond(code: u16, body: &Value) -> Response<FakeBody> {
    let mut response = Response::new(FakeBody::json(body));
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn fail(code: u16, message: &str) -> Response<FakeBody> {
    respond(code, &status(code, reason(code), message))
}

/// The request, taken apart as the fake needs it.
struct Incoming {
    recorded: Recorded,
    target: Option<Target>,
    /// Why the body is not JSON.
    bad_body: Option<String>,
}

fn take_apart(method: &Method, uri: &http::Uri, content_type: &str, bytes: &[u8]) -> Incoming {
    let query = select::query(uri);
    let target = Target::parse(uri.path());
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let (verb, group, resource) = match &target {
        Some(t) => (
            t.verb(method, watch),
            t.resource.group.clone(),
            t.rbac_resource(),
        ),
        None => (
            method.as_str().to_lowercase(),
            String::new(),
            uri.path().to_string(),
        ),
    };
    let (body, bad_body) = match serde_json::from_slice::<Value>(bytes) {
        Ok(body) => (body, None),
        Err(_) if bytes.is_empty() => (Value::Null, None),
        Err(e) => (Value::Null, Some(e.to_string())),
    };
    Incoming {
        recorded: Recorded {
            method: method.to_string(),
            uri: uri.to_string(),
            path: uri.path().to_string(),
            query,
            content_type: content_type.to_string(),
            body,
            verb,
            group,
            resource,
            created: false,
        },
        target,
        bad_body,
    }
}

impl FakeApi {
    /// Answers one request from client `client`.
    pub(crate) async fn handle<B>(
        &self,
        client: ClientId,
        request: http::Request<B>,
    ) -> Response<FakeBody>
    where
        B: http_body::Body,
    {
        let (parts, body) = request.into_parts();
        // A body that breaks off is answered as an empty one (the client is gone anyway).
        let bytes = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let incoming = take_apart(&parts.method, &parts.uri, content_type, &bytes);
        self.lock().answer(client, incoming)
    }
}

impl State {
    fn answer(&mut self, client: ClientId, incoming: Incoming) -> Response<FakeBody> {
        let Incoming {
            recorded: r,
            target,
            bad_body,
        } = incoming;
        self.requests.push(r.clone());
        let index = self.requests.len() - 1;
        if let Mode::Status(code) = self.mode {
            return fail(code, &format!("{}: injected {code}", r.rbac()));
        }
        if let Some(fault) = self.take_fault(&r.verb, &r.path) {
            if let Some(object) = fault.update {
                self.put(object, true);
            }
            return fail(fault.code, &fault.message);
        }
        let Some(t) = target else {
            return fail(404, &format!("no such path {}", r.path));
        };
        if self.missing.contains(&t.resource) {
            return fail(404, "the server could not find the requested resource");
        }
        if let Some(why) = bad_body {
            return fail(400, &format!("the body is not JSON: {why}"));
        }
        let key = |name: &str| (t.namespace.clone().unwrap_or_default(), name.to_string());
        let what = |name: &str| format!("{} {name:?}", t.resource.qualified());
        match (r.verb.as_str(), t.name.as_deref(), t.subresource.as_deref()) {
            ("list", None, None) => {
                let filter = Filter::new(t.namespace.clone(), &r.query);
                let list = json!({
                    "apiVersion": t.api_version(), "kind": "List",
                    "metadata": {"resourceVersion": self.store.version().to_string()},
                    "items": self.store.list(&t.resource, &filter),
                });
                respond(200, &list)
            }
            ("watch", None, None) => {
                let filter = Filter::new(t.namespace.clone(), &r.query);
                let from = r
                    .query
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let events = self.store.watch(&t.resource, filter, from, client);
                let mut response = Response::new(FakeBody::stream(events));
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                response
            }
            ("get", Some(name), None | Some("status")) => {
                match self.store.get(&t.resource, &key(name)) {
                    Some(object) => respond(200, object),
                    None => fail(404, &format!("{} not found", what(name))),
                }
            }
            ("create", None, None) => {
                let mut object = r.body.clone();
                if let Some(ns) = &t.namespace {
                    object["metadata"]["namespace"] = ns.clone().into();
                }
                let Some(k) = key_of(&object) else {
                    return fail(422, "metadata.name: Required value");
                };
                if self.store.get(&t.resource, &k).is_some() {
                    return fail(409, &format!("{} already exists", what(&k.1)));
                }
                if object["metadata"]["creationTimestamp"].is_null() {
                    object["metadata"]["creationTimestamp"] = CREATED.into();
                }
                let (stored, _) = self.store.write(&t.resource, object, true);
                respond(201, &stored)
            }
            ("patch", Some(name), sub @ (None | Some("status"))) => {
                let patched = self.patch(&t, &key(name), sub.is_some(), &r);
                match patched {
                    Ok((object, created)) => {
                        self.requests[index].created = created;
                        respond(if created { 201 } else { 200 }, &object)
                    }
                    Err((code, message)) => fail(code, &message),
                }
            }
            ("delete", Some(name), None) => {
                let Some(old) = self.store.get(&t.resource, &key(name)) else {
                    return fail(404, &format!("{} not found", what(name)));
                };
                let preconditions = &r.body["preconditions"];
                for field in ["uid", "resourceVersion"] {
                    if let Some(want) = preconditions[field].as_str() {
                        if old["metadata"][field].as_str() != Some(want) {
                            return fail(409, &format!("Precondition failed: {field} in precondition does not match the object"));
                        }
                    }
                }
                match self.delete(&t.resource, &key(name)) {
                    Some(gone) => respond(200, &gone),
                    None => fail(404, &format!("{} not found", what(name))),
                }
            }
            (verb, _, _) => fail(405, &format!("{verb} {} is not faked", r.path)),
        }
    }

    /// A patch of the object `key` (its `status` with `status`) by its content type: the
    /// patched object and whether the patch created it, or the error's code and message.
    fn patch(
        &mut self,
        t: &Target,
        key: &Key,
        status: bool,
        r: &Recorded,
    ) -> Result<(Value, bool), (u16, String)> {
        let live = self.store.get(&t.resource, key).cloned();
        let base = match (&live, r.content_type.as_str()) {
            (Some(live), _) => live.clone(),
            // Only an apply to the object itself creates it.
            (None, APPLY) if !status => {
                let mut meta = json!({"name": key.1, "creationTimestamp": CREATED});
                if !key.0.is_empty() {
                    meta["namespace"] = key.0.clone().into();
                }
                json!({"apiVersion": r.body["apiVersion"], "kind": r.body["kind"], "metadata": meta})
            }
            (None, _) => {
                let what = format!("{} {:?}", t.resource.qualified(), key.1);
                return Err((404, format!("{what} not found")));
            }
        };
        let mut object = base.clone();
        match r.content_type.as_str() {
            APPLY => {
                if let Some(want) = r.body["metadata"]["resourceVersion"].as_str() {
                    let have = live
                        .as_ref()
                        .and_then(|o| o["metadata"]["resourceVersion"].as_str());
                    if have != Some(want) {
                        return Err((409, format!("Operation cannot be fulfilled on {} {:?}: the object has been modified; please apply your changes to the latest version and try again", t.resource.qualified(), key.1)));
                    }
                }
                let manager = r.query.get("fieldManager").cloned().unwrap_or_default();
                let applied_key = (t.resource.clone(), key.clone(), manager, status);
                patch::apply(&mut object, self.applied.get(&applied_key), &r.body);
                self.applied.insert(applied_key, r.body.clone());
            }
            "application/merge-patch+json" => patch::merge(&mut object, &r.body),
            "application/strategic-merge-patch+json" => patch::strategic(&mut object, &r.body),
            "application/json-patch+json" => {
                patch::json_patch(&mut object, &r.body).map_err(|e| (422, e.to_string()))?
            }
            other => return Err((415, format!("unsupported patch type {other:?}"))),
        }
        // A write to the object keeps the stored status; a write to `status` changes only
        // the status (the rule for resources with a status subresource). `from` is what the
        // status comes from, `object` everything else.
        let (mut object, from) = if status {
            (base, object)
        } else {
            (object, base)
        };
        match from.get("status") {
            Some(s) => object["status"] = s.clone(),
            None => drop(object.as_object_mut().map(|o| o.remove("status"))),
        }
        Ok(self.store.write(&t.resource, object, true))
    }

    /// The fault for a request, if one matches (counting it down).
    fn take_fault(&mut self, verb: &str, path: &str) -> Option<crate::Fault> {
        let i = self
            .faults
            .iter()
            .position(|f| f.verb == verb && f.path == path)?;
        let fault = self.faults[i].clone();
        match &mut self.faults[i].times {
            Some(1) => drop(self.faults.remove(i)),
            Some(n) => *n -= 1,
            None => {}
        }
        Some(fault)
    }
}

/// The fake as a tower service, the way a kube `Client` talks to an API server:
/// `kube::Client::new(fake.service(), "default")`. Each service is one client of the fake
/// ([`FakeService::id`]); in [`Mode::Refusing`] its calls fail as a refused connection does.
#[derive(Clone, Debug)]
pub struct FakeService {
    fake: FakeApi,
    id: ClientId,
}

impl FakeService {
    pub(crate) fn new(fake: FakeApi, id: ClientId) -> FakeService {
        FakeService { fake, id }
    }

    /// This client, for [`FakeApi::sent`].
    pub fn id(&self) -> ClientId {
        self.id
    }
}

impl<B> tower::Service<http::Request<B>> for FakeService
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    type Response = Response<FakeBody>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<FakeBody>, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (fake, id) = (self.fake.clone(), self.id);
        Box::pin(async move {
            if fake.lock().mode == Mode::Refusing {
                return Err(std::io::ErrorKind::ConnectionRefused.into());
            }
            Ok(fake.handle(id, request).await)
        })
    }
}

/// A body the tests send to the fake's control path over TCP.
pub(crate) fn control_put(fake: &FakeApi, body: &Bytes) -> Response<FakeBody> {
    match serde_json::from_slice::<Value>(body) {
        Ok(object) if crate::resource_of(&object).is_some() && key_of(&object).is_some() => {
            fake.put(object);
            let mut response = Response::new(FakeBody::default());
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
        _ => fail(
            400,
            "POST /fake/put takes an object with apiVersion, kind and metadata.name",
        ),
    }
}
