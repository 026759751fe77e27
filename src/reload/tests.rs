//! Hot reload against real files: each test writes limits into its own temp directory,
//! starts a watch, changes the files the way an operator (or Kubernetes) would, and waits
//! (bounded) for the live limits to follow.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::{ReloadOptions, ReloadStats, Watcher, load, reload_now, version_of, watch};
use crate::limits::{Limits, LoadOptions, Source};
use ratekeeper_core::testing::{TempDir, mkfifo};

/// How long a change may take to show up before a test fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// A limits file for `domain` limiting each `api_key` to `requests_per_unit` per second.
fn limits_yaml(domain: &str, requests_per_unit: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: api_key\n    rate_limit: {{unit: second, requests_per_unit: {requests_per_unit}}}\n"
    )
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).expect("write file");
}

/// The live `requests_per_unit` of `api_key=x` in `domain`, if that matches a limit.
fn live_rate(live: &ArcSwap<Limits>, domain: &str) -> Option<u32> {
    let limits = live.load();
    let node = limits.domain(domain)?.lookup([("api_key", "x")])?;
    let rate = node.limits.first()?.rate.as_ref()?;
    Some(rate.requests_per_unit)
}

fn has_domain(live: &ArcSwap<Limits>, domain: &str) -> bool {
    live.load().domain(domain).is_some()
}

/// The live limits and stats for `path` as the server starts them, and a running watch.
struct Running {
    live: Arc<ArcSwap<Limits>>,
    stats: Arc<ReloadStats>,
    watcher: Watcher,
}

fn start(path: &Path, options: ReloadOptions) -> Running {
    let (limits, version) = match load(path, options.load) {
        Ok(loaded) => loaded,
        Err(errors) => panic!("initial load of {} failed:\n{errors}", path.display()),
    };
    let live = Arc::new(ArcSwap::from_pointee(limits));
    let stats = Arc::new(ReloadStats::with_version(version));
    let watcher = watch(
        path.to_owned(),
        Arc::clone(&live),
        options,
        Arc::clone(&stats),
    )
    .expect("start watching");
    Running {
        live,
        stats,
        watcher,
    }
}

/// A short debounce keeps the tests quick; the behaviour is the same.
fn quick() -> ReloadOptions {
    ReloadOptions {
        debounce: Duration::from_millis(50),
        ..ReloadOptions::default()
    }
}

/// Polls `condition` every 20 ms until it holds; fails the test after `PATIENCE`.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    if !poll_until(PATIENCE, &mut condition).await {
        panic!("timed out after {PATIENCE:?} waiting for: {what}");
    }
}

/// Polls `condition` every 20 ms for up to `limit`; whether it came to hold.
async fn poll_until(limit: Duration, condition: &mut impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn failures(stats: &ReloadStats) -> u64 {
    stats.failures.load(Ordering::Relaxed)
}

fn successes(stats: &ReloadStats) -> u64 {
    stats.successes.load(Ordering::Relaxed)
}

/// Lays out a Kubernetes ConfigMap volume: `..<stamp>/<file>` for each file, `..data ->
/// ..<stamp>`, and `<file> -> ..data/<file>` for each file.
fn configmap_mount(dir: &Path, stamp: &str, files: &[(&str, String)]) {
    let data = dir.join(format!("..{stamp}"));
    fs::create_dir(&data).expect("create timestamped dir");
    for (name, text) in files {
        write(&data.join(name), text);
        symlink(format!("..data/{name}"), dir.join(name)).expect("link visible file");
    }
    symlink(format!("..{stamp}"), dir.join("..data")).expect("link ..data");
}

/// Updates a ConfigMap volume the way the kubelet does: a new timestamped dir, `..data_tmp`
/// pointing at it, renamed over `..data`, then the old dir removed.
fn configmap_update(dir: &Path, old_stamp: &str, new_stamp: &str, files: &[(&str, String)]) {
    let data = dir.join(format!("..{new_stamp}"));
    fs::create_dir(&data).expect("create timestamped dir");
    for (name, text) in files {
        write(&data.join(name), text);
    }
    symlink(format!("..{new_stamp}"), dir.join("..data_tmp")).expect("link ..data_tmp");
    fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    fs::remove_dir_all(dir.join(format!("..{old_stamp}"))).expect("remove old dir");
}

#[tokio::test]
async fn a_file_edited_in_place_is_reloaded() {
    let dir = TempDir::new("in-place");
    let file = dir.join("edge.yaml");
    write(&file, &limits_yaml("edge", 10));
    let running = start(dir.path(), quick());
    assert_eq!(live_rate(&running.live, "edge"), Some(10));

    write(&file, &limits_yaml("edge", 20));
    eventually("requests_per_unit 20", || {
        live_rate(&running.live, "edge") == Some(20)
    })
    .await;
    assert!(
        running
            .stats
            .last_success_unix_seconds
            .load(Ordering::Relaxed)
            > 0
    );
}

#[tokio::test]
async fn a_single_file_config_edited_in_place_is_reloaded() {
    let dir = TempDir::new("single-in-place");
    let file = dir.join("edge.yaml");
    write(&file, &limits_yaml("edge", 10));
    let running = start(&file, quick());

    write(&file, &limits_yaml("edge", 30));
    eventually("requests_per_unit 30", || {
        live_rate(&running.live, "edge") == Some(30)
    })
    .await;
}

#[tokio::test]
async fn an_atomic_rename_over_the_file_is_reloaded() {
    let dir = TempDir::new("rename");
    let file = dir.join("edge.yaml");
    write(&file, &limits_yaml("edge", 10));
    // `--config` names the file itself: the watch on its parent survives the inode change.
    let running = start(&file, quick());

    let tmp = dir.join(".edge.yaml.tmp");
    write(&tmp, &limits_yaml("edge", 40));
    fs::rename(&tmp, &file).expect("rename over");
    eventually("requests_per_unit 40", || {
        live_rate(&running.live, "edge") == Some(40)
    })
    .await;

    // And again: the second rename replaces the inode the first one created.
    write(&tmp, &limits_yaml("edge", 41));
    fs::rename(&tmp, &file).expect("rename over");
    eventually("requests_per_unit 41", || {
        live_rate(&running.live, "edge") == Some(41)
    })
    .await;
}

#[tokio::test]
async fn an_atomic_rename_in_a_directory_is_reloaded() {
    let dir = TempDir::new("rename-dir");
    write(&dir.join("edge.yaml"), &limits_yaml("edge", 10));
    let running = start(dir.path(), quick());

    let tmp = dir.join(".edge.yaml.tmp");
    write(&tmp, &limits_yaml("edge", 45));
    fs::rename(&tmp, dir.join("edge.yaml")).expect("rename over");
    eventually("requests_per_unit 45", || {
        live_rate(&running.live, "edge") == Some(45)
    })
    .await;
}

#[tokio::test]
async fn adding_and_deleting_a_file_in_the_directory_is_reloaded() {
    let dir = TempDir::new("add-delete");
    write(&dir.join("edge.yaml"), &limits_yaml("edge", 10));
    let running = start(dir.path(), quick());
    assert!(!has_domain(&running.live, "internal"));

    write(&dir.join("internal.yml"), &limits_yaml("internal", 5));
    eventually("domain internal added", || {
        live_rate(&running.live, "internal") == Some(5)
    })
    .await;
    assert_eq!(live_rate(&running.live, "edge"), Some(10));

    fs::remove_file(dir.join("internal.yml")).expect("delete file");
    eventually("domain internal removed", || {
        !has_domain(&running.live, "internal")
    })
    .await;
    assert_eq!(live_rate(&running.live, "edge"), Some(10));
}

#[tokio::test]
async fn a_file_in_a_sub_directory_is_watched_and_reloaded() {
    let dir = TempDir::new("nested");
    write(&dir.join("edge.yaml"), &limits_yaml("edge", 10));
    fs::create_dir(dir.join("teams")).expect("create teams/");
    write(
        &dir.join("teams/internal.conf"),
        &limits_yaml("internal", 5),
    );
    let running = start(dir.path(), quick());
    assert_eq!(live_rate(&running.live, "internal"), Some(5));

    write(
        &dir.join("teams/internal.conf"),
        &limits_yaml("internal", 7),
    );
    eventually("the nested file's change applied", || {
        live_rate(&running.live, "internal") == Some(7)
    })
    .await;
    // A directory created after the watch started is watched too.
    fs::create_dir(dir.join("later")).expect("create later/");
    write(&dir.join("later/extra.yaml"), &limits_yaml("extra", 3));
    eventually("a file in a new sub-directory loaded", || {
        live_rate(&running.live, "extra") == Some(3)
    })
    .await;
    assert_eq!(live_rate(&running.live, "edge"), Some(10));
}

#[tokio::test]
async fn a_kubernetes_configmap_update_is_reloaded() {
    let dir = TempDir::new("configmap");
    let first = "2026_11_21_10_00_00.000000001";
    configmap_mount(dir.path(), first, &[("edge.yaml", limits_yaml("edge", 10))]);
    let running = start(dir.path(), quick());
    assert_eq!(live_rate(&running.live, "edge"), Some(10));
    // The hidden `..` entries are not loaded twice (that would be a duplicate domain).
    assert_eq!(running.live.load().domains().count(), 1);

    let second = "2026_11_21_10_05_00.000000002";
    configmap_update(
        dir.path(),
        first,
        second,
        &[("edge.yaml", limits_yaml("edge", 50))],
    );
    eventually("requests_per_unit 50", || {
        live_rate(&running.live, "edge") == Some(50)
    })
    .await;

    let third = "2026_11_21_10_10_00.000000003";
    configmap_update(
        dir.path(),
        second,
        third,
        &[("edge.yaml", limits_yaml("edge", 60))],
    );
    eventually("requests_per_unit 60", || {
        live_rate(&running.live, "edge") == Some(60)
    })
    .await;
    assert_eq!(failures(&running.stats), 0);
}

#[tokio::test]
async fn a_kubernetes_configmap_file_named_directly_is_reloaded() {
    let dir = TempDir::new("configmap-file");
    let first = "2026_11_21_10_00_00.000000001";
    configmap_mount(dir.path(), first, &[("edge.yaml", limits_yaml("edge", 10))]);
    // `--config` is the visible symlink `edge.yaml -> ..data/edge.yaml`.
    let running = start(&dir.join("edge.yaml"), quick());

    let second = "2026_11_21_10_05_00.000000002";
    configmap_update(
        dir.path(),
        first,
        second,
        &[("edge.yaml", limits_yaml("edge", 70))],
    );
    eventually("requests_per_unit 70", || {
        live_rate(&running.live, "edge") == Some(70)
    })
    .await;
    assert_eq!(failures(&running.stats), 0);
}

#[tokio::test]
async fn an_invalid_file_keeps_the_old_limits_until_it_is_fixed() {
    let dir = TempDir::new("invalid");
    let file = dir.join("edge.yaml");
    write(&file, &limits_yaml("edge", 10));
    let running = start(dir.path(), quick());
    let version = running.stats.version.load(Ordering::Relaxed);

    write(
        &file,
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: fortnight, requests_per_unit: 20}\n",
    );
    eventually("a failed reload", || failures(&running.stats) > 0).await;
    assert_eq!(live_rate(&running.live, "edge"), Some(10));
    assert_eq!(running.stats.version.load(Ordering::Relaxed), version);
    assert_eq!(successes(&running.stats), 0);
    // The dashboard shows why, naming the file and the place.
    let (_, errors) = running.stats.last_error().expect("the last error is kept");
    assert!(
        errors.contains("edge.yaml") && errors.contains("unknown unit \"fortnight\""),
        "{errors}"
    );

    write(&file, &limits_yaml("edge", 25));
    eventually("requests_per_unit 25", || {
        live_rate(&running.live, "edge") == Some(25)
    })
    .await;
    assert_eq!(successes(&running.stats), 1);
    assert_ne!(running.stats.version.load(Ordering::Relaxed), version);
    assert_eq!(running.stats.last_error(), None, "a success clears it");
}

#[tokio::test]
async fn reading_the_files_does_not_count_as_a_change() {
    let dir = TempDir::new("no-echo");
    let file = dir.join("edge.yaml");
    write(&file, &limits_yaml("edge", 10));
    let running = start(dir.path(), quick());

    write(&file, &limits_yaml("edge", 20));
    eventually("requests_per_unit 20", || {
        live_rate(&running.live, "edge") == Some(20)
    })
    .await;
    // A reload opens and reads the files in the watched directory; if that counted as an
    // event, the watcher would re-read every quiet period forever. Trailing events of the
    // write may cause one or two more looks, not a steady stream.
    let checks = running.stats.checks.load(Ordering::Relaxed);
    let spinning = poll_until(Duration::from_secs(1), &mut || {
        running.stats.checks.load(Ordering::Relaxed) >= checks + 5
    })
    .await;
    assert!(!spinning, "the watcher keeps re-reading its own reads");
}

#[tokio::test]
async fn a_burst_of_writes_ends_in_few_reloads_with_the_last_content() {
    let dir = TempDir::new("burst");
    let file = dir.join("edge.yaml");
    write(&file, &limits_yaml("edge", 1000));
    let running = start(dir.path(), ReloadOptions::default());

    for requests_per_unit in 1..=50 {
        write(&file, &limits_yaml("edge", requests_per_unit));
    }
    eventually("requests_per_unit 50", || {
        live_rate(&running.live, "edge") == Some(50)
    })
    .await;
    let reloads = successes(&running.stats);
    assert!(
        (1..=5).contains(&reloads),
        "50 writes took {reloads} reloads"
    );
}

#[tokio::test]
async fn a_periodic_recheck_sees_changes_that_send_no_events() {
    // The visible file links to a file in a directory nobody watches, so editing the
    // target makes no event in the watched directory: like a filesystem without events.
    let root = TempDir::new("recheck");
    let elsewhere = root.join("elsewhere");
    let dir = root.join("limits");
    fs::create_dir(&elsewhere).expect("create target dir");
    fs::create_dir(&dir).expect("create config dir");
    let target = elsewhere.join("edge.yaml");
    write(&target, &limits_yaml("edge", 10));
    symlink(&target, dir.join("edge.yaml")).expect("link config file");
    let options = ReloadOptions {
        recheck_every: Some(Duration::from_millis(100)),
        ..ReloadOptions::default()
    };
    let running = start(&dir, options);

    write(&target, &limits_yaml("edge", 90));
    eventually("requests_per_unit 90", || {
        live_rate(&running.live, "edge") == Some(90)
    })
    .await;
}

#[tokio::test]
async fn a_deleted_directory_keeps_the_old_limits_and_recovers_when_it_returns() {
    let root = TempDir::new("deleted");
    let dir = root.join("limits");
    fs::create_dir(&dir).expect("create config dir");
    write(&dir.join("edge.yaml"), &limits_yaml("edge", 10));
    let running = start(&dir, quick());

    fs::remove_dir_all(&dir).expect("delete config dir");
    eventually("a failed reload", || failures(&running.stats) > 0).await;
    assert_eq!(live_rate(&running.live, "edge"), Some(10));

    // Created elsewhere and renamed into place, so the directory appears with its file.
    let staging = root.join("staging");
    fs::create_dir(&staging).expect("create staging dir");
    write(&staging.join("edge.yaml"), &limits_yaml("edge", 15));
    fs::rename(&staging, &dir).expect("move config dir into place");
    eventually("requests_per_unit 15", || {
        live_rate(&running.live, "edge") == Some(15)
    })
    .await;

    // Watched again: a later edit is seen through events.
    write(&dir.join("edge.yaml"), &limits_yaml("edge", 16));
    eventually("requests_per_unit 16", || {
        live_rate(&running.live, "edge") == Some(16)
    })
    .await;
    // No retry loop while it was gone: one failed reload for the deletion's event burst.
    assert!(
        failures(&running.stats) <= 2,
        "{} failed reloads",
        failures(&running.stats)
    );
}

#[tokio::test]
async fn dropping_the_watcher_stops_reloading() {
    let dir = TempDir::new("drop");
    let file = dir.join("edge.yaml");
    write(&file, &limits_yaml("edge", 10));
    let running = start(dir.path(), quick());

    write(&file, &limits_yaml("edge", 11));
    eventually("requests_per_unit 11", || {
        live_rate(&running.live, "edge") == Some(11)
    })
    .await;

    let Running {
        live,
        stats,
        watcher,
    } = running;
    drop(watcher);
    let reloads = successes(&stats);
    let failed = failures(&stats);
    write(&file, &limits_yaml("edge", 12));
    // The point of this wait is that nothing happens: a bounded look, not synchronisation.
    let changed = poll_until(Duration::from_secs(1), &mut || {
        live_rate(&live, "edge") != Some(11)
    })
    .await;
    assert!(!changed, "reloaded after the watcher was dropped");
    assert_eq!(successes(&stats), reloads);
    assert_eq!(failures(&stats), failed);
}

#[test]
fn reload_now_does_nothing_when_nothing_changed() {
    let dir = TempDir::new("now");
    let file = dir.join("edge.yaml");
    write(&file, &limits_yaml("edge", 10));
    let (limits, version) = load(dir.path(), LoadOptions::default()).expect("load");
    let live = ArcSwap::from_pointee(limits);
    let stats = ReloadStats::with_version(version);
    let before = live.load_full();

    assert_eq!(
        reload_now(dir.path(), LoadOptions::default(), &live, &stats),
        Ok(false)
    );
    assert!(Arc::ptr_eq(&before, &live.load_full()), "swapped a no-op");
    assert_eq!(successes(&stats), 0);

    write(&file, &limits_yaml("edge", 20));
    assert_eq!(
        reload_now(dir.path(), LoadOptions::default(), &live, &stats),
        Ok(true)
    );
    assert_eq!(live_rate(&live, "edge"), Some(20));
    assert_eq!(successes(&stats), 1);
    assert_eq!(
        reload_now(dir.path(), LoadOptions::default(), &live, &stats),
        Ok(false)
    );
    assert_eq!(successes(&stats), 1);
    assert_eq!(failures(&stats), 0);
}

#[test]
fn reload_now_reports_every_problem_and_keeps_the_old_limits() {
    let dir = TempDir::new("now-invalid");
    write(&dir.join("a.yaml"), &limits_yaml("edge", 10));
    let (limits, version) = load(dir.path(), LoadOptions::default()).expect("load");
    let live = ArcSwap::from_pointee(limits);
    let stats = ReloadStats::with_version(version);

    write(&dir.join("b.yaml"), &limits_yaml("edge", 20));
    write(&dir.join("c.yaml"), "domain: other\nratelimit: {}\n");
    let errors =
        reload_now(dir.path(), LoadOptions::default(), &live, &stats).expect_err("invalid config");
    let text = errors.to_string();
    assert!(
        text.contains("b.yaml") && text.contains("duplicate domain"),
        "{text}"
    );
    assert!(text.contains("c.yaml"), "{text}");
    assert_eq!(errors.errors().len(), 2, "{text}");
    assert_eq!(live_rate(&live, "edge"), Some(10));
    assert_eq!(failures(&stats), 1);
    assert_eq!(stats.version.load(Ordering::Relaxed), version);
}

#[test]
fn version_of_covers_names_and_texts() {
    let source = |name: &str, text: &str| Source {
        name: name.to_owned(),
        text: text.to_owned(),
    };
    let base = version_of(&[source("edge.yaml", "domain: edge\n")]);
    assert_eq!(base, version_of(&[source("edge.yaml", "domain: edge\n")]));
    assert_ne!(base, version_of(&[source("edge.yaml", "domain: edgy\n")]));
    assert_ne!(base, version_of(&[source("edge.yml", "domain: edge\n")]));
    // Length prefixes: moving bytes between name and text, or between files, changes it.
    assert_ne!(
        version_of(&[source("ab", "c")]),
        version_of(&[source("a", "bc")])
    );
    assert_ne!(
        version_of(&[source("a", "b"), source("c", "d")]),
        version_of(&[source("a", "bc"), source("", "d")])
    );
    // Load order matters.
    assert_ne!(
        version_of(&[source("a", "x"), source("b", "y")]),
        version_of(&[source("b", "y"), source("a", "x")])
    );
    // Golden: no files is FNV-1a's offset basis.
    assert_eq!(version_of(&[]), 0xcbf2_9ce4_8422_2325);
}

#[test]
fn load_versions_the_bytes_it_compiled() {
    let dir = TempDir::new("load");
    let file = dir.join("edge.yaml");
    let text = limits_yaml("edge", 10);
    write(&file, &text);
    let (limits, version) = load(dir.path(), LoadOptions::default()).expect("load");
    assert_eq!(limits.limit_count(), 1);
    let expected = version_of(&[Source {
        name: file.display().to_string(),
        text,
    }]);
    assert_eq!(version, expected);
}

#[test]
fn watch_needs_an_existing_path() {
    let dir = TempDir::new("missing");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();
    let error = watch(
        dir.join("absent"),
        Arc::new(ArcSwap::from_pointee(Limits::default())),
        ReloadOptions::default(),
        Arc::new(ReloadStats::default()),
    )
    .expect_err("absent path");
    assert!(error.to_string().starts_with("cannot watch "), "{error}");
}

#[tokio::test]
async fn merged_domains_stay_merged_across_reloads() {
    let dir = TempDir::new("merge");
    write(&dir.join("a.yaml"), &limits_yaml("edge", 10));
    let options = ReloadOptions {
        load: LoadOptions {
            merge_domains: true,
            ..LoadOptions::default()
        },
        ..quick()
    };
    let running = start(dir.path(), options);
    assert_eq!(live_rate(&running.live, "edge"), Some(10));

    // A second file of the same domain adds its descriptors.
    write(
        &dir.join("b.yaml"),
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 4}\n",
    );
    eventually("the second file merged", || {
        let limits = running.live.load();
        limits
            .domain("edge")
            .and_then(|domain| domain.lookup([("tenant", "t")]))
            .is_some()
    })
    .await;
    assert_eq!(live_rate(&running.live, "edge"), Some(10));
    assert_eq!(running.stats.failures.load(Ordering::Relaxed), 0);
}

/// The finding: a FIFO dropped into the limits directory froze reloads (the read blocked)
/// and later good files never went live. Now the reload fails naming it, the old limits
/// keep serving, and once it is gone the next good file goes live.
#[tokio::test]
async fn a_fifo_in_the_directory_fails_one_reload_and_never_freezes_the_next() {
    let dir = TempDir::new("fifo");
    let file = dir.join("edge.yaml");
    write(&file, &limits_yaml("edge", 10));
    let running = start(dir.path(), quick());

    let fifo = dir.join("pipe.yaml");
    mkfifo(&fifo);
    eventually("a failed reload", || failures(&running.stats) > 0).await;
    assert_eq!(live_rate(&running.live, "edge"), Some(10));
    let (_, errors) = running.stats.last_error().expect("the last error is kept");
    assert!(
        errors.contains("pipe.yaml") && errors.contains("not a regular file"),
        "{errors}"
    );

    std::fs::remove_file(&fifo).expect("removed");
    write(&file, &limits_yaml("edge", 25));
    eventually("requests_per_unit 25", || {
        live_rate(&running.live, "edge") == Some(25)
    })
    .await;
}
