//! `ratekeeper inject`'s input and output: a stream of Kubernetes YAML documents, each
//! workload's pod template found by its kind, the sidecar added to (or removed from) it, and
//! the peers' headless Service written after each workload in cluster mode. Other kinds
//! (Services, ConfigMaps, custom resources) are copied unchanged, or refused when strict.
//!
//! Invariants:
//! - All or nothing: the whole output is built in memory; any error (naming the document by
//!   its index, kind and name) means no output at all.
//! - Documents come out in input order, each with its keys in input order; only what the
//!   sidecar needs is added. Comments and YAML styles are not kept.
//! - A Service this module wrote carries the label [`GENERATED`]: a second `inject` keeps it
//!   (and writes no other), `--uninject` drops it.

use std::collections::BTreeMap;

use super::node::{Map, Node};
use super::settings::{PEER_PORT, SettingsArgs};
use super::sidecar::{self, Outcome};

/// The label on Services `inject` writes (`app.kubernetes.io/managed-by`).
pub const GENERATED: (&str, &str) = ("app.kubernetes.io/managed-by", "ratekeeper-inject");

/// Input larger than this is refused.
pub const MAX_INPUT_BYTES: u64 = 16 << 20;

/// Add or remove.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Inject,
    Uninject,
}

/// How to treat the stream.
#[derive(Clone, Debug)]
pub struct Options {
    pub mode: Mode,
    /// Refuse kinds without a pod template (else they are copied unchanged).
    pub strict: bool,
    pub settings: SettingsArgs,
}

/// The rewritten stream, and one line per document saying what was done.
#[derive(Debug)]
pub struct Rewritten {
    pub yaml: String,
    pub report: Vec<String>,
}

/// Why a stream was not rewritten; every error names the document (its index from 1, and
/// its kind and name when it has them) or the line its YAML broke on.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("document {document} (from line {line}): invalid YAML: {problem}")]
    Yaml {
        document: usize,
        line: usize,
        problem: String,
    },
    #[error("{place}: {problem}")]
    Document { place: String, problem: String },
    #[error("cannot write the output: {0}")]
    Write(String),
}

/// The error about document `place`.
fn problem(place: &str, problem: impl Into<String>) -> InjectError {
    InjectError::Document {
        place: place.to_owned(),
        problem: problem.into(),
    }
}

/// Where the pod template of each workload kind lives.
fn template_path(kind: &str) -> Option<&'static [&'static str]> {
    match kind {
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => Some(&["spec", "template"]),
        "CronJob" => Some(&["spec", "jobTemplate", "spec", "template"]),
        "Pod" => Some(&[]),
        _ => None,
    }
}

/// Rewrites a YAML stream; an error names the document and what is wrong.
pub fn rewrite(text: &str, options: &Options) -> Result<Rewritten, InjectError> {
    let mut run = Run {
        options,
        out: Vec::new(),
        report: Vec::new(),
        services: BTreeMap::new(),
    };
    let documents = split(text);
    // Services already in the input (a Service `inject` wrote, or the user's): not written again.
    let mut parsed = Vec::new();
    for (index, (line, chunk)) in documents.iter().enumerate() {
        if !has_content(chunk) {
            continue;
        }
        let number = index + 1;
        let node: Node = serde_saphyr::from_str(chunk).map_err(|error| InjectError::Yaml {
            document: number,
            line: *line,
            problem: error.to_string(),
        })?;
        if node == Node::Null {
            continue;
        }
        parsed.push((number, node));
    }
    for (_, node) in &parsed {
        collect_services(node, &mut run.services);
    }
    for (number, node) in parsed {
        let name = format!("document {number}");
        run.document(&name, node, None)?;
    }
    let mut yaml = String::new();
    for (index, document) in run.out.iter().enumerate() {
        if index > 0 {
            yaml.push_str("---\n");
        }
        let text = serde_saphyr::to_string(document)
            .map_err(|error| InjectError::Write(error.to_string()))?;
        yaml.push_str(&text);
        if !yaml.ends_with('\n') {
            yaml.push('\n');
        }
    }
    Ok(Rewritten {
        yaml,
        report: run.report,
    })
}

struct Run<'a> {
    options: &'a Options,
    out: Vec<Node>,
    report: Vec<String>,
    /// Peers Services by (namespace, name): their selector, and who asked for it.
    services: BTreeMap<(String, String), (Node, String)>,
}

/// Every Service's (namespace, name) in `node` (a document or a List's items).
fn collect_services(node: &Node, services: &mut BTreeMap<(String, String), (Node, String)>) {
    match node.str_at(&["kind"]) {
        Some("Service") => {
            let key = (
                node.str_at(&["metadata", "namespace"])
                    .unwrap_or_default()
                    .to_owned(),
                node.str_at(&["metadata", "name"])
                    .unwrap_or_default()
                    .to_owned(),
            );
            let selector = node
                .at(&["spec", "selector"])
                .cloned()
                .unwrap_or(Node::Null);
            services.insert(key, (selector, "the input".to_owned()));
        }
        Some("List") => {
            for item in node
                .get("items")
                .and_then(Node::as_seq)
                .into_iter()
                .flatten()
            {
                collect_services(item, services);
            }
        }
        _ => {}
    }
}

impl Run<'_> {
    /// Handles one document (or List item: then `into` is the List's new items).
    fn document(
        &mut self,
        place: &str,
        mut node: Node,
        into: Option<&mut Vec<Node>>,
    ) -> Result<(), InjectError> {
        let (kind, place) = identify(place, &node)?;
        if kind == "List" {
            if into.is_some() {
                return Err(problem(&place, "a List inside a List"));
            }
            return self.list(&place, node);
        }
        let extra = if kind == "Service" && is_generated(&node) {
            if self.options.mode == Mode::Uninject {
                self.report
                    .push(format!("{place}: removed (written by inject)"));
                return Ok(());
            }
            self.report
                .push(format!("{place}: kept (written by inject)"));
            None
        } else if let Some(path) = template_path(&kind) {
            self.workload(&place, &mut node, path)?
        } else if !self.options.strict {
            self.report
                .push(format!("{place}: skipped (no pod template), unchanged"));
            None
        } else {
            return Err(problem(
                &place,
                format!(
                    "kind {kind} has no pod template (expected Deployment, StatefulSet, \
                 DaemonSet, ReplicaSet, ReplicationController, Job, CronJob, Pod or List; \
                 without --strict other kinds are copied unchanged)"
                ),
            ));
        };
        let out = match into {
            Some(items) => items,
            None => &mut self.out,
        };
        out.push(node);
        out.extend(extra);
        Ok(())
    }

    /// Handles a List: each item in turn, the List written with the rewritten items.
    fn list(&mut self, place: &str, mut node: Node) -> Result<(), InjectError> {
        let Some(items) = node.get_mut("items").and_then(Node::as_seq_mut) else {
            return Err(problem(place, "items: expected a list"));
        };
        let items = std::mem::take(items);
        let mut rewritten = Vec::new();
        for (index, item) in items.into_iter().enumerate() {
            self.document(
                &format!("{place} > item {index}"),
                item,
                Some(&mut rewritten),
            )?;
        }
        if let Some(slot) = node.get_mut("items") {
            *slot = Node::Seq(rewritten);
        }
        self.out.push(node);
        Ok(())
    }

    /// Adds the sidecar to (or removes it from) the pod template at `path` of workload
    /// `node`; the peers Service to write after it, if injection asks for one.
    fn workload(
        &mut self,
        place: &str,
        node: &mut Node,
        path: &[&str],
    ) -> Result<Option<Node>, InjectError> {
        if !path.is_empty() {
            misplaced_annotation(place, node, path)?;
        }
        let namespace = node.str_at(&["metadata", "namespace"]).map(str::to_owned);
        let Some(template) = node.at_mut(path) else {
            return Err(problem(place, format!("{}: missing", path.join("."))));
        };
        let at = |what: String| template_problem(place, path, what);
        match self.options.mode {
            Mode::Inject => {
                let (outcome, settings) =
                    sidecar::inject(template, &self.options.settings).map_err(at)?;
                self.report.push(format!(
                    "{place}: {}",
                    match outcome {
                        Outcome::Injected => "injected",
                        Outcome::AlreadyInjected => "already has the sidecar, unchanged",
                        Outcome::OptedOut =>
                            "opted out (ratekeeper.io/inject: disabled), unchanged",
                    }
                ));
                if outcome == Outcome::Injected && settings.cluster {
                    let labels = template.at(&["metadata", "labels"]).cloned();
                    return self.peers_service(place, namespace, &settings.peers_service, labels);
                }
            }
            Mode::Uninject => {
                let removed = sidecar::uninject(template).map_err(at)?;
                self.report.push(format!(
                    "{place}: {}",
                    if removed {
                        "sidecar removed"
                    } else {
                        "no injected sidecar, unchanged"
                    }
                ));
            }
        }
        Ok(None)
    }

    /// The headless Service the injected pods find each other through, unless the input has
    /// it (or an earlier workload asked for the same one).
    fn peers_service(
        &mut self,
        place: &str,
        namespace: Option<String>,
        name: &str,
        labels: Option<Node>,
    ) -> Result<Option<Node>, InjectError> {
        let key = (namespace.clone().unwrap_or_default(), name.to_owned());
        let selector = match labels {
            Some(Node::Map(labels)) if !labels.is_empty() => Node::Map(labels),
            _ => {
                return Err(problem(
                    place,
                    format!(
                        "cluster mode needs labels on the pod template (the peers Service {name} selects the pods by them)"
                    ),
                ));
            }
        };
        if let Some((existing, owner)) = self.services.get(&key) {
            if owner != "the input" && *existing != selector {
                return Err(problem(
                    place,
                    format!(
                        "the peers Service {name} is {owner}'s, which selects other pods; \
                     set ratekeeper.io/peers-service on one of them"
                    ),
                ));
            }
            return Ok(None);
        }
        self.services
            .insert(key, (selector.clone(), place.to_owned()));
        let mut metadata = Map::new();
        metadata.insert("name", Node::str(name));
        if let Some(namespace) = namespace {
            metadata.insert("namespace", Node::String(namespace));
        }
        metadata.insert("labels", Node::map([(GENERATED.0, Node::str(GENERATED.1))]));
        self.report
            .push(format!("{place}: wrote the peers Service {name}"));
        Ok(Some(Node::map([
            ("apiVersion", Node::str("v1")),
            ("kind", Node::str("Service")),
            ("metadata", Node::Map(metadata)),
            (
                "spec",
                Node::map([
                    ("clusterIP", Node::str("None")),
                    ("publishNotReadyAddresses", Node::Bool(true)),
                    ("selector", selector),
                    (
                        "ports",
                        Node::Seq(vec![Node::map([
                            ("name", Node::str("peer")),
                            ("port", Node::Int(i64::from(PEER_PORT))),
                            ("targetPort", Node::str("rk-peer")),
                            ("protocol", Node::str("TCP")),
                            ("appProtocol", Node::str("tls")),
                        ])]),
                    ),
                ]),
            ),
        ])))
    }
}

/// The kind of Kubernetes object `node` is, and `place` with its kind and name; an error
/// when it is not one (not a map, or no apiVersion and kind).
fn identify(place: &str, node: &Node) -> Result<(String, String), InjectError> {
    let Some(map) = node.as_map() else {
        return Err(problem(
            place,
            format!(
                "not a Kubernetes object: expected a map, found {}",
                node.kind()
            ),
        ));
    };
    let (Some(kind), Some(_)) = (
        map.get("kind").and_then(Node::as_str).map(str::to_owned),
        map.get("apiVersion").and_then(Node::as_str),
    ) else {
        return Err(problem(
            place,
            "not a Kubernetes object: no apiVersion and kind",
        ));
    };
    let place = match node.str_at(&["metadata", "name"]) {
        Some(name) => format!("{place} ({kind} {name})"),
        None => format!("{place} ({kind})"),
    };
    Ok((kind, place))
}

/// The error about the pod template at `path` of document `place`, naming the field from the
/// document's root: `spec.template` + `spec.containers: missing` ->
/// `spec.template.spec.containers: missing`.
fn template_problem(place: &str, path: &[&str], what: String) -> InjectError {
    let field = what.starts_with("spec") || what.starts_with("metadata");
    let what = match (path.is_empty(), field) {
        (true, _) => what,
        (false, true) => format!("{}.{what}", path.join(".")),
        (false, false) => format!("{}: {what}", path.join(".")),
    };
    problem(place, what)
}

/// A `ratekeeper.io/` annotation on a workload's own metadata, where nothing reads it (the
/// settings are read from the pod template, as the webhook sees pods): an error naming
/// where it belongs, so a setting never silently does nothing.
fn misplaced_annotation(place: &str, node: &Node, path: &[&str]) -> Result<(), InjectError> {
    let annotations = node.at(&["metadata", "annotations"]).and_then(Node::as_map);
    let Some((name, _)) = annotations
        .into_iter()
        .flat_map(|map| map.iter())
        .find(|(name, _)| name.starts_with("ratekeeper.io/"))
    else {
        return Ok(());
    };
    Err(problem(
        place,
        format!(
            "metadata.annotations.{name}: ratekeeper reads its annotations from the pod template; move it to {}.metadata.annotations",
            path.join(".")
        ),
    ))
}

fn is_generated(node: &Node) -> bool {
    node.str_at(&["metadata", "labels", GENERATED.0]) == Some(GENERATED.1)
}

/// The documents of a stream, each with the line it starts on: split at `---` lines (a
/// marker's rest of line belongs to the document it starts); `...` ends a document.
fn split(text: &str) -> Vec<(usize, String)> {
    let mut documents = vec![(1, String::new())];
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let marker = line
            .strip_prefix("---")
            .filter(|rest| rest.is_empty() || rest.starts_with([' ', '\t']));
        if let Some(rest) = marker {
            documents.push((number, format!("{rest}\n")));
        } else if line.trim_end() == "..." {
            documents.push((number + 1, String::new()));
        } else if let Some((_, document)) = documents.last_mut() {
            document.push_str(line);
            document.push('\n');
        }
    }
    documents
}

/// Whether a document holds more than blank lines, comments and directives.
fn has_content(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim();
        !line.is_empty() && !line.starts_with('#') && !line.starts_with('%')
    })
}

#[cfg(test)]
mod tests {
    use super::{Mode, Options, rewrite};
    use crate::settings::SettingsArgs;

    fn options(mode: Mode) -> Options {
        Options {
            mode,
            strict: true,
            settings: SettingsArgs::default(),
        }
    }

    #[test]
    fn an_annotation_on_the_workload_instead_of_its_pod_template_is_an_error() {
        let yaml = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  annotations: {ratekeeper.io/cluster: \"true\"}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: app, image: nginx}]
";
        let Err(error) = rewrite(yaml, &options(Mode::Inject)) else {
            panic!("a misplaced annotation was accepted");
        };
        let error = error.to_string();
        assert!(
            error.contains(
                "document 1 (Deployment web): metadata.annotations.ratekeeper.io/cluster"
            ) && error.contains("move it to spec.template.metadata.annotations"),
            "{error}"
        );
    }

    #[test]
    fn errors_name_the_document_and_nothing_is_written() {
        let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n    spec:\n      containers: [{name: app, image: app}]\n";
        for (text, expected) in [
            (format!("{deployment}---\n- a list\n"), "document 2: not a Kubernetes object"),
            (format!("{deployment}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\n"), "document 2 (ConfigMap c): kind ConfigMap has no pod template"),
            (format!("# only a comment\n---\n{deployment}---\nkey: [unclosed\n"), "document 3 (from line 10): invalid YAML"),
            ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {}\n".to_owned(), "document 1 (Deployment web): spec.template: missing"),
            ("apiVersion: v1\nkind: List\nitems:\n- apiVersion: batch/v1\n  kind: Job\n  metadata: {name: j}\n  spec: {template: {spec: {}}}\n".to_owned(), "document 1 (List) > item 0 (Job j): spec.template.spec.containers: missing"),
        ] {
            let error = rewrite(&text, &options(Mode::Inject))
                .expect_err(&text)
                .to_string();
            assert!(error.contains(expected), "{error}\nexpected: {expected}");
        }
    }
}
