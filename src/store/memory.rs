//! The in-memory store: one node's counters, in this process.
//!
//! [`MemoryStore`] is the [`Store`] of a single node: [`engine`] routes each check to the
//! shard owning its key and steps that shard on the caller's task; [`shard`] holds one
//! shard's counters and decides with the pure algorithms. Cluster mode
//! ([`crate::store::cluster`]) wraps this store across peers: the checks a node owns are
//! decided here, the others on their owners.
//!
//! Invariants: a check this node decides without waiting is answered at once
//! ([`Checked::Ready`]: no allocation, no task hop); only the shards mutate counters.

pub mod engine;
pub mod shard;

use prometheus_client::registry::Registry;

pub use self::engine::{Engine, EngineConfig};
use crate::check::Checks;
use crate::key::{KeyId, shard_of};
use crate::store::{Capabilities, Checked, Placement, ResetFuture, RuleKeys, Store};

/// One node's counters: its engine's shards. Cheap to clone.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    engine: Engine,
}

impl MemoryStore {
    pub fn new(engine: Engine) -> MemoryStore {
        MemoryStore { engine }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Registers the shards' metrics (read at scrape time) in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.engine.register_metrics(registry);
    }

    /// This node's shard holding the counters of `route`, and its shard count.
    pub fn shard_of(&self, route: u64) -> (usize, usize) {
        let shards = self.engine.shard_count();
        (shard_of(route, shards), shards)
    }
}

impl Store for MemoryStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::MEMORY
    }

    fn check(&self, checks: Checks) -> Checked<'_> {
        match self.engine.start(checks) {
            Ok(started) => match started.progress() {
                engine::Progress::Decided(decisions) => Checked::Ready(Ok(decisions)),
                engine::Progress::Waiting(waiting) => Checked::Pending(Box::pin(waiting.finish())),
            },
            Err(error) => Checked::Ready(Err(error)),
        }
    }

    fn placement(&self, route: u64) -> Placement {
        Placement {
            shard: Some(self.shard_of(route)),
            owner: None,
            local: true,
        }
    }

    fn peek(&self, checks: Checks) -> Checked<'_> {
        Checked::Ready(Ok(self.engine.peek(&checks)))
    }

    fn all_rule_keys(&self) -> Vec<(u32, RuleKeys)> {
        self.engine.rule_keys()
    }

    fn rule_keys(&self, rule: u32) -> Option<RuleKeys> {
        Some(self.engine.rule(rule))
    }

    fn reset(&self, keys: Vec<KeyId>) -> ResetFuture<'_> {
        Box::pin(std::future::ready(Ok(self.engine.reset(&keys))))
    }
}

/// Helpers shared with the tests of the stores built on this one (`cluster`).
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::algorithm::{NANOS_PER_SEC, Rate, Unit};
    use crate::check::{Check, Counter};
    use crate::clock::Clock;
    use crate::key::KeyBuilder;

    /// A small two-shard engine whose clock reads 2024-01-04T00:00:00Z.
    pub(crate) fn engine() -> Engine {
        let config = EngineConfig {
            shards: 2,
            max_keys: 100,
            max_waiters: 10,
            rule_key_share: 1.0,
        };
        Engine::spawn(config, Clock::starting_at(1_704_326_400 * NANOS_PER_SEC))
    }

    /// A check of one hit on `value`'s counter, limited to 2 an hour.
    pub(crate) fn check(value: &str) -> Check {
        let rate = Rate::fixed(2, Unit::Hour);
        Check {
            counters: smallvec::smallvec![Counter {
                key: KeyBuilder::new("d").entry("k", value).key(&rate),
                rate,
            }],
            cost: 1,
            wait: None,
            charge: crate::check::Charge::Admitted,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_single_node_decides_everything_on_its_engine_at_once() {
        let memory = MemoryStore::new(engine());
        let checks = smallvec::smallvec![check("a"), check("b"), check("a")];
        let Checked::Ready(decisions) = memory.check(checks) else {
            panic!("checks that do not wait are decided without a future");
        };
        let remaining: Vec<u32> = decisions
            .expect("answers")
            .iter()
            .map(|decision| decision.remaining)
            .collect();
        assert_eq!(remaining, [1, 1, 0]);
        let placement = memory.placement(KeyBuilder::new("d").entry("k", "a").route());
        assert!(placement.local && placement.owner.is_none());
        assert_eq!(placement.shard.map(|(_, shards)| shards), Some(2));
    }
}
