//! Where the counters live: `BACKEND_TYPE`, `REDIS_*` as one `--store` URL (single,
//! sentinel or cluster; auth and TLS), the Redis knobs ratekeeper does not need, and what
//! it refuses (a per-second Redis, memcache, a key prefix, TLS to sentinels).

use super::Reader;

/// The reference's Redis TLS client files (and hostname check switch).
const TLS_FILES: [&str; 4] = [
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
];

impl Reader<'_> {
    /// Whether the counters go to the Redis of `REDIS_*`: `BACKEND_TYPE=redis`, or
    /// `BACKEND_TYPE` unset with `REDIS_URL` set (the reference's backend is Redis unless
    /// told otherwise; without a `REDIS_URL` ratekeeper keeps its in-memory store).
    pub(super) fn redis(&mut self) {
        const SETTINGS: [&str; 8] = [
            "REDIS_SOCKET_TYPE",
            "REDIS_TYPE",
            "REDIS_URL",
            "REDIS_AUTH",
            "REDIS_TLS",
            "REDIS_POOL_SIZE",
            "REDIS_TIMEOUT",
            "CACHE_KEY_PREFIX",
        ];
        self.per_second();
        if self.given("peers") || self.given("peer_dns") {
            // Envoy Gateway always sets REDIS_URL; its cluster-mode patch adds the peers.
            let why = "cluster mode (--peers or --peer-dns) keeps the counters among the \
                       replicas, in memory";
            self.unused(&SETTINGS, why);
            self.unused(&TLS_FILES, why);
            self.unused(&["REDIS_SENTINEL_AUTH", "BACKEND_TYPE"], why);
            self.redis_tuning();
            return;
        }
        let Some(redis) = self.backend_is_redis() else {
            return;
        };
        if !redis {
            let why = "no Redis is in use (neither REDIS_URL nor BACKEND_TYPE=redis is set)";
            self.unused(&SETTINGS, why);
            self.unused(&TLS_FILES, why);
            self.unused(&["REDIS_SENTINEL_AUTH"], why);
            self.redis_tuning();
            return;
        }
        self.redis_store();
        self.redis_pool_size();
        self.copy_duration("REDIS_TIMEOUT", "store_timeout", "--store-timeout");
        self.redis_tuning();
    }

    /// `BACKEND_TYPE` (or, unset, whether `REDIS_URL` is): whether the counters go to Redis;
    /// `None` after an error.
    fn backend_is_redis(&mut self) -> Option<bool> {
        match self
            .get("BACKEND_TYPE")
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None => Some(self.get("REDIS_URL").is_some()),
            Some("redis") => {
                if self.get("REDIS_URL").is_none() && !self.given("store") {
                    self.refuse(
                        "BACKEND_TYPE",
                        "redis needs REDIS_URL (ratekeeper has no default Redis socket)",
                    );
                    return None;
                }
                Some(true)
            }
            Some("memcache") => {
                self.refuse(
                    "BACKEND_TYPE",
                    "ratekeeper has no memcache backend: counters live in memory (the default, \
                     shared by a cluster with --peers) or in Redis (BACKEND_TYPE=redis)",
                );
                None
            }
            Some(other) => {
                self.refuse(
                    "BACKEND_TYPE",
                    format!("{other:?}: ratekeeper counts in memory or in Redis"),
                );
                None
            }
        }
    }

    /// `--store` (and `--store-tls-*`) from `REDIS_*`, unless ratekeeper's own `--store`
    /// is given; what of them ratekeeper cannot honour (a key prefix).
    fn redis_store(&mut self) {
        let mut from = vec![
            "REDIS_URL",
            "REDIS_SOCKET_TYPE",
            "REDIS_TYPE",
            "REDIS_AUTH",
            "REDIS_TLS",
        ];
        if self.get("BACKEND_TYPE").is_some() {
            from.push("BACKEND_TYPE");
        }
        let tls = self.bool("REDIS_TLS");
        if self.given("store") {
            self.set("store", "--store", None, &from);
            let why = "ratekeeper's own --store is given";
            self.unused(&["CACHE_KEY_PREFIX", "REDIS_SENTINEL_AUTH"], why);
            self.unused(&TLS_FILES, why);
            return;
        }
        if let Some((url, shown)) = self.redis_url(tls == Some(true)) {
            self.set_shown("store", "--store", Some(url), Some(shown), &from);
        }
        if self.get("CACHE_KEY_PREFIX").is_some() {
            self.refuse(
                "CACHE_KEY_PREFIX",
                "ratekeeper's Redis keys take no prefix, so deployments sharing this Redis \
                 would share counters: give each its own database (RATEKEEPER_STORE=\
                 redis://HOST:PORT/DB) and unset CACHE_KEY_PREFIX",
            );
        }
        self.redis_tls_files(tls == Some(true));
    }

    /// `REDIS_POOL_SIZE` as `--store-pool` (capped at 256).
    fn redis_pool_size(&mut self) {
        let Some(size) = self.get("REDIS_POOL_SIZE") else {
            return;
        };
        let from = ["REDIS_POOL_SIZE"];
        match size.parse::<u64>() {
            Ok(size @ 1..=256) => {
                self.set("store_pool", "--store-pool", Some(size.to_string()), &from);
            }
            Ok(size @ 257..) => {
                self.set("store_pool", "--store-pool", Some("256".into()), &from);
                self.warn(
                    "REDIS_POOL_SIZE",
                    format!("{size} connections capped at 256 (requests are pipelined on them)"),
                );
            }
            _ => self.refuse(
                "REDIS_POOL_SIZE",
                format!("{size:?} is not a pool size (1 to 256)"),
            ),
        }
    }

    /// The reference's Redis TLS files (and hostname check switch) as `--store-tls-*`.
    pub(super) fn redis_tls_files(&mut self, tls: bool) {
        if !tls {
            self.unused(&TLS_FILES, "REDIS_TLS is not true");
            return;
        }
        let [cert, key, ca, skip] = TLS_FILES;
        match (self.get(cert), self.get(key)) {
            (Some(_), None) => self.refuse(cert, format!("needs {key} (the certificate's key)")),
            (None, Some(_)) => self.refuse(key, format!("needs {cert} (the key's certificate)")),
            _ => {
                self.copy(cert, "store_tls_cert", "--store-tls-cert");
                self.copy(key, "store_tls_key", "--store-tls-key");
            }
        }
        self.copy(ca, "store_tls_ca", "--store-tls-ca");
        self.switch(
            skip,
            "store_tls_skip_hostname_verification",
            "--store-tls-skip-hostname-verification",
        );
    }

    /// `--store` from `REDIS_*`, and the same with the password masked; `None` after an
    /// error.
    pub(super) fn redis_url(&mut self, tls: bool) -> Option<(String, String)> {
        let url = self.get("REDIS_URL")?;
        if !self.redis_over_tcp(url) {
            return None;
        }
        let (user, password) = match self.get("REDIS_AUTH") {
            None => (None, None),
            Some(auth) => match auth.split_once(':') {
                Some((user, password)) => (Some(user), Some(password)),
                None => (None, Some(auth)),
            },
        };
        // `password` percent-encoded already (or the mask).
        let credentials = |password: String| match (user, password.as_str()) {
            (_, "") => String::new(),
            (Some(user), password) => format!("{}:{password}@", encode(user)),
            (None, password) => format!(":{password}@"),
        };
        let kind = self.get("REDIS_TYPE").map(str::to_ascii_lowercase);
        let build = |credentials: String| store_url(kind.as_deref(), url, tls, credentials);
        // The same shape twice, so the masked one builds whenever the real one does.
        let real = password.map(|password| credentials(encode(password)));
        let built = build(real.unwrap_or_default()).map(|url| {
            let masked = password
                .map(|_| credentials("***".into()))
                .unwrap_or_default();
            (url, build(masked).unwrap_or_default())
        });
        if kind.as_deref() == Some("sentinel") && self.get("REDIS_SENTINEL_AUTH").is_some() {
            self.refuse(
                "REDIS_SENTINEL_AUTH",
                "ratekeeper asks the sentinels without a password (REDIS_AUTH is the master's)",
            );
        } else {
            self.unused(&["REDIS_SENTINEL_AUTH"], "REDIS_TYPE is not sentinel");
        }
        match built {
            Ok(urls) => Some(urls),
            Err((variable, problem)) => {
                self.refuse(variable, problem);
                None
            }
        }
    }

    /// Whether `REDIS_SOCKET_TYPE` (with `REDIS_URL`, `url`) asks for TCP, the only way
    /// ratekeeper reaches Redis; an error otherwise.
    fn redis_over_tcp(&mut self, url: &str) -> bool {
        match self
            .get("REDIS_SOCKET_TYPE")
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("tcp") => true,
            // The reference's default socket type is unix: a path is a socket.
            None if !url.starts_with('/') => true,
            Some("unix") | None => {
                self.refuse(
                    "REDIS_SOCKET_TYPE",
                    "ratekeeper reaches Redis over TCP only (REDIS_SOCKET_TYPE=tcp, REDIS_URL=\
                     HOST:PORT), not over a Unix socket",
                );
                false
            }
            Some(other) => {
                self.refuse(
                    "REDIS_SOCKET_TYPE",
                    format!("{other:?} is neither tcp nor unix"),
                );
                false
            }
        }
    }

    /// Knobs of the reference's Redis client that ratekeeper's does not need.
    pub(super) fn redis_tuning(&mut self) {
        self.unused(
            &[
                "REDIS_PIPELINE_WINDOW",
                "REDIS_PIPELINE_LIMIT",
                "REDIS_USE_EXPLICIT_PIPELINE",
                "REDIS_POOL_ON_EMPTY_BEHAVIOR",
            ],
            "ratekeeper batches concurrent requests into one script call and pipelines them \
             (--store-pool connections)",
        );
        if self.is_true("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION") {
            self.warn(
                "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
                "ignored: /healthcheck does not follow Redis; while Redis cannot answer, \
                 --store-failure (allow by default) decides",
            );
        }
    }

    /// `REDIS_PERSECOND`: a second Redis for per-second limits, which ratekeeper does not
    /// have (one store counts every limit).
    pub(super) fn per_second(&mut self) {
        if self.is_true("REDIS_PERSECOND") {
            self.refuse(
                "REDIS_PERSECOND",
                "ratekeeper has no separate Redis for per-second limits: one store counts every \
                 limit (or keep per-second limits in memory with cluster mode)",
            );
        } else {
            let settings = Self::named(&["REDIS_PERSECOND_"]);
            self.unused(&settings, "REDIS_PERSECOND is not true");
        }
    }

    pub(super) fn memcache(&mut self) {
        let settings = Self::named(&["MEMCACHE_"]);
        self.unused(&settings, "ratekeeper has no memcache backend");
    }
}

/// The `--store` URL for a Redis of type `kind` (`REDIS_TYPE`, single when unset) at `url`
/// (`REDIS_URL`), with `credentials` (`user:password@`, or empty); an error names the
/// variable at fault.
fn store_url(
    kind: Option<&str>,
    url: &str,
    tls: bool,
    credentials: String,
) -> Result<String, (&'static str, String)> {
    match kind.unwrap_or("single") {
        "single" => single_url(url, tls, credentials),
        "sentinel" if tls => Err((
            "REDIS_TLS",
            "ratekeeper reaches sentinels without TLS (TLS is for a single Redis or a cluster)"
                .to_owned(),
        )),
        "cluster" => {
            for node in url.split(',') {
                host_port(node).map_err(|problem| ("REDIS_URL", problem))?;
            }
            let scheme = if tls { "rediss" } else { "redis" };
            Ok(format!("{scheme}-cluster://{credentials}{url}"))
        }
        "sentinel" => sentinel_url(url, credentials),
        other => Err((
            "REDIS_TYPE",
            format!("{other:?} is not single, sentinel or cluster"),
        )),
    }
}

/// A single Redis: `url` is `HOST:PORT` or a URL already.
fn single_url(url: &str, tls: bool, credentials: String) -> Result<String, (&'static str, String)> {
    if let Some((scheme, rest)) = url.split_once("://") {
        // radix also dials redis:// URLs; credentials in them win.
        let scheme = if tls && scheme == "redis" {
            "rediss"
        } else {
            scheme
        };
        let credentials = if rest.contains('@') {
            String::new()
        } else {
            credentials
        };
        return Ok(format!("{scheme}://{credentials}{rest}"));
    }
    let scheme = if tls { "rediss" } else { "redis" };
    host_port(url).map_err(|problem| ("REDIS_URL", problem))?;
    Ok(format!("{scheme}://{credentials}{url}"))
}

/// Sentinels: `url` is `MASTER_NAME,HOST:PORT[,HOST:PORT...]`.
fn sentinel_url(url: &str, credentials: String) -> Result<String, (&'static str, String)> {
    let mut parts = url.split(',');
    let master = parts.next().unwrap_or_default();
    let sentinels: Vec<&str> = parts.collect();
    if master.is_empty() || sentinels.is_empty() {
        return Err((
            "REDIS_URL",
            "a sentinel URL is MASTER_NAME,HOST:PORT[,HOST:PORT...]".into(),
        ));
    }
    for node in &sentinels {
        host_port(node).map_err(|problem| ("REDIS_URL", problem))?;
    }
    Ok(format!(
        "redis-sentinel://{credentials}{}/{master}",
        sentinels.join(",")
    ))
}

/// `HOST:PORT` with a numeric port.
fn host_port(node: &str) -> Result<(), String> {
    match node.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!("{node:?} is not HOST:PORT")),
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters (for URL userinfo).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
