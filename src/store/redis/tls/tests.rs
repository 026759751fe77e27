use std::fs;
use std::path::{Path, PathBuf};

use ratekeeper_core::testing::TempDir;

use super::{RedisTlsOptions, TlsFiles};
use crate::store::redis::Target;

/// A self-signed certificate for `name` and its key, written as `dir/NAME.crt` and `.key`.
fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let (cert_path, key_path) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    fs::write(&cert_path, cert.pem()).expect("write cert");
    fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

fn error(options: RedisTlsOptions) -> String {
    TlsFiles::load(options).expect_err("refused").to_string()
}

#[test]
fn files_that_cannot_serve_are_refused_naming_the_flag_and_the_file() {
    let dir = TempDir::new("redis-tls-refused");
    let (cert, key) = pair(dir.path(), "client");
    let (_, other_key) = pair(dir.path(), "other");
    let missing = dir.path().join("missing.pem");
    let text = error(RedisTlsOptions {
        ca: Some(missing.clone()),
        ..RedisTlsOptions::default()
    });
    assert!(
        text.starts_with(&format!(
            "--store-tls-ca {}: cannot read: ",
            missing.display()
        )),
        "{text}"
    );
    let text = error(RedisTlsOptions {
        ca: Some(key.clone()),
        ..RedisTlsOptions::default()
    });
    assert!(text.contains("no PEM certificate found"), "{text}");
    let text = error(RedisTlsOptions {
        client: Some((cert.clone(), other_key.clone())),
        ..RedisTlsOptions::default()
    });
    assert!(
        text.starts_with(&format!("--store-tls-key {}", other_key.display()))
            && text.contains("does not match the certificate in --store-tls-cert"),
        "{text}"
    );
    let text = error(RedisTlsOptions {
        client: Some((cert.clone(), cert.clone())),
        ..RedisTlsOptions::default()
    });
    assert!(text.contains("no PEM private key found"), "{text}");
    let files = TlsFiles::load(RedisTlsOptions {
        ca: Some(cert.clone()),
        client: Some((cert, key)),
        skip_hostname_verification: true,
    });
    assert!(files.is_ok(), "a usable set loads");
}

#[test]
fn rotated_files_are_seen_after_a_failure_and_bad_ones_keep_the_last_good() {
    let dir = TempDir::new("redis-tls-rotated");
    let (cert, key) = pair(dir.path(), "client");
    let files = TlsFiles::load(RedisTlsOptions {
        client: Some((cert.clone(), key.clone())),
        ..RedisTlsOptions::default()
    })
    .expect("loads");
    assert!(!files.changed(), "unchanged files");
    *files.checked.lock().expect("lock") = None;
    fs::write(&key, "not a key").expect("break the key");
    assert!(!files.changed(), "an invalid key keeps the last good pair");
    *files.checked.lock().expect("lock") = None;
    pair(dir.path(), "client");
    assert!(files.changed(), "a new pair is taken");
    let info =
        redis::IntoConnectionInfo::into_connection_info("rediss://127.0.0.1:1").expect("a url");
    assert!(files.client(&info).is_ok());
}

#[test]
fn skipping_every_certificate_check_is_refused_naming_the_safe_flags() {
    let text = Target::parse("rediss://127.0.0.1:6380/#insecure").expect_err("refused");
    assert!(
        text.contains("--store-tls-ca") && text.contains("--store-tls-skip-hostname-verification"),
        "{text}"
    );
    assert!(
        Target::parse("rediss://127.0.0.1:6380")
            .expect("tls")
            .is_tls()
    );
    assert!(
        !Target::parse("redis://127.0.0.1:6380")
            .expect("plain")
            .is_tls()
    );
    let cluster = Target::parse("rediss-cluster://a:7000,b:7001").expect("a tls cluster");
    assert!(cluster.is_tls() && cluster.is_cluster());
    let text = Target::parse("rediss-cluster://a:7000,b:7001#insecure").expect_err("refused");
    assert!(text.contains("--store-tls-ca"), "{text}");
}
