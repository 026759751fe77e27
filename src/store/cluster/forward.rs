//! Forwarding: a request's checks scattered to whoever decides them (a lease this node
//! holds, this node's memory store, each other owner through its [`Remote`], the
//! [`Fallback`] policy for an owner that cannot answer) and the answers gathered back in
//! request order, with [`Scatter`] as the plan. Explanations (peeks) ask the owners the
//! same way, without a fallback.
//!
//! A request that fails consumes nothing: when any part errs, every other part gives back
//! what it consumed ([`Taken::give_back`]) before the error is answered.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::scatter::Scatter;
use super::{Cluster, Node};
use crate::check::{Check, Checks, Decisions};
use crate::cluster::remote::{self, PeerError, Remote};
use crate::cluster::{Fallback, Topology, convert, lease};
use crate::error::{ClusterError, StoreError};
use crate::store::memory::engine::Consumed;

/// Per check of a request: what it spent when it was admitted from a lease.
pub(super) type SpentLeases = SmallVec<[Option<lease::Spent>; 4]>;

/// Who decides a part of one request's checks.
#[derive(Clone, Copy)]
enum Target<'a> {
    /// This node's memory store (its own keys).
    Here,
    /// Admitted from a lease another node granted (see `lease`).
    Leased,
    /// The owner of the part's keys.
    Owner(&'a Arc<Remote>),
}

impl PartialEq for Target<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Target::Here, Target::Here) | (Target::Leased, Target::Leased) => true,
            (Target::Owner(one), Target::Owner(other)) => Arc::ptr_eq(one, other),
            _ => false,
        }
    }
}

impl<'a> Target<'a> {
    /// Where the checks of `route` go when no lease admitted them.
    fn of(topology: &'a Topology, route: Option<u64>) -> Target<'a> {
        route
            .and_then(|route| topology.owner_of(route))
            .map_or(Target::Here, Target::Owner)
    }
}

/// Gathering failed: a part answered fewer decisions than its checks have counters.
fn too_few() -> StoreError {
    ClusterError::Protocol {
        peer: Arc::from("a peer"),
        problem: "answered too few decisions".to_owned(),
    }
    .into()
}

/// What the parts of one request consumed so far, to give back if another part fails.
#[derive(Default)]
struct Taken {
    /// Checks admitted from leases, and what each spent.
    leased: Vec<(Check, lease::Spent)>,
    /// Checks this node's engine decided (its own keys, and the local fallback's), and
    /// which of them consumed when.
    engine: Vec<(Checks, Consumed)>,
    /// What each owner counted for the checks forwarded to it.
    forwarded: Vec<(Arc<Remote>, remote::Counted)>,
}

impl Taken {
    /// Gives everything back: lease spends to their lease (or lender), this node's engine
    /// in the windows its checks were counted in, and each owner's admissions with a
    /// `Refund` naming the windows the owner counted them in (never this node's guess, so
    /// clock skew cannot take hits off a window that did not count them), while it still
    /// owns their keys (after a ring change the counter went to the new owner with the
    /// hits in it; another counter of the old owner's never had them). A refund the owner
    /// does not get (it went away meanwhile, or the keys moved) stays counted until its
    /// window ends: an under-admission of at most that request's cost, never an
    /// over-admission.
    async fn give_back(self, node: &Node) {
        for (check, spent) in &self.leased {
            node.runtime.leases.unspend(check, spent);
        }
        for (checks, consumed) in &self.engine {
            node.engine().give_back(checks, consumed);
        }
        let topology = node.runtime.topology.load_full();
        let owns = |remote: &Remote, refund: &lease::Refund| {
            topology
                .ring
                .owner(refund.counter.key.route)
                .is_some_and(|owner| owner == remote.address())
        };
        let refunds: Vec<(&Arc<Remote>, Vec<lease::Refund>)> = self
            .forwarded
            .iter()
            .map(|(remote, counted)| {
                let mut refunds = counted.refunds(remote.address());
                refunds.retain(|refund| owns(remote, refund));
                (remote, refunds)
            })
            .collect();
        let refunds = refunds
            .iter()
            .flat_map(|(remote, refunds)| {
                refunds
                    .chunks(convert::MAX_HANDOFF / 10)
                    .map(move |chunk| (*remote, chunk))
            })
            .map(|(remote, chunk)| async move {
                if let Err(error) = remote.refund(chunk).await {
                    tracing::warn!(%error, refunds = chunk.len(), "could not give back what an owner counted for a failed request");
                }
            });
        futures_util::future::join_all(refunds).await;
    }
}

/// One distributed decision in progress: each part's answer, what the parts consumed
/// (to give back if the request fails), the first error, and the parts left to the
/// fallback.
struct Round {
    answers: Vec<Option<Decisions>>,
    taken: Taken,
    /// The first error of any part; once there is one, the parts still in flight are
    /// awaited only to give back what they consumed.
    failed: Option<StoreError>,
    fallbacks: Vec<(usize, Arc<Remote>, Checks)>,
    /// The decisions of the checks admitted from a lease (part 1), until the parts exist.
    leased: Decisions,
}

impl Round {
    /// Room for the answers of `parts` parts, the leased ones in already.
    fn with_parts(mut self, parts: usize) -> Round {
        self.answers = (0..parts).map(|_| None).collect();
        self.answers[1] = Some(std::mem::take(&mut self.leased));
        self
    }

    /// Decides this node's part (part 0) on its engine.
    async fn decide_here(&mut self, node: &Node, local: Checks) {
        if local.is_empty() {
            return;
        }
        match node.engine().begin(&local) {
            Ok(started) => match started.finish_consumed().await {
                Ok((decisions, consumed)) => {
                    self.answers[0] = Some(decisions);
                    self.taken.engine.push((local, consumed));
                }
                Err(error) => self.failed = Some(error),
            },
            // The engine gave back its own part already.
            Err(error) => self.failed = Some(error),
        }
    }

    /// Takes an owner's answer to part `index`: its decisions, an error of its own, or (it
    /// could not be reached, or is no longer a member) the part back for the fallback.
    fn take_answer(
        &mut self,
        index: usize,
        remote: Arc<Remote>,
        answer: Result<remote::Answer, oneshot::error::RecvError>,
    ) {
        match answer {
            Ok(Ok(answered)) => {
                self.answers[index] = Some(answered.decisions);
                self.taken.forwarded.push((remote, answered.counted));
            }
            Ok(Err((error @ PeerError::Remote { .. }, _))) => {
                self.failed
                    .get_or_insert_with(|| ClusterError::from(error).into());
            }
            Ok(Err((_, part))) => self.fallbacks.push((index, remote, part)),
            Err(_) => {
                let peer = Arc::clone(remote.address());
                let problem = "the forward was dropped".to_owned();
                self.failed
                    .get_or_insert_with(|| ClusterError::Protocol { peer, problem }.into());
            }
        }
    }
}

/// Each check's decider: this node (part 0), the lease it was admitted from already
/// (part 1; a lease spent on a key this node owns now is given back and the key decided
/// here), or its owner.
fn route<'t>(
    node: &Node,
    topology: &'t Topology,
    checks: Checks,
    leased: SpentLeases,
) -> (Scatter<Target<'t>>, Round) {
    let mut spent = leased.into_iter();
    let mut round = Round {
        answers: Vec::new(),
        taken: Taken::default(),
        failed: None,
        fallbacks: Vec::new(),
        leased: Decisions::new(),
    };
    let mut scatter = Scatter::new([Target::Here, Target::Leased], checks.len());
    for check in checks {
        let route = check.counters.first().map(|counter| counter.key.route);
        let target = match (Target::of(topology, route), spent.next().flatten()) {
            (Target::Here, spent) => {
                if let Some(spent) = spent {
                    node.runtime.leases.unspend(&check, &spent);
                }
                Target::Here
            }
            (_, Some(spent)) => {
                round.leased.push(spent.decision);
                round.taken.leased.push((check.clone(), spent));
                Target::Leased
            }
            (owner, None) => owner,
        };
        scatter.push(target, check);
    }
    (scatter, round)
}

impl Cluster {
    /// [`Cluster::check`] when some checks belong to other nodes; an owner that cannot be
    /// reached is a case for the fallback policy. `leased` holds, per check, what it spent
    /// when it was admitted from a lease already ([`Node::spend_leases`]).
    ///
    /// A request that fails consumes nothing: when any part errs (this node's engine, an
    /// owner's own error such as its key cap, a lost forward, the fallback), every other
    /// part gives back what it consumed ([`Taken::give_back`]) before the error is answered.
    ///
    /// With `may_reroute` (the request's first routing), a part whose owner could not be
    /// reached but is no longer its owner on the ring is routed again, once, not decided by
    /// the fallback: a node whose detector takes a dead owner off its ring hands the
    /// counters it kept on its fallback share to the keys' new owners 50 ms later, and a
    /// forward that failed around then, decided on the share after that handoff, would count
    /// on a counter the new owner never sees (docs/cluster.md, "The guarantee").
    pub(super) async fn check_distributed(
        &self,
        node: &Node,
        checks: Checks,
        leased: SpentLeases,
        may_reroute: bool,
    ) -> Result<Decisions, StoreError> {
        let topology = node.runtime.topology.load();
        let (scatter, round) = route(node, &topology, checks, leased);
        let (parts, gather) = scatter.into_parts();
        let mut round = round.with_parts(parts.len());
        // Queue the forwards first, so they travel while the local part is decided.
        let mut waiting: Vec<(usize, Arc<Remote>, oneshot::Receiver<remote::Answer>)> = Vec::new();
        let mut local = Checks::new();
        for (index, (target, part)) in parts.into_iter().enumerate() {
            match target {
                Target::Here => local = part,
                Target::Leased => {}
                Target::Owner(remote) => match remote.submit(part) {
                    Ok(rx) => waiting.push((index, Arc::clone(remote), rx)),
                    Err((_, part)) => round.fallbacks.push((index, Arc::clone(remote), part)),
                },
            }
        }
        drop(topology);
        round.decide_here(node, local).await;
        // Every forward is answered within its deadline (see `remote`).
        for (index, remote, rx) in waiting {
            round.take_answer(index, remote, rx.await);
        }
        if round.failed.is_none() && !round.fallbacks.is_empty() {
            self.decide_fallbacks(node, &mut round, may_reroute).await;
        }
        let decided = match round.failed {
            Some(error) => Err(error),
            None => gather.gather(round.answers).ok_or_else(too_few),
        };
        if decided.is_err() {
            round.taken.give_back(node).await;
        }
        decided
    }

    /// Decides the parts whose owner could not be reached: routed again (once, with
    /// `may_reroute`) when the owner has left the ring meanwhile, else by the fallback
    /// policy. Stops at the first error.
    async fn decide_fallbacks(&self, node: &Node, round: &mut Round, may_reroute: bool) {
        let topology = node.runtime.topology.load_full();
        for (index, remote, part) in std::mem::take(&mut round.fallbacks) {
            let moved = part
                .iter()
                .any(|check| Target::of(&topology, Some(check.route())) != Target::Owner(&remote));
            let decided = if may_reroute && moved {
                // What a rerouted part consumed is not given back if a later part
                // fails: an under-admission at worst.
                node.runtime.stats.rerouted.fetch_add(1, Ordering::Relaxed);
                Box::pin(self.check_distributed(node, part, SpentLeases::new(), false))
                    .await
                    .map(|decisions| (decisions, None))
            } else {
                node.runtime.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                node.fallback(part).await
            };
            match decided {
                Ok((decisions, consumed)) => {
                    round.answers[index] = Some(decisions);
                    round.taken.engine.extend(consumed);
                }
                Err(error) => {
                    round.failed = Some(error);
                    break;
                }
            }
        }
        // The ring changed while the fallback counted: what it counted on this node's
        // share after the handoff is handed over too.
        if !Arc::ptr_eq(&topology, &node.runtime.topology.load_full()) {
            node.runtime.rebalance.notify_one();
        }
    }

    /// [`Store::peek`](crate::store::Store::peek) when some checks belong to other nodes:
    /// each owner is asked once (`Remote::peek`, at most `convert::MAX_CHECKS_PER_GROUP`
    /// checks per call), all at once, and the answers are put back in request order.
    pub(super) async fn peek_distributed(
        &self,
        node: &Node,
        checks: Checks,
    ) -> Result<Decisions, StoreError> {
        let topology = node.runtime.topology.load();
        let mut scatter = Scatter::new([Target::Here], checks.len());
        for check in checks {
            let target = Target::of(&topology, Some(check.route()));
            scatter.push(target, check);
        }
        let (parts, gather) = scatter.into_parts();
        // Part 0 is this node's; the others are owners'.
        let parts: Vec<(Option<Arc<Remote>>, Checks)> = parts
            .into_iter()
            .map(|(target, checks)| match target {
                Target::Owner(remote) => (Some(Arc::clone(remote)), checks),
                Target::Here | Target::Leased => (None, checks),
            })
            .collect();
        drop(topology);
        let asked = parts.iter().filter_map(|(remote, checks)| {
            let remote = remote.as_ref()?;
            Some(async move {
                let mut decisions = Decisions::new();
                for chunk in checks.chunks(convert::MAX_CHECKS_PER_GROUP) {
                    let chunk: Checks = chunk.iter().cloned().collect();
                    let expected: usize = chunk.iter().map(|check| check.counters.len()).sum();
                    let answer = remote.peek(&chunk).await?;
                    if answer.len() != expected {
                        return Err(ClusterError::Protocol {
                            peer: Arc::clone(remote.address()),
                            problem: format!("{} decisions for {expected} counters", answer.len()),
                        });
                    }
                    decisions.extend(answer);
                }
                Ok(decisions)
            })
        });
        let mut here = parts.first().map(|(_, local)| node.engine().peek(local));
        let mut theirs = futures_util::future::try_join_all(asked).await?.into_iter();
        let answers = parts
            .iter()
            .map(|(remote, _)| match remote {
                None => here.take(),
                Some(_) => theirs.next(),
            })
            .collect();
        gather.gather(answers).ok_or_else(too_few)
    }
}

impl Node {
    /// Admits from their leases the checks whose keys other nodes own and lent this node
    /// hits for; `None` for the others (this node's own keys, and keys without a lease).
    pub(super) fn spend_leases(&self, checks: &[Check]) -> SpentLeases {
        let topology = self.runtime.topology.load();
        let now = tokio::time::Instant::now();
        checks
            .iter()
            .map(|check| {
                topology.owner_of(check.route())?;
                self.runtime.leases.spend(check, now)
            })
            .collect()
    }

    /// Whether this node owns every check's key (then nothing needs forwarding).
    pub(super) fn owns_all(&self, checks: &[Check]) -> bool {
        let topology = self.runtime.topology.load();
        checks
            .iter()
            .all(|check| topology.owner_of(check.route()).is_none())
    }

    /// Decides `group` (checks whose owner cannot answer) by the fallback policy; with
    /// [`Fallback::Local`], also answers what this node's engine consumed for them (to give
    /// back if the request fails).
    async fn fallback(
        &self,
        group: Checks,
    ) -> Result<(Decisions, Option<(Checks, Consumed)>), StoreError> {
        match self.runtime.options.fallback {
            Fallback::Local => {
                // This node's share of each limit: with every node falling back at once,
                // together they admit no more than the limit.
                let members = self.runtime.topology.load().ring.len();
                let mut group = group;
                for counter in group.iter_mut().flat_map(|check| check.counters.iter_mut()) {
                    counter.rate = counter.rate.share(members);
                }
                let (decisions, consumed) = self.engine().begin(&group)?.finish_consumed().await?;
                Ok((decisions, Some((group, consumed))))
            }
            Fallback::Policy(policy) => Ok((
                policy.decide(&group, self.runtime.options.breaker_cooldown),
                None,
            )),
        }
    }
}
