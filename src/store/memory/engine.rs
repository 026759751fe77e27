//! The in-memory engine: N shards, each the only owner of the keys that hash to it.
//!
//! A key's shard is its route hash, mixed, modulo N. Each [`Shard`] sits behind its own
//! lock, and the requesting task runs the shard's step itself ([`Engine::start`]): it takes
//! the lock, reads the clock, decides, and lets go. A request that touches four shards costs
//! four short lock holds, not four cross-thread wake-ups. Steps are short and bounded (one
//! request's checks; a lock is never held across an `.await`, and never two at once), so
//! a caller that finds its shard busy waits a few hundred nanoseconds rather than queueing
//! (counted in `ratekeeper_shard_contended_total`). On its first visit to a shard, a request
//! of several checks looks up all of its keys on that shard at once ([`Shard::warm`]): with
//! many keys each lookup misses the cache, and back to back the misses overlap.
//!
//! What must happen later runs on one timer task per shard, under the same lock: waking
//! checks that wait for capacity (`max_wait`) and sweeping idle keys (every part twice a second). The
//! engine holds no counters itself: only shards mutate state. The timer tasks end when the
//! last handle drops.

mod metrics;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use prometheus_client::registry::Registry;
use smallvec::SmallVec;
use tokio::sync::Notify;

use super::shard::{Shard, ShardConfig, ShardStats, Stepped, WaitReply};
use crate::algorithm::{LendPolicy, Lent};
use crate::check::{Check, Checks, Counter, Decisions, KeepRoute, RuleKeys, Rules, Slot};
use crate::clock::Clock;
use crate::error::StoreError;
use crate::key::KeyId;

/// Sizes of the engine.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// Number of shards (at least 1).
    pub shards: usize,
    /// Live keys across all shards; each shard holds at most its share.
    pub max_keys: usize,
    /// Checks waiting in FIFO queues across all shards.
    pub max_waiters: usize,
    /// The share of `max_keys` one rule may hold when it sets no `max_keys` of its own
    /// (its key budget; see `shard`).
    pub rule_key_share: f64,
}

/// [`EngineConfig::rule_key_share`] by default: a flood of new values on one rule takes at
/// most half the table; the other rules keep the rest.
pub const DEFAULT_RULE_KEY_SHARE: f64 = 0.5;

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            shards: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_keys: 4_000_000,
            max_waiters: 100_000,
            rule_key_share: DEFAULT_RULE_KEY_SHARE,
        }
    }
}

/// One shard, its lock, and what its timer task listens to.
struct Cell {
    shard: Mutex<Shard>,
    /// Wakes the timer task: an earlier timer was queued, or the engine is gone.
    wake: Notify,
    closed: AtomicBool,
    stats: Arc<ShardStats>,
}

impl Cell {
    /// The shard's lock; a wait for a busy shard is counted and timed.
    fn lock(&self) -> MutexGuard<'_, Shard> {
        match self.shard.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => {
                let started = std::time::Instant::now();
                // A panic while holding the lock would be a bug elsewhere; the state
                // stays usable (every step leaves it consistent before it can panic).
                let guard = self.shard.lock().unwrap_or_else(PoisonError::into_inner);
                self.stats.contended.fetch_add(1, Ordering::Relaxed);
                self.stats.lock_wait.observe(started.elapsed());
                guard
            }
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        }
    }
}

struct Inner {
    cells: Box<[Arc<Cell>]>,
    clock: Clock,
    rules: Option<Arc<dyn Rules>>,
    /// When a refusal for a rule's key budget was last logged (Unix nanoseconds).
    budget_logged: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for cell in self.cells.iter() {
            cell.closed.store(true, Ordering::Release);
            cell.wake.notify_one();
        }
    }
}

/// A cloneable handle to the shards. Their timer tasks end when the last handle drops.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("shards", &self.inner.cells.len())
            .finish()
    }
}

/// Live figures of one shard, read under its lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardFigures {
    pub live_keys: usize,
    /// Keys the shard's table has room for before it grows (its memory follows this, not
    /// `live_keys`).
    pub key_slots: usize,
    pub waiters: usize,
}

/// The name of the rule tagged `rule` in `rules` (the key's rule tag in hex when it is not
/// configured: a retired rule whose keys have not expired yet, or 0: requests' own limits).
pub(super) fn rule_name(rules: Option<&dyn Rules>, rule: u32) -> Arc<str> {
    match rules.and_then(|rules| rules.name(rule)) {
        Some(name) => name,
        None if rule == 0 => Arc::from("(request limits)"),
        None => Arc::from(format!("(rule {rule:08x})")),
    }
}

/// The checks of `checks` on shard `index`, `shards[i]` being the shard of `checks[i]`.
fn on_shard<'c>(
    index: usize,
    checks: &'c [Check],
    shards: &'c [usize],
) -> impl Iterator<Item = &'c Check> {
    checks
        .iter()
        .zip(shards)
        .filter(move |&(_, &shard)| shard == index)
        .map(|(check, _)| check)
}

impl Engine {
    /// Builds the shards and spawns their timer tasks on the current tokio runtime. Every
    /// rule has the default key budget ([`Engine::spawn_with_rules`] reads the rules' own).
    pub fn spawn(config: EngineConfig, clock: Clock) -> Engine {
        Engine::spawn_with_rules(config, clock, None)
    }

    /// [`Engine::spawn`], with the rules in force: their own `max_keys`, and their names
    /// for logs and metrics.
    pub fn spawn_with_rules(
        config: EngineConfig,
        clock: Clock,
        rules: Option<Arc<dyn Rules>>,
    ) -> Engine {
        let count = config.shards.max(1);
        let max_keys = config.max_keys.div_ceil(count).max(1);
        let share = config.rule_key_share.clamp(0.0, 1.0);
        let shard_config = ShardConfig {
            max_keys,
            max_waiters: config.max_waiters.div_ceil(count),
            rule_max_keys: ((max_keys as f64 * share).ceil() as usize).max(1),
            shards: count,
        };
        let cells: Box<[Arc<Cell>]> = (0..count)
            .map(|index| {
                let stats = Arc::new(ShardStats::default());
                Arc::new(Cell {
                    shard: Mutex::new(Shard::new(
                        index,
                        shard_config,
                        rules.clone(),
                        Arc::clone(&stats),
                    )),
                    wake: Notify::new(),
                    closed: AtomicBool::new(false),
                    stats,
                })
            })
            .collect();
        for cell in cells.iter() {
            tokio::spawn(run_timers(Arc::clone(cell), clock));
        }
        Engine {
            inner: Arc::new(Inner {
                cells,
                clock,
                rules,
                budget_logged: AtomicU64::new(0),
            }),
        }
    }

    pub fn shard_count(&self) -> usize {
        self.inner.cells.len()
    }

    /// Per-shard counters, for metrics.
    pub fn stats(&self) -> impl Iterator<Item = &Arc<ShardStats>> {
        self.inner.cells.iter().map(|cell| &cell.stats)
    }

    /// Live keys and waiters of each shard (takes each shard's lock briefly).
    pub fn figures(&self) -> Vec<ShardFigures> {
        self.inner
            .cells
            .iter()
            .map(|cell| {
                let shard = cell.lock();
                ShardFigures {
                    live_keys: shard.live_keys(),
                    key_slots: shard.key_slots(),
                    waiters: shard.waiters(),
                }
            })
            .collect()
    }

    /// Each rule's live keys, refusals and budget on this node (summed over the shards;
    /// takes each shard's lock briefly), by rule tag.
    pub fn rule_keys(&self) -> Vec<(u32, RuleKeys)> {
        let mut rules: std::collections::BTreeMap<u32, RuleKeys> = Default::default();
        for cell in self.inner.cells.iter() {
            let shard = cell.lock();
            for (rule, keys) in shard.rule_keys() {
                *rules.entry(rule).or_default() += keys;
            }
        }
        rules.into_iter().collect()
    }

    /// One rule's live keys, refusals and budget on this node.
    pub fn rule(&self, rule: u32) -> RuleKeys {
        let mut sum = RuleKeys::default();
        for cell in self.inner.cells.iter() {
            let shard = cell.lock();
            sum += shard.rule_keys_of(rule);
        }
        sum
    }

    /// How logs and metrics name the rule tagged `rule`.
    pub fn rule_name(&self, rule: u32) -> Arc<str> {
        rule_name(self.inner.rules.as_deref(), rule)
    }

    /// Logs a refusal for a rule's key budget, at most once a minute (the metric
    /// `ratekeeper_rule_key_refusals_total` counts every one).
    fn log_budget(&self, rule: u32, max_keys: usize, now: u64) {
        const EVERY: u64 = 60 * crate::algorithm::NANOS_PER_SEC;
        let last = self.inner.budget_logged.load(Ordering::Relaxed);
        if now < last.saturating_add(EVERY) && last != 0 {
            return;
        }
        if self
            .inner
            .budget_logged
            .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(
                rule = %self.rule_name(rule),
                budget_per_shard = max_keys,
                "a rule holds its key budget: requests that need a new key of it are answered UNAVAILABLE until some of its keys expire (raise its max_keys or --rule-key-share if this is not a flood; logged at most once a minute)"
            );
        }
    }

    /// Registers the shards' metrics (read at scrape time) in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(metrics::EngineCollector {
            engine: self.clone(),
        }));
    }

    /// Decides `checks` on this task, one shard step per run of checks on the same shard.
    /// Checks that wait for capacity are queued on their shard; [`Started::finish`] waits
    /// for them.
    ///
    /// A request that fails (a shard at its key cap) has no effect: what its earlier checks
    /// consumed is given back ([`Shard::undo`]) before the error is answered.
    pub fn start(&self, checks: Checks) -> Result<Started, StoreError> {
        self.begin(&checks)
    }

    /// [`Engine::start`] on borrowed checks: the caller keeps them, so it can give back
    /// what they consumed ([`Engine::give_back`]) if its request fails elsewhere (cluster
    /// mode: on another node, or on a lease).
    pub fn begin(&self, checks: &[Check]) -> Result<Started, StoreError> {
        let cells = &self.inner.cells;
        let mut decisions = Decisions::new();
        let mut waits = Vec::new();
        let shards: SmallVec<[usize; 4]> = checks
            .iter()
            .map(|check| crate::key::shard_of(check.route(), cells.len()))
            .collect();
        // The checks that consumed, by position, and the shard's time when they did.
        let mut consumed = Consumed::new();
        let mut held: Option<(usize, MutexGuard<'_, Shard>, u64)> = None;
        for (position, (check, &index)) in checks.iter().zip(&shards).enumerate() {
            let (_, shard, now) = match held {
                Some(ref mut step) if step.0 == index => step,
                _ => {
                    // Let go of one shard before taking the next: never two locks at once.
                    held = None;
                    let guard = cells[index].lock();
                    // Read under the lock, so a shard's time never goes backwards.
                    let now = self.inner.clock.now();
                    let step = held.insert((index, guard, now));
                    if shards.len() > 1 && !shards[..position].contains(&index) {
                        // The first visit to a shard looks up all of the request's keys on
                        // it at once, so their cache misses overlap instead of coming one
                        // check at a time.
                        let later = &checks[position + 1..];
                        let later = on_shard(index, later, &shards[position + 1..]);
                        step.1.warm(std::iter::once(check).chain(later));
                    }
                    step
                }
            };
            let offset = decisions.len();
            let len = check.counters.len();
            match shard.check(check, *now, &mut decisions) {
                Ok(Stepped::Waiting { reply, wake }) => {
                    waits.push(Wait {
                        position,
                        offset,
                        len,
                        reply,
                    });
                    if wake {
                        cells[index].wake.notify_one();
                    }
                }
                Ok(Stepped::Decided) => {
                    if check.takes() && decisions[offset..].iter().all(|d| d.allowed) {
                        consumed.push((position, *now));
                    }
                }
                Err(error) => {
                    let now = *now;
                    drop(held);
                    self.undo(checks, consumed, waits);
                    if let StoreError::RuleKeyBudget { rule, max_keys, .. } = error {
                        self.log_budget(rule, max_keys, now);
                    }
                    return Err(error);
                }
            }
        }
        Ok(Started {
            decisions,
            waits,
            consumed,
        })
    }

    /// Gives back what the checks of a failed request consumed: those decided (`consumed`:
    /// position and time), and those that waited and were admitted before the failure
    /// (their replies are closed first, so none is admitted after).
    fn undo(&self, checks: &[Check], mut consumed: Consumed, waits: Vec<Wait>) {
        for mut wait in waits {
            wait.reply.close();
            if let Ok(settled) = wait.reply.try_recv()
                && settled.decisions.iter().all(|d| d.allowed)
            {
                consumed.push((wait.position, settled.at));
            }
        }
        self.give_back(checks, &consumed);
    }

    /// Gives back what `checks` consumed, as [`Started::finish_consumed`] answered it
    /// (`consumed`: each admitted check's position and its shard's time then), because the
    /// request they belong to failed elsewhere. Each counter ends as if the check had
    /// never been admitted; a window only while it lasts ([`Shard::undo`]).
    pub fn give_back(&self, checks: &[Check], consumed: &[(usize, u64)]) {
        let cells = &self.inner.cells;
        for &(position, at) in consumed {
            let Some(check) = checks.get(position) else {
                continue;
            };
            let mut shard = cells[crate::key::shard_of(check.route(), cells.len())].lock();
            let now = self.inner.clock.now();
            shard.undo(check, at, now);
        }
    }

    /// [`Engine::start`], then waits for the checks that wait.
    pub async fn check(&self, checks: Checks) -> Result<Decisions, StoreError> {
        self.start(checks)?.finish().await
    }

    /// What each check's counters say now for the check's cost, consuming nothing and
    /// never waiting (explanations): one decision per counter, in order, each admitted or
    /// not, with how long until it would be when not (`retry_after`; `None`: never).
    pub fn peek(&self, checks: &Checks) -> Decisions {
        let cells = &self.inner.cells;
        let mut decisions = Decisions::new();
        for check in checks {
            let mut shard = cells[crate::key::shard_of(check.route(), cells.len())].lock();
            let now = self.inner.clock.now();
            shard.peek(check, now, &mut decisions);
        }
        decisions
    }

    /// Lends hits of `counter` (a key this node owns) to another node: see
    /// [`algorithm::lend`](crate::algorithm::lend).
    pub fn lend(&self, counter: &Counter, policy: LendPolicy) -> Option<Lent> {
        let cell = &self.inner.cells[counter.key.shard(self.inner.cells.len())];
        let mut shard = cell.lock();
        let now = self.inner.clock.now();
        shard.lend(counter, policy, now)
    }

    /// Takes back lent hits that were not spent; answers how many.
    pub fn refund(&self, counter: &Counter, units: u64, window: u64) -> u64 {
        let cell = &self.inner.cells[counter.key.shard(self.inner.cells.len())];
        let mut shard = cell.lock();
        let now = self.inner.clock.now();
        shard.refund(counter, units, window, now)
    }

    /// Removes and returns every counter whose route `keep` rejects, from all shards (for
    /// handing them to other nodes).
    pub fn export(&self, keep: KeepRoute) -> Vec<(KeyId, Slot)> {
        let mut out = Vec::new();
        for cell in self.inner.cells.iter() {
            // One part of the shard's table per lock hold: requests get the shard in
            // between, so a handoff never stalls them for a whole table.
            for part in 0..super::shard::TABLE_PARTS {
                cell.lock().export_part(part, &*keep, &mut out);
            }
        }
        out
    }

    /// Forgets the counters of `keys` on their shards (one lock at a time); returns how
    /// many were held.
    pub fn reset(&self, keys: &[KeyId]) -> usize {
        let cells = &self.inner.cells;
        cells
            .iter()
            .enumerate()
            .map(|(index, cell)| {
                let mine: Vec<KeyId> = keys
                    .iter()
                    .filter(|key| key.shard(cells.len()) == index)
                    .copied()
                    .collect();
                if mine.is_empty() {
                    0
                } else {
                    cell.lock().reset(&mine)
                }
            })
            .sum()
    }

    /// Hands counters from another node to their shards; returns how many were kept.
    pub fn import(&self, counters: Vec<(KeyId, Slot)>) -> usize {
        let cells = &self.inner.cells;
        let mut groups: Vec<Vec<(KeyId, Slot)>> = (0..cells.len()).map(|_| Vec::new()).collect();
        for (key, slot) in counters {
            groups[key.shard(cells.len())].push((key, slot));
        }
        cells
            .iter()
            .zip(groups)
            .filter(|(_, counters)| !counters.is_empty())
            .map(|(cell, counters)| cell.lock().import(counters))
            .sum()
    }
}

/// The checks of a request that consumed: each one's position in the request, and its
/// shard's time (Unix nanoseconds) when it did.
pub type Consumed = SmallVec<[(usize, u64); 4]>;

/// A check queued on its shard, and where its decisions go.
struct Wait {
    /// The check's position in the request.
    position: usize,
    offset: usize,
    len: usize,
    reply: WaitReply,
}

/// Where [`Engine::start`] got to.
pub enum Progress {
    /// Everything decided.
    Decided(Decisions),
    /// Some checks wait for capacity: [`Started::finish`] waits for them.
    Waiting(Started),
}

/// The decisions of [`Engine::start`], some of them possibly still waiting.
#[must_use]
pub struct Started {
    decisions: Decisions,
    waits: Vec<Wait>,
    /// The checks decided (not waiting) that consumed.
    consumed: Consumed,
}

impl Started {
    /// The decisions when no check waits, else the checks still to wait for.
    pub fn progress(self) -> Progress {
        if self.waits.is_empty() {
            Progress::Decided(self.decisions)
        } else {
            Progress::Waiting(self)
        }
    }

    /// Every decision, once the waiting checks are settled.
    pub async fn finish(self) -> Result<Decisions, StoreError> {
        Ok(self.finish_consumed().await?.0)
    }

    /// [`Started::finish`], also answering which checks consumed and when (to give them
    /// back with [`Engine::give_back`], or to name the windows they were counted in).
    pub async fn finish_consumed(self) -> Result<(Decisions, Consumed), StoreError> {
        let Started {
            mut decisions,
            waits,
            mut consumed,
        } = self;
        for wait in waits {
            // A dropped sender means the engine went away with the check still queued.
            let settled = wait.reply.await.map_err(|_| StoreError::Stopped)?;
            let slots = decisions
                .get_mut(wait.offset..wait.offset + wait.len)
                .ok_or(StoreError::Stopped)?;
            if settled.decisions.len() != slots.len() {
                return Err(StoreError::Stopped);
            }
            slots.copy_from_slice(&settled.decisions);
            if settled.decisions.iter().all(|d| d.allowed) {
                consumed.push((wait.position, settled.at));
            }
        }
        Ok((decisions, consumed))
    }
}

/// A shard's timer task: serves due waiters and sweeps, then sleeps until the next timer,
/// an earlier timer queued by a request, or the engine's end.
async fn run_timers(cell: Arc<Cell>, clock: Clock) {
    loop {
        if cell.closed.load(Ordering::Acquire) {
            return;
        }
        let (next, now) = {
            let mut shard = cell.lock();
            let now = clock.now();
            (shard.tick(now), now)
        };
        if next <= now {
            // More to do at once (a late sweep catching up): let the shard's requests in
            // first.
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep_until(clock.instant_at(next)) => {}
            () = cell.wake.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests;
