//! The conversion of `RateLimitConfig` resources into limits, and the reconnect backoff.

use std::time::Duration;

use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};
use super::{TYPE_URL, backoff, source, sources, truncate};
use crate::limits::Limits;

fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit.into(),
        requests_per_unit,
        ..RateLimitPolicy::default()
    })
}

fn entry(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.to_owned(),
        value: value.to_owned(),
        rate_limit,
        ..RateLimitDescriptor::default()
    }
}

fn config(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: name.to_owned(),
        domain: domain.to_owned(),
        descriptors,
    }
}

/// Compiles configs as ratekeeper would; the `/rlconfig` dump, or the errors' text.
fn compile(configs: &[RateLimitConfig]) -> Result<String, String> {
    let sources: Vec<_> = configs
        .iter()
        .enumerate()
        .map(|(index, config)| source(index, config))
        .collect();
    Limits::from_sources(&sources)
        .map(|limits| limits.to_string())
        .map_err(|errors| errors.to_string())
}

/// The same limits written as a file.
fn compile_yaml(yaml: &str) -> String {
    Limits::parse_str("file.yaml", yaml)
        .expect("valid yaml")
        .to_string()
}

#[test]
fn a_resource_compiles_to_what_the_same_file_gives() {
    let mut nested = entry("user", "", policy(RateLimitUnit::Minute, 5));
    nested.shadow_mode = true;
    let mut parent = entry("api_key", "vip", policy(RateLimitUnit::Second, 10));
    parent.descriptors = vec![nested];
    let unlimited = entry(
        "internal",
        "",
        Some(RateLimitPolicy {
            unlimited: true,
            ..RateLimitPolicy::default()
        }),
    );
    let named = entry(
        "path",
        "/login",
        Some(RateLimitPolicy {
            unit: RateLimitUnit::Hour.into(),
            requests_per_unit: 100,
            name: "login".to_owned(),
            replaces: vec![RateLimitReplace {
                name: "other".to_owned(),
            }],
            ..RateLimitPolicy::default()
        }),
    );
    let no_limit = entry("tenant", "", None);
    let got = compile(&[config(
        "edge",
        "edge",
        vec![parent, unlimited, named, no_limit],
    )])
    .expect("valid");
    let want = compile_yaml(
        "domain: edge
descriptors:
  - key: api_key
    value: vip
    rate_limit: {unit: second, requests_per_unit: 10}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
        shadow_mode: true
  - key: internal
    rate_limit: {unlimited: true}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 100, name: login, replaces: [{name: other}]}
  - key: tenant
",
    );
    assert_eq!(got, want);
    assert!(got.contains("edge.api_key_vip.user: unit=MINUTE requests_per_unit=5"));
}

/// Every unit of the reference's proto, Envoy Gateway's weekly, monthly and yearly
/// policies included (WEEK is 7, after MONTH 5 and YEAR 6), compiles to the unit of the
/// same name, and `detailed_metric` and `quota_mode` to the file's keys.
#[test]
fn every_unit_and_descriptor_flag_of_the_reference_proto_compiles() {
    let units = [
        (RateLimitUnit::Second, 1, "second"),
        (RateLimitUnit::Minute, 2, "minute"),
        (RateLimitUnit::Hour, 3, "hour"),
        (RateLimitUnit::Day, 4, "day"),
        (RateLimitUnit::Month, 5, "month"),
        (RateLimitUnit::Year, 6, "year"),
        (RateLimitUnit::Week, 7, "week"),
    ];
    let mut descriptors = Vec::new();
    let mut yaml = String::from("domain: edge\ndescriptors:\n");
    for (unit, number, name) in units {
        assert_eq!(i32::from(unit), number, "{name}'s number on the wire");
        descriptors.push(entry("k", name, policy(unit, 10)));
        yaml += &format!(
            "  - key: k\n    value: {name}\n    rate_limit: {{unit: {name}, requests_per_unit: 10}}\n"
        );
    }
    let flagged = RateLimitDescriptor {
        detailed_metric: true,
        quota_mode: true,
        ..entry("q", "", policy(RateLimitUnit::Hour, 3))
    };
    descriptors.push(flagged);
    yaml += "  - key: q\n    detailed_metric: true\n    quota_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";
    let got = compile(&[config("policy", "edge", descriptors)]).expect("compiles");
    assert_eq!(got, compile_yaml(&yaml));
    for name in ["SECOND", "MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "YEAR"] {
        assert!(got.contains(&format!("unit={name} ")), "{name}: {got}");
    }
    assert!(got.contains("quota_mode=true"), "{got}");
}

#[test]
fn errors_name_the_resource_the_place_and_the_problem() {
    let bad = config(
        "team-a",
        "edge",
        vec![entry("user", "", policy(RateLimitUnit::Unknown, 5))],
    );
    let error = compile(&[bad]).expect_err("no unit");
    assert!(error.contains("xds resource team-a"), "{error}");
    assert!(
        error.contains("domain edge > descriptors[0] (key user)"),
        "{error}"
    );
    assert!(error.contains("missing unit"), "{error}");

    let unknown_unit = config(
        "",
        "edge",
        vec![entry(
            "user",
            "",
            Some(RateLimitPolicy {
                unit: 42,
                requests_per_unit: 1,
                ..RateLimitPolicy::default()
            }),
        )],
    );
    let error = compile(&[unknown_unit]).expect_err("unit 42");
    assert!(error.contains("xds resource #0"), "{error}");
    assert!(error.contains("unknown unit \"42\""), "{error}");

    let error = compile(&[config("a", "", Vec::new())]).expect_err("empty domain");
    assert!(
        error.contains("xds resource a") && error.contains("empty domain"),
        "{error}"
    );
}

#[test]
fn two_resources_for_one_domain_are_a_duplicate_naming_both() {
    let a = config(
        "a",
        "edge",
        vec![entry("x", "", policy(RateLimitUnit::Second, 1))],
    );
    let b = config(
        "b",
        "edge",
        vec![entry("y", "", policy(RateLimitUnit::Second, 1))],
    );
    let error = compile(&[a, b]).expect_err("duplicate");
    assert!(
        error.contains("xds resource b") && error.contains("already defined in xds resource a"),
        "{error}"
    );
}

fn any(config: &RateLimitConfig) -> Any {
    Any {
        type_url: TYPE_URL.to_owned(),
        value: config.encode_to_vec(),
    }
}

#[test]
fn resources_are_bounded_and_typed() {
    let good = config("a", "edge", Vec::new());
    assert_eq!(sources(&[any(&good)]).expect("decodes").len(), 1);

    let wrong_type = Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".to_owned(),
        value: Vec::new(),
    };
    let error = sources(&[any(&good), wrong_type]).expect_err("wrong type");
    assert!(error.starts_with("resources[1]: type"), "{error}");

    let garbage = Any {
        type_url: TYPE_URL.to_owned(),
        value: vec![0xff, 0xff, 0xff],
    };
    let error = sources(&[garbage]).expect_err("undecodable");
    assert!(error.contains("resources[0]: cannot decode"), "{error}");

    let many = vec![any(&good); super::MAX_RESOURCES + 1];
    let error = sources(&many).expect_err("too many");
    assert!(error.contains("at most 1024"), "{error}");
}

#[test]
fn backoff_doubles_caps_and_jitters_within_the_upper_half() {
    let initial = Duration::from_millis(100);
    let max = Duration::from_secs(2);
    let check = |attempt: u32, seed: u64, low: u64, high: u64| {
        let delay = backoff(attempt, initial, max, seed);
        assert!(
            delay >= Duration::from_millis(low) && delay <= Duration::from_millis(high),
            "attempt {attempt} seed {seed}: {delay:?}"
        );
    };
    check(0, 0, 50, 50);
    check(0, u64::MAX, 50, 100);
    check(1, 0, 100, 100);
    check(3, 12_345_678, 400, 800);
    check(10, 0, 1000, 1000);
    check(10, u64::MAX, 1000, 2000);
    check(u32::MAX, 7, 1000, 2000);
    assert_eq!(backoff(5, Duration::ZERO, max, 9), Duration::ZERO);
}

#[test]
fn error_details_are_cut_on_a_character_boundary() {
    assert_eq!(truncate("short".to_owned(), 10), "short");
    let cut = truncate("ééééé".to_owned(), 8);
    assert!(cut.len() <= 8 && cut.ends_with("..."), "{cut}");
}

/// A failed handshake says what to check, naming the flag and the file.
#[test]
fn tls_failures_say_what_to_check() {
    use rustls::{AlertDescription, CertificateError};

    use super::tls::explain;
    use crate::transport::tls::ClientTlsOptions;

    let with_files = ClientTlsOptions {
        ca: Some("/certs/ca.crt".into()),
        identity: Some(("/certs/tls.crt".into(), "/certs/tls.key".into())),
    };
    let bare = ClientTlsOptions::default();
    let check = |error: rustls::Error, files: &ClientTlsOptions, parts: &[&str]| {
        let text = explain(&error, files, "xds.internal");
        assert!(
            text.starts_with("tls with the xds server failed: "),
            "{text}"
        );
        for part in parts {
            assert!(text.contains(part), "{part:?} not in {text:?}");
        }
    };
    let unknown = || rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
    check(
        unknown(),
        &with_files,
        &["not signed by", "--xds-tls-ca /certs/ca.crt"],
    );
    check(unknown(), &bare, &["system's roots", "give --xds-tls-ca"]);
    check(
        rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
        &with_files,
        &["not valid for \"xds.internal\"", "--xds-tls-san"],
    );
    check(
        rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
        &bare,
        &[
            "asks for a client certificate",
            "give --xds-tls-cert and --xds-tls-key",
        ],
    );
    check(
        rustls::Error::AlertReceived(AlertDescription::UnknownCA),
        &with_files,
        &["refused the client certificate --xds-tls-cert /certs/tls.crt"],
    );
}

/// The name the server's certificate must carry: --xds-tls-san, else the URL's host.
#[test]
fn the_server_name_is_the_san_or_the_urls_host() {
    use super::{XdsTls, XdsTlsOptions};

    let name = |san: Option<&str>, url: &str| {
        let options = XdsTlsOptions {
            san: san.map(str::to_owned),
            ..XdsTlsOptions::default()
        };
        // Without a CA the system's roots are loaded; a machine without any cannot say.
        XdsTls::load(&options, url)
            .map(|tls| tls.name())
            .map_err(|error| error.to_string())
    };
    match name(None, "https://xds.internal:18000") {
        Ok(found) => {
            assert_eq!(found, "xds.internal");
            assert_eq!(name(None, "https://[::1]:18000").as_deref(), Ok("::1"));
            assert_eq!(
                name(Some("envoy-gateway"), "https://10.0.0.5:18000").as_deref(),
                Ok("envoy-gateway")
            );
            let bad = name(Some("not a name"), "https://xds:1").expect_err("bad san");
            assert!(bad.starts_with("--xds-tls-san \"not a name\""), "{bad}");
        }
        Err(error) => assert!(error.contains("give --xds-tls-ca"), "{error}"),
    }
}

/// An error's text with its sources, each once: an IO error shows its inner error and has
/// it as its source too.
#[test]
fn an_error_chain_names_each_cause_once() {
    let inner = std::io::Error::new(std::io::ErrorKind::InvalidData, "invalid peer certificate");
    let outer = std::io::Error::other(inner);
    assert_eq!(super::source_chain(&outer), "invalid peer certificate");
    let status = tonic::Status::from_error(Box::new(std::io::Error::other("connection refused")));
    let text = super::status_text(&status);
    assert!(text.contains("connection refused"), "{text}");
    assert_eq!(text.matches("connection refused").count(), 1, "{text}");
}
