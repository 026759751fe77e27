use std::sync::Mutex;
use std::sync::atomic::Ordering;

use super::membership::tests::set;
use super::*;
use crate::store::cluster::Cluster;
use crate::store::memory::MemoryStore;
use crate::store::memory::tests::engine;

/// Serves `cluster`'s peer service on `listener` until the task is aborted.
pub(crate) fn serve_peer(
    cluster: &Cluster,
    listener: tokio::net::TcpListener,
) -> tokio::task::JoinHandle<()> {
    let service = cluster.peer_service(None, None);
    tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    })
}

/// Polls `condition` every 10 ms for up to 5 s.
pub(crate) async fn within_5s(mut condition: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_detector_takes_a_silent_member_off_the_ring_and_back_when_it_answers() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let b_address = listener.local_addr().expect("bound").to_string();
    let fast = |me: &str, peers: Vec<String>| {
        let mut options = ClusterOptions::new(me);
        options.peers = peers;
        options.ping_interval = Duration::from_millis(20);
        options.down_after = 2;
        options.up_after = 2;
        options
    };
    // A knows B, which does not answer yet (its listener accepts, nobody serves).
    let a = Cluster::join(
        MemoryStore::new(engine()),
        fast("127.0.0.1:1", vec![b_address.clone()]),
    );
    assert_eq!(
        a.runtime().members().len(),
        2,
        "a seed is on the ring until it misses pings"
    );
    assert!(
        within_5s(|| a.runtime().members().len() == 1).await,
        "the silent member is taken off the ring"
    );
    assert_eq!(a.runtime().peer_health(), vec![(b_address.clone(), false)]);
    // B starts serving: it answers A's pings and is back on A's ring.
    let b = Cluster::join(MemoryStore::new(engine()), fast(&b_address, Vec::new()));
    let server = serve_peer(&b, listener);
    assert!(
        within_5s(|| a.runtime().members().len() == 2).await,
        "the member is back once it answers"
    );
    assert_eq!(a.runtime().peer_health(), vec![(b_address, true)]);
    server.abort();
}

/// A peer listener on a free loopback port, and its address.
pub(crate) async fn bind_peer() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("bound").to_string();
    (listener, address)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_member_dropped_by_a_spoofed_leave_is_back_on_both_rings() {
    let ((a_listener, a_address), (b_listener, b_address)) = (bind_peer().await, bind_peer().await);
    let fast = |me: &str, peers: Vec<String>| {
        let mut options = ClusterOptions::new(me);
        options.peers = peers;
        options.ping_interval = Duration::from_millis(20);
        options
    };
    let a = Cluster::join(
        MemoryStore::new(engine()),
        fast(&a_address, vec![b_address.clone()]),
    );
    let b = Cluster::join(MemoryStore::new(engine()), fast(&b_address, Vec::new()));
    let servers = [serve_peer(&a, a_listener), serve_peer(&b, b_listener)];
    let both = |a: &Cluster, b: &Cluster| {
        a.runtime().members().len() == 2 && b.runtime().members().len() == 2
    };
    assert!(within_5s(|| both(&a, &b)).await, "the two nodes meet");
    // Someone tells B that A left, and A that B left; both are alive.
    let (a_runtime, b_runtime) = (a.runtime(), b.runtime());
    assert_eq!(b_runtime.left(&a_address), vec![b_address.clone()]);
    assert_eq!(a_runtime.left(&b_address), vec![a_address.clone()]);
    assert!(
        within_5s(|| both(&a, &b)).await,
        "anti-entropy puts each back on the other's ring"
    );
    for server in servers {
        server.abort();
    }
}

/// A `Leave` naming an address this node never knew changes nothing: `left` stays bounded
/// by the members known, and the detector, which pings nodes said to have left, is never
/// made to dial an address a message made up. (Found by the `peer` fuzz target.)
#[tokio::test(start_paused = true)]
async fn a_leave_for_an_unknown_address_is_not_remembered_nor_probed() {
    let mut options = ClusterOptions::new("127.0.0.1:1");
    options.peers = vec!["127.0.0.1:2".to_owned()];
    let runtime = Runtime::start(options, None);
    for n in 0..1000 {
        runtime.left(&format!("10.9.{}.{}:8091", n / 250, n % 250));
    }
    runtime.left("127.0.0.1:2");
    let membership = runtime.lock();
    assert_eq!(
        membership.left,
        set(&["127.0.0.1:2"]),
        "only the known node"
    );
    assert_eq!(membership.probed("127.0.0.1:1"), set(&["127.0.0.1:2"]));
}

#[test]
fn a_membership_answer_naming_too_many_or_malformed_members_is_refused() {
    let many: Vec<String> = (0..=convert::MAX_MEMBERS)
        .map(|n| format!("n{n}:1"))
        .collect();
    assert!(convert::member_addresses(many).is_err());
    assert!(convert::member_addresses(vec![String::new()]).is_err());
    assert!(convert::member_addresses(vec!["a".repeat(257)]).is_err());
    assert_eq!(
        convert::member_addresses(vec!["a:1".to_owned()]),
        Ok(vec!["a:1".to_owned()])
    );
}

/// A quota source answering `share` for every bucket, recording who asked for how many.
fn recording(share: u64, asked: &Arc<Mutex<Vec<(String, usize)>>>) -> quota::QuotaSource {
    let asked = Arc::clone(asked);
    Arc::new(move |sender: &str, demands: &[quota::QuotaDemand]| {
        asked
            .lock()
            .expect("lock")
            .push((sender.to_owned(), demands.len()));
        vec![Some(share); demands.len()]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_demands_go_to_each_buckets_owner_in_one_call_and_strangers_get_no_share() {
    use super::proto::v1 as wire;
    let ((a_listener, a_address), (b_listener, b_address)) = (bind_peer().await, bind_peer().await);
    let a = Cluster::join(MemoryStore::new(engine()), {
        let mut options = ClusterOptions::new(&a_address);
        options.peers = vec![b_address.clone()];
        options
    });
    let b = Cluster::join(MemoryStore::new(engine()), {
        let mut options = ClusterOptions::new(&b_address);
        options.peers = vec![a_address.clone()];
        options
    });
    let b_asked = Arc::new(Mutex::new(Vec::new()));
    let b_service = b.peer_service(None, Some(recording(7, &b_asked)));
    let b_server = tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(b_listener);
        let _ = tonic::transport::Server::builder()
            .add_service(b_service)
            .serve_with_incoming(incoming)
            .await;
    });
    let a_server = serve_peer(&a, a_listener);
    assert!(
        within_5s(|| a.runtime().members().len() == 2 && b.runtime().members().len() == 2).await,
        "the two nodes meet"
    );
    // Twenty buckets, spread over both owners: b's go to b in one call, a's to its own
    // division without a call.
    let demands: Vec<quota::QuotaDemand> = (0..20u64)
        .map(|n| quota::QuotaDemand {
            bucket: quota::QuotaBucket {
                route: crate::key::fmix64(n),
                id: n,
            },
            limit: 10,
            demand: 5,
        })
        .collect();
    let ring = Ring::new([a_address.as_str(), b_address.as_str()], DEFAULT_VNODES);
    let owned_by_b = |demand: &quota::QuotaDemand| {
        ring.owner(demand.bucket.route)
            .is_some_and(|owner| **owner == *b_address)
    };
    let at_b = demands.iter().filter(|demand| owned_by_b(demand)).count();
    assert!(at_b > 0 && at_b < demands.len(), "{at_b} of 20 at b");
    let here_asked = Arc::new(Mutex::new(Vec::new()));
    let shares = a
        .runtime()
        .exchange_quota(&demands, &recording(3, &here_asked))
        .await;
    for (demand, share) in demands.iter().zip(&shares) {
        let expected = if owned_by_b(demand) { 7 } else { 3 };
        assert_eq!(*share, Some(expected), "{demand:?}");
    }
    assert_eq!(*b_asked.lock().expect("lock"), [(a_address.clone(), at_b)]);
    assert_eq!(
        *here_asked.lock().expect("lock"),
        [(a_address.clone(), demands.len() - at_b)]
    );
    assert_eq!(
        a.runtime().stats().0.quota_sent.load(Ordering::Relaxed),
        at_b as u64
    );
    assert_eq!(
        b.runtime().stats().0.quota_received.load(Ordering::Relaxed),
        at_b as u64
    );
    // Straight to b's peer service: a node not on b's ring gets no share, and numbers out
    // of bounds or another version are refused.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{b_address}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("connects");
    let mut client = wire::peer_client::PeerClient::new(channel);
    let report = |sender: &str, limit: u64, version: u32| wire::QuotaReport {
        version,
        sender: sender.to_owned(),
        buckets: vec![wire::QuotaDemand {
            route: 1,
            id: 1,
            limit,
            demand: 1,
        }],
    };
    let stranger = client
        .quota(report("127.0.0.1:9", 10, convert::VERSION))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(stranger.shares, [0]);
    assert_eq!(
        b_asked.lock().expect("lock").len(),
        1,
        "the stranger was not divided"
    );
    let huge = client
        .quota(report(&a_address, u64::MAX, convert::VERSION))
        .await
        .expect_err("refused");
    assert_eq!(huge.code(), tonic::Code::InvalidArgument, "{huge:?}");
    let other = client
        .quota(report(&a_address, 10, convert::VERSION + 1))
        .await
        .expect_err("refused");
    assert_eq!(other.code(), tonic::Code::FailedPrecondition, "{other:?}");
    a_server.abort();
    b_server.abort();
}
