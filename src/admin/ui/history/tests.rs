use super::*;
use crate::limiter::{LimiterOptions, Query};
use crate::limits::Limits;

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: day, requests_per_unit: 2}
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: internal
    rate_limit: {unlimited: true}
"#;

/// 2024-01-04T00:00:10Z, the limiter's test clock.
const START_MS: u64 = (1_704_326_400 + 10) * 1000;

fn limiter() -> Arc<Limiter> {
    Arc::new(Limiter::at_test_start(LIMITS, LimiterOptions::default()))
}

fn clock() -> Clock {
    Clock::starting_at(START_MS * 1_000_000)
}

async fn hit(limiter: &Limiter, value: &str) -> bool {
    let mut query = Query::new("edge");
    query.descriptor([("api_key", value)], 1);
    !limiter.decide(&query).await.expect("decides").is_over()
}

/// Lets the sampling task run what is due.
async fn settle() {
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
}

/// Points as `(ms since START_MS, hits, over)`.
type Points = Vec<(u64, u64, u64)>;

/// Each series' key and its points.
fn read(history: &History) -> Vec<(String, Points)> {
    history
        .series()
        .series
        .into_iter()
        .map(|(key, points)| {
            let points = points
                .iter()
                .map(|point| (point.at_ms - START_MS, point.hits, point.over))
                .collect();
            (key.joined(), points)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_sampler_keeps_ten_minutes_of_each_limits_totals() {
    let limiter = limiter();
    let history = History::spawn(&limiter, clock());
    settle().await;
    assert_eq!(
        read(&history),
        [
            ("edge|edge > api_key|per_key".to_owned(), vec![(0, 0, 0)]),
            ("edge|edge > tenant > path|#0".to_owned(), vec![(0, 0, 0)]),
        ],
        "sampled at once; the unlimited limit has no series"
    );
    let admitted = [
        hit(&limiter, "k").await,
        hit(&limiter, "k").await,
        hit(&limiter, "k").await,
    ];
    assert_eq!(admitted, [true, true, false]);
    tokio::time::advance(INTERVAL - Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(
        read(&history)[0].1.len(),
        1,
        "not sampled before the interval"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(read(&history)[0].1, [(0, 0, 0), (10_000, 3, 1)]);

    // Twenty minutes later: the last ten, one sample every ten seconds.
    for _ in 0..120 {
        tokio::time::advance(INTERVAL).await;
        settle().await;
    }
    let series = read(&history);
    let points = &series[0].1;
    assert_eq!(points.len(), KEEP);
    assert_eq!(points[0].0, 10_000 * 62, "the oldest kept");
    assert_eq!(points[KEEP - 1].0, 10_000 * 121, "the newest");
    assert!(
        points
            .windows(2)
            .all(|pair| pair[1].0 - pair[0].0 == 10_000)
    );
    assert!(points.iter().all(|point| (point.1, point.2) == (3, 1)));
}

#[tokio::test(start_paused = true)]
async fn a_limit_dropped_by_a_reload_loses_its_series_and_a_new_one_starts_fresh() {
    let limiter = limiter();
    let history = History::new(clock(), INTERVAL, KEEP);
    history.sample(&limiter);
    hit(&limiter, "k").await;
    tokio::time::advance(INTERVAL).await;
    history.sample(&limiter);
    let reloaded = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: day, requests_per_unit: 2}
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 5}
"#;
    let limits = Limits::parse_str("reloaded.yaml", reloaded).expect("valid");
    limiter.limits().store(Arc::new(limits));
    tokio::time::advance(INTERVAL).await;
    history.sample(&limiter);
    let series = read(&history);
    let keys: Vec<&str> = series.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(
        keys,
        ["edge|edge > api_key|per_key", "edge|edge > user|per_user"]
    );
    assert_eq!(series[0].1.len(), 3, "per_key kept its past");
    assert_eq!(series[0].1[1], (10_000, 1, 0));
    assert_eq!(series[1].1, [(20_000, 0, 0)], "per_user starts now");
}

#[tokio::test(start_paused = true)]
async fn the_series_are_bounded_by_the_limits_followed() {
    let mut yaml = String::from("domain: many\ndescriptors:\n");
    for n in 0..MAX_SERIES + 5 {
        yaml += &format!("  - key: k{n}\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n");
    }
    let limiter = Limiter::at_test_start(&yaml, LimiterOptions::default());
    let history = History::new(clock(), INTERVAL, 3);
    for _ in 0..5 {
        history.sample(&limiter);
    }
    let series = history.series();
    assert_eq!(series.series.len(), MAX_SERIES);
    assert_eq!(series.truncated, 5);
    assert!(series.series.iter().all(|(_, points)| points.len() == 3));
}

#[tokio::test(start_paused = true)]
async fn the_sampling_task_ends_with_the_last_handle() {
    let limiter = limiter();
    let before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let history = History::spawn(&limiter, clock());
    settle().await;
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    assert_eq!(alive(), before + 1);
    drop(history);
    tokio::time::advance(INTERVAL).await;
    settle().await;
    assert_eq!(alive(), before, "the sampler stopped");
    assert_eq!(Arc::strong_count(&limiter), 1, "it never held the limiter");
}
