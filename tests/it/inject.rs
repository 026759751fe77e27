//! Sidecar injection (`ratekeeper inject`, `ratekeeper webhook`, deploy/kubernetes/injector),
//! through the real binary: golden input and output files for every workload kind, the
//! native sidecar's place among init containers, the plain container (flag and annotation)
//! and other kinds copied unchanged (`tests/data/inject/*.in.yaml` -> `*.out.yaml`),
//! injecting twice, the `--uninject` round trip, bad input and `--strict`; the Kubernetes schema (kubernetes-validate, strict) on everything
//! `inject` writes and on the injector's manifests; and the Envoy configuration that
//! reaches the injected sidecar, checked by a real Envoy. The webhook's tests are in
//! `inject_webhook.rs`.
//!
//! `RATEKEEPER_UPDATE_GOLDEN=1 cargo test --test it inject::` rewrites the golden outputs
//! (review the diff).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{
    START_TIMEOUT, TempDir, envoy_validate, python_tool, read_repo_file, repo_path, run_ratekeeper,
    run_to_end, write_config, yaml_document, yaml_documents,
};

const DATA: &str = "tests/data/inject";
pub(crate) const INJECTOR: &str = "deploy/kubernetes/injector";
/// The name the injector's certificate is for (its Service in its namespace).
pub(crate) const INJECTOR_NAME: &str = "ratekeeper-injector.ratekeeper-system.svc";

/// Golden cases: input file stem and the flags `inject` runs with.
const CASES: [(&str, &[&str]); 6] = [
    ("kinds", &[]),
    ("list", &[]),
    ("istio", &["--cluster"]),
    // Native: after init containers, before Istio's native sidecar; plain by annotation.
    ("init", &[]),
    // Plain by flag, native by annotation.
    ("plain", &["--native-sidecar=false"]),
    // Kinds without a pod template, copied unchanged.
    ("other", &[]),
];

/// The names of the containers in `list` (`containers`, `initContainers`) of a pod.
fn names(pod: &Value, list: &str) -> Vec<String> {
    pod["spec"][list]
        .as_array()
        .into_iter()
        .flatten()
        .map(|container| container["name"].as_str().unwrap_or("?").to_owned())
        .collect()
}

pub(crate) fn inject(args: &[&str]) -> (bool, String, String) {
    let (status, stdout, stderr) = run_ratekeeper(&[&["inject"], args].concat());
    (status.success(), stdout, stderr)
}

fn input_path(case: &str) -> String {
    repo_path(&format!("{DATA}/{case}.in.yaml"))
        .to_string_lossy()
        .into_owned()
}

/// `inject`'s output for a golden case (stdout, without its last newline).
fn injected(case: &str, flags: &[&str]) -> String {
    let input = input_path(case);
    let (ok, stdout, stderr) = inject(&[&[input.as_str()], flags].concat());
    assert!(ok, "inject {case}: {stderr}");
    stdout
}

pub(crate) fn kubernetes_validate(files: &[PathBuf], expected_objects: usize) {
    let validate = python_tool("kubernetes-validate", "1.37.0", "kubernetes-validate");
    for version in [Some("1.30.0"), None] {
        let mut command = Command::new(&validate);
        command.arg("--strict");
        if let Some(version) = version {
            command.args(["--kubernetes-version", version]);
        }
        command.args(files);
        let (status, stdout, stderr) = run_to_end(
            "kubernetes-validate",
            &mut command,
            Duration::from_secs(120),
        );
        assert!(
            status.success(),
            "kubernetes-validate {version:?}: {status}\n{stdout}\n{stderr}"
        );
        let passed = format!("{stdout}\n{stderr}").matches(" passed ").count();
        assert_eq!(passed, expected_objects, "{stdout}\n{stderr}");
    }
}

// ---------------------------------------------------------------------------------------
// ratekeeper inject

#[test]
fn inject_writes_the_golden_output_for_every_workload_kind() {
    let update = std::env::var_os("RATEKEEPER_UPDATE_GOLDEN").is_some();
    for (case, flags) in CASES {
        let output = injected(case, flags);
        let golden = format!("{DATA}/{case}.out.yaml");
        if update {
            std::fs::write(repo_path(&golden), format!("{output}\n")).expect("write golden");
            continue;
        }
        assert_eq!(
            output,
            read_repo_file(&golden).trim_end(),
            "{golden} (RATEKEEPER_UPDATE_GOLDEN=1 rewrites it)"
        );
    }
    // Every kind got the native sidecar, but the one that opted out.
    let documents = yaml_documents("kinds", &injected("kinds", &[]));
    let kinds: Vec<(&str, &str, bool)> = documents
        .iter()
        .map(|document| {
            let template = match document["kind"].as_str() {
                Some("Pod") => document,
                Some("CronJob") => &document["spec"]["jobTemplate"]["spec"]["template"],
                _ => &document["spec"]["template"],
            };
            let has = names(template, "initContainers") == ["ratekeeper"]
                && !names(template, "containers").contains(&"ratekeeper".to_owned());
            (
                document["kind"].as_str().unwrap_or("?"),
                document["metadata"]["name"].as_str().unwrap_or("?"),
                has,
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("Deployment", "web", true),
            ("Service", "ratekeeper-peers", false),
            ("StatefulSet", "db", true),
            ("Service", "db-ratekeeper-peers", false),
            ("DaemonSet", "agent", true),
            ("ReplicaSet", "legacy", false),
            ("Job", "once", true),
            ("CronJob", "nightly", true),
            ("Pod", "debug", true),
        ]
    );
}

#[test]
fn the_native_sidecar_starts_first_and_the_plain_one_is_kept_on_request() {
    // Native: after the init containers that run to completion, before Istio's native
    // sidecar (its Envoy asks ratekeeper, so ratekeeper starts before it, stops after it).
    let init = yaml_documents("init", &injected("init", &[]));
    let template = |document: &Value| document["spec"]["template"].clone();
    let migrating = template(&init[0]);
    assert_eq!(
        names(&migrating, "initContainers"),
        ["migrate", "ratekeeper"]
    );
    assert_eq!(names(&migrating, "containers"), ["app"]);
    let sidecar = &migrating["spec"]["initContainers"][1];
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert_eq!(
        sidecar["startupProbe"],
        json!({"httpGet": {"path": "/healthcheck", "port": "rk-http"}, "periodSeconds": 1, "failureThreshold": 30})
    );
    assert!(sidecar.get("lifecycle").is_none(), "no preStop pause");
    assert_eq!(
        names(&template(&init[1]), "initContainers"),
        ["istio-init", "ratekeeper", "istio-proxy", "warm-cache"]
    );
    // Plain, by annotation (under the native default) or by flag; an annotation turns the
    // native sidecar back on under the flag.
    let plain = yaml_documents("plain", &injected("plain", &["--native-sidecar=false"]));
    for pod in [template(&init[2]), template(&plain[0])] {
        assert_eq!(
            names(&pod, "containers").last().map(String::as_str),
            Some("ratekeeper")
        );
        assert!(!names(&pod, "initContainers").contains(&"ratekeeper".to_owned()));
        let sidecar = pod["spec"]["containers"]
            .as_array()
            .and_then(|c| c.last())
            .expect("sidecar");
        assert_eq!(sidecar["lifecycle"]["preStop"]["sleep"]["seconds"], 5);
        assert!(sidecar.get("restartPolicy").is_none() && sidecar.get("startupProbe").is_none());
    }
    assert_eq!(
        names(&plain[0]["spec"]["template"], "initContainers"),
        ["migrate"]
    );
    assert_eq!(names(&plain[1], "initContainers"), ["ratekeeper"]);
    // The environment variable sets the flag, like the other settings.
    let (status, stdout, stderr) = crate::support::run_to_end(
        "ratekeeper inject",
        Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
            .args(["inject", &input_path("plain")])
            .env("RATEKEEPER_INJECT_NATIVE_SIDECAR", "false"),
        START_TIMEOUT,
    );
    assert!(status.success(), "{stderr}");
    assert_eq!(
        stdout.trim_end(),
        injected("plain", &["--native-sidecar=false"])
    );
}

#[test]
fn the_injected_sidecar_is_the_hand_written_one() {
    // deploy/kubernetes/deployment.yaml's ratekeeper container, made by hand, a native
    // sidecar too: injection in cluster mode gives the same command line, ports, probes,
    // env, resources and restart policy, and no lifecycle either.
    let deployment = yaml_document(
        "deployment.yaml",
        &read_repo_file("deploy/kubernetes/deployment.yaml"),
    );
    let by_hand = container(
        &deployment["spec"]["template"],
        "initContainers",
        "ratekeeper",
    );
    let documents = yaml_documents("istio", &injected("istio", &["--cluster"]));
    let injected = &container(
        &documents[0]["spec"]["template"],
        "initContainers",
        "ratekeeper",
    );
    for field in [
        "args",
        "env",
        "ports",
        "restartPolicy",
        "startupProbe",
        "readinessProbe",
        "livenessProbe",
        "lifecycle",
        "resources",
        "imagePullPolicy",
    ] {
        assert_eq!(injected[field], by_hand[field], "{field}");
    }
    for (field, value) in by_hand["securityContext"].as_object().expect("a map") {
        assert_eq!(
            &injected["securityContext"][field], value,
            "securityContext.{field}"
        );
    }
    // The same mount points, under the injector's volume names.
    let paths = |container: &Value| -> Vec<Value> {
        container["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .map(|mount| mount["mountPath"].clone())
            .collect()
    };
    assert_eq!(paths(injected), paths(&by_hand));
    // The peers Service written next to it is the hand-written one, selecting these pods.
    let service = yaml_document(
        "peers-service.yaml",
        &read_repo_file("deploy/kubernetes/peers-service.yaml"),
    );
    assert_eq!(documents[1]["spec"]["ports"], service["spec"]["ports"]);
    assert_eq!(documents[1]["spec"]["clusterIP"], "None");
    assert_eq!(documents[1]["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(
        documents[1]["spec"]["selector"]["app.kubernetes.io/name"],
        "echo"
    );
}

/// The container `name` in `list` (`containers`, `initContainers`) of `pod`.
fn container(pod: &Value, list: &str, name: &str) -> Value {
    pod["spec"][list]
        .as_array()
        .and_then(|containers| containers.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {name} in {list}"))
        .clone()
}

#[test]
fn the_plain_sidecar_is_the_native_one_with_envoys_pause() {
    // The same container but for its place, its restart policy and startup probe, and a
    // preStop pause as long as Envoy's in deploy/kubernetes/deployment.yaml (it must not
    // stop while Envoy still asks).
    let flags = ["--cluster", "--native-sidecar=false"];
    let plain = yaml_documents("istio", &injected("istio", &flags));
    let mut plain = container(&plain[0]["spec"]["template"], "containers", "ratekeeper");
    let native = yaml_documents("istio", &injected("istio", &["--cluster"]));
    let mut native = container(
        &native[0]["spec"]["template"],
        "initContainers",
        "ratekeeper",
    );
    let deployment = yaml_document(
        "deployment.yaml",
        &read_repo_file("deploy/kubernetes/deployment.yaml"),
    );
    let envoy = container(&deployment["spec"]["template"], "containers", "envoy");
    assert_eq!(plain["lifecycle"], envoy["lifecycle"]);
    let plain = plain.as_object_mut().expect("a map");
    plain.remove("lifecycle");
    let native = native.as_object_mut().expect("a map");
    assert_eq!(native.remove("restartPolicy"), Some(json!("Always")));
    assert!(native.remove("startupProbe").is_some());
    assert_eq!(plain, native);
}

#[test]
fn injecting_twice_changes_nothing_and_uninject_gives_back_the_input() {
    let dir = TempDir::new("inject-twice");
    for (case, flags) in CASES {
        let once = injected(case, flags);
        let path = write_config(dir.path(), &format!("{case}.yaml"), &once);
        let path = path.to_string_lossy().into_owned();
        let (ok, twice, stderr) = inject(&[&[path.as_str()], flags].concat());
        assert!(ok, "{stderr}");
        assert_eq!(twice, once, "{case}: a second inject changed it");
        assert!(stderr.contains("already has the sidecar"), "{stderr}");
        let (ok, back, stderr) = inject(&["--uninject", &path]);
        assert!(ok, "{stderr}");
        // The input as the writer puts it (comments and flow style go, order stays).
        let (ok, original, _) = inject(&["--uninject", &input_path(case)]);
        assert!(ok);
        assert_eq!(
            back, original,
            "{case}: --uninject did not give back the input"
        );
        assert_eq!(
            yaml_documents(case, &back),
            yaml_documents(case, &read_repo_file(&format!("{DATA}/{case}.in.yaml")))
        );
    }
    // The inputs without comments or flow style come back byte for byte.
    for case in ["kinds", "list", "init", "plain", "other"] {
        let (ok, back, _) = inject(&["--uninject", &input_path(case)]);
        assert!(ok);
        assert_eq!(
            back,
            read_repo_file(&format!("{DATA}/{case}.in.yaml")).trim_end()
        );
    }
}

#[test]
fn inject_reads_stdin_and_writes_nothing_on_bad_input() {
    let bin = env!("CARGO_BIN_EXE_ratekeeper");
    let (status, stdout, stderr) = run_to_end(
        "ratekeeper inject -",
        Command::new("sh")
            .args(["-c", "exec \"$0\" inject - < \"$1\""])
            .arg(bin)
            .arg(input_path("list")),
        START_TIMEOUT,
    );
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout, injected("list", &[]));

    let dir = TempDir::new("inject-bad");
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers: [{name: app, image: app}]\n";
    // Other kinds are an error only with --strict.
    let cases: [(&str, String, &str); 8] = [
        ("not YAML", format!("{deployment}---\nkind: [\n"), "document 2 (from line 9): invalid YAML"),
        ("not an object", format!("{deployment}---\njust text\n"), "document 2: not a Kubernetes object"),
        ("no kind", format!("{deployment}---\nmetadata: {{name: x}}\n"), "document 2: not a Kubernetes object: no apiVersion and kind"),
        ("no pod template", format!("{deployment}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: limits}}\n"), "document 2 (ConfigMap limits): kind ConfigMap has no pod template"),
        ("no containers", "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: c}\nspec: {jobTemplate: {spec: {template: {spec: {}}}}}\n".to_owned(), "document 1 (CronJob c): spec.jobTemplate.spec.template.spec.containers: missing"),
        ("bad annotation", deployment.replace("metadata: {labels", "metadata: {annotations: {ratekeeper.io/cluster: sometimes}, labels"), "document 1 (Deployment web): spec.template: annotation ratekeeper.io/cluster: \"sometimes\" is neither true nor false"),
        ("port clash", deployment.replace("image: app}", "image: app, ports: [{containerPort: 8080}]}"), "document 1 (Deployment web): spec.template.spec.containers[0] (app): port 8080"),
        ("list item", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Secret\n  metadata: {name: s}\n".to_owned(), "document 1 (List) > item 0 (Secret s): kind Secret has no pod template"),
    ];
    for (what, text, expected) in cases {
        let path = write_config(dir.path(), "bad.yaml", &text);
        let (ok, stdout, stderr) = inject(&["--strict", path.to_str().expect("utf-8")]);
        assert!(!ok, "{what}: accepted");
        assert!(stdout.is_empty(), "{what}: wrote half: {stdout}");
        assert!(
            stderr.contains(expected),
            "{what}: {stderr}\nexpected: {expected}"
        );
    }
}

#[test]
fn other_kinds_are_copied_unchanged_unless_strict() {
    // The golden case `other` (a ConfigMap, a Service, a CRD around a Deployment) shows
    // them copied; stderr says so for each, as it says what became of each workload.
    let input = input_path("other");
    let (ok, stdout, stderr) = inject(&[&input]);
    assert!(ok, "{stderr}");
    let documents = yaml_documents("other", &stdout);
    let original = yaml_documents("other", &read_repo_file(&format!("{DATA}/other.in.yaml")));
    for index in [0, 2, 3] {
        assert_eq!(documents[index], original[index]);
    }
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        [
            "document 1 (ConfigMap settings): skipped (no pod template), unchanged",
            "document 2 (Deployment web): injected",
            "document 3 (Service web): skipped (no pod template), unchanged",
            "document 4 (CustomResourceDefinition widgets.example.com): skipped (no pod template), unchanged",
        ]
    );
    // --pass-through, the old way to ask for it, is still accepted: the same output.
    let (ok, passed, stderr) = inject(&["--pass-through", &input]);
    assert!(ok, "{stderr}");
    assert_eq!(passed, stdout);
    // --strict refuses them, and writes nothing.
    let (ok, stdout, stderr) = inject(&["--strict", &input]);
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("document 1 (ConfigMap settings): kind ConfigMap has no pod template"),
        "{stderr}"
    );
    // Input that is not Kubernetes YAML stays an error either way.
    let dir = TempDir::new("inject-other");
    let path = write_config(dir.path(), "text.yaml", "just some text\n");
    let (ok, _, stderr) = inject(&[path.to_str().expect("utf-8")]);
    assert!(!ok);
    assert!(
        stderr.contains("document 1: not a Kubernetes object"),
        "{stderr}"
    );
}

#[test]
fn everything_inject_writes_passes_the_kubernetes_schema() {
    let dir = TempDir::new("inject-schema");
    let mut files = Vec::new();
    let mut count = 0;
    for (case, flags) in CASES {
        // kubernetes-validate has no schema for List: its items are checked one by one.
        let mut objects = Vec::new();
        for document in yaml_documents(case, &injected(case, flags)) {
            match document["kind"].as_str() {
                Some("List") => {
                    objects.extend(document["items"].as_array().expect("items").clone())
                }
                _ => objects.push(document),
            }
        }
        count += objects.len();
        let text: Vec<String> = objects.iter().map(Value::to_string).collect();
        files.push(write_config(
            dir.path(),
            &format!("{case}.yaml"),
            &text.join("\n---\n"),
        ));
    }
    kubernetes_validate(&files, count);
}

// ---------------------------------------------------------------------------------------
// deploy/kubernetes/injector

fn injector_files() -> Vec<String> {
    let kustomization = yaml_document(
        "kustomization.yaml",
        &read_repo_file(&format!("{INJECTOR}/kustomization.yaml")),
    );
    kustomization["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|file| file.as_str().expect("a file").to_owned())
        .collect()
}

fn injector_object(kind: &str) -> Value {
    for file in injector_files() {
        let path = format!("{INJECTOR}/{file}");
        for document in yaml_documents(&path, &read_repo_file(&path)) {
            if document["kind"] == kind {
                return document;
            }
        }
    }
    panic!("no {kind} in {INJECTOR}");
}

#[test]
fn injector_manifests_pass_the_schema_and_agree_with_each_other() {
    let mut listed = injector_files();
    listed.sort();
    let mut present: Vec<String> = std::fs::read_dir(repo_path(INJECTOR))
        .expect("injector dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".yaml"))
        // cert-manager's kinds need its CRDs: applied on their own.
        .filter(|name| name != "kustomization.yaml" && name != "certificate.yaml")
        .collect();
    present.sort();
    assert_eq!(
        listed, present,
        "kustomization.yaml must list every manifest"
    );
    let files: Vec<PathBuf> = listed
        .iter()
        .map(|file| repo_path(&format!("{INJECTOR}/{file}")))
        .collect();
    kubernetes_validate(&files, listed.len());

    let deployment = injector_object("Deployment");
    let service = injector_object("Service");
    let webhooks = injector_object("MutatingWebhookConfiguration");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| arg.as_str().expect("an arg"))
        .collect();
    assert_eq!(args[0], "webhook");
    // The Service reaches the HTTPS port; the probes the plain one.
    let port_of = |name: &str| {
        container["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|port| port["name"] == name)
            .unwrap_or_else(|| panic!("no port {name}"))["containerPort"]
            .as_u64()
            .expect("a number")
    };
    assert_eq!(service["spec"]["ports"][0]["port"], 443);
    let target = service["spec"]["ports"][0]["targetPort"]
        .as_str()
        .expect("a named port");
    assert!(args.contains(&format!("--addr=0.0.0.0:{}", port_of(target)).as_str()));
    assert!(args.contains(&format!("--http-addr=0.0.0.0:{}", port_of("http")).as_str()));
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "http");
    for (key, value) in service["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&pod["metadata"]["labels"][key], value);
    }
    // The certificate files are the mounted Secret's, the one certificate.yaml makes.
    let mount = container["volumeMounts"][0]["mountPath"]
        .as_str()
        .expect("a mount");
    assert!(args.contains(&format!("--tls-cert={mount}/tls.crt").as_str()));
    assert!(args.contains(&format!("--tls-key={mount}/tls.key").as_str()));
    let secret = pod["spec"]["volumes"][0]["secret"]["secretName"].clone();
    let certificates = yaml_documents(
        "certificate.yaml",
        &read_repo_file(&format!("{INJECTOR}/certificate.yaml")),
    );
    let certificate = certificates
        .iter()
        .find(|document| {
            document["kind"] == "Certificate" && document["spec"]["secretName"] == secret
        })
        .expect("a Certificate for the mounted Secret");
    let service_name = format!(
        "{}.{}.svc",
        service["metadata"]["name"].as_str().expect("name"),
        service["metadata"]["namespace"]
            .as_str()
            .expect("namespace")
    );
    assert_eq!(service_name, INJECTOR_NAME);
    assert!(
        certificate["spec"]["dnsNames"]
            .as_array()
            .expect("dnsNames")
            .contains(&json!(service_name))
    );
    assert_eq!(
        webhooks["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!(
            "{}/{}",
            certificate["metadata"]["namespace"]
                .as_str()
                .expect("namespace"),
            certificate["metadata"]["name"].as_str().expect("name")
        )
    );
    // Every webhook fails open, within a timeout above the injector's own bound, and calls
    // a path the injector serves on its Service.
    for webhook in webhooks["webhooks"].as_array().expect("webhooks") {
        assert_eq!(webhook["failurePolicy"], "Ignore");
        assert_eq!(webhook["sideEffects"], "None");
        assert_eq!(webhook["admissionReviewVersions"], json!(["v1"]));
        let timeout = webhook["timeoutSeconds"].as_u64().expect("timeoutSeconds");
        assert!(Duration::from_secs(timeout) > ratekeeper::webhook::ANSWER_WITHIN);
        let client = &webhook["clientConfig"]["service"];
        assert_eq!(client["name"], service["metadata"]["name"]);
        assert_eq!(client["namespace"], service["metadata"]["namespace"]);
        assert!(["/inject", "/inject/namespace"].contains(&client["path"].as_str().expect("path")));
    }
    // The injector runs the image it injects by default.
    let image = container["image"].as_str().expect("image");
    assert_eq!(image, ratekeeper::inject::settings::DEFAULT_IMAGE);
    assert!(args.contains(&format!("--image={image}").as_str()));
}

// ---------------------------------------------------------------------------------------
// Envoy

#[test]
fn envoy_reaches_the_injected_sidecar_through_the_shipped_configs() {
    // The injected sidecar listens for Envoy on --grpc-addr.
    let documents = yaml_documents("kinds", &injected("kinds", &[]));
    let args = documents[0]["spec"]["template"]["spec"]["initContainers"][0]["args"]
        .as_array()
        .expect("args")
        .clone();
    let grpc = args
        .iter()
        .find_map(|arg| {
            arg.as_str()
                .and_then(|arg| arg.strip_prefix("--grpc-addr="))
        })
        .expect("--grpc-addr")
        .to_owned();
    let endpoint = |cluster: &Value| {
        let address = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"];
        format!(
            "{}:{}",
            address["address"].as_str().expect("address"),
            address["port_value"]
        )
    };
    // Istio: the sidecar EnvoyFilter's cluster and ratelimit filter, in an Envoy config
    // shaped like an inbound listener, validated by a real Envoy.
    let filter = yaml_document(
        "sidecar-ratelimit.yaml",
        &read_repo_file("deploy/istio/sidecar-ratelimit.yaml"),
    );
    let patch = |apply_to: &str| {
        filter["spec"]["configPatches"]
            .as_array()
            .expect("configPatches")
            .iter()
            .find(|patch| patch["applyTo"] == apply_to)
            .unwrap_or_else(|| panic!("no {apply_to} patch"))["patch"]["value"]
            .clone()
    };
    let cluster = patch("CLUSTER");
    let ratelimit = patch("HTTP_FILTER");
    assert_eq!(endpoint(&cluster), grpc);
    assert_eq!(
        ratelimit["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"],
        cluster["name"]
    );
    let config = json!({
        "static_resources": {
            "listeners": [{
                "name": "virtualInbound",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 15006}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "inbound",
                        "route_config": {"name": "inbound", "virtual_hosts": [{
                            "name": "app", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}]
                        }]},
                        "http_filters": [ratelimit, {
                            "name": "envoy.filters.http.router",
                            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                        }]
                    }
                }]}]
            }],
            "clusters": [cluster],
        }
    });
    let dir = TempDir::new("inject-envoy");
    let path = write_config(dir.path(), "envoy.yaml", &config.to_string());
    let (status, stdout, stderr) = envoy_validate(&path);
    assert!(status.success(), "{stdout}\n{stderr}");
    // Without Istio: the Envoy of deploy/kubernetes asks the same address (its config is
    // validated by tests/it/deploy.rs).
    let config_map = yaml_document(
        "envoy-configmap.yaml",
        &read_repo_file("deploy/kubernetes/envoy-configmap.yaml"),
    );
    let envoy = yaml_document(
        "envoy.yaml",
        config_map["data"]["envoy.yaml"]
            .as_str()
            .expect("envoy.yaml"),
    );
    let ratekeeper = envoy["static_resources"]["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .find(|cluster| cluster["name"] == "ratekeeper")
        .expect("the ratekeeper cluster");
    assert_eq!(endpoint(ratekeeper), grpc);
}
