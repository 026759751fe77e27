//! The reference's StatsD push (`USE_STATSD`, `--statsd`): every `--statsd-flush-interval`
//! (`STATS_FLUSH_INTERVAL`, 10 s), what each reference stat counted since the last push, as
//! StatsD counter lines (`ratelimit.service.rate_limit.edge.api_key.over_limit:3|c`) over
//! UDP, through cadence's buffered sink (lines joined into datagrams of at most 512 bytes).
//! The address is resolved at the first push that can (then kept): a StatsD server whose
//! name does not resolve yet never stops the limiter, its stats wait.
//! A stat that counted nothing since the last push sends nothing, as gostats does.
//!
//! The reference's gostats sink speaks TCP unless told otherwise (`STATSD_PROTOCOL`);
//! ratekeeper sends UDP, which statsd_exporter (Envoy Gateway's sidecar, `:9125`) and StatsD
//! servers take alike.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use cadence::{BufferedUdpMetricSink, Counted, StatsdClient};

use super::{Loads, ReferenceStats};

/// Where and how often to push.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsdOptions {
    /// `HOST:PORT`, resolved at the first push that can (its IPv4 address first).
    pub addr: String,
    pub flush_every: Duration,
}

/// The push task: `spawn` starts it; it ends when its handle is aborted.
#[derive(Debug)]
pub struct Pusher {
    stats: Arc<ReferenceStats>,
    reloads: Arc<dyn Loads>,
    addr: String,
    /// Made at the first push that can resolve `addr` (a name that does not resolve yet
    /// must not stop the limiter: the counts wait for it).
    client: Option<StatsdClient>,
    warned: bool,
    every: Duration,
    /// What was pushed so far, by name (bounded like the stats: a name per stat counter).
    pushed: HashMap<String, u64>,
}

impl Pusher {
    /// A push to `options.addr`; nothing is resolved or sent yet.
    pub fn new(
        options: &StatsdOptions,
        stats: Arc<ReferenceStats>,
        reloads: Arc<dyn Loads>,
    ) -> Pusher {
        Pusher {
            stats,
            reloads,
            addr: options.addr.clone(),
            client: None,
            warned: false,
            every: options.flush_every,
            pushed: HashMap::new(),
        }
    }

    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run())
    }

    async fn run(mut self) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: nothing counted yet.
        tick.tick().await;
        loop {
            tick.tick().await;
            self.connect().await;
            self.push();
        }
    }

    /// Makes the client if there is none yet (a name that does not resolve yet is tried
    /// again at the next push).
    async fn connect(&mut self) {
        if self.client.is_some() {
            return;
        }
        match connect(&self.addr).await {
            Ok(client) => self.client = Some(client),
            Err(error) if !self.warned => {
                self.warned = true;
                tracing::warn!(addr = %self.addr, %error, "--statsd: cannot reach the StatsD address yet; the stats wait for it");
            }
            Err(_) => {}
        }
    }

    /// Sends what every stat counted since the last push.
    pub fn push(&mut self) {
        if self.client.is_none() {
            return;
        }
        for (name, value) in self.stats.snapshot(Some(&*self.reloads)) {
            let before = self.pushed.get(&name).copied().unwrap_or(0);
            let delta = value.saturating_sub(before);
            if delta == 0 {
                continue;
            }
            let Some(client) = &self.client else { return };
            if let Err(error) = client.count_with_tags(&name, delta).try_send() {
                tracing::debug!(%error, "statsd push failed; the next push sends it again");
                continue;
            }
            self.pushed.insert(name, value);
        }
        if let Some(Err(error)) = self.client.as_ref().map(StatsdClient::flush) {
            tracing::debug!(%error, "statsd flush failed");
        }
    }
}

/// A client sending to `addr` (its first IPv4 address if it has one, as a sidecar on
/// `localhost` may listen on IPv4 only) from a non-blocking socket of the same family.
async fn connect(addr: &str) -> std::io::Result<StatsdClient> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr).await?.collect();
    let to = addrs
        .iter()
        .find(|addr| addr.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    let from = match to {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    };
    let socket = UdpSocket::bind(from)?;
    socket.set_nonblocking(true)?;
    let sink = BufferedUdpMetricSink::from(to, socket).map_err(std::io::Error::other)?;
    Ok(StatsdClient::from_sink("", sink))
}
