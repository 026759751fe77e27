//! Oversized, overdeep and amplified inputs end in an error, never a crash or a hang.

use super::{errors, limits, lines};
use crate::limits::{Limits, MAX_DEPTH, Source};

#[test]
fn input_bounds_are_errors() {
    let big = format!("domain: edge\n#{}\n", "x".repeat(4 * 1024 * 1024));
    assert_eq!(
        errors(&big),
        ["t.yaml: file is larger than 4194304 bytes (4 MiB)"]
    );

    let nested = |levels: usize| {
        let mut yaml = String::from("domain: edge\n");
        for level in 0..levels {
            let indent = "  ".repeat(level);
            yaml.push_str(&format!("{indent}descriptors:\n{indent}- key: k{level}\n"));
        }
        let indent = "  ".repeat(levels);
        yaml.push_str(&format!(
            "{indent}rate_limits: [{{unit: second, replaces: [{{name: x}}]}}]\n"
        ));
        yaml
    };
    let deepest = limits(&nested(MAX_DEPTH));
    let domain = deepest.domain("edge");
    let entries: Vec<String> = (0..MAX_DEPTH).map(|level| format!("k{level}")).collect();
    let node = domain.and_then(|d| d.lookup(entries.iter().map(|key| (key.as_str(), "v"))));
    assert_eq!(node.map(|node| node.limits.len()), Some(1));

    let found = errors(&nested(MAX_DEPTH + 1));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("t.yaml:")
            && found[0].ends_with(": descriptors nested deeper than 32 levels"),
        "{found:?}"
    );
    // Far deeper input stops at the bound too, without exhausting the stack.
    let flow = format!(
        "domain: edge\ndescriptors: {}{}\n",
        "[{key: k, descriptors: ".repeat(5_000),
        "}]".repeat(5_000)
    );
    for yaml in [nested(200), flow] {
        let found = errors(&yaml);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].ends_with(": descriptors nested deeper than 32 levels"),
            "{found:?}"
        );
    }
}

#[test]
fn at_most_100000_descriptors_in_all_files() {
    let file = |name: &str, count: usize| {
        let mut text = format!("domain: {name}\ndescriptors:\n");
        for i in 0..count {
            text.push_str(&format!("- {{key: k{i}}}\n"));
        }
        Source {
            name: format!("{name}.yaml"),
            text,
        }
    };
    let mut sources = vec![file("a", 60_000), file("b", 40_000)];
    let loaded = Limits::from_sources(&sources);
    assert_eq!(loaded.map(|limits| limits.domains().count()).ok(), Some(2));

    sources.push(file("c", 1));
    sources.push(file("d", 1));
    let errors = lines(Limits::from_sources(&sources).map(|limits| limits.to_string()));
    // The budget runs out in c.yaml; d.yaml is not read.
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("c.yaml:3:"), "{errors:?}");
    assert!(
        errors[0].ends_with(": more than 100000 descriptors in all files"),
        "{errors:?}"
    );
}

#[test]
fn one_anchor_may_be_shared_by_many_descriptors() {
    let mut yaml = String::from(
        "domain: edge\ndescriptors:\n  - key: base\n    rate_limit: &standard {unit: second, requests_per_unit: 5}\n",
    );
    for i in 0..500 {
        yaml.push_str(&format!("  - key: k{i}\n    rate_limit: *standard\n"));
    }
    let limits = limits(&yaml);
    assert_eq!(limits.limit_count(), 501);
    let node = limits
        .domain("edge")
        .and_then(|d| d.lookup([("k499", "v")]));
    let rate = node.and_then(|n| n.limits.first()).and_then(|l| l.rate);
    assert_eq!(rate.map(|r| r.requests_per_unit), Some(5));
}

#[test]
fn alias_amplification_is_cut_off() {
    // Each level aliases the previous one ten times: 10^8 descriptors if expanded.
    let mut yaml = String::from("domain: edge\ndescriptors:\n  - &d0 {key: k0}\n");
    for level in 1..=8 {
        let previous = format!("*d{}", level - 1);
        let children = [previous.as_str(); 10].join(", ");
        yaml.push_str(&format!(
            "  - &d{level} {{key: k{level}, descriptors: [{children}]}}\n"
        ));
    }
    let errors = errors(&yaml);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("t.yaml:")
            && errors[0].ends_with(": more than 100000 descriptors in all files"),
        "{errors:?}"
    );
}
