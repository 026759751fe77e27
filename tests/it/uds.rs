//! gRPC on a Unix domain socket (`--grpc-uds`, the reference's `GRPC_UDS`): served instead of
//! TCP, a stale socket file replaced at start, the file removed at exit.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::Duration;

use crate::support::{Ratekeeper, TempDir, eventually, write_config};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratekeeper::limits::Limits;
use ratekeeper::server::{Server, ServerOptions};
use ratekeeper::transport::listener::GrpcEndpoint;
use tonic::transport::{Channel, Endpoint};

const LIMITS: &str = "
domain: uds
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 2}
";

fn options(socket: &Path) -> ServerOptions {
    let localhost = "127.0.0.1:0".parse().expect("addr");
    ServerOptions {
        grpc_uds: Some(socket.to_owned()),
        ..ServerOptions::new(localhost, localhost)
    }
}

async fn bind(socket: &Path) -> Result<Server, String> {
    let limits = Limits::parse_str("uds.yaml", LIMITS).expect("valid");
    Server::bind(&options(socket), limits, 0)
        .await
        .map_err(|error| error.to_string())
}

async fn channel(socket: &Path) -> Channel {
    Endpoint::from_shared(format!("unix:{}", socket.display()))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connects over the unix socket")
}

fn request(user: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "uds".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".to_owned(),
                value: user.to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        ..RateLimitRequest::default()
    }
}

async fn overall_code(client: &mut RateLimitServiceClient<Channel>, user: &str) -> Code {
    client
        .should_rate_limit(request(user))
        .await
        .expect("answered")
        .into_inner()
        .overall_code()
}

fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|metadata| metadata.file_type().is_socket())
}

#[tokio::test]
async fn a_client_over_the_unix_socket_gets_answers_and_the_file_goes_at_exit() {
    let dir = TempDir::new("uds");
    let socket = dir.path().join("ratekeeper.sock");
    // A socket file left by a process that is gone (bound, then closed without removing it).
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("stale socket"));
    assert!(is_socket(&socket));

    let server = bind(&socket).await.expect("replaces the stale socket");
    assert_eq!(
        server.grpc_endpoint(),
        &GrpcEndpoint::Unix(socket.clone()),
        "served on the socket"
    );
    assert_eq!(server.grpc_addr(), None, "and not on tcp");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    let channel = channel(&socket).await;
    let mut client = RateLimitServiceClient::new(channel.clone());
    assert_eq!(overall_code(&mut client, "u1").await, Code::Ok);
    assert_eq!(overall_code(&mut client, "u1").await, Code::Ok);
    assert_eq!(overall_code(&mut client, "u1").await, Code::OverLimit);
    // gRPC health is on the socket too.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "ratelimit".to_owned(),
        })
        .await
        .expect("health answered")
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    drop(client);
    drop(health);

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), done)
        .await
        .expect("stops in time")
        .expect("task")
        .expect("clean exit");
    assert!(!socket.exists(), "the socket file is removed at exit");
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_is_never_removed() {
    let dir = TempDir::new("uds-file");
    let path = write_config(dir.path(), "data.sock", "precious");
    let error = bind(&path).await.err().expect("refuses");
    assert_eq!(
        error,
        format!(
            "--grpc-uds {}: exists and is not a socket (not removing it)",
            path.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&path).expect("kept"), "precious");
}

#[tokio::test]
async fn a_socket_another_process_serves_on_is_not_taken_over() {
    let dir = TempDir::new("uds-busy");
    let socket = dir.path().join("busy.sock");
    let _live = std::os::unix::net::UnixListener::bind(&socket).expect("a live socket");
    let error = bind(&socket).await.err().expect("refuses");
    assert_eq!(
        error,
        format!(
            "--grpc-uds {}: another process is serving on this socket",
            socket.display()
        )
    );
    assert!(is_socket(&socket), "the live socket stays");
}

#[test]
fn the_binary_serves_on_the_socket_it_prints_and_removes_it_on_sigterm() {
    let dir = TempDir::new("uds-binary");
    let limits = write_config(dir.path(), "limits.yaml", LIMITS);
    let socket = dir.path().join("rk.sock");
    let socket_arg = socket.to_str().expect("utf-8 path");
    let mut ratekeeper = Ratekeeper::start(&limits, &["--grpc-uds", socket_arg]);
    assert_eq!(ratekeeper.grpc_uds(), socket);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut client = RateLimitServiceClient::new(channel(&socket).await);
        assert_eq!(overall_code(&mut client, "u2").await, Code::Ok);
    });
    // Closes the client's connection (its task lives on the runtime), so the drain at
    // SIGTERM has nothing to wait for.
    drop(runtime);

    ratekeeper.process().signal("-TERM");
    let exited = eventually(Duration::from_secs(30), || {
        ratekeeper
            .child()
            .try_wait()
            .expect("try_wait")
            .is_some_and(|status| status.success())
    });
    assert!(exited, "no clean exit: {}", ratekeeper.stderr());
    assert!(!socket.exists(), "the socket file is removed at exit");
}
