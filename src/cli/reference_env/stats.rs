//! The stats: `USE_STATSD` (`STATSD_HOST`, `STATSD_PORT`, `STATS_FLUSH_INTERVAL`) is the
//! StatsD push (`--statsd`), `USE_PROMETHEUS` (`PROMETHEUS_ADDR`, `PROMETHEUS_PATH`,
//! `PROMETHEUS_MAPPER_YAML`) the Prometheus listener (`--prometheus-addr`), `EXTRA_TAGS`
//! the names' tags (`--stats-tag`). Asked for, the reference's defaults fill what is unset
//! (`localhost:8125`, `:9090`); unset, `USE_STATSD` stays off (the reference's default is
//! on, pushing to a StatsD that is rarely there). Like the reference, one sink at a time,
//! none with `DISABLE_STATS`. ratekeeper's own metrics stay at `/metrics` on `PORT` (and
//! `DEBUG_PORT`) whatever is set.

use super::Reader;
use crate::cli::serve::listen_addr;

/// Where the reference pushes without `STATSD_HOST`, `STATSD_PORT`.
const STATSD_HOST: &str = "localhost";
const STATSD_PORT: &str = "8125";
/// Where the reference's Prometheus listener is without `PROMETHEUS_ADDR`.
const PROMETHEUS_ADDR: &str = ":9090";

const STATSD: [&str; 3] = ["STATSD_HOST", "STATSD_PORT", "STATS_FLUSH_INTERVAL"];
const STATSD_ADDR: [&str; 2] = ["STATSD_HOST", "STATSD_PORT"];
const PROMETHEUS: [&str; 3] = [
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
];

impl Reader<'_> {
    pub(super) fn stats(&mut self) {
        if self.is_true("USE_DOG_STATSD") {
            self.refuse(
                "USE_DOG_STATSD",
                "ratekeeper does not send DogStatsD: use USE_STATSD or USE_PROMETHEUS",
            );
        }
        self.unused(
            &["USE_DOG_STATSD_MOGRIFIERS"],
            "ratekeeper does not send DogStatsD",
        );
        if self.is_true("DISABLE_STATS") {
            self.applied("DISABLE_STATS");
            let why = "DISABLE_STATS is true (ratekeeper's own metrics stay at /metrics)";
            self.unused(&["USE_STATSD", "USE_PROMETHEUS", "EXTRA_TAGS"], why);
            self.unused(&STATSD, why);
            self.unused(&PROMETHEUS, why);
            return;
        }
        let statsd = self.is_true("USE_STATSD");
        let prometheus = self.is_true("USE_PROMETHEUS");
        if statsd && prometheus {
            self.refuse(
                "USE_PROMETHEUS",
                "the reference sends its stats to one sink: set one of USE_STATSD and \
                 USE_PROMETHEUS to true (ratekeeper's --statsd and --prometheus-addr go together)",
            );
            return;
        }
        self.statsd(statsd);
        self.prometheus(prometheus);
        if statsd {
            let (id, long) = ("statsd_flush_interval", "--statsd-flush-interval");
            self.copy_duration("STATS_FLUSH_INTERVAL", id, long);
        } else if prometheus {
            let why = "the Prometheus listener reads the counts at each scrape";
            self.unused(&["STATS_FLUSH_INTERVAL"], why);
        } else {
            let why = "neither USE_STATSD nor USE_PROMETHEUS is true";
            self.unused(&["STATS_FLUSH_INTERVAL"], why);
        }
        if statsd || prometheus {
            self.extra_tags();
        } else {
            self.unused(
                &["EXTRA_TAGS"],
                "neither USE_STATSD nor USE_PROMETHEUS is true",
            );
        }
    }

    fn statsd(&mut self, on: bool) {
        if !on {
            self.unused(&STATSD_ADDR, "USE_STATSD is not true");
            return;
        }
        let host = self.get("STATSD_HOST").unwrap_or(STATSD_HOST);
        let port = self.get("STATSD_PORT").unwrap_or(STATSD_PORT);
        if port.parse::<u16>().is_err() {
            self.refuse("STATSD_PORT", format!("{port:?} is not a port"));
            return;
        }
        let addr = match host.contains(':') {
            true => format!("[{host}]:{port}"),
            false => format!("{host}:{port}"),
        };
        let from = ["USE_STATSD", "STATSD_HOST", "STATSD_PORT"];
        self.set("statsd", "--statsd", Some(addr), &from);
    }

    fn prometheus(&mut self, on: bool) {
        if !on {
            self.unused(&PROMETHEUS, "USE_PROMETHEUS is not true");
            return;
        }
        let addr = self.get("PROMETHEUS_ADDR").unwrap_or(PROMETHEUS_ADDR);
        if let Err(problem) = listen_addr(addr) {
            self.refuse("PROMETHEUS_ADDR", problem);
            return;
        }
        let from = ["USE_PROMETHEUS", "PROMETHEUS_ADDR"];
        let addr = Some(addr.to_owned());
        self.set("prometheus_addr", "--prometheus-addr", addr, &from);
        self.copy("PROMETHEUS_PATH", "prometheus_path", "--prometheus-path");
        self.copy(
            "PROMETHEUS_MAPPER_YAML",
            "prometheus_mapping",
            "--prometheus-mapping",
        );
    }

    /// `EXTRA_TAGS`, envconfig's map: `key:value` pairs separated by commas.
    fn extra_tags(&mut self) {
        let Some(tags) = self.get("EXTRA_TAGS") else {
            return;
        };
        let bad = tags
            .split(',')
            .find(|pair| pair.split_once(':').is_none_or(|(key, _)| key.is_empty()));
        if let Some(bad) = bad {
            self.refuse(
                "EXTRA_TAGS",
                format!("{bad:?} is not key:value (tags are key:value pairs separated by commas)"),
            );
            return;
        }
        let value = Some(tags.to_owned());
        self.set("stats_tags", "--stats-tag", value, &["EXTRA_TAGS"]);
    }
}
