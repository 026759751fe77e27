//! Counter names across the cluster, for `GET /counters/{domain}?cluster=1`.
//!
//! Counter keys are hashes; the descriptor values behind them are kept (with
//! `--counter-names`) by the node that received the requests, whoever owns the counter, so
//! one counter may be named on several nodes, or only on nodes that do not own it. A node
//! serves its names to the others ([`NameSource`], installed by the server: this module
//! does not know where names are kept) with the peer call `Names`, and asks every other
//! ring member for theirs ([`Runtime::member_names`](super::Runtime::member_names));
//! merging and reading each counter's state from its owner is the limiter's job. This
//! module is the vocabulary and the bounds (it imports no sibling).
//!
//! Invariants: bounded: a page holds at most [`MAX_NAMES`] names of at most
//! [`MAX_NAME_BYTES`] each, checked on both sides; every member gets one call, all at
//! once, each within [`DEADLINE`]: a member that does not answer in time is reported,
//! never waited for longer.

use std::sync::Arc;
use std::time::Duration;

/// Names per page at most (the listing's page cap).
pub const MAX_NAMES: usize = 1000;
/// The longest descriptor (domain, keys and values) carried.
pub const MAX_NAME_BYTES: usize = 512;
/// Entries per name at most.
pub const MAX_ENTRIES: usize = 64;
/// How long a member's listing is waited for.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// One named counter: its route hash and its descriptor's entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub route: u64,
    pub entries: Vec<(Box<str>, Box<str>)>,
}

/// A page of one node's names of a domain, and how full its map of names is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamesPage {
    /// In route order.
    pub names: Vec<Named>,
    /// More names follow the last one.
    pub more: bool,
    pub kept: u64,
    pub capacity: u64,
    pub dropped: u64,
}

/// Where a node's names come from: `(domain, after, limit)` -> the page of names of
/// `domain` with routes above `after`, at most `limit`; `None` when the node keeps none.
pub type NameSource = Arc<dyn Fn(&str, Option<u64>, usize) -> Option<NamesPage> + Send + Sync>;

/// Whether `entries` (under `domain`) fit the bounds a name must keep.
pub fn fits(domain: &str, entries: &[(Box<str>, Box<str>)]) -> bool {
    let bytes: usize = domain.len()
        + entries
            .iter()
            .map(|(key, value)| key.len() + value.len())
            .sum::<usize>();
    !entries.is_empty() && entries.len() <= MAX_ENTRIES && bytes <= MAX_NAME_BYTES
}
