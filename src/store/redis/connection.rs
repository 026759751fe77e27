//! Where the Redis store's commands go: the `--store` address ([`Target`]) and the
//! connections to it ([`Backend`]).
//!
//! - One server (`redis://`, `rediss://`): a small pool of multiplexed connections, used
//!   round robin; concurrent requests are pipelined on them. Each reconnects on its own.
//! - A Sentinel-managed master (`redis-sentinel://`): the same pool, to the master the
//!   sentinels name; after a failure the pool is dropped and the next call asks the
//!   sentinels again, so a failover is followed.
//! - A Redis Cluster (`redis-cluster://`, `rediss-cluster://` for TLS): one cluster
//!   connection, which routes each command by its key's hash slot and follows `MOVED`/`ASK`
//!   and resharding.
//!
//! Connections are made lazily, on the first call: ratekeeper starts even when Redis is
//! down (the store's failure policy answers meanwhile). Passwords never reach a log line.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult};
use tokio::sync::Mutex;

use super::tls::TlsFiles;

/// A `--store` Redis address, parsed.
#[derive(Clone, Debug)]
pub enum Target {
    /// `redis://[USER:PASSWORD@]HOST:PORT[/DB]`, or `rediss://` for TLS.
    Server(ConnectionInfo),
    /// `redis-sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB]`: the
    /// credentials and database are the master's; sentinels are asked without them.
    Sentinel {
        sentinels: Vec<ConnectionInfo>,
        master: String,
        node: ConnectionInfo,
    },
    /// `redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]` (`rediss-cluster://` for
    /// TLS): any reachable nodes; the others are discovered.
    Cluster(Vec<ConnectionInfo>),
}

impl Target {
    /// Parses a `--store` value that starts with a Redis scheme.
    pub fn parse(text: &str) -> Result<Target, String> {
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| format!("{:?} is not a URL like redis://HOST:PORT", redact(text)))?;
        match scheme {
            "redis" | "rediss" => {
                let info = text
                    .into_connection_info()
                    .map_err(|error| format!("{}: {error}", redact(text)))?;
                if super::tls::is_insecure(&info) {
                    return Err(format!(
                        "{}: {}",
                        redact(text),
                        super::tls::INSECURE_REFUSED
                    ));
                }
                Ok(Target::Server(no_delay(info)))
            }
            "redis-sentinel" => {
                let (credentials, hosts, path) = split(rest);
                let mut parts = path.split('/').filter(|part| !part.is_empty());
                let master = parts
                    .next()
                    .ok_or_else(|| {
                        format!(
                            "{}: the master's name is missing (redis-sentinel://HOST:PORT/MASTER)",
                            redact(text)
                        )
                    })?
                    .to_owned();
                let db = parts.next().unwrap_or("0");
                let sentinels = nodes(&hosts, "", "")?;
                let node = format!("redis://{credentials}localhost/{db}")
                    .into_connection_info()
                    .map_err(|error| format!("{}: {error}", redact(text)))?;
                Ok(Target::Sentinel {
                    sentinels,
                    master,
                    node,
                })
            }
            "redis-cluster" | "rediss-cluster" => {
                let (credentials, hosts, path) = split(rest);
                if !path.trim_matches('/').is_empty() {
                    return Err(format!(
                        "{}: a Redis Cluster has only database 0; remove {path:?}",
                        redact(text)
                    ));
                }
                let scheme = scheme.strip_suffix("-cluster").unwrap_or(scheme);
                let nodes = nodes_of(scheme, &hosts, &credentials, "")?;
                if nodes.iter().any(super::tls::is_insecure) {
                    return Err(format!(
                        "{}: {}",
                        redact(text),
                        super::tls::INSECURE_REFUSED
                    ));
                }
                Ok(Target::Cluster(nodes))
            }
            other => Err(format!(
                "unknown store scheme {other:?} (expected memory, redis://, rediss://, redis-sentinel://, redis-cluster:// or rediss-cluster://)"
            )),
        }
    }

    /// The address for logs: hosts, no credentials.
    pub fn describe(&self) -> String {
        let hosts = |infos: &[ConnectionInfo]| {
            infos
                .iter()
                .map(|info| host(info.addr()))
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Target::Server(info) => format!(
                "redis {} db {}",
                host(info.addr()),
                info.redis_settings().db()
            ),
            Target::Sentinel {
                sentinels, master, ..
            } => format!("redis master {master:?} via sentinels {}", hosts(sentinels)),
            Target::Cluster(nodes) => format!("redis cluster {}", hosts(nodes)),
        }
    }

    /// Whether each request's checks must go one hash slot per command.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(_))
    }

    /// Whether the connections are TLS (`rediss://`, `rediss-cluster://`).
    pub fn is_tls(&self) -> bool {
        let tls = |info: &ConnectionInfo| matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        match self {
            Target::Server(info) => tls(info),
            Target::Cluster(nodes) => nodes.first().is_some_and(tls),
            Target::Sentinel { .. } => false,
        }
    }
}

/// `info` with Nagle's algorithm off: requests are small and pipelined, and waiting for
/// an ACK before sending the next one costs tens of milliseconds (the redis crate's
/// default leaves it on).
fn no_delay(info: ConnectionInfo) -> ConnectionInfo {
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    info.set_tcp_settings(tcp)
}

fn host(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    }
}

/// `USER:PASSWORD@HOST:PORT,HOST:PORT/PATH` into `("USER:PASSWORD@", "HOST:PORT,...", "/PATH")`.
fn split(rest: &str) -> (String, String, String) {
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    let (credentials, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    (credentials.to_owned(), hosts.to_owned(), path.to_owned())
}

fn nodes(hosts: &str, credentials: &str, path: &str) -> Result<Vec<ConnectionInfo>, String> {
    nodes_of("redis", hosts, credentials, path)
}

/// [`nodes`] with `scheme` (`redis` or `rediss`).
fn nodes_of(
    scheme: &str,
    hosts: &str,
    credentials: &str,
    path: &str,
) -> Result<Vec<ConnectionInfo>, String> {
    let infos: Result<Vec<_>, String> = hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| {
            format!("{scheme}://{credentials}{host}{path}")
                .into_connection_info()
                .map(no_delay)
                .map_err(|error| format!("{host:?}: {error}"))
        })
        .collect();
    match infos {
        Ok(infos) if infos.is_empty() => Err("no HOST:PORT given".to_owned()),
        result => result,
    }
}

/// `text` with any password replaced by `***`.
pub fn redact(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_owned();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***{}", &rest[at..])
        }
        None => text.to_owned(),
    }
}

/// The connections to a [`Target`].
pub enum Backend {
    Server {
        source: Source,
        pool: ArcSwapOption<Vec<ConnectionManager>>,
        /// One caller builds the pool; the others wait for it.
        building: Mutex<()>,
        next: AtomicUsize,
        size: usize,
        timeout: Duration,
    },
    Cluster {
        /// Made again when the TLS files change (see [`Backend::failed`]).
        client: std::sync::Mutex<ClusterClient>,
        connection: Mutex<Option<ClusterConnection>>,
        nodes: Vec<ConnectionInfo>,
        timeout: Duration,
        tls: Option<Arc<TlsFiles>>,
    },
}

/// The client of a Redis Cluster at `nodes`, with `tls`'s live files.
fn cluster_client(
    nodes: &[ConnectionInfo],
    timeout: Duration,
    tls: Option<&TlsFiles>,
) -> RedisResult<ClusterClient> {
    let mut builder = ClusterClient::builder(nodes.to_vec())
        .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .retries(1);
    if let Some(files) = tls {
        builder = builder
            .certs(files.certificates())
            .danger_accept_invalid_hostnames(files.skips_hostname());
    }
    builder.build()
}

/// Where a server pool's master comes from.
pub enum Source {
    Direct(redis::Client),
    /// A `rediss://` server with TLS files: the client is made again when they change.
    DirectTls {
        info: ConnectionInfo,
        files: Arc<TlsFiles>,
    },
    Sentinel(Mutex<SentinelClient>),
}

/// A connection to send one command on.
#[derive(Clone)]
pub enum Connection {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Backend {
    /// The connections for `target` (made on first use), `pool` of them to one server,
    /// each connect and response bounded by `timeout`, with `tls`'s files to a `rediss://`
    /// server.
    pub fn new(
        target: &Target,
        pool: usize,
        timeout: Duration,
        tls: Option<Arc<TlsFiles>>,
    ) -> RedisResult<Backend> {
        let server = |source| Backend::Server {
            source,
            pool: ArcSwapOption::empty(),
            building: Mutex::new(()),
            next: AtomicUsize::new(0),
            size: pool.max(1),
            timeout,
        };
        Ok(match target {
            Target::Server(info) => server(match tls {
                Some(files) => Source::DirectTls {
                    info: info.clone(),
                    files,
                },
                None => Source::Direct(redis::Client::open(info.clone())?),
            }),
            Target::Sentinel {
                sentinels,
                master,
                node,
            } => {
                let node = SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(node.redis_settings().clone())
                    .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
                server(Source::Sentinel(Mutex::new(SentinelClient::build(
                    sentinels.clone(),
                    master.clone(),
                    Some(node),
                    SentinelServerType::Master,
                )?)))
            }
            Target::Cluster(nodes) => Backend::Cluster {
                client: std::sync::Mutex::new(cluster_client(nodes, timeout, tls.as_deref())?),
                connection: Mutex::new(None),
                nodes: nodes.clone(),
                timeout,
                tls,
            },
        })
    }

    /// A connection, connecting first if there is none.
    pub async fn connection(&self) -> RedisResult<Connection> {
        match self {
            Backend::Server {
                source,
                pool,
                building,
                next,
                size,
                timeout,
            } => {
                let pick = |pool: &Arc<Vec<ConnectionManager>>| {
                    let index = next.fetch_add(1, Ordering::Relaxed) % pool.len().max(1);
                    pool.get(index).cloned()
                };
                if let Some(connection) = pool.load().as_ref().and_then(pick) {
                    return Ok(Connection::Server(connection));
                }
                let _building = building.lock().await;
                if let Some(connection) = pool.load().as_ref().and_then(pick) {
                    return Ok(Connection::Server(connection));
                }
                let client = match source {
                    Source::Direct(client) => client.clone(),
                    Source::DirectTls { info, files } => files.client(info)?,
                    Source::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
                };
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(*timeout))
                    .set_response_timeout(Some(*timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(1));
                let connections = (0..*size)
                    .map(|_| {
                        ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                    })
                    .collect::<RedisResult<Vec<_>>>()?;
                let connections = Arc::new(connections);
                pool.store(Some(Arc::clone(&connections)));
                pick(&connections)
                    .map(Connection::Server)
                    .ok_or_else(|| (redis::ErrorKind::Client, "empty connection pool").into())
            }
            Backend::Cluster {
                client, connection, ..
            } => {
                let mut slot = connection.lock().await;
                if let Some(connection) = slot.as_ref() {
                    return Ok(Connection::Cluster(connection.clone()));
                }
                let client = client.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let fresh = client.get_async_connection().await?;
                *slot = Some(fresh.clone());
                Ok(Connection::Cluster(fresh))
            }
        }
    }

    /// After a failed call: connections to a Sentinel-named master are dropped (the next
    /// call asks the sentinels which server is master now); so are those to a TLS server
    /// whose certificate files changed (the next call connects with the new ones); a
    /// cluster connection that never worked is made again. Other direct connections
    /// reconnect by themselves.
    pub async fn failed(&self) {
        match self {
            Backend::Server {
                source: Source::Sentinel(_),
                pool,
                ..
            } => pool.store(None),
            Backend::Server {
                source: Source::DirectTls { files, .. },
                pool,
                ..
            } => {
                let files = Arc::clone(files);
                let changed = tokio::task::spawn_blocking(move || files.changed()).await;
                if changed.unwrap_or(false) {
                    pool.store(None);
                }
            }
            Backend::Server { .. } => {}
            Backend::Cluster {
                client,
                connection,
                nodes,
                timeout,
                tls,
            } => {
                if let Some(files) = tls {
                    let files = Arc::clone(files);
                    let changed = tokio::task::spawn_blocking(move || files.changed()).await;
                    if changed.unwrap_or(false)
                        && let Ok(fresh) = cluster_client(nodes, *timeout, tls.as_deref())
                    {
                        *client.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
                    }
                }
                // The cluster connection refreshes its slots itself, but one whose nodes all
                // went away never recovers: after a failure the next call connects afresh
                // (the breaker keeps that to a probe per cooldown).
                if let Ok(mut slot) = connection.try_lock() {
                    *slot = None;
                }
            }
        }
    }
}

impl Backend {
    /// Why calls to a single server time out: one connection made and asked PING directly,
    /// without the pool's retries (which outlast the call's deadline and so hide the
    /// reason: a refused handshake, a wrong password). `None` when it answers, or for
    /// sentinels and clusters.
    pub async fn diagnose(&self) -> Option<String> {
        let Backend::Server { source, .. } = self else {
            return None;
        };
        let client = match source {
            Source::Direct(client) => client.clone(),
            Source::DirectTls { info, files } => match files.client(info) {
                Ok(client) => client,
                Err(error) => return Some(error.to_string()),
            },
            Source::Sentinel(_) => return None,
        };
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(DIAGNOSE_TIMEOUT))
            .set_response_timeout(Some(DIAGNOSE_TIMEOUT));
        let ping = async {
            let mut connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await
        };
        match tokio::time::timeout(DIAGNOSE_TIMEOUT * 2, ping).await {
            Ok(Ok(_)) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some(format!("no connection within {:?}", DIAGNOSE_TIMEOUT * 2)),
        }
    }
}

/// The deadlines of [`Backend::diagnose`]'s connection and PING.
const DIAGNOSE_TIMEOUT: Duration = Duration::from_secs(1);

impl Connection {
    /// `DEL keys`: how many existed. On a Redis Cluster the keys must share a hash slot
    /// (one descriptor's keys do: `rk:{ROUTE}:ID`).
    pub async fn delete(&mut self, keys: &[String]) -> RedisResult<usize> {
        let mut command = redis::cmd("DEL");
        command.arg(keys);
        self.query(&command).await
    }

    /// Runs `command` (an `EVALSHA` of `script`); if the server does not have the script
    /// (a restart, a failover, a flush), loads it and runs the command again. The script
    /// answers one string.
    pub async fn invoke(
        &mut self,
        script: &redis::Script,
        command: &redis::Cmd,
    ) -> RedisResult<Vec<u8>> {
        match self.query(command).await {
            Err(error)
                if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                match self {
                    Connection::Server(connection) => script.load_async(connection).await?,
                    Connection::Cluster(connection) => script.load_async(connection).await?,
                };
                self.query(command).await
            }
            answer => answer,
        }
    }

    async fn query<T: redis::FromRedisValue>(&mut self, command: &redis::Cmd) -> RedisResult<T> {
        match self {
            Connection::Server(connection) => command.query_async(connection).await,
            Connection::Cluster(connection) => command.query_async(connection).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme_and_keeps_passwords_out_of_descriptions() {
        let server = Target::parse("redis://:secret@10.0.0.1:6380/2").expect("server");
        assert_eq!(server.describe(), "redis 10.0.0.1:6380 db 2");
        let Target::Server(info) = &server else {
            panic!("not a server target: {server:?}");
        };
        assert!(info.tcp_settings().nodelay(), "Nagle's algorithm is off");
        assert!(!server.is_cluster());
        let tls = Target::parse("rediss://redis.example:6379").expect("tls");
        assert_eq!(tls.describe(), "redis redis.example:6379 db 0");
        let sentinel =
            Target::parse("redis-sentinel://u:p@s1:26379,s2:26379/mymaster/3").expect("sentinel");
        assert_eq!(
            sentinel.describe(),
            "redis master \"mymaster\" via sentinels s1:26379,s2:26379"
        );
        let Target::Sentinel { node, .. } = &sentinel else {
            panic!("not a sentinel target: {sentinel:?}");
        };
        assert_eq!(node.redis_settings().db(), 3);
        assert_eq!(node.redis_settings().password(), Some("p"));
        let cluster = Target::parse("redis-cluster://a:7000,b:7001,c:7002").expect("cluster");
        assert_eq!(cluster.describe(), "redis cluster a:7000,b:7001,c:7002");
        assert!(cluster.is_cluster());
    }

    #[test]
    fn refuses_bad_addresses_with_the_reason() {
        let cases = [
            ("redis-sentinel://s1:26379", "master's name is missing"),
            ("redis-cluster://a:7000/1", "only database 0"),
            ("redis-cluster://", "no HOST:PORT"),
            ("memcached://x:1", "unknown store scheme"),
            ("localhost:6379", "not a URL"),
        ];
        for (text, problem) in cases {
            let error = Target::parse(text).expect_err(text);
            assert!(error.contains(problem), "{text}: {error}");
        }
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://:pw@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("redis://user:pw@h:1"), "redis://user:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
