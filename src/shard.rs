//! Shard actors: each owns the counters of the keys that hash to it.
//!
//! A shard is a tokio task with a bounded mailbox. One [`Message::Check`] carries every check
//! of one request that routes to this shard; the reply goes back through a `oneshot`. Only
//! the shard touches its map, so the request path takes no locks.
//!
//! Invariants:
//! - All limits of one descriptor (one [`Check`]) are decided together: either every counter
//!   admits the cost and all consume it, or none consumes anything.
//! - The number of live keys never exceeds `max_keys`; the number of waiting checks never
//!   exceeds `max_waiters` (and each key's queue its own `max_queue`).
//! - Keys idle for three of their windows (see [`algorithm::idle_expiry`]) are swept.
//! - A waiter whose caller has gone away is dropped without consuming.
//! - Waiters on one key are served first in, first out; a new waiting check never overtakes
//!   one already queued on the same key.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, MissedTickBehavior};

use crate::algorithm::{self, Decision, NANOS_PER_SEC, Rate, State};
use crate::clock::Clock;
use crate::key::{KeyHasher, KeyId};
use crate::metrics::AtomicHistogram;

/// How often a shard sweeps out idle keys.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Messages a shard takes from its mailbox per wake-up.
const RECV_BATCH: usize = 64;

/// One limit of a descriptor: the counter's key and its rate.
#[derive(Clone, Copy, Debug)]
pub struct Counter {
    pub key: KeyId,
    pub rate: Rate,
}

/// Opt-in waiting: a check that would be over its limit may wait up to `max_wait` in the
/// key's FIFO queue for capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPolicy {
    pub max_wait: Duration,
    pub max_queue: u32,
}

/// The limits of one request descriptor, decided together.
#[derive(Clone, Debug)]
pub struct Check {
    /// All with the same `key.route`.
    pub counters: Vec<Counter>,
    /// Hits to consume; 0 checks without consuming.
    pub cost: u64,
    pub wait: Option<WaitPolicy>,
}

pub type CheckReply = Result<Vec<Decision>, ShardError>;

/// Which routes a shard keeps when exporting (cluster handoff).
pub type KeepRoute = Arc<dyn Fn(u64) -> bool + Send + Sync>;

pub enum Message {
    /// Decide `checks`; reply with one decision per counter, in order.
    Check {
        checks: Vec<Check>,
        reply: oneshot::Sender<CheckReply>,
        /// When the engine queued it (for the queue wait metric).
        sent_at: Instant,
    },
    /// Remove and return every counter whose route `keep` rejects.
    Export {
        keep: KeepRoute,
        reply: oneshot::Sender<Vec<(KeyId, Slot)>>,
    },
    /// Take counters handed over by another node; reply with how many were kept.
    Import {
        counters: Vec<(KeyId, Slot)>,
        reply: oneshot::Sender<usize>,
    },
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ShardError {
    #[error("shard {shard} is full: it holds its maximum of {max_keys} keys")]
    KeyCapacity { shard: usize, max_keys: usize },
}

/// Sizes of one shard.
#[derive(Clone, Copy, Debug)]
pub struct ShardConfig {
    pub max_keys: usize,
    pub max_waiters: usize,
}

/// Counters a shard keeps for scrapes; written by the shard only.
#[derive(Debug, Default)]
pub struct ShardStats {
    pub live_keys: AtomicU64,
    pub expired_keys: AtomicU64,
    pub key_capacity_hits: AtomicU64,
    pub waiters: AtomicU64,
    pub waits_admitted: AtomicU64,
    pub waits_rejected: AtomicU64,
    /// Written by the engine when this shard's mailbox is full.
    pub overloads: AtomicU64,
    /// Time messages spent in the mailbox.
    pub queue_wait: AtomicHistogram,
    /// Counters taken from other nodes, and those dropped because the shard was full.
    pub imported: AtomicU64,
    pub import_dropped: AtomicU64,
}

/// A key's state plus when it may be forgotten (Unix seconds). 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub a: u64,
    pub b: u32,
    pub expires: u32,
}

/// The counters a shard owns.
struct Counters {
    shard: usize,
    keys: HashMap<KeyId, Slot, KeyHasher>,
    /// Handed-over counters for keys this shard already had: merged on the key's next use,
    /// when its rate is known. Bounded by `max_keys`.
    pending: HashMap<KeyId, Vec<Slot>, KeyHasher>,
    max_keys: usize,
    stats: Arc<ShardStats>,
}

struct Waiter {
    batch: u64,
    /// Index of this check's first decision in the batch's reply.
    offset: usize,
    check: Check,
    deadline: u64,
}

struct Queue {
    waiters: VecDeque<Waiter>,
    /// When this queue's head is next looked at (the timer that matters for it).
    wake_at: u64,
}

/// A reply held back until every waiting check in it is settled.
struct Pending {
    decisions: Vec<Decision>,
    outstanding: usize,
    reply: oneshot::Sender<CheckReply>,
}

pub struct Shard {
    rx: mpsc::Receiver<Message>,
    clock: Clock,
    counters: Counters,
    max_waiters: usize,
    queues: HashMap<KeyId, Queue, KeyHasher>,
    timers: BinaryHeap<Reverse<(u64, KeyId)>>,
    pending: HashMap<u64, Pending>,
    next_batch: u64,
    waiting: usize,
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

impl Shard {
    pub fn new(
        shard: usize,
        rx: mpsc::Receiver<Message>,
        clock: Clock,
        config: ShardConfig,
        stats: Arc<ShardStats>,
    ) -> Shard {
        Shard {
            rx,
            clock,
            counters: Counters {
                shard,
                keys: HashMap::with_hasher(KeyHasher::default()),
                pending: HashMap::with_hasher(KeyHasher::default()),
                max_keys: config.max_keys,
                stats,
            },
            max_waiters: config.max_waiters,
            queues: HashMap::with_hasher(KeyHasher::default()),
            timers: BinaryHeap::new(),
            pending: HashMap::new(),
            next_batch: 0,
            waiting: 0,
        }
    }

    /// Runs until every sender of the mailbox is gone.
    pub async fn run(mut self) {
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut inbox = Vec::with_capacity(RECV_BATCH);
        let timer = tokio::time::sleep_until(Instant::now());
        tokio::pin!(timer);
        let mut armed: Option<u64> = None;
        loop {
            let next = self.timers.peek().map(|Reverse((at, _))| *at);
            if next != armed
                && let Some(at) = next
            {
                timer.as_mut().reset(self.clock.instant_at(at));
            }
            armed = next;
            tokio::select! {
                biased;
                received = self.rx.recv_many(&mut inbox, RECV_BATCH) => {
                    if received == 0 {
                        break;
                    }
                    // One clock read for the whole batch of messages.
                    let arrived = Instant::now();
                    let now = self.clock.unix_at(arrived);
                    for message in inbox.drain(..) {
                        self.handle(message, arrived, now);
                    }
                }
                () = &mut timer, if armed.is_some() => {
                    armed = None;
                    self.fire_timers();
                }
                _ = sweep.tick() => self.sweep(),
            }
            self.publish();
        }
    }

    fn handle(&mut self, message: Message, arrived: Instant, now: u64) {
        match message {
            Message::Check {
                checks,
                reply,
                sent_at,
            } => {
                let waited = arrived.saturating_duration_since(sent_at);
                self.counters.stats.queue_wait.observe(waited);
                self.check(checks, reply, now);
            }
            Message::Export { keep, reply } => {
                let _ = reply.send(self.counters.export(&*keep));
            }
            Message::Import { counters, reply } => {
                let _ = reply.send(self.counters.import(counters));
            }
        }
    }

    fn publish(&self) {
        let stats = &self.counters.stats;
        stats
            .live_keys
            .store(self.counters.keys.len() as u64, Ordering::Relaxed);
        stats.waiters.store(self.waiting as u64, Ordering::Relaxed);
    }

    fn check(&mut self, checks: Vec<Check>, reply: oneshot::Sender<CheckReply>, now: u64) {
        let total = checks.iter().map(|check| check.counters.len()).sum();
        let mut decisions = Vec::with_capacity(total);
        // Checks that wait are queued only once the whole batch evaluated without error.
        let mut to_queue: Vec<(KeyId, Waiter, u64)> = Vec::new();
        let mut queued_here = 0usize;
        for check in checks {
            let offset = decisions.len();
            let policy = check.wait.filter(|_| check.cost > 0);
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
                    self.counters.peek(&check, now, &mut decisions);
                    Outcome::Denied {
                        key,
                        retry_after: Some(0),
                    }
                }
                None => match self.counters.evaluate(&check, now, &mut decisions) {
                    Ok(outcome) => outcome,
                    Err(error) => {
                        let _ = reply.send(Err(error));
                        return;
                    }
                },
            };
            let (Some(policy), Outcome::Denied { key, retry_after }) = (policy, outcome) else {
                continue;
            };
            let deadline = now.saturating_add(duration_nanos(policy.max_wait));
            let queue_len = self.queues.get(&key).map_or(0, |queue| queue.waiters.len());
            let room = queue_len + queued_here < policy.max_queue as usize
                && self.waiting + queued_here < self.max_waiters;
            match retry_after {
                Some(wait) if room && now.saturating_add(wait) <= deadline => {
                    queued_here += 1;
                    let waiter = Waiter {
                        batch: 0,
                        offset,
                        check,
                        deadline,
                    };
                    to_queue.push((key, waiter, now.saturating_add(wait)));
                }
                _ => {
                    self.counters
                        .stats
                        .waits_rejected
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if to_queue.is_empty() {
            // The caller may have left; nothing to undo then.
            let _ = reply.send(Ok(decisions));
            return;
        }
        let batch = self.next_batch;
        self.next_batch += 1;
        self.pending.insert(
            batch,
            Pending {
                decisions,
                outstanding: to_queue.len(),
                reply,
            },
        );
        for (key, mut waiter, wake_at) in to_queue {
            waiter.batch = batch;
            self.waiting += 1;
            let queue = self.queues.entry(key).or_insert_with(|| Queue {
                waiters: VecDeque::new(),
                wake_at: u64::MAX,
            });
            queue.waiters.push_back(waiter);
            if queue.waiters.len() == 1 {
                queue.wake_at = wake_at;
                self.timers.push(Reverse((wake_at, key)));
            }
        }
    }

    /// Serves every queue whose timer is due.
    fn fire_timers(&mut self) {
        let now = self.clock.now();
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
        let mut scratch = Vec::new();
        while let Some(waiter) = queue.waiters.front() {
            let gone = self
                .pending
                .get(&waiter.batch)
                .is_none_or(|pending| pending.reply.is_closed());
            if gone {
                self.settle(queue.waiters.pop_front(), None);
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
                    self.settle(queue.waiters.pop_front(), Some(&scratch));
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
                            self.settle(queue.waiters.pop_front(), Some(&scratch));
                        }
                    }
                }
            }
        }
        if !queue.waiters.is_empty() {
            self.queues.insert(key, queue);
        }
    }

    /// Records a waiter's decisions and sends its batch's reply when it was the last.
    fn settle(&mut self, waiter: Option<Waiter>, decisions: Option<&[Decision]>) {
        let Some(waiter) = waiter else { return };
        self.waiting -= 1;
        let Some(pending) = self.pending.get_mut(&waiter.batch) else {
            return;
        };
        if let Some(decisions) = decisions {
            let end = waiter.offset + decisions.len();
            if let Some(slots) = pending.decisions.get_mut(waiter.offset..end) {
                slots.copy_from_slice(decisions);
            }
        }
        pending.outstanding -= 1;
        if pending.outstanding == 0
            && let Some(pending) = self.pending.remove(&waiter.batch)
        {
            let _ = pending.reply.send(Ok(pending.decisions));
        }
    }

    fn sweep(&mut self) {
        let now_secs = unix_secs(self.clock.now());
        let before = self.counters.keys.len();
        self.counters.keys.retain(|_, slot| slot.expires > now_secs);
        self.counters.pending.retain(|_, slots| {
            slots.retain(|slot| slot.expires > now_secs);
            !slots.is_empty()
        });
        let expired = before - self.counters.keys.len();
        if expired > 0 {
            self.counters
                .stats
                .expired_keys
                .fetch_add(expired as u64, Ordering::Relaxed);
        }
        // Give memory back after a burst of keys went idle.
        let keys = &mut self.counters.keys;
        if keys.capacity() > 1024 && keys.len() < keys.capacity() / 4 {
            keys.shrink_to(keys.len() * 2);
        }
    }
}

impl Counters {
    /// Decides `check` at `now`, consuming on every counter if all admit. Pushes one
    /// decision per counter onto `out`.
    fn evaluate(
        &mut self,
        check: &Check,
        now: u64,
        out: &mut Vec<Decision>,
    ) -> Result<Outcome, ShardError> {
        if !self.pending.is_empty() {
            for counter in &check.counters {
                self.absorb(counter, now);
            }
        }
        if let [counter] = check.counters.as_slice()
            && let Some(slot) = self.keys.get_mut(&counter.key)
        {
            // The common case, a known key with one limit: decide in place, one probe.
            let mut state = State {
                a: slot.a,
                b: slot.b,
            };
            let decision = algorithm::decide(&counter.rate, &mut state, now, check.cost);
            out.push(decision);
            if !decision.allowed {
                return Ok(Outcome::Denied {
                    key: counter.key,
                    retry_after: decision.retry_after,
                });
            }
            if check.cost > 0 {
                let idle = algorithm::idle_expiry(&counter.rate);
                *slot = Slot {
                    a: state.a,
                    b: state.b,
                    expires: unix_secs(now.saturating_add(idle)),
                };
            }
            return Ok(Outcome::Admitted);
        }
        let start = out.len();
        let mut admitted = true;
        let mut denied: Option<(KeyId, Option<u64>)> = None;
        let mut states: [State; 4] = [State::default(); 4];
        let mut new_keys = 0usize;
        for (index, counter) in check.counters.iter().enumerate() {
            let mut state = match self.keys.get(&counter.key) {
                Some(slot) => State {
                    a: slot.a,
                    b: slot.b,
                },
                None => {
                    new_keys += 1;
                    algorithm::init(&counter.rate, now)
                }
            };
            let decision = algorithm::decide(&counter.rate, &mut state, now, check.cost);
            if let Some(saved) = states.get_mut(index) {
                *saved = state;
            }
            if !decision.allowed {
                admitted = false;
                let longest = match (denied, decision.retry_after) {
                    (None, retry) => Some((counter.key, retry)),
                    (Some((_, Some(old))), Some(new)) if new > old => {
                        Some((counter.key, Some(new)))
                    }
                    (Some((_, Some(_))), None) => Some((counter.key, None)),
                    (kept, _) => kept,
                };
                denied = longest;
            }
            out.push(decision);
        }
        if let Some((key, retry_after)) = denied {
            // Nothing is consumed: report the others as they stand without this request.
            out.truncate(start);
            self.peek(check, now, out);
            for (decision, counter) in out[start..].iter_mut().zip(&check.counters) {
                if counter.key == key {
                    decision.allowed = false;
                    decision.retry_after = retry_after;
                }
            }
            return Ok(Outcome::Denied { key, retry_after });
        }
        debug_assert!(admitted);
        if check.cost == 0 {
            return Ok(Outcome::Admitted);
        }
        if new_keys > 0 && self.keys.len() + new_keys > self.max_keys {
            self.stats.key_capacity_hits.fetch_add(1, Ordering::Relaxed);
            return Err(ShardError::KeyCapacity {
                shard: self.shard,
                max_keys: self.max_keys,
            });
        }
        for (index, counter) in check.counters.iter().enumerate() {
            let state = match states.get(index) {
                Some(state) => *state,
                // More than four limits on one descriptor: decide again, now consuming.
                None => {
                    let mut state = self.state_of(counter, now);
                    algorithm::decide(&counter.rate, &mut state, now, check.cost);
                    state
                }
            };
            let expires = unix_secs(now.saturating_add(algorithm::idle_expiry(&counter.rate)));
            self.keys.insert(
                counter.key,
                Slot {
                    a: state.a,
                    b: state.b,
                    expires,
                },
            );
        }
        Ok(Outcome::Admitted)
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

    /// Removes and returns every counter (and pending handoff) whose route `keep` rejects.
    fn export(&mut self, keep: &dyn Fn(u64) -> bool) -> Vec<(KeyId, Slot)> {
        let mut out: Vec<(KeyId, Slot)> = self.keys.extract_if(|key, _| !keep(key.route)).collect();
        for (key, handed) in self.pending.extract_if(|key, _| !keep(key.route)) {
            out.extend(handed.into_iter().map(|slot| (key, slot)));
        }
        out
    }

    /// Takes counters from another node: new keys are stored as they are; for keys this
    /// shard has, the state is kept aside and merged on the key's next use.
    fn import(&mut self, counters: Vec<(KeyId, Slot)>) -> usize {
        let mut kept = 0;
        for (key, slot) in counters {
            let room = if self.keys.contains_key(&key) {
                let room = self.pending.len() < self.max_keys;
                if room {
                    self.pending.entry(key).or_default().push(slot);
                }
                room
            } else if self.keys.len() < self.max_keys {
                self.keys.insert(key, slot);
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
    fn peek(&self, check: &Check, now: u64, out: &mut Vec<Decision>) {
        for counter in &check.counters {
            let mut state = self.state_of(counter, now);
            let mut decision = algorithm::decide(&counter.rate, &mut state, now, 0);
            // With cost 0 nothing is ever denied, unless the limit denies everything.
            decision.allowed = decision.allowed && check.cost <= u64::from(decision.remaining);
            out.push(decision);
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

fn unix_secs(nanos: u64) -> u32 {
    u32::try_from(nanos / NANOS_PER_SEC).unwrap_or(u32::MAX)
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
