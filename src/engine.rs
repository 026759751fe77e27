//! The engine: routes checks to shard actors and gathers their decisions.
//!
//! [`Engine::check`] groups a request's checks by shard (FNV-1a route hash, mixed, modulo the
//! shard count), sends one message per shard with `try_send` (a full mailbox fails fast with
//! [`EngineError::Overloaded`] instead of queueing without bound), and reassembles the replies
//! in request order. The engine holds no counters itself: only shards mutate state.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, oneshot};

use crate::algorithm::Decision;
use crate::clock::Clock;
use crate::key::KeyId;
use crate::shard::{
    Check, CheckReply, KeepRoute, Message, Shard, ShardConfig, ShardError, ShardStats, Slot,
};

/// Sizes of the engine.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// Number of shard actors (at least 1).
    pub shards: usize,
    /// Mailbox capacity of each shard, in messages.
    pub queue_capacity: usize,
    /// Live keys across all shards; each shard holds at most its share.
    pub max_keys: usize,
    /// Checks waiting in FIFO queues across all shards.
    pub max_waiters: usize,
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            shards: std::thread::available_parallelism().map_or(2, |n| n.get()),
            queue_capacity: 4096,
            max_keys: 4_000_000,
            max_waiters: 100_000,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EngineError {
    #[error("shard {shard} is overloaded: its queue is full")]
    Overloaded { shard: usize },
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error("shard {shard} stopped")]
    Stopped { shard: usize },
    /// The key's owner node answered with an error of its own.
    #[error("owner node: {0}")]
    Peer(String),
}

/// A cloneable handle to the shard actors. The actors end when the last handle drops.
#[derive(Clone)]
pub struct Engine {
    shards: Arc<[mpsc::Sender<Message>]>,
    stats: Arc<[Arc<ShardStats>]>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl Engine {
    /// Spawns the shard actors on the current tokio runtime.
    pub fn spawn(config: EngineConfig, clock: Clock) -> Engine {
        let count = config.shards.max(1);
        let shard_config = ShardConfig {
            max_keys: config.max_keys.div_ceil(count).max(1),
            max_waiters: config.max_waiters.div_ceil(count),
        };
        let mut senders = Vec::with_capacity(count);
        let mut stats = Vec::with_capacity(count);
        for index in 0..count {
            let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
            let shard_stats = Arc::new(ShardStats::default());
            let shard = Shard::new(index, rx, clock, shard_config, Arc::clone(&shard_stats));
            tokio::spawn(shard.run());
            senders.push(tx);
            stats.push(shard_stats);
        }
        Engine {
            shards: senders.into(),
            stats: stats.into(),
        }
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Messages waiting in each shard's mailbox.
    pub fn queue_depths(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|sender| sender.max_capacity() - sender.capacity())
            .collect()
    }

    /// Per-shard counters, for metrics.
    pub fn stats(&self) -> &[Arc<ShardStats>] {
        &self.stats
    }

    /// Decides `checks`; returns one decision per counter, in order.
    pub async fn check(&self, checks: Vec<Check>) -> Result<Vec<Decision>, EngineError> {
        let shards = self.shards.len();
        let first = match checks.first() {
            Some(check) => route_of(check),
            None => return Ok(Vec::new()),
        };
        let first_shard = crate::key::shard_of(first, shards);
        let single = checks
            .iter()
            .all(|check| crate::key::shard_of(route_of(check), shards) == first_shard);
        if single {
            // The common case: everything on one shard, no regrouping.
            return self.send(first_shard, checks)?.recv().await;
        }
        // Group by shard, remembering where each check's decisions go.
        let mut groups: Vec<Vec<Check>> = (0..shards).map(|_| Vec::new()).collect();
        let mut offsets = Vec::with_capacity(checks.len());
        let mut total = 0;
        for check in checks {
            let shard = crate::key::shard_of(route_of(&check), shards);
            offsets.push((shard, total, check.counters.len()));
            total += check.counters.len();
            groups[shard].push(check);
        }
        let mut waits = Vec::new();
        for (shard, group) in groups.into_iter().enumerate() {
            if !group.is_empty() {
                waits.push((shard, self.send(shard, group)?));
            }
        }
        let mut replies: Vec<Option<std::vec::IntoIter<Decision>>> =
            (0..shards).map(|_| None).collect();
        for (shard, wait) in waits {
            replies[shard] = Some(wait.recv().await?.into_iter());
        }
        let mut decisions = vec![EMPTY; total];
        for (shard, offset, len) in offsets {
            let Some(reply) = replies[shard].as_mut() else {
                return Err(EngineError::Stopped { shard });
            };
            for slot in &mut decisions[offset..offset + len] {
                *slot = reply.next().ok_or(EngineError::Stopped { shard })?;
            }
        }
        Ok(decisions)
    }

    /// Removes and returns every counter whose route `keep` rejects, from all shards (for
    /// handing them to other nodes). Waits for room in the mailboxes: not a request path.
    pub async fn export(&self, keep: KeepRoute) -> Vec<(KeyId, Slot)> {
        let mut waits = Vec::with_capacity(self.shards.len());
        for sender in self.shards.iter() {
            let (reply, rx) = oneshot::channel();
            let message = Message::Export {
                keep: Arc::clone(&keep),
                reply,
            };
            if sender.send(message).await.is_ok() {
                waits.push(rx);
            }
        }
        let mut out = Vec::new();
        for wait in waits {
            out.extend(wait.await.unwrap_or_default());
        }
        out
    }

    /// Hands counters from another node to their shards; returns how many were kept.
    pub async fn import(&self, counters: Vec<(KeyId, Slot)>) -> usize {
        let shards = self.shards.len();
        let mut groups: Vec<Vec<(KeyId, Slot)>> = (0..shards).map(|_| Vec::new()).collect();
        for (key, slot) in counters {
            groups[key.shard(shards)].push((key, slot));
        }
        let mut waits = Vec::new();
        for (sender, counters) in self.shards.iter().zip(groups) {
            if counters.is_empty() {
                continue;
            }
            let (reply, rx) = oneshot::channel();
            if sender
                .send(Message::Import { counters, reply })
                .await
                .is_ok()
            {
                waits.push(rx);
            }
        }
        let mut kept = 0;
        for wait in waits {
            kept += wait.await.unwrap_or(0);
        }
        kept
    }

    fn send(&self, shard: usize, checks: Vec<Check>) -> Result<ReplyFuture, EngineError> {
        let (reply, rx) = oneshot::channel();
        let message = Message::Check {
            checks,
            reply,
            sent_at: tokio::time::Instant::now(),
        };
        match self.shards[shard].try_send(message) {
            Ok(()) => Ok(ReplyFuture { shard, rx }),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.stats[shard].overloads.fetch_add(1, Ordering::Relaxed);
                Err(EngineError::Overloaded { shard })
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(EngineError::Stopped { shard }),
        }
    }
}

const EMPTY: Decision = Decision {
    allowed: true,
    remaining: 0,
    reset_after: 0,
    retry_after: Some(0),
};

fn route_of(check: &Check) -> u64 {
    check
        .counters
        .first()
        .map_or(0, |counter| counter.key.route)
}

struct ReplyFuture {
    shard: usize,
    rx: oneshot::Receiver<CheckReply>,
}

impl ReplyFuture {
    async fn recv(self) -> Result<Vec<Decision>, EngineError> {
        match self.rx.await {
            Ok(reply) => Ok(reply?),
            Err(_) => Err(EngineError::Stopped { shard: self.shard }),
        }
    }
}

#[cfg(test)]
mod tests;
