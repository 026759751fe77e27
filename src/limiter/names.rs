//! Counter names: the descriptor values behind this node's live counters, so that
//! `GET /counters/{domain}` can list them (a counter's key is a hash and cannot be printed
//! back; see `ARCHITECTURE.md`, "Keys").
//!
//! Opt-in (`--counter-names N`): without it the limiter keeps nothing and pays one branch
//! per request. With it, a decided descriptor is noted only when its counters were full
//! before the request (`remaining + cost >= capacity`: a new key, or one that had fully
//! recovered), and only when this node holds them; a noted name costs one read-locked
//! probe of a sharded map afterwards, and a new one a short write lock. So a hot key costs
//! nothing, and a key costs at most one probe per window.
//!
//! Invariants:
//! - Bounded: at most `capacity` names, each at most [`MAX_NAME_BYTES`] of text; names
//!   that do not fit are dropped (and counted) until a sweep makes room.
//! - A name does not keep a counter alive and says nothing by itself: listing and sweeping
//!   read the counter's state through [`Limiter::explain`] (cost 0, the same planning as a
//!   request), and the sweep ([`Limiter::sweep_counter_names`]) forgets names whose
//!   counters are back to full, no longer match a limit, or moved to another node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crate::error::Error;
use crate::key::fmix64;

use super::{DescriptorExplanation, Limiter, Query};

/// The longest descriptor (domain, keys and values) whose name is kept.
pub const MAX_NAME_BYTES: usize = 512;
/// Names listed per page at most.
pub const MAX_PAGE: usize = 1000;
/// Descriptors explained per query (the limiter's bound on descriptors per query).
const CHUNK: usize = super::bounds::MAX_DESCRIPTORS;
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
    pub(super) fn forget(&self, routes: &[u64]) {
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
    pub name: Arc<CounterName>,
    pub explained: DescriptorExplanation,
}

/// A page of [`Limiter::counters`].
#[derive(Debug)]
pub struct CounterPage {
    pub counters: Vec<ListedCounter>,
    /// Where the next page starts (`after`), when there is one.
    pub next: Option<u64>,
    pub figures: NamesFigures,
}

impl Limiter {
    /// The counter names this limiter keeps (`None` when it keeps none).
    pub fn counter_names(&self) -> Option<&CounterNames> {
        self.names.as_ref()
    }

    /// Notes the names of a decided query's descriptors whose counters were full before
    /// it (see the module docs).
    pub(super) fn note_names(
        &self,
        names: &CounterNames,
        query: &Query<'_>,
        plans: &[super::Plan<'_>],
        decisions: &[crate::check::Decision],
    ) {
        for (plan, descriptor) in plans.iter().zip(&query.descriptors) {
            let super::Plan::Checked {
                limits,
                node: Some(_),
                first,
                route,
                ..
            } = plan
            else {
                continue;
            };
            if descriptor.cost == 0 {
                continue;
            }
            let ours = decisions.get(*first..*first + limits.len()).unwrap_or(&[]);
            let was_full = ours.iter().zip(limits).all(|(decision, limit)| {
                decision.allowed
                    && limit.rate.is_some_and(|rate| {
                        u64::from(decision.remaining).saturating_add(descriptor.cost)
                            >= rate.capacity()
                    })
            });
            if was_full && self.store.placement(*route).local {
                names.note(*route, query.domain, descriptor.entries.iter().copied());
            }
        }
    }

    /// Up to `limit` (at most [`MAX_PAGE`]) counters of `domain` held on this node with
    /// something counted, after the route `after`, in route order. Consumes nothing.
    pub async fn counters(
        &self,
        domain: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Option<CounterPage>, Error> {
        let Some(names) = self.counter_names() else {
            return Ok(None);
        };
        let (page, more) = names.page(domain, after, limit.clamp(1, MAX_PAGE));
        let next = if more {
            page.last().map(|(route, _)| *route)
        } else {
            None
        };
        let mut counters = Vec::with_capacity(page.len());
        for chunk in page.chunks(CHUNK) {
            let explained = self.explain_names(chunk).await?;
            for ((_, name), explained) in chunk.iter().zip(explained) {
                if is_live(&explained) {
                    counters.push(ListedCounter {
                        name: Arc::clone(name),
                        explained,
                    });
                }
            }
        }
        Ok(Some(CounterPage {
            counters,
            next,
            figures: names.figures(),
        }))
    }

    /// Forgets the names whose counters are back to full, match no limit any more, or are
    /// held by another node now; returns how many were forgotten.
    pub async fn sweep_counter_names(&self) -> Result<usize, Error> {
        let Some(names) = self.counter_names() else {
            return Ok(0);
        };
        let mut all = names.all();
        let mut stale: Vec<u64> = Vec::new();
        all.retain(|(route, _)| {
            let local = self.store.placement(*route).local;
            if !local {
                stale.push(*route);
            }
            local
        });
        // One query per domain and chunk.
        all.sort_unstable_by(|(a, left), (b, right)| left.domain.cmp(&right.domain).then(a.cmp(b)));
        for group in all.chunk_by(|(_, left), (_, right)| left.domain == right.domain) {
            for chunk in group.chunks(CHUNK) {
                let explained = self.explain_names(chunk).await?;
                stale.extend(
                    chunk
                        .iter()
                        .zip(&explained)
                        .filter(|(_, explained)| !is_live(explained))
                        .map(|((route, _), _)| *route),
                );
            }
        }
        names.forget(&stale);
        Ok(stale.len())
    }

    /// Explains the descriptors of `chunk` (one domain, at most [`CHUNK`]) with cost 0.
    async fn explain_names(
        &self,
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
        Ok(self.explain(&query).await?.descriptors)
    }
}

/// A counter worth listing: it matches a limit, lives here, and has something counted.
fn is_live(explained: &DescriptorExplanation) -> bool {
    explained.matched.is_limited()
        && explained
            .placement
            .as_ref()
            .is_none_or(|placement| placement.local)
        && explained.limits.iter().any(|limit| limit.used > 0)
}

#[cfg(test)]
mod tests;
