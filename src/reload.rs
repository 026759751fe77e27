//! Hot reload of the limits: keeps the server's `Arc<ArcSwap<Limits>>` equal to what the
//! `--config` path (a YAML file or a directory of them) holds on disk.
//!
//! [`watch`] watches the config directory (for a file: its parent directory) non-recursively
//! through inotify and treats every event there except a read as "maybe changed": once events
//! have been quiet for [`ReloadOptions::debounce`] it re-reads everything, and the content
//! hash ([`version_of`]) turns no-ops into nothing. Watching the directory, not the files, is
//! what makes in-place edits, atomic renames, added and deleted files and Kubernetes
//! ConfigMap symlink swaps (`..data -> ..2026_...` replaced by a rename) all visible.
//!
//! Invariants:
//! - A reload is read -> parse -> validate -> compile -> swap, all or nothing: on any error
//!   the old limits stay live, and the failure is counted and logged with every problem.
//! - Reloads are serialized by a lock inside [`ReloadStats`], so an older read never replaces
//!   a newer one, and `version` names the live limits after any reload.
//! - Once a [`Watcher`] has been dropped it never swaps again: drop waits for a reload in
//!   flight, and a reload checks the stop flag under the same lock.
//! - Bounded: a fixed-size event queue (a full queue drops events, since one re-read covers
//!   any number of them), at most one reload per quiet period, and no busy loop when the
//!   directory disappears (one re-watch attempt per [`REWATCH_EVERY`]).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval, MissedTickBehavior};

mod metrics;

use crate::key::fnv1a64;
use crate::limits::{ConfigErrors, Domain, Limits, LoadOptions, Source};

/// FNV-1a 64's offset basis: the version of no files at all.
const FNV64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Events waiting for the reload loop. More are dropped: one pending is enough.
const EVENT_QUEUE: usize = 16;

/// A steady stream of events defers a reload by at most this many quiet periods.
const MAX_DEFER_PERIODS: u32 = 10;

/// How often to try watching the directory again after it was removed or moved away.
pub const REWATCH_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug)]
pub struct ReloadOptions {
    /// Quiet period after the last event before reloading (200 ms by default).
    pub debounce: Duration,
    /// Re-read this often even without events, for filesystems that send none (off by
    /// default; zero also means off).
    pub recheck_every: Option<Duration>,
    /// How the files become limits; the same as at start-up.
    pub load: LoadOptions,
}

impl Default for ReloadOptions {
    fn default() -> ReloadOptions {
        ReloadOptions {
            debounce: Duration::from_millis(200),
            recheck_every: None,
            load: LoadOptions::default(),
        }
    }
}

/// Reload counters, scraped by metrics; written only by the reloader.
#[derive(Default)]
pub struct ReloadStats {
    /// Every look at the files, whatever came of it (including unchanged ones).
    pub checks: AtomicU64,
    pub successes: AtomicU64,
    pub failures: AtomicU64,
    pub last_success_unix_seconds: AtomicU64,
    /// [`version_of`] the live limits; 0 until known. Start from [`ReloadStats::with_version`]
    /// so that the first check of an unchanged config is a no-op.
    pub version: AtomicU64,
    /// Held for a whole reload: reloads never overlap.
    serial: Mutex<()>,
    /// The last failed reload (Unix seconds) and its errors, cleared by a success; its
    /// text is bounded by [`MAX_ERROR_TEXT`].
    last_error: Mutex<Option<(u64, String)>>,
}

/// The most bytes of a failed reload's errors kept for the dashboard.
pub const MAX_ERROR_TEXT: usize = 8 * 1024;

impl crate::metrics::reference::Loads for ReloadStats {
    fn loads(&self) -> (u64, u64) {
        let successes = self.successes.load(Ordering::Relaxed);
        (successes, self.failures.load(Ordering::Relaxed))
    }
}

impl ReloadStats {
    /// Stats for limits already live at `version` (as returned by [`load`]).
    pub fn with_version(version: u64) -> ReloadStats {
        let stats = ReloadStats::default();
        stats.version.store(version, Ordering::Relaxed);
        stats
    }

    /// Registers the reload metrics (read at scrape time) in `registry`.
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        registry.register_collector(Box::new(metrics::ReloadCollector {
            stats: Arc::clone(self),
        }));
    }

    /// The last failed reload, when it failed (Unix seconds) and why, unless a reload
    /// succeeded since.
    pub fn last_error(&self) -> Option<(u64, String)> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_last_error(&self, error: Option<String>) {
        let error = error.map(|mut text| {
            if text.len() > MAX_ERROR_TEXT {
                let mut end = MAX_ERROR_TEXT;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
                text.push_str("\n...");
            }
            (unix_now(), text)
        });
        // The guarded value is replaced whole: a poisoned lock holds nothing half-written.
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = error;
    }

    fn serialize(&self) -> MutexGuard<'_, ()> {
        // The guarded data is `()`: a panic while holding it leaves nothing inconsistent.
        self.serial.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for ReloadStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadStats")
            .field("checks", &self.checks)
            .field("successes", &self.successes)
            .field("failures", &self.failures)
            .field("last_success_unix_seconds", &self.last_success_unix_seconds)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// FNV-1a 64 over every source's name and text (each length-prefixed), in load order.
pub fn version_of(sources: &[Source]) -> u64 {
    sources.iter().fold(FNV64_OFFSET, |hash, source| {
        let hash = hash_field(hash, source.name.as_bytes());
        hash_field(hash, source.text.as_bytes())
    })
}

fn hash_field(hash: u64, bytes: &[u8]) -> u64 {
    let length = (bytes.len() as u64).to_le_bytes();
    fnv1a64(fnv1a64(hash, &length), bytes)
}

/// Reads, parses, validates and compiles `path` exactly as [`Limits::load_with_sources`]
/// does; returns the limits and the [`version_of`] the files compiled.
pub fn load(path: &Path, options: LoadOptions) -> Result<(Limits, u64), ConfigErrors> {
    let (limits, sources) = Limits::load_with_sources(path, options)?;
    Ok((limits, version_of(&sources)))
}

/// [`load`] at start-up. With `start_without_config`, limits that do not load (invalid, or
/// no file yet) are logged and replaced by no limits at all, version 0, so the process can
/// start and the watch installs the first good files (the reference service's
/// `FORCE_START_WITHOUT_INITIAL_CONFIG`).
pub fn load_at_start(
    path: &Path,
    options: LoadOptions,
    start_without_config: bool,
) -> Result<(Limits, u64), ConfigErrors> {
    match load(path, options) {
        Err(errors) if start_without_config => {
            tracing::warn!(
                path = %path.display(),
                %errors,
                "starting without limits (--start-without-config); waiting for valid files"
            );
            Ok((Limits::from_sources(&[])?, 0))
        }
        loaded => loaded,
    }
}

/// Reloads once: read all files -> parse -> validate -> compile -> swap.
///
/// `Ok(false)` when the files hash to the live version (nothing is swapped or counted).
/// On error the old limits stay, the error is logged with every problem, a failure is
/// counted and the error returned. On success the new limits are swapped in, counted and
/// logged, and `Ok(true)` returned. Blocking: it reads files (and waits for a reload in
/// progress elsewhere); call it from `spawn_blocking` in async code.
pub fn reload_now(
    path: &Path,
    options: LoadOptions,
    live: &ArcSwap<Limits>,
    stats: &ReloadStats,
) -> Result<bool, ConfigErrors> {
    reload_serialized(path, options, live, stats, None)
}

/// [`reload_now`], doing nothing once `stopped` is set.
fn reload_serialized(
    path: &Path,
    options: LoadOptions,
    live: &ArcSwap<Limits>,
    stats: &ReloadStats,
    stopped: Option<&AtomicBool>,
) -> Result<bool, ConfigErrors> {
    let _serial = stats.serialize();
    if stopped.is_some_and(|stopped| stopped.load(Ordering::SeqCst)) {
        return Ok(false);
    }
    install(&path.display(), load(path, options), live, stats)
}

/// [`reload_now`] for limits that arrive as text rather than files (the xDS client's
/// resources, see `envoy::xds`): compile `sources` -> same version? nothing : swap, all or nothing,
/// counted and logged like a file reload. `origin` names where they came from in the logs.
/// Blocking (CPU: a compile of up to a few MiB); call it from `spawn_blocking`.
pub fn reload_sources(
    origin: &dyn fmt::Display,
    sources: &[Source],
    options: LoadOptions,
    live: &ArcSwap<Limits>,
    stats: &ReloadStats,
) -> Result<bool, ConfigErrors> {
    let _serial = stats.serialize();
    let loaded =
        Limits::from_sources_with(sources, options).map(|limits| (limits, version_of(sources)));
    install(origin, loaded, live, stats)
}

/// The common end of every reload, under the serializing lock: count, then keep the live
/// limits (error or same version) or swap `loaded` in.
fn install(
    origin: &dyn fmt::Display,
    loaded: Result<(Limits, u64), ConfigErrors>,
    live: &ArcSwap<Limits>,
    stats: &ReloadStats,
) -> Result<bool, ConfigErrors> {
    stats.checks.fetch_add(1, Ordering::Relaxed);
    let (limits, version) = match loaded {
        Ok(loaded) => loaded,
        Err(errors) => {
            stats.failures.fetch_add(1, Ordering::Relaxed);
            stats.set_last_error(Some(errors.to_string()));
            tracing::error!(
                path = %origin,
                problems = errors.errors().len(),
                "cannot reload the limits, keeping the previous ones:\n{errors}"
            );
            return Err(errors);
        }
    };
    // The files load again: whatever failed before is fixed.
    stats.set_last_error(None);
    if version == stats.version.load(Ordering::Relaxed) {
        tracing::debug!(path = %origin, "limits unchanged");
        return Ok(false);
    }
    let domains: Vec<&str> = limits.domains().map(Domain::name).collect();
    let domains = domains.join(",");
    let limit_count = limits.limit_count();
    live.store(Arc::new(limits));
    stats.version.store(version, Ordering::Relaxed);
    stats.successes.fetch_add(1, Ordering::Relaxed);
    stats
        .last_success_unix_seconds
        .store(unix_now(), Ordering::Relaxed);
    tracing::info!(
        path = %origin,
        version = %format_args!("{version:016x}"),
        domains = %domains,
        limits = limit_count,
        "limits reloaded"
    );
    Ok(true)
}

fn unix_now() -> u64 {
    // A clock before 1970 is not worth failing a reload over: the timestamp reads 0.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("cannot watch {}: {source}", path.display())]
    Path { path: PathBuf, source: io::Error },
    #[error("cannot watch {}: {source}", path.display())]
    Notify {
        path: PathBuf,
        source: notify::Error,
    },
    #[error("cannot watch the limits: not inside a tokio runtime")]
    NoRuntime,
}

/// A running watch; dropping it stops it.
pub struct Watcher {
    path: PathBuf,
    dir: PathBuf,
    stats: Arc<ReloadStats>,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    reload: ReloadHandle,
}

impl Watcher {
    /// The directory being watched (absolute).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reloads on demand (SIGHUP) through the watch's own path; does nothing once the
    /// watcher is dropped.
    pub fn handle(&self) -> ReloadHandle {
        self.reload.clone()
    }
}

/// Reloads the watched limits when asked, exactly as a change the watch saw would: read
/// all -> validate -> swap, the old limits kept on error, counted in [`ReloadStats`].
#[derive(Clone)]
pub struct ReloadHandle {
    path: PathBuf,
    load: LoadOptions,
    live: Arc<ArcSwap<Limits>>,
    stats: Arc<ReloadStats>,
    shared: Arc<Shared>,
}

impl ReloadHandle {
    /// The file or directory the limits are read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reloads once, on the blocking pool (see [`reload_now`] for the outcome); errors are
    /// logged and counted inside.
    pub async fn reload(&self) -> Result<bool, ConfigErrors> {
        let this = self.clone();
        let reload = tokio::task::spawn_blocking(move || {
            reload_serialized(
                &this.path,
                this.load,
                &this.live,
                &this.stats,
                Some(&this.shared.stopped),
            )
        });
        match reload.await {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::error!(%error, "limits reload did not finish");
                Ok(false)
            }
        }
    }
}

impl fmt::Debug for ReloadHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadHandle")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Watcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watcher")
            .field("path", &self.path)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Wait out a reload in flight (one read and compile); every later one sees `stopped`
        // under the same lock and does nothing.
        drop(self.stats.serialize());
        // Dropping notify's watcher ends its thread, which drops the event sender.
        drop(lock(&self.shared.notify).take());
        self.task.abort();
    }
}

/// What the [`Watcher`] shares with its reload task.
struct Shared {
    stopped: AtomicBool,
    /// `None` once the [`Watcher`] is dropped.
    notify: Mutex<Option<RecommendedWatcher>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every holder leaves the value valid at each step, so a poisoned lock is still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts watching `path` (a file or a directory) and keeps `live` current; must be called
/// inside a tokio runtime. Once the watch is in place it checks the files once, blocking
/// (a read and compile of a few MiB at most, once at startup), so a change between the
/// caller's initial load and the watch is not missed; that check is a no-op when
/// `stats.version` is the initial load's version ([`ReloadStats::with_version`]).
pub fn watch(
    path: PathBuf,
    live: Arc<ArcSwap<Limits>>,
    options: ReloadOptions,
    stats: Arc<ReloadStats>,
) -> Result<Watcher, ReloadError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| ReloadError::NoRuntime)?;
    let dir = watched_dir(&path)?;
    let (sender, events) = mpsc::channel(EVENT_QUEUE);
    let lost = Arc::new(AtomicBool::new(false));
    let handler = {
        let dir = dir.clone();
        let lost = Arc::clone(&lost);
        // Runs on notify's thread.
        move |event: notify::Result<Event>| {
            match event {
                Ok(event) if is_read(&event.kind) => return,
                Ok(event) if is_gone(&event, &dir) => {
                    lost.store(true, Ordering::SeqCst);
                    tracing::warn!(
                        dir = %dir.display(),
                        "the limits directory was removed or moved; keeping the current limits \
                         and watching for it again every {REWATCH_EVERY:?}"
                    );
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "limits watch error; re-reading the limits"),
            }
            // A full queue already holds a pending re-read; a closed one means we are stopping.
            let _ = sender.try_send(());
        }
    };
    let notify_error = |source| ReloadError::Notify {
        path: dir.clone(),
        source,
    };
    let mut notify =
        RecommendedWatcher::new(handler, notify::Config::default()).map_err(notify_error)?;
    notify.watch(&dir, mode_for(&path)).map_err(notify_error)?;
    // Errors are logged and counted inside; the old limits stay and events will retry.
    let _ = reload_serialized(&path, options.load, &live, &stats, None);
    let shared = Arc::new(Shared {
        stopped: AtomicBool::new(false),
        notify: Mutex::new(Some(notify)),
    });
    let reload = ReloadHandle {
        path: path.clone(),
        load: options.load,
        live,
        stats: Arc::clone(&stats),
        shared: Arc::clone(&shared),
    };
    let reloader = Reloader {
        path: path.clone(),
        dir: dir.clone(),
        reload: reload.clone(),
        options,
        events,
        lost,
        shared: Arc::clone(&shared),
    };
    tracing::info!(
        path = %path.display(),
        dir = %dir.display(),
        "watching the limits for changes"
    );
    let task = runtime.spawn(reloader.run());
    Ok(Watcher {
        path,
        dir,
        stats,
        shared,
        task,
        reload,
    })
}

/// A limits directory is read recursively, so it is watched recursively; a single file's
/// parent is watched alone (it may hold anything).
fn mode_for(path: &Path) -> RecursiveMode {
    if path.is_dir() {
        RecursiveMode::Recursive
    } else {
        RecursiveMode::NonRecursive
    }
}

/// The directory to watch for `path`: itself, or a file's parent; absolute, as notify
/// reports event paths under it.
fn watched_dir(path: &Path) -> Result<PathBuf, ReloadError> {
    let path_error = |source| ReloadError::Path {
        path: path.to_owned(),
        source,
    };
    let metadata = std::fs::metadata(path).map_err(path_error)?;
    let dir = if metadata.is_dir() {
        path
    } else {
        match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        }
    };
    std::path::absolute(dir).map_err(path_error)
}

/// Our own reads (and anyone else's) open and close files: not a change.
pub(crate) fn is_read(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Access(access) if *access != AccessKind::Close(AccessMode::Write))
}

/// The watched directory itself was deleted or renamed away: its watch is gone.
fn is_gone(event: &Event, dir: &Path) -> bool {
    let gone = matches!(
        event.kind,
        EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(RenameMode::From))
    );
    gone && event.paths.iter().any(|path| path == dir)
}

/// The reload loop: waits for events (or the re-check timer), debounces, reloads.
struct Reloader {
    path: PathBuf,
    dir: PathBuf,
    reload: ReloadHandle,
    options: ReloadOptions,
    events: mpsc::Receiver<()>,
    /// Set by notify's thread when the watched directory went away.
    lost: Arc<AtomicBool>,
    shared: Arc<Shared>,
}

impl Reloader {
    async fn run(mut self) {
        let mut recheck = self
            .options
            .recheck_every
            .filter(|period| !period.is_zero())
            .map(|period| {
                let mut interval = tokio::time::interval_at(later(period), period);
                interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
                interval
            });
        loop {
            let lost = self.lost.load(Ordering::SeqCst);
            tokio::select! {
                event = self.events.recv() => {
                    // `None`: notify's watcher, and so the `Watcher`, is gone.
                    if event.is_none() || !self.settle().await {
                        return;
                    }
                    self.reload().await;
                }
                () = tick(recheck.as_mut()) => self.reload().await,
                () = tokio::time::sleep(REWATCH_EVERY), if lost => {
                    if self.rewatch() {
                        self.reload().await;
                    }
                }
            }
        }
    }

    /// Waits until no event has come for a quiet period (at most [`MAX_DEFER_PERIODS`] of
    /// them in all). False when the event source is gone.
    async fn settle(&mut self) -> bool {
        let debounce = self.options.debounce;
        let deadline = later(debounce.saturating_mul(MAX_DEFER_PERIODS));
        loop {
            let quiet = later(debounce).min(deadline);
            match tokio::time::timeout_at(quiet, self.events.recv()).await {
                Err(_quiet) => return true,
                Ok(None) => return false,
                Ok(Some(())) if Instant::now() >= deadline => return true,
                Ok(Some(())) => {}
            }
        }
    }

    async fn reload(&self) {
        // Reading and compiling is blocking file IO plus CPU (up to a few MiB), so it runs on
        // the blocking pool rather than stalling a runtime worker that serves requests. This
        // task awaits it, so its reloads never overlap. Errors are logged and counted inside.
        let _ = self.reload.reload().await;
    }

    /// Watches the directory again after it went away; true once it is watched.
    fn rewatch(&self) -> bool {
        let mut notify = lock(&self.shared.notify);
        let Some(notify) = notify.as_mut() else {
            return false;
        };
        // After a delete notify has dropped the watch already; after a move it still
        // watches the old directory under our path. Either way start afresh. These calls
        // wait only for notify's thread to add or remove one inotify watch.
        let _ = notify.unwatch(&self.dir);
        match notify.watch(&self.dir, mode_for(&self.path)) {
            Ok(()) => {
                self.lost.store(false, Ordering::SeqCst);
                tracing::info!(dir = %self.dir.display(), "watching the limits directory again");
                true
            }
            Err(error) => {
                tracing::debug!(dir = %self.dir.display(), %error, "limits directory still missing");
                false
            }
        }
    }
}

/// `period` from now, or far in the future when that does not fit in an `Instant`.
fn later(period: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(period)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// The next tick of the re-check timer; never, without one.
async fn tick(interval: Option<&mut Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
