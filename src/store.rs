//! The store seam: where the limiter hands a request's [`Checks`] over to be counted.
//!
//! A store decides every check of a request and answers one [`Decision`](crate::check::Decision)
//! per counter, in order ([`crate::check`] has the vocabulary). Today there is one store, the
//! in-memory engine, alone or in cluster mode ([`Cluster`](crate::cluster::Cluster)
//! implements [`Store`]); another store (Redis, say) is one module implementing this trait,
//! chosen in `server`.
//!
//! A store says what it can do ([`Capabilities`]): one that cannot hold a check back
//! (`max_wait` waiting needs a FIFO queue next to the counter) says `wait: false`, and the
//! limiter then never asks it to wait.
//!
//! [`Store::check`] answers [`Checked::Ready`] when it decided without waiting (the
//! in-memory store, for keys this node owns: no allocation, no task hop), and
//! [`Checked::Pending`] with a future otherwise (a forward to another node, a check queued
//! for capacity, a network round trip).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::check::{Checks, Decisions};
use crate::error::StoreError;

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

/// What a store can do beyond counting, and the limits it can count exactly. Limits files
/// are validated against the selected store's capabilities, so a limit the store cannot
/// honour is refused at load, naming the file and the place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// How config errors name the store (`--store redis`).
    pub name: &'static str,
    /// It can hold a check back in a FIFO queue until capacity frees up (`max_wait`).
    pub wait: bool,
    /// The most `requests_per_unit` a `sliding_window` limit may have (`None`: any).
    pub max_sliding_per_unit: Option<u32>,
    /// The longest a `token_bucket` or `gcra` limit may take to refill from empty
    /// (`unit / requests_per_unit * burst`; `None`: any).
    pub max_refill: Option<Duration>,
}

impl Default for Capabilities {
    fn default() -> Capabilities {
        Capabilities::MEMORY
    }
}

impl Capabilities {
    /// The in-memory engine, alone or clustered: everything.
    pub const MEMORY: Capabilities = Capabilities {
        name: "--store memory",
        wait: true,
        max_sliding_per_unit: None,
        max_refill: None,
    };
}

/// Counts and decides checks.
pub trait Store: Send + Sync + std::fmt::Debug {
    fn capabilities(&self) -> Capabilities;

    /// Decides `checks`: one decision per counter, in order. A denied check consumes
    /// nothing; the counters of one check consume all or nothing.
    fn check(&self, checks: Checks) -> Checked<'_>;
}

pub mod redis;
