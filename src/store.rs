//! The store seam: where the limiter hands a request's [`Checks`] over to be counted.
//!
//! A store decides every check of a request and answers one [`Decision`](crate::check::Decision)
//! per counter, in order ([`crate::check`] has the vocabulary). The stores sit side by side
//! under this module, each implementing [`Store`]; `server` builds the one `--store` and the
//! peer flags select, and nothing of the others:
//! - [`memory`]: one node's counters in this process ([`MemoryStore`](memory::MemoryStore):
//!   the engine's shards);
//! - [`cluster`]: the memory store across peers ([`Cluster`](cluster::Cluster) wraps this
//!   node's `MemoryStore` and forwards the checks other nodes own, over the cluster
//!   runtime, [`crate::cluster`]);
//! - [`redis`]: the counters in Redis, shared by every node
//!   ([`RedisStore`](redis::RedisStore)).
//!
//! A new store is one more module here implementing this trait (see ARCHITECTURE.md).
//!
//! A store says what it can do ([`Capabilities`]): one that cannot hold a check back
//! (`max_wait` waiting needs a FIFO queue next to the counter) says `wait: false`, and the
//! limiter then never asks it to wait.
//!
//! Explanations (`Limiter::explain`) ask two more things: where a descriptor's counters
//! live ([`Store::placement`], with a default) and their state without consuming
//! ([`Store::peek`]: checks read where `check` would decide them, each counter saying
//! whether the check's cost fits and when it would, with no fallback standing in for an
//! owner that cannot answer).
//!
//! An operator's reset (`DELETE /counters/{domain}`) asks [`Store::reset`] to forget a
//! descriptor's counters wherever they live; a store that cannot says so (the default).
//!
//! [`Store::check`] answers [`Checked::Ready`] when it decided without waiting (the
//! in-memory store, for keys this node owns: no allocation, no task hop), and
//! [`Checked::Pending`] with a future otherwise (a forward to another node, a check queued
//! for capacity, a network round trip).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use self::build::{BuildError, Built, StoreOptions, build};
pub use crate::check::{Capabilities, RuleKeys};
use crate::check::{Checks, Decisions};
use crate::error::StoreError;
use crate::key::KeyId;

/// What a store decided, or the future that will.
pub enum Checked<'a> {
    Ready(Result<Decisions, StoreError>),
    Pending(StoreFuture<'a>),
}

impl Checked<'_> {
    /// The decisions, waiting for them if needed.
    pub async fn wait(self) -> Result<Decisions, StoreError> {
        match self {
            Checked::Ready(result) => result,
            Checked::Pending(future) => future.await,
        }
    }
}

pub type StoreFuture<'a> = Pin<Box<dyn Future<Output = Result<Decisions, StoreError>> + Send + 'a>>;

/// What [`Store::reset`] answers: how many of the keys held a counter.
pub type ResetFuture<'a> = Pin<Box<dyn Future<Output = Result<usize, StoreError>> + Send + 'a>>;

/// Where the counters of one route live, as far as the store knows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The shard holding them on this node, and this node's shard count (`None` when
    /// another node owns them: its shards are its own).
    pub shard: Option<(usize, usize)>,
    /// The node owning them (cluster mode), by its peer address.
    pub owner: Option<Arc<str>>,
    /// Whether this node reaches them itself (its own engine, or a store every node shares,
    /// like Redis) rather than through another node that owns them.
    pub local: bool,
}

/// Counts and decides checks.
pub trait Store: Send + Sync + std::fmt::Debug {
    fn capabilities(&self) -> Capabilities;

    /// Decides `checks`: one decision per counter, in order. A denied check consumes
    /// nothing; the counters of one check consume all or nothing.
    fn check(&self, checks: Checks) -> Checked<'_>;

    /// Where the counters of `route` live (for explanations).
    fn placement(&self, _route: u64) -> Placement {
        Placement {
            local: true,
            ..Placement::default()
        }
    }

    /// Reports `checks` as their counters stand, from wherever they live, consuming nothing
    /// and never waiting (a check's `wait` is ignored): one decision per counter, in order,
    /// saying whether the check's cost would be admitted now, what remains, and when it
    /// would not be, how long until it would (`retry_after`; `None`: never).
    /// [`check::peek`](crate::check::peek) computes that from a counter's state. A store
    /// that would stand in for an unreachable owner answers an error instead, so the state
    /// reported is always the real one.
    fn peek(&self, checks: Checks) -> Checked<'_>;

    /// The live keys of the rule tagged `rule` ([`KeyId::rule`]) on this node, against its
    /// budget; `None` for a store that keeps no budgets (Redis: its own memory policy and
    /// the keys' TTLs bound it).
    fn rule_keys(&self, _rule: u32) -> Option<RuleKeys> {
        None
    }

    /// [`Store::rule_keys`] of every rule with keys (or refusals) on this node.
    fn all_rule_keys(&self) -> Vec<(u32, RuleKeys)> {
        Vec::new()
    }

    /// Forgets the counters of `keys` (all limits of one descriptor: one route) wherever
    /// they live, so the descriptor starts afresh; answers how many existed. An owner that
    /// cannot be reached is an error, never a silent success. A store that cannot reset
    /// answers [`StoreError::Unsupported`].
    fn reset(&self, _keys: Vec<KeyId>) -> ResetFuture<'_> {
        Box::pin(std::future::ready(Err(StoreError::Unsupported {
            what: "resetting counters",
        })))
    }
}

mod build;
pub mod cluster;
pub mod memory;
pub mod redis;
