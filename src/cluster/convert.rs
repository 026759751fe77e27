//! Conversions between the peer protocol's messages and the engine's types. Anything a peer
//! sends is validated here: a malformed message is an error, never a panic.

use std::time::Duration;

use super::proto::v1 as wire;
use crate::algorithm::{Algorithm, Rate, Unit};
use crate::check::{
    Charge, Check, Counter, Counters, Decision, MAX_COST, Slot, WaitPolicy, expiry,
};
use crate::error::ErrorKind;
use crate::key::KeyId;

use super::names::{self, Named, NamesPage};
use super::quota::{self, QuotaBucket, QuotaDemand};

/// The newest protocol version this build speaks. Version 2 added `Rate.unit_multiplier`
/// (windows of several units); nothing else changed.
pub const VERSION: u32 = 2;
/// The oldest version this build accepts. A message is sent with the oldest version that
/// says it exactly ([`version_for`]), so a node of the release before (version 1 only)
/// accepts everything it can count right and refuses (`FAILED_PRECONDITION`) a check it
/// would count wrong: upgrading a running cluster works node by node.
pub const OLDEST: u32 = 1;

/// The version a message carrying counters of `rates` is sent with: [`OLDEST`], unless
/// one of them has a `unit_multiplier`, which a version 1 node would read as one unit.
pub fn version_for<'a>(rates: impl IntoIterator<Item = &'a Rate>) -> u32 {
    if rates.into_iter().any(|rate| rate.multiplier != 1) {
        VERSION
    } else {
        OLDEST
    }
}

/// Bounds on what one peer message may carry.
pub const MAX_GROUPS: usize = 4096;
pub const MAX_CHECKS_PER_GROUP: usize = 64;
pub const MAX_COUNTERS_PER_CHECK: usize = 32;
pub const MAX_HANDOFF: usize = 100_000;
/// Members a peer may name in one membership answer, and bytes in one member's address.
pub const MAX_MEMBERS: usize = 1024;
pub const MAX_ADDRESS_BYTES: usize = 256;

/// The member addresses a peer answered a `Join` or `Leave` with, bounded: at most
/// [`MAX_MEMBERS`], each of 1 to [`MAX_ADDRESS_BYTES`] bytes.
pub fn member_addresses(addresses: Vec<String>) -> Result<Vec<String>, String> {
    if addresses.len() > MAX_MEMBERS {
        return Err(format!(
            "{} members named, at most {MAX_MEMBERS}",
            addresses.len()
        ));
    }
    if let Some(bad) = addresses
        .iter()
        .find(|address| !(1..=MAX_ADDRESS_BYTES).contains(&address.len()))
    {
        return Err(format!(
            "a member address of {} bytes, expected 1 to {MAX_ADDRESS_BYTES}",
            bad.len()
        ));
    }
    Ok(addresses)
}

pub fn key_to_wire(key: &KeyId) -> wire::Key {
    wire::Key {
        route: key.route,
        id_hi: key.id[0],
        id_lo: key.id[1],
    }
}

pub fn key_from_wire(key: Option<&wire::Key>) -> Result<KeyId, String> {
    let key = key.ok_or("counter without a key")?;
    Ok(KeyId {
        route: key.route,
        id: [key.id_hi, key.id_lo],
    })
}

/// The wire's `Algorithm` values are the algorithms' codes ([`Algorithm::code`]).
fn algorithm_to_wire(algorithm: Algorithm) -> i32 {
    i32::from(algorithm.code())
}

fn algorithm_from_wire(value: i32) -> Result<Algorithm, String> {
    Algorithm::from_code(i64::from(value)).ok_or_else(|| format!("unknown algorithm {value}"))
}

fn charge_to_wire(charge: Charge) -> wire::Charge {
    match charge {
        Charge::Admitted => wire::Charge::Admitted,
        Charge::Always => wire::Charge::Always,
        Charge::Refund => wire::Charge::Refund,
    }
}

fn charge_from_wire(value: i32) -> Result<Charge, String> {
    match wire::Charge::try_from(value) {
        Ok(wire::Charge::Admitted) => Ok(Charge::Admitted),
        Ok(wire::Charge::Always) => Ok(Charge::Always),
        Ok(wire::Charge::Refund) => Ok(Charge::Refund),
        Err(_) => Err(format!("unknown charge {value}")),
    }
}

pub fn counter_to_wire(counter: &Counter) -> wire::Counter {
    wire::Counter {
        key: Some(key_to_wire(&counter.key)),
        rate: Some(wire::Rate {
            algorithm: algorithm_to_wire(counter.rate.algorithm),
            requests_per_unit: counter.rate.requests_per_unit,
            unit: counter.rate.unit.to_proto() as u32,
            burst: counter.rate.burst,
            // 0 (not sent) for 1, as version 1 nodes send it.
            unit_multiplier: match counter.rate.multiplier {
                1 => 0,
                multiplier => multiplier,
            },
        }),
    }
}

pub fn counter_from_wire(counter: &wire::Counter) -> Result<Counter, String> {
    let key = key_from_wire(counter.key.as_ref())?;
    let rate = counter.rate.as_ref().ok_or("counter without a rate")?;
    let unit = i32::try_from(rate.unit)
        .ok()
        .and_then(Unit::from_proto)
        .ok_or_else(|| format!("unknown unit {}", rate.unit))?;
    let algorithm = algorithm_from_wire(rate.algorithm)?;
    let mut checked = Rate::new(algorithm, rate.requests_per_unit, unit, Some(rate.burst));
    if algorithm.uses_burst() && rate.burst == 0 {
        return Err("burst 0".to_owned());
    }
    checked.burst = if algorithm.uses_burst() {
        rate.burst
    } else {
        rate.requests_per_unit
    };
    if rate.unit_multiplier > 1 {
        checked = checked.every(rate.unit_multiplier).ok_or_else(|| {
            format!(
                "unit_multiplier {} of a {unit}: a window longer than a year",
                rate.unit_multiplier
            )
        })?;
    }
    Ok(Counter { key, rate: checked })
}

pub fn check_to_wire(check: &Check) -> wire::Check {
    wire::Check {
        counters: check.counters.iter().map(counter_to_wire).collect(),
        cost: crate::check::bounded_cost(check.cost),
        max_wait_nanos: check.wait.map_or(0, |wait| {
            u64::try_from(wait.max_wait.as_nanos()).unwrap_or(u64::MAX)
        }),
        max_queue: check.wait.map_or(0, |wait| wait.max_queue),
        lease: super::lease::leasable(check),
        charge: charge_to_wire(check.charge) as i32,
    }
}

/// A check a peer sent, and whether it asked for a lease.
pub fn check_from_wire(check: wire::Check) -> Result<(Check, bool), String> {
    if check.counters.is_empty() || check.counters.len() > MAX_COUNTERS_PER_CHECK {
        return Err(format!("{} counters in a check", check.counters.len()));
    }
    let asked = check.lease;
    let counters = check
        .counters
        .iter()
        .map(counter_from_wire)
        .collect::<Result<Counters, _>>()?;
    // A check's counters live together on one shard, chosen by their shared route: a
    // counter of another route would be counted on a shard that does not own it.
    let route = counters[0].key.route;
    if counters.iter().any(|counter| counter.key.route != route) {
        return Err("counters of different routes in one check".to_owned());
    }
    // `bounded_cost`: 2^32 stands for any cost beyond every limit.
    if check.cost > MAX_COST + 1 {
        return Err(format!(
            "a cost of {}, at most {}",
            check.cost,
            MAX_COST + 1
        ));
    }
    let charge = charge_from_wire(check.charge)?;
    // Only a check that consumes nothing when rejected may wait (see `Check::wait`).
    let wait = (check.max_wait_nanos > 0 && charge == Charge::Admitted).then(|| WaitPolicy {
        // Bounded like the config's max_wait, whatever a peer sends.
        max_wait: Duration::from_nanos(check.max_wait_nanos).min(Duration::from_secs(10)),
        max_queue: check.max_queue.clamp(1, 100_000),
    });
    let check = Check {
        counters,
        cost: check.cost,
        wait,
        charge,
    };
    let lease = asked && super::lease::leasable(&check);
    Ok((check, lease))
}

pub fn decision_to_wire(decision: &Decision) -> wire::Decision {
    wire::Decision {
        allowed: decision.allowed,
        remaining: decision.remaining,
        reset_after_nanos: decision.reset_after,
        can_retry: decision.retry_after.is_some(),
        retry_after_nanos: decision.retry_after.unwrap_or(0),
        ..Default::default()
    }
}

pub fn decision_from_wire(decision: &wire::Decision) -> Decision {
    Decision {
        allowed: decision.allowed,
        remaining: decision.remaining,
        reset_after: decision.reset_after_nanos,
        retry_after: decision.can_retry.then_some(decision.retry_after_nanos),
    }
}

pub fn state_to_wire(key: &KeyId, slot: &Slot) -> wire::CounterState {
    wire::CounterState {
        key: Some(key_to_wire(key)),
        a: slot.a,
        b: slot.b,
        expires: expiry::to_unix_secs(slot.expires),
    }
}

pub fn state_from_wire(state: &wire::CounterState) -> Result<(KeyId, Slot), String> {
    Ok((
        key_from_wire(state.key.as_ref())?,
        Slot {
            a: state.a,
            b: state.b,
            expires: expiry::from_unix_secs(state.expires),
        },
    ))
}

pub fn error_to_wire(kind: ErrorKind) -> wire::ErrorCode {
    match kind {
        ErrorKind::InvalidArgument => wire::ErrorCode::InvalidArgument,
        ErrorKind::Overloaded => wire::ErrorCode::Overloaded,
        ErrorKind::Full => wire::ErrorCode::Full,
        ErrorKind::Unavailable => wire::ErrorCode::Unavailable,
        ErrorKind::Internal => wire::ErrorCode::Internal,
    }
}

/// The kind of an owner's error; unknown and missing codes are internal errors.
pub fn error_from_wire(code: i32) -> ErrorKind {
    match wire::ErrorCode::try_from(code) {
        Ok(wire::ErrorCode::InvalidArgument) => ErrorKind::InvalidArgument,
        Ok(wire::ErrorCode::Overloaded) => ErrorKind::Overloaded,
        Ok(wire::ErrorCode::Full) => ErrorKind::Full,
        Ok(wire::ErrorCode::Unavailable) => ErrorKind::Unavailable,
        Ok(wire::ErrorCode::Internal | wire::ErrorCode::Unspecified) | Err(_) => {
            ErrorKind::Internal
        }
    }
}

/// A page of names for the wire.
pub fn names_to_wire(page: Option<NamesPage>) -> wire::NamesReply {
    let Some(page) = page else {
        return wire::NamesReply::default();
    };
    wire::NamesReply {
        keeps_names: true,
        names: page
            .names
            .into_iter()
            .map(|named| wire::Named {
                route: named.route,
                entries: named
                    .entries
                    .into_iter()
                    .map(|(key, value)| wire::Entry {
                        key: key.into(),
                        value: value.into(),
                    })
                    .collect(),
            })
            .collect(),
        more: page.more,
        kept: page.kept,
        capacity: page.capacity,
        dropped: page.dropped,
    }
}

/// A peer's page of names of `domain`, asked with `limit`: in route order, each within the
/// bounds of a name; `None` when it keeps none.
pub fn names_from_wire(
    domain: &str,
    limit: usize,
    reply: wire::NamesReply,
) -> Result<Option<NamesPage>, String> {
    if !reply.keeps_names {
        return Ok(None);
    }
    if reply.names.len() > limit.min(names::MAX_NAMES) {
        return Err(format!(
            "{} names for a limit of {limit}",
            reply.names.len()
        ));
    }
    let mut out = Vec::with_capacity(reply.names.len());
    for named in reply.names {
        let entries: Vec<(Box<str>, Box<str>)> = named
            .entries
            .into_iter()
            .map(|entry| (entry.key.into_boxed_str(), entry.value.into_boxed_str()))
            .collect();
        if !names::fits(domain, &entries) || entries.iter().any(|(key, _)| key.is_empty()) {
            return Err("a name out of bounds".to_owned());
        }
        if out
            .last()
            .is_some_and(|last: &Named| last.route >= named.route)
        {
            return Err("names out of route order".to_owned());
        }
        out.push(Named {
            route: named.route,
            entries,
        });
    }
    Ok(Some(NamesPage {
        names: out,
        more: reply.more,
        kept: reply.kept,
        capacity: reply.capacity,
        dropped: reply.dropped,
    }))
}

pub fn quota_demand_to_wire(demand: &QuotaDemand) -> wire::QuotaDemand {
    wire::QuotaDemand {
        route: demand.bucket.route,
        id: demand.bucket.id,
        limit: demand.limit,
        demand: demand.demand,
    }
}

/// The demands of a `Quota` report, bounded: at most [`quota::MAX_BUCKETS`], each limit
/// within `u32`, each demand read as at most its limit.
pub fn quota_demands_from_wire(buckets: &[wire::QuotaDemand]) -> Result<Vec<QuotaDemand>, String> {
    if buckets.len() > quota::MAX_BUCKETS {
        return Err(format!(
            "buckets: {} given, at most {}",
            buckets.len(),
            quota::MAX_BUCKETS
        ));
    }
    buckets
        .iter()
        .enumerate()
        .map(|(index, bucket)| {
            let name = QuotaBucket {
                route: bucket.route,
                id: bucket.id,
            };
            quota::bounded(name, bucket.limit, bucket.demand).ok_or_else(|| {
                format!(
                    "buckets[{index}].limit: {} is more than a limit can be ({})",
                    bucket.limit,
                    u32::MAX
                )
            })
        })
        .collect()
}

/// The owner's answer to `sent` demands: one share per demand, each at most its limit
/// (`None` for 0: no share given); `Ok(None)` when the owner divides no quotas.
pub fn quota_shares_from_wire(
    sent: &[QuotaDemand],
    reply: wire::QuotaReply,
) -> Result<Option<Vec<Option<u64>>>, String> {
    if !reply.serves_quota {
        return Ok(None);
    }
    if reply.shares.len() != sent.len() {
        return Err(format!(
            "{} shares for {} buckets",
            reply.shares.len(),
            sent.len()
        ));
    }
    Ok(Some(
        reply
            .shares
            .iter()
            .zip(sent)
            .map(|(&share, demand)| (share > 0).then(|| share.min(demand.limit)))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_algorithm_values_are_the_algorithms_codes() {
        for algorithm in Algorithm::ALL {
            let value = algorithm_to_wire(algorithm);
            let wire = wire::Algorithm::try_from(value).expect("a wire value");
            assert_eq!(
                wire.as_str_name(),
                algorithm.as_str().to_ascii_uppercase(),
                "peer.proto's value {value} names {algorithm:?}"
            );
            assert_eq!(algorithm_from_wire(value), Ok(algorithm));
        }
        assert_eq!(
            algorithm_from_wire(4),
            Err("unknown algorithm 4".to_owned())
        );
    }

    /// Version 2 carries `unit_multiplier`. A message is sent as version 1 unless one of
    /// its counters has a multiplier (a version 1 node refuses version 2 instead of counting
    /// one unit), and a version 1 counter (no field 5) is read as one unit.
    #[test]
    fn a_multiplier_crosses_the_wire_in_version_2_and_only_then() {
        use crate::algorithm::{Rate, Unit};
        use crate::key::KeyBuilder;
        let plain = Rate::fixed(5, Unit::Second);
        let ten_seconds = plain.every(10).expect("10 s");
        let counter = |rate: Rate| Counter {
            key: KeyBuilder::new("d").entry("k", "v").key(&rate),
            rate,
        };
        assert_eq!(version_for([&plain, &plain]), OLDEST);
        assert_eq!(version_for([&plain, &ten_seconds]), VERSION);
        assert_eq!(version_for([]), OLDEST);
        for rate in [
            plain,
            ten_seconds,
            Rate::fixed(5, Unit::Day).every(14).expect("14 days"),
        ] {
            let wire = counter_to_wire(&counter(rate));
            assert_eq!(counter_from_wire(&wire).map(|c| c.rate), Ok(rate));
        }
        // One unit is not sent at all: the bytes are version 1's.
        let wire = counter_to_wire(&counter(plain));
        assert_eq!(wire.rate.as_ref().map(|rate| rate.unit_multiplier), Some(0));
        let mut one = wire;
        one.rate.as_mut().expect("a rate").unit_multiplier = 1;
        assert_eq!(counter_from_wire(&one).map(|c| c.rate), Ok(plain));
        // Beyond a year is refused, never cut short.
        let mut long = wire;
        let rate = long.rate.as_mut().expect("a rate");
        rate.unit = Unit::Day.to_proto() as u32;
        rate.unit_multiplier = 366;
        let error = counter_from_wire(&long).expect_err("over a year");
        assert!(error.contains("longer than a year"), "{error}");
    }

    #[test]
    fn error_kinds_cross_the_wire_as_codes() {
        for kind in [
            ErrorKind::InvalidArgument,
            ErrorKind::Overloaded,
            ErrorKind::Full,
            ErrorKind::Unavailable,
            ErrorKind::Internal,
        ] {
            assert_eq!(error_from_wire(error_to_wire(kind) as i32), kind);
        }
        // A node that predates the code sends 0 with text; an unknown code is no better.
        assert_eq!(error_from_wire(0), ErrorKind::Internal);
        assert_eq!(error_from_wire(99), ErrorKind::Internal);
    }

    /// A forwarded check is refused when its counters belong to different routes (they
    /// would be counted on a shard that does not own them) or its cost is beyond any limit.
    #[test]
    fn a_forwarded_check_keeps_to_one_route_and_a_bounded_cost() {
        use crate::algorithm::{Rate, Unit};
        use crate::key::KeyBuilder;
        let rate = Rate::fixed(5, Unit::Hour);
        let counter = |value: &str| Counter {
            key: KeyBuilder::new("d").entry("k", value).key(&rate),
            rate,
        };
        let check = |counters: Vec<Counter>, cost: u64| Check {
            counters: counters.into_iter().collect(),
            cost,
            wait: None,
            charge: crate::check::Charge::Admitted,
        };
        let fine = check(vec![counter("a"), counter("a")], MAX_COST);
        assert!(check_from_wire(check_to_wire(&fine)).is_ok());
        let mixed = check(vec![counter("a"), counter("b")], 1);
        let error = check_from_wire(check_to_wire(&mixed)).expect_err("two routes");
        assert!(error.contains("different routes"), "{error}");
        // Any cost beyond every limit is sent as 2^32, and that is accepted; a peer sending
        // more is refused.
        let costly = check(vec![counter("a")], u64::MAX);
        let (sent, _) = check_from_wire(check_to_wire(&costly)).expect("sent bounded");
        assert_eq!(sent.cost, MAX_COST + 1);
        let mut raw = check_to_wire(&costly);
        raw.cost = MAX_COST + 2;
        let error = check_from_wire(raw).expect_err("beyond the bound");
        assert!(error.contains("at most 4294967296"), "{error}");
    }

    #[test]
    fn a_peers_names_are_checked_before_use() {
        let named = |route: u64, key: &str, value: &str| Named {
            route,
            entries: vec![(Box::from(key), Box::from(value))],
        };
        let page = NamesPage {
            names: vec![named(1, "api_key", "a"), named(7, "api_key", "b")],
            more: true,
            kept: 2,
            capacity: 10,
            dropped: 0,
        };
        let wire = names_to_wire(Some(page.clone()));
        assert_eq!(names_from_wire("edge", 2, wire.clone()), Ok(Some(page)));
        assert_eq!(names_from_wire("edge", 5, names_to_wire(None)), Ok(None));
        let bad = |change: &dyn Fn(&mut wire::NamesReply), problem: &str| {
            let mut reply = wire.clone();
            change(&mut reply);
            let error = names_from_wire("edge", 2, reply).expect_err(problem);
            assert!(error.contains(problem), "{error}");
        };
        bad(&|reply| reply.names.reverse(), "route order");
        bad(&|reply| reply.names[1].route = 1, "route order");
        bad(&|reply| reply.names.push(reply.names[0].clone()), "3 names");
        bad(&|reply| reply.names[0].entries.clear(), "out of bounds");
        bad(
            &|reply| reply.names[0].entries[0].key.clear(),
            "out of bounds",
        );
        bad(
            &|reply| reply.names[0].entries[0].value = "x".repeat(names::MAX_NAME_BYTES),
            "out of bounds",
        );
    }

    #[test]
    fn quota_messages_are_bounded_both_ways() {
        let bucket = |limit: u64, demand: u64| wire::QuotaDemand {
            route: 1,
            id: 2,
            limit,
            demand,
        };
        // A demand over the limit is read as the limit; a limit over u32 is refused.
        let read = quota_demands_from_wire(&[bucket(20, 500)]).expect("valid");
        assert_eq!(read[0].demand, 20);
        let refused = quota_demands_from_wire(&[bucket(20, 1), bucket(u64::MAX, 1)]);
        assert!(refused.is_err_and(|problem| problem.starts_with("buckets[1].limit")));
        let too_many = vec![bucket(1, 1); quota::MAX_BUCKETS + 1];
        assert!(quota_demands_from_wire(&too_many).is_err());
        // Shares: one per bucket, at most its limit, 0 read as none given.
        let sent = read;
        let reply = |shares: Vec<u64>| wire::QuotaReply {
            serves_quota: true,
            shares,
        };
        assert_eq!(
            quota_shares_from_wire(&sent, reply(vec![u64::MAX])),
            Ok(Some(vec![Some(20)]))
        );
        assert_eq!(
            quota_shares_from_wire(&sent, reply(vec![0])),
            Ok(Some(vec![None]))
        );
        assert!(quota_shares_from_wire(&sent, reply(vec![1, 2])).is_err());
        assert_eq!(
            quota_shares_from_wire(&sent, wire::QuotaReply::default()),
            Ok(None)
        );
    }
}
