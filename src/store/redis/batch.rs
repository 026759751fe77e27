//! Batching for one Redis server (or Sentinel master): the checks of concurrent requests go
//! to Redis in one script call, so a busy store pays Redis's per-call cost once per batch,
//! not once per request.
//!
//! A request queues its checks ([`Pending`]); the batcher takes the first, waits for one of
//! `in_flight` call slots, then takes whatever else is queued (up to [`MAX_REQUESTS`]
//! requests, [`MAX_KEYS`] keys) and sends it all as one call. An idle store adds no delay
//! (a lone request goes at once); a busy one, whose slots are all taken, builds bigger
//! batches while it waits. The script decides the checks in queue order, each all or
//! nothing, exactly as if they had come one request at a time.
//!
//! Invariants: the queue is bounded (full: the request fails fast, and the failure policy
//! answers it); every queued request gets exactly one answer or its caller went away; a
//! batch is decided at one time, the latest of its requests' clocks, which each request
//! gets back with its part of the reply.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{Caller, part_len};
use crate::check::Checks;

/// Requests waiting for a batch at most.
pub(super) const QUEUE: usize = 4096;
/// Requests in one call at most.
const MAX_REQUESTS: usize = 128;
/// Keys in one call at most.
const MAX_KEYS: usize = 1024;

/// The part of a batch's reply for one request, and the time the batch was decided at.
pub(super) type Answer = Result<(u64, Bytes), String>;

pub(super) struct Pending {
    pub checks: Checks,
    pub now: u64,
    pub reply: oneshot::Sender<Answer>,
}

/// Starts the batcher on the current tokio runtime; it ends when the returned sender (and
/// its clones) are dropped.
pub(super) fn spawn(caller: Arc<Caller>, in_flight: usize) -> mpsc::Sender<Pending> {
    let (queue, pending) = mpsc::channel(QUEUE);
    tokio::spawn(run(
        caller,
        pending,
        Arc::new(Semaphore::new(in_flight.max(1))),
    ));
    queue
}

async fn run(caller: Arc<Caller>, mut pending: mpsc::Receiver<Pending>, slots: Arc<Semaphore>) {
    while let Some(first) = pending.recv().await {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut keys = keys_of(&first.checks);
        let mut batch = vec![first];
        while batch.len() < MAX_REQUESTS && keys < MAX_KEYS {
            match pending.try_recv() {
                Ok(next) => {
                    keys += keys_of(&next.checks);
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let caller = Arc::clone(&caller);
        tokio::spawn(async move {
            send(&caller, batch).await;
            drop(slot);
        });
    }
}

fn keys_of(checks: &Checks) -> usize {
    checks.iter().map(|check| check.counters.len()).sum()
}

/// One call for the whole batch; each request gets its part of the reply.
async fn send(caller: &Caller, batch: Vec<Pending>) {
    let now = batch.iter().map(|pending| pending.now).max().unwrap_or(0);
    let result = async {
        let mut connection = caller.backend.connection().await?;
        let checks = batch.iter().flat_map(|pending| pending.checks.iter());
        let command = caller.command(checks, now);
        connection.invoke(&caller.script, &command).await
    }
    .await;
    let reply = match result {
        Ok(reply) => Bytes::from(reply),
        Err(error) => {
            let error = error.to_string();
            for pending in batch {
                let _ = pending.reply.send(Err(error.clone()));
            }
            return;
        }
    };
    let mut at = 0;
    for pending in batch {
        // A reply too short for this request's part leaves it empty: the caller reads an
        // empty part as malformed.
        let part = match part_len(&pending.checks, &reply, at) {
            Some(len) => {
                at += len;
                reply.slice(at - len..at)
            }
            None => {
                at = reply.len();
                Bytes::new()
            }
        };
        let _ = pending.reply.send(Ok((now, part)));
    }
}
