//! What a quota bucket's limit is: its id read as a descriptor of the limits domain, looked
//! up in the compiled limits exactly as `ShouldRateLimit` looks a descriptor up. Pure.
//!
//! The mapping (docs/rlqs.md): the report's `domain` is the limits domain; the bucket id's
//! pairs, ordered by key (byte order), are the descriptor's entries. So the bucket
//! `{"path": "/a", "api_key": "alice"}` is the descriptor `[(api_key, alice), (path, /a)]`.
//! Values, wildcards and defaults match as in the limits files; then
//! - which limits apply is `Node::applies`, as for `ShouldRateLimit`: no limit (no rule,
//!   a rule without limits, or all replaced) -> allow all, as `ShouldRateLimit` answers
//!   OK; any `unlimited: true` limit -> allow all;
//! - a limit with `requests_per_unit: 0` -> deny all;
//! - `shadow_mode` (the rule's or the server's) -> allow all, the would-be denials counted;
//! - several limits -> the tightest long-run rate wins, after `replaces` dropped the limits
//!   the others name.

use crate::algorithm::Rate;
use crate::limits::{Applies, Domain, replaced_names};

/// A bucket id as plain pairs, ordered by key: the descriptor it is read as.
pub type BucketKey = Box<[(Box<str>, Box<str>)]>;

/// What a bucket's limits say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The domain is not configured: the documented fallback (allow all), counted.
    UnknownDomain,
    /// No limit applies, or one is `unlimited`.
    AllowAll,
    /// `requests_per_unit: 0`.
    DenyAll,
    /// A limit to divide; `shadow`: only counted, never enforced.
    Limited { rate: Rate, shadow: bool },
}

/// The rule for `bucket` in `domain` (`None`: the domain is not configured);
/// `shadow_everywhere` is the server's `--shadow-mode`.
pub fn resolve(domain: Option<&Domain>, bucket: &BucketKey, shadow_everywhere: bool) -> Rule {
    let Some(domain) = domain else {
        return Rule::UnknownDomain;
    };
    let entries = bucket.iter().map(|(key, value)| (&**key, &**value));
    let Some(node) = domain.lookup(entries) else {
        return Rule::AllowAll;
    };
    // One bucket is one descriptor: the names its own limits replace are all there are.
    let limits = match node.applies(&replaced_names([node])) {
        Applies::Nothing | Applies::Unlimited => return Rule::AllowAll,
        Applies::Limits(limits) => limits,
    };
    let tightest = limits.iter().filter_map(|limit| limit.rate).min_by(|a, b| {
        // a.rpu / a.window < b.rpu / b.window, compared without division; a smaller burst
        // breaks a tie.
        let left = u128::from(a.requests_per_unit) * u128::from(b.window_seconds());
        let right = u128::from(b.requests_per_unit) * u128::from(a.window_seconds());
        left.cmp(&right).then(a.burst.cmp(&b.burst))
    });
    match tightest {
        None => Rule::AllowAll,
        Some(rate) if rate.requests_per_unit == 0 => Rule::DenyAll,
        Some(rate) => Rule::Limited {
            rate,
            shadow: node.shadow_mode || shadow_everywhere,
        },
    }
}

/// `pairs` as a bucket key: ordered by key (a key given twice cannot happen in a protobuf
/// map, so the order is total).
pub fn bucket_key<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> BucketKey {
    let mut pairs: Vec<(Box<str>, Box<str>)> = pairs
        .into_iter()
        .map(|(key, value)| (Box::from(key), Box::from(value)))
        .collect();
    pairs.sort_unstable();
    pairs.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Unit};
    use crate::limits::Limits;

    const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    value: free
    rate_limit: { unit: minute, requests_per_unit: 60 }
    descriptors:
      - key: path
        rate_limit: { unit: second, requests_per_unit: 5 }
  - key: api_key
    value: vip
    rate_limit: { unlimited: true }
  - key: api_key
    value: banned
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: api_key
    value: trial
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: api_key
    value: team*
    rate_limits:
      - { name: per_second, unit: second, requests_per_unit: 10 }
      - { name: per_minute, unit: minute, requests_per_unit: 300 }
  - key: api_key
    value: gold
    rate_limits:
      - { name: base, unit: second, requests_per_unit: 1 }
      - { name: boost, unit: minute, requests_per_unit: 3000, replaces: [{ name: base }] }
  - key: tenant
";

    fn check(pairs: &[(&str, &str)], expected: Rule) {
        let limits = Limits::parse_str("edge.yaml", LIMITS).expect("valid limits");
        let key = bucket_key(pairs.iter().copied());
        assert_eq!(
            resolve(limits.domain("edge"), &key, false),
            expected,
            "{pairs:?}"
        );
    }

    fn limited(requests_per_unit: u32, unit: Unit, shadow: bool) -> Rule {
        Rule::Limited {
            rate: Rate::new(Algorithm::FixedWindow, requests_per_unit, unit, None),
            shadow,
        }
    }

    #[test]
    fn a_bucket_reads_as_a_descriptor_ordered_by_key() {
        check(&[("api_key", "free")], limited(60, Unit::Minute, false));
        // `api_key` sorts before `path`, whatever order the map gave.
        check(
            &[("path", "/a"), ("api_key", "free")],
            limited(5, Unit::Second, false),
        );
        check(&[("api_key", "vip")], Rule::AllowAll);
        check(&[("api_key", "banned")], Rule::DenyAll);
        check(&[("api_key", "trial")], limited(100, Unit::Hour, true));
        // The tightest of several limits: 300 per minute (5 per second) beats 10 per second.
        check(&[("api_key", "team-a")], limited(300, Unit::Minute, false));
        // `replaces` drops `base`, leaving `boost`.
        check(&[("api_key", "gold")], limited(3000, Unit::Minute, false));
        // No rule, or a rule without limits: allow all.
        check(&[("api_key", "nobody")], Rule::AllowAll);
        check(&[("tenant", "x")], Rule::AllowAll);
        check(&[], Rule::AllowAll);
        let limits = Limits::parse_str("edge.yaml", LIMITS).expect("valid limits");
        let key = bucket_key([("api_key", "free")]);
        assert_eq!(resolve(None, &key, false), Rule::UnknownDomain);
        assert_eq!(
            resolve(limits.domain("edge"), &key, true),
            limited(60, Unit::Minute, true)
        );
    }
}
