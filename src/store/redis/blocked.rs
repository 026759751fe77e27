//! The blocked cache: descriptors known to have a counter with no room for one more hit,
//! with the states of all their counters, so a flood against them costs no Redis call.
//!
//! Invariants:
//! - An entry is stored under every key of its check, so a check of another shape that
//!   shares a counter (the same descriptor with a request-supplied limit, say) finds and
//!   drops it before going to Redis: the states kept here never miss this process's own
//!   consumption.
//! - An entry answers only until its blocking counter could admit one hit; nothing can be
//!   consumed on a counter with no room, by any process, so the answer is exact for it.
//!   Other counters of the entry show their state as of the last Redis call. (A refund
//!   through another process can make room sooner; this process sees it when the entry
//!   ends: see the module `redis`.)
//! - Bounded: at most `capacity` key slots; a full shard drops expired entries first and
//!   otherwise keeps nothing new.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use super::metrics::RedisStats;
use crate::algorithm::{self, NANOS_PER_SEC, State};
use crate::check::{Check, Decisions, States};
use crate::key::{KeyHasher, KeyId};

pub(super) const SHARDS: usize = 16;

type Map = HashMap<KeyId, Arc<Blocked>, KeyHasher>;

pub(super) struct BlockedCache {
    shards: Box<[Mutex<Map>]>,
    per_shard: usize,
}

#[derive(Debug)]
struct Blocked {
    /// Unix nanoseconds until which a counter of the check has no room for one hit.
    until: u64,
    /// When the states were read.
    at: u64,
    keys: SmallVec<[KeyId; 2]>,
    states: States,
}

impl BlockedCache {
    /// A cache of at most `capacity` key slots (0: off).
    pub fn new(capacity: usize) -> BlockedCache {
        BlockedCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Map::with_hasher(KeyHasher::default())))
                .collect(),
            per_shard: capacity.div_ceil(SHARDS),
        }
    }

    fn shard(&self, key: &KeyId) -> Option<MutexGuard<'_, Map>> {
        if self.per_shard == 0 {
            return None;
        }
        let index = crate::key::shard_of(key.id[0] ^ key.id[1], SHARDS);
        let shard = self.shards.get(index)?;
        Some(shard.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The check decided locally at `now`, if a counter of it is blocked and the answer
    /// consumes nothing. Otherwise `None`, and entries that share its keys are dropped
    /// (Redis is about to change those counters).
    pub fn answer(&self, check: &Check, now: u64) -> Option<Decisions> {
        let first = check.counters.first()?;
        let blocked = self.shard(&first.key)?.get(&first.key).cloned();
        let answer = blocked.and_then(|blocked| {
            let at = now.max(blocked.at);
            let same = blocked.keys.len() == check.counters.len()
                && blocked
                    .keys
                    .iter()
                    .zip(&check.counters)
                    .all(|(key, counter)| *key == counter.key);
            if at >= blocked.until || !same {
                return None;
            }
            let mut states = blocked.states.clone();
            let mut out = Decisions::new();
            let admitted = check.decide(&mut states, at, &mut out).is_none();
            // Room again (sooner than `until` said), a refund, or a rejected check that
            // counts on a counter with room left: Redis decides.
            let writes = check.writes(admitted) && states != blocked.states;
            ((!admitted || check.cost == 0) && !writes).then_some(out)
        });
        if answer.is_none() {
            self.forget(check);
        }
        answer
    }

    /// After Redis decided `check` at `at`, leaving `states`: keeps them while a counter
    /// has no room for one more hit.
    pub fn remember(&self, check: &Check, states: &[State], at: u64, stats: &RedisStats) {
        self.forget(check);
        let until = check
            .counters
            .iter()
            .zip(states)
            .filter_map(|(counter, state)| {
                let mut state = *state;
                let next = algorithm::decide(&counter.rate, &mut state, at, 1);
                match (next.allowed, next.retry_after) {
                    (true, _) => None,
                    (false, Some(wait)) => Some(at.saturating_add(wait)),
                    // Never (a limit of 0): look again after a while.
                    (false, None) => Some(at.saturating_add(next.reset_after.max(NANOS_PER_SEC))),
                }
            })
            .max();
        let Some(until) = until else {
            return;
        };
        let entry = Arc::new(Blocked {
            until,
            at,
            keys: check.counters.iter().map(|counter| counter.key).collect(),
            states: states.iter().copied().collect(),
        });
        for key in &entry.keys {
            let Some(mut map) = self.shard(key) else {
                return;
            };
            if map.len() >= self.per_shard {
                map.retain(|_, blocked| blocked.until > at);
                if map.len() >= self.per_shard {
                    stats.blocked_full.fetch_add(1, Ordering::Relaxed);
                    drop(map);
                    self.forget_entry(&entry);
                    return;
                }
            }
            map.insert(*key, Arc::clone(&entry));
        }
    }

    /// Drops every entry stored under a key of `check`, under all of its keys.
    fn forget(&self, check: &Check) {
        for counter in &check.counters {
            let removed = self
                .shard(&counter.key)
                .and_then(|mut map| map.remove(&counter.key));
            if let Some(entry) = removed {
                self.forget_entry(&entry);
            }
        }
    }

    /// Drops every entry stored under one of `keys` (their counters were reset).
    pub fn forget_keys(&self, keys: &[KeyId]) {
        for key in keys {
            let removed = self.shard(key).and_then(|mut map| map.remove(key));
            if let Some(entry) = removed {
                self.forget_entry(&entry);
            }
        }
    }

    fn forget_entry(&self, entry: &Arc<Blocked>) {
        for key in &entry.keys {
            if let Some(mut map) = self.shard(key)
                && map.get(key).is_some_and(|kept| Arc::ptr_eq(kept, entry))
            {
                map.remove(key);
            }
        }
    }

    /// Key slots in use.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}
