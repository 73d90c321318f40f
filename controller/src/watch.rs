//! The kube layer, reading: one watcher per watched kind, each object converted with the
//! library's one object → state conversion into a [`Seen`] for the [`crate::model::Model`].
//!
//! The objects are read as `DynamicObject`s and each body is parsed on its own, so one
//! object that does not parse (say, a Network whose CIDR slipped past admission) is reported
//! on that object instead of failing the whole list, as a typed watch would.

use std::pin::pin;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use lace::api::Condition;
use lace::k8s::meta_of;
use lace::objects::{Body, BodyVisitor, Kind, Meta, Object};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::desired::NODE_ALLOCATED;
use crate::error::{classify, FatalError, Resource};
use crate::metrics::Metrics;
use crate::model::{Observed, Seen, WATCHED};

/// The API resource of `kind`, for dynamic requests.
pub fn api_resource(kind: Kind) -> ApiResource {
    ApiResource {
        group: kind.group().into(),
        version: kind.version().into(),
        api_version: kind.api_version().into(),
        kind: kind.name().into(),
        plural: kind.plural().into(),
    }
}

/// An API handle for every object of `kind` (all watched kinds are cluster-scoped).
pub fn api(client: &Client, kind: Kind) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &api_resource(kind))
}

struct Parse {
    meta: Meta,
    data: Value,
}

impl BodyVisitor for Parse {
    type Output = Result<Option<Object>, String>;
    fn visit<B: Body>(self) -> Self::Output {
        let body: B = serde_path_to_error::deserialize(self.data).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                e.inner().to_string()
            } else {
                format!("{path}: {}", e.inner())
            }
        })?;
        body.into_object(self.meta).map_err(|e| e.to_string())
    }
}

/// The conditions the controller reads back from `status`: all of a Lace kind's, only its
/// own of a Node's. Entries it cannot read are skipped (it then rewrites them).
fn conditions_of(kind: Kind, data: &Value) -> Vec<Condition> {
    let Some(list) = data.pointer("/status/conditions").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter(|c| {
            kind != Kind::Node || c.get("type").and_then(Value::as_str) == Some(NODE_ALLOCATED)
        })
        .filter_map(|c| serde_json::from_value(c.clone()).ok())
        .collect()
}

/// The [`Seen`] of an object of `kind` with `metadata` and the rest `data`.
pub fn seen(kind: Kind, metadata: &ObjectMeta, data: Value) -> Seen {
    let owner_kind = match kind {
        Kind::NetworkAllocation => Some(Kind::Network),
        Kind::NodeAllocation => Some(Kind::Node),
        _ => None,
    };
    let owner_uid = owner_kind.and_then(|owner| {
        metadata
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.kind == owner.name() && r.api_version == owner.api_version())
            .map(|r| r.uid.clone())
    });
    let conditions = if owner_kind.is_some() {
        Vec::new()
    } else {
        conditions_of(kind, &data)
    };
    let parsed = kind.visit(Parse {
        meta: meta_of(metadata),
        data,
    });
    let (object, unreadable) = match parsed {
        Ok(Some(object)) => (Some(object), None),
        Ok(None) => (None, Some("not an object Lace reads".to_string())),
        Err(why) => (None, Some(why)),
    };
    Seen {
        kind,
        name: metadata.name.clone().unwrap_or_default(),
        observed: Observed {
            uid: metadata.uid.clone().unwrap_or_default(),
            resource_version: metadata.resource_version.clone().unwrap_or_default(),
            generation: metadata.generation,
            owner_uid,
            conditions,
            unreadable,
        },
        object,
    }
}

/// The [`Seen`] of a whole object (a watch event's, a write's response).
pub fn seen_object(kind: Kind, object: DynamicObject) -> Seen {
    seen(kind, &object.metadata, object.data)
}

/// What the watchers tell the controller's loop.
#[derive(Debug)]
pub enum Msg {
    /// A (re)list of `kind` starts.
    Init(Kind),
    /// An object of the list in progress.
    InitApply(Seen),
    /// The list of `kind` is complete: replace what is known of it.
    InitDone(Kind),
    Apply(Seen),
    Delete(Kind, String),
    /// A watcher cannot go on (CRD missing, RBAC denied).
    Fatal(FatalError),
}

/// Watches `kind` into `tx` until the receiver is gone or the watch hits a fatal error.
/// Other errors are retried by the watcher, with backoff.
pub async fn watch(
    client: Client,
    kind: Kind,
    tx: mpsc::Sender<Msg>,
    metrics: std::sync::Arc<Metrics>,
) {
    let stream = watcher(api(&client, kind), watcher::Config::default()).default_backoff();
    let mut stream = pin!(stream);
    while let Some(next) = stream.next().await {
        let msg = match next {
            Ok(watcher::Event::Init) => Msg::Init(kind),
            Ok(watcher::Event::InitApply(o)) => Msg::InitApply(seen_object(kind, o)),
            Ok(watcher::Event::InitDone) => Msg::InitDone(kind),
            Ok(watcher::Event::Apply(o)) => Msg::Apply(seen_object(kind, o)),
            Ok(watcher::Event::Delete(o)) => Msg::Delete(kind, o.metadata.name.unwrap_or_default()),
            Err(e) => {
                let (verb, source) = match &e {
                    watcher::Error::InitialListFailed(s) => ("list", Some(s)),
                    watcher::Error::WatchStartFailed(s) | watcher::Error::WatchFailed(s) => {
                        ("watch", Some(s))
                    }
                    _ => ("watch", None),
                };
                if let Some(fatal) =
                    source.and_then(|s| classify(verb, Resource::of(kind, None), s))
                {
                    let _ = tx.send(Msg::Fatal(fatal)).await;
                    return;
                }
                metrics.watch_error(kind);
                tracing::warn!(%kind, error = %e, "watch failed; retrying with backoff");
                continue;
            }
        };
        if tx.send(msg).await.is_err() {
            return;
        }
    }
}

/// Starts one watcher per watched kind.
pub fn spawn(
    client: &Client,
    tx: &mpsc::Sender<Msg>,
    metrics: &std::sync::Arc<Metrics>,
) -> Vec<tokio::task::JoinHandle<()>> {
    WATCHED
        .into_iter()
        .map(|kind| tokio::spawn(watch(client.clone(), kind, tx.clone(), metrics.clone())))
        .collect()
}
