//! (pure) The stat keys of the reference service: the part of a stat's name between
//! `ratelimit.service.rate_limit.` and the counter (`.total_hits`), as
//! envoyproxy/ratelimit's `config_impl.go` builds them.
//!
//! - A configured limit: the domain, then each configured entry from the root to the
//!   limit's, as `key` or `key_value` (a wildcard's pattern as its value: `path_/api*`),
//!   joined with dots (`edge.api_key_vip.path`). Fixed per limit: built once per limits
//!   snapshot.
//! - `detailed_metric: true` on the matched entry: the request's entries, each
//!   `key_value` with the request's value (`key_` when it is empty), an entry matched by a
//!   `share_threshold` wildcard as its pattern.
//! - `value_to_metric: true` on an entry matched by its default (no value) or by a
//!   wildcard without `share_threshold`: that entry as `key_value` with the request's value;
//!   every other entry as configured.
//! - A request's own limit (a descriptor's `limit`): the request's entries, `key_value`, or
//!   `key` when the value is empty.

use std::collections::HashMap;

use crate::limits::{Node, Step};

/// How a configured entry matched, and its part of a configured limit's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub key: Box<str>,
    pub step: Step,
}

impl Segment {
    /// `key`, or `key_value` for an entry with a value (a wildcard's pattern).
    pub fn configured(&self) -> String {
        match &self.step {
            Step::Exact(value) | Step::Wildcard(value) => format!("{}_{value}", self.key),
            Step::Default => self.key.to_string(),
        }
    }
}

/// Every node of a limits snapshot with its [`Segment`], by the node's address (the
/// snapshot is kept alive beside it, so addresses are stable).
pub type Segments = HashMap<usize, Segment>;

/// A node's address, the key of [`Segments`].
pub fn node_id(node: &Node) -> usize {
    std::ptr::from_ref(node) as usize
}

/// A configured limit's key: `domain` and its entries from the root.
pub fn limit_key<'a>(domain: &str, path: impl IntoIterator<Item = &'a Segment>) -> String {
    let mut key = domain.to_owned();
    for segment in path {
        key.push('.');
        key.push_str(&segment.configured());
    }
    key
}

/// The key of a `detailed_metric` limit for one request's entries.
pub fn detailed_key(domain: &str, entries: &[(&str, &str)], steps: &[&Node]) -> String {
    let mut key = domain.to_owned();
    for (index, (name, value)) in entries.iter().enumerate() {
        let shared = steps.get(index).and_then(|node| node.shared.as_deref());
        key.push('.');
        key.push_str(name);
        key.push('_');
        key.push_str(shared.unwrap_or(value));
    }
    key
}

/// The key of a limit reached through entries with `value_to_metric: true`.
pub fn value_key(
    domain: &str,
    entries: &[(&str, &str)],
    steps: &[&Node],
    segments: &Segments,
) -> String {
    let mut key = domain.to_owned();
    for (index, (name, value)) in entries.iter().enumerate() {
        key.push('.');
        let node = steps.get(index);
        let segment = node.and_then(|node| segments.get(&node_id(node)));
        let (Some(node), Some(segment)) = (node, segment) else {
            key.push_str(name);
            continue;
        };
        let request_value = node.value_to_metric
            && node.shared.is_none()
            && !matches!(segment.step, Step::Exact(_));
        if request_value {
            push_pair(&mut key, name, value);
        } else {
            key.push_str(&segment.configured());
        }
    }
    key
}

/// The key of a request's own limit.
pub fn override_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut key = domain.to_owned();
    for (name, value) in entries {
        key.push('.');
        push_pair(&mut key, name, value);
    }
    key
}

/// `key_value`, or `key` for an empty value.
fn push_pair(key: &mut String, name: &str, value: &str) {
    key.push_str(name);
    if !value.is_empty() {
        key.push('_');
        key.push_str(value);
    }
}
