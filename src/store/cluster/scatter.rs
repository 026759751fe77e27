//! The scatter/gather plan of one request in cluster mode: which part decides each check
//! (this node, a lease, one owner per other member), and the parts' answers put back in
//! request order.
//!
//! Pure: it knows no rings, peers or clocks; the caller says where each check goes and
//! hands in what each part answered.
//!
//! Invariants: a part's checks keep their request order; parts are numbered in the order
//! their targets were first named (the fixed ones first); gathering answers exactly one
//! decision per counter, in request order, or nothing when a part answered fewer decisions
//! than its checks have counters.

use crate::check::{Check, Checks, Decisions};

/// A request's checks grouped into parts by target, and where each came from.
#[derive(Debug)]
pub struct Scatter<T> {
    parts: Vec<(T, Checks)>,
    gather: Gather,
}

/// How to put the parts' answers back in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gather {
    /// Per check, in request order: its part and its number of counters.
    places: Vec<(usize, usize)>,
    /// Counters in all.
    total: usize,
}

impl<T: PartialEq> Scatter<T> {
    /// A plan for `checks` checks whose first parts go to `fixed`, in order (they stay
    /// empty until a check goes there).
    pub fn new(fixed: impl IntoIterator<Item = T>, checks: usize) -> Scatter<T> {
        Scatter {
            parts: fixed
                .into_iter()
                .map(|target| (target, Checks::new()))
                .collect(),
            gather: Gather {
                places: Vec::with_capacity(checks),
                total: 0,
            },
        }
    }

    /// Sends the request's next check to `target`'s part (a new last part for a target not
    /// named before); answers that part's index.
    pub fn push(&mut self, target: T, check: Check) -> usize {
        let part = match self.parts.iter().position(|(other, _)| *other == target) {
            Some(part) => part,
            None => {
                self.parts.push((target, Checks::new()));
                self.parts.len() - 1
            }
        };
        let counters = check.counters.len();
        self.gather.places.push((part, counters));
        self.gather.total += counters;
        self.parts[part].1.push(check);
        part
    }

    /// The parts, in order, each with its checks in request order, and how to gather what
    /// they answer.
    pub fn into_parts(self) -> (Vec<(T, Checks)>, Gather) {
        (self.parts, self.gather)
    }
}

impl Gather {
    /// Puts the parts' answers back in request order: `answers[i]` holds part `i`'s
    /// decisions (one per counter of its checks, in the part's order; `None` for a part
    /// that has no checks). `None` when a part answered too few.
    pub fn gather(self, answers: Vec<Option<Decisions>>) -> Option<Decisions> {
        let mut decisions = Decisions::with_capacity(self.total);
        let mut parts: Vec<_> = answers
            .into_iter()
            .map(|answer| answer.unwrap_or_default().into_iter())
            .collect();
        for (part, counters) in self.places {
            let part = parts.get_mut(part)?;
            for _ in 0..counters {
                decisions.push(part.next()?);
            }
        }
        Some(decisions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Rate, Unit};
    use crate::check::{Counter, Decision};
    use crate::key::KeyBuilder;

    /// A check of `counters` counters on descriptor `value`.
    fn check(value: &str, counters: usize) -> Check {
        let rate = Rate::fixed(10, Unit::Minute);
        let key = KeyBuilder::new("d").entry("k", value).key(&rate);
        Check {
            counters: (0..counters).map(|_| Counter { key, rate }).collect(),
            cost: 1,
            wait: None,
            charge: crate::check::Charge::Admitted,
        }
    }

    /// A decision marked with `remaining`, so tests can see where it went.
    fn decision(remaining: u32) -> Decision {
        Decision {
            allowed: true,
            remaining,
            reset_after: 0,
            retry_after: None,
        }
    }

    fn decisions(marks: &[u32]) -> Decisions {
        marks.iter().copied().map(decision).collect()
    }

    fn marks(decisions: &Decisions) -> Vec<u32> {
        decisions
            .iter()
            .map(|decision| decision.remaining)
            .collect()
    }

    /// `(target, counters)` per check, scattered after the fixed parts `fixed`: the parts'
    /// targets and their checks' values, and the plan to gather with.
    fn scatter(
        fixed: &[&'static str],
        checks: &[(&'static str, usize)],
    ) -> (Vec<(&'static str, usize)>, Gather) {
        let mut scatter = Scatter::new(fixed.iter().copied(), checks.len());
        for (index, (target, counters)) in checks.iter().enumerate() {
            scatter.push(*target, check(&index.to_string(), *counters));
        }
        let (parts, gather) = scatter.into_parts();
        let parts = parts
            .into_iter()
            .map(|(target, checks)| (target, checks.len()))
            .collect();
        (parts, gather)
    }

    #[test]
    fn checks_are_grouped_by_target_fixed_parts_first_then_in_the_order_named() {
        let (parts, _) = scatter(
            &["here", "leased"],
            &[("b", 1), ("here", 1), ("a", 1), ("b", 2), ("here", 1)],
        );
        assert_eq!(
            parts,
            [("here", 2), ("leased", 0), ("b", 2), ("a", 1)],
            "an unused fixed part stays, empty"
        );
    }

    #[test]
    fn a_parts_checks_keep_their_request_order() {
        let mut scatter = Scatter::new(["here"], 3);
        for value in ["x", "y", "z"] {
            assert_eq!(scatter.push("b", check(value, 1)), 1);
        }
        let (parts, _) = scatter.into_parts();
        let routes: Vec<u64> = parts[1].1.iter().map(Check::route).collect();
        let expected: Vec<u64> = ["x", "y", "z"]
            .iter()
            .map(|value| check(value, 1).route())
            .collect();
        assert_eq!(routes, expected);
    }

    #[test]
    fn answers_are_gathered_back_in_request_order_one_per_counter() {
        // Checks (target, counters): 0 b/1, 1 here/2, 2 a/1, 3 b/3, 4 here/1.
        let (_, gather) = scatter(
            &["here", "leased"],
            &[("b", 1), ("here", 2), ("a", 1), ("b", 3), ("here", 1)],
        );
        let answers = vec![
            Some(decisions(&[10, 11, 40])), // here: check 1 (2 counters), check 4
            None,                           // leased: nothing went there
            Some(decisions(&[0, 30, 31, 32])), // b: check 0, check 3 (3 counters)
            Some(decisions(&[20])),         // a: check 2
        ];
        let gathered = gather.gather(answers).expect("every part answered in full");
        assert_eq!(marks(&gathered), [0, 10, 11, 20, 30, 31, 32, 40]);
    }

    #[test]
    fn a_part_that_answers_too_few_gathers_nothing() {
        let (_, gather) = scatter(&["here"], &[("here", 1), ("b", 2)]);
        assert_eq!(
            gather
                .clone()
                .gather(vec![Some(decisions(&[1])), Some(decisions(&[2]))]),
            None,
            "b answered one decision for two counters"
        );
        assert_eq!(
            gather.clone().gather(vec![Some(decisions(&[1]))]),
            None,
            "b is missing"
        );
        assert_eq!(
            gather.gather(vec![None, Some(decisions(&[2, 3]))]),
            None,
            "here is missing"
        );
    }

    #[test]
    fn no_checks_gather_no_decisions() {
        let (parts, gather) = scatter(&["here"], &[]);
        assert_eq!(parts, [("here", 0)]);
        assert_eq!(gather.gather(vec![None]).map(|d| d.len()), Some(0));
    }
}
