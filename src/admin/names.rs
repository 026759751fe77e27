//! Counter names: the descriptor values behind this node's live counters, so that
//! `GET /counters/{domain}` can list them (a counter's key is a hash and cannot be printed
//! back; see `ARCHITECTURE.md`, "Keys").
//!
//! Opt-in (`--counter-names N`): without it nothing is kept and the limiter pays one branch
//! per request. With it, [`CounterNames`] is the limiter's [`Observer`]: told of a decided
//! descriptor only when its counters were full before the request (`remaining + cost >=
//! capacity`: a new key, or one that had fully recovered), wherever they live (in cluster
//! mode, a node names the counters of the requests it received, its own and those other
//! nodes own); a noted name costs one read-locked probe of a sharded map afterwards, and a
//! new one a short write lock. So a hot key costs nothing, and a key costs at most one
//! probe per window.
//!
//! [`CounterNames::counters`] lists the named counters this node holds;
//! [`cluster_counters`] lists names gathered from every member (one counter may be named on
//! several), each once, with its state read from its owner. Both sort a page by use.
//!
//! Invariants:
//! - Bounded: at most `capacity` names, each at most [`MAX_NAME_BYTES`] of text; names
//!   that do not fit are dropped (and counted) until a sweep makes room.
//! - A name does not keep a counter alive and says nothing by itself: listing and sweeping
//!   read the counter's state through [`Limiter::explain`] (cost 0, the same planning as a
//!   request; from the owner in cluster mode), and the sweep ([`CounterNames::sweep`])
//!   forgets names whose counters are back to full or no longer match a limit. Names whose
//!   owner cannot answer are kept until it can.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crate::error::Error;
use crate::key::fmix64;

use crate::limiter::{DescriptorExplanation, Limiter, Observer, Query};

/// The longest descriptor (domain, keys and values) whose name is kept.
pub const MAX_NAME_BYTES: usize = 512;
/// Names listed per page at most.
pub const MAX_PAGE: usize = 1000;
/// Descriptors explained per query (the limiter's bound on descriptors per query).
const CHUNK: usize = crate::limiter::bounds::MAX_DESCRIPTORS;
const MAP_SHARDS: usize = 16;

/// One counter's descriptor.
#[derive(Debug, PartialEq, Eq)]
pub struct CounterName {
    pub domain: Box<str>,
    pub entries: Box<[(Box<str>, Box<str>)]>,
}

/// One shard of the map: names by route hash.
type NameMap = RwLock<HashMap<u64, Arc<CounterName>>>;

/// The bounded map of counter names, by route hash.
#[derive(Debug)]
pub struct CounterNames {
    capacity: usize,
    len: AtomicUsize,
    dropped: AtomicU64,
    maps: Box<[NameMap]>,
}

/// How full the map is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamesFigures {
    pub kept: usize,
    pub capacity: usize,
    /// Names not kept because the map was full or the descriptor too long.
    pub dropped: u64,
}

impl CounterNames {
    pub fn new(capacity: usize) -> CounterNames {
        CounterNames {
            capacity,
            len: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            maps: (0..MAP_SHARDS)
                .map(|_| RwLock::new(HashMap::new()))
                .collect(),
        }
    }

    fn map(&self, route: u64) -> &NameMap {
        // `usize` -> `u64` is lossless on every supported target, and the result is small.
        &self.maps[(fmix64(route) % MAP_SHARDS as u64) as usize]
    }

    /// Keeps the name of `route` unless it is known already, too long, or the map is full.
    pub fn note<'e>(
        &self,
        route: u64,
        domain: &str,
        entries: impl Iterator<Item = (&'e str, &'e str)> + Clone,
    ) {
        let map = self.map(route);
        // A poisoned lock would be a bug elsewhere; the map stays usable.
        if map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&route)
        {
            return;
        }
        let bytes: usize = domain.len()
            + entries
                .clone()
                .map(|(key, value)| key.len() + value.len())
                .sum::<usize>();
        if bytes > MAX_NAME_BYTES {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Reserve a place first, so racing notes never overfill the map.
        if self.len.fetch_add(1, Ordering::Relaxed) >= self.capacity {
            self.len.fetch_sub(1, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let name = Arc::new(CounterName {
            domain: Box::from(domain),
            entries: entries
                .map(|(key, value)| (Box::from(key), Box::from(value)))
                .collect(),
        });
        let mut map = map.write().unwrap_or_else(PoisonError::into_inner);
        if map.insert(route, name).is_some() {
            // Another request noted it meanwhile: it was counted twice.
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Up to `limit` names of `domain` with routes above `after`, in route order, and
    /// whether more follow.
    pub fn page(
        &self,
        domain: &str,
        after: Option<u64>,
        limit: usize,
    ) -> (Vec<(u64, Arc<CounterName>)>, bool) {
        let mut found: Vec<(u64, Arc<CounterName>)> = Vec::new();
        for map in self.maps.iter() {
            let map = map.read().unwrap_or_else(PoisonError::into_inner);
            found.extend(
                map.iter()
                    .filter(|(route, name)| {
                        &*name.domain == domain && after.is_none_or(|after| **route > after)
                    })
                    .map(|(route, name)| (*route, Arc::clone(name))),
            );
        }
        found.sort_unstable_by_key(|(route, _)| *route);
        let more = found.len() > limit;
        found.truncate(limit);
        (found, more)
    }

    /// Every name, for the sweep.
    fn all(&self) -> Vec<(u64, Arc<CounterName>)> {
        let mut out = Vec::with_capacity(self.len.load(Ordering::Relaxed));
        for map in self.maps.iter() {
            let map = map.read().unwrap_or_else(PoisonError::into_inner);
            out.extend(map.iter().map(|(route, name)| (*route, Arc::clone(name))));
        }
        out
    }

    /// Forgets `routes`.
    fn forget(&self, routes: &[u64]) {
        for route in routes {
            let mut map = self
                .map(*route)
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if map.remove(route).is_some() {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    pub fn figures(&self) -> NamesFigures {
        NamesFigures {
            kept: self.len.load(Ordering::Relaxed).min(self.capacity),
            capacity: self.capacity,
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

/// One listed counter: its descriptor and what it meets now.
#[derive(Debug)]
pub struct ListedCounter {
    pub route: u64,
    pub name: Arc<CounterName>,
    pub explained: DescriptorExplanation,
}

/// Counter names with their routes.
type NameList = Vec<(u64, Arc<CounterName>)>;

/// Counter names with their routes and what their counters meet.
type Explained = Vec<(u64, Arc<CounterName>, DescriptorExplanation)>;

/// A page of [`cluster_counters`].
#[derive(Debug)]
pub struct MergedPage {
    pub counters: Vec<ListedCounter>,
    /// Where the next page starts (`after`), when there is one.
    pub next: Option<u64>,
    /// The owners (`None`: this node's store) that could not tell their counters' state,
    /// and why; their counters are not in the page.
    pub unanswered: Vec<(Option<Arc<str>>, Error)>,
}

/// A page of [`CounterNames::counters`].
#[derive(Debug)]
pub struct CounterPage {
    pub counters: Vec<ListedCounter>,
    /// Where the next page starts (`after`), when there is one.
    pub next: Option<u64>,
    pub figures: NamesFigures,
}

impl Observer for CounterNames {
    fn fresh(&self, route: u64, domain: &str, entries: &[(&str, &str)]) {
        self.note(route, domain, entries.iter().copied());
    }

    fn reset(&self, route: u64) {
        self.forget(&[route]);
    }
}

impl CounterNames {
    /// Up to `limit` (at most [`MAX_PAGE`]) counters of `domain` held on this node with
    /// something counted, after the route `after` (pages follow the routes), the page
    /// sorted by use ([`sort_by_use`]), their state read through `limiter`. Consumes
    /// nothing.
    pub async fn counters(
        &self,
        limiter: &Limiter,
        domain: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<CounterPage, Error> {
        let (page, more) = self.page(domain, after, limit.clamp(1, MAX_PAGE));
        let next = if more {
            page.last().map(|(route, _)| *route)
        } else {
            None
        };
        let mut counters = Vec::with_capacity(page.len());
        for chunk in page.chunks(CHUNK) {
            let explained = explain_names(limiter, chunk).await?;
            for ((route, name), explained) in chunk.iter().zip(explained) {
                if is_counted(&explained) && is_here(&explained) {
                    counters.push(ListedCounter {
                        route: *route,
                        name: Arc::clone(name),
                        explained,
                    });
                }
            }
        }
        sort_by_use(&mut counters);
        Ok(CounterPage {
            counters,
            next,
            figures: self.figures(),
        })
    }

    /// Forgets the names whose counters are back to full or match no limit any more, as
    /// their owners say (through `limiter`); returns how many were forgotten. Names whose
    /// owner cannot answer are kept, and the first such error is answered after the rest
    /// was swept.
    pub async fn sweep(&self, limiter: &Limiter) -> Result<usize, Error> {
        let mut all = self.all();
        let mut stale: Vec<u64> = Vec::new();
        let mut failed = None;
        // One query per domain, owner and chunk.
        all.sort_unstable_by(|(a, left), (b, right)| left.domain.cmp(&right.domain).then(a.cmp(b)));
        for group in all.chunk_by(|(_, left), (_, right)| left.domain == right.domain) {
            let (explained, unanswered) = explain_by_owner(limiter, group.to_vec()).await;
            stale.extend(
                explained
                    .iter()
                    .filter(|(_, _, explained)| !is_counted(explained))
                    .map(|(route, _, _)| *route),
            );
            if let Some((_, error)) = unanswered.into_iter().next() {
                failed.get_or_insert(error);
            }
        }
        self.forget(&stale);
        match failed {
            Some(error) => Err(error),
            None => Ok(stale.len()),
        }
    }
}

/// One page of a domain's counters across the cluster: `named` are the names this node and
/// the other members keep (each member's first page after the same cursor), `more` whether
/// any of them has more. Each counter is listed once, with its state read from its owner
/// (those with nothing counted are left out); a page holds the `limit` (at most
/// [`MAX_PAGE`]) first routes, sorted by use. The counters of an owner that cannot answer
/// are left out and the owner reported in `unanswered`. Consumes nothing.
pub async fn cluster_counters(
    limiter: &Limiter,
    mut named: Vec<(u64, Arc<CounterName>)>,
    more: bool,
    limit: usize,
) -> MergedPage {
    named.sort_unstable_by_key(|(route, _)| *route);
    named.dedup_by_key(|(route, _)| *route);
    let limit = limit.clamp(1, MAX_PAGE);
    let more = more || named.len() > limit;
    named.truncate(limit);
    let next = if more {
        named.last().map(|(route, _)| *route)
    } else {
        None
    };
    let (explained, unanswered) = explain_by_owner(limiter, named).await;
    let mut counters: Vec<ListedCounter> = explained
        .into_iter()
        .filter(|(_, _, explained)| is_counted(explained))
        .map(|(route, name, explained)| ListedCounter {
            route,
            name,
            explained,
        })
        .collect();
    sort_by_use(&mut counters);
    MergedPage {
        counters,
        next,
        unanswered,
    }
}

/// Explains `named` (one domain) owner by owner, so an owner that cannot answer costs only
/// its own counters: the names explained, and per owner that could not answer (`None`:
/// this node's store), why.
async fn explain_by_owner(
    limiter: &Limiter,
    named: NameList,
) -> (Explained, Vec<(Option<Arc<str>>, Error)>) {
    let mut explained = Vec::with_capacity(named.len());
    let mut unanswered = Vec::new();
    for (owner, group) in by_owner(limiter, named) {
        for chunk in group.chunks(CHUNK) {
            match explain_names(limiter, chunk).await {
                Ok(answers) => explained.extend(
                    chunk
                        .iter()
                        .zip(answers)
                        .map(|((route, name), answer)| (*route, Arc::clone(name), answer)),
                ),
                Err(error) => {
                    unanswered.push((owner, error));
                    break;
                }
            }
        }
    }
    (explained, unanswered)
}

/// `named` (one domain) grouped by the node owning their counters (`None`: this store has
/// no owners), in order of first appearance.
fn by_owner(limiter: &Limiter, named: NameList) -> Vec<(Option<Arc<str>>, NameList)> {
    let mut groups: Vec<(Option<Arc<str>>, NameList)> = Vec::new();
    for (route, name) in named {
        let owner = limiter.placement(route).owner;
        match groups.iter_mut().find(|(other, _)| *other == owner) {
            Some((_, group)) => group.push((route, name)),
            None => groups.push((owner, vec![(route, name)])),
        }
    }
    groups
}

/// Explains the descriptors of `chunk` (one domain, at most [`CHUNK`]) with cost 0.
async fn explain_names(
    limiter: &Limiter,
    chunk: &[(u64, Arc<CounterName>)],
) -> Result<Vec<DescriptorExplanation>, Error> {
    let Some((_, first)) = chunk.first() else {
        return Ok(Vec::new());
    };
    let mut query = Query::new(&first.domain);
    for (_, name) in chunk {
        let entries = name.entries.iter().map(|(key, value)| (&**key, &**value));
        query.descriptor(entries, 0);
    }
    Ok(limiter.explain(&query).await?.descriptors)
}

/// A counter worth listing: it matches a limit and has something counted.
fn is_counted(explained: &DescriptorExplanation) -> bool {
    explained.matched.is_limited() && explained.limits.iter().any(|limit| limit.used > 0)
}

/// A counter this node holds (or reaches itself, like Redis).
fn is_here(explained: &DescriptorExplanation) -> bool {
    explained
        .placement
        .as_ref()
        .is_none_or(|placement| placement.local)
}

/// Most used first: the largest share of a limit's capacity used, then the most hits used
/// on one limit, then route order (so equal counters keep a stable order).
fn sort_by_use(counters: &mut [ListedCounter]) {
    let usage = |listed: &ListedCounter| {
        let limits = &listed.explained.limits;
        let share = limits
            .iter()
            .map(|limit| limit.used as f64 / limit.rate.capacity().max(1) as f64)
            .fold(0.0, f64::max);
        let used = limits.iter().map(|limit| limit.used).max().unwrap_or(0);
        (share, used)
    };
    counters.sort_by(|left, right| {
        let ((left_share, left_used), (right_share, right_used)) = (usage(left), usage(right));
        right_share
            .total_cmp(&left_share)
            .then(right_used.cmp(&left_used))
            .then(left.route.cmp(&right.route))
    });
}

#[cfg(test)]
mod tests;
