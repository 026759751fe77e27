//! The sidecar itself, on one pod (a workload's pod template, or a Pod): the container,
//! volumes and annotations injection adds, as deploy/kubernetes/deployment.yaml writes them
//! by hand, and their removal. The container is a native sidecar (in `initContainers`, with
//! `restartPolicy: Always` and a startup probe) unless the settings ask for a plain one (in
//! `containers`, with a `preStop` pause).
//!
//! Invariants:
//! - A pod is changed only after every check passed (decide all, then change all).
//! - Additions go at the end of the lists and maps they join (a missing `metadata` goes
//!   first in the template), but for the native sidecar, which goes before Istio's own
//!   native sidecar when the pod has one (`native_index`). The `ratekeeper.io/status`
//!   annotation records every addition, with the earlier value of each annotation it
//!   changed: [`uninject`] removes exactly those, so the pod is as it was, field order
//!   included.
//! - A pod that has the status annotation, or a container named `ratekeeper` (the
//!   hand-written sidecar), is left alone: injecting twice changes nothing.

use serde::{Deserialize, Serialize};

use super::node::{Map, Node};
use super::settings::{
    ADMIN_PORT, GRPC_PORT, INJECT, Istio, PEER_PORT, STATUS, Settings, SettingsArgs,
};

pub const CONTAINER: &str = "ratekeeper";
pub const LIMITS_VOLUME: &str = "ratekeeper-limits";
pub const PEER_TLS_VOLUME: &str = "ratekeeper-peer-tls";
pub const ADMIN_TOKEN_VOLUME: &str = "ratekeeper-admin-token";
const LIMITS_DIR: &str = "/etc/ratekeeper/limits";
const PEER_TLS_DIR: &str = "/etc/ratekeeper/peer-tls";
const ADMIN_TOKEN_DIR: &str = "/etc/ratekeeper/admin";
/// The image's user (Dockerfile `USER 65532:65532`).
const IMAGE_USER: i64 = 65532;
/// Istio's annotations for ports its sidecar must not capture.
pub const ISTIO_EXCLUDE_INBOUND: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
pub const ISTIO_EXCLUDE_OUTBOUND: &str = "traffic.sidecar.istio.io/excludeOutboundPorts";
/// Istio's sidecar container (a native sidecar too when Istio injects it as one).
const ISTIO_PROXY: &str = "istio-proxy";

/// What became of one pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Injected,
    /// It carries the sidecar already (injected, or written by hand).
    AlreadyInjected,
    /// `ratekeeper.io/inject: disabled`.
    OptedOut,
}

/// The `ratekeeper.io/status` annotation: what injection added. The status of earlier
/// versions (a plain container only: no `initContainers`) reads the same.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Status {
    /// Added to `spec.containers` (the plain sidecar).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    containers: Vec<String>,
    /// Added to `spec.initContainers` (the native sidecar).
    #[serde(
        default,
        rename = "initContainers",
        skip_serializing_if = "Vec::is_empty"
    )]
    init_containers: Vec<String>,
    volumes: Vec<String>,
    /// Fields that did not exist (`metadata`, `annotations`, `initContainers`, `volumes`),
    /// or were null (`annotations=null`), before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    created: Vec<String>,
    /// Annotations changed: their earlier value (`None`: there was none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    annotations: Vec<(String, Option<String>)>,
}

/// The pod's annotations (`metadata.annotations`), if any.
pub fn annotations(pod: &Node) -> Option<&Map> {
    pod.at(&["metadata", "annotations"])?.as_map()
}

/// Whether the pod carries the sidecar already.
pub fn is_injected(pod: &Node) -> bool {
    if annotations(pod).is_some_and(|annotations| annotations.contains_key(STATUS)) {
        return true;
    }
    has_container(pod, CONTAINER)
}

/// Whether a container or init container of the pod is named `name`.
fn has_container(pod: &Node, name: &str) -> bool {
    ["containers", "initContainers"].iter().any(|list| {
        pod.at(&["spec", list])
            .and_then(Node::as_seq)
            .is_some_and(|containers| {
                containers
                    .iter()
                    .any(|container| container.str_at(&["name"]) == Some(name))
            })
    })
}

/// Whether the pod opted out (`ratekeeper.io/inject: disabled`).
pub fn opted_out(pod: &Node) -> bool {
    annotations(pod)
        .and_then(|annotations| annotations.get(INJECT))
        .and_then(Node::as_str)
        == Some("disabled")
}

/// Adds the sidecar to `pod` (a map with `metadata` and `spec`). An error says what is wrong
/// with the pod (the caller names the document); the pod is then unchanged.
pub fn inject(pod: &mut Node, flags: &SettingsArgs) -> Result<(Outcome, Settings), String> {
    let settings = flags.for_pod(annotations(pod))?;
    if opted_out(pod) {
        return Ok((Outcome::OptedOut, settings));
    }
    if is_injected(pod) {
        return Ok((Outcome::AlreadyInjected, settings));
    }
    check(pod, &settings)?;
    let istio = match settings.istio {
        Istio::On => true,
        Istio::Off => false,
        Istio::Auto => wants_istio(pod),
    };
    let Some(map) = pod.as_map_mut() else {
        return Err(format!("expected a map, found {}", pod.kind()));
    };
    let mut status = Status::default();
    // The spec: checked above to be a map with a list of containers.
    if let Some(Node::Map(spec)) = map.get_mut("spec") {
        add_to_spec(spec, &settings, &mut status);
    }
    let annotations = annotations_to_change(map, &mut status)?;
    if istio && settings.cluster {
        keep_peer_port_from_istio(annotations, &mut status);
    }
    // Serializing plain strings and lists cannot fail.
    let status = serde_json::to_string(&status).unwrap_or_default();
    annotations.insert(STATUS, Node::String(status));
    Ok((Outcome::Injected, settings))
}

/// Adds the container and its volumes to the pod's `spec`, noting them in `status`.
fn add_to_spec(spec: &mut Map, settings: &Settings, status: &mut Status) {
    let container = vec![container(settings)];
    if settings.native_sidecar {
        let index = spec
            .get("initContainers")
            .and_then(Node::as_seq)
            .and_then(|init| native_index(init));
        add_to_list(spec, "initContainers", container, index, status);
        status.init_containers.push(CONTAINER.to_owned());
    } else {
        add_to_list(spec, "containers", container, None, status);
        status.containers.push(CONTAINER.to_owned());
    }
    let volumes = volumes(settings);
    status.volumes = volumes
        .iter()
        .filter_map(|volume| volume.str_at(&["name"]).map(str::to_owned))
        .collect();
    add_to_list(spec, "volumes", volumes, None, status);
}

/// Where the native sidecar goes in `initContainers`: before Istio's native sidecar, as
/// its Envoy asks ratekeeper (native sidecars start in order and stop in reverse order, so
/// ratekeeper serves before it starts and until it has stopped); `None`: last, after the
/// init containers that run to completion.
fn native_index(init_containers: &[Node]) -> Option<usize> {
    init_containers.iter().position(|container| {
        container.str_at(&["name"]) == Some(ISTIO_PROXY)
            && container.str_at(&["restartPolicy"]) == Some("Always")
    })
}

/// Inserts `items` into the list `key` of `spec` at `index` (`None`: at the end), creating
/// the list where it is missing or null (checked: nothing else), as `status` notes.
fn add_to_list(
    spec: &mut Map,
    key: &str,
    items: Vec<Node>,
    index: Option<usize>,
    status: &mut Status,
) {
    match spec.get_mut(key) {
        Some(Node::Seq(existing)) => {
            let at = index.unwrap_or(existing.len()).min(existing.len());
            existing.splice(at..at, items);
        }
        Some(slot) => {
            // null: `volumes:` (or `initContainers:`) with nothing under it.
            *slot = Node::Seq(items);
            status.created.push(format!("{key}=null"));
        }
        None => {
            spec.insert(key, Node::Seq(items));
            status.created.push(key.to_owned());
        }
    }
}

/// The pod's annotations (`pod` is its map), creating `metadata` and `annotations` where
/// they are missing or null, as `status` notes.
fn annotations_to_change<'a>(pod: &'a mut Map, status: &mut Status) -> Result<&'a mut Map, String> {
    if !pod.contains_key("metadata") {
        pod.insert_first("metadata", Node::Map(Map::new()));
        status.created.push("metadata".to_owned());
    }
    let Some(Node::Map(metadata)) = pod.get_mut("metadata") else {
        return Err("metadata: expected a map".to_owned());
    };
    match metadata.get_mut("annotations") {
        Some(Node::Map(_)) => {}
        Some(slot) => {
            *slot = Node::Map(Map::new());
            status.created.push("annotations=null".to_owned());
        }
        None => {
            metadata.insert("annotations", Node::Map(Map::new()));
            status.created.push("annotations".to_owned());
        }
    }
    let Some(Node::Map(annotations)) = metadata.get_mut("annotations") else {
        return Err("metadata.annotations: expected a map".to_owned());
    };
    Ok(annotations)
}

/// Adds the peer port to Istio's exclusion annotations (noting their earlier values in
/// `status`): ratekeeper's own mutual TLS protects the peer port; Istio's sidecar would take
/// those TLS bytes for plaintext gRPC.
fn keep_peer_port_from_istio(annotations: &mut Map, status: &mut Status) {
    for name in [ISTIO_EXCLUDE_INBOUND, ISTIO_EXCLUDE_OUTBOUND] {
        let before = annotations
            .get(name)
            .and_then(Node::as_str)
            .map(str::to_owned);
        let ports = before.as_deref().unwrap_or("");
        let listed = ports
            .split(',')
            .any(|port| port.trim() == PEER_PORT.to_string());
        if listed {
            continue;
        }
        let after = if ports.trim().is_empty() {
            PEER_PORT.to_string()
        } else {
            format!("{ports},{PEER_PORT}")
        };
        annotations.insert(name, Node::String(after));
        status.annotations.push((name.to_owned(), before));
    }
}

/// Removes what [`inject`] added (nothing when the pod has no status annotation): `Ok(true)`
/// when something was removed.
pub fn uninject(pod: &mut Node) -> Result<bool, String> {
    let Some(text) = annotations(pod)
        .and_then(|annotations| annotations.get(STATUS))
        .map(|status| status.as_str().map(str::to_owned))
    else {
        return Ok(false);
    };
    let status: Status = text
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok())
        .ok_or_else(|| format!("annotation {STATUS}: not what injection writes"))?;
    let Some(map) = pod.as_map_mut() else {
        return Ok(false);
    };
    if let Some(Node::Map(spec)) = map.get_mut("spec") {
        remove_named(spec, "containers", &status.containers, &status.created);
        remove_named(
            spec,
            "initContainers",
            &status.init_containers,
            &status.created,
        );
        remove_named(spec, "volumes", &status.volumes, &status.created);
    }
    if let Some(Node::Map(metadata)) = map.get_mut("metadata") {
        if let Some(Node::Map(annotations)) = metadata.get_mut("annotations") {
            annotations.remove(STATUS);
            for (name, before) in &status.annotations {
                match before {
                    Some(value) => annotations.insert(name, Node::str(value)),
                    None => {
                        annotations.remove(name);
                    }
                }
            }
            let empty = annotations.is_empty();
            restore_created(metadata, "annotations", &status.created, empty);
        }
        let empty = metadata.is_empty();
        if empty && status.created.iter().any(|created| created == "metadata") {
            map.remove("metadata");
        }
    }
    Ok(true)
}

/// Removes the items named one of `names` from the list `key` of `map`, then the list itself
/// if injection created it (`created`) and it is empty again.
fn remove_named(map: &mut Map, key: &str, names: &[String], created: &[String]) {
    let Some(Node::Seq(items)) = map.get_mut(key) else {
        return;
    };
    items.retain(|item| {
        !item
            .str_at(&["name"])
            .is_some_and(|name| names.iter().any(|added| added == name))
    });
    let empty = items.is_empty();
    restore_created(map, key, created, empty);
}

/// Takes `key` of `map` back to what it was before injection created it (absent or null),
/// when it is empty again.
fn restore_created(map: &mut Map, key: &str, created: &[String], empty: bool) {
    if !empty {
        return;
    }
    if created.iter().any(|c| c == key) {
        map.remove(key);
    } else if created.iter().any(|c| *c == format!("{key}=null")) {
        map.insert(key, Node::Null);
    }
}

/// The pod runs Istio's sidecar, or asks for it.
fn wants_istio(pod: &Node) -> bool {
    let marked = ["annotations", "labels"]
        .iter()
        .any(|field| pod.str_at(&["metadata", field, "sidecar.istio.io/inject"]) == Some("true"));
    marked || has_container(pod, ISTIO_PROXY)
}

/// Everything that would make the injected pod invalid or broken: refused before any change.
fn check(pod: &Node, settings: &Settings) -> Result<(), String> {
    let spec = check_spec(pod)?;
    check_metadata(pod)?;
    if spec.get("hostNetwork") == Some(&Node::Bool(true)) {
        return Err(
            "spec.hostNetwork: the sidecar's ports would be the node's; not injected".to_owned(),
        );
    }
    check_volumes(spec)?;
    optional_list(spec, "initContainers")?;
    check_ports(spec, settings)
}

/// The pod's `spec`, a map with a list of containers.
fn check_spec(pod: &Node) -> Result<&Node, String> {
    let Some(spec) = pod.get("spec") else {
        return Err("spec: missing".to_owned());
    };
    if spec.as_map().is_none() {
        return Err(format!("spec: expected a map, found {}", spec.kind()));
    }
    match spec.get("containers") {
        Some(Node::Seq(_)) => Ok(spec),
        Some(other) => Err(format!(
            "spec.containers: expected a list, found {}",
            other.kind()
        )),
        None => Err("spec.containers: missing".to_owned()),
    }
}

/// `metadata` (if any) is a map, and its annotations (if any) a map of strings.
fn check_metadata(pod: &Node) -> Result<(), String> {
    if let Some(metadata) = pod.get("metadata")
        && metadata.as_map().is_none()
    {
        return Err(format!(
            "metadata: expected a map, found {}",
            metadata.kind()
        ));
    }
    if let Some(annotations) = pod.at(&["metadata", "annotations"])
        && !matches!(annotations, Node::Map(_) | Node::Null)
    {
        return Err(format!(
            "metadata.annotations: expected a map, found {}",
            annotations.kind()
        ));
    }
    // Kubernetes annotations are strings (a changed one is given back as a string).
    for (name, value) in annotations(pod).into_iter().flat_map(Map::iter) {
        if value.as_str().is_none() {
            return Err(format!(
                "metadata.annotations.{name}: expected a string, found {}",
                value.kind()
            ));
        }
    }
    Ok(())
}

/// The items of list `key` of `spec`: none when it is absent or null, an error when it is
/// not a list.
fn optional_list<'a>(spec: &'a Node, key: &str) -> Result<&'a [Node], String> {
    match spec.get(key) {
        None | Some(Node::Null) => Ok(&[]),
        Some(Node::Seq(items)) => Ok(items),
        Some(other) => Err(format!(
            "spec.{key}: expected a list, found {}",
            other.kind()
        )),
    }
}

/// `spec.volumes` (if any) is a list, with no volume named like one of the sidecar's.
fn check_volumes(spec: &Node) -> Result<(), String> {
    let volumes = optional_list(spec, "volumes")?;
    let ours = [LIMITS_VOLUME, PEER_TLS_VOLUME, ADMIN_TOKEN_VOLUME];
    for volume in volumes {
        if let Some(name) = volume.str_at(&["name"])
            && ours.contains(&name)
        {
            return Err(format!("spec.volumes: a volume is already named {name:?}"));
        }
    }
    Ok(())
}

/// No container of the pod declares a port number or name the sidecar uses.
fn check_ports(spec: &Node, settings: &Settings) -> Result<(), String> {
    let our_ports = settings.ports();
    let our_names = ["rk-http", "rk-peer", "rk-admin"];
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec.get(list).and_then(Node::as_seq) else {
            continue;
        };
        for (index, container) in containers.iter().enumerate() {
            let container_name = container.str_at(&["name"]).unwrap_or("?");
            let ports = container.get("ports").and_then(Node::as_seq);
            for port in ports.into_iter().flatten() {
                let number = match port.get("containerPort") {
                    Some(Node::Int(number)) => u16::try_from(*number).ok(),
                    _ => None,
                };
                if let Some(number) = number
                    && our_ports.contains(&number)
                {
                    return Err(format!(
                        "spec.{list}[{index}] ({container_name}): port {number} is one the sidecar listens on \
                         (set {} for the http port)",
                        super::settings::HTTP_PORT
                    ));
                }
                if let Some(name) = port.str_at(&["name"])
                    && our_names.contains(&name)
                {
                    return Err(format!(
                        "spec.{list}[{index}] ({container_name}): port name {name:?} is the sidecar's"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn string_list(items: &[String]) -> Node {
    Node::Seq(items.iter().map(|item| Node::str(item)).collect())
}

fn port(name: &str, number: u16) -> Node {
    Node::map([
        ("name", Node::str(name)),
        ("containerPort", Node::Int(i64::from(number))),
        ("protocol", Node::str("TCP")),
    ])
}

fn mount(name: &str, path: &str) -> Node {
    Node::map([
        ("name", Node::str(name)),
        ("mountPath", Node::str(path)),
        ("readOnly", Node::Bool(true)),
    ])
}

fn probe(period: i64, failures: Option<i64>) -> Node {
    let mut probe = Node::map([
        (
            "httpGet",
            Node::map([
                ("path", Node::str("/healthcheck")),
                ("port", Node::str("rk-http")),
            ]),
        ),
        ("periodSeconds", Node::Int(period)),
    ]);
    if let (Some(failures), Some(map)) = (failures, probe.as_map_mut()) {
        map.insert("failureThreshold", Node::Int(failures));
    }
    probe
}

/// The command line of the sidecar (deploy/kubernetes/deployment.yaml's, with these settings).
pub fn args(settings: &Settings) -> Vec<String> {
    let mut args = vec![
        "serve".to_owned(),
        format!("--config={LIMITS_DIR}"),
        format!("--grpc-addr=127.0.0.1:{GRPC_PORT}"),
        format!("--http-addr=0.0.0.0:{}", settings.http_port),
    ];
    match &settings.admin_token_secret {
        Some(_) => {
            args.push(format!("--admin-addr=0.0.0.0:{ADMIN_PORT}"));
            args.push(format!("--admin-token-file={ADMIN_TOKEN_DIR}/token"));
        }
        None => args.push(format!("--admin-addr=127.0.0.1:{ADMIN_PORT}")),
    }
    if settings.cluster {
        args.extend([
            format!("--peer-addr=0.0.0.0:{PEER_PORT}"),
            format!("--advertise=$(POD_IP):{PEER_PORT}"),
            format!("--peer-dns={}:{PEER_PORT}", settings.peers_service),
            format!("--peer-tls-cert={PEER_TLS_DIR}/tls.crt"),
            format!("--peer-tls-key={PEER_TLS_DIR}/tls.key"),
            format!("--peer-tls-ca={PEER_TLS_DIR}/ca.crt"),
            format!("--peer-tls-name={}", settings.peer_tls_name),
        ]);
    }
    args.extend([
        // No delay on SIGTERM: a native sidecar gets it once Envoy has exited, and the
        // plain container keeps its preStop pause (one or the other, never both).
        "--shutdown-delay=0s".to_owned(),
        "--shutdown-grace=15s".to_owned(),
        "--max-keys=1000000".to_owned(),
        "--log-format=json".to_owned(),
    ]);
    args
}

/// The sidecar container: native (`restartPolicy: Always`, for `initContainers`, with a
/// startup probe) or plain (for `containers`, with a `preStop` pause).
pub fn container(settings: &Settings) -> Node {
    let native = settings.native_sidecar;
    let mut container = Map::new();
    container.insert("name", Node::str(CONTAINER));
    container.insert("image", Node::str(&settings.image));
    container.insert("imagePullPolicy", Node::str("IfNotPresent"));
    if native {
        // An init container that keeps running: a native sidecar.
        container.insert("restartPolicy", Node::str("Always"));
    }
    container.insert("args", string_list(&args(settings)));
    let mut ports = vec![port("rk-http", settings.http_port)];
    if settings.cluster {
        container.insert("env", pod_ip_env());
        ports.push(port("rk-peer", PEER_PORT));
    }
    if settings.admin_token_secret.is_some() {
        ports.push(port("rk-admin", ADMIN_PORT));
    }
    container.insert("ports", Node::Seq(ports));
    if native {
        // The next containers (Envoy's, the app's) start once this one serves.
        container.insert("startupProbe", probe(1, Some(30)));
    }
    container.insert("readinessProbe", probe(5, None));
    container.insert("livenessProbe", probe(10, Some(6)));
    if !native {
        // Stay up as long as Envoy does (same pause); a native sidecar stops after it.
        container.insert(
            "lifecycle",
            Node::map([(
                "preStop",
                Node::map([("sleep", Node::map([("seconds", Node::Int(5))]))]),
            )]),
        );
    }
    container.insert("resources", settings.resources.clone());
    let mut mounts = vec![mount(LIMITS_VOLUME, LIMITS_DIR)];
    if settings.cluster {
        mounts.push(mount(PEER_TLS_VOLUME, PEER_TLS_DIR));
    }
    if settings.admin_token_secret.is_some() {
        mounts.push(mount(ADMIN_TOKEN_VOLUME, ADMIN_TOKEN_DIR));
    }
    container.insert("volumeMounts", Node::Seq(mounts));
    container.insert("securityContext", security_context());
    Node::Map(container)
}

/// `POD_IP` from the downward API (cluster mode's `--advertise`).
fn pod_ip_env() -> Node {
    Node::Seq(vec![Node::map([
        ("name", Node::str("POD_IP")),
        (
            "valueFrom",
            Node::map([(
                "fieldRef",
                Node::map([("fieldPath", Node::str("status.podIP"))]),
            )]),
        ),
    ])])
}

/// Locked down: the image's user, a read-only root, no privileges.
fn security_context() -> Node {
    Node::map([
        ("allowPrivilegeEscalation", Node::Bool(false)),
        ("readOnlyRootFilesystem", Node::Bool(true)),
        ("runAsNonRoot", Node::Bool(true)),
        ("runAsUser", Node::Int(IMAGE_USER)),
        ("runAsGroup", Node::Int(IMAGE_USER)),
        (
            "capabilities",
            Node::map([("drop", Node::Seq(vec![Node::str("ALL")]))]),
        ),
    ])
}

/// The pod volumes the sidecar mounts.
pub fn volumes(settings: &Settings) -> Vec<Node> {
    let mut volumes = vec![Node::map([
        ("name", Node::str(LIMITS_VOLUME)),
        (
            "configMap",
            Node::map([("name", Node::str(&settings.limits_configmap))]),
        ),
    ])];
    let secret = |volume: &str, name: &str| {
        Node::map([
            ("name", Node::str(volume)),
            ("secret", Node::map([("secretName", Node::str(name))])),
        ])
    };
    if settings.cluster {
        volumes.push(secret(PEER_TLS_VOLUME, &settings.peer_tls_secret));
    }
    if let Some(token) = &settings.admin_token_secret {
        volumes.push(secret(ADMIN_TOKEN_VOLUME, token));
    }
    volumes
}

#[cfg(test)]
mod tests {
    use super::{Outcome, inject, uninject};
    use crate::node::Node;
    use crate::settings::SettingsArgs;

    fn pod(text: &str) -> Node {
        serde_saphyr::from_str(text).expect("yaml")
    }

    #[test]
    fn inject_then_uninject_gives_back_the_pod_exactly() {
        let cases = [
            "spec:\n  containers:\n  - name: app\n    image: app\n",
            "metadata:\n  labels: {a: b}\nspec:\n  containers: [{name: app}]\n  volumes: []\n",
            "metadata:\n  annotations:\n    x: z\n    traffic.sidecar.istio.io/excludeInboundPorts: '9000'\n    ratekeeper.io/cluster: 'true'\n    ratekeeper.io/istio: 'true'\nspec:\n  containers: [{name: app}]\n  volumes:\n",
            "metadata:\n  annotations:\nspec: {containers: [{name: app}]}\n",
            "spec:\n  initContainers:\n  containers: [{name: app}]\n",
            "spec:\n  initContainers: [{name: migrate}, {name: istio-proxy, restartPolicy: Always}]\n  containers: [{name: app}]\n",
            "metadata:\n  annotations: {ratekeeper.io/native-sidecar: 'false'}\nspec:\n  initContainers: []\n  containers: [{name: app}]\n",
        ];
        for text in cases {
            let original = pod(text);
            let mut injected = original.clone();
            let (outcome, _) = inject(&mut injected, &SettingsArgs::default()).expect("injected");
            assert_eq!(outcome, Outcome::Injected, "{text}");
            assert_ne!(injected, original);
            let mut twice = injected.clone();
            let (outcome, _) = inject(&mut twice, &SettingsArgs::default()).expect("again");
            assert_eq!(outcome, Outcome::AlreadyInjected);
            assert_eq!(twice, injected, "{text}");
            let mut back = injected.clone();
            assert!(uninject(&mut back).expect("uninjected"));
            assert_eq!(back, original, "{text}");
        }
    }

    /// The names of the pod's `list` (containers or initContainers).
    fn names(pod: &Node, list: &str) -> Vec<String> {
        pod.at(&["spec", list])
            .and_then(Node::as_seq)
            .into_iter()
            .flatten()
            .filter_map(|container| container.str_at(&["name"]).map(str::to_owned))
            .collect()
    }

    #[test]
    fn the_native_sidecar_starts_after_init_containers_and_before_istios_sidecar() {
        let injected = |text: &str, flags: &SettingsArgs| {
            let mut pod = pod(text);
            inject(&mut pod, flags).expect("injected");
            pod
        };
        let native = SettingsArgs::default();
        let pod = injected(
            "spec: {initContainers: [{name: migrate}], containers: [{name: app}]}",
            &native,
        );
        assert_eq!(names(&pod, "initContainers"), ["migrate", "ratekeeper"]);
        assert_eq!(names(&pod, "containers"), ["app"]);
        let sidecar = &pod
            .at(&["spec", "initContainers"])
            .and_then(Node::as_seq)
            .expect("init")[1];
        assert_eq!(sidecar.str_at(&["restartPolicy"]), Some("Always"));
        assert_eq!(
            sidecar.str_at(&["startupProbe", "httpGet", "path"]),
            Some("/healthcheck")
        );
        assert!(sidecar.get("lifecycle").is_none(), "no preStop pause");
        // Istio's native sidecar (Envoy) asks ratekeeper: ratekeeper starts before it and
        // stops after it. Istio's plain sidecar is not a native one to order against.
        let istio = "spec:\n  initContainers: [{name: istio-init}, {name: istio-proxy, restartPolicy: Always}, {name: migrate}]\n  containers: [{name: app}]\n";
        assert_eq!(
            names(&injected(istio, &native), "initContainers"),
            ["istio-init", "ratekeeper", "istio-proxy", "migrate"]
        );
        let plain_istio = "spec: {initContainers: [{name: istio-init}], containers: [{name: app}, {name: istio-proxy}]}";
        assert_eq!(
            names(&injected(plain_istio, &native), "initContainers"),
            ["istio-init", "ratekeeper"]
        );
        // Plain: by flag, or by annotation; and the annotation turns it back on.
        let plain = SettingsArgs {
            native_sidecar: false,
            ..SettingsArgs::default()
        };
        let pod = injected("spec: {containers: [{name: app}]}", &plain);
        assert_eq!(names(&pod, "containers"), ["app", "ratekeeper"]);
        assert!(pod.at(&["spec", "initContainers"]).is_none());
        let sidecar = &pod
            .at(&["spec", "containers"])
            .and_then(Node::as_seq)
            .expect("containers")[1];
        assert!(sidecar.get("restartPolicy").is_none() && sidecar.get("startupProbe").is_none());
        assert!(sidecar.at(&["lifecycle", "preStop", "sleep"]).is_some());
        let annotated = |value: &str| {
            format!(
                "metadata: {{annotations: {{ratekeeper.io/native-sidecar: '{value}'}}}}\nspec: {{containers: [{{name: app}}]}}"
            )
        };
        let pod = injected(&annotated("false"), &native);
        assert_eq!(names(&pod, "containers"), ["app", "ratekeeper"]);
        let pod = injected(&annotated("true"), &plain);
        assert_eq!(names(&pod, "initContainers"), ["ratekeeper"]);
    }

    #[test]
    fn a_status_written_by_an_earlier_version_still_uninjects() {
        // Earlier versions added the plain container only, and wrote this status: the plain
        // container's status is still the same, and it still takes the sidecar away.
        let original =
            pod("metadata:\n  annotations: {a: b}\nspec:\n  containers:\n  - name: app\n");
        let mut injected = original.clone();
        let plain = SettingsArgs {
            native_sidecar: false,
            ..SettingsArgs::default()
        };
        inject(&mut injected, &plain).expect("injected");
        assert_eq!(
            super::annotations(&injected).and_then(|map| map.get(super::STATUS)),
            Some(&Node::str(
                r#"{"containers":["ratekeeper"],"volumes":["ratekeeper-limits"],"created":["volumes"]}"#
            ))
        );
        assert!(uninject(&mut injected).expect("uninjected"));
        assert_eq!(injected, original);
    }

    #[test]
    fn a_pod_that_cannot_take_the_sidecar_is_refused_unchanged() {
        for (text, expected) in [
            ("spec: {}", "spec.containers: missing"),
            ("spec: {containers: {}}", "spec.containers: expected a list"),
            (
                "spec: {containers: [{name: app, ports: [{containerPort: 8080}]}]}",
                "port 8080",
            ),
            ("spec: {hostNetwork: true, containers: []}", "hostNetwork"),
            (
                "spec: {containers: [], volumes: [{name: ratekeeper-limits}]}",
                "already named",
            ),
            (
                "spec: {containers: [], initContainers: {}}",
                "spec.initContainers: expected a list",
            ),
        ] {
            let original = pod(text);
            let mut changed = original.clone();
            let error = inject(&mut changed, &SettingsArgs::default()).expect_err(text);
            assert!(error.contains(expected), "{text}: {error}");
            assert_eq!(changed, original);
        }
    }
}
