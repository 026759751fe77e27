//! The hub over time (tokio's paused clock): division among streams, pushes, the sweep,
//! bounds, reloads, shadow mode, and the over-admission bound against a model of Envoy's
//! token buckets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, advance};

use super::*;
use crate::algorithm::{Algorithm, Rate, Unit};
use crate::quota::envoy_model::EnvoyModel;
use crate::quota::rule::bucket_key;

const INTERVAL: Duration = Duration::from_secs(5);

fn options() -> HubOptions {
    HubOptions {
        max_streams: 4,
        max_buckets_per_stream: 3,
        max_buckets: 5,
        stale_after: 3 * INTERVAL,
        abandon_after: Duration::from_secs(60),
    }
}

fn rate(requests_per_unit: u32, burst: u32) -> Rate {
    Rate::new(
        Algorithm::TokenBucket,
        requests_per_unit,
        Unit::Second,
        Some(burst),
    )
}

fn limited(requests_per_unit: u32, burst: u32) -> Rule {
    Rule::Limited {
        rate: rate(requests_per_unit, burst),
        shadow: false,
    }
}

fn key(name: &str) -> BucketKey {
    bucket_key([("api_key", name)])
}

/// Opens a stream whose pushed actions land in the returned list.
fn open(hub: &Hub) -> (StreamId, Arc<Mutex<Vec<Action>>>) {
    let pushed = Arc::new(Mutex::new(Vec::new()));
    let sink_pushed = Arc::clone(&pushed);
    let id = hub
        .open(
            "edge",
            "edge",
            Box::new(move |actions| {
                sink_pushed.lock().expect("lock").extend(actions);
                true
            }),
        )
        .expect("a stream opens");
    (id, pushed)
}

fn usage(bucket: &str, allowed: u64, denied: u64, elapsed: u64) -> Usage {
    Usage {
        bucket: key(bucket),
        allowed,
        denied,
        elapsed: Duration::from_secs(elapsed),
    }
}

fn report(hub: &Hub, id: StreamId, usages: Vec<Usage>, rule: Rule) -> Vec<Action> {
    hub.report(id, usages, |_| rule, Instant::now())
        .expect("report taken")
        .actions
}

/// The tokens per fill of the one token bucket among `actions`.
fn share(actions: &[Action]) -> u32 {
    match actions {
        [
            Action::Assign {
                strategy: Strategy::TokenBucket(bucket),
                ..
            },
        ] => bucket.tokens_per_fill,
        other => panic!("expected one token bucket, got {other:?}"),
    }
}

fn take(pushed: &Arc<Mutex<Vec<Action>>>) -> Vec<Action> {
    std::mem::take(&mut *pushed.lock().expect("lock"))
}

/// With a `unit_multiplier`, 100 per 10 seconds is a bucket refilled with 100 tokens every
/// 10 s (not 100 per second).
#[tokio::test(start_paused = true)]
async fn one_stream_gets_the_whole_limit_as_a_token_bucket() {
    for multiplier in [1, 10] {
        let hub = Hub::new(options(), RlqsStats::default());
        let (a, _) = open(&hub);
        let rule = Rule::Limited {
            rate: rate(100, 20).every(multiplier).expect("a window"),
            shadow: false,
        };
        let actions = report(&hub, a, vec![usage("alice", 1, 0, 0)], rule);
        assert_eq!(
            actions,
            vec![Action::Assign {
                bucket: key("alice"),
                strategy: Strategy::TokenBucket(TokenBucket {
                    max_tokens: 20,
                    tokens_per_fill: 100,
                    fill_interval_secs: u64::from(multiplier),
                }),
            }]
        );
    }
}

/// Each stream's share of a limit of 100 per 10 seconds is refilled every 10 s too.
#[tokio::test(start_paused = true)]
async fn a_multiplied_window_is_the_fill_interval_of_every_share() {
    let hub = Hub::new(options(), RlqsStats::default());
    let rule = Rule::Limited {
        rate: rate(100, 20).every(10).expect("10 seconds"),
        shadow: false,
    };
    let (a, _) = open(&hub);
    report(&hub, a, vec![usage("alice", 1, 0, 0)], rule);
    // A second stream: each gets a part, still per 10 s.
    let (b, _) = open(&hub);
    let actions = report(&hub, b, vec![usage("alice", 1, 0, 0)], rule);
    match actions.as_slice() {
        [
            Action::Assign {
                strategy: Strategy::TokenBucket(bucket),
                ..
            },
        ] => {
            assert_eq!(bucket.fill_interval_secs, 10);
            assert!(bucket.tokens_per_fill <= 100, "{bucket:?}");
        }
        other => panic!("expected one token bucket, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn blanket_rules_follow_the_limits() {
    let hub = Hub::new(options(), RlqsStats::default());
    let (a, _) = open(&hub);
    for (rule, expected) in [
        (Rule::AllowAll, Strategy::AllowAll),
        (Rule::DenyAll, Strategy::DenyAll),
        (Rule::UnknownDomain, Strategy::AllowAll),
        (
            Rule::Limited {
                rate: rate(10, 10),
                shadow: true,
            },
            Strategy::AllowAll,
        ),
    ] {
        let actions = report(&hub, a, vec![usage("alice", 1, 0, 0)], rule);
        assert_eq!(
            actions,
            vec![Action::Assign {
                bucket: key("alice"),
                strategy: expected
            }],
            "{rule:?}"
        );
    }
    assert_eq!(hub.stats().unknown_domain_reports.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_newcomer_gets_a_share_at_once_and_the_other_shrinks_at_once() {
    let hub = Hub::new(options(), RlqsStats::default());
    let (a, a_pushed) = open(&hub);
    let (b, _) = open(&hub);
    assert_eq!(
        share(&report(
            &hub,
            a,
            vec![usage("alice", 1, 0, 0)],
            limited(100, 20)
        )),
        100
    );
    advance(INTERVAL).await;
    // `a` is busy (500 wanted in 5 s: 100 per second).
    assert_eq!(
        share(&report(
            &hub,
            a,
            vec![usage("alice", 300, 200, 5)],
            limited(100, 20)
        )),
        100
    );
    // `b` arrives: it gets half at once, and `a` is told to shrink at once.
    assert_eq!(
        share(&report(
            &hub,
            b,
            vec![usage("alice", 1, 0, 0)],
            limited(100, 20)
        )),
        50
    );
    assert_eq!(share(&take(&a_pushed)), 50);
    let reporters = hub.reporters("edge", &key("alice"));
    assert_eq!(reporters.len(), 2);
    assert_eq!(reporters.iter().filter_map(|r| r.share).sum::<u64>(), 100);
}

#[tokio::test(start_paused = true)]
async fn shares_follow_demand_max_min_fair() {
    let hub = Hub::new(options(), RlqsStats::default());
    let (a, a_pushed) = open(&hub);
    let (b, b_pushed) = open(&hub);
    report(&hub, a, vec![usage("alice", 1, 0, 0)], limited(100, 20));
    report(&hub, b, vec![usage("alice", 1, 0, 0)], limited(100, 20));
    assert_eq!(share(&take(&a_pushed)), 50);
    advance(INTERVAL).await;
    // 80/20 of 200 per second offered: `b` wants 40 (46 with headroom) and gets it, `a`
    // the rest.
    let a_share = share(&report(
        &hub,
        a,
        vec![usage("alice", 250, 550, 5)],
        limited(100, 20),
    ));
    let b_share = share(&report(
        &hub,
        b,
        vec![usage("alice", 200, 0, 5)],
        limited(100, 20),
    ));
    assert_eq!((a_share, b_share), (50, 46));
    // `a` was pushed what `b` does not want.
    assert_eq!(share(&take(&a_pushed)), 54);
    assert!(take(&b_pushed).is_empty());
    // `b` goes idle: it keeps a floor (100 / 40 = 2), `a` gets the rest at its next report.
    advance(INTERVAL).await;
    assert_eq!(
        share(&report(
            &hub,
            b,
            vec![usage("alice", 0, 0, 5)],
            limited(100, 20)
        )),
        2
    );
    assert_eq!(share(&take(&a_pushed)), 98);
}

#[tokio::test(start_paused = true)]
async fn a_closed_stream_gives_its_share_back_at_once() {
    let hub = Hub::new(options(), RlqsStats::default());
    let (a, a_pushed) = open(&hub);
    let (b, _) = open(&hub);
    report(&hub, a, vec![usage("alice", 1, 0, 0)], limited(100, 20));
    report(&hub, b, vec![usage("alice", 1, 0, 0)], limited(100, 20));
    assert_eq!(share(&take(&a_pushed)), 50);
    hub.close(b);
    assert_eq!(share(&take(&a_pushed)), 100);
    assert_eq!(hub.stream_count(), 1);
    assert_eq!(
        hub.stats()
            .streams
            .get_or_create(&RlqsStats::label("edge"))
            .get(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn idle_buckets_are_abandoned_and_silent_reporters_dropped() {
    let hub = Hub::new(options(), RlqsStats::default());
    let (a, a_pushed) = open(&hub);
    let (b, b_pushed) = open(&hub);
    report(&hub, a, vec![usage("alice", 1, 0, 0)], limited(100, 20));
    report(&hub, b, vec![usage("alice", 1, 0, 0)], limited(100, 20));
    take(&a_pushed);
    // `a` keeps reporting traffic; `b` reports nothing at all (a stalled stream).
    for _ in 0..3 {
        advance(INTERVAL).await;
        hub.sweep(Instant::now());
        report(&hub, a, vec![usage("alice", 50, 0, 5)], limited(100, 20));
    }
    // After 15 s without a report `b` is dropped (told to abandon) and `a` gets all.
    assert_eq!(
        take(&b_pushed).last(),
        Some(&Action::Abandon {
            bucket: key("alice")
        })
    );
    assert_eq!(
        take(&a_pushed)
            .last()
            .map(|a| share(std::slice::from_ref(a))),
        Some(100)
    );
    assert_eq!(hub.reporters("edge", &key("alice")).len(), 1);
    // `a` keeps reporting, but no traffic: after 60 s the bucket is abandoned and gone.
    for _ in 0..12 {
        advance(INTERVAL).await;
        report(&hub, a, vec![usage("alice", 0, 0, 5)], limited(100, 20));
        hub.sweep(Instant::now());
    }
    assert!(take(&a_pushed).contains(&Action::Abandon {
        bucket: key("alice")
    }));
    assert!(hub.reporters("edge", &key("alice")).is_empty());
    assert_eq!(
        hub.stats()
            .buckets
            .get_or_create(&RlqsStats::label("edge"))
            .get(),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn bounds_refuse_without_changing_anything() {
    let hub = Hub::new(options(), RlqsStats::default());
    let (a, _) = open(&hub);
    report(
        &hub,
        a,
        vec![usage("a", 1, 0, 0), usage("b", 1, 0, 0)],
        limited(10, 10),
    );
    let refused = hub.report(
        a,
        vec![usage("c", 1, 0, 0), usage("d", 1, 0, 0)],
        |_| limited(10, 10),
        Instant::now(),
    );
    assert_eq!(
        refused.map(|_| ()),
        Err(HubError::TooManyBuckets { would: 4, max: 3 })
    );
    assert!(hub.reporters("edge", &key("c")).is_empty());
    // The same bucket twice in one message is one bucket.
    report(
        &hub,
        a,
        vec![usage("c", 1, 0, 0), usage("c", 1, 0, 0)],
        limited(10, 10),
    );
    // The node's bound: 3 buckets held, a second stream may add 2 more, not 3.
    let (b, _) = open(&hub);
    let refused = hub.report(
        b,
        vec![
            usage("x", 1, 0, 0),
            usage("y", 1, 0, 0),
            usage("z", 1, 0, 0),
        ],
        |_| limited(10, 10),
        Instant::now(),
    );
    assert_eq!(
        refused.map(|_| ()),
        Err(HubError::TooManyNodeBuckets { would: 6, max: 5 })
    );
    // Buckets the node holds already cost nothing more.
    report(
        &hub,
        b,
        vec![
            usage("a", 1, 0, 0),
            usage("x", 1, 0, 0),
            usage("y", 1, 0, 0),
        ],
        limited(10, 10),
    );
    for _ in 2..4 {
        open(&hub);
    }
    let too_many = hub.open("edge", "edge", Box::new(|_| true));
    assert_eq!(too_many, Err(HubError::TooManyStreams(4)));
    assert!(
        HubError::TooManyStreams(4)
            .to_string()
            .contains("--rlqs-max-streams")
    );
}

#[tokio::test(start_paused = true)]
async fn a_reload_changes_the_next_assignment() {
    let hub = Hub::new(options(), RlqsStats::default());
    let (a, _) = open(&hub);
    assert_eq!(
        share(&report(
            &hub,
            a,
            vec![usage("alice", 1, 0, 0)],
            limited(100, 20)
        )),
        100
    );
    advance(INTERVAL).await;
    assert_eq!(
        share(&report(
            &hub,
            a,
            vec![usage("alice", 90, 0, 5)],
            limited(40, 20)
        )),
        40
    );
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_allows_all_and_counts_what_the_share_would_have_denied() {
    let hub = Hub::new(options(), RlqsStats::default());
    let (a, _) = open(&hub);
    let shadow = Rule::Limited {
        rate: rate(10, 10),
        shadow: true,
    };
    report(&hub, a, vec![usage("alice", 1, 0, 0)], shadow);
    advance(INTERVAL).await;
    // 80 allowed in 5 s against a share of 10 per second: 30 over.
    let actions = report(&hub, a, vec![usage("alice", 80, 0, 5)], shadow);
    assert!(matches!(
        actions.as_slice(),
        [Action::Assign {
            strategy: Strategy::AllowAll,
            ..
        }]
    ));
    assert_eq!(
        hub.stats()
            .shadow_violations
            .get_or_create(&RlqsStats::label("edge"))
            .get(),
        30
    );
}

/// The bound of docs/rlqs.md, checked against the model: over a window of W seconds, Envoys
/// sharing a limit of R per second with burst B admit at most R * W + B + (one burst per
/// assignment change) + one request per reporter for rounding; with 80/20 load and an
/// Envoy joining mid-window, the total stays within 10 % of R * W + B and the busy Envoy
/// gets at least 70 % of what it could.
#[tokio::test(start_paused = true)]
async fn uneven_load_and_a_newcomer_stay_within_the_bound() {
    const LIMIT: u32 = 100;
    const BURST: u32 = 20;
    const WINDOW: u64 = 60;
    let hub = Hub::new(options(), RlqsStats::default());
    let pushed: Vec<Arc<Mutex<Vec<Action>>>> = Vec::new();
    let mut streams = Vec::new();
    let mut pushed = pushed;
    let mut envoys: Vec<EnvoyModel> = Vec::new();
    // Offered per second: the busy Envoy 160, the light one 40, the newcomer (from 30 s) 30.
    let load = [160, 40, 30];
    // Assignment changes after each Envoy's first one.
    let mut first_assignments = 0u64;
    for second in 0..WINDOW {
        let joining = match second {
            0 => 2,
            30 => 1,
            _ => 0,
        };
        for _ in 0..joining {
            let (id, sink) = open(&hub);
            streams.push(id);
            pushed.push(sink);
            let mut envoy = EnvoyModel::new();
            // The request that creates the bucket, reported at once (0 s elapsed).
            envoy.second(1);
            let first = envoy.usage(key("alice"), 0);
            envoy.assign(&report(&hub, id, vec![first], limited(LIMIT, BURST)));
            first_assignments += envoy.changes;
            envoys.push(envoy);
        }
        for (index, envoy) in envoys.iter_mut().enumerate() {
            envoy.assign(&take(&pushed[index]));
            envoy.second(load[index]);
        }
        advance(Duration::from_secs(1)).await;
        if second % 5 == 4 {
            for (index, envoy) in envoys.iter_mut().enumerate() {
                let usage = envoy.usage(key("alice"), 5);
                let actions = report(&hub, streams[index], vec![usage], limited(LIMIT, BURST));
                envoy.assign(&actions);
            }
        }
    }
    let total: u64 = envoys.iter().map(|envoy| envoy.admitted).sum();
    let changes = envoys.iter().map(|envoy| envoy.changes).sum::<u64>() - first_assignments;
    let limit = u64::from(LIMIT) * WINDOW;
    let bound = limit + u64::from(BURST) * (1 + changes) + envoys.len() as u64 * WINDOW;
    assert!(
        total <= bound,
        "{total} admitted, bound {bound} ({changes} changes)"
    );
    assert!(
        total * 10 <= (limit + u64::from(BURST)) * 11,
        "{total} admitted over {limit} + {BURST}"
    );
    assert!(
        total * 10 >= limit * 9,
        "{total} admitted: the limit should be used"
    );
    // The busy Envoy could get the limit minus what the others want: 60 per second, then
    // 30 once the newcomer is in.
    let busy_could: u64 = 60 * 30 + 30 * 30;
    assert!(
        envoys[0].admitted * 10 >= busy_could * 7,
        "the busy Envoy got {} of {busy_could}",
        envoys[0].admitted
    );
}
