//! The rate limit header fields a verdict advertises, in either style the front ends can
//! send ([`HeaderStyle`]): draft-03's three `RateLimit-Limit`, `RateLimit-Remaining`,
//! `RateLimit-Reset` integers (the reference service's, names configurable), or the
//! current IETF draft's (draft-ietf-httpapi-ratelimit-headers-08 and later) two structured
//! fields, Lists of Items (RFC 9651):
//!
//! ```text
//! RateLimit-Policy: "per_key";q=100;w=60, "10/second";q=10;w=1
//! RateLimit: "per_key";r=0;t=42, "10/second";r=9;t=1
//! ```
//!
//! One policy per limit reported by the verdict's descriptors, the tightest (fewest hits
//! left) first, each limit once. A policy is named by the limit's `name` (when it is a
//! printable ASCII string), else `{requests_per_unit}/{unit}` (`{requests_per_unit}/{window}`
//! with a `unit_multiplier`: `"5/10s"`); `q` is `requests_per_unit`, `w` the window in seconds
//! (`unit_multiplier` units), `r` the hits left and `t` the seconds until the limit has fully
//! recovered, rounded up.
//!
//! [`HeaderNames`] are the draft-03 names (the reference service's `LIMIT_*_HEADER`
//! settings); the IETF fields have fixed names.
//!
//! Invariant: every value produced here is a valid structured field (names are escaped,
//! integers are far below the 15-digit bound).

use std::fmt::Write;
use std::sync::Arc;

use smallvec::SmallVec;

use super::{Limited, Status, Verdict};
use crate::algorithm::NANOS_PER_SEC;

/// Which rate limit header fields front ends send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeaderStyle {
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` of the tightest limit
    /// (draft-03, the reference service's), under the configured [`HeaderNames`].
    #[default]
    Draft03,
    /// `RateLimit-Policy` and `RateLimit` structured fields (the current IETF draft).
    Ietf,
}

/// The names of the three rate limit headers (the reference service's `LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: Arc<str>,
    pub remaining: Arc<str>,
    pub reset: Arc<str>,
}

impl Default for HeaderNames {
    fn default() -> HeaderNames {
        HeaderNames {
            limit: Arc::from("RateLimit-Limit"),
            remaining: Arc::from("RateLimit-Remaining"),
            reset: Arc::from("RateLimit-Reset"),
        }
    }
}

impl HeaderNames {
    /// Checks that `name` can be an HTTP header name (an RFC 9110 token), for the flags.
    pub fn check(name: &str) -> Result<(), String> {
        let token = |byte: u8| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte);
        if name.is_empty() || name.len() > 128 || !name.bytes().all(token) {
            return Err(format!(
                "{name:?} is not a header name (1 to 128 letters, digits or !#$%&'*+-.^_`|~)"
            ));
        }
        Ok(())
    }
}

/// The name of the policy field.
pub const POLICY_HEADER: &str = "RateLimit-Policy";
/// The name of the current-state field.
pub const RATELIMIT_HEADER: &str = "RateLimit";

impl Verdict {
    /// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (seconds, rounded up)
    /// of the tightest descriptor, for every front end that answers with headers.
    pub fn rate_limit_headers<'n>(&self, names: &'n HeaderNames) -> Option<[(&'n str, String); 3]> {
        let tightest = self.tightest()?;
        let reset = u64::try_from(tightest.reset_after.as_nanos())
            .unwrap_or(u64::MAX)
            .div_ceil(crate::algorithm::NANOS_PER_SEC);
        Some([
            (&*names.limit, tightest.requests_per_unit.to_string()),
            (&*names.remaining, tightest.remaining.to_string()),
            (&*names.reset, reset.to_string()),
        ])
    }

    /// The limit to advertise in `RateLimit-*` headers: the one with the fewest hits left.
    pub fn tightest(&self) -> Option<&Limited> {
        self.statuses
            .iter()
            .filter_map(Status::limited)
            .reduce(|best, next| {
                if next.remaining < best.remaining {
                    next
                } else {
                    best
                }
            })
    }

    /// The rate limit headers of this verdict in `style` (none when no limit applied).
    pub fn headers<'n>(
        &self,
        style: HeaderStyle,
        names: &'n HeaderNames,
    ) -> SmallVec<[(&'n str, String); 3]> {
        match style {
            HeaderStyle::Draft03 => self
                .rate_limit_headers(names)
                .into_iter()
                .flatten()
                .collect(),
            HeaderStyle::Ietf => self.ietf_headers().into_iter().flatten().collect(),
        }
    }

    /// `RateLimit-Policy` and `RateLimit` for every limit reported, tightest first.
    pub fn ietf_headers(&self) -> Option<[(&'static str, String); 2]> {
        let mut limits: SmallVec<[(&Limited, String); 4]> = SmallVec::new();
        let mut reported: SmallVec<[&Limited; 4]> = self
            .statuses
            .iter()
            .filter_map(|status| status.limited())
            .collect();
        // Stable: among equals, the first descriptor's limit comes first.
        reported.sort_by_key(|limited| limited.remaining);
        for limited in reported {
            let name = policy_name(limited);
            if !limits.iter().any(|(_, seen)| *seen == name) {
                limits.push((limited, name));
            }
        }
        if limits.is_empty() {
            return None;
        }
        let (mut policy, mut state) = (String::new(), String::new());
        for (index, (limited, name)) in limits.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            let window = limited.window_seconds();
            let reset = u64::try_from(limited.reset_after.as_nanos())
                .unwrap_or(u64::MAX)
                .div_ceil(NANOS_PER_SEC);
            // Writing to a String cannot fail.
            let _ = write!(
                policy,
                "{separator}{name};q={};w={window}",
                limited.requests_per_unit
            );
            let _ = write!(state, "{separator}{name};r={};t={reset}", limited.remaining);
        }
        Some([(POLICY_HEADER, policy), (RATELIMIT_HEADER, state)])
    }
}

/// The policy's name as a structured-field String (quoted, `"` and `\` escaped).
fn policy_name(limited: &Limited) -> String {
    let printable =
        |name: &&str| !name.is_empty() && name.bytes().all(|byte| (0x20..0x7f).contains(&byte));
    let name = match limited.name.as_deref().filter(printable) {
        Some(name) => name.to_owned(),
        None => format!("{}/{}", limited.requests_per_unit, limited.window_name()),
    };
    let mut quoted = String::with_capacity(name.len() + 2);
    quoted.push('"');
    for char in name.chars() {
        if char == '"' || char == '\\' {
            quoted.push('\\');
        }
        quoted.push(char);
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use sfv::{BareItem, List, ListEntry, Parser};

    use super::*;
    use crate::algorithm::Unit;
    use crate::limiter::Status;

    fn limited(
        name: Option<&str>,
        limit: u32,
        remaining: u32,
        unit: Unit,
        reset: Duration,
    ) -> Status {
        Status::Limited(Limited {
            name: name.map(Arc::from),
            requests_per_unit: limit,
            unit,
            multiplier: 1,
            remaining,
            reset_after: reset,
            over: false,
            shadow: false,
            retry_after: None,
        })
    }

    /// `(name, [(param, integer)])` per list member, parsed by an RFC 9651 parser.
    fn parse(field: &str) -> Vec<(String, Vec<(String, i64)>)> {
        let list: List = Parser::new(field)
            .parse()
            .unwrap_or_else(|error| panic!("{field:?} is not a structured List: {error}"));
        list.iter()
            .map(|entry| {
                let ListEntry::Item(item) = entry else {
                    panic!("{field:?}: an inner list");
                };
                let BareItem::String(name) = &item.bare_item else {
                    panic!("{field:?}: the policy name is not a String");
                };
                let params = item
                    .params
                    .iter()
                    .map(|(key, value)| {
                        let BareItem::Integer(value) = value else {
                            panic!("{field:?}: {key} is not an Integer");
                        };
                        (key.as_str().to_owned(), i64::from(*value))
                    })
                    .collect();
                (name.as_str().to_owned(), params)
            })
            .collect()
    }

    fn params(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), *value))
            .collect()
    }

    #[test]
    fn every_limit_is_a_policy_tightest_first_and_parses_as_a_structured_list() {
        let verdict = Verdict {
            statuses: [
                limited(Some("per_key"), 100, 40, Unit::Minute, Duration::new(41, 5)),
                Status::NoLimit,
                limited(None, 10, 3, Unit::Second, Duration::from_millis(700)),
                Status::Unlimited,
                // The same limit reported by another descriptor: once, at its tightest.
                limited(
                    Some("per_key"),
                    100,
                    90,
                    Unit::Minute,
                    Duration::from_secs(6),
                ),
            ]
            .into_iter()
            .collect(),
            ..Verdict::default()
        };
        let [(policy_name, policy), (state_name, state)] =
            verdict.ietf_headers().expect("limits applied");
        assert_eq!((policy_name, state_name), ("RateLimit-Policy", "RateLimit"));
        assert_eq!(
            parse(&policy),
            [
                ("10/second".to_owned(), params(&[("q", 10), ("w", 1)])),
                ("per_key".to_owned(), params(&[("q", 100), ("w", 60)])),
            ]
        );
        assert_eq!(
            parse(&state),
            [
                ("10/second".to_owned(), params(&[("r", 3), ("t", 1)])),
                ("per_key".to_owned(), params(&[("r", 40), ("t", 42)])),
            ]
        );
        assert_eq!(state, r#""10/second";r=3;t=1, "per_key";r=40;t=42"#);
    }

    #[test]
    fn names_are_escaped_or_replaced_so_the_field_stays_valid() {
        let verdict = |name: &str| Verdict {
            statuses: [limited(Some(name), 5, 5, Unit::Day, Duration::ZERO)]
                .into_iter()
                .collect(),
            ..Verdict::default()
        };
        let [(_, policy), _] = verdict(r#"a "quoted" \ name"#)
            .ietf_headers()
            .expect("a limit");
        assert_eq!(parse(&policy)[0].0, r#"a "quoted" \ name"#);
        let [(_, policy), _] = verdict("naïve").ietf_headers().expect("a limit");
        assert_eq!(
            parse(&policy)[0],
            ("5/day".to_owned(), params(&[("q", 5), ("w", 86_400)]))
        );
        let none = Verdict {
            statuses: [Status::NoLimit].into_iter().collect(),
            ..Verdict::default()
        };
        assert!(none.ietf_headers().is_none());
        assert!(
            none.headers(HeaderStyle::Ietf, &HeaderNames::default())
                .is_empty()
        );
    }
}
