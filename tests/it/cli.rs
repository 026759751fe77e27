//! The `ratekeeper` command line: `validate`, and `serve` failing fast on bad limits.

use std::process::Command;

fn ratekeeper(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .args(args)
        .output()
        .expect("runs the binary")
}

/// `ratekeeper serve` on port 0 with `args` after the addresses.
fn serve(args: &[&str]) -> std::process::Output {
    let mut all = vec![
        "serve",
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ];
    all.extend_from_slice(args);
    ratekeeper(&all)
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ratekeeper-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writes");
    path
}

/// `validate` of a file `name` holding `yaml`, which must fail: its stderr.
fn validate_fails(name: &str, yaml: &str) -> String {
    let path = temp_file(name, yaml);
    let output = ratekeeper(&["validate", path.to_str().expect("utf-8 path")]);
    assert!(!output.status.success(), "{name} is refused");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn validate_accepts_the_repository_example_limits() {
    let output = ratekeeper(&["validate", concat!(env!("CARGO_MANIFEST_DIR"), "/config")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("ok, 1 domains (edge)"), "{stdout}");
}

#[test]
fn validate_lists_every_file_it_read_including_sub_directories() {
    let root = std::env::temp_dir().join(format!("ratekeeper-cli-{}-tree", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("teams")).expect("temp dir");
    let limits = |domain: &str| {
        format!(
            "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        )
    };
    std::fs::write(root.join("edge.yaml"), limits("edge")).expect("writes");
    std::fs::write(root.join("teams/internal.conf"), limits("internal")).expect("writes");
    let output = ratekeeper(&["validate", root.to_str().expect("utf-8 path")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let read: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("read "))
        .collect();
    assert_eq!(
        read,
        [
            root.join("edge.yaml").display().to_string(),
            root.join("teams/internal.conf").display().to_string()
        ],
        "{stdout}"
    );
    assert!(
        stdout.contains("ok, 2 domains (edge, internal)"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn validate_reports_every_error_with_file_and_place() {
    let path = temp_file(
        "bad.yaml",
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: ''\n",
    );
    let output = ratekeeper(&["validate", path.to_str().expect("utf-8 path")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("bad.yaml"))
        .collect();
    assert_eq!(lines.len(), 2, "both errors are reported: {stderr}");
    assert!(stderr.contains("fortnight"), "{stderr}");
}

/// `unit_multiplier`: `validate --list` shows each window as a duration, and a zero
/// multiplier is refused naming the file and the place.
#[test]
fn validate_lists_windows_of_several_units_and_refuses_a_zero_multiplier() {
    let path = temp_file(
        "windows.yaml",
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: minute, unit_multiplier: 5, requests_per_unit: 100}\n      - {unit: second, requests_per_unit: 5}\n",
    );
    let output = ratekeeper(&["validate", "--list", path.to_str().expect("utf-8 path")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains(
            "edge.a: unit=MINUTE unit_multiplier=5 requests_per_unit=100, algorithm=fixed_window (100 per 5m)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("edge.a: unit=SECOND requests_per_unit=5, algorithm=fixed_window,"),
        "{stdout}"
    );
    let stderr = validate_fails(
        "zero.yaml",
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unit_multiplier: 0, requests_per_unit: 1}\n",
    );
    assert!(
        stderr.contains(
            "zero.yaml: domain edge > descriptors[0] (key a) > rate_limit.unit_multiplier: \
             unit_multiplier must be at least 1"
        ),
        "{stderr}"
    );
}

#[test]
fn validate_rejects_typos_in_field_names() {
    let stderr = validate_fails(
        "typo.yaml",
        "domain: edge\ndescriptors:\n  - key: a\n    ratelimit: {unit: second, requests_per_unit: 1}\n",
    );
    assert!(
        stderr.contains("ratelimit"),
        "names the unknown field: {stderr}"
    );
}

#[test]
fn serve_refuses_to_start_with_invalid_limits() {
    let path = temp_file(
        "broken.yaml",
        "domain: edge\ndescriptors: [{key: a, rate_limit: {unit: second}}, {key: a, rate_limit: {unit: second}}]\n",
    );
    let output = serve(&["--config", path.to_str().expect("utf-8 path")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("broken.yaml"), "{stderr}");
    assert!(output.stdout.is_empty(), "never announced serving");
}

#[test]
fn serve_refuses_a_header_name_that_is_not_a_token() {
    let output = serve(&["--header-limit", "Rate Limit"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--header-limit") && stderr.contains("\"Rate Limit\" is not a header name"),
        "names the flag and the problem: {stderr}"
    );
    assert!(output.stdout.is_empty(), "never announced serving");
}

#[test]
fn validate_merges_one_domain_across_files_only_when_asked() {
    let root = std::env::temp_dir().join(format!("ratekeeper-cli-{}-merge", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("temp dir");
    let limits = |key: &str| {
        format!(
            "domain: edge\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        )
    };
    std::fs::write(root.join("a.yaml"), limits("api_key")).expect("writes");
    std::fs::write(root.join("b.yaml"), limits("tenant")).expect("writes");
    let dir = root.to_str().expect("utf-8 path");

    let plain = ratekeeper(&["validate", dir]);
    assert!(!plain.status.success());
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert!(stderr.contains("duplicate domain"), "{stderr}");

    let merged = ratekeeper(&["validate", "--merge-domain-config", dir]);
    let stdout = String::from_utf8_lossy(&merged.stdout);
    assert!(
        merged.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&merged.stderr)
    );
    assert!(
        stdout.contains("ok, 1 domains (edge), 2 limits"),
        "{stdout}"
    );

    // The environment variable works like the flag (for `serve` as well).
    let from_env = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .args(["validate", dir])
        .env("RATEKEEPER_MERGE_DOMAIN_CONFIG", "true")
        .output()
        .expect("runs the binary");
    assert!(from_env.status.success(), "{from_env:?}");

    // `serve` reads the same flag: without it, it refuses to start; with it, it serves
    // both files' limits.
    let refused = serve(&["--config", dir]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("duplicate domain"),
        "{refused:?}"
    );
    let ratekeeper = crate::support::Ratekeeper::start(&root, &["--merge-domain-config"]);
    let dump =
        crate::support::http_get(ratekeeper.http_addr(), "/rlconfig", &[]).expect("GET /rlconfig");
    assert!(
        dump.body.contains("edge.api_key:") && dump.body.contains("edge.tenant:"),
        "{dump:#?}"
    );
    drop(ratekeeper);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn serve_refuses_tls_without_a_key_or_with_an_unreadable_file() {
    let cert = temp_file("only.crt", "not used\n");
    let cert = cert.to_str().expect("utf-8 path");
    let output = serve(&["--grpc-tls-cert", cert]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--grpc-tls-key"),
        "names the missing flag: {stderr}"
    );

    let missing = "/nonexistent/ratekeeper/server.key";
    let output = serve(&[
        "--config",
        concat!(env!("CARGO_MANIFEST_DIR"), "/config"),
        "--grpc-tls-cert",
        cert,
        "--grpc-tls-key",
        missing,
    ]);
    assert_eq!(output.status.code(), Some(1), "an error, not a panic");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "--grpc-tls-key {missing}: cannot read: no such file or directory"
        )),
        "names the flag and the file: {stderr}"
    );
    assert!(output.stdout.is_empty(), "never announced serving");
}
