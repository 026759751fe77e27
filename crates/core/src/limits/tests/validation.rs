//! What a user sees when a limits file is wrong, and what a valid one compiles to.

use std::time::Duration;

use super::{errors, limits};
use crate::algorithm::{Algorithm, Rate, Unit};
use crate::limits::{Limits, Source};

/// Asserts that the descriptor list `descriptors` (YAML, under `domain: edge`) is rejected
/// with exactly `expected` (without the `t.yaml: domain edge > ` prefix).
fn check(descriptors: &str, expected: &[&str]) {
    let yaml = format!("domain: edge\ndescriptors:\n{descriptors}");
    let prefix = "t.yaml: domain edge > ";
    let expected: Vec<String> = expected.iter().map(|e| format!("{prefix}{e}")).collect();
    assert_eq!(errors(&yaml), expected, "for:\n{yaml}");
}

/// Asserts that `yaml` fails to parse with one error starting with `expected`.
fn check_parse(yaml: &str, expected: &str) {
    let errors = errors(yaml);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(expected),
        "got {:?}\nwanted {expected:?}...",
        errors[0]
    );
}

#[test]
fn the_documented_message_shape() {
    let yaml = "domain: edge
descriptors:
  - key: api_key
  - key: api_key
    value: vip
    rate_limits:
      - {unit: minutes, requests_per_unit: 10}
";
    let result = Limits::parse_str("config/edge.yaml", yaml);
    let errors = result.err().map(|e| e.to_string());
    assert_eq!(
        errors.as_deref(),
        Some(
            "config/edge.yaml: domain edge > descriptors[1] (key api_key, value vip) > rate_limits[0].unit: \
             unknown unit \"minutes\" (expected second, minute, hour, day, week, month or year)"
        )
    );
}

#[test]
fn errors_expose_file_place_and_problem() {
    let Err(errors) = Limits::parse_str("e.yaml", "domain: edge\ndescriptors:\n  - key: ''\n")
    else {
        panic!("an empty key was accepted");
    };
    let [error] = errors.errors() else {
        panic!("expected one error, got {errors}");
    };
    assert_eq!(error.file(), "e.yaml");
    assert_eq!(error.place(), "domain edge > descriptors[0] (key \"\")");
    assert_eq!(error.problem(), "empty key");
    assert_eq!(error.position(), None);
}

#[test]
fn a_domain_is_required() {
    assert_eq!(errors(""), ["t.yaml: missing domain"]);
    assert_eq!(errors("# nothing here\n"), ["t.yaml: missing domain"]);
    assert_eq!(errors("descriptors: []\n"), ["t.yaml: missing domain"]);
    assert_eq!(errors("domain:\n"), ["t.yaml: missing domain"]);
    assert_eq!(errors("domain: ''\n"), ["t.yaml: empty domain"]);
    // Without a domain, descriptor places start at the list.
    assert_eq!(
        errors("descriptors:\n  - key: ''\n"),
        [
            "t.yaml: missing domain",
            "t.yaml: descriptors[0] (key \"\"): empty key"
        ]
    );
}

#[test]
fn descriptor_problems() {
    check("  - key: ''\n", &["descriptors[0] (key \"\"): empty key"]);
    check(
        "  - {key: a, value: b}\n  - {key: a}\n  - {key: a, value: b}\n",
        &[
            "descriptors[2] (key a, value b): duplicate descriptor (same key and value as descriptors[0])",
        ],
    );
    // `value: ""` is the key's default entry, like no value at all.
    check(
        "  - {key: a}\n  - {key: a, value: ''}\n",
        &["descriptors[1] (key a): duplicate descriptor (same key and value as descriptors[0])"],
    );
    // The same key and value at different levels is fine; a duplicate deep down is named
    // by its whole path.
    check(
        "  - key: a
    descriptors:
      - {key: a}
      - key: b
        value: 'x y'
        descriptors:
          - {key: c}
          - {key: c}
",
        &[
            "descriptors[0] (key a) > descriptors[1] (key b, value \"x y\") > descriptors[1] (key c): \
           duplicate descriptor (same key and value as descriptors[0])",
        ],
    );
    check(
        "  - key: a\n    rate_limit: {unit: second}\n    rate_limits: [{unit: day}]\n",
        &["descriptors[0] (key a): both rate_limit and rate_limits are set (use one of them)"],
    );
    check(
        "  - key: a\n    rate_limits: []\n",
        &["descriptors[0] (key a) > rate_limits: empty list (remove rate_limits or add a limit)"],
    );
}

#[test]
fn unit_problems() {
    let units = "second, minute, hour, day, week, month or year";
    check(
        "  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
        &[&format!(
            "descriptors[0] (key a) > rate_limit.unit: unknown unit \"fortnight\" (expected {units})"
        )],
    );
    check(
        "  - key: a\n    rate_limit: {requests_per_unit: 1}\n",
        &[&format!(
            "descriptors[0] (key a) > rate_limit.unit: missing unit (expected {units}, or unlimited: true)"
        )],
    );
    check(
        "  - key: a\n    rate_limit: {unit: second, unlimited: true}\n",
        &["descriptors[0] (key a) > rate_limit.unit: unit must not be set when unlimited is true"],
    );
}

#[test]
fn replaces_problems() {
    check(
        "  - key: a
    rate_limit:
      unit: second
      name: mine
      replaces: [{name: ''}, {name: mine}, {}, {name: other}]
",
        &[
            "descriptors[0] (key a) > rate_limit.replaces[0].name: empty name",
            "descriptors[0] (key a) > rate_limit.replaces[1].name: limit mine replaces itself",
            "descriptors[0] (key a) > rate_limit.replaces[2].name: empty name",
        ],
    );
}

#[test]
fn algorithm_and_burst_problems() {
    let place = "descriptors[0] (key a) > rate_limit";
    let table = [
        (
            "{unit: second, algorithm: leaky_bucket}",
            format!(
                "{place}.algorithm: unknown algorithm \"leaky_bucket\" \
                 (expected fixed_window, sliding_window, token_bucket or gcra)"
            ),
        ),
        (
            "{unit: second, burst: 5}",
            format!(
                "{place}.burst: burst is not used by fixed_window (only token_bucket and gcra take a burst)"
            ),
        ),
        (
            "{unit: second, algorithm: sliding_window, burst: 5}",
            format!(
                "{place}.burst: burst is not used by sliding_window (only token_bucket and gcra take a burst)"
            ),
        ),
        (
            "{unit: second, algorithm: token_bucket, burst: 0}",
            format!("{place}.burst: burst must be at least 1"),
        ),
        (
            "{unit: second, algorithm: gcra, burst: 0}",
            format!("{place}.burst: burst must be at least 1"),
        ),
        (
            "{unlimited: true, algorithm: gcra}",
            format!("{place}.algorithm: algorithm must not be set when unlimited is true"),
        ),
    ];
    for (limit, expected) in table {
        check(
            &format!("  - key: a\n    rate_limit: {limit}\n"),
            &[&expected],
        );
    }
}

#[test]
fn max_wait_and_max_queue_problems() {
    let place = "descriptors[0] (key a) > rate_limit";
    let invalid = "(expected a number and a unit of ns, us, ms or s, e.g. \"50ms\")";
    let table = [
        (
            "max_wait: fast",
            format!("{place}.max_wait: invalid duration \"fast\" {invalid}"),
        ),
        (
            "max_wait: 50",
            format!("{place}.max_wait: invalid duration \"50\" {invalid}"),
        ),
        (
            "max_wait: 1m",
            format!("{place}.max_wait: invalid duration \"1m\" {invalid}"),
        ),
        (
            "max_wait: 1.2.3s",
            format!("{place}.max_wait: invalid duration \"1.2.3s\" {invalid}"),
        ),
        (
            "max_wait: 0ms",
            format!("{place}.max_wait: max_wait must be more than 0"),
        ),
        (
            "max_wait: 10001ms",
            format!("{place}.max_wait: max_wait 10001ms is more than the maximum of 10s"),
        ),
        (
            "max_queue: 10",
            format!("{place}.max_queue: max_queue is only valid with max_wait"),
        ),
        (
            "{max_wait: 1s, max_queue: 0}",
            format!("{place}.max_queue: max_queue must be from 1 to 100000, got 0"),
        ),
        (
            "{max_wait: 1s, max_queue: 100001}",
            format!("{place}.max_queue: max_queue must be from 1 to 100000, got 100001"),
        ),
    ];
    for (fields, expected) in table {
        let fields = fields.trim_start_matches('{').trim_end_matches('}');
        check(
            &format!("  - key: a\n    rate_limit: {{unit: second, {fields}}}\n"),
            &[&expected],
        );
    }
}

#[test]
fn rate_limits_list_problems() {
    check(
        "  - key: a
    rate_limits:
      - {unit: minute, requests_per_unit: 1}
      - {unit: minute, requests_per_unit: 2, algorithm: gcra}
      - {unit: MINUTE, requests_per_unit: 3}
      - {unlimited: true}
      - {unit: nope}
",
        &[
            "descriptors[0] (key a) > rate_limits[2]: same unit and algorithm as rate_limits[0] \
             (minute, fixed_window): they would share one counter",
            "descriptors[0] (key a) > rate_limits[3].unlimited: \
             an unlimited limit cannot be combined with other limits in rate_limits",
            "descriptors[0] (key a) > rate_limits[4].unit: unknown unit \"nope\" \
             (expected second, minute, hour, day, week, month or year)",
        ],
    );
}

#[test]
fn every_error_is_reported_across_descriptors_and_files() {
    let sources = [
        Source {
            name: "a.yaml".into(),
            text: "domain: a\ndescriptors:\n  - key: x\n    rate_limit: {unit: eon}\n  - key: ''\n"
                .into(),
        },
        Source {
            name: "b.yaml".into(),
            text: "domain: b\ndescriptors:\n  - key: x\n    ratelimit: {unit: second}\n".into(),
        },
        Source {
            name: "c.yaml".into(),
            text: "descriptors: []\n".into(),
        },
    ];
    let errors = Limits::from_sources(&sources).err().map(|e| e.to_string());
    let errors = errors.unwrap_or_default();
    let lines: Vec<&str> = errors.lines().collect();
    assert_eq!(lines.len(), 4, "{errors}");
    assert!(lines[0].starts_with(
        "a.yaml: domain a > descriptors[0] (key x) > rate_limit.unit: unknown unit \"eon\""
    ));
    assert_eq!(
        lines[1],
        "a.yaml: domain a > descriptors[1] (key \"\"): empty key"
    );
    assert!(
        lines[2].starts_with("b.yaml:4:5: unknown field `ratelimit`"),
        "{}",
        lines[2]
    );
    assert_eq!(lines[3], "c.yaml: missing domain");
}

#[test]
fn typos_and_wrong_types_fail_with_a_position() {
    let header = "domain: edge\ndescriptors:\n  - key: a\n";
    let table = [
        (
            "    ratelimit: {unit: second}\n",
            "t.yaml:4:5: unknown field `ratelimit`, expected one of",
        ),
        (
            "    rate_limit: {unit: second, requestsperunit: 5}\n",
            "t.yaml:4:32: unknown field `requestsperunit`, expected one of",
        ),
        (
            "    rate_limit: {unit: second, requests_per_unit: -1}\n",
            "t.yaml:4:32: invalid value: integer `-1`, expected a whole number from 0 to 4294967295",
        ),
        (
            "    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
            "t.yaml:4:32: invalid type: floating point `1.5`, expected a whole number",
        ),
        (
            "    rate_limit: {unit: second, requests_per_unit: '10'}\n",
            "t.yaml:4:32: invalid type: string \"10\", expected a whole number",
        ),
        (
            "    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
            "t.yaml:4:32: invalid value: integer `4294967296`, expected a whole number",
        ),
        (
            "    rate_limit: [1]\n",
            "t.yaml:4:17: expected a map (key: value pairs)",
        ),
        (
            "    shadow_mode: maybe\n",
            "t.yaml:4:18: expected true or false",
        ),
        (
            "    descriptors: {key: b}\n",
            "t.yaml:4:18: expected a list",
        ),
        ("    value: [b]\n", "t.yaml:4:12: expected a string"),
    ];
    for (descriptor, expected) in table {
        check_parse(&format!("{header}{descriptor}"), expected);
    }
    check_parse(
        "domain: edge\ndescriptors:\n  - a\n",
        "t.yaml:3:5: expected a map (key: value pairs)",
    );
    check_parse(
        "domain: edge\ndescriptors:\n  - value: a\n",
        "t.yaml:3:5: missing field `key`",
    );
    check_parse(
        "domain: edge\ndomains: []\n",
        "t.yaml:2:1: unknown field `domains`",
    );
    check_parse(
        "domain: a\ndomain: b\n",
        "t.yaml:2:1: duplicate mapping key",
    );
    check_parse(
        "domain: a\n---\ndomain: b\n",
        "t.yaml:3:1: only single YAML document expected",
    );
    check_parse("domain: [a\n", "t.yaml:");
}

#[test]
fn every_unit_in_any_case() {
    for unit in Unit::ALL {
        let name = unit.as_str();
        let mut capitalized = name.to_owned();
        capitalized[..1].make_ascii_uppercase();
        for spelling in [name.to_owned(), name.to_ascii_uppercase(), capitalized] {
            let limits = limits(&format!(
                "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {{unit: {spelling}, requests_per_unit: 7}}\n"
            ));
            let node = limits.domain("edge").and_then(|d| d.lookup([("a", "x")]));
            let rates: Vec<_> = node
                .iter()
                .flat_map(|n| n.limits.iter())
                .map(|l| l.rate)
                .collect();
            assert_eq!(
                rates,
                [Some(Rate::fixed(7, unit))],
                "unit spelled {spelling}"
            );
        }
    }
}

#[test]
fn valid_limits_compile_to_what_was_written() {
    let limits = limits(
        "domain: edge
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: token_bucket
      burst: 20
      max_wait: 50ms
      max_queue: 100
      name: per_a
      replaces: [{name: global}]
  - key: b
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: gcra}
      - {unit: second, requests_per_unit: 10, algorithm: Sliding_Window, max_wait: 250us}
      - {unit: day, requests_per_unit: 1000}
  - key: c
    rate_limit: {unit: hour}
  - key: d
    rate_limit: {unlimited: true, name: free}
  - key: e
    rate_limits: [{unlimited: true}]
",
    );
    let find = |key: &str| {
        let node = limits.domain("edge").and_then(|d| d.lookup([(key, "v")]));
        node.map(|n| n.limits.to_vec()).unwrap_or_default()
    };
    let a = find("a");
    assert_eq!(a.len(), 1);
    assert_eq!(
        a[0].rate,
        Some(Rate::new(
            Algorithm::TokenBucket,
            10,
            Unit::Second,
            Some(20)
        ))
    );
    assert_eq!(a[0].max_wait, Some(Duration::from_millis(50)));
    assert_eq!(a[0].max_queue, 100);
    assert_eq!(a[0].name.as_deref(), Some("per_a"));
    assert_eq!(
        a[0].replaces.iter().map(|r| &**r).collect::<Vec<_>>(),
        ["global"]
    );

    let b = find("b");
    let rates: Vec<_> = b.iter().map(|l| l.rate).collect();
    assert_eq!(
        rates,
        [
            Some(Rate::new(Algorithm::Gcra, 10, Unit::Second, None)),
            Some(Rate::new(Algorithm::SlidingWindow, 10, Unit::Second, None)),
            Some(Rate::fixed(1000, Unit::Day)),
        ]
    );
    assert_eq!(b[0].rate.map(|r| r.burst), Some(1), "gcra's default burst");
    assert_eq!((b[0].max_wait, b[0].max_queue), (None, 0));
    assert_eq!(
        (b[1].max_wait, b[1].max_queue),
        (Some(Duration::from_micros(250)), 1000)
    );

    // A missing requests_per_unit is 0 (blocks everything), as in the reference service.
    assert_eq!(find("c")[0].rate, Some(Rate::fixed(0, Unit::Hour)));
    assert!(find("d")[0].is_unlimited());
    assert_eq!(find("d")[0].name.as_deref(), Some("free"));
    assert!(find("e")[0].is_unlimited());
    assert_eq!(limits.limit_count(), 7);
}

#[test]
fn max_wait_spellings() {
    let table = [
        ("1s", Duration::from_secs(1)),
        ("10s", Duration::from_secs(10)),
        ("1.5s", Duration::from_millis(1500)),
        ("250us", Duration::from_micros(250)),
        ("250µs", Duration::from_micros(250)),
        ("100ns", Duration::from_nanos(100)),
        ("10000ms", Duration::from_secs(10)),
    ];
    for (text, expected) in table {
        let limits = limits(&format!(
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {{unit: second, max_wait: {text}}}\n"
        ));
        let node = limits.domain("edge").and_then(|d| d.lookup([("a", "v")]));
        let wait = node.and_then(|n| n.limits.first()).and_then(|l| l.max_wait);
        assert_eq!(wait, Some(expected), "max_wait: {text}");
    }
}

#[test]
fn descriptor_flags_and_nulls() {
    let limits = limits(
        "domain: edge
descriptors:
  - key: a
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
  - key: b
    value: 42
    rate_limits:
",
    );
    let domain = limits.domain("edge");
    let a = domain.and_then(|d| d.lookup([("a", "x")]));
    assert_eq!(
        a.map(|n| (n.shadow_mode, n.detailed_metric)),
        Some((true, true))
    );
    // Scalars are text: `value: 42` matches the request value "42".
    let b = domain.and_then(|d| d.lookup([("b", "42")]));
    assert_eq!(b.map(|n| (n.shadow_mode, n.limits.len())), Some((false, 0)));
}

#[test]
fn a_yaml_error_quoting_a_line_break_stays_on_one_line() {
    // Found by the limits fuzz target: an unknown field's name with line breaks in it.
    let lines = errors("domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {\"u\\nx\": 1}\n");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("t.yaml:4:"), "{}", lines[0]);
    assert!(lines[0].contains("unknown field `u\\nx`"), "{}", lines[0]);
}

#[test]
fn unit_multiplier_makes_windows_of_several_units() {
    let limits = limits(
        "domain: edge
descriptors:
  - key: a
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: second, unit_multiplier: 30, requests_per_unit: 60}
      - {unit: minute, unit_multiplier: 5, requests_per_unit: 100, algorithm: token_bucket}
  - key: b
    rate_limit: {unit: day, unit_multiplier: 7, requests_per_unit: 1000}
  - key: c
    rate_limit: {unit: second, unit_multiplier: 1, requests_per_unit: 3}
",
    );
    let rates = |key: &str| {
        let node = limits.domain("edge").and_then(|d| d.lookup([(key, "v")]));
        let limits = node.map(|n| n.limits.to_vec()).unwrap_or_default();
        limits
            .iter()
            .filter_map(|limit| limit.rate)
            .map(|rate| {
                (
                    rate.window_seconds(),
                    rate.requests_per_unit,
                    rate.algorithm,
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        rates("a"),
        [
            (1, 5, Algorithm::FixedWindow),
            (30, 60, Algorithm::FixedWindow),
            (300, 100, Algorithm::TokenBucket),
        ]
    );
    // `day` x 7 is a week, and a multiplier of 1 changes nothing.
    let node = limits.domain("edge").and_then(|d| d.lookup([("b", "v")]));
    assert_eq!(
        node.map(|n| n.limits[0].rate),
        Some(Some(Rate::fixed(1000, Unit::Week)))
    );
    let node = limits.domain("edge").and_then(|d| d.lookup([("c", "v")]));
    assert_eq!(
        node.map(|n| n.limits[0].rate),
        Some(Some(Rate::fixed(3, Unit::Second)))
    );
    // `/rlconfig` and `validate --list` show the multiplier and the window.
    let dump = limits.to_string();
    assert!(
        dump.contains(
            "edge.a: unit=MINUTE unit_multiplier=5 requests_per_unit=100, \
             algorithm=token_bucket (100 per 5m), burst=100"
        ),
        "{dump}"
    );
    assert!(
        dump.contains("edge.b: unit=WEEK requests_per_unit=1000, algorithm=fixed_window,"),
        "{dump}"
    );
}

#[test]
fn unit_multiplier_problems() {
    check(
        "  - key: a\n    rate_limit: {unit: second, unit_multiplier: 0, requests_per_unit: 1}\n",
        &[
            "descriptors[0] (key a) > rate_limit.unit_multiplier: unit_multiplier must be at least 1",
        ],
    );
    check(
        "  - key: a\n    rate_limit: {unit: day, unit_multiplier: 366, requests_per_unit: 1}\n",
        &[
            "descriptors[0] (key a) > rate_limit.unit_multiplier: 366 x day is longer than a year \
           (31536000 seconds), the longest window a limit may have",
        ],
    );
    check(
        "  - key: a\n    rate_limit: {unit: year, unit_multiplier: 4294967295, requests_per_unit: 1}\n",
        &[
            "descriptors[0] (key a) > rate_limit.unit_multiplier: 4294967295 x year is longer than \
           a year (31536000 seconds), the longest window a limit may have",
        ],
    );
    check(
        "  - key: a\n    rate_limit: {unit_multiplier: 2, unlimited: true}\n",
        &["descriptors[0] (key a) > rate_limit.unit_multiplier: \
           unit_multiplier must not be set when unlimited is true"],
    );
    check_parse(
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unit_multiplier: -1}\n",
        "t.yaml:4:32: invalid value: integer `-1`, expected a whole number",
    );
    // A limit is its window's length: equal windows written apart share one counter.
    check(
        "  - key: a
    rate_limits:
      - {unit: second, unit_multiplier: 10, requests_per_unit: 1}
      - {unit: second, requests_per_unit: 1}
      - {unit: second, unit_multiplier: 10, requests_per_unit: 5}
      - {unit: week, requests_per_unit: 1}
      - {unit: day, unit_multiplier: 7, requests_per_unit: 2}
",
        &[
            "descriptors[0] (key a) > rate_limits[2]: same window and algorithm as rate_limits[0] \
             (10s, fixed_window): they would share one counter",
            "descriptors[0] (key a) > rate_limits[4]: same unit and algorithm as rate_limits[3] \
             (week, fixed_window): they would share one counter",
        ],
    );
}
