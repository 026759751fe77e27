//! `ratekeeper webhook` over real HTTPS: AdmissionReviews (inject, skip, opt-out, injected
//! already, refused, malformed, not JSON, too large, too slow) answered by the real binary
//! with a test CA's certificate and with the one deploy/kubernetes/injector/webhook-certs.sh
//! makes; its JSONPatch applied (as the API server does) and compared with `ratekeeper
//! inject`'s output for the same pod, the patched pods checked by kubernetes-validate; the
//! native sidecar added to initContainers (created, or inserted before Istio's), the plain
//! one to containers; the certificate reloaded when renewed; the metrics counting each
//! answer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

use crate::inject::{INJECTOR, INJECTOR_NAME, inject, kubernetes_validate};
use crate::support::{
    Process, START_TIMEOUT, TempDir, TestCa, eventually, eventually_some, http_get, metric,
    ratekeeper_command, read_repo_file, repo_path, run_to_end, write_atomically, write_config,
    yaml_document, yaml_documents,
};

/// A running `ratekeeper webhook`: its HTTPS and plain HTTP addresses.
struct Webhook {
    process: Process,
    https: SocketAddr,
    http: SocketAddr,
}

fn start_webhook(cert: &Path, key: &Path) -> Webhook {
    let mut process = Process::spawn(
        "ratekeeper webhook",
        ratekeeper_command()
            .args([
                "webhook",
                "--addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
            ])
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key),
    );
    let line = process.stdout_line(START_TIMEOUT);
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|field| field.strip_prefix(name))
            .and_then(|addr| addr.parse::<SocketAddr>().ok())
    };
    let (Some(https), Some(http)) = (field("https="), field("http=")) else {
        process.fail(&format!("printed {line:?} instead of the serving line"));
    };
    Webhook {
        process,
        https,
        http,
    }
}

/// An HTTPS response: status, body and the protocol ALPN settled on.
struct Answer {
    status: u16,
    body: String,
    alpn: Option<Vec<u8>>,
}

/// One HTTP/1.1 request over TLS, checking the server's certificate against `ca_pem` for
/// `name`, offering `h2` and `http/1.1` as the API server does.
fn https(
    addr: SocketAddr,
    ca_pem: &str,
    name: &str,
    path: &str,
    body: &[u8],
    headers: &str,
) -> std::io::Result<Answer> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(std::io::Error::other)?)
            .map_err(std::io::Error::other)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(std::io::Error::other)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let server = ServerName::try_from(name.to_owned()).map_err(std::io::Error::other)?;
    let connection =
        rustls::ClientConnection::new(Arc::new(config), server).map_err(std::io::Error::other)?;
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    tcp.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {name}\r\nContent-Type: application/json\r\nConnection: close\r\n{headers}"
    );
    let head = if headers.contains("Content-Length") {
        format!("{head}\r\n")
    } else {
        format!("{head}Content-Length: {}\r\n\r\n", body.len())
    };
    tls.write_all(head.as_bytes())?;
    tls.write_all(body)?;
    tls.flush()?;
    let mut raw = Vec::new();
    match tls.read_to_end(&mut raw) {
        Ok(_) => {}
        // A server that closes without close_notify; what came is complete (Content-Length).
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(error) => return Err(error),
    }
    let alpn = tls.conn.alpn_protocol().map(<[u8]>::to_vec);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {head:?}")))?;
    Ok(Answer {
        status,
        body: body.to_owned(),
        alpn,
    })
}

fn review(uid: &str, pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
        }
    }))
    .expect("json")
}

/// A pod as a ReplicaSet creates it, with these annotations.
fn pod(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-6d4cf56db6-",
            "namespace": "shop",
            "labels": {"app": "web"},
            "annotations": annotations,
        },
        "spec": {
            "containers": [{"name": "app", "image": "example/web:1", "ports": [{"containerPort": 9000, "protocol": "TCP"}]}],
            "volumes": [{"name": "cache", "emptyDir": {}}],
        }
    })
}

/// RFC 6902 `add`, `replace` and `remove`, as the API server applies them.
fn apply_patch(document: &mut Value, ops: &Value) {
    for op in ops.as_array().expect("a patch is a list") {
        let path = op["path"].as_str().expect("a path");
        let mut tokens: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|token| token.replace("~1", "/").replace("~0", "~"))
            .collect();
        let last = tokens.pop().expect("a non-root path");
        let mut target = &mut *document;
        for token in &tokens {
            target = match target {
                Value::Object(map) => map
                    .get_mut(token)
                    .unwrap_or_else(|| panic!("{path}: no {token}")),
                Value::Array(items) => &mut items[token.parse::<usize>().expect("an index")],
                _ => panic!("{path}: {token} is not a container"),
            };
        }
        let value = op.get("value").cloned();
        match (op["op"].as_str().expect("an op"), target) {
            ("add" | "replace", Value::Object(map)) => {
                map.insert(last, value.expect("a value"));
            }
            ("add", Value::Array(items)) if last == "-" => items.push(value.expect("a value")),
            ("add", Value::Array(items)) => {
                items.insert(last.parse().expect("an index"), value.expect("a value"));
            }
            ("replace", Value::Array(items)) => {
                items[last.parse::<usize>().expect("an index")] = value.expect("a value");
            }
            ("remove", Value::Object(map)) => {
                map.remove(&last).expect("removed");
            }
            ("remove", Value::Array(items)) => {
                items.remove(last.parse().expect("an index"));
            }
            (other, _) => panic!("unexpected op {other} at {path}"),
        }
    }
}

fn response(answer: &Answer) -> Value {
    assert_eq!(answer.status, 200, "{}", answer.body);
    let review: Value = serde_json::from_str(&answer.body).expect("a JSON review");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    assert_eq!(review["response"]["allowed"], true, "{review}");
    review["response"].clone()
}

fn decode_patch(response: &Value) -> Option<Value> {
    use base64::Engine as _;
    let patch = response.get("patch")?.as_str().expect("base64");
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("base64");
    Some(serde_json::from_slice(&bytes).expect("a JSON patch"))
}

#[test]
fn the_webhook_injects_over_https_what_inject_writes_and_allows_every_other_pod() {
    let dir = TempDir::new("webhook");
    let ca = TestCa::new("webhook-test-ca");
    let (cert, key) = ca.server(&[INJECTOR_NAME]).write(dir.path(), "tls");
    let mut webhook = start_webhook(&cert, &key);
    let ca_pem = ca.cert_pem();
    let call = |path: &str, body: &[u8]| {
        https(webhook.https, &ca_pem, INJECTOR_NAME, path, body, "")
            .unwrap_or_else(|error| panic!("POST {path}: {error}"))
    };

    // Inject: a pod that asks for it, in cluster mode with its own limits.
    let asked = pod(json!({
        "ratekeeper.io/inject": "enabled",
        "ratekeeper.io/cluster": "true",
        "ratekeeper.io/limits-configmap": "web-limits",
    }));
    let answer = call("/inject", &review("uid-inject", &asked));
    assert_eq!(answer.alpn.as_deref(), Some(&b"http/1.1"[..]));
    let answered = response(&answer);
    assert_eq!(answered["uid"], "uid-inject");
    let ops = decode_patch(&answered).expect("a patch");
    let mut patched = asked.clone();
    apply_patch(&mut patched, &ops);
    // The same pod through `ratekeeper inject`: the same result.
    let file = write_config(dir.path(), "pod.json", &asked.to_string());
    let (ok, stdout, stderr) = inject(&[file.to_str().expect("utf-8")]);
    assert!(ok, "{stderr}");
    assert_eq!(patched, yaml_documents("inject", &stdout)[0]);
    assert!(
        answered["warnings"][0]
            .as_str()
            .is_some_and(|warning| warning.contains("ratekeeper-peers"))
    );
    // A labelled namespace's pod without the annotation is injected on the other path.
    let plain = pod(json!({}));
    let namespaced = response(&call("/inject/namespace", &review("uid-ns", &plain)));
    let mut patched_plain = plain.clone();
    apply_patch(
        &mut patched_plain,
        &decode_patch(&namespaced).expect("a patch"),
    );
    // Both patched pods pass the schema (named, as the API server names them from
    // generateName before storing them).
    for pod in [&mut patched, &mut patched_plain] {
        pod["metadata"]["name"] = json!("web-6d4cf56db6-x7k2p");
    }
    let files = [
        write_config(dir.path(), "patched.yaml", &patched.to_string()),
        write_config(dir.path(), "patched-plain.yaml", &patched_plain.to_string()),
    ];
    kubernetes_validate(&files, 2);

    // Skipped, allowed unchanged: not asked for, opted out, injected already.
    let opted_out = pod(json!({"ratekeeper.io/inject": "disabled"}));
    for (path, pod, what) in [
        ("/inject", &plain, "not asked for"),
        ("/inject/namespace", &opted_out, "opted out"),
        ("/inject", &patched, "injected already"),
        ("/inject/namespace", &patched_plain, "injected already"),
    ] {
        let answered = response(&call(path, &review("uid-skip", pod)));
        assert_eq!(answered["uid"], "uid-skip");
        assert!(answered.get("patch").is_none(), "{what}: {answered}");
    }
    // A pod that cannot take the sidecar is allowed unchanged, with the reason.
    let clash = pod(json!({"ratekeeper.io/inject": "enabled", "ratekeeper.io/http-port": "9000"}));
    let answered = response(&call("/inject", &review("uid-clash", &clash)));
    assert!(answered.get("patch").is_none());
    assert!(
        answered["warnings"][0]
            .as_str()
            .is_some_and(|warning| warning.contains("port 9000")),
        "{answered}"
    );
    // Malformed reviews: allowed with a warning. Bytes that are not JSON: 400. Too large: 413.
    for body in [&br#"{"hello": "world"}"#[..], br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": 7}}"#] {
        let answered = response(&call("/inject/namespace", body));
        assert!(answered.get("patch").is_none());
        assert!(answered["warnings"][0]
            .as_str()
            .is_some_and(|warning| warning.contains("malformed")));
    }
    let answer = call("/inject", b"\x89PNG not json");
    assert_eq!(answer.status, 400, "{}", answer.body);
    let answer = https(
        webhook.https,
        &ca_pem,
        INJECTOR_NAME,
        "/inject",
        b"",
        "Content-Length: 5000000\r\n",
    )
    .expect("an answer");
    assert_eq!(answer.status, 413, "{}", answer.body);
    // A client that never sends the body it announced gets an answer within the bound.
    let started = std::time::Instant::now();
    let answer = https(
        webhook.https,
        &ca_pem,
        INJECTOR_NAME,
        "/inject",
        b"{\"apiVersion\"",
        "Content-Length: 4096\r\n",
    )
    .expect("an answer");
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(answer.body.contains("no answer within"), "{}", answer.body);
    assert!(started.elapsed() < ratekeeper::webhook::ANSWER_WITHIN + Duration::from_secs(3));
    // Still serving after all that, and it counted each answer.
    let count = |result: &str| {
        metric(
            webhook.http,
            &format!("ratekeeper_webhook_reviews_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(count("injected"), 2.0);
    assert_eq!(count("skipped"), 4.0);
    assert_eq!(count("refused"), 1.0);
    assert_eq!(count("malformed"), 2.0);
    assert_eq!(count("not_json"), 1.0);
    assert_eq!(count("too_large"), 1.0);
    assert_eq!(count("timeout"), 1.0);
    let health = http_get(webhook.http, "/healthcheck", &[]).expect("healthcheck");
    assert_eq!(health.status, 200);
    assert!(
        webhook.process.exited().is_none(),
        "{}",
        webhook.process.stderr()
    );
    // SIGTERM stops it cleanly.
    webhook.process.signal("-TERM");
    let status = eventually_some(START_TIMEOUT, || webhook.process.exited());
    assert!(status.is_some_and(|status| status.success()), "{status:?}");
}

#[test]
fn the_webhook_adds_the_native_sidecar_to_init_containers_or_the_plain_one_to_containers() {
    let dir = TempDir::new("webhook-native");
    let ca = TestCa::new("webhook-native-ca");
    let (cert, key) = ca.server(&[INJECTOR_NAME]).write(dir.path(), "tls");
    let webhook = start_webhook(&cert, &key);
    let ca_pem = ca.cert_pem();
    // The patch the webhook answers for `pod`, applied; and the ops that touch containers.
    let inject_pod = |name: &str, pod: &Value| -> (Value, Vec<Value>) {
        let body = review(name, pod);
        let answer = https(webhook.https, &ca_pem, INJECTOR_NAME, "/inject", &body, "")
            .unwrap_or_else(|error| panic!("POST /inject: {error}"));
        let ops = decode_patch(&response(&answer)).expect("a patch");
        let mut patched = pod.clone();
        apply_patch(&mut patched, &ops);
        let file = write_config(dir.path(), &format!("{name}.json"), &pod.to_string());
        let (ok, stdout, stderr) = inject(&[file.to_str().expect("utf-8")]);
        assert!(ok, "{stderr}");
        assert_eq!(
            patched,
            yaml_documents(name, &stdout)[0],
            "{name}: not what inject writes"
        );
        let ops = ops.as_array().expect("ops").iter();
        let touched = ops.filter(|op| {
            op["path"]
                .as_str()
                .is_some_and(|path| path.contains("ontainers"))
        });
        (patched, touched.cloned().collect())
    };
    let enabled = json!({"ratekeeper.io/inject": "enabled"});
    // No initContainers: the patch creates the list, with the native sidecar in it.
    let (patched, ops) = inject_pod("created", &pod(enabled.clone()));
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert_eq!(ops[0]["op"], "add");
    assert_eq!(ops[0]["path"], "/spec/initContainers");
    assert_eq!(ops[0]["value"][0]["name"], "ratekeeper");
    assert_eq!(ops[0]["value"][0]["restartPolicy"], "Always");
    assert_eq!(
        ops[0]["value"][0]["startupProbe"]["httpGet"]["path"],
        "/healthcheck"
    );
    assert_eq!(
        patched["spec"]["containers"].as_array().map(Vec::len),
        Some(1)
    );
    // Init containers and Istio's native sidecar: inserted after the first, before the other.
    let mut meshed = pod(enabled.clone());
    meshed["spec"]["initContainers"] = json!([
        {"name": "istio-init", "image": "istio/proxyv2:1.27.0"},
        {"name": "istio-proxy", "image": "istio/proxyv2:1.27.0", "restartPolicy": "Always"},
    ]);
    let (patched, ops) = inject_pod("meshed", &meshed);
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert_eq!(
        (&ops[0]["op"], &ops[0]["path"]),
        (&json!("add"), &json!("/spec/initContainers/1"))
    );
    let names: Vec<&Value> = patched["spec"]["initContainers"]
        .as_array()
        .expect("initContainers")
        .iter()
        .map(|container| &container["name"])
        .collect();
    assert_eq!(
        names,
        [
            &json!("istio-init"),
            &json!("ratekeeper"),
            &json!("istio-proxy")
        ]
    );
    // Plain, by annotation: appended to containers, with its preStop pause.
    let (patched, ops) = inject_pod(
        "plain",
        &pod(json!({"ratekeeper.io/inject": "enabled", "ratekeeper.io/native-sidecar": "false"})),
    );
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert_eq!(
        (&ops[0]["op"], &ops[0]["path"]),
        (&json!("add"), &json!("/spec/containers/-"))
    );
    assert_eq!(
        ops[0]["value"]["lifecycle"]["preStop"]["sleep"]["seconds"],
        5
    );
    assert!(patched["spec"].get("initContainers").is_none());
}

#[test]
fn the_webhook_serves_webhook_certs_sh_certificate_and_reloads_a_renewed_one() {
    // The script clusters without cert-manager use: its certificate serves the Service name.
    let dir = TempDir::new("webhook-certs");
    let script = repo_path(&format!("{INJECTOR}/webhook-certs.sh"));
    let (status, stdout, stderr) = run_to_end(
        "webhook-certs.sh",
        Command::new("sh").arg(&script).arg(dir.path()),
        Duration::from_secs(60),
    );
    assert!(status.success(), "{stderr}");
    let secret = yaml_document("webhook-certs.sh output", &stdout);
    assert_eq!(secret["metadata"]["name"], "ratekeeper-injector-tls");
    let secret_file = write_config(dir.path(), "secret.yaml", &stdout);
    kubernetes_validate(&[secret_file], 1);
    let patch: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("ca-bundle-patch.json")).expect("the patch"),
    )
    .expect("JSON");
    let mut webhooks = yaml_document(
        "mutatingwebhookconfiguration.yaml",
        &read_repo_file(&format!("{INJECTOR}/mutatingwebhookconfiguration.yaml")),
    );
    apply_patch(&mut webhooks, &patch);
    let script_ca = std::fs::read_to_string(dir.path().join("ca.crt")).expect("ca.crt");
    for webhook in webhooks["webhooks"].as_array().expect("webhooks") {
        use base64::Engine as _;
        let bundle = base64::engine::general_purpose::STANDARD
            .decode(
                webhook["clientConfig"]["caBundle"]
                    .as_str()
                    .expect("caBundle"),
            )
            .expect("base64");
        assert_eq!(String::from_utf8_lossy(&bundle), script_ca);
    }

    // Serve the script's files from a directory, as the Secret's mount.
    let tls = dir.path().join("mounted");
    std::fs::create_dir(&tls).expect("mkdir");
    let copy = |name: &str| {
        let text = std::fs::read_to_string(dir.path().join(name)).expect("read");
        write_atomically(&tls, name, &text)
    };
    let (cert, key) = (copy("tls.crt"), copy("tls.key"));
    let webhook = start_webhook(&cert, &key);
    let body = review("uid-1", &pod(json!({"ratekeeper.io/inject": "enabled"})));
    let answer = https(
        webhook.https,
        &script_ca,
        INJECTOR_NAME,
        "/inject",
        &body,
        "",
    )
    .expect("the script's certificate serves the Service name");
    assert!(decode_patch(&response(&answer)).is_some());

    // Renewed with another CA: new connections get the new certificate, no restart.
    let renewed = TestCa::new("renewed-ca");
    let leaf = renewed.server(&[INJECTOR_NAME]);
    write_atomically(&tls, "tls.key", &leaf.key_pem);
    write_atomically(&tls, "tls.crt", &leaf.cert_pem);
    let reloaded = eventually(Duration::from_secs(20), || {
        https(
            webhook.https,
            &renewed.cert_pem(),
            INJECTOR_NAME,
            "/inject",
            &body,
            "",
        )
        .is_ok()
    });
    assert!(reloaded, "the renewed certificate was never served");
    assert_eq!(
        metric(
            webhook.http,
            "ratekeeper_webhook_tls_loads_total{result=\"success\"}"
        ),
        2.0
    );
}
