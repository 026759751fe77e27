//! The reference service's newer descriptor keys: `share_threshold`, `quota_mode`,
//! `value_to_metric` and `metadata`.

use super::{errors, limits};

/// The error lines for `descriptors` under `domain: edge`, without the shared prefix.
fn problems(descriptors: &str) -> Vec<String> {
    let yaml = format!("domain: edge\ndescriptors:\n{descriptors}");
    errors(&yaml)
        .into_iter()
        .map(|line| {
            line.strip_prefix("t.yaml: domain edge > ")
                .map_or(line.clone(), str::to_owned)
        })
        .collect()
}

#[test]
fn the_newer_keys_load_and_reach_the_tree() {
    let limits = limits(
        "domain: edge
descriptors:
  - key: route
    value_to_metric: true
    quota_mode: true
    metadata:
      backend: primary
      weight: 3
      tags: [a, b]
      nested: {on: true, none: null}
    descriptors:
      - key: file
        value: files/*
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 10}
",
    );
    let domain = limits.domain("edge").expect("domain");
    let walk = domain
        .walk([("route", "/x"), ("file", "files/a")])
        .expect("matches");
    let [route, file] = walk.steps() else {
        panic!("two steps expected");
    };
    assert!(route.value_to_metric && route.soft);
    assert!(!file.value_to_metric && !file.soft);
    assert_eq!(file.shared.as_deref(), Some("files/*"));
    assert_eq!(route.shared, None);
    let metadata = route.metadata.as_ref().expect("metadata");
    let json = serde_json::Value::Object(metadata.as_ref().clone());
    assert_eq!(
        json,
        serde_json::json!({
            "backend": "primary", "weight": 3, "tags": ["a", "b"],
            "nested": {"on": true, "none": null}
        })
    );
    assert_eq!(file.metadata, None);
    // `/rlconfig` shows the two that change decisions.
    let dump = limits.to_string();
    assert!(
        dump.contains("edge.route.file_files/*: unit=HOUR requests_per_unit=10, algorithm=fixed_window, shadow_mode=false, share_threshold=true"),
        "{dump}"
    );
}

#[test]
fn empty_metadata_and_false_flags_are_nothing() {
    let limits = limits(
        "domain: edge
descriptors:
  - key: a
    metadata:
    quota_mode: false
    share_threshold: false
  - key: b
    metadata: {}
",
    );
    let domain = limits.domain("edge").expect("domain");
    for key in ["a", "b"] {
        let node = domain.lookup([(key, "v")]).expect("matches");
        assert_eq!(node.metadata, None, "{key}");
        assert!(!node.soft && node.shared.is_none());
    }
}

#[test]
fn share_threshold_needs_a_wildcard_value() {
    assert_eq!(
        problems(
            "  - key: file
    value: report.pdf
    share_threshold: true
  - key: path
    share_threshold: true
"
        ),
        [
            "descriptors[0] (key file, value report.pdf) > share_threshold: share_threshold needs a wildcard value (a value with *) whose matches share one counter",
            "descriptors[1] (key path) > share_threshold: share_threshold needs a wildcard value (a value with *) whose matches share one counter",
        ]
    );
}

#[test]
fn metadata_must_be_a_map_of_bounded_depth() {
    assert_eq!(
        problems(
            "  - key: a
    metadata: primary
  - key: b
    metadata: [x]
  - key: c
    metadata: {a: {b: {c: {d: {e: {f: {g: {h: {i: 1}}}}}}}}}
"
        ),
        [
            "descriptors[0] (key a) > metadata: expected a map (key: value pairs) of data to return to Envoy",
            "descriptors[1] (key b) > metadata: expected a map (key: value pairs) of data to return to Envoy",
            "descriptors[2] (key c) > metadata: metadata nested deeper than 8 levels",
        ]
    );
}

#[test]
fn the_newer_flags_are_booleans_and_metadata_keys_are_unique() {
    let flag = errors("domain: edge\ndescriptors:\n  - key: a\n    quota_mode: yes please\n");
    assert_eq!(flag.len(), 1, "{flag:?}");
    assert!(flag[0].starts_with("t.yaml:4:"), "{flag:?}");
    assert!(flag[0].contains("expected true or false"), "{flag:?}");
    let twice = errors("domain: edge\ndescriptors:\n  - key: a\n    metadata: {x: 1, x: 2}\n");
    assert_eq!(twice.len(), 1, "{twice:?}");
    assert!(twice[0].contains("duplicate"), "{twice:?}");
}
