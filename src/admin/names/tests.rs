use std::time::Duration;

use super::*;
use crate::limiter::LimiterOptions;

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 5, name: per_key}
  - key: health
"#;

/// A limiter feeding counter names, as the server wires them.
struct Named {
    limiter: Limiter,
    names: Option<Arc<CounterNames>>,
}

impl std::ops::Deref for Named {
    type Target = Limiter;

    fn deref(&self) -> &Limiter {
        &self.limiter
    }
}

impl Named {
    fn counter_names(&self) -> Option<&CounterNames> {
        self.names.as_deref()
    }

    async fn counters(
        &self,
        domain: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Option<CounterPage>, Error> {
        match &self.names {
            Some(names) => names
                .counters(&self.limiter, domain, after, limit)
                .await
                .map(Some),
            None => Ok(None),
        }
    }

    async fn sweep_counter_names(&self) -> Result<usize, Error> {
        self.names
            .as_ref()
            .expect("kept")
            .sweep(&self.limiter)
            .await
    }

    async fn cluster_counters(
        &self,
        named: Vec<(u64, Arc<CounterName>)>,
        more: bool,
        limit: usize,
    ) -> MergedPage {
        cluster_counters(&self.limiter, named, more, limit).await
    }
}

fn limiter(counter_names: usize) -> Named {
    let limiter = Limiter::at_test_start(LIMITS, LimiterOptions::default());
    if counter_names == 0 {
        return Named {
            limiter,
            names: None,
        };
    }
    let names = Arc::new(CounterNames::new(counter_names));
    Named {
        limiter: limiter.with_observer(Arc::clone(&names) as _),
        names: Some(names),
    }
}

async fn hit(limiter: &Limiter, key: &str, value: &str, cost: u64) {
    let mut query = Query::new("edge");
    query.descriptor([(key, value)], cost);
    limiter.decide(&query).await.expect("decides");
}

/// (value, used) of every listed counter, walking all pages of `size`.
async fn listed(limiter: &Named, size: usize) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = limiter
            .counters("edge", after, size)
            .await
            .expect("lists")
            .expect("names are kept");
        assert!(page.counters.len() <= size);
        out.extend(page.counters.iter().map(|listed| {
            (
                listed.name.entries[0].1.to_string(),
                listed.explained.limits[0].used,
            )
        }));
        match page.next {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn decided_counters_are_listed_with_their_state_and_paged() {
    let limiter = limiter(100);
    for (value, hits) in [
        ("alice", 2),
        ("bob", 1),
        ("carol", 3),
        ("dave", 1),
        ("eve", 1),
    ] {
        for _ in 0..hits {
            hit(&limiter, "api_key", value, 1).await;
        }
    }
    hit(&limiter, "health", "probe", 1).await;
    hit(&limiter, "api_key", "peeked", 0).await;
    let mut all = listed(&limiter, 2).await;
    assert_eq!(
        all.len(),
        5,
        "{all:?}: no allow-listed or cost-0 descriptor"
    );
    all.sort();
    assert_eq!(
        all,
        [
            ("alice", 2),
            ("bob", 1),
            ("carol", 3),
            ("dave", 1),
            ("eve", 1)
        ]
        .map(|(value, used)| (value.to_owned(), used))
    );
    let figures = limiter.counter_names().expect("kept").figures();
    assert_eq!((figures.kept, figures.dropped), (5, 0), "alice noted once");
    // The same walk with one big page finds the same counters, in route order.
    let one_page = limiter
        .counters("edge", None, 100)
        .await
        .expect("lists")
        .expect("kept");
    assert_eq!(one_page.next, None);
    assert_eq!(one_page.counters.len(), 5);
}

#[tokio::test(start_paused = true)]
async fn the_map_is_bounded_and_the_sweep_makes_room_again() {
    let limiter = limiter(2);
    for value in ["a", "b", "c"] {
        hit(&limiter, "api_key", value, 1).await;
    }
    let names = limiter.counter_names().expect("kept");
    assert_eq!(
        names.figures(),
        NamesFigures {
            kept: 2,
            capacity: 2,
            dropped: 1
        }
    );
    assert_eq!(
        limiter.sweep_counter_names().await,
        Ok(0),
        "all still counting"
    );
    // The window ends: every counter is back to full, and the sweep forgets them.
    tokio::time::advance(Duration::from_secs(51)).await;
    assert!(listed(&limiter, 10).await.is_empty(), "nothing counted now");
    assert_eq!(limiter.sweep_counter_names().await, Ok(2));
    assert_eq!(names.figures().kept, 0);
    hit(&limiter, "api_key", "c", 1).await;
    assert_eq!(listed(&limiter, 10).await, [("c".to_owned(), 1)]);
}

#[tokio::test(start_paused = true)]
async fn long_descriptors_are_not_kept_and_nothing_is_kept_when_off() {
    let limiter = limiter(10);
    let long = "x".repeat(MAX_NAME_BYTES);
    hit(&limiter, "api_key", &long, 1).await;
    let names = limiter.counter_names().expect("kept");
    assert_eq!((names.figures().kept, names.figures().dropped), (0, 1));

    let off = self::limiter(0);
    hit(&off, "api_key", "a", 1).await;
    assert!(off.counter_names().is_none());
    assert!(
        off.counters("edge", None, 10)
            .await
            .expect("answers")
            .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn a_page_is_sorted_by_use() {
    let limiter = limiter(100);
    for (value, hits) in [("one", 1), ("four", 4), ("two", 2), ("three", 3)] {
        hit(&limiter, "api_key", value, hits).await;
    }
    let page = limiter
        .counters("edge", None, 10)
        .await
        .expect("lists")
        .expect("kept");
    let order: Vec<&str> = page
        .counters
        .iter()
        .map(|listed| &*listed.name.entries[0].1)
        .collect();
    assert_eq!(order, ["four", "three", "two", "one"]);
}

/// The name of `value` as another member would send it.
fn named(value: &str) -> (u64, Arc<CounterName>) {
    let mut key = crate::key::KeyBuilder::new("edge");
    key.entry("api_key", value);
    let name = CounterName {
        domain: Box::from("edge"),
        entries: Box::new([(Box::from("api_key"), Box::from(value))]),
    };
    (key.route(), Arc::new(name))
}

#[tokio::test(start_paused = true)]
async fn names_from_several_members_are_listed_once_each_in_pages() {
    // This store holds every counter; the names came from several "members".
    let limiter = limiter(100);
    for (value, hits) in [("a", 1), ("b", 5), ("c", 2), ("d", 3)] {
        hit(&limiter, "api_key", value, hits).await;
    }
    let mut from_members: Vec<(u64, Arc<CounterName>)> = ["a", "b", "c", "d", "b", "c"]
        .into_iter()
        .map(named)
        .collect();
    // A name whose counter has nothing counted is not listed.
    from_members.push(named("idle"));
    let all = limiter
        .cluster_counters(from_members.clone(), false, 10)
        .await;
    let listed: Vec<(&str, u64)> = all
        .counters
        .iter()
        .map(|listed| (&*listed.name.entries[0].1, listed.explained.limits[0].used))
        .collect();
    assert_eq!(listed, [("b", 5), ("d", 3), ("c", 2), ("a", 1)]);
    assert_eq!(all.next, None);
    assert!(all.unanswered.is_empty());

    // Pages of 2 follow the routes, so a walk lists each counted one exactly once.
    let mut routes: Vec<(u64, String)> = from_members
        .iter()
        .map(|(route, name)| (*route, name.entries[0].1.to_string()))
        .collect();
    routes.sort_unstable();
    routes.dedup();
    assert_eq!(routes.len(), 5);
    let mut walked: Vec<String> = Vec::new();
    let mut after: Option<u64> = None;
    for page_index in 0..3 {
        let rest: Vec<(u64, Arc<CounterName>)> = from_members
            .iter()
            .filter(|(route, _)| after.is_none_or(|after| *route > after))
            .cloned()
            .collect();
        let page = limiter.cluster_counters(rest, false, 2).await;
        let expected: Vec<&str> = routes
            .iter()
            .skip(page_index * 2)
            .take(2)
            .map(|(_, value)| value.as_str())
            .filter(|value| *value != "idle")
            .collect();
        let mut got: Vec<String> = page
            .counters
            .iter()
            .map(|listed| listed.name.entries[0].1.to_string())
            .collect();
        got.sort();
        let mut expected: Vec<String> = expected.into_iter().map(str::to_owned).collect();
        expected.sort();
        assert_eq!(got, expected, "page {page_index}");
        walked.extend(got);
        after = page.next;
        assert_eq!(after.is_some(), page_index < 2, "page {page_index}");
    }
    walked.sort();
    assert_eq!(walked, ["a", "b", "c", "d"]);
    // A member with more names than it sent makes a next page even when this one is short.
    let last = limiter.cluster_counters(vec![named("a")], true, 5).await;
    assert_eq!(last.next, Some(named("a").0));
}
