//! The load generator's settings and their one-line `key=value` form, which is how a
//! parent process hands them to the child (see [`super::ENV`]).
//!
//! Invariant: `Config::parse(&config.to_args())` gives back `config`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::loadgen::workload::{BodyMode, Workload};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Stop {
    /// Send for this long after the warm-up.
    After(Duration),
    /// Send this many requests after the warm-up.
    Count(u64),
}

#[derive(Clone, PartialEq, Debug)]
pub struct Config {
    pub addr: SocketAddr,
    /// The other endpoints, as an Envoy cluster lists them. With any, a call that never
    /// reached its endpoint (a refused connection, a stream past its GOAWAY, or refused) is
    /// sent once more on a new connection, and a broken connection is replaced, trying
    /// `addr` first, then these in order: the client retries as Envoy's `connect-failure`,
    /// `refused-stream` policy does. Without any, every failure is an error.
    pub fallbacks: Vec<SocketAddr>,
    pub connections: usize,
    /// Concurrent requests per connection.
    pub streams: usize,
    /// Requests during the warm-up are checked but not measured.
    pub warmup: Duration,
    pub stop: Stop,
    pub workload: Workload,
    pub body: BodyMode,
    pub seed: u64,
    /// Descriptor statuses every answer must carry (`None`: not checked).
    pub statuses: Option<usize>,
    /// Runtime threads of the load generator.
    pub threads: usize,
    /// Open loop: start requests at this many per second in all, each timed from when it
    /// was due (so a slow server's queueing counts). 0: closed loop, as fast as answered.
    pub rate: u64,
    /// Give up (and report an error) if the run has not ended this long after it should
    /// have ([`Stop::After`]) or after the warm-up ([`Stop::Count`]): a stalled server must
    /// not hang the benchmark.
    pub timeout: Duration,
}

impl Config {
    pub fn new(addr: SocketAddr, workload: Workload) -> Config {
        Config {
            addr,
            fallbacks: Vec::new(),
            connections: 8,
            streams: 32,
            warmup: Duration::from_secs(1),
            stop: Stop::After(Duration::from_secs(4)),
            workload,
            body: BodyMode::Build,
            seed: 1,
            statuses: None,
            threads: 1,
            rate: 0,
            timeout: Duration::from_secs(60),
        }
    }

    /// Parses `key=value` pairs separated by spaces, e.g.
    /// `addr=127.0.0.1:8081 connections=8 streams=32 seconds=4 descriptors=1 keys=100000`.
    /// `addr` is required; everything else has the defaults of [`Config::new`].
    pub fn parse(text: &str) -> Result<Config, String> {
        let mut addr = None;
        let mut config = Config::new(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            Workload {
                descriptors: 1,
                keys: 1,
                first: 0,
            },
        );
        for pair in text.split_whitespace() {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not key=value"))?;
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("{key}: {value:?} is not a whole number"))
            };
            let seconds = || {
                value
                    .parse::<f64>()
                    .ok()
                    .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
                    .ok_or_else(|| format!("{key}: {value:?} is not a number of seconds"))
            };
            match key {
                "addr" => {
                    addr = Some(
                        value
                            .parse()
                            .map_err(|_| format!("addr: {value:?} is not host:port"))?,
                    )
                }
                "fallbacks" => {
                    config.fallbacks = value
                        .split(',')
                        .map(|addr| {
                            addr.parse()
                                .map_err(|_| format!("fallbacks: {addr:?} is not host:port"))
                        })
                        .collect::<Result<_, _>>()?;
                }
                "connections" => config.connections = number()? as usize,
                "streams" => config.streams = number()? as usize,
                "warmup" => config.warmup = seconds()?,
                "seconds" => config.stop = Stop::After(seconds()?),
                "requests" => config.stop = Stop::Count(number()?),
                "descriptors" => config.workload.descriptors = number()? as usize,
                "keys" => config.workload.keys = number()?,
                "first" => config.workload.first = number()?,
                "body" => config.body = BodyMode::parse(value)?,
                "seed" => config.seed = number()?,
                "statuses" => config.statuses = Some(number()? as usize),
                "threads" => config.threads = number()? as usize,
                "rate" => config.rate = number()?,
                "timeout" => config.timeout = seconds()?,
                other => return Err(format!("unknown setting {other:?}")),
            }
        }
        config.addr = addr.ok_or("addr=host:port is required")?;
        if config.connections == 0 || config.streams == 0 || config.threads == 0 {
            return Err("connections, streams and threads must be at least 1".to_owned());
        }
        config.workload.validate()?;
        Ok(config)
    }

    /// The `key=value` form [`Config::parse`] reads back.
    pub fn to_args(&self) -> String {
        let stop = match self.stop {
            Stop::After(duration) => format!("seconds={}", duration.as_secs_f64()),
            Stop::Count(count) => format!("requests={count}"),
        };
        let statuses = self
            .statuses
            .map(|statuses| format!(" statuses={statuses}"))
            .unwrap_or_default();
        let fallbacks: Vec<String> = self.fallbacks.iter().map(ToString::to_string).collect();
        let fallbacks = if fallbacks.is_empty() {
            String::new()
        } else {
            format!(" fallbacks={}", fallbacks.join(","))
        };
        format!(
            "addr={} connections={} streams={} warmup={} {stop} descriptors={} keys={} \
             first={} body={} seed={}{statuses}{fallbacks} threads={} timeout={} rate={}",
            self.addr,
            self.connections,
            self.streams,
            self.warmup.as_secs_f64(),
            self.workload.descriptors,
            self.workload.keys,
            self.workload.first,
            self.body.name(),
            self.seed,
            self.threads,
            self.timeout.as_secs_f64(),
            self.rate
        )
    }
}

/// [`Config::to_args`] and [`Config::parse`] agree, and bad settings are refused.
pub fn check() {
    let addr = SocketAddr::from(([127, 0, 0, 1], 8081));
    let mut config = Config::new(
        addr,
        Workload {
            descriptors: 4,
            keys: 100_000,
            first: 0,
        },
    );
    config.warmup = Duration::from_millis(250);
    config.statuses = Some(4);
    config.fallbacks = vec![SocketAddr::from(([127, 0, 0, 1], 8082)), addr];
    config.body = BodyMode::Pool;
    assert_eq!(Config::parse(&config.to_args()), Ok(config.clone()));
    config.stop = Stop::Count(1000);
    config.statuses = None;
    config.timeout = Duration::from_secs(5);
    assert_eq!(Config::parse(&config.to_args()), Ok(config));
    for bad in [
        "connections=8",
        "addr=127.0.0.1:1 streams=0",
        "addr=127.0.0.1:1 descriptors=4 keys=3",
        "addr=127.0.0.1:1 colour=blue",
    ] {
        assert!(Config::parse(bad).is_err(), "{bad:?} was accepted");
    }
}
