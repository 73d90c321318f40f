//! The patch types the API server takes, on JSON values: merge patch (RFC 7386), strategic
//! merge patch, JSON patch (RFC 6902) and server-side apply.
//!
//! Strategic merge and apply need a schema to know which lists merge by key; the fake
//! knows the one list Kubernetes objects that Lace writes share: `conditions`, keyed by
//! `type` (`patchMergeKey` in the core types, `listType=map` in CRDs). Every other list is
//! replaced whole, as an atomic list is.

use serde_json::Value;

/// Why a patch cannot be applied (the API server answers 422).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum PatchError {
    #[error("a JSON patch is a list of operations")]
    NotAList,
    #[error("JSON patch operation {0}: {1}")]
    Operation(usize, String),
    #[error("JSON patch operation {0}: test failed at {1}")]
    TestFailed(usize, String),
}

/// The list fields that merge by a key, and the key.
fn merge_key(field: &str) -> Option<&'static str> {
    (field == "conditions").then_some("type")
}

/// RFC 7386: objects merge, `null` deletes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    merge_with(target, patch, "", false);
}

/// A strategic merge patch: a merge patch whose keyed lists merge item by item.
pub fn strategic(target: &mut Value, patch: &Value) {
    merge_with(target, patch, "", true);
}

fn merge_with(target: &mut Value, patch: &Value, field: &str, keyed: bool) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_with(t.entry(k.clone()).or_insert(Value::Null), v, k, keyed);
                }
            }
        }
        (Value::Array(t), Value::Array(p)) if keyed && merge_key(field).is_some() => {
            let key = merge_key(field).unwrap_or_default();
            for item in p {
                match t.iter_mut().find(|x| x[key] == item[key]) {
                    Some(x) => merge_with(x, item, "", keyed),
                    None => t.push(item.clone()),
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Server-side apply by one field manager: the fields `applied` sets are set; the fields
/// the manager's previous apply (`previous`) set and this one does not are removed; fields
/// set by anyone else stay. (The API server tracks this in `managedFields`; the fake keeps
/// each manager's last applied configuration instead, which gives the same result while
/// managers do not take fields from each other.)
pub fn apply(live: &mut Value, previous: Option<&Value>, applied: &Value) {
    if let Some(previous) = previous {
        prune(live, previous, applied, "");
    }
    merge_with(live, applied, "", true);
}

/// Removes from `live` what `previous` set and `applied` (`Null`: nothing) no longer does,
/// field by field: a map or keyed list the manager shares with others keeps their fields.
fn prune(live: &mut Value, previous: &Value, applied: &Value, field: &str) {
    match (live, previous) {
        (Value::Object(l), Value::Object(p)) => {
            for (k, before) in p {
                let now = applied.get(k).unwrap_or(&Value::Null);
                let Some(child) = l.get_mut(k) else {
                    continue;
                };
                let nested = before.is_object() || (before.is_array() && merge_key(k).is_some());
                if !nested {
                    if now.is_null() {
                        l.remove(k);
                    }
                    continue;
                }
                prune(child, before, now, k);
                // A map or list only this manager filled goes with its last field.
                let emptied = match child {
                    Value::Object(m) => m.is_empty(),
                    Value::Array(a) => a.is_empty(),
                    _ => false,
                };
                if now.is_null() && emptied {
                    l.remove(k);
                }
            }
        }
        (Value::Array(l), Value::Array(p)) => {
            let Some(key) = merge_key(field) else {
                return; // atomic: the apply replaces it whole
            };
            let kept = applied.as_array().map(Vec::as_slice).unwrap_or_default();
            for before in p {
                match kept.iter().find(|x| x[key] == before[key]) {
                    None => l.retain(|x| x[key] != before[key]),
                    Some(now) => {
                        if let Some(child) = l.iter_mut().find(|x| x[key] == before[key]) {
                            prune(child, before, now, "");
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

/// RFC 6902: `add`, `remove`, `replace`, `move`, `copy` and `test`, all or nothing.
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let ops = ops.as_array().ok_or(PatchError::NotAList)?;
    let mut patched = target.clone();
    for (i, op) in ops.iter().enumerate() {
        let bad = |why: &str| PatchError::Operation(i, why.to_string());
        let path = op["path"].as_str().ok_or_else(|| bad("no path"))?;
        let from = || op["from"].as_str().ok_or_else(|| bad("no from"));
        let value = || op.get("value").cloned().ok_or_else(|| bad("no value"));
        match op["op"].as_str().unwrap_or_default() {
            "add" => add(&mut patched, path, value()?).map_err(|w| bad(&w))?,
            "remove" => drop(remove(&mut patched, path).map_err(|w| bad(&w))?),
            "replace" => {
                remove(&mut patched, path).map_err(|w| bad(&w))?;
                add(&mut patched, path, value()?).map_err(|w| bad(&w))?;
            }
            "move" => {
                let moved = remove(&mut patched, from()?).map_err(|w| bad(&w))?;
                add(&mut patched, path, moved).map_err(|w| bad(&w))?;
            }
            "copy" => {
                let copied = patched
                    .pointer(from()?)
                    .cloned()
                    .ok_or_else(|| bad("from does not exist"))?;
                add(&mut patched, path, copied).map_err(|w| bad(&w))?;
            }
            "test" => {
                if patched.pointer(path) != Some(&value()?) {
                    return Err(PatchError::TestFailed(i, path.to_string()));
                }
            }
            other => return Err(bad(&format!("unknown op {other:?}"))),
        }
    }
    *target = patched;
    Ok(())
}

/// The parent of a JSON pointer and its last token (unescaped).
fn split(path: &str) -> Result<(&str, String), String> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("{path:?} is not a JSON pointer"))?;
    Ok((parent, last.replace("~1", "/").replace("~0", "~")))
}

fn add(target: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *target = value;
        return Ok(());
    }
    let (parent, last) = split(path)?;
    match target.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.insert(last, value);
            Ok(())
        }
        Some(Value::Array(list)) => {
            let at = if last == "-" {
                list.len()
            } else {
                last.parse::<usize>()
                    .ok()
                    .filter(|at| *at <= list.len())
                    .ok_or_else(|| format!("no index {last} in {parent:?}"))?
            };
            list.insert(at, value);
            Ok(())
        }
        _ => Err(format!("{parent:?} does not exist")),
    }
}

fn remove(target: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split(path)?;
    let removed = match target.pointer_mut(parent) {
        Some(Value::Object(map)) => map.remove(&last),
        Some(Value::Array(list)) => last
            .parse::<usize>()
            .ok()
            .filter(|at| *at < list.len())
            .map(|at| list.remove(at)),
        _ => None,
    };
    removed.ok_or_else(|| format!("{path:?} does not exist"))
}
