//! What the injected sidecar looks like: the settings from the command line
//! ([`SettingsArgs`], shared by `inject` and `webhook`) and their per-pod overrides from
//! `ratekeeper.io/*` annotations ([`ANNOTATIONS`], the one documented table).
//!
//! Invariant: every value is checked here, before anything is changed; an unknown
//! `ratekeeper.io/` annotation is an error (a typo would otherwise be ignored silently).

use clap::{ArgAction, Args, ValueEnum};

use super::node::{Map, Node};

/// The annotation (and label) prefix.
pub const PREFIX: &str = "ratekeeper.io/";
/// `enabled`: inject (the webhook injects only these, outside labelled namespaces);
/// `disabled`: never inject.
pub const INJECT: &str = "ratekeeper.io/inject";
/// Written by injection: what it added, so `--uninject` removes exactly that.
pub const STATUS: &str = "ratekeeper.io/status";
pub const IMAGE: &str = "ratekeeper.io/image";
pub const LIMITS_CONFIGMAP: &str = "ratekeeper.io/limits-configmap";
pub const CLUSTER: &str = "ratekeeper.io/cluster";
pub const PEERS_SERVICE: &str = "ratekeeper.io/peers-service";
pub const PEER_TLS_SECRET: &str = "ratekeeper.io/peer-tls-secret";
pub const PEER_TLS_NAME: &str = "ratekeeper.io/peer-tls-name";
pub const ADMIN_TOKEN_SECRET: &str = "ratekeeper.io/admin-token-secret";
pub const RESOURCES: &str = "ratekeeper.io/resources";
pub const HTTP_PORT: &str = "ratekeeper.io/http-port";
pub const ISTIO: &str = "ratekeeper.io/istio";
pub const NATIVE_SIDECAR: &str = "ratekeeper.io/native-sidecar";

/// Every annotation ratekeeper reads, with the flag that sets its default (docs/injection.md
/// "Injecting the sidecar", prints this table).
pub const ANNOTATIONS: [(&str, &str); 13] = [
    (INJECT, "-"),
    (STATUS, "-"),
    (IMAGE, "--image"),
    (LIMITS_CONFIGMAP, "--limits-configmap"),
    (CLUSTER, "--cluster"),
    (PEERS_SERVICE, "--peers-service"),
    (PEER_TLS_SECRET, "--peer-tls-secret"),
    (PEER_TLS_NAME, "--peer-tls-name"),
    (ADMIN_TOKEN_SECRET, "--admin-token-secret"),
    (RESOURCES, "--resources"),
    (HTTP_PORT, "--http-port"),
    (ISTIO, "--istio"),
    (NATIVE_SIDECAR, "--native-sidecar"),
];

/// The image injected unless `--image` or the annotation say otherwise: the one the
/// Dockerfile builds (docs/deploying.md, "Docker image"), at this version.
pub const DEFAULT_IMAGE: &str = concat!("ratekeeper:", env!("CARGO_PKG_VERSION"));
/// Requests and limits of the sidecar unless overridden (deploy/kubernetes/deployment.yaml's).
pub const DEFAULT_RESOURCES: &str =
    r#"{"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}"#;

/// Ports the sidecar binds besides the HTTP one: gRPC for Envoy (loopback), peers, admin.
pub const GRPC_PORT: u16 = 8081;
pub const PEER_PORT: u16 = 8091;
pub const ADMIN_PORT: u16 = 6070;

/// Whether to add what Istio's sidecar needs (the peer port kept out of its capture).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Istio {
    /// When the pod runs (or is marked to get) Istio's sidecar.
    Auto,
    #[value(name = "true")]
    On,
    #[value(name = "false")]
    Off,
}

/// The sidecar's settings (flags of `inject` and `webhook`); each has an annotation that
/// overrides it per pod.
#[derive(Args, Clone, Debug)]
pub struct SettingsArgs {
    /// The ratekeeper image [annotation ratekeeper.io/image].
    #[arg(long, env = "RATEKEEPER_INJECT_IMAGE", default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// The ConfigMap holding the limits, mounted at /etc/ratekeeper/limits
    /// [annotation ratekeeper.io/limits-configmap].
    #[arg(
        long,
        env = "RATEKEEPER_INJECT_LIMITS_CONFIGMAP",
        default_value = "ratekeeper-limits"
    )]
    pub limits_configmap: String,
    /// Cluster mode: the pods share counters through a headless Service, with mutual TLS
    /// [annotation ratekeeper.io/cluster: "true" or "false"].
    #[arg(long, env = "RATEKEEPER_INJECT_CLUSTER")]
    pub cluster: bool,
    /// Cluster mode: the headless Service listing the pods (`inject` writes it)
    /// [annotation ratekeeper.io/peers-service].
    #[arg(
        long,
        env = "RATEKEEPER_INJECT_PEERS_SERVICE",
        default_value = "ratekeeper-peers"
    )]
    pub peers_service: String,
    /// Cluster mode: the Secret with the peers' certificate (tls.crt, tls.key, ca.crt)
    /// [annotation ratekeeper.io/peer-tls-secret].
    #[arg(
        long,
        env = "RATEKEEPER_INJECT_PEER_TLS_SECRET",
        default_value = "ratekeeper-peer-tls"
    )]
    pub peer_tls_secret: String,
    /// Cluster mode: the DNS name the peers' shared certificate is valid for
    /// (--peer-tls-name) [annotation ratekeeper.io/peer-tls-name].
    #[arg(
        long,
        env = "RATEKEEPER_INJECT_PEER_TLS_NAME",
        default_value = "ratekeeper-peers"
    )]
    pub peer_tls_name: String,
    /// A Secret with a `token` key: the admin listener then serves on the pod network,
    /// guarded by that token (else it stays on loopback)
    /// [annotation ratekeeper.io/admin-token-secret].
    #[arg(long, env = "RATEKEEPER_INJECT_ADMIN_TOKEN_SECRET")]
    pub admin_token_secret: Option<String>,
    /// The sidecar's resources, JSON or YAML flow: {"requests": {...}, "limits": {...}}
    /// [annotation ratekeeper.io/resources].
    #[arg(long, env = "RATEKEEPER_INJECT_RESOURCES", default_value = DEFAULT_RESOURCES)]
    pub resources: String,
    /// The port of /healthcheck and /metrics (probes, Prometheus)
    /// [annotation ratekeeper.io/http-port].
    #[arg(long, env = "RATEKEEPER_INJECT_HTTP_PORT", default_value_t = 8080)]
    pub http_port: u16,
    /// Add what Istio's sidecar needs: `auto` when the pod has (or asks for) istio-proxy
    /// [annotation ratekeeper.io/istio].
    #[arg(long, env = "RATEKEEPER_INJECT_ISTIO", value_enum, default_value_t = Istio::Auto)]
    pub istio: Istio,
    /// A Kubernetes native sidecar (in initContainers, `restartPolicy: Always`): started
    /// before the app's containers and Envoy, stopped after them; `false`: a plain container
    /// in containers [annotation ratekeeper.io/native-sidecar: "true" or "false"].
    #[arg(
        long,
        env = "RATEKEEPER_INJECT_NATIVE_SIDECAR",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set
    )]
    pub native_sidecar: bool,
}

impl Default for SettingsArgs {
    fn default() -> SettingsArgs {
        SettingsArgs {
            image: DEFAULT_IMAGE.to_owned(),
            limits_configmap: "ratekeeper-limits".to_owned(),
            cluster: false,
            peers_service: "ratekeeper-peers".to_owned(),
            peer_tls_secret: "ratekeeper-peer-tls".to_owned(),
            peer_tls_name: "ratekeeper-peers".to_owned(),
            admin_token_secret: None,
            resources: DEFAULT_RESOURCES.to_owned(),
            http_port: 8080,
            istio: Istio::Auto,
            native_sidecar: true,
        }
    }
}

/// One pod's settings: the flags, overridden by its annotations, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub image: String,
    pub limits_configmap: String,
    pub cluster: bool,
    pub peers_service: String,
    pub peer_tls_secret: String,
    pub peer_tls_name: String,
    pub admin_token_secret: Option<String>,
    pub resources: Node,
    pub http_port: u16,
    pub istio: Istio,
    pub native_sidecar: bool,
}

impl SettingsArgs {
    /// The settings of a pod with these annotations (`None`: it has none). An error names
    /// the annotation (or flag) and what is wrong with it.
    pub fn for_pod(&self, annotations: Option<&Map>) -> Result<Settings, String> {
        let mut resources = self.resources.as_str();
        let mut settings = self.settings();
        let mut resources_from = "--resources";
        for (name, value) in annotations.into_iter().flat_map(Map::iter) {
            if !name.starts_with(PREFIX) {
                continue;
            }
            let Some(text) = value.as_str() else {
                return Err(format!(
                    "annotation {name}: expected a string, found {}",
                    value.kind()
                ));
            };
            let text = text.trim();
            settings.annotated(name, text)?;
            if name == RESOURCES {
                resources = text;
                resources_from = RESOURCES;
            }
        }
        settings.resources = parse_resources(resources)
            .map_err(|problem| format!("{}: {problem}", describe(resources_from)))?;
        settings.check()?;
        Ok(settings)
    }

    /// The flags' settings, resources not parsed yet (`Node::Null`).
    fn settings(&self) -> Settings {
        Settings {
            image: self.image.clone(),
            limits_configmap: self.limits_configmap.clone(),
            cluster: self.cluster,
            peers_service: self.peers_service.clone(),
            peer_tls_secret: self.peer_tls_secret.clone(),
            peer_tls_name: self.peer_tls_name.clone(),
            admin_token_secret: self.admin_token_secret.clone(),
            resources: Node::Null,
            http_port: self.http_port,
            istio: self.istio,
            native_sidecar: self.native_sidecar,
        }
    }
}

/// `--flag` or `annotation name`.
fn describe(source: &str) -> String {
    if source.starts_with("--") {
        source.to_owned()
    } else {
        format!("annotation {source}")
    }
}

fn boolean(name: &str, text: &str) -> Result<bool, String> {
    match text {
        "true" | "enabled" => Ok(true),
        "false" | "disabled" => Ok(false),
        _ => Err(format!(
            "annotation {name}: {text:?} is neither true nor false"
        )),
    }
}

/// `{"requests": {..}, "limits": {..}}` (JSON or YAML): a map with only those keys, each a
/// map of resource names to quantities (strings or numbers).
fn parse_resources(text: &str) -> Result<Node, String> {
    let node: Node =
        serde_saphyr::from_str(text).map_err(|error| format!("not YAML or JSON: {error}"))?;
    let Some(map) = node.as_map() else {
        return Err(format!(
            "expected a map with requests and limits, found {}",
            node.kind()
        ));
    };
    for (key, value) in map.iter() {
        if key != "requests" && key != "limits" {
            return Err(format!("unknown key {key:?} (expected requests, limits)"));
        }
        let Some(quantities) = value.as_map() else {
            return Err(format!("{key}: expected a map, found {}", value.kind()));
        };
        for (resource, quantity) in quantities.iter() {
            let fine = match quantity {
                Node::String(text) => quantity_like(text),
                Node::Int(_) | Node::UInt(_) | Node::Float(_) => true,
                _ => false,
            };
            if !fine {
                return Err(format!(
                    "{key}.{resource}: {quantity:?} is not a quantity like 100m or 64Mi"
                ));
            }
        }
    }
    Ok(node)
}

/// Digits (with an optional fraction) and a unit suffix of letters: `100m`, `1.5`, `64Mi`.
fn quantity_like(text: &str) -> bool {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &text[digits.len()..];
    !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
        && digits.chars().filter(|c| *c == '.').count() <= 1
        && suffix.len() <= 2
}

impl Settings {
    /// Overrides the setting of annotation `name` with its value `text`; an error when the
    /// value is bad or the annotation unknown.
    fn annotated(&mut self, name: &str, text: &str) -> Result<(), String> {
        match name {
            INJECT => match text {
                "enabled" | "disabled" => {}
                _ => {
                    return Err(format!(
                        "annotation {name}: {text:?} is neither enabled nor disabled"
                    ));
                }
            },
            STATUS => {}
            IMAGE => self.image = text.to_owned(),
            LIMITS_CONFIGMAP => self.limits_configmap = text.to_owned(),
            CLUSTER => self.cluster = boolean(name, text)?,
            NATIVE_SIDECAR => self.native_sidecar = boolean(name, text)?,
            PEERS_SERVICE => self.peers_service = text.to_owned(),
            PEER_TLS_SECRET => self.peer_tls_secret = text.to_owned(),
            PEER_TLS_NAME => self.peer_tls_name = text.to_owned(),
            ADMIN_TOKEN_SECRET => {
                self.admin_token_secret = (!text.is_empty()).then(|| text.to_owned());
            }
            // Parsed by `for_pod` once every annotation is read.
            RESOURCES => {}
            HTTP_PORT => {
                self.http_port = text
                    .parse()
                    .map_err(|_| format!("annotation {name}: {text:?} is not a port number"))?;
            }
            ISTIO => {
                self.istio = match text {
                    "auto" => Istio::Auto,
                    "true" => Istio::On,
                    "false" => Istio::Off,
                    _ => {
                        return Err(format!(
                            "annotation {name}: {text:?} is not auto, true or false"
                        ));
                    }
                };
            }
            _ => {
                let known: Vec<&str> = ANNOTATIONS.iter().map(|(name, _)| *name).collect();
                return Err(format!(
                    "unknown annotation {name} (known: {})",
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), String> {
        if self.image.is_empty() || self.image.contains(char::is_whitespace) {
            return Err(format!("image {:?}: not an image reference", self.image));
        }
        name("limits ConfigMap", &self.limits_configmap, 253)?;
        if let Some(secret) = &self.admin_token_secret {
            name("admin token Secret", secret, 253)?;
        }
        if self.cluster {
            name("peers Service", &self.peers_service, 63)?;
            name("peer TLS Secret", &self.peer_tls_secret, 253)?;
            name("peer TLS name", &self.peer_tls_name, 253)?;
        }
        if self.http_port == 0 || [GRPC_PORT, PEER_PORT, ADMIN_PORT].contains(&self.http_port) {
            return Err(format!(
                "http port {}: must be a port other than {GRPC_PORT}, {PEER_PORT} and {ADMIN_PORT} (taken by the sidecar)",
                self.http_port
            ));
        }
        Ok(())
    }

    /// The ports the sidecar listens on, in the pod's network namespace.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports = vec![GRPC_PORT, self.http_port, ADMIN_PORT];
        if self.cluster {
            ports.push(PEER_PORT);
        }
        ports
    }
}

/// A Kubernetes object name (DNS-1123: lowercase letters, digits, `-` and `.`, starting and
/// ending alphanumeric), at most `max` characters.
fn name(what: &str, text: &str, max: usize) -> Result<(), String> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let fine = !text.is_empty()
        && text.len() <= max
        && text.chars().all(|c| alnum(c) || c == '-' || c == '.')
        && text.starts_with(alnum)
        && text.ends_with(alnum);
    if fine {
        Ok(())
    } else {
        Err(format!(
            "{what} {text:?}: not a Kubernetes name (lowercase letters, digits, '-' and '.', at most {max})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{Node, SettingsArgs};

    fn annotations(pairs: &[(&str, &str)]) -> super::Map {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), Node::str(value)))
            .collect()
    }

    #[test]
    fn annotations_override_the_flags_and_bad_values_name_the_annotation() {
        let flags = SettingsArgs::default();
        let pod = flags
            .for_pod(Some(&annotations(&[
                ("ratekeeper.io/cluster", "true"),
                ("ratekeeper.io/limits-configmap", "web-limits"),
                ("ratekeeper.io/resources", "{limits: {memory: 1Gi}}"),
                ("other.io/ignored", "x"),
            ])))
            .expect("valid");
        assert!(pod.cluster);
        assert_eq!(pod.limits_configmap, "web-limits");
        assert_eq!(pod.resources.str_at(&["limits", "memory"]), Some("1Gi"));
        for (key, value, expected) in [
            (
                "ratekeeper.io/cluster",
                "maybe",
                "annotation ratekeeper.io/cluster",
            ),
            (
                "ratekeeper.io/limit-configmap",
                "x",
                "unknown annotation ratekeeper.io/limit-configmap",
            ),
            (
                "ratekeeper.io/resources",
                "{cpu: 1}",
                "annotation ratekeeper.io/resources: unknown key",
            ),
            (
                "ratekeeper.io/resources",
                "{limits: {cpu: lots}}",
                "not a quantity",
            ),
            (
                "ratekeeper.io/http-port",
                "8081",
                "must be a port other than",
            ),
            (
                "ratekeeper.io/limits-configmap",
                "Web_Limits",
                "not a Kubernetes name",
            ),
        ] {
            let error = flags
                .for_pod(Some(&annotations(&[(key, value)])))
                .expect_err(value);
            assert!(error.contains(expected), "{key}={value}: {error}");
        }
    }
}
