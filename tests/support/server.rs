//! The library's [`Server`] in the test process, for tests that need what the binary
//! cannot show (its xDS stats, TLS options built in code): [`spawn_server`] runs it on a
//! task until the test lets it go.

use ratekeeper::server::{ServeError, Server};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Runs `server` on a tokio task until the returned sender sends or drops, and hands back
/// the task, which ends with what [`Server::run`] returned.
pub fn spawn_server(server: Server) -> (oneshot::Sender<()>, JoinHandle<Result<(), ServeError>>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    (stop, task)
}
