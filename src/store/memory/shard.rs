//! A shard: the counters of the keys that hash to it, their FIFO wait queues and timers.
//!
//! A [`Shard`] is plain state with synchronous steps; the [`Engine`](crate::store::memory::engine::Engine)
//! keeps each one behind its own lock and the requesting task runs the step itself (no
//! mailbox, no thread wake-up per request). Only what must happen later, timers of waiting
//! checks and the sweep of idle keys, runs on the shard's timer task, under the same lock.
//!
//! Invariants:
//! - One step at a time: a shard's state changes only under its lock, and `now` is read
//!   under the lock, so a shard sees time move forward only.
//! - All limits of one descriptor (one [`Check`]) are decided together: either every counter
//!   admits the cost and all consume it, or none consumes anything.
//! - The number of live keys never exceeds `max_keys`; the number of waiting checks never
//!   exceeds `max_waiters` (and each key's queue its own `max_queue`).
//! - No rule holds more live keys than its budget ([`ShardConfig::rule_max_keys`], or the
//!   rule's own `max_keys` divided among the shards): a rule's new key past its budget is
//!   refused ([`StoreError::RuleKeyBudget`]) as a key past `max_keys` is, so a flood of new
//!   values on one rule cannot take the table from the others. `rules` counts each rule's
//!   live keys (by the tag in the key, [`KeyId::rule`]) and follows every insert and
//!   removal.
//! - A key is kept while its state can still change an answer ([`algorithm::lifetime`]:
//!   until its window ends, the following window for a sliding window, or its bucket is
//!   full again), rounded up to an [`expiry`] tick (a quarter second), then forgotten
//!   within [`SWEEP_EVERY`]: the sweep goes through the table a part at a time, at most
//!   [`SWEEP_STEP_KEYS`] keys per step (see [`table`]), so no step looks at more than a
//!   sliver of the table, and it passes over parts none of whose keys can be due yet (keys of
//!   limits of a minute or longer have parts of their own, so they are looked at about
//!   when they are due, not twice a second).
//! - A waiter whose caller has gone away is dropped without consuming.
//! - Waiters on one key are served first in, first out; a new waiting check never overtakes
//!   one already queued on the same key.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::algorithm::{self, State};
use crate::check::{self, Check, Counter, Decisions, RuleKeys, Rules, Slot, States, expiry};
use crate::error::StoreError;
use crate::histogram::AtomicHistogram;
use crate::key::{KeyHasher, KeyId};
use table::Table;

/// How often a shard sweeps out keys whose state no longer matters: every part of its table
/// once in this time, a few parts per step. A key is forgotten on average half of this after
/// its expiry (and the quarter second of rounding), so memory holds about
/// `(lifetime + 0.4 s) / lifetime` times what the windows need: 1.007x for a minute window.
pub const SWEEP_EVERY: Duration = Duration::from_millis(500);
/// Parts of a shard's key table (see [`table`]): a handoff exports one per lock hold.
pub const TABLE_PARTS: usize = table::PARTS;
/// Keys one sweep step looks at, at most (a step sweeps one part at least): a step holds
/// the shard's lock for some tens of microseconds whatever the table's size, and a late
/// sweep catches up in steps that release the lock in between.
const SWEEP_STEP_KEYS: usize = 2048;
/// Parts one step sweeps at most, parts not yet due included: a small table (its parts a
/// few keys each) is swept in a few wake-ups a second rather than one per part.
const SWEEP_AHEAD: u64 = 64;

/// Sizes of one shard.
#[derive(Clone, Copy, Debug)]
pub struct ShardConfig {
    pub max_keys: usize,
    pub max_waiters: usize,
    /// The most live keys of one rule on this shard, for a rule without its own
    /// `max_keys`.
    pub rule_max_keys: usize,
    /// Shards of the engine: a rule's own `max_keys` is divided among them.
    pub shards: usize,
}

/// Counters a shard keeps for scrapes.
#[derive(Debug, Default)]
pub struct ShardStats {
    pub expired_keys: AtomicU64,
    /// Keys the sweep looked at (kept or forgotten): the sweep's work.
    pub swept_keys: AtomicU64,
    pub key_capacity_hits: AtomicU64,
    pub waits_admitted: AtomicU64,
    pub waits_rejected: AtomicU64,
    /// Steps that found the shard busy and waited for it.
    pub contended: AtomicU64,
    /// How long those steps waited for the shard.
    pub lock_wait: AtomicHistogram,
    /// Counters taken from other nodes, and those dropped because the shard was full.
    pub imported: AtomicU64,
    pub import_dropped: AtomicU64,
}

/// A waiting check's decisions, sent when it is settled.
pub type WaitReply = oneshot::Receiver<Settled>;

/// What a waiting check is told when it is settled: its decisions, and the shard's time
/// then (Unix nanoseconds: when an admitted check consumed, so it can be given back in the
/// window it was counted in).
#[derive(Debug)]
pub struct Settled {
    pub decisions: Decisions,
    pub at: u64,
}

/// The counters a shard owns.
struct Counters {
    shard: usize,
    keys: Table<Slot>,
    /// Handed-over counters for keys this shard already had: merged on the key's next use,
    /// when its rate is known. Bounded by `max_keys`.
    pending: Table<Vec<Slot>>,
    max_keys: usize,
    /// Live keys (and refusals) per rule tag; an entry goes when both are 0. Bounded by the
    /// live keys.
    rules: HashMap<u32, RuleCount>,
    budgets: Budgets,
    stats: Arc<ShardStats>,
}

#[derive(Clone, Copy, Debug, Default)]
struct RuleCount {
    live: u32,
    refused: u32,
}

/// How a shard finds a rule's budget.
#[derive(Clone)]
pub struct Budgets {
    /// The rules in force (their own `max_keys`); `None`: every rule has the default.
    pub rules: Option<Arc<dyn Rules>>,
    /// The budget of a rule without its own `max_keys`.
    pub default: usize,
    pub shards: usize,
}

impl Budgets {
    /// The most live keys the rule tagged `rule` may hold on one shard: its own `max_keys`
    /// divided among the shards (rounded up), or the default share.
    pub fn per_shard(&self, rule: u32) -> usize {
        let own = self.rules.as_ref().and_then(|rules| rules.max_keys(rule));
        match own {
            Some(max_keys) => (max_keys as usize).div_ceil(self.shards.max(1)),
            None => self.default,
        }
    }
}

struct Waiter {
    check: Check,
    deadline: u64,
    reply: oneshot::Sender<Settled>,
}

struct Queue {
    waiters: VecDeque<Waiter>,
    /// When this queue's head is next looked at (the timer that matters for it).
    wake_at: u64,
}

pub struct Shard {
    counters: Counters,
    max_waiters: usize,
    queues: HashMap<KeyId, Queue, KeyHasher>,
    timers: BinaryHeap<Reverse<(u64, KeyId)>>,
    waiting: usize,
    /// When the timer task wakes next (Unix nanoseconds); an earlier timer must wake it.
    armed_at: u64,
    next_sweep: u64,
    /// The table part the sweep looks at next.
    sweep_part: usize,
}

/// The outcome of evaluating one check.
enum Outcome {
    Admitted,
    /// Denied; `retry_after` is the longest wait any denying counter needs (None: never),
    /// and `key` the counter that needs it.
    Denied {
        key: KeyId,
        retry_after: Option<u64>,
    },
}

/// What [`Shard::check`] did with a check.
pub enum Stepped {
    /// Decided: its decisions were pushed.
    Decided,
    /// Queued to wait for capacity: placeholder decisions were pushed, the real ones come
    /// on the receiver. `wake` says whether the timer task must be woken (the new timer is
    /// earlier than the one it sleeps on).
    Waiting { reply: WaitReply, wake: bool },
}

impl Shard {
    pub fn new(
        shard: usize,
        config: ShardConfig,
        rules: Option<Arc<dyn Rules>>,
        stats: Arc<ShardStats>,
    ) -> Shard {
        Shard {
            counters: Counters {
                shard,
                keys: Table::new(),
                pending: Table::new(),
                max_keys: config.max_keys,
                rules: HashMap::new(),
                budgets: Budgets {
                    rules,
                    default: config.rule_max_keys.max(1),
                    shards: config.shards,
                },
                stats,
            },
            max_waiters: config.max_waiters,
            queues: HashMap::with_hasher(KeyHasher::default()),
            timers: BinaryHeap::new(),
            waiting: 0,
            armed_at: u64::MAX,
            next_sweep: 0,
            sweep_part: 0,
        }
    }

    pub fn live_keys(&self) -> usize {
        self.counters.keys.len()
    }

    /// The key table's capacity (see [`ShardFigures`](crate::store::memory::engine::ShardFigures)).
    pub fn key_slots(&self) -> usize {
        self.counters.keys.capacity()
    }

    pub fn waiters(&self) -> usize {
        self.waiting
    }

    /// One rule's live keys and refusals here, with its budget on this shard.
    pub fn rule_keys_of(&self, rule: u32) -> RuleKeys {
        let count = self.counters.rules.get(&rule).copied().unwrap_or_default();
        RuleKeys {
            live: u64::from(count.live),
            refused: u64::from(count.refused),
            budget: self.counters.budgets.per_shard(rule) as u64,
        }
    }

    /// Each rule's live keys and refusals here, with its budget on this shard.
    pub fn rule_keys(&self) -> impl Iterator<Item = (u32, RuleKeys)> + '_ {
        self.counters
            .rules
            .keys()
            .map(|&rule| (rule, self.rule_keys_of(rule)))
    }

    /// Looks up the counters of `checks` without changing anything, so that the steps that
    /// follow find them in the cache. A table of many keys misses the cache on almost every
    /// lookup; looked up back to back, the misses of several checks overlap, where one check
    /// at a time waits for each in turn.
    pub fn warm<'a>(&self, checks: impl Iterator<Item = &'a Check>) {
        for check in checks {
            for counter in &check.counters {
                // Only the memory traffic matters; `black_box` keeps the lookup from being
                // optimized away.
                std::hint::black_box(self.counters.keys.contains_key(&counter.key));
            }
        }
    }

    /// Decides `check` at `now`, pushing one decision per counter onto `out`. A check that
    /// may wait and is denied is queued instead (see [`Stepped::Waiting`]).
    pub fn check(
        &mut self,
        check: &Check,
        now: u64,
        out: &mut Decisions,
    ) -> Result<Stepped, StoreError> {
        // Only a check that consumes nothing when rejected may wait (see `Check::wait`).
        let policy = check
            .wait
            .filter(|_| check.cost > 0 && check.charge == check::Charge::Admitted);
        // First in, first out: don't overtake checks already waiting on one of our keys.
        let queued_key = policy.and_then(|_| {
            check
                .counters
                .iter()
                .map(|counter| counter.key)
                .find(|key| self.queues.contains_key(key))
        });
        let outcome = match queued_key {
            Some(key) => {
                self.counters.peek(check, now, out);
                Outcome::Denied {
                    key,
                    retry_after: Some(0),
                }
            }
            None => self.counters.evaluate(check, now, out)?,
        };
        let (Some(policy), Outcome::Denied { key, retry_after }) = (policy, outcome) else {
            return Ok(Stepped::Decided);
        };
        let deadline = now.saturating_add(duration_nanos(policy.max_wait));
        let queue_len = self.queues.get(&key).map_or(0, |queue| queue.waiters.len());
        let room = queue_len < policy.max_queue as usize && self.waiting < self.max_waiters;
        let wake_at = match retry_after {
            Some(wait) if room && now.saturating_add(wait) <= deadline => now.saturating_add(wait),
            _ => {
                self.counters
                    .stats
                    .waits_rejected
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(Stepped::Decided);
            }
        };
        let (reply, rx) = oneshot::channel();
        self.waiting += 1;
        let queue = self.queues.entry(key).or_insert_with(|| Queue {
            waiters: VecDeque::new(),
            wake_at: u64::MAX,
        });
        queue.waiters.push_back(Waiter {
            check: check.clone(),
            deadline,
            reply,
        });
        let mut wake = false;
        if queue.waiters.len() == 1 {
            queue.wake_at = wake_at;
            self.timers.push(Reverse((wake_at, key)));
            if wake_at < self.armed_at {
                self.armed_at = wake_at;
                wake = true;
            }
        }
        Ok(Stepped::Waiting { reply: rx, wake })
    }

    /// The timer task's step: serves every queue whose timer is due, sweeps the next parts
    /// of the table when their turn has come (each part once per [`SWEEP_EVERY`], at most
    /// [`SWEEP_STEP_KEYS`] keys per step), and returns when it must run next (Unix
    /// nanoseconds; `now` or earlier: at once, after letting others take the lock).
    pub fn tick(&mut self, now: u64) -> u64 {
        self.fire_timers(now);
        if now >= self.next_sweep {
            let cycle = duration_nanos(SWEEP_EVERY);
            let per_part = (cycle / table::PARTS as u64).max(1);
            // Behind by more than a cycle: one cycle of steps is all there is to catch up.
            let behind = (now - self.next_sweep).min(cycle);
            let due = 1 + behind / per_part;
            let most = due.max(SWEEP_AHEAD).min(table::PARTS as u64);
            let (mut swept, mut looked) = (0, 0);
            let now_tick = expiry::tick(now);
            while swept < most {
                let next = self.counters.keys.due_len(self.sweep_part, now_tick);
                if swept > 0 && looked + next > SWEEP_STEP_KEYS {
                    break;
                }
                looked += self.sweep(now);
                swept += 1;
            }
            self.next_sweep = (now - behind).saturating_add(swept * per_part);
        }
        let next_timer = self.timers.peek().map_or(u64::MAX, |Reverse((at, _))| *at);
        self.armed_at = next_timer.min(self.next_sweep);
        self.armed_at
    }

    /// Serves every queue whose timer is due.
    fn fire_timers(&mut self, now: u64) {
        while let Some(&Reverse((at, key))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let current = self
                .queues
                .get(&key)
                .is_some_and(|queue| queue.wake_at == at);
            if current {
                self.serve_queue(key, now);
            }
        }
    }

    /// Admits or rejects waiters from the head of `key`'s queue until one must wait longer.
    fn serve_queue(&mut self, key: KeyId, now: u64) {
        let Some(mut queue) = self.queues.remove(&key) else {
            return;
        };
        let mut scratch = Decisions::new();
        while let Some(waiter) = queue.waiters.front() {
            if waiter.reply.is_closed() {
                self.settle(queue.waiters.pop_front(), None, now);
                continue;
            }
            scratch.clear();
            let outcome = match self.counters.evaluate(&waiter.check, now, &mut scratch) {
                Ok(outcome) => outcome,
                Err(_) => {
                    // Full: the waiter is rejected with what it would have been told now.
                    scratch.clear();
                    self.counters.peek(&waiter.check, now, &mut scratch);
                    Outcome::Denied {
                        key,
                        retry_after: None,
                    }
                }
            };
            match outcome {
                Outcome::Admitted => {
                    self.counters
                        .stats
                        .waits_admitted
                        .fetch_add(1, Ordering::Relaxed);
                    self.settle(queue.waiters.pop_front(), Some(&scratch), now);
                }
                Outcome::Denied { retry_after, .. } => {
                    let retry_at = retry_after.map(|wait| now.saturating_add(wait.max(1)));
                    match retry_at {
                        Some(at) if now < waiter.deadline => {
                            // Wait for capacity or the deadline, whichever comes first.
                            queue.wake_at = at.min(waiter.deadline);
                            self.timers.push(Reverse((queue.wake_at, key)));
                            break;
                        }
                        _ => {
                            self.counters
                                .stats
                                .waits_rejected
                                .fetch_add(1, Ordering::Relaxed);
                            self.settle(queue.waiters.pop_front(), Some(&scratch), now);
                        }
                    }
                }
            }
        }
        if !queue.waiters.is_empty() {
            self.queues.insert(key, queue);
        }
    }

    /// Sends a waiter its decisions (none: its caller left).
    fn settle(&mut self, waiter: Option<Waiter>, decisions: Option<&Decisions>, now: u64) {
        let Some(waiter) = waiter else { return };
        self.waiting -= 1;
        if let Some(decisions) = decisions {
            // The caller may have left meanwhile; nothing to undo then.
            let _ = waiter.reply.send(Settled {
                decisions: decisions.clone(),
                at: now,
            });
        }
    }

    /// Forgets the idle keys of the next part of the table (and shrinks it if it emptied
    /// out: see [`table`]), unless none of them can be due yet; answers how many keys it
    /// looked at.
    fn sweep(&mut self, now: u64) -> usize {
        let now_tick = expiry::tick(now);
        let part = self.sweep_part;
        let looked = self.counters.keys.due_len(part, now_tick);
        self.sweep_part = (part + 1) % table::PARTS;
        let Counters { keys, rules, .. } = &mut self.counters;
        let expired = if looked > 0 {
            keys.retain_part(part, |key, slot| {
                let keep = slot.expires > now_tick;
                if !keep {
                    forget(rules, key.rule());
                }
                keep
            })
        } else {
            0
        };
        if self.counters.pending.due_len(part, now_tick) > 0 {
            self.counters.pending.retain_part(part, |_, slots| {
                slots.retain(|slot| slot.expires > now_tick);
                !slots.is_empty()
            });
        }
        if looked > 0 {
            let stats = &self.counters.stats;
            stats.swept_keys.fetch_add(looked as u64, Ordering::Relaxed);
            stats
                .expired_keys
                .fetch_add(expired as u64, Ordering::Relaxed);
        }
        looked
    }

    /// Removes the counters (and pending handoffs) of one part of the table (see
    /// [`TABLE_PARTS`]) whose route `keep` rejects, adding them to `out`: a handoff exports
    /// a part per lock hold, so it never holds the shard for the whole table.
    pub fn export_part(
        &mut self,
        part: usize,
        keep: &dyn Fn(u64) -> bool,
        out: &mut Vec<(KeyId, Slot)>,
    ) {
        self.counters.export_part(part, keep, out);
    }

    /// Takes counters from another node; returns how many were kept.
    pub fn import(&mut self, counters: Vec<(KeyId, Slot)>) -> usize {
        self.counters.import(counters)
    }

    /// Lends hits of `counter`'s key (held here) to another node as `policy` allows (see
    /// [`algorithm::lend`]).
    pub fn lend(
        &mut self,
        counter: &Counter,
        policy: algorithm::LendPolicy,
        now: u64,
    ) -> Option<algorithm::Lent> {
        self.counters.absorb(counter, now);
        let slot = self.counters.keys.get_mut(&counter.key)?;
        let mut state = State {
            a: slot.a,
            b: slot.b,
        };
        let lent = algorithm::lend(&counter.rate, &mut state, now, policy)?;
        (slot.a, slot.b) = (state.a, state.b);
        // Lending consumed: the state matters longer.
        let lifetime = algorithm::lifetime(&counter.rate, lent.reset_after);
        slot.expires = slot.expires.max(expires(now, lifetime));
        Some(lent)
    }

    /// Gives back what `check` consumed at `at` (its request failed after it was admitted),
    /// as [`algorithm::refund`] gives back a loan: the counters end as if it had never been
    /// admitted (a window only while it lasts: after, its count no longer matters).
    pub fn undo(&mut self, check: &Check, at: u64, now: u64) {
        for counter in &check.counters {
            let window = algorithm::window_at(&counter.rate, at);
            self.refund(counter, check.cost, window, now);
        }
    }

    /// Takes back unspent lent hits (see [`algorithm::refund`]); answers how many.
    pub fn refund(&mut self, counter: &Counter, units: u64, window: u64, now: u64) -> u64 {
        self.counters.absorb(counter, now);
        let Some(slot) = self.counters.keys.get_mut(&counter.key) else {
            return 0;
        };
        let mut state = State {
            a: slot.a,
            b: slot.b,
        };
        let back = algorithm::refund(&counter.rate, &mut state, now, units, window);
        (slot.a, slot.b) = (state.a, state.b);
        back
    }

    /// Pushes what each counter of `check` says at `now` for the check's cost, consuming
    /// nothing (an explanation): admitted or not, and when not, how long until it would be.
    /// Handed-over states waiting for the keys are merged first, as a check would.
    pub fn peek(&mut self, check: &Check, now: u64, out: &mut Decisions) {
        if !self.counters.pending.is_empty() {
            for counter in &check.counters {
                self.counters.absorb(counter, now);
            }
        }
        self.counters.peek(check, now, out);
    }

    /// Forgets the counters of `keys` (and handed-over states waiting for them); returns
    /// how many were held. Waiters stay queued: their next look finds the room.
    pub fn reset(&mut self, keys: &[KeyId]) -> usize {
        keys.iter()
            .filter(|key| {
                let held = self.counters.remove(key);
                let pending = self.counters.pending.remove(key).is_some();
                held || pending
            })
            .count()
    }
}

/// Decides a check of one counter on its held `slot`, in place: pushes its decision onto
/// `out` and writes the slot as the check's charge says. Answers the outcome, and the
/// slot's new expiry when it came earlier than it was (a refund can bring a bucket's full
/// time forward), which the key table's due order must learn.
#[inline]
fn decide_in_place(
    slot: &mut Slot,
    counter: &Counter,
    check: &Check,
    now: u64,
    out: &mut Decisions,
) -> (Outcome, Option<u32>) {
    let mut state = State {
        a: slot.a,
        b: slot.b,
    };
    let decision = algorithm::apply(&counter.rate, &mut state, now, check.cost, check.charge);
    out.push(decision);
    let mut earlier = None;
    if check.writes(decision.allowed) {
        let until = expires(
            now,
            algorithm::lifetime(&counter.rate, decision.reset_after),
        );
        if until < slot.expires {
            earlier = Some(until);
        }
        *slot = Slot {
            a: state.a,
            b: state.b,
            expires: until,
        };
    }
    if !decision.allowed {
        let outcome = Outcome::Denied {
            key: counter.key,
            retry_after: decision.retry_after,
        };
        return (outcome, earlier);
    }
    (Outcome::Admitted, earlier)
}

impl Counters {
    /// Decides `check` at `now`, consuming on every counter if all admit (and, as its
    /// charge says, counting a rejected check or giving back a refund: [`Check::writes`]).
    /// Pushes one decision per counter onto `out`.
    fn evaluate(
        &mut self,
        check: &Check,
        now: u64,
        out: &mut Decisions,
    ) -> Result<Outcome, StoreError> {
        if !self.pending.is_empty() {
            for counter in &check.counters {
                self.absorb(counter, now);
            }
        }
        if let [counter] = check.counters.as_slice()
            && let Some(slot) = self.keys.get_mut(&counter.key)
        {
            // The common case, a known key with one limit: decide in place, one probe.
            let (outcome, earlier) = decide_in_place(slot, counter, check, now, out);
            if let Some(until) = earlier {
                // A refund can bring a bucket's full time forward.
                self.keys.lower_due(&counter.key, until);
            }
            return Ok(outcome);
        }
        self.evaluate_slots(check, now, out)
    }

    /// [`Counters::evaluate`] for a check of several counters, or of a key not held yet.
    fn evaluate_slots(
        &mut self,
        check: &Check,
        now: u64,
        out: &mut Decisions,
    ) -> Result<Outcome, StoreError> {
        let mut new_keys = 0usize;
        let mut states: States = check
            .counters
            .iter()
            .map(|counter| match self.keys.get(&counter.key) {
                Some(slot) => State {
                    a: slot.a,
                    b: slot.b,
                },
                None => {
                    new_keys += 1;
                    algorithm::init(&counter.rate, now)
                }
            })
            .collect();
        let first = out.len();
        let denied = check.decide(&mut states, now, out);
        let outcome = match denied {
            // `decide` answers the index of one of the check's counters.
            Some((index, retry_after)) => Outcome::Denied {
                key: check.counters[index].key,
                retry_after,
            },
            None => Outcome::Admitted,
        };
        if !check.writes(denied.is_none()) {
            return Ok(outcome);
        }
        // A refund has nothing to give back to a key not held (its state stays a fresh
        // one's): it creates no key, so it never meets the key cap or a rule's budget.
        let creates = check.charge != check::Charge::Refund;
        if creates && new_keys > 0 {
            self.room_for(check)?;
        }
        // Charged: `decide` pushed each counter's decision, in order.
        for ((counter, state), decision) in check.counters.iter().zip(states).zip(&out[first..]) {
            if !creates && !self.keys.contains_key(&counter.key) {
                continue;
            }
            let expires = expires(
                now,
                algorithm::lifetime(&counter.rate, decision.reset_after),
            );
            self.insert(
                counter.key,
                Slot {
                    a: state.a,
                    b: state.b,
                    expires,
                },
            );
        }
        Ok(outcome)
    }

    /// Whether the keys of `check` this shard lacks fit: under `max_keys`, and each under
    /// its rule's budget (a check's counters are of different rules: one per limit).
    fn room_for(&mut self, check: &Check) -> Result<(), StoreError> {
        let new = || {
            check
                .counters
                .iter()
                .filter(|counter| !self.keys.contains_key(&counter.key))
        };
        if self.keys.len() + new().count() > self.max_keys {
            self.stats.key_capacity_hits.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::KeyCapacity {
                shard: self.shard,
                max_keys: self.max_keys,
            });
        }
        let over = new().map(|counter| counter.key.rule()).find(|&rule| {
            let live = self.rules.get(&rule).map_or(0, |count| count.live as usize);
            live >= self.budgets.per_shard(rule)
        });
        let Some(rule) = over else { return Ok(()) };
        let count = self.rules.entry(rule).or_default();
        count.refused = count.refused.saturating_add(1);
        Err(StoreError::RuleKeyBudget {
            shard: self.shard,
            rule,
            max_keys: self.budgets.per_shard(rule),
        })
    }

    /// Stores a key's state, counting a new key against its rule.
    fn insert(&mut self, key: KeyId, slot: Slot) {
        if self.keys.insert(key, slot).is_none() {
            let count = self.rules.entry(key.rule()).or_default();
            count.live = count.live.saturating_add(1);
        }
    }

    /// Forgets a key's state; answers whether there was one.
    fn remove(&mut self, key: &KeyId) -> bool {
        let held = self.keys.remove(key).is_some();
        if held {
            forget(&mut self.rules, key.rule());
        }
        held
    }

    /// Merges a handed-over counter for `counter`'s key into this shard's own.
    fn absorb(&mut self, counter: &Counter, now: u64) {
        let Some(handed) = self.pending.remove(&counter.key) else {
            return;
        };
        let Some(slot) = self.keys.get_mut(&counter.key) else {
            return;
        };
        for theirs in handed {
            let ours = State {
                a: slot.a,
                b: slot.b,
            };
            let theirs_state = State {
                a: theirs.a,
                b: theirs.b,
            };
            let merged = algorithm::merge(&counter.rate, ours, theirs_state, now);
            *slot = Slot {
                a: merged.a,
                b: merged.b,
                expires: slot.expires.max(theirs.expires),
            };
        }
    }

    fn export_part(
        &mut self,
        part: usize,
        keep: &dyn Fn(u64) -> bool,
        out: &mut Vec<(KeyId, Slot)>,
    ) {
        let before = out.len();
        self.keys.extract_part(part, out, |key, _| !keep(key.route));
        for (key, _) in &out[before..] {
            forget(&mut self.rules, key.rule());
        }
        let mut handed = Vec::new();
        self.pending
            .extract_part(part, &mut handed, |key, _| !keep(key.route));
        for (key, slots) in handed {
            out.extend(slots.into_iter().map(|slot| (key, slot)));
        }
    }

    /// Takes counters from another node: new keys are stored as they are; for keys this
    /// shard has, the state is kept aside and merged on the key's next use.
    fn import(&mut self, counters: Vec<(KeyId, Slot)>) -> usize {
        let mut kept = 0;
        for (key, slot) in counters {
            let room = if self.keys.contains_key(&key) {
                let room = self.pending.len() < self.max_keys;
                if room {
                    self.pending.get_or_insert_with(key, Vec::new).push(slot);
                    self.pending.lower_due(&key, slot.expires);
                }
                room
            } else if self.keys.len() < self.max_keys
                && self
                    .rules
                    .get(&key.rule())
                    .map_or(0, |count| count.live as usize)
                    < self.budgets.per_shard(key.rule())
            {
                self.insert(key, slot);
                true
            } else {
                false
            };
            if room {
                kept += 1;
            } else {
                self.stats.import_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.stats
            .imported
            .fetch_add(kept as u64, Ordering::Relaxed);
        kept
    }

    /// Pushes what each counter of `check` would say with nothing consumed.
    fn peek(&self, check: &Check, now: u64, out: &mut Decisions) {
        for counter in &check.counters {
            out.push(check::peek(
                &counter.rate,
                self.state_of(counter, now),
                now,
                check.cost,
            ));
        }
    }

    fn state_of(&self, counter: &Counter, now: u64) -> State {
        match self.keys.get(&counter.key) {
            Some(slot) => State {
                a: slot.a,
                b: slot.b,
            },
            None => algorithm::init(&counter.rate, now),
        }
    }
}

/// Counts one key of `rule` gone; a rule with no keys and no refusals left is dropped.
fn forget(rules: &mut HashMap<u32, RuleCount>, rule: u32) {
    if let Entry::Occupied(mut entry) = rules.entry(rule) {
        let count = entry.get_mut();
        count.live = count.live.saturating_sub(1);
        if count.live == 0 && count.refused == 0 {
            entry.remove();
        }
    }
}

/// The [`expiry`] tick from which a key whose state matters for `lifetime` nanoseconds from
/// `now` may be forgotten. No slack is added: each node forgets by its own clock, which is
/// also the clock its decisions use (a counter handed over from a node whose clock is a
/// little behind is forgotten a little early here, when by this node's clock its window is
/// over or its bucket full anyway).
fn expires(now: u64, lifetime: u64) -> u32 {
    expiry::tick_at_or_after(now.saturating_add(lifetime))
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

mod table;

#[cfg(test)]
mod tests;
