//! Asking every other member at once, each within its deadline: the RLQS quota exchange
//! (each bucket's demand to the bucket's owner, batched per owner) and the counter names of
//! a domain (for the cluster-wide listing). Neither has a fallback: a member that does not
//! answer in time is reported (no share, its names missing), never waited for longer.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Runtime;
use super::names::{DEADLINE, MAX_NAMES, NamesPage};
use super::quota::{self, QuotaDemand, QuotaSource};
use super::remote::{PeerError, Remote};

impl Runtime {
    /// Asks every other ring member for its names of `domain` with routes above `after`
    /// (at most `limit`, itself at most [`MAX_NAMES`]), all at once, each within
    /// [`DEADLINE`]: one answer per member, in ring order.
    pub async fn member_names(
        &self,
        domain: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Vec<(Arc<str>, Result<NamesPage, NamesMissing>)> {
        let peers = self.topology.load().peers();
        let limit = limit.clamp(1, MAX_NAMES);
        let asked = peers.iter().map(|peer| async move {
            let answer = match peer.names(domain, after, limit, DEADLINE).await {
                Ok(Some(page)) => Ok(page),
                Ok(None) => Err(NamesMissing::NotKept),
                Err(error) => Err(NamesMissing::Peer(error)),
            };
            (Arc::clone(peer.address()), answer)
        });
        futures_util::future::join_all(asked).await
    }

    /// RLQS: sends each bucket's demand to the bucket's owner on the ring, one batch per
    /// owner (split at [`quota::MAX_BUCKETS`]), all owners at once, each call within
    /// [`quota::DEADLINE`]; the buckets this node owns are divided by `here` (this node's
    /// own division, with this node as the sender). Answers one share per demand, in
    /// order: `None` where the owner did not answer in time or gave none.
    pub async fn exchange_quota(
        &self,
        demands: &[QuotaDemand],
        here: &QuotaSource,
    ) -> Vec<Option<u64>> {
        let mut shares = vec![None; demands.len()];
        // Per owner (None: this node), the indices of its buckets.
        let mut by_owner: Vec<(Option<Arc<Remote>>, Vec<usize>)> = Vec::new();
        {
            let topology = self.topology.load();
            for (index, demand) in demands.iter().enumerate() {
                let owner = topology.owner_of(demand.bucket.route).cloned();
                let at = by_owner
                    .iter()
                    .position(|(known, _)| match (known, &owner) {
                        (None, None) => true,
                        (Some(known), Some(owner)) => Arc::ptr_eq(known, owner),
                        _ => false,
                    });
                match at {
                    Some(at) => by_owner[at].1.push(index),
                    None => by_owner.push((owner, vec![index])),
                }
            }
        }
        let mut calls = Vec::new();
        for (owner, indices) in &by_owner {
            for chunk in indices.chunks(quota::MAX_BUCKETS) {
                let batch: Vec<QuotaDemand> = chunk.iter().map(|&index| demands[index]).collect();
                match owner {
                    None => {
                        let answered = here(&self.me, &batch);
                        for (&index, share) in chunk.iter().zip(answered) {
                            shares[index] = share;
                        }
                    }
                    Some(remote) => calls
                        .push(async move { (chunk, remote.quota(&batch, quota::DEADLINE).await) }),
                }
            }
        }
        let sent: usize = calls.len();
        let answers = futures_util::future::join_all(calls).await;
        let mut failed = 0u64;
        let mut remote_buckets = 0u64;
        for (chunk, answer) in answers {
            remote_buckets += chunk.len() as u64;
            match answer {
                Ok(Some(answered)) => {
                    for (&index, share) in chunk.iter().zip(answered) {
                        shares[index] = share;
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    failed += 1;
                    tracing::debug!(%error, "a quota owner did not answer: its buckets use an equal part per member");
                }
            }
        }
        let stats = &self.stats;
        stats
            .quota_sent
            .fetch_add(remote_buckets, Ordering::Relaxed);
        stats
            .quota_failed_calls
            .fetch_add(failed, Ordering::Relaxed);
        let unanswered = shares.iter().filter(|share| share.is_none()).count() as u64;
        stats
            .quota_unanswered
            .fetch_add(unanswered, Ordering::Relaxed);
        tracing::trace!(buckets = demands.len(), calls = sent, "quota exchanged");
        shares
    }
}

/// Why a member's names are not in a listing ([`Runtime::member_names`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamesMissing {
    /// The call failed or timed out.
    Peer(PeerError),
    /// It answered that it keeps no names (it runs without `--counter-names`).
    NotKept,
}

impl std::fmt::Display for NamesMissing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NamesMissing::Peer(error) => error.fmt(f),
            NamesMissing::NotKept => f.write_str("it keeps no counter names (--counter-names)"),
        }
    }
}
