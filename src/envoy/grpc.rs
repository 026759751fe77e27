//! The gRPC listener's HTTP/2 server: `ShouldRateLimit` is read, decided and written here
//! directly (the hot path), every other call goes through tonic's router.
//!
//! Why not tonic's server for everything: for a unary call tonic adds a router lookup, a
//! boxed service clone, a streaming decoder, a streaming encoder and several allocations,
//! which together cost more than the limiter's own work (a do-nothing server on this path
//! answers ~20% more requests per second than the same server through tonic; BENCHMARKS.md,
//! issue 8). The gRPC part of a unary call is small: one length-prefixed message in
//! (`[flag][u32 length][protobuf]`), one out, and `grpc-status` in the trailers. hyper
//! still does all of HTTP/2 and prost all of protobuf.
//!
//! What the fast path answers like tonic does (same codes and messages): a message larger
//! than [`MAX_MESSAGE_BYTES`] (`OUT_OF_RANGE`), no message or a cut-off one (`INTERNAL`), a
//! compressed message (`INTERNAL`: nothing is negotiated), protobuf that does not decode
//! (`INTERNAL`), and `grpc-timeout` (`CANCELLED` once it expires). A request naming a
//! `grpc-encoding` is handed to tonic whole, which answers it as before. Errors are rendered
//! by [`tonic::Status::into_http`], so their trailers are tonic's.
//!
//! Where a new gRPC service goes: add it to the [`Routes`] built in `server.rs`; it is served
//! by tonic unchanged. Only a call as hot as `ShouldRateLimit` earns a path of its own here.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming as Body;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prost::Message;
use tokio::sync::watch;
use tonic::Status;
use tonic::metadata::MetadataMap;
use tonic::service::Routes;
use tower_service::Service;

use crate::envoy::rls::{self, MAX_MESSAGE_BYTES};
use crate::limiter::Limiter;
use crate::transport::listener::{Conn, Incoming};

/// The path Envoy calls.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Concurrent calls on one connection at most (tonic's default is no limit). A client that
/// wants more opens another connection, as Envoy does.
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Serves the connections of `incoming` until `stop` completes, then lets every open
/// connection finish its calls (HTTP/2 GOAWAY) and returns once all have closed. Accepting
/// stops, and the listening socket closes, as soon as `stop` completes.
pub async fn serve(
    incoming: Incoming,
    limiter: Arc<Limiter>,
    routes: Routes,
    stop: impl Future<Output = ()>,
) {
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // No `date` header: gRPC peers do not read it (grpc-go does not send one either), and
    // stamping every answer costs a clock read and a header.
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .auto_date_header(false);
    let service = GrpcService { limiter, routes };
    // Every connection holds a receiver; `closing` says when to go away.
    let (closing, closing_rx) = watch::channel(false);
    {
        let mut incoming = pin!(incoming);
        let mut stop = pin!(stop);
        loop {
            let conn = tokio::select! {
                () = &mut stop => break,
                conn = std::future::poll_fn(|cx| futures_core::Stream::poll_next(incoming.as_mut(), cx)) => conn,
            };
            match conn {
                Some(Ok(conn)) => {
                    let connection = http2.serve_connection(TokioIo::new(conn), service.clone());
                    tokio::spawn(serve_connection(connection, closing_rx.clone()));
                }
                // The listener logs its own accept errors and keeps accepting.
                Some(Err(error)) => tracing::debug!(%error, "grpc connection not accepted"),
                None => break,
            }
        }
    }
    drop(closing_rx);
    let _ = closing.send(true);
    closing.closed().await;
}

/// One connection until it ends, going away gracefully once `closing` turns true.
async fn serve_connection(
    connection: hyper::server::conn::http2::Connection<TokioIo<Conn>, GrpcService, TokioExecutor>,
    mut closing: watch::Receiver<bool>,
) {
    let mut connection = pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "grpc connection ended");
            }
            return;
        }
        _ = closing.wait_for(|closing| *closing) => {}
    }
    connection.as_mut().graceful_shutdown();
    if let Err(error) = connection.await {
        tracing::debug!(%error, "grpc connection ended while going away");
    }
}

/// Answers one call: `ShouldRateLimit` here, anything else through `routes`.
#[derive(Clone)]
struct GrpcService {
    limiter: Arc<Limiter>,
    routes: Routes,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Reply>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Body>> for GrpcService {
    type Response = Response<Reply>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: Request<Body>) -> Answer {
        if request.uri().path() == SHOULD_RATE_LIMIT
            && !request.headers().contains_key("grpc-encoding")
        {
            let limiter = Arc::clone(&self.limiter);
            return Box::pin(async move {
                Ok(should_rate_limit(&limiter, request)
                    .await
                    .unwrap_or_else(|status| status.into_http()))
            });
        }
        let mut routes = self.routes.clone();
        Box::pin(async move {
            let response = routes.call(request).await?;
            Ok(response.map(Reply::Tonic))
        })
    }
}

/// Reads the request's one message, decides it and writes the answer.
async fn should_rate_limit(
    limiter: &Limiter,
    request: Request<Body>,
) -> Result<Response<Reply>, Status> {
    let (parts, body) = request.into_parts();
    let deadline = grpc_timeout(&parts.headers);
    let answer = async {
        let message = read_message(body).await?;
        let request = RateLimitRequest::decode(message)
            // As tonic's protobuf codec answers it.
            .map_err(|error| Status::internal(error.to_string()))?;
        let metadata = MetadataMap::from_headers(parts.headers);
        rls::answer(limiter, &metadata, &request)
            .await
            .map_err(|error| error.to_grpc())
    };
    let response = match deadline {
        None => answer.await?,
        Some(deadline) => tokio::time::timeout(deadline, answer)
            .await
            .map_err(|_| Status::cancelled("Timeout expired"))??,
    };
    let mut frame = Vec::with_capacity(5 + response.response.encoded_len());
    frame.extend_from_slice(&[0; 5]);
    response.encode(&mut frame);
    let length = u32::try_from(frame.len() - 5)
        .map_err(|_| Status::internal("the response is larger than 4 GiB"))?;
    frame[1..5].copy_from_slice(&length.to_be_bytes());
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut reply = Response::new(Reply::Message {
        data: Some(Bytes::from(frame)),
        trailers: Some(trailers),
    });
    reply.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    Ok(reply)
}

/// The body's one gRPC message: at most [`MAX_MESSAGE_BYTES`], uncompressed, complete.
async fn read_message(body: Body) -> Result<Bytes, Status> {
    // The frame's header and the largest message; a longer body is refused while reading.
    let limited = http_body_util::Limited::new(body, 5 + MAX_MESSAGE_BYTES);
    let body = match limited.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            return Err(if error.is::<http_body_util::LengthLimitError>() {
                Status::out_of_range(format!(
                    "Error, decoded message length too large: found more than \
                     {MAX_MESSAGE_BYTES} bytes, the limit is: {MAX_MESSAGE_BYTES} bytes"
                ))
            } else {
                Status::internal(format!("the request's body: {error}"))
            });
        }
    };
    unframe(body)
}

/// The one message of a whole request body (`[flag][u32 length][message]`).
pub(crate) fn unframe(mut body: Bytes) -> Result<Bytes, Status> {
    if body.is_empty() {
        return Err(Status::internal("Missing request message."));
    }
    if body.len() < 5 {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    let flag = body.get_u8();
    let length = body.get_u32() as usize;
    match flag {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ));
        }
        other => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {other} \
                 (valid flags are 0 and 1), while sending request"
            )));
        }
    }
    if length > MAX_MESSAGE_BYTES {
        return Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found {length} bytes, the limit is: \
             {MAX_MESSAGE_BYTES} bytes"
        )));
    }
    if body.len() < length {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    if body.len() > length {
        return Err(Status::invalid_argument(
            "ShouldRateLimit takes one message; the request carries more",
        ));
    }
    Ok(body)
}

/// The client's `grpc-timeout` (`1-8 digits` and a unit: `H M S m u n`); `None` when absent
/// or malformed, which tonic also ignores.
pub(crate) fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let split = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// A response body: the fast path's one message and trailers, tonic's own body, or nothing
/// (an error, whose status travels in the headers).
#[derive(Default)]
pub enum Reply {
    Message {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
    Tonic(tonic::body::Body),
    #[default]
    Empty,
}

impl http_body::Body for Reply {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match self.get_mut() {
            Reply::Message { data, trailers } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(
                    trailers
                        .take()
                        .map(|trailers| Ok(Frame::trailers(trailers))),
                )
            }
            Reply::Tonic(body) => Pin::new(body).poll_frame(cx),
            Reply::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Reply::Message { data, trailers } => data.is_none() && trailers.is_none(),
            Reply::Tonic(body) => body.is_end_stream(),
            Reply::Empty => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert(
            "grpc-timeout",
            HeaderValue::from_str(value).expect("a header value"),
        );
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeout_reads_every_unit_and_ignores_malformed_values() {
        assert_eq!(timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(timeout("250u"), Some(Duration::from_micros(250)));
        assert_eq!(timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "m", "123456789m", "20x", "-1m", "2 m", "1.5S"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }
}
