//! The kube layer, writing: each [`Step`] of [`crate::diff`] as one request (server-side apply
//! with field manager [`FIELD_MANAGER`], or a delete with the uid as precondition), and its
//! Events through kube-runtime's recorder once the write succeeded.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use lace::objects::Kind;
use serde_json::{json, Value};

use crate::config::FIELD_MANAGER;
use crate::diff::{Note, Step, Write};
use crate::error::{classify, FatalError, Resource};
use crate::metrics::Metrics;
use crate::model::{Model, Seen};
use crate::watch::{api, seen_object};

/// What a successful write changed, for the model (the watch confirms it later).
#[derive(Debug)]
pub enum Outcome {
    Seen(Box<Seen>),
    Deleted(Kind, String),
    /// The object was already gone.
    Nothing,
}

/// Why a write failed (and will be retried with backoff), or cannot be retried.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// 409: the object changed since it was observed.
    #[error("{write}: conflict (the object changed since it was read): {message}")]
    Conflict { write: String, message: String },
    #[error(transparent)]
    Fatal(FatalError),
    #[error("{write}: {source}")]
    Failed {
        write: String,
        #[source]
        source: kube::Error,
    },
}

/// The result of one step: the write's, and a fatal error from publishing its Events.
#[derive(Debug)]
pub struct StepResult {
    pub write: Result<Outcome, WriteError>,
    pub event_error: Option<FatalError>,
}

/// Executes steps against the API.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    recorder: Recorder,
    metrics: std::sync::Arc<Metrics>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

/// The owner reference of an internal object: its Node or Network, as controller. No
/// `blockOwnerDeletion`: it would need the right to set finalizers on Nodes.
fn owner_reference(owner: Kind, name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": owner.api_version(),
        "kind": owner.name(),
        "name": name,
        "uid": uid,
        "controller": true,
    })
}

/// The apply body of an internal object of `kind` owned by `owner`.
fn allocation_body(
    kind: Kind,
    owner: Kind,
    name: &str,
    owner_uid: &str,
    spec: Value,
    resource_version: Option<&str>,
) -> Value {
    let mut metadata = json!({
        "name": name,
        "ownerReferences": [owner_reference(owner, name, owner_uid)],
    });
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = rv.into();
    }
    json!({
        "apiVersion": kind.api_version(),
        "kind": kind.name(),
        "metadata": metadata,
        "spec": spec,
    })
}

/// The request a write issues: verb, kind and subresource (also the RBAC it needs).
pub fn request_of(write: &Write) -> (&'static str, Kind, Option<&'static str>) {
    match write {
        Write::Delete { kind, .. } => ("delete", *kind, None),
        Write::NetworkAllocation { .. } => ("patch", Kind::NetworkAllocation, None),
        Write::NodeAllocation { .. } => ("patch", Kind::NodeAllocation, None),
        Write::Status { kind, .. } => ("patch", *kind, Some("status")),
        Write::NodeCondition { .. } => ("patch", Kind::Node, Some("status")),
    }
}

impl Writer {
    pub fn new(client: Client, metrics: std::sync::Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
        }
    }

    /// Executes `step`; `model` supplies the uids its Events refer to.
    pub async fn execute(&self, step: Step, model: &Model) -> StepResult {
        let (verb, kind, sub) = request_of(&step.write);
        let write = self.send(&step.write).await;
        let result = match &write {
            Ok(_) => "ok",
            Err(kube::Error::Api(s)) if s.code == 404 => "not_found",
            Err(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Err(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Err(kube::Error::Api(s)) if s.code == 422 => "invalid",
            Err(_) => "error",
        };
        self.metrics.write(verb, kind, sub, result);
        let write = match write {
            Ok(outcome) => Ok(outcome),
            // Gone already (deleted by the garbage collector, or the object a status is for).
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Outcome::Nothing),
            Err(e) => Err(match classify(verb, Resource::of(kind, sub), &e) {
                Some(fatal) => WriteError::Fatal(fatal),
                None => match e {
                    kube::Error::Api(s) if s.code == 409 => WriteError::Conflict {
                        write: step.write.to_string(),
                        message: s.message,
                    },
                    source => WriteError::Failed {
                        write: step.write.to_string(),
                        source,
                    },
                },
            }),
        };
        let mut event_error = None;
        if matches!(write, Ok(Outcome::Seen(_) | Outcome::Deleted(..))) {
            for note in &step.notes {
                if let Some(e) = self.publish(note, model).await {
                    event_error = Some(e);
                }
            }
        }
        StepResult { write, event_error }
    }

    async fn send(&self, write: &Write) -> Result<Outcome, kube::Error> {
        let (_, kind, sub) = request_of(write);
        let (_, name) = write.target();
        let body = match write {
            Write::Delete { uid, .. } => {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(uid.clone()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                api(&self.client, kind).delete(name, &params).await?;
                return Ok(Outcome::Deleted(kind, name.to_string()));
            }
            Write::NetworkAllocation {
                alloc,
                resource_version,
                ..
            } => allocation_body(
                kind,
                Kind::Network,
                name,
                &alloc.owner_uid,
                json!(alloc.spec),
                resource_version.as_deref(),
            ),
            Write::NodeAllocation {
                alloc,
                resource_version,
                ..
            } => allocation_body(
                kind,
                Kind::Node,
                name,
                &alloc.owner_uid,
                json!(alloc.spec),
                resource_version.as_deref(),
            ),
            Write::Status { conditions, .. } => json!({
                "apiVersion": kind.api_version(),
                "kind": kind.name(),
                "metadata": {"name": name},
                "status": {"conditions": conditions},
            }),
            // A core NodeCondition: no observedGeneration.
            Write::NodeCondition { condition, .. } => json!({
                "apiVersion": kind.api_version(),
                "kind": kind.name(),
                "metadata": {"name": name},
                "status": {"conditions": [{
                    "type": condition.type_,
                    "status": condition.status,
                    "reason": condition.reason,
                    "message": condition.message,
                    "lastTransitionTime": condition.last_transition_time,
                }]},
            }),
        };
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        let api = api(&self.client, kind);
        let object = match sub {
            Some(_) => api.patch_status(name, &apply, &Patch::Apply(&body)).await?,
            None => api.patch(name, &apply, &Patch::Apply(&body)).await?,
        };
        Ok(Outcome::Seen(Box::new(seen_object(kind, object))))
    }

    /// Publishes `note`; a fatal error (RBAC) is returned, others are logged and counted.
    async fn publish(&self, note: &Note, model: &Model) -> Option<FatalError> {
        let reference = ObjectReference {
            api_version: Some(note.kind.api_version().into()),
            kind: Some(note.kind.name().into()),
            name: Some(note.name.clone()),
            uid: model.get(note.kind, &note.name).map(|o| o.uid.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.clone(),
            // The Events API caps a note at 1 kB.
            note: Some(truncate(&note.message, 1000)),
            action: note.action.into(),
            secondary: None,
        };
        match self.recorder.publish(&event, &reference).await {
            Ok(()) => {
                self.metrics.event(note.warning, "ok");
                None
            }
            Err(e) => {
                self.metrics.event(note.warning, "error");
                // The recorder creates an Event, or patches it when it repeats.
                let fatal = classify("create or patch", Resource::EVENTS, &e);
                if fatal.is_none() {
                    tracing::warn!(object = %format!("{}/{}", note.kind, note.name), reason = %note.reason, error = %e, "publishing an Event failed");
                }
                fatal
            }
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
