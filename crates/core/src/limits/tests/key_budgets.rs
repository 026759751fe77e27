//! `max_keys` and rule tags: what the in-memory store keeps each rule's keys within.

use super::{errors, limits};

const TWO_RULES: &str = "domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 5, max_keys: 2000}
      - {name: daily, unit: day, requests_per_unit: 1000}
";

fn tags(limits: &super::Limits, entries: &[(&str, &str)]) -> Vec<u32> {
    let domain = limits.domain("edge").expect("domain");
    let walk = domain.walk(entries.iter().copied()).expect("matches");
    walk.node().limits.iter().map(|limit| limit.rule).collect()
}

#[test]
fn each_limit_has_its_own_rule_tag_named_by_its_place_and_kept_across_reloads() {
    let limits = limits(TWO_RULES);
    let address = tags(&limits, &[("remote_address", "10.0.0.1")]);
    let api_key = tags(&limits, &[("api_key", "k1")]);
    assert_eq!(address.len(), 1);
    assert_eq!(api_key.len(), 2);
    let all = [address[0], api_key[0], api_key[1]];
    assert!(
        all.iter().all(|&tag| tag != 0),
        "0 is no rule's tag: {all:?}"
    );
    assert!(
        all[0] != all[1] && all[1] != all[2] && all[0] != all[2],
        "{all:?}"
    );
    let rule = |tag| limits.rule(tag).expect("a configured rule").clone();
    assert_eq!(&*rule(address[0]).name, "edge > remote_address");
    assert_eq!(rule(address[0]).max_keys, None);
    assert_eq!(
        &*rule(api_key[0]).name,
        "edge > api_key [second fixed_window]"
    );
    assert_eq!(rule(api_key[0]).max_keys, Some(2000));
    assert_eq!(&*rule(api_key[1]).name, "edge > api_key [daily]");
    // The same files loaded again (a reload, another node) tag the same rules alike, so
    // live keys keep counting against the right budget.
    let again = super::limits(&TWO_RULES.replace("requests_per_unit: 60", "requests_per_unit: 90"));
    assert_eq!(tags(&again, &[("remote_address", "x")]), address);
    assert_eq!(tags(&again, &[("api_key", "x")]), api_key);
}

#[test]
fn max_keys_is_a_whole_number_of_at_least_one_on_a_limit_with_a_rate() {
    let problems = errors(
        "domain: edge
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1, max_keys: 0}
  - key: b
    rate_limit: {unlimited: true, max_keys: 10}
",
    );
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].contains("descriptors[0] (key a) > rate_limit.max_keys")
            && problems[0].contains("max_keys must be at least 1"),
        "{problems:#?}"
    );
    assert!(
        problems[1].contains("max_keys must not be set when unlimited is true"),
        "{problems:#?}"
    );
    let negative = errors(
        "domain: edge
descriptors:
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 1, max_keys: -3}
",
    );
    assert!(
        negative[0].starts_with("t.yaml:4:54: ") && negative[0].contains("whole number"),
        "the place of the bad number: {negative:#?}"
    );
}
