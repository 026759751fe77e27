//! The peer port's security, with real ratekeeper processes: mutual TLS between peers
//! (`--peer-tls-*`), membership messages accepted only from the node they concern, and
//! anti-entropy healing a membership that a spoofed or stale message broke.
//!
//! Each mTLS node listens on its own loopback address (127.0.0.2, .3, .4) and its
//! certificate is valid for that address only, so one node's certificate cannot speak for
//! another (the identity rule: docs/cluster.md, "Peer security").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::{
    Leaf, Ratekeeper, TempDir, TestCa, cluster_members, edge_decide, eventually, grpc_clients,
    metric_sum, start_member, wait_for_members, write_config,
};
use ratekeeper::cluster::proto::v1 as wire;
use ratekeeper::cluster::proto::v1::peer_client::PeerClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const LIMIT: usize = 12;
const LIMITS: &str = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 12}\n";
/// How soon a live node a spoofed message dropped must be back on every ring.
const HEAL_WITHIN: Duration = Duration::from_secs(3);
/// The peer protocol's version (`ratekeeper.peer.v1`).
const VERSION: u32 = 1;

/// The certificate files of one node.
struct PeerFiles {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

impl PeerFiles {
    fn args(&self) -> Vec<String> {
        vec![
            "--peer-tls-cert".to_owned(),
            self.cert.display().to_string(),
            "--peer-tls-key".to_owned(),
            self.key.display().to_string(),
            "--peer-tls-ca".to_owned(),
            self.ca.display().to_string(),
        ]
    }
}

/// Node `index`'s loopback host: 127.0.0.2, 127.0.0.3, ...
fn host(index: usize) -> String {
    format!("127.0.0.{}", index + 2)
}

/// `n` mTLS members serving the limits file `config`, each on its own loopback host with a
/// certificate for that host only, signed by `ca` (the files in `dir`); returns once every
/// one sees all `n`.
fn start_mtls_cluster(
    config: &Path,
    dir: &Path,
    ca: &TestCa,
    n: usize,
) -> (Vec<Ratekeeper>, Vec<Leaf>) {
    let ca_path = ca.write(dir, "ca.pem");
    let mut nodes: Vec<Ratekeeper> = Vec::new();
    let mut leaves = Vec::new();
    for index in 0..n {
        let leaf = ca.peer(&[&host(index)]);
        let (cert, key) = leaf.write(dir, &format!("node{index}"));
        let files = PeerFiles {
            cert,
            key,
            ca: ca_path.clone(),
        };
        let args = files.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let peers: Vec<SocketAddr> = nodes.iter().map(Ratekeeper::peer_addr).collect();
        let addr = format!("{}:0", host(index));
        nodes.push(start_member(config, &addr, &peers, &args));
        leaves.push(leaf);
    }
    wait_for_members(&nodes, n);
    (nodes, leaves)
}

/// A peer client of `addr`: plain, or over TLS trusting `ca` and presenting `identity`.
async fn peer_client(
    addr: SocketAddr,
    ca: Option<&TestCa>,
    identity: Option<&Leaf>,
) -> Result<PeerClient<Channel>, String> {
    let scheme = if ca.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|error| error.to_string())?
        .connect_timeout(Duration::from_secs(2));
    if let Some(ca) = ca {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca.cert_pem()))
            .domain_name(addr.ip().to_string());
        if let Some(leaf) = identity {
            tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|error| error.to_string())?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|error| format!("{error:?}"))?;
    Ok(PeerClient::new(channel))
}

/// Sends `Leave { address: leaving }` to `to`; the member list it answers, or its status.
async fn leave(
    to: SocketAddr,
    leaving: SocketAddr,
    ca: Option<&TestCa>,
    identity: Option<&Leaf>,
) -> Result<Vec<String>, (tonic::Code, String)> {
    let mut client = peer_client(to, ca, identity)
        .await
        .map_err(|problem| (tonic::Code::Unavailable, problem))?;
    let member = wire::Member {
        version: VERSION,
        address: leaving.to_string(),
    };
    match tokio::time::timeout(Duration::from_secs(5), client.leave(member)).await {
        Ok(Ok(reply)) => Ok(reply.into_inner().addresses),
        Ok(Err(status)) => Err((status.code(), status.message().to_owned())),
        Err(_) => Err((tonic::Code::DeadlineExceeded, "no answer".to_owned())),
    }
}

/// How many of `LIMIT x 3` hits on a fresh key, spread over every node, are admitted.
async fn admitted_across(nodes: &[Ratekeeper], value: &str) -> usize {
    let mut clients = grpc_clients(nodes).await;
    let mut admitted = 0;
    for hit in 0..LIMIT * 3 {
        let client = &mut clients[hit % nodes.len()];
        if edge_decide(client, value).await == Code::Ok {
            admitted += 1;
        }
    }
    admitted
}

/// Every node has `n` members for the whole of `period` (polled).
fn stays_at(nodes: &[Ratekeeper], n: usize, period: Duration) -> bool {
    let until = Instant::now() + period;
    while Instant::now() < until {
        if nodes
            .iter()
            .any(|node| cluster_members(node) != Some(n as f64))
        {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// No node has more than `n` members at any time during `period` (polled). A member may
/// drop out for a moment on a loaded machine (a ping that timed out); what matters here is
/// that no one else gets in.
fn never_above(nodes: &[Ratekeeper], n: usize, period: Duration) -> bool {
    let until = Instant::now() + period;
    while Instant::now() < until {
        if nodes
            .iter()
            .any(|node| cluster_members(node).is_some_and(|members| members > n as f64))
        {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mtls_cluster_counts_exactly_and_refuses_a_peer_from_another_ca() {
    let dir = TempDir::new("cluster-mtls");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let certs = TempDir::new("cluster-mtls-certs");
    let ca = TestCa::new("peers");
    let (nodes, _) = start_mtls_cluster(&config, certs.path(), &ca, 3);

    for key in ["mtls-a", "mtls-b", "mtls-c", "mtls-d"] {
        let admitted = admitted_across(&nodes, key).await;
        assert_eq!(admitted, LIMIT, "{key}: one limit across the mTLS cluster");
    }
    assert_eq!(
        metric_sum(
            nodes[0].http_addr(),
            "ratekeeper_peer_tls_loads_total{result=\"success\"}"
        ),
        1.0,
        "the peer tls files are loaded and counted"
    );

    // A fourth node whose certificate another CA signed cannot join: no node takes it, and
    // it sees no one.
    let other = TestCa::new("not the peers' ca");
    let other_dir = TempDir::new("cluster-mtls-other");
    let outsider = PeerFiles {
        cert: other
            .peer(&[&host(3)])
            .write(other_dir.path(), "outsider")
            .0,
        key: other_dir.path().join("outsider.key"),
        ca: ca.write(other_dir.path(), "ca.pem"),
    };
    let args = outsider.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let intruder = start_member(
        &config,
        &format!("{}:0", host(3)),
        &[nodes[0].peer_addr()],
        &args,
    );
    assert!(
        never_above(&nodes, 3, Duration::from_secs(3)),
        "a node with another CA's certificate got into a ring"
    );
    assert!(
        eventually(Duration::from_secs(5), || cluster_members(&intruder)
            == Some(1.0)),
        "the outsider's detector finds no peer that answers it:\n{}",
        intruder.stderr()
    );
    let refused = metric_sum(
        nodes[0].http_addr(),
        "ratekeeper_peer_tls_handshake_failures_total",
    );
    assert!(
        refused >= 1.0,
        "the outsider's handshakes fail and are counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mtls_a_leave_for_another_node_is_refused_and_the_ring_stays() {
    let dir = TempDir::new("cluster-mtls-leave");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let certs = TempDir::new("cluster-mtls-leave-certs");
    let ca = TestCa::new("peers");
    let (nodes, leaves) = start_mtls_cluster(&config, certs.path(), &ca, 3);
    let (a, b) = (nodes[0].peer_addr(), nodes[1].peer_addr());

    // C's certificate cannot make A drop B.
    let spoofed = leave(a, b, Some(&ca), Some(&leaves[2])).await;
    let (code, message) = spoofed.expect_err("a leave for B signed by C");
    assert_eq!(code, tonic::Code::PermissionDenied, "{message}");
    assert!(message.contains(&b.to_string()), "{message}");
    // Without a certificate the handshake itself fails: no message gets through.
    let anonymous = leave(a, b, Some(&ca), None).await;
    assert!(anonymous.is_err(), "a leave without a client certificate");
    // Plain HTTP/2 to the TLS port is no way around it.
    assert!(leave(a, b, None, None).await.is_err(), "a plain-text leave");

    assert!(
        stays_at(&nodes, 3, Duration::from_secs(2)),
        "a refused leave changed a ring"
    );
    assert_eq!(
        metric_sum(
            nodes[0].http_addr(),
            "ratekeeper_cluster_peer_refused_total"
        ),
        1.0,
        "the refusal is counted"
    );
}

/// RLQS across the cluster under mutual TLS: a `Quota` report takes a share of a limit for
/// the node it names, so only that node's certificate may send it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mtls_a_quota_report_speaks_only_for_its_sender() {
    let dir = TempDir::new("cluster-mtls-quota");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let certs = TempDir::new("cluster-mtls-quota-certs");
    let ca = TestCa::new("peers");
    let (nodes, leaves) = start_mtls_cluster(&config, certs.path(), &ca, 2);
    let (a, b) = (nodes[0].peer_addr(), nodes[1].peer_addr());
    let report = |sender: SocketAddr| wire::QuotaReport {
        version: VERSION,
        sender: sender.to_string(),
        buckets: vec![wire::QuotaDemand {
            route: 1,
            id: 2,
            limit: 20,
            demand: 20,
        }],
    };
    let mut as_b = peer_client(a, Some(&ca), Some(&leaves[1]))
        .await
        .expect("B's certificate connects");
    // B's certificate cannot report for A.
    let spoofed = as_b
        .quota(report(a))
        .await
        .expect_err("a quota report for A signed by B");
    assert_eq!(
        spoofed.code(),
        tonic::Code::PermissionDenied,
        "{}",
        spoofed.message()
    );
    // It reports for B: A, the owner it asked, divides the limit and answers B's share.
    let answered = as_b
        .quota(report(b))
        .await
        .expect("B's own report")
        .into_inner();
    assert!(answered.serves_quota);
    assert_eq!(answered.shares.len(), 1);
    assert!(
        (1..=20).contains(&answered.shares[0]),
        "{:?}",
        answered.shares
    );
    assert_eq!(
        metric_sum(
            nodes[0].http_addr(),
            "ratekeeper_cluster_peer_refused_total"
        ),
        1.0,
        "the refusal is counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_mtls_a_spoofed_leave_heals_within_3s_and_the_limit_is_exact_again() {
    let dir = TempDir::new("cluster-spoofed-leave");
    write_config(dir.path(), "edge.yaml", LIMITS);
    let nodes = crate::support::start_cluster(dir.path(), 3, &["--peer-timeout", "2s"]);
    let b = nodes[1].peer_addr();

    // Anything that reaches the peer port: A and C drop B, which is alive.
    let sent = Instant::now();
    for node in [&nodes[0], &nodes[2]] {
        let members = leave(node.peer_addr(), b, None, None)
            .await
            .expect("an unauthenticated leave is taken");
        assert!(
            !members.contains(&b.to_string()),
            "the spoofed leave dropped B: {members:?}"
        );
    }
    let healed = eventually(HEAL_WITHIN, || {
        nodes.iter().all(|node| cluster_members(node) == Some(3.0))
    });
    let took = sent.elapsed();
    assert!(
        healed,
        "B is not back on every ring {took:?} after the spoofed leave:\n{}",
        crate::support::cluster_diagnosis(&nodes, &["A", "B", "C"])
    );
    eprintln!("healed {took:?} after the spoofed leave");
    // Let the rebalance after the heal land, then one limit across all nodes again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for key in ["heal-a", "heal-b", "heal-c", "heal-d", "heal-e"] {
        let admitted = admitted_across(&nodes, key).await;
        assert_eq!(admitted, LIMIT, "{key}: the limit is exact again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_certificates_reload_when_their_files_change() {
    let dir = TempDir::new("cluster-mtls-reload");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let certs = TempDir::new("cluster-mtls-reload-certs");
    let (old_ca, new_ca) = (TestCa::new("old peers"), TestCa::new("new peers"));
    let (nodes, _) = start_mtls_cluster(&config, certs.path(), &old_ca, 1);
    let node = &nodes[0];
    let newcomer = new_ca.peer(&["127.0.0.9"]);
    let ping = || async {
        let mut client = peer_client(node.peer_addr(), Some(&new_ca), Some(&newcomer)).await?;
        let member = wire::Member {
            version: VERSION,
            address: "127.0.0.9:1".to_owned(),
        };
        match tokio::time::timeout(Duration::from_secs(2), client.ping(member)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(status.to_string()),
            Err(_) => Err("no answer".to_owned()),
        }
    };
    assert!(ping().await.is_err(), "the new CA is not trusted yet");
    // Renewed in place, as cert-manager does: a new CA, and the node's certificate from it.
    new_ca.write(certs.path(), "ca.pem");
    new_ca.peer(&[&host(0)]).write(certs.path(), "node0");
    let mut reloaded = false;
    for _ in 0..50 {
        if ping().await.is_ok() {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        reloaded,
        "the renewed files are not served:\n{}",
        node.stderr()
    );
    assert_eq!(
        metric_sum(
            node.http_addr(),
            "ratekeeper_peer_tls_loads_total{result=\"success\"}"
        ),
        2.0
    );
}

#[test]
fn a_peer_listener_off_loopback_without_mtls_needs_the_insecure_opt_in() {
    let dir = TempDir::new("cluster-insecure");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let config = config.display().to_string();
    let args = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["serve", "--config", &config, "--peer-addr", "0.0.0.0:0"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect()
    };
    let (status, _, stderr) =
        crate::support::run_ratekeeper(&args(&["--advertise", "127.0.0.1:1"]));
    assert!(!status.success(), "started without mTLS on 0.0.0.0");
    for flag in [
        "--peer-tls-cert",
        "--peer-tls-key",
        "--peer-tls-ca",
        "--peer-insecure",
    ] {
        assert!(stderr.contains(flag), "the error names {flag}: {stderr}");
    }
    let started = Ratekeeper::start(
        dir.path(),
        &[
            "--peer-addr",
            "0.0.0.0:0",
            "--advertise",
            "127.0.0.1:1",
            "--peer-insecure",
        ],
    );
    assert!(
        started
            .stderr()
            .contains("--peer-insecure: the peer listener takes unauthenticated"),
        "a warning at start: {}",
        started.stderr()
    );
}
