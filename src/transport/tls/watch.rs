//! Reloading the TLS files when they change, and the TLS metrics.
//!
//! The watch is on the files' directories, non-recursively, like the limits' (`reload`):
//! an edit in place, a rename over a file and a Kubernetes Secret update (the `..data`
//! symlink swapped inside the mount) all show up there. Any event but a read means "maybe
//! changed"; after [`DEBOUNCE`] without events the files are read again, and a content
//! hash turns unchanged files into nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{Event, RecommendedWatcher, RecursiveMode, Watcher as _};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{TlsError, TlsStats};
use crate::metrics::{scrape_counter, scrape_counters_by};
use crate::reload::is_read;

/// Quiet time after the last event before the files are read again. Writers often replace
/// the certificate and the key one after the other; this lets both land first.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// A steady stream of events defers a reload by at most this many quiet periods.
const MAX_DEFER_PERIODS: u32 = 10;

/// Events waiting for the reload task; more are dropped (one pending is enough).
const EVENT_QUEUE: usize = 16;

/// A running watch of the TLS files; dropping it stops it.
pub struct TlsWatch {
    /// Dropping notify's watcher ends its thread and so the event stream. (The lock only
    /// makes the watch `Sync`, so a server holding it can be shared.)
    _notify: Mutex<RecommendedWatcher>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for TlsWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsWatch").finish_non_exhaustive()
    }
}

impl Drop for TlsWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a watch keeps current: a live TLS config made from files.
pub(super) trait Reloadable: Clone + Send + Sync + 'static {
    /// The files it is made from (their directories are watched).
    fn files(&self) -> Vec<PathBuf>;
    /// `grpc`, `peer`, `webhook` or `xds`, for logs.
    fn what(&self) -> &'static str;
    /// Re-reads the files; errors are logged and counted inside (the old config stays).
    fn reload_now(&self) -> Result<bool, TlsError>;
}

pub(super) fn start<T: Reloadable>(tls: T) -> Result<TlsWatch, TlsError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| TlsError::NoRuntime)?;
    let (sender, events) = mpsc::channel(EVENT_QUEUE);
    // Runs on notify's thread.
    let handler = move |event: notify::Result<Event>| {
        if let Ok(event) = &event
            && is_read(&event.kind)
        {
            return;
        }
        // A full queue already holds a pending re-read; a closed one means we are stopping.
        let _ = sender.try_send(());
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    for file in tls.files() {
        let dir = parent(&file);
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    let watch_error = |dir: &Path| {
        let dir = dir.to_owned();
        move |source| TlsError::Watch { dir, source }
    };
    let first = dirs.first().cloned().unwrap_or_else(|| PathBuf::from("."));
    let mut notify =
        RecommendedWatcher::new(handler, notify::Config::default()).map_err(watch_error(&first))?;
    for dir in &dirs {
        notify
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(watch_error(dir))?;
    }
    tracing::info!(dirs = ?dirs, what = tls.what(), "watching the tls files for changes");
    // A change between the start-up load and the watch would otherwise wait for the next
    // event; unchanged files are a no-op (errors are logged and counted inside).
    let _ = tls.reload_now();
    let task = runtime.spawn(run(tls, events));
    Ok(TlsWatch {
        _notify: Mutex::new(notify),
        task,
    })
}

/// The directory holding `file` (`.` for a bare file name).
fn parent(file: &Path) -> PathBuf {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    }
}

async fn run<T: Reloadable>(tls: T, mut events: mpsc::Receiver<()>) {
    while events.recv().await.is_some() {
        if !settle(&mut events).await {
            return;
        }
        let what = tls.what();
        let tls = tls.clone();
        // Errors are logged and counted inside; the old config stays live.
        match tokio::task::spawn_blocking(move || tls.reload_now()).await {
            Ok(_) => {}
            Err(error) => tracing::error!(%error, what, "tls reload did not finish"),
        }
    }
}

/// Waits until no event came for [`DEBOUNCE`] (at most [`MAX_DEFER_PERIODS`] of them in
/// all). False when the event source is gone.
async fn settle(events: &mut mpsc::Receiver<()>) -> bool {
    let deadline = tokio::time::Instant::now() + DEBOUNCE * MAX_DEFER_PERIODS;
    loop {
        let quiet = (tokio::time::Instant::now() + DEBOUNCE).min(deadline);
        match tokio::time::timeout_at(quiet, events.recv()).await {
            Err(_quiet) => return true,
            Ok(None) => return false,
            Ok(Some(())) if tokio::time::Instant::now() >= deadline => return true,
            Ok(Some(())) => {}
        }
    }
}

/// Reads the TLS figures at scrape time.
#[derive(Debug)]
pub(super) struct TlsCollector {
    pub stats: Arc<TlsStats>,
    /// `grpc`, `peer`, `webhook` or `xds`: the metrics' prefix.
    pub what: &'static str,
}

impl Collector for TlsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &self.stats;
        let (loads, failures) = match self.what {
            "peer" => (
                "Loads of the peer TLS certificate files by result (the start-up load counts)",
                "Peer connections whose TLS handshake failed or timed out",
            ),
            "webhook" => (
                "Loads of the webhook's TLS certificate files by result (the start-up load counts)",
                "Admission webhook connections whose TLS handshake failed or timed out",
            ),
            "xds" => (
                "Loads of the xDS client's TLS files (CA, client certificate) by result (the start-up load counts)",
                "Connections to the xDS management server whose TLS handshake failed",
            ),
            _ => (
                "Loads of the gRPC TLS certificate files by result (the start-up load counts)",
                "gRPC connections whose TLS handshake failed or timed out",
            ),
        };
        scrape_counters_by(
            &mut encoder,
            &format!("{}_tls_loads", self.what),
            loads,
            "result",
            &[
                ("success", stats.loads.load(Ordering::Relaxed)),
                ("failure", stats.load_failures.load(Ordering::Relaxed)),
            ],
        )?;
        scrape_counter(
            &mut encoder,
            &format!("{}_tls_handshake_failures", self.what),
            failures,
            stats.handshake_failures.load(Ordering::Relaxed),
        )
    }
}
