//! Which configured node a request descriptor lands on, and the `/rlconfig`-style dump.

use super::limits;
use crate::limits::{Limits, Source};

const CONFIG: &str = "domain: edge
descriptors:
  - key: path
    value: /api/*/users
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/v1/users
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: anything
    value: '*'
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: api_key
    value: vip
    descriptors:
      - key: path
        value: /vip
        rate_limit: {unit: second, requests_per_unit: 6}
  - key: api_key
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 7}
  - key: internal
";

/// Asserts which node `entries` end on (by its path), or that the walk fails.
fn check(limits: &Limits, entries: &[(&str, &str)], expected: Option<&str>) {
    let node = limits
        .domain("edge")
        .and_then(|d| d.lookup(entries.iter().copied()));
    assert_eq!(node.map(|n| &*n.path), expected, "request {entries:?}");
}

#[test]
fn exact_beats_wildcard_beats_default() {
    let limits = limits(CONFIG);
    type Request<'a> = &'a [(&'a str, &'a str)];
    let table: &[(Request, Option<&str>)] = &[
        (
            &[("path", "/api/v1/users")],
            Some("edge > path=/api/v1/users"),
        ),
        (
            &[("path", "/api/v2/users")],
            Some("edge > path=/api/*/users"),
        ),
        (&[("path", "/api/v2/orders")], Some("edge > path=/api/*")),
        (&[("path", "/api/")], Some("edge > path=/api/*")),
        (&[("path", "/other")], Some("edge > path")),
        (&[("path", "")], Some("edge > path")),
        (&[("anything", "")], Some("edge > anything=*")),
        (&[("anything", "x y z")], Some("edge > anything=*")),
        (&[("unknown", "x")], None),
        (&[], None),
    ];
    for (entries, expected) in table {
        check(&limits, entries, *expected);
    }
}

#[test]
fn the_matched_node_carries_its_limit() {
    let limits = limits(CONFIG);
    let requests_per_unit = |entries: &[(&str, &str)]| {
        let node = limits
            .domain("edge")
            .and_then(|d| d.lookup(entries.iter().copied()));
        node.and_then(|n| n.limits.first())
            .and_then(|l| l.rate)
            .map(|r| r.requests_per_unit)
    };
    assert_eq!(requests_per_unit(&[("path", "/api/v1/users")]), Some(3));
    assert_eq!(requests_per_unit(&[("path", "/api/v9/users")]), Some(1));
    assert_eq!(
        requests_per_unit(&[("api_key", "k1"), ("path", "/p")]),
        Some(7)
    );
    assert_eq!(
        requests_per_unit(&[("api_key", "vip"), ("path", "/vip")]),
        Some(6)
    );
}

#[test]
fn first_wildcard_in_config_order_wins() {
    // The same two patterns in the other order: now the broader one comes first and wins.
    let limits = limits(
        "domain: edge
descriptors:
  - {key: path, value: /api/*}
  - {key: path, value: /api/*/users}
  - {key: path, value: '*/users'}
",
    );
    check(
        &limits,
        &[("path", "/api/v2/users")],
        Some("edge > path=/api/*"),
    );
    check(
        &limits,
        &[("path", "/web/users")],
        Some("edge > path=*/users"),
    );
    check(&limits, &[("path", "/web/orders")], None);
}

#[test]
fn no_backtracking_once_a_branch_is_chosen() {
    let limits = limits(CONFIG);
    // `vip` picks the exact branch, which has no `/other` child; the default `api_key`
    // branch would have matched, but the walk does not go back.
    check(&limits, &[("api_key", "vip"), ("path", "/other")], None);
    check(
        &limits,
        &[("api_key", "vip"), ("path", "/vip")],
        Some("edge > api_key=vip > path=/vip"),
    );
    check(
        &limits,
        &[("api_key", "k1"), ("path", "/other")],
        Some("edge > api_key > path"),
    );
}

#[test]
fn the_walk_must_consume_every_entry() {
    let limits = limits(CONFIG);
    // Longer than any configured path: no node.
    check(&limits, &[("path", "/other"), ("extra", "x")], None);
    // Shorter: the walk ends on an intermediate node, which has no limits of its own.
    check(&limits, &[("api_key", "k1")], Some("edge > api_key"));
    let node = limits
        .domain("edge")
        .and_then(|d| d.lookup([("api_key", "k1")]));
    assert_eq!(node.map(|n| n.limits.len()), Some(0));
}

#[test]
fn an_entry_without_limit_or_children_is_an_allow_list_node() {
    let limits = limits(CONFIG);
    let node = limits
        .domain("edge")
        .and_then(|d| d.lookup([("internal", "svc")]));
    assert_eq!(
        node.map(|n| (&*n.path, n.limits.len())),
        Some(("edge > internal", 0))
    );
    check(&limits, &[("internal", "svc"), ("path", "/x")], None);
}

#[test]
fn domains_are_separate_and_listed_in_name_order() {
    let source = |name: &str, domain: &str| Source {
        name: name.into(),
        text: format!(
            "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute}}\n"
        ),
    };
    let limits = Limits::from_sources(&[source("1.yaml", "zeta"), source("2.yaml", "alpha")]);
    let limits = match limits {
        Ok(limits) => limits,
        Err(errors) => panic!("{errors}"),
    };
    assert_eq!(
        limits.domains().map(|d| d.name()).collect::<Vec<_>>(),
        ["alpha", "zeta"]
    );
    assert!(limits.domain("beta").is_none());
    assert_eq!(
        limits
            .domain("zeta")
            .and_then(|d| d.lookup([("k", "v")]))
            .map(|n| &*n.path),
        Some("zeta > k")
    );
    assert_eq!(limits.limit_count(), 2);
}

#[test]
fn dump_lists_every_limit_like_rlconfig() {
    let limits = limits(
        "domain: edge
descriptors:
  - key: api_key
    value: vip
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 8, max_wait: 50ms}
      - {unit: day, requests_per_unit: 1000, name: daily, replaces: [{name: a}, {name: b}]}
    descriptors:
      - key: path
        value: /api/*
        rate_limit: {unlimited: true}
  - key: internal
",
    );
    assert_eq!(
        limits.to_string(),
        "edge.api_key_vip: unit=SECOND requests_per_unit=10, algorithm=fixed_window, shadow_mode=true
edge.api_key: unit=SECOND requests_per_unit=5, algorithm=token_bucket, burst=8, max_wait=50ms, max_queue=1000, shadow_mode=false
edge.api_key: unit=DAY requests_per_unit=1000, algorithm=fixed_window, name=daily, replaces=a|b, shadow_mode=false
edge.api_key.path_/api/*: unlimited, shadow_mode=false
"
    );
    assert_eq!(Limits::default().to_string(), "");
}

/// Which limits of a matched entry apply (`Node::applies`, shared by the limiter and RLQS):
/// `replaces` drops the named limits (of this entry or of another matched one), an
/// `unlimited` limit makes the descriptor uncounted, and an entry without limits (or whose
/// limits were all replaced) has nothing.
#[test]
fn applies_drops_replaced_limits_and_sees_unlimited_and_nothing() {
    use crate::limits::{Applies, replaced_names};
    let limits = limits(
        "domain: d
descriptors:
  - key: user
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 5}
      - {name: daily, unit: day, requests_per_unit: 1000}
  - key: vip
    rate_limit: {unit: day, requests_per_unit: 10000, replaces: [{name: daily}]}
  - key: free
    rate_limit: {unlimited: true}
  - key: parent
    descriptors:
      - key: child
        rate_limit: {unit: second, requests_per_unit: 1}
",
    );
    let domain = limits.domain("d").expect("domain d");
    let node = |key: &str| domain.lookup([(key, "x")]).expect("matched");
    let names = |applies: Applies<'_>| match applies {
        Applies::Limits(limits) => limits
            .iter()
            .map(|limit| limit.name.as_deref().unwrap_or("-").to_owned())
            .collect::<Vec<_>>(),
        other => panic!("limits expected, got {other:?}"),
    };
    let user = node("user");
    assert_eq!(
        names(user.applies(&replaced_names([user]))),
        ["burst", "daily"]
    );
    // A request matching user and vip: vip's limit replaces user's daily one.
    let vip = node("vip");
    let replaced = replaced_names([user, vip]);
    assert_eq!(&*replaced, ["daily"]);
    assert_eq!(names(user.applies(&replaced)), ["burst"]);
    assert_eq!(node("free").applies(&[]), Applies::Unlimited);
    assert_eq!(node("parent").applies(&[]), Applies::Nothing);
    assert_eq!(
        Applies::of(
            user.limits
                .iter()
                .filter(|limit| limit.name.as_deref() == Some("x"))
        ),
        Applies::Nothing
    );
}
