//! Leases: hits an owner lends a node for a hot key, so the node admits them on its own
//! instead of forwarding every request.
//!
//! When a node forwards checks it could hold a lease for (one counter, a cost, no waiting:
//! [`leasable`]), the owner decides them as always. If one key comes up at least twice in
//! the same batch (the sender has concurrent requests for it: it is hot there; a client
//! asking one request at a time never gets a lease) and is admitted, the owner also takes a
//! share of what remains ([`policy`], [`crate::algorithm::lend`]) and answers it with the
//! decision. The node then admits that key's checks from the lease ([`Leases::spend`])
//! until it runs out, its window ends, or [`TTL`] passes; whatever is left goes back to the
//! owner that lent it (`Refund`), which takes it back as if it had never been lent
//! ([`crate::algorithm::refund`]: a window only while it lasts, a bucket at any time). If
//! that node no longer owns the key (it died, or the ring changed), the hits are not given
//! back: another owner never counted them, and taking them off its count would admit more.
//!
//! Exactness: lent hits are counted by the owner before the borrower admits any of them,
//! so leases never admit more than the limit; they can only hold hits back from other
//! nodes for at most [`TTL`] (an under-admission that ends when the lease returns). A
//! lease lost with its node (kill -9) is never given back: the rest of its window admits
//! that many fewer.
//!
//! Bounds: at most [`MAX_LEASES`] keys hold a lease on one node, and at most
//! [`MAX_REFUNDS`] refunds wait to be sent (beyond that, units are dropped: an
//! under-admission, never an over-admission).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::algorithm::{LendPolicy, Rate};
use crate::check::{Charge, Check, Counter, Decision};
use crate::key::KeyId;

/// How an owner lends, in a cluster of `members` nodes: at most 256 hits and at most
/// `1 / (2 x members)` of what remains per loan, and no loan under 8 hits (a limit too
/// small to share is forwarded every time, and counted exactly as it goes).
pub fn policy(members: u64) -> LendPolicy {
    LendPolicy {
        most: 256,
        share: 2 * members.max(1),
        least: 8,
    }
}
/// How long a lease may be spent at most (also the most it can hold hits back).
pub const TTL: Duration = Duration::from_secs(1);
/// Keys holding a lease on one node at most.
pub const MAX_LEASES: usize = 65_536;
/// Refunds waiting to be sent at most.
pub const MAX_REFUNDS: usize = 65_536;
const SHARDS: usize = 16;

/// Whether a node could hold a lease for `check`'s hits.
pub fn leasable(check: &Check) -> bool {
    match check.counters.as_slice() {
        // A refund goes to the owner's counter; a check that counts rejected hits spends a
        // lease only when admitted, and is otherwise forwarded, so the owner counts it.
        [counter] => {
            check.wait.is_none()
                && check.cost > 0
                && check.charge != Charge::Refund
                && counter.rate.requests_per_unit > 0
        }
        _ => false,
    }
}

/// Hits lent by an owner, as the owner answered them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The owner that lent (the only node a refund may go to).
    pub lender: Arc<str>,
    pub units: u64,
    pub window: u64,
    /// How long the lease may be spent (at most [`TTL`], never past the window's end).
    pub lease_for: Duration,
    /// The owner's remaining hits, and its reset, when it lent.
    pub remaining: u32,
    pub reset_after: Duration,
}

/// A check admitted from a lease: its decision, and the lease it spent (to give it back
/// if the check's request fails: [`Leases::unspend`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spent {
    pub decision: Decision,
    pub lender: Arc<str>,
    pub window: u64,
}

/// Unspent hits to give back to a counter's owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refund {
    pub lender: Arc<str>,
    pub counter: Counter,
    pub units: u64,
    pub window: u64,
}

#[derive(Debug)]
struct Lease {
    lender: Arc<str>,
    rate: Rate,
    units: u64,
    window: u64,
    expires: Instant,
    remaining: u32,
    reset_at: Instant,
}

/// Figures of this node's leases, for metrics.
#[derive(Debug, Default)]
pub struct LeaseStats {
    /// Units this node (as owner) lent to others.
    pub lent: AtomicU64,
    /// Checks this node admitted from a lease, without a forward.
    pub spent: AtomicU64,
    /// Units this node gave back unspent.
    pub returned: AtomicU64,
}

/// The leases this node holds, by key.
#[derive(Debug)]
pub struct Leases {
    shards: Box<[Mutex<HashMap<KeyId, Lease>>]>,
    refunds: Mutex<Vec<Refund>>,
    pub stats: LeaseStats,
}

impl Default for Leases {
    fn default() -> Leases {
        Leases {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            refunds: Mutex::new(Vec::new()),
            stats: LeaseStats::default(),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here can panic while holding a lock; the data stays usable if it did.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Leases {
    fn shard(&self, key: &KeyId) -> MutexGuard<'_, HashMap<KeyId, Lease>> {
        lock(&self.shards[key.shard(SHARDS)])
    }

    /// Admits `check` from its key's lease when the lease covers its cost; `None` when it
    /// must be forwarded.
    pub fn spend(&self, check: &Check, now: Instant) -> Option<Spent> {
        let [counter] = check.counters.as_slice() else {
            return None;
        };
        if !leasable(check) {
            return None;
        }
        let mut shard = self.shard(&counter.key);
        let lease = shard.get_mut(&counter.key)?;
        if lease.rate != counter.rate || now >= lease.expires || lease.units < check.cost {
            return None;
        }
        lease.units -= check.cost;
        let left = u32::try_from(lease.units).unwrap_or(u32::MAX);
        let remaining = lease.remaining_with(left);
        let reset_after = lease.reset_at.saturating_duration_since(now);
        let (lender, window) = (Arc::clone(&lease.lender), lease.window);
        drop(shard);
        self.stats.spent.fetch_add(1, Ordering::Relaxed);
        Some(Spent {
            decision: Decision {
                allowed: true,
                remaining,
                reset_after: u64::try_from(reset_after.as_nanos()).unwrap_or(u64::MAX),
                retry_after: Some(0),
            },
            lender,
            window,
        })
    }

    /// Gives back what `check` spent (`spent`: [`Leases::spend`]'s answer), because its
    /// request failed: to the lease it came from while that is still held (same lender,
    /// rate and window), else straight to the lender as a refund (taken back only while
    /// that window lasts). Either way the lender ends as if the check had never been
    /// admitted; a refund beyond [`MAX_REFUNDS`] is dropped (an under-admission).
    pub fn unspend(&self, check: &Check, spent: &Spent) {
        let [counter] = check.counters.as_slice() else {
            return;
        };
        let mut shard = self.shard(&counter.key);
        if let Some(lease) = shard.get_mut(&counter.key)
            && lease.lender == spent.lender
            && lease.rate == counter.rate
            && lease.window == spent.window
        {
            lease.units = lease.units.saturating_add(check.cost);
            return;
        }
        drop(shard);
        self.queue(Refund {
            lender: Arc::clone(&spent.lender),
            counter: *counter,
            units: check.cost,
            window: spent.window,
        });
    }

    /// Takes a lease the owner granted for `counter`. A lease from another window (or
    /// rate) that is still held is replaced and given back; one beyond the cap is given
    /// back at once.
    pub fn take(&self, counter: &Counter, grant: Grant, now: Instant) {
        let lease = Lease {
            lender: grant.lender,
            rate: counter.rate,
            // An owner lends at most what the counter can admit: a larger grant (from the
            // wire) is held to that, and grants add up without overflowing.
            units: grant.units.min(counter.rate.capacity()),
            window: grant.window,
            expires: now + grant.lease_for.min(TTL),
            remaining: grant.remaining,
            reset_at: now + grant.reset_after,
        };
        let mut shard = self.shard(&counter.key);
        let full = shard.len() >= MAX_LEASES / SHARDS;
        let replaced = match shard.get_mut(&counter.key) {
            Some(held)
                if held.window == lease.window
                    && held.rate == lease.rate
                    && held.lender == lease.lender =>
            {
                held.units = held.units.saturating_add(lease.units);
                held.expires = held.expires.min(lease.expires);
                held.remaining = lease.remaining;
                None
            }
            Some(held) => Some(std::mem::replace(held, lease)),
            None if full => Some(lease),
            None => {
                shard.insert(counter.key, lease);
                None
            }
        };
        drop(shard);
        if let Some(old) = replaced {
            self.give_back(counter.key, &old);
        }
    }

    fn give_back(&self, key: KeyId, lease: &Lease) {
        self.queue(Refund {
            lender: Arc::clone(&lease.lender),
            counter: Counter {
                key,
                rate: lease.rate,
            },
            units: lease.units,
            window: lease.window,
        });
    }

    /// Queues `refund` for the refund task, unless it is empty or [`MAX_REFUNDS`] wait.
    fn queue(&self, refund: Refund) {
        if refund.units == 0 {
            return;
        }
        let mut refunds = lock(&self.refunds);
        if refunds.len() < MAX_REFUNDS {
            refunds.push(refund);
        }
    }

    /// Ends the leases that expired by `now` (all of them with `all`) and answers every
    /// unspent unit waiting to go back to its owner.
    pub fn collect(&self, now: Instant, all: bool) -> Vec<Refund> {
        for shard in self.shards.iter() {
            let ended: Vec<(KeyId, Lease)> = lock(shard)
                .extract_if(|_, lease| all || now >= lease.expires)
                .collect();
            for (key, lease) in ended {
                self.give_back(key, &lease);
            }
        }
        let refunds = std::mem::take(&mut *lock(&self.refunds));
        let units: u64 = refunds.iter().map(|refund| refund.units).sum();
        self.stats.returned.fetch_add(units, Ordering::Relaxed);
        refunds
    }

    /// Drops the leases of `keys` without giving them back (their counters were reset).
    pub fn forget(&self, keys: &[KeyId]) {
        for key in keys {
            self.shard(key).remove(key);
        }
    }

    /// Keys holding a lease now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Lease {
    /// What a check admitted from this lease reports as remaining: the owner's remaining
    /// when it lent, plus what is left of the lease.
    fn remaining_with(&self, left: u32) -> u32 {
        self.remaining.saturating_add(left)
    }
}

#[cfg(test)]
mod tests;
