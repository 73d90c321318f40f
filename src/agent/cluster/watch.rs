//! One watch per kind: kube-runtime's `watcher` of the kind's slim body, each event turned
//! into a [`Change`] for the feeder ([`super::feed`]), which owns the only copy of the
//! objects (the [`crate::index::ClusterIndex`]).
//!
//! The watcher resumes an interrupted watch from the last resource version it saw (a
//! restarted API server costs a watch request per kind, not a relist) and relists only when
//! the API server says that version is gone (410). Lists are served from the API server's
//! watch cache (`resourceVersion=0`), the cheap kind of list, as client-go's reflectors do.
//!
//! Objects decode one at a time ([`Lenient`]): one of unexpected shape (a wrong type where a
//! field should be) is reported as that object's error instead of failing the whole list.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::watcher::{self, watcher, Event};
use kube::Client;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use tokio::sync::mpsc;

use crate::k8s::Slim;
use crate::objects::{Body, Kind, Meta, NodeBody, Object, ObjectError};
use crate::state::ObjectKey;

/// What a watch saw, for the feeder.
#[derive(Debug)]
pub(super) enum Change {
    /// An object was added or changed (`listing`: as part of a (re)list). `Ok(None)`: an
    /// object Lace ignores (as if it did not exist); `Err`: why it cannot be used.
    Apply {
        kind: Kind,
        key: ObjectKey,
        object: Result<Option<Object>, ObjectError>,
        listing: bool,
    },
    Delete {
        kind: Kind,
        key: ObjectKey,
    },
    /// A (re)list starts: what it does not deliver again is gone when it is done.
    ListStarted(Kind),
    ListDone(Kind),
    /// The watch failed; it is retried after `retry_in`.
    Failed {
        kind: Kind,
        error: watcher::Error,
        retry_in: Duration,
    },
    /// A request to the API server succeeded after failures (the reachability probe).
    Reachable,
}

/// A body that decodes whatever the API server sends: the object's error if it is not of
/// the shape `B` expects.
#[derive(Clone, Debug)]
pub(super) struct Lenient<B>(Result<B, ObjectError>);

impl<'de, B: Body> Deserialize<'de> for Lenient<B> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Ok(Lenient::decode(value))
    }
}

impl<B: DeserializeOwned> Lenient<B> {
    fn decode(value: serde_json::Value) -> Self {
        Lenient(B::deserialize(value).map_err(|e| ObjectError::Shape(e.to_string())))
    }
}

impl<B: Body> Body for Lenient<B> {
    const KIND: Kind = B::KIND;
    fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError> {
        self.0.and_then(|body| body.into_object(meta))
    }
}

/// The own Node's `NetworkUnavailable` condition, as far as Lace cares.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub(super) struct Condition {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub reason: String,
}

/// The own Node: its slim body and its `NetworkUnavailable` condition (for
/// [`super::node_status`]).
#[derive(Clone, Debug)]
pub(super) struct OwnNode {
    node: Lenient<NodeBody>,
    pub network_unavailable: Option<Condition>,
}

impl<'de> Deserialize<'de> for OwnNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        let network_unavailable = value
            .pointer("/status/conditions")
            .and_then(|c| c.as_array())
            .and_then(|c| {
                c.iter()
                    .find(|c| c.get("type").and_then(|t| t.as_str()) == Some(NETWORK_UNAVAILABLE))
            })
            .and_then(|c| Condition::deserialize(c).ok());
        let node = Lenient::decode(value);
        Ok(OwnNode {
            node,
            network_unavailable,
        })
    }
}

impl Body for OwnNode {
    const KIND: Kind = Kind::Node;
    fn into_object(self, meta: Meta) -> Result<Option<Object>, ObjectError> {
        self.node.into_object(meta)
    }
}

/// The Node condition type Lace sets.
pub(super) const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";

fn key_of(meta: &ObjectMeta) -> ObjectKey {
    ObjectKey::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Exponential backoff with jitter (client-go's reflector: 800 ms doubling to 30 s), so
/// thousands of agents do not retry in step after an API server restart.
#[derive(Clone, Debug)]
pub(super) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            next: min,
        }
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// The next delay: the current step plus up to half of it at random.
    pub fn next_delay(&mut self) -> Duration {
        use std::hash::{BuildHasher, Hasher};
        let step = self.next;
        self.next = (self.next * 2).min(self.max);
        // RandomState is seeded per instance: enough randomness to spread retries.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(step.as_nanos() as u64);
        let jitter = step.mul_f64((h.finish() % 1000) as f64 / 2000.0);
        step + jitter
    }
}

/// Runs the watch of `R`'s kind until the feeder goes away. `inspect` sees every object
/// delivered (the own Node's condition).
pub(super) async fn run<R: Body>(
    client: Client,
    config: watcher::Config,
    tx: mpsc::Sender<Change>,
    mut backoff: Backoff,
    inspect: impl Fn(&Slim<R>) + Send + 'static,
) {
    let kind = R::KIND;
    let api: Api<Slim<R>> = Api::all_with(client, &());
    let mut events = watcher(api, config).boxed();
    while let Some(event) = events.next().await {
        let change = match event {
            Ok(Event::Init) => Change::ListStarted(kind),
            Ok(Event::InitDone) => Change::ListDone(kind),
            Ok(Event::Apply(o)) => {
                inspect(&o);
                Change::Apply {
                    kind,
                    key: key_of(&o.metadata),
                    listing: false,
                    object: o.into_object(),
                }
            }
            Ok(Event::InitApply(o)) => {
                inspect(&o);
                Change::Apply {
                    kind,
                    key: key_of(&o.metadata),
                    listing: true,
                    object: o.into_object(),
                }
            }
            Ok(Event::Delete(o)) => Change::Delete {
                kind,
                key: key_of(&o.metadata),
            },
            Err(error) => {
                // 410 Gone: relist now, it is routine. Anything else: back off.
                let gone = matches!(&error, watcher::Error::WatchError(s) if s.code == 410);
                let retry_in = if gone {
                    Duration::ZERO
                } else {
                    backoff.next_delay()
                };
                if tx
                    .send(Change::Failed {
                        kind,
                        error,
                        retry_in,
                    })
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(retry_in).await;
                continue;
            }
        };
        backoff.reset();
        if tx.send(change).await.is_err() {
            return;
        }
    }
}
