//! The Istio EnvoyFilters (`deploy/istio/`), checked the way Istio would apply them: each
//! file's patches are applied to a minimal Envoy config shaped like the one Istio generates
//! for that context (an HTTP connection manager ending in the router, a virtual host with a
//! route), exactly as written (the values are taken from the YAML, not copied), and the real
//! Envoy checks the result with `envoy --mode validate`. A deliberately broken copy must
//! fail the same check, which shows the check has teeth. The patches must also agree with
//! the sidecar deployment: the cluster points at ratekeeper's `--grpc-addr`, the domain and
//! descriptor keys exist in the limits, the workload selector picks the pods.

use std::collections::BTreeSet;
use std::fs;

use crate::support::{
    TempDir, envoy_validate, read_repo_file, repo_path, write_config, yaml_document,
};
use serde_json::{Value, json};

const DIR: &str = "deploy/istio";

/// Every EnvoyFilter file in deploy/istio, by path.
fn envoy_filter_files() -> Vec<String> {
    let mut files: Vec<String> = fs::read_dir(repo_path(DIR))
        .expect("deploy/istio")
        .map(|entry| entry.expect("a dir entry").file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .map(|name| format!("{DIR}/{name}"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no EnvoyFilters in {DIR}");
    files
}

fn load(path: &str) -> Value {
    let filter = yaml_document(path, &read_repo_file(path));
    assert_eq!(filter["kind"], "EnvoyFilter", "{path}");
    assert_eq!(
        filter["apiVersion"], "networking.istio.io/v1alpha3",
        "{path}"
    );
    filter
}

fn patches(filter: &Value) -> &Vec<Value> {
    filter["spec"]["configPatches"]
        .as_array()
        .expect("spec.configPatches")
}

/// The single patch that applies to `apply_to`.
fn patch<'a>(filter: &'a Value, apply_to: &str) -> &'a Value {
    let found: Vec<&Value> = patches(filter)
        .iter()
        .filter(|patch| patch["applyTo"] == apply_to)
        .collect();
    assert_eq!(found.len(), 1, "expected one {apply_to} patch");
    found[0]
}

/// The context every patch of the filter matches (they must agree).
fn context(filter: &Value) -> String {
    let contexts: BTreeSet<&str> = patches(filter)
        .iter()
        .map(|patch| patch["match"]["context"].as_str().expect("match.context"))
        .collect();
    assert_eq!(contexts.len(), 1, "one context per file: {contexts:?}");
    let context = contexts.into_iter().next().expect("a context").to_owned();
    assert!(
        ["SIDECAR_INBOUND", "GATEWAY"].contains(&context.as_str()),
        "{context}"
    );
    context
}

/// Proto merge, as Istio's MERGE does it: messages merge field by field, repeated fields
/// append, scalars are replaced.
fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(into), Value::Object(patch)) => {
            for (key, value) in patch {
                match into.get_mut(key) {
                    Some(existing) => merge(existing, value),
                    None => {
                        into.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Array(into), Value::Array(patch)) => into.extend(patch.iter().cloned()),
        (into, patch) => *into = patch.clone(),
    }
}

/// Envoy's config with `filter`'s patches applied to what Istio generates for its context:
/// a listener whose HTTP connection manager ends in the router, one virtual host with one
/// route to the app's cluster.
fn patched_bootstrap(filter: &Value) -> Value {
    let context = context(filter);
    let manager = "envoy.filters.network.http_connection_manager";
    let mut bootstrap = json!({
        "static_resources": {
            "listeners": [{
                "name": context,
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 15006}},
                "filter_chains": [{"filters": [{
                    "name": manager,
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "inbound",
                        "route_config": {
                            "name": "inbound|8080||",
                            "virtual_hosts": [{
                                "name": "inbound|http|8080",
                                "domains": ["*"],
                                "routes": [{
                                    "name": "default",
                                    "match": {"prefix": "/"},
                                    "route": {"cluster": "inbound|8080||"}
                                }]
                            }]
                        },
                        "http_filters": [{
                            "name": "envoy.filters.http.router",
                            "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                            }
                        }]
                    }
                }]}]
            }],
            "clusters": [{
                "name": "inbound|8080||",
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {
                    "cluster_name": "inbound|8080||",
                    "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                        "socket_address": {"address": "127.0.0.1", "port_value": 8080}
                    }}}]}]
                }
            }]
        }
    });
    let resources = &mut bootstrap["static_resources"];
    for patch in patches(filter) {
        let operation = patch["patch"]["operation"].as_str().expect("operation");
        let value = &patch["patch"]["value"];
        let apply_to = patch["applyTo"].as_str().expect("applyTo");
        match (apply_to, operation) {
            ("CLUSTER", "ADD") => resources["clusters"]
                .as_array_mut()
                .expect("clusters")
                .push(value.clone()),
            ("HTTP_FILTER", "INSERT_BEFORE") => {
                let chain = &patch["match"]["listener"]["filterChain"]["filter"];
                assert_eq!(
                    chain["name"], manager,
                    "patches the HTTP connection manager"
                );
                let before = chain["subFilter"]["name"].as_str().expect("subFilter.name");
                let filters = http_manager(resources)["http_filters"]
                    .as_array_mut()
                    .expect("http_filters");
                let at = filters
                    .iter()
                    .position(|filter| filter["name"] == before)
                    .unwrap_or_else(|| panic!("no HTTP filter {before} to insert before"));
                filters.insert(at, value.clone());
            }
            ("VIRTUAL_HOST", "MERGE") => {
                for vhost in http_manager(resources)["route_config"]["virtual_hosts"]
                    .as_array_mut()
                    .expect("virtual_hosts")
                {
                    merge(vhost, value);
                }
            }
            ("HTTP_ROUTE", "MERGE") => {
                let action = &patch["match"]["routeConfiguration"]["vhost"]["route"]["action"];
                assert!(action == "ROUTE" || action == "ANY", "{action}");
                let vhost = &mut http_manager(resources)["route_config"]["virtual_hosts"][0];
                for route in vhost["routes"].as_array_mut().expect("routes") {
                    merge(route, value);
                }
            }
            other => panic!("tests/it/istio.rs does not apply {other:?} patches yet"),
        }
    }
    bootstrap
}

/// The HTTP connection manager's config in the bootstrap's `static_resources`.
fn http_manager(resources: &mut Value) -> &mut Value {
    &mut resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
}

/// `envoy --mode validate` on the bootstrap; returns whether it passed and the output.
fn validate(label: &str, bootstrap: &Value) -> (bool, String) {
    let dir = TempDir::new(label);
    let text = serde_json::to_string_pretty(bootstrap).expect("JSON");
    let path = write_config(dir.path(), "bootstrap.json", &text);
    let (status, stdout, stderr) = envoy_validate(&path);
    (
        status.success(),
        format!("{status}\nconfig:\n{text}\nstdout:\n{stdout}\nstderr:\n{stderr}"),
    )
}

#[test]
fn every_envoy_filter_patch_set_passes_envoy_validation() {
    for path in envoy_filter_files() {
        let filter = load(&path);
        let bootstrap = patched_bootstrap(&filter);
        // The ratelimit filter landed before the router, which stays last.
        let filters = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
            [0]["typed_config"]["http_filters"]
            .as_array()
            .expect("http_filters")
            .iter()
            .map(|filter| filter["name"].as_str().expect("name").to_owned())
            .collect::<Vec<_>>();
        assert_eq!(
            filters,
            ["envoy.filters.http.ratelimit", "envoy.filters.http.router"],
            "{path}"
        );
        let (passed, output) = validate("istio", &bootstrap);
        assert!(passed, "{path}: {output}");
        assert!(output.contains("OK"), "{path}: {output}");
    }
}

/// Broken copies of a patch set, one per patch, each with what Envoy must complain about:
/// each proves that part of the patch set really reaches the validated config. (Validation
/// does not resolve the filter's gRPC cluster name, which is why
/// `patches_agree_with_the_sidecar_deployment_and_its_limits` compares it by hand.)
fn breakages(filter: &Value) -> Vec<(&'static str, Value)> {
    let index = |apply_to: &str| {
        patches(filter)
            .iter()
            .position(|patch| patch["applyTo"] == apply_to)
            .unwrap_or_else(|| panic!("no {apply_to} patch"))
    };
    let value =
        |apply_to: &str| filter["spec"]["configPatches"][index(apply_to)]["patch"]["value"].clone();
    let mut broken = Vec::new();

    // The filter: a misspelt field.
    let mut copy = filter.clone();
    let mut patched = value("HTTP_FILTER");
    patched["typed_config"]["failure_mode_denied"] = json!(true);
    copy["spec"]["configPatches"][index("HTTP_FILTER")]["patch"]["value"] = patched;
    broken.push(("failure_mode_denied", copy));

    // The cluster: a type Envoy does not have.
    let mut copy = filter.clone();
    let mut patched = value("CLUSTER");
    patched["type"] = json!("STATIK");
    copy["spec"]["configPatches"][index("CLUSTER")]["patch"]["value"] = patched;
    broken.push(("STATIK", copy));

    // The descriptors: a misspelt action, wherever the route patch puts them.
    let route_patch = ["VIRTUAL_HOST", "HTTP_ROUTE"]
        .into_iter()
        .find(|apply_to| {
            patches(filter)
                .iter()
                .any(|patch| patch["applyTo"] == *apply_to)
        })
        .expect("a VIRTUAL_HOST or HTTP_ROUTE patch");
    let mut copy = filter.clone();
    let mut patched = value(route_patch);
    let rate_limits = match route_patch {
        "VIRTUAL_HOST" => &mut patched["rate_limits"],
        _ => &mut patched["route"]["rate_limits"],
    };
    rate_limits[0]["actions"][0] = json!({"request_header": {"header_name": "x-api-key"}});
    copy["spec"]["configPatches"][index(route_patch)]["patch"]["value"] = patched;
    broken.push(("request_header", copy));
    broken
}

#[test]
fn a_broken_patch_set_fails_envoy_validation() {
    for path in envoy_filter_files() {
        let filter = load(&path);
        for (complaint, broken) in breakages(&filter) {
            let (passed, output) = validate("istio-broken", &patched_bootstrap(&broken));
            assert!(!passed, "{path} broken ({complaint}) passed: {output}");
            let stderr = output.split("stderr:").nth(1).unwrap_or_default();
            assert!(
                stderr.contains(complaint),
                "{path}: Envoy should name {complaint}: {output}"
            );
        }
    }
}

/// The sidecar deployment's documents, for cross-checks.
fn kubernetes_documents() -> Vec<Value> {
    let mut documents = Vec::new();
    for file in fs::read_dir(repo_path("deploy/kubernetes")).expect("deploy/kubernetes") {
        let name = file.expect("a dir entry").file_name();
        let name = name.to_string_lossy().into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            let path = format!("deploy/kubernetes/{name}");
            documents.extend(crate::support::yaml_documents(
                &path,
                &read_repo_file(&path),
            ));
        }
    }
    documents
}

#[test]
fn patches_agree_with_the_sidecar_deployment_and_its_limits() {
    let documents = kubernetes_documents();
    let deployment = documents
        .iter()
        .find(|document| document["kind"] == "Deployment")
        .expect("a Deployment");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    // A native sidecar (initContainers); or a plain one.
    let spec = &deployment["spec"]["template"]["spec"];
    let ratekeeper = ["initContainers", "containers"]
        .iter()
        .flat_map(|list| spec[list].as_array().into_iter().flatten())
        .find(|container| container["name"] == "ratekeeper")
        .expect("the ratekeeper container");
    let grpc_addr = ratekeeper["args"]
        .as_array()
        .expect("args")
        .iter()
        .find_map(|arg| arg.as_str()?.strip_prefix("--grpc-addr="))
        .expect("--grpc-addr=");
    // Domains and their top-level keys, from the limits ConfigMap.
    let limits: Vec<Value> = documents
        .iter()
        .filter(|document| document["kind"] == "ConfigMap")
        .flat_map(|map| map["data"].as_object().expect("data").iter())
        .filter(|(key, _)| key.ends_with(".yaml") && !key.starts_with("envoy"))
        .map(|(key, text)| yaml_document(key, text.as_str().expect("text")))
        .collect();

    for path in envoy_filter_files() {
        let filter = load(&path);
        let cluster = &patch(&filter, "CLUSTER")["patch"]["value"];
        let address = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"];
        assert_eq!(
            format!(
                "{}:{}",
                address["address"].as_str().expect("address"),
                address["port_value"]
            ),
            grpc_addr,
            "{path}: the cluster must reach ratekeeper's --grpc-addr"
        );
        let ratelimit = &patch(&filter, "HTTP_FILTER")["patch"]["value"]["typed_config"];
        assert_eq!(
            ratelimit["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"],
            cluster["name"],
            "{path}"
        );
        let domain = ratelimit["domain"].as_str().expect("domain");
        let domain_limits = limits
            .iter()
            .find(|limits| limits["domain"] == domain)
            .unwrap_or_else(|| panic!("{path}: domain {domain} is not in the limits"));
        let keys: BTreeSet<&str> = domain_limits["descriptors"]
            .as_array()
            .expect("descriptors")
            .iter()
            .map(|descriptor| descriptor["key"].as_str().expect("key"))
            .collect();
        // The descriptors' first keys exist in the limits (else nothing would be limited).
        let routes = patch_rate_limits(&filter);
        assert!(!routes.is_empty(), "{path}: no rate_limits");
        for rate_limit in routes {
            let action = &rate_limit["actions"][0];
            let key = match action.get("request_headers") {
                Some(headers) => headers["descriptor_key"].as_str().expect("descriptor_key"),
                None if action.get("remote_address").is_some() => "remote_address",
                None => panic!("{path}: unexpected action {action}"),
            };
            assert!(keys.contains(key), "{path}: {key} not in {keys:?}");
        }
        if context(&filter) == "SIDECAR_INBOUND" {
            let selector = filter["spec"]["workloadSelector"]["labels"]
                .as_object()
                .expect("workloadSelector.labels");
            for (key, value) in selector {
                assert_eq!(&pod_labels[key], value, "{path}: selects {key}={value}");
            }
        }
    }
}

/// The `rate_limits` a filter's VIRTUAL_HOST or HTTP_ROUTE patch adds.
fn patch_rate_limits(filter: &Value) -> Vec<Value> {
    let mut found = Vec::new();
    for patch in patches(filter) {
        let value = &patch["patch"]["value"];
        let list = match patch["applyTo"].as_str() {
            Some("VIRTUAL_HOST") => &value["rate_limits"],
            Some("HTTP_ROUTE") => &value["route"]["rate_limits"],
            _ => continue,
        };
        found.extend(list.as_array().expect("rate_limits").iter().cloned());
    }
    found
}
