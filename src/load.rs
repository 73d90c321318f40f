//! [`ClusterState`] from a directory of YAML manifests (standalone mode: the demo and tests).
//!
//! [`load_dir`] reads every `*.yaml` / `*.yml` file below a directory (recursively, in path
//! order), each possibly holding several documents, turns each document of a kind Lace reads
//! into an [`Object`](crate::objects::Object) (the conversion both state sources share, see
//! [`crate::objects`]) and applies it to a [`ClusterIndex`]. What this module adds is the
//! directory walk and the error positions: every error names the file, the document and,
//! where serde can tell, the field, line and column.
//!
//! A file is split into its documents with the YAML parser's own document events
//! ([`split_documents`]) and each document is read on its own with `serde_saphyr`, whose
//! multi-document readers skip empty documents: the document numbers in messages count every
//! document of the file, empty ones included, and every position is one in the file.
//!
//! Every other kind is ignored. Namespaced objects without `metadata.namespace` are in
//! `default` (as `kubectl apply` would put them). An object defined twice is an error.
//!
//! [`write_allocations`] records an [`Allocation`] as one file of internal objects in the same
//! directory, so one allocator pass decides and every agent reads the same allocation.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_saphyr::granit_parser::{Event, Parser};
use serde_saphyr::localizer::Localizer;
use serde_saphyr::{MessageFormatter, SnippetMode, UserMessageFormatter};

use crate::alloc::Allocation;
use crate::api::{self, NetworkAllocationSpec, NodeAllocationSpec};
use crate::index::ClusterIndex;
use crate::objects::{is_lace_config, Body, BodyVisitor, Kind, Meta};
use crate::state::ClusterState;

/// Name of the file [`write_allocations`] writes.
pub const ALLOCATIONS_FILE: &str = "lace-allocations.yaml";

/// How Lace reads YAML: scalars get the types `serde_yaml` gave them, the types the manifests
/// are written for. Only YAML 1.2's `true` and `false` are booleans (`name: n` is a name, not
/// YAML 1.1's `false`, which is `serde_saphyr`'s default), and numbers spelled with leading
/// zeros or underscores stay strings where no type is asked for (a label `version: 010`).
pub fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
    }
}

/// Why a directory could not be loaded or allocations not written.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file or directory could not be read.
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A document is not valid YAML.
    #[error("{}: document {doc}: invalid YAML: {message}", .file.display())]
    Yaml {
        file: PathBuf,
        doc: usize,
        /// What is wrong, with the line and column in the file.
        message: String,
    },
    /// A document is not a Kubernetes object (no `apiVersion` or `kind`).
    #[error("{}: document {doc}: not a Kubernetes object: {what}", .file.display())]
    NotAnObject {
        file: PathBuf,
        doc: usize,
        what: String,
    },
    /// A known kind without `metadata.name`.
    #[error("{}: document {doc}: {kind} has no metadata.name", .file.display())]
    MissingName {
        file: PathBuf,
        doc: usize,
        kind: String,
    },
    /// A known kind whose content is malformed.
    #[error("{}: document {doc}: {kind}/{name}: {message}", .file.display())]
    Invalid {
        file: PathBuf,
        doc: usize,
        kind: String,
        name: String,
        message: String,
    },
    /// The same object twice.
    #[error("{}: document {doc}: {kind}/{name} is defined twice (first in {}, document {first_doc})", .file.display(), .first_file.display())]
    Duplicate {
        file: PathBuf,
        doc: usize,
        kind: String,
        name: String,
        first_file: PathBuf,
        first_doc: usize,
    },
    /// Writing the allocations failed.
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Serializing the allocations failed.
    #[error("cannot serialize the allocations: {0}")]
    Serialize(serde_saphyr::SerializeError),
}

/// Loads every manifest below `dir` into a [`ClusterState`].
pub fn load_dir(dir: &Path) -> Result<ClusterState, LoadError> {
    let files = manifest_files(dir)?;
    let mut loader = Loader::default();
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|source| LoadError::Read {
            path: file.clone(),
            source,
        })?;
        loader.load_file(file, &text)?;
    }
    Ok(loader.index.into_state())
}

/// The files [`load_dir`] reads: every `*.yaml` and `*.yml` below `dir`, sorted. Standalone
/// mode watches exactly these for changes.
pub fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)?;
    files.sort();
    Ok(files)
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let read_err = |source| LoadError::Read {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let path = entry.map_err(read_err)?.path();
        if path.is_dir() {
            collect_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    Ok(())
}

/// Where a document is: for error messages and duplicate detection.
#[derive(Clone, Debug)]
struct Location {
    file: PathBuf,
    /// 1-based.
    doc: usize,
}

/// `metadata.labels`, the part of `metadata` parsed with serde (name and namespace are read
/// before, to name the object in errors).
#[derive(Debug, Default, Deserialize)]
struct MetaLabels {
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
struct WithMeta {
    #[serde(default)]
    metadata: MetaLabels,
}

/// One document's text within its file.
#[derive(Clone, Copy, Debug)]
struct DocText<'a> {
    /// From the start of the document's first line, so that columns are the file's.
    text: &'a str,
    /// Lines of the file before `text`: added to the lines the parser counts in `text`.
    lines_before: u64,
}

/// Splits a file into its documents, empty ones included, where the YAML parser ends each. A
/// document ends at the start of the line of the next `---`, or after the line where an
/// explicit end is (a `...`, or the `---` of an empty document), so that every document starts
/// at the start of a line (columns stay the file's) and a `%YAML` directive, which follows a
/// `...`, stays with the document it is for. A syntax error is returned as the (1-based)
/// number of the document it is in and the message.
fn split_documents(text: &str) -> Result<Vec<DocText<'_>>, (usize, String)> {
    // Where lines start as the parser counts them: after `\n`, `\r\n` or a lone `\r`.
    let bytes = text.as_bytes();
    let breaks = bytes
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n')));
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(breaks.map(|(i, _)| i + 1))
        .collect();
    let mut docs = Vec::new();
    let mut start_line = 1;
    for event in Parser::new_from_str(text) {
        match event {
            Ok((Event::DocumentEnd, span)) => {
                let end_line = span.end.line() + usize::from(span.end.col() > 0);
                let at_line =
                    |line: usize| line_starts.get(line - 1).copied().unwrap_or(text.len());
                docs.push(DocText {
                    text: &text[at_line(start_line)..at_line(end_line)],
                    lines_before: (start_line - 1) as u64,
                });
                start_line = end_line;
            }
            Ok(_) => {}
            Err(e) => {
                let mark = e.marker();
                return Err((docs.len() + 1, at(&e.info(), mark.line(), mark.col() + 1)));
            }
        }
    }
    Ok(docs)
}

/// `message at line L column C`, as Lace words positions.
fn at(message: &str, line: impl std::fmt::Display, column: impl std::fmt::Display) -> String {
    format!("{message} at line {line} column {column}")
}

/// `path: message`, or the message alone for the document itself (`serde_path_to_error`
/// writes that path as `.`).
fn at_path(path: &str, message: &str) -> String {
    if path == "." {
        message.to_string()
    } else {
        format!("{path}: {message}")
    }
}

/// `serde_saphyr`'s wording for users, with positions worded as [`at`] words them.
struct Wording;

impl MessageFormatter for Wording {
    fn localizer(&self) -> &dyn Localizer {
        self
    }

    fn format_message<'a>(&self, err: &'a serde_saphyr::Error) -> Cow<'a, str> {
        UserMessageFormatter.format_message(err)
    }
}

impl Localizer for Wording {
    fn attach_location<'a>(&self, base: Cow<'a, str>, loc: serde_saphyr::Location) -> Cow<'a, str> {
        if loc == serde_saphyr::Location::UNKNOWN {
            base
        } else {
            Cow::Owned(at(&base, loc.line(), loc.column()))
        }
    }
}

impl DocText<'_> {
    /// `err` (from reading `text`) with its position in the file.
    fn describe(&self, err: &serde_saphyr::Error) -> String {
        err.render_with_options(serde_saphyr::render_options! {
            formatter: &Wording,
            snippets: SnippetMode::Off,
            line_offset: self.lines_before,
        })
    }

    fn value(&self) -> Result<Value, String> {
        serde_saphyr::from_str_with_options(self.text, yaml_options())
            .map_err(|e| self.describe(&e))
    }

    /// The message for a document whose value fails to deserialize as `T` at `path` with
    /// `message`: the text is read again as `T`, because only the parser knows the line and
    /// column. Where that read fails at the same field, `message` keeps serde's wording,
    /// which names the offending value (the parser's only names the type it wanted).
    fn field_error<T: DeserializeOwned>(&self, path: &str, message: &str) -> String {
        let mut text_path = None;
        let read = serde_saphyr::with_deserializer_from_str_with_options(
            self.text,
            yaml_options(),
            |de| {
                serde_path_to_error::deserialize::<_, T>(de).map_err(|e| {
                    text_path = Some(e.path().to_string());
                    e.into_inner()
                })
            },
        );
        match (read.err(), text_path) {
            (Some(err), Some(text_path)) if text_path != path => {
                at_path(&text_path, &self.describe(&err))
            }
            (Some(err), Some(_)) => match err.location() {
                Some(loc) => at_path(
                    path,
                    &at(message, loc.line() + self.lines_before, loc.column()),
                ),
                None => at_path(path, message),
            },
            // The text reads as `T` where the value does not (a plain scalar read as a string
            // where the value holds a number): no position to add.
            _ => at_path(path, message),
        }
    }
}

/// One document being loaded: its text (for precise error messages), value and identity.
struct Doc<'a> {
    source: DocText<'a>,
    value: Value,
    at: Location,
    kind: Kind,
    /// `namespace/name` or `name`, for messages.
    name: String,
}

impl Doc<'_> {
    fn invalid(&self, message: impl Into<String>) -> LoadError {
        LoadError::Invalid {
            file: self.at.file.clone(),
            doc: self.at.doc,
            kind: self.kind.to_string(),
            name: self.name.clone(),
            message: message.into(),
        }
    }

    /// Deserializes the document as `T`; on failure the message names the field and, from
    /// [`DocText::field_error`], its line and column.
    fn parse<T: DeserializeOwned>(&self) -> Result<T, LoadError> {
        serde_path_to_error::deserialize(&self.value).map_err(|err| {
            let path = err.path().to_string();
            let message = err.into_inner().to_string();
            self.invalid(self.source.field_error::<T>(&path, &message))
        })
    }
}

/// Parses a document as its kind's body and applies the object to the index.
struct ApplyDoc<'a> {
    doc: &'a Doc<'a>,
    meta: Meta,
    index: &'a mut ClusterIndex,
}

impl BodyVisitor for ApplyDoc<'_> {
    type Output = Result<(), LoadError>;
    fn visit<B: Body>(self) -> Self::Output {
        let doc = self.doc;
        let object = doc
            .parse::<B>()?
            .into_object(self.meta)
            .map_err(|e| doc.invalid(e.to_string()))?;
        match object {
            Some(object) => _ = self.index.apply(object),
            None => {
                tracing::debug!(file = %doc.at.file.display(), doc = doc.at.doc, kind = %doc.kind, name = %doc.name, "ignored");
            }
        }
        Ok(())
    }
}

/// Accumulates the state over all documents.
#[derive(Default)]
struct Loader {
    index: ClusterIndex,
    /// `Kind/namespace/name` → where it was first seen.
    seen: BTreeMap<String, Location>,
}

fn str_at<'v>(value: &'v Value, path: &[&str]) -> Option<&'v str> {
    path.iter().try_fold(value, |v, key| v.get(*key))?.as_str()
}

impl Loader {
    fn load_file(&mut self, file: &Path, text: &str) -> Result<(), LoadError> {
        let yaml_error = |doc, message| LoadError::Yaml {
            file: file.to_path_buf(),
            doc,
            message,
        };
        let documents = split_documents(text).map_err(|(doc, message)| yaml_error(doc, message))?;
        for (index, source) in documents.into_iter().enumerate() {
            let at = Location {
                file: file.to_path_buf(),
                doc: index + 1,
            };
            let value = source
                .value()
                .map_err(|message| yaml_error(at.doc, message))?;
            if value.is_null() {
                continue; // an empty document, e.g. after a trailing `---`
            }
            self.load_doc(source, value, at)?;
        }
        Ok(())
    }

    fn load_doc(
        &mut self,
        source: DocText<'_>,
        value: Value,
        at: Location,
    ) -> Result<(), LoadError> {
        let not_object = |what: &str| LoadError::NotAnObject {
            file: at.file.clone(),
            doc: at.doc,
            what: what.to_string(),
        };
        let api_version =
            str_at(&value, &["apiVersion"]).ok_or_else(|| not_object("no apiVersion"))?;
        let kind_str = str_at(&value, &["kind"]).ok_or_else(|| not_object("no kind"))?;
        let Some(kind) = Kind::of(api_version, kind_str) else {
            tracing::debug!(file = %at.file.display(), doc = at.doc, %api_version, kind = %kind_str, "ignoring unknown kind");
            return Ok(());
        };
        let Some(name) = str_at(&value, &["metadata", "name"]).map(str::to_string) else {
            return Err(LoadError::MissingName {
                file: at.file,
                doc: at.doc,
                kind: kind.to_string(),
            });
        };
        let namespace = if kind.namespaced() {
            str_at(&value, &["metadata", "namespace"])
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        let display_name = if kind.namespaced() {
            format!("{namespace}/{name}")
        } else {
            name.clone()
        };
        let doc = Doc {
            source,
            value,
            at,
            kind,
            name: display_name,
        };
        let labels = doc.parse::<WithMeta>()?.metadata.labels;
        let meta = Meta {
            name,
            namespace,
            labels,
        };
        if kind == Kind::ConfigMap && !is_lace_config(&meta) {
            return Ok(()); // only Lace's own ConfigMap matters (and may be defined once)
        }
        self.check_unique(&doc)?;
        kind.visit(ApplyDoc {
            doc: &doc,
            meta,
            index: &mut self.index,
        })
    }

    fn check_unique(&mut self, doc: &Doc<'_>) -> Result<(), LoadError> {
        let id = format!("{}/{}", doc.kind, doc.name);
        if let Some(first) = self.seen.get(&id) {
            return Err(LoadError::Duplicate {
                file: doc.at.file.clone(),
                doc: doc.at.doc,
                kind: doc.kind.to_string(),
                name: doc.name.clone(),
                first_file: first.file.clone(),
                first_doc: first.doc,
            });
        }
        self.seen.insert(id, doc.at.clone());
        Ok(())
    }
}

/// A Lace object as written to a manifest.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Manifest<'a, S> {
    api_version: &'static str,
    kind: &'static str,
    metadata: NameOnly<'a>,
    spec: &'a S,
}

#[derive(Serialize)]
struct NameOnly<'a> {
    name: &'a str,
}

fn manifest<S: Serialize>(kind: &'static str, name: &str, spec: &S) -> Result<String, LoadError> {
    let m = Manifest {
        api_version: api::API_VERSION,
        kind,
        metadata: NameOnly { name },
        spec,
    };
    serde_saphyr::to_string(&m).map_err(LoadError::Serialize)
}

/// The internal objects of `alloc` as one multi-document YAML text, sorted by kind and name.
pub fn allocations_yaml(alloc: &Allocation) -> Result<String, LoadError> {
    let mut out =
        String::from("# Written by the Lace allocator: the internal objects agents read.\n");
    let docs = alloc
        .network_allocations
        .iter()
        .map(|(name, spec): (&String, &NetworkAllocationSpec)| {
            manifest("NetworkAllocation", name, spec)
        })
        .chain(alloc.node_allocations.iter().map(
            |(name, spec): (&String, &NodeAllocationSpec)| manifest("NodeAllocation", name, spec),
        ));
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&doc?);
    }
    Ok(out)
}

/// Writes `alloc` to `dir/lace-allocations.yaml` durably ([`crate::durable::write`]), so a
/// reader never sees half a file (the temporary file is not `*.yaml`: a concurrent
/// `load_dir` never reads it). Returns the path written.
pub fn write_allocations(dir: &Path, alloc: &Allocation) -> Result<PathBuf, LoadError> {
    let text = allocations_yaml(alloc)?;
    crate::durable::write(dir, ALLOCATIONS_FILE, &mut text.as_bytes(), 0o644).map_err(|e| {
        LoadError::Write {
            path: e.path,
            source: e.source,
        }
    })
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::alloc::allocate;
    use crate::state::{ObjectKey, ServicePort};
    use crate::validate::validate_cluster;

    fn example_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cluster")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Writes `files` (relative path → content) into a fresh temporary directory.
    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        dir
    }

    /// The example cluster is valid, loads completely, and its checked-in allocation file is
    /// what the allocator produces from the rest (run with `LACE_BLESS=1` to rewrite it).
    #[test]
    fn example_cluster_loads_validates_and_its_allocations_are_up_to_date() {
        let mut state = load_dir(&example_dir()).unwrap();
        assert_eq!(validate_cluster(&state), Ok(()));
        assert_eq!(
            state.config.srv6_locator_prefix,
            Some("2001:db8:100::/48".parse().unwrap())
        );
        assert_eq!(
            state.networks.keys().collect::<Vec<_>>(),
            ["default", "internet", "system", "tenant-a"]
        );
        assert_eq!(
            (state.network_bindings.len(), state.service_bindings.len()),
            (3, 2)
        );
        assert_eq!(
            (state.network_routes.len(), state.service_routes.len()),
            (4, 2)
        );
        assert_eq!(
            (state.nodes.len(), state.namespaces.len(), state.pods.len()),
            (3, 4, 8)
        );
        assert_eq!(
            state.nodes["node-2"].underlay().ipv6,
            Some("fd00:fab::2".parse().unwrap())
        );
        assert_eq!(state.namespaces["team-a"].labels["lace.io/tenant"], "a");
        assert_eq!(
            state.namespaces["kube-system"].labels[crate::objects::NAMESPACE_NAME_LABEL],
            "kube-system"
        );
        let dns = &state.endpoints[&ObjectKey::new("kube-system", "kube-dns")];
        assert_eq!(
            dns.addresses,
            [
                "10.244.0.10",
                "10.244.1.10",
                "fd00:244::a",
                "fd00:244:0:1::a"
            ]
            .map(ip)
        );
        assert_eq!(dns.ports.len(), 2, "TCP and UDP 53, merged over two slices");

        let mut fresh = state.clone();
        fresh.network_allocations.clear();
        fresh.node_allocations.clear();
        let alloc = allocate(&fresh).unwrap();
        if std::env::var_os("LACE_BLESS").is_some() {
            write_allocations(&example_dir(), &alloc).unwrap();
            state = load_dir(&example_dir()).unwrap();
        }
        assert_eq!(
            state.network_allocations, alloc.network_allocations,
            "run with LACE_BLESS=1"
        );
        assert_eq!(
            state.node_allocations, alloc.node_allocations,
            "run with LACE_BLESS=1"
        );
        // Every pod address lies in a block of the pod's node (host-network pods: a node IP).
        for (key, pod) in &state.pods {
            for addr in &pod.ips {
                let ok = if pod.host_network {
                    state.nodes[&pod.node].internal_ips.contains(addr)
                } else {
                    let index = alloc.node_allocations[&pod.node].index;
                    state.networks.values().any(|n| {
                        crate::alloc::node_blocks(index, &n.subnets)
                            .iter()
                            .any(|b| b.contains(addr))
                    })
                };
                assert!(ok, "{key}: {addr} is not in a block of {}", pod.node);
            }
        }
    }

    #[test]
    fn written_allocations_load_back_unchanged() {
        let mut state = load_dir(&example_dir()).unwrap();
        state.network_allocations.clear();
        state.node_allocations.clear();
        let alloc = allocate(&state).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = write_allocations(dir.path(), &alloc).unwrap();
        assert_eq!(path, dir.path().join(ALLOCATIONS_FILE));
        let loaded = load_dir(dir.path()).unwrap();
        assert_eq!(loaded.network_allocations, alloc.network_allocations);
        assert_eq!(loaded.node_allocations, alloc.node_allocations);
        // Only the final file remains, and rewriting replaces it.
        write_allocations(dir.path(), &Allocation::default()).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [ALLOCATIONS_FILE]);
        assert_eq!(load_dir(dir.path()).unwrap(), ClusterState::default());
    }

    #[test]
    fn errors_name_the_file_the_document_and_the_object() {
        let network = "apiVersion: lace.io/v1alpha1\nkind: Network\n";
        let cases: Vec<(Vec<(&str, String)>, &str)> = vec![
            (
                vec![("a.yaml", "kind: [".into())],
                "DIR/a.yaml: document 1: invalid YAML: unclosed bracket '[' at line 1 column 7",
            ),
            (
                vec![("a.yaml", "---\napiVersion: v1\nmetadata: {name: x}\n".into())],
                "DIR/a.yaml: document 1: not a Kubernetes object: no kind",
            ),
            (
                vec![("a.yaml", format!("{network}metadata: {{name: x}}\nspec: {{external: true}}\n---\n{network}spec: {{}}\n"))],
                "DIR/a.yaml: document 2: Network has no metadata.name",
            ),
            (
                vec![("a.yaml", format!("{network}metadata:\n  name: n\nspec:\n  subnets:\n    - cidr: 10.0.0.0/8\n"))],
                "DIR/a.yaml: document 1: Network/n: spec.subnets[0]: missing field `blockPrefix` at line 7 column 7",
            ),
            (
                vec![("a.yaml", format!("{network}metadata:\n  name: n\nspec:\n  subnets:\n    - cidr: 10.0.0.0/88\n      blockPrefix: 8\n"))],
                "DIR/a.yaml: document 1: Network/n: spec.subnets[0].cidr: cidr \"10.0.0.0/88\" is not a CIDR: the prefix length is too long for the address at line 7 column 13",
            ),
            (
                vec![
                    ("a.yaml", format!("{network}metadata: {{name: n}}\nspec: {{external: true}}\n")),
                    ("sub/b.yml", format!("---\n---\n{network}metadata: {{name: n}}\nspec: {{external: true}}\n")),
                ],
                "DIR/sub/b.yml: document 2: Network/n is defined twice (first in DIR/a.yaml, document 1)",
            ),
            (
                vec![("a.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default}\n".into())],
                "DIR/a.yaml: document 2: Pod/default/p is defined twice (first in DIR/a.yaml, document 1)",
            ),
            (
                vec![("a.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nstatus:\n  addresses:\n    - {type: Hostname, address: n1}\n    - {type: InternalIP, address: fd00::zz}\n".into())],
                "DIR/a.yaml: document 1: Node/n1: status.addresses[1].address: invalid IP address \"fd00::zz\"",
            ),
            (
                vec![("a.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lace-config, namespace: kube-system}\ndata: {srv6LocatorPrefix: 10.0.0.0/8}\n".into())],
                "DIR/a.yaml: document 1: ConfigMap/kube-system/lace-config: data.srv6LocatorPrefix: invalid IPv6 prefix \"10.0.0.0/8\"",
            ),
            (
                vec![("a.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: x}\nspec:\n  clusterIPs: [10.96.0.300]\n".into())],
                "DIR/a.yaml: document 1: Service/x/s: spec.clusterIPs: invalid IP address \"10.96.0.300\"",
            ),
            (
                vec![("a.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: x}\nspec:\n  ports:\n    - protocol: TCP\n".into())],
                "DIR/a.yaml: document 1: Service/x/s: spec.ports[0]: missing field `port`",
            ),
        ];
        for (files, want) in cases {
            let files: Vec<(&str, &str)> = files.iter().map(|(n, c)| (*n, c.as_str())).collect();
            let dir = dir_with(&files);
            let err = load_dir(dir.path()).unwrap_err().to_string();
            assert_eq!(err.replace(&dir.path().display().to_string(), "DIR"), want);
        }
        let missing = Path::new("/nonexistent/lace");
        assert_eq!(
            load_dir(missing).unwrap_err().to_string(),
            "cannot read /nonexistent/lace: No such file or directory (os error 2)"
        );
    }

    /// Lines count from the start of the file in every document, whatever ends the documents
    /// before, and so do syntax errors; a value of the wrong type keeps serde's wording.
    #[test]
    fn positions_in_later_documents_are_the_files() {
        let network = |name: &str, subnet: &str| {
            format!("apiVersion: lace.io/v1alpha1\nkind: Network\nmetadata: {{name: {name}}}\nspec:\n  subnets:\n    - {subnet}\n")
        };
        let cases = [
            (
                format!("{}...\n%YAML 1.2\n---\n{}", network("a", "{cidr: 10.0.0.0/8, blockPrefix: 16}"), network("b", "cidr: 10.1.0.0/16")),
                "document 2: Network/b: spec.subnets[0]: missing field `blockPrefix` at line 15 column 7",
            ),
            (
                format!("---\n---\n{}", network("c", "{cidr: 10.0.0.0/8, blockPrefix: 300}")),
                "document 2: Network/c: spec.subnets[0].blockPrefix: invalid value: integer `300`, expected u8 at line 8 column 39",
            ),
            (
                "---\n# empty\n---\n\n---\nkind: [\n".to_string(),
                "document 3: invalid YAML: unclosed bracket '[' at line 6 column 7",
            ),
        ];
        // The same lines with other line breaks.
        let cases = cases.iter().flat_map(|(text, want)| {
            [
                text.clone(),
                text.replace('\n', "\r\n"),
                text.replace('\n', "\r"),
            ]
            .map(|t| (t, *want))
        });
        for (text, want) in cases {
            let dir = dir_with(&[("a.yaml", &text)]);
            let err = load_dir(dir.path()).unwrap_err().to_string();
            let file = dir.path().join("a.yaml");
            assert_eq!(err, format!("{}: {want}", file.display()), "{text:?}");
        }
    }

    /// Scalars get YAML 1.2's types, as with `serde_yaml`: `on` and `n` are strings, not
    /// YAML 1.1's booleans, and so is a number with a leading zero.
    #[test]
    fn plain_scalars_are_strings_unless_yaml_1_2_says_otherwise() {
        let dir = dir_with(&[(
            "ns.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: n, labels: {a: on, b: y, c: 010, d: 1_000}}\n",
        )]);
        let state = load_dir(dir.path()).unwrap();
        let labels = &state.namespaces["n"].labels;
        let values = ["a", "b", "c", "d"].map(|k| labels[k].as_str());
        assert_eq!(values, ["on", "y", "010", "1_000"]);
    }

    #[test]
    fn unknown_kinds_and_other_files_are_ignored() {
        let dir = dir_with(&[
            ("deploy.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: 3\n"),
            ("future.yaml", "apiVersion: lace.io/v2\nkind: Network\nmetadata: {name: x}\nspec: 3\n"),
            ("other-cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lace-config, namespace: default}\ndata: {srv6LocatorPrefix: bad}\n"),
            ("notes.txt", "kind: ["),
            ("empty.yaml", "---\n---\n"),
        ]);
        assert_eq!(load_dir(dir.path()).unwrap(), ClusterState::default());
    }

    #[test]
    fn core_kinds_are_read_as_kubernetes_means_them() {
        let dir = dir_with(&[(
            "all.yaml",
            r#"
apiVersion: v1
kind: Pod
metadata: {name: p, labels: {app: x}}
spec: {nodeName: n1}
status: {podIP: 10.0.0.5}
---
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns}
spec: {clusterIP: None, ports: [{port: 53, protocol: UDP}, {port: 80, nodePort: 30080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
endpoints:
  - addresses: [10.0.0.2]
    conditions: {ready: false}
  - addresses: [10.0.0.1]
  - addresses: [10.0.0.3]
    conditions: {ready: true}
ports: [{port: 8080}, {name: all-ports}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-2, namespace: ns, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.1]}, {addresses: [10.0.0.0]}]
ports: [{port: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-fqdn, namespace: ns, labels: {kubernetes.io/service-name: s}}
addressType: FQDN
endpoints: [{addresses: [example.com]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: unowned, namespace: ns}
addressType: IPv4
endpoints: [{addresses: [10.9.9.9]}]
"#,
        )]);
        let s = load_dir(dir.path()).unwrap();
        let pod = &s.pods[&ObjectKey::new("default", "p")];
        assert_eq!(
            (pod.node.as_str(), pod.ips.as_slice(), pod.host_network),
            ("n1", &[ip("10.0.0.5")][..], false)
        );
        let svc = &s.services[&ObjectKey::new("ns", "s")];
        assert!(svc.cluster_ips.is_empty(), "headless");
        assert_eq!(
            svc.ports,
            [
                ServicePort {
                    protocol: "UDP".into(),
                    port: 53,
                    node_port: None,
                },
                ServicePort {
                    protocol: "TCP".into(),
                    port: 80,
                    node_port: Some(30080),
                }
            ]
        );
        assert_eq!(s.endpoints.len(), 1);
        let ep = &s.endpoints[&ObjectKey::new("ns", "s")];
        assert_eq!(
            ep.addresses,
            ["10.0.0.0", "10.0.0.1", "10.0.0.3"].map(ip),
            "ready (or unset) only, merged"
        );
        assert_eq!(
            ep.ports,
            [ServicePort {
                protocol: "TCP".into(),
                port: 8080,
                node_port: None,
            }]
        );
    }
}
