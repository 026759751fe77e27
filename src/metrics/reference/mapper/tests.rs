use super::*;

/// Envoy Gateway's mapping file, as its ConfigMap ships it.
const ENVOY_GATEWAY: &str = include_str!("../testdata/envoy-gateway-statsd.yaml");

fn envoy_gateway() -> Mapper {
    Mapper::parse("envoy-gateway", ENVOY_GATEWAY).expect("Envoy Gateway's mapping loads")
}

fn metric(name: &str, labels: &[(&str, &str)]) -> Mapped {
    Mapped::Metric {
        name: name.to_owned(),
        labels: labels
            .iter()
            .map(|(label, value)| ((*label).to_owned(), (*value).to_owned()))
            .collect(),
        help: DEFAULT_HELP.to_owned(),
    }
}

/// Table-driven: each StatsD name and what Envoy Gateway's mapping makes of it.
#[test]
fn envoy_gateways_mapping_file() {
    let mapper = envoy_gateway();
    let cases: &[(&str, Mapped)] = &[
        (
            "ratelimit.service.rate_limit.default/eg/http.rule-0-match-0_v.over_limit",
            metric(
                "ratelimit_service_rate_limit_over_limit",
                &[("domain", "default/eg/http"), ("key1", "rule-0-match-0_v")],
            ),
        ),
        (
            "ratelimit.service.rate_limit.d.k1.k2_v.total_hits",
            metric(
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "d"), ("key1", "k1"), ("key2", "k2_v")],
            ),
        ),
        (
            "ratelimit.service.rate_limit.d.k1.k2.within_limit",
            metric(
                "ratelimit_service_rate_limit_within_limit",
                &[("domain", "d"), ("key1", "k1"), ("key2", "k2")],
            ),
        ),
        (
            "ratelimit.service.rate_limit.d.k1.k2.shadow_mode",
            metric(
                "ratelimit_service_rate_limit_shadow_mode",
                &[("domain", "d"), ("key1", "k1"), ("key2", "k2")],
            ),
        ),
        (
            "ratelimit.service.call.should_rate_limit.redis_error",
            metric(
                "ratelimit_service_should_rate_limit_error",
                &[("err_type", "redis_error")],
            ),
        ),
        (
            "ratelimit_server.ShouldRateLimit.total_requests",
            metric(
                "ratelimit_service_total_requests",
                &[("grpc_method", "ShouldRateLimit")],
            ),
        ),
        (
            "ratelimit.service.config_load_success",
            metric("ratelimit_service_config_load_success", &[]),
        ),
        // No rule for a one-part key's shadow_mode, nor for three parts: the closing regex
        // drops them, as statsd_exporter does with this file.
        (
            "ratelimit.service.rate_limit.d.k1.shadow_mode",
            Mapped::Dropped,
        ),
        (
            "ratelimit.service.rate_limit.d.a.b.c.over_limit",
            Mapped::Dropped,
        ),
        ("anything.else", Mapped::Dropped),
    ];
    for (name, expected) in cases {
        assert_eq!(&mapper.map_counter(name), expected, "{name}");
    }
}

#[test]
fn the_reference_default_mapping() {
    let mapper = Mapper::reference_default();
    let deep = "ratelimit.service.rate_limit.d.a.b.c.over_limit";
    assert_eq!(
        mapper.map_counter(deep),
        metric(
            "ratelimit_service_rate_limit_over_limit",
            &[("domain", "d"), ("key1", "a"), ("key2", "b")],
        ),
        "deeper keys keep their first two parts"
    );
    assert_eq!(
        mapper.map_counter("ratelimit.service.rate_limit.d.a.shadow_mode"),
        metric(
            "ratelimit_service_rate_limit_shadow_mode",
            &[("domain", "d"), ("key1", "a")],
        ),
    );
    // Unmatched: the name escaped, no labels.
    assert_eq!(
        mapper.map_counter("ratelimit.service.rate_limit.d.over_limit"),
        metric("ratelimit_service_rate_limit_d_over_limit", &[]),
    );
}

#[test]
fn globs_win_over_earlier_regexes_and_types_must_match() {
    let text = r#"
mappings:
  - match: "a\\..*"
    match_type: regex
    action: drop
    name: dropped
  - match: "a.*.c"
    name: "glob_${1}_x"
    labels: {part: "${1}"}
  - match: "b.*"
    match_metric_type: gauge
    name: gauges
"#;
    let mapper = Mapper::parse("test", text).expect("loads");
    assert_eq!(
        mapper.map_counter("a.b.c"),
        metric("glob_b_x", &[("part", "b")])
    );
    assert_eq!(mapper.map_counter("a.b.d"), Mapped::Dropped);
    // `*` stays within one part.
    assert_eq!(mapper.map_counter("a.b.b.c"), Mapped::Dropped);
    assert_eq!(mapper.map_counter("b.x"), metric("b_x", &[]));
}

#[test]
fn defaults_match_type_and_help() {
    let text = r#"
defaults:
  match_type: regex
mappings:
  - match: "^x\\.(\\w+)$"
    name: "x"
    help: "the x"
    labels: {what: "$1"}
"#;
    let mapper = Mapper::parse("test", text).expect("loads");
    assert_eq!(
        mapper.map_counter("x.y"),
        Mapped::Metric {
            name: "x".into(),
            labels: vec![("what".into(), "y".into())],
            help: "the x".into(),
        }
    );
}

#[test]
fn bad_mappings_are_refused_naming_the_file_and_the_mapping() {
    let cases = [
        (
            "mappings: [{match: 'a.*', name: x, labels: {'1bad': '$1'}}]",
            "\"1bad\" is not a label name",
        ),
        (
            "mappings: [{match: '(', match_type: regex, name: x}]",
            "mappings[0]",
        ),
        (
            "mappings: [{match: 'a', name: x, action: keep}]",
            "action \"keep\"",
        ),
        ("mappings: [{match: 'a'}]", "needs a name"),
        (
            "mappings: [{match: 'a', name: x, match_type: fuzzy}]",
            "match_type \"fuzzy\"",
        ),
        ("mappings: 3", "f.yaml"),
    ];
    for (text, expected) in cases {
        let error = Mapper::parse("f.yaml", text).expect_err(text).to_string();
        assert!(error.starts_with("f.yaml: "), "{error}");
        assert!(error.contains(expected), "{text}: {error}");
    }
}

#[test]
fn metric_names_are_escaped_as_statsd_exporter_does() {
    for (name, escaped) in [
        ("a.b-c", "a_b_c"),
        ("9lives", "_9lives"),
        ("ns:name", "ns:name"),
        ("é", "__"),
        ("path_/api*", "path__api_"),
    ] {
        assert_eq!(escape_metric_name(name), escaped, "{name}");
    }
}
